//! An agent's log (`ctx/agent/<name>.d/log`): what it wrote to its stderr,
//! one JSON line a piece (`{"ts","run","stream","text"}`), as the
//! supervisor's projection appends it. Read here by byte offset (to follow
//! it) or from its end (a tail), for `brood logs`, `brood show`, `brood run`
//! and `GET /api/agents/{name}/log`.
//!
//! The file lies in the agent's own part of the ctx tree, so it is opened
//! without following a symlink and read only when it is a regular file: a
//! child that put a link there would otherwise have its supervisor read
//! whatever the link names for the caller. Such a log reads as empty (and
//! the reader's log says why).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use brood_api::{AgentLog, LogEntry};
use serde_json::Value;

/// The most bytes one read takes from the file: a follower asks again
/// from `next` for the rest.
pub const PAGE_BYTES: u64 = 1 << 20;
/// The most entries a tail gives.
pub const TAIL_MAX: usize = 1000;

/// Opens the log without following a symlink; `None` when there is none.
fn open(path: &Path) -> std::io::Result<Option<(File, u64)>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            tracing::warn!(path = %path.display(), "an agent's log is a symlink: not read");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let m = f.metadata()?;
    if !m.is_file() {
        tracing::warn!(path = %path.display(), "an agent's log is not a regular file: not read");
        return Ok(None);
    }
    Ok(Some((f, m.len())))
}

/// The entries of complete lines in `bytes` (starting at a line's start),
/// and how many bytes they span; a line not yet ended is left for later.
fn parse(bytes: &[u8]) -> (Vec<LogEntry>, usize) {
    let mut entries = Vec::new();
    let mut used = 0;
    while let Some(end) = bytes[used..].iter().position(|&b| b == b'\n') {
        let line = &bytes[used..used + end];
        used += end + 1;
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        entries.push(LogEntry {
            ts_ms: v["ts"].as_i64().unwrap_or(0),
            run: v["run"].as_str().unwrap_or("").to_owned(),
            stream: v["stream"].as_str().unwrap_or("stderr").to_owned(),
            text: v["text"].as_str().unwrap_or("").to_owned(),
        });
    }
    (entries, used)
}

/// The entries after byte `after` (at most [`PAGE_BYTES`] of the file), or
/// with `tail`, the last `tail` entries (at most [`TAIL_MAX`]) whatever
/// `after` says. `next` is where to ask again from.
pub fn read(path: &Path, after: u64, tail: Option<usize>) -> std::io::Result<AgentLog> {
    let Some((mut f, len)) = open(path)? else {
        return Ok(AgentLog {
            entries: Vec::new(),
            next: 0,
        });
    };
    if let Some(n) = tail {
        let n = n.min(TAIL_MAX);
        let from = len.saturating_sub(PAGE_BYTES);
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::new();
        f.take(len - from).read_to_end(&mut buf)?;
        // Reading from the middle of the file: the first line may be cut.
        let start = if from == 0 {
            0
        } else {
            buf.iter()
                .position(|&b| b == b'\n')
                .map_or(buf.len(), |i| i + 1)
        };
        let (mut entries, used) = parse(&buf[start..]);
        let skip = entries.len().saturating_sub(n);
        entries.drain(..skip);
        return Ok(AgentLog {
            entries,
            next: from + (start + used) as u64,
        });
    }
    if after >= len {
        // A log read past its end (or one replaced by a shorter file).
        return Ok(AgentLog {
            entries: Vec::new(),
            next: after.min(len),
        });
    }
    f.seek(SeekFrom::Start(after))?;
    let mut buf = Vec::new();
    f.take((len - after).min(PAGE_BYTES))
        .read_to_end(&mut buf)?;
    let (entries, used) = parse(&buf);
    // A single line longer than a page is skipped rather than stalling a follower.
    let used = if used == 0 && buf.len() as u64 == PAGE_BYTES {
        buf.len()
    } else {
        used
    };
    Ok(AgentLog {
        entries,
        next: after + used as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn line(run: &str, text: &str) -> String {
        format!(
            "{}\n",
            serde_json::json!({"ts": 1, "run": run, "stream": "stderr", "text": text})
        )
    }

    #[test]
    fn read_by_offset_and_from_the_end() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let missing = read(&p, 0, None).unwrap();
        assert!(missing.entries.is_empty());
        let mut f = std::fs::File::create(&p).unwrap();
        for i in 0..5 {
            f.write_all(line("r", &format!("line {i}\n")).as_bytes())
                .unwrap();
        }
        // A line not yet ended is not given.
        f.write_all(b"{\"ts\":2,\"run\":\"r\",\"te").unwrap();
        let all = read(&p, 0, None).unwrap();
        assert_eq!(all.entries.len(), 5);
        assert_eq!(all.entries[4].text, "line 4\n");
        let again = read(&p, all.next, None).unwrap();
        assert!(again.entries.is_empty());
        assert_eq!(again.next, all.next);
        let tail = read(&p, 0, Some(2)).unwrap();
        let texts: Vec<_> = tail.entries.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["line 3\n", "line 4\n"]);
        assert_eq!(tail.next, all.next);
    }

    #[test]
    fn a_symlink_in_place_of_the_log_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        std::fs::write(&secret, line("r", "secret")).unwrap();
        let p = d.path().join("log");
        std::os::unix::fs::symlink(&secret, &p).unwrap();
        assert!(read(&p, 0, None).unwrap().entries.is_empty());
        assert!(read(&p, 0, Some(10)).unwrap().entries.is_empty());
    }
}
