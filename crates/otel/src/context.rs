//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` a caller hands brood and the `TRACEPARENT` every agent gets,
//! and the ids brood derives from its own records.
//!
//! A run's span id is not drawn and kept apart: it is the random half of the
//! run's id (a UUIDv7, whose last 8 bytes are its variant bits and 62 random
//! bits), so the span of any run is known to every node from the record alone,
//! a parent's on one node and its child's on another.

use std::fmt;

/// A trace's id: 16 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// One `traceparent`: the trace, the span that is the parent of what the
/// receiver does, and whether the caller samples it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace: TraceId,
    pub span: SpanId,
    pub sampled: bool,
}

/// Why a `traceparent` was refused, for the error that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextError(pub String);

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ContextError {}

fn hex_to<const N: usize>(what: &str, s: &str) -> Result<[u8; N], ContextError> {
    if s.len() != 2 * N {
        return Err(ContextError(format!(
            "{what} must be {} hexadecimal digits, not {}",
            2 * N,
            s.len()
        )));
    }
    let mut out = [0u8; N];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        match (d(pair[0]), d(pair[1])) {
            (Some(h), Some(l)) => out[i] = h << 4 | l,
            _ => {
                return Err(ContextError(format!(
                    "{what} must be lowercase hexadecimal digits: {s:?}"
                )));
            }
        }
    }
    if out.iter().all(|b| *b == 0) {
        return Err(ContextError(format!("{what} must not be all zeros")));
    }
    Ok(out)
}

fn to_hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[usize::from(b >> 4)] as char);
        s.push(D[usize::from(b & 15)] as char);
    }
    s
}

impl TraceId {
    pub fn parse(s: &str) -> Result<TraceId, ContextError> {
        hex_to("trace-id", s).map(TraceId)
    }
    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }
}

impl SpanId {
    pub fn parse(s: &str) -> Result<SpanId, ContextError> {
        hex_to("parent-id", s).map(SpanId)
    }
    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }
}

/// The 32 hexadecimal digits of a UUID (its hyphens dropped), or `None`
/// for anything else.
fn uuid_hex(run: &str) -> Option<String> {
    let h: String = run.chars().filter(|c| *c != '-').collect();
    (h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| h.to_ascii_lowercase())
}

/// The span of a run: the random half of its id (see the module's docs).
pub fn span_of_run(run: &str) -> Result<SpanId, ContextError> {
    let h = uuid_hex(run).ok_or_else(|| ContextError(format!("run id {run:?} is not a UUID")))?;
    SpanId::parse(&h[16..])
}

/// The trace a root starts when no caller gave one: its first run's id,
/// whose last 7 bytes are random as W3C asks of a trace id's right half.
pub fn trace_of_run(run: &str) -> Result<TraceId, ContextError> {
    let h = uuid_hex(run).ok_or_else(|| ContextError(format!("run id {run:?} is not a UUID")))?;
    TraceId::parse(&h)
}

impl TraceContext {
    /// Reads a `traceparent` header's value: version `00` exactly as W3C
    /// level 1 writes it; a later version's first four fields (its rules
    /// say a reader of an unknown version reads those); version `ff` and
    /// anything malformed refused, naming the field.
    pub fn parse(s: &str) -> Result<TraceContext, ContextError> {
        let s = s.trim_matches(|c| c == ' ' || c == '\t');
        let parts: Vec<&str> = s.split('-').collect();
        if parts.len() < 4 {
            return Err(ContextError(format!(
                "must be version-traceid-parentid-flags, not {s:?}"
            )));
        }
        let version = hex_to::<1>("version", parts[0]).or_else(|e| {
            // `00` is a version, though all zeros.
            if parts[0] == "00" { Ok([0]) } else { Err(e) }
        })?;
        match version[0] {
            0xff => return Err(ContextError("version ff is invalid".into())),
            0 if parts.len() != 4 => {
                return Err(ContextError(format!(
                    "version 00 has four fields, not {}",
                    parts.len()
                )));
            }
            _ => {}
        }
        let trace = TraceId::parse(parts[1])?;
        let span = SpanId::parse(parts[2])?;
        let flags = parts[3];
        if flags.len() != 2
            || !flags
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(ContextError(format!(
                "trace-flags must be two lowercase hexadecimal digits: {flags:?}"
            )));
        }
        let sampled = u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1);
        Ok(TraceContext {
            trace,
            span,
            sampled,
        })
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` value, version `00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{}",
            self.trace.hex(),
            self.span.hex(),
            if self.sampled { "01" } else { "00" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let c = TraceContext::parse(GOOD).unwrap();
        assert!(c.sampled);
        assert_eq!(c.to_string(), GOOD);
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
        let c = TraceContext::parse(later).unwrap();
        assert_eq!(c.trace.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(!c.sampled);
    }

    #[test]
    fn a_bad_traceparent_is_refused_naming_its_field() {
        for (bad, says) in [
            ("", "version-traceid"),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version ff",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace-id must not be all zeros",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent-id must not be all zeros",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "lowercase",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "32 hexadecimal",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "trace-flags",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "four fields",
            ),
            (
                "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version",
            ),
        ] {
            let e = TraceContext::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_runs_span_is_its_ids_random_half() {
        let run = "019ac4f2-7d3e-7abc-8def-0123456789ab";
        assert_eq!(span_of_run(run).unwrap().hex(), "8def0123456789ab");
        assert_eq!(
            trace_of_run(run).unwrap().hex(),
            "019ac4f27d3e7abc8def0123456789ab"
        );
        assert!(span_of_run("not-a-run").is_err());
    }
}
