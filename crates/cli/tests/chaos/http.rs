//! One HTTP/1.1 request to a node's control socket with a deadline: under
//! faults a node may be stopped (its socket accepts, nothing answers), killed
//! (nothing accepts) or slow, and none of that may hang the campaign. A call
//! that fails is an answer too (`Err`), never a panic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// An answer: its status and its body's bytes.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON (`Null` when empty or not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn call(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
    limit: Duration,
) -> Result<Answer, String> {
    let t0 = Instant::now();
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(limit))
        .and_then(|()| s.set_write_timeout(Some(limit)))
        .map_err(|e| format!("timeouts: {e}"))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        if t0.elapsed() > limit {
            return Err(format!("no whole answer within {limit:?}"));
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    parse(&raw)
}

fn parse(raw: &[u8]) -> Result<Answer, String> {
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {} bytes", raw.len()))?;
    let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let rest = &raw[at + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        unchunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(Answer { status, body })
}

/// A chunked body's bytes (RFC 9112 7.1); an answer cut short is an error.
fn unchunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let line = String::from_utf8_lossy(&rest[..eol]);
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("chunk size {line:?}: {e}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err("a chunk cut short".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
