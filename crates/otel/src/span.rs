//! A span as brood builds it: whole, once what it describes is over, with
//! its ids and times given rather than drawn or read from a clock. A run that
//! started on one node and ended on another, or hours later, is one value
//! made at its end from its record, never a span held open in memory.

use crate::context::{SpanId, TraceId};

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(i64::from(v))
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

/// What side of a call a span is (OpenTelemetry's span kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal,
    Client,
    Server,
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    pub trace: TraceId,
    pub id: SpanId,
    /// `None` for a trace's root span.
    pub parent: Option<SpanId>,
    pub kind: Kind,
    /// Unix time in nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(String, Value)>,
    /// Set when what it describes failed: the status's description.
    pub error: Option<String>,
}

/// Unix milliseconds (the store's times) as nanoseconds; a time before the
/// epoch reads as the epoch.
pub fn ms_to_ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// Now, in Unix nanoseconds.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Span {
    pub fn new(
        name: impl Into<String>,
        trace: TraceId,
        id: SpanId,
        parent: Option<SpanId>,
    ) -> Span {
        Span {
            name: name.into(),
            trace,
            id,
            parent,
            kind: Kind::Internal,
            start_ns: 0,
            end_ns: 0,
            attributes: Vec::new(),
            error: None,
        }
    }

    pub fn times(mut self, start_ns: u64, end_ns: u64) -> Span {
        self.start_ns = start_ns;
        // A clock that stepped back between the two never gives a negative span.
        self.end_ns = end_ns.max(start_ns);
        self
    }

    pub fn kind(mut self, kind: Kind) -> Span {
        self.kind = kind;
        self
    }

    pub fn attr(mut self, key: &str, value: impl Into<Value>) -> Span {
        self.attributes.push((key.to_owned(), value.into()));
        self
    }

    /// An attribute only when there is a value.
    pub fn attr_opt(self, key: &str, value: Option<impl Into<Value>>) -> Span {
        match value {
            Some(v) => self.attr(key, v),
            None => self,
        }
    }

    pub fn failed(mut self, description: impl Into<String>) -> Span {
        self.error = Some(description.into());
        self
    }
}

/// A fresh span id for a span that is no run's (an admission, a model
/// call): 8 bytes from the kernel's random source, never all zero.
pub fn random_span_id() -> SpanId {
    let mut b = [0u8; 8];
    if getrandom_into(&mut b) && b.iter().any(|x| *x != 0) {
        return SpanId(b);
    }
    // No random source: the clock and a counter, still unique within this
    // process, never zero.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SpanId((now_ns().rotate_left(17) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).to_be_bytes())
}

/// A fresh trace id, the same way.
pub fn random_trace_id() -> TraceId {
    let (a, b) = (random_span_id(), random_span_id());
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&a.0);
    t[8..].copy_from_slice(&b.0);
    TraceId(t)
}

fn getrandom_into(buf: &mut [u8]) -> bool {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
}
