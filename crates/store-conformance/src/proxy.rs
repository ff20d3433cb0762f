//! A TCP proxy in front of a real PostgreSQL server, for the faults a
//! network makes. It can go silent: it reads what either side sends and
//! forwards nothing (a network that black-holes: the server never hears the
//! query, the client never the answer), without closing anything. And it can
//! lose a commit: it reads the client's messages (the frontend protocol: a
//! type byte and an i32 length), and at the commit it was told to lose it
//! cuts the connection there, one of the ways of [`Loss`]. Shared by the
//! store's tests and the CLI's (a test fixture: it panics when it cannot set
//! itself up).
//!
//! For the fault campaign (`crates/cli/tests/chaos.rs`) it can also delay
//! every forwarded read by a latency, and drop every open connection at once
//! (both sides closed, as a network that resets them). And it can refuse:
//! every connection dropped and each new one closed at once, a server that
//! is down, so that every call fails at once instead of at its deadline.
//!
//! What commits. An explicit one is a simple query whose last statement is
//! `COMMIT` or `END` inside a block a `BEGIN` (or `START TRANSACTION`)
//! opened, which is what the store sends (tokio-postgres's
//! `Transaction::commit` sends the simple query `COMMIT` too). An implicit
//! one is a `Sync` after an `Execute` outside such a block: a statement of
//! the extended protocol that commits on its own.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the commit the proxy was told to lose is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The server gets it (and commits); its answer never reaches the
    /// client, whose connection is closed. The server's side is closed after
    /// the commit (it sees the client leave once it has answered).
    Answer,
    /// The server never gets it; both sides are closed (the server rolls
    /// the transaction back when it sees the client gone).
    Commit,
    /// The server never gets it, and its side is left open: its transaction
    /// waits, holding its locks, as behind a network that dropped the
    /// packet and never said so; the client's side is closed.
    CommitUnseen,
    /// The server never gets it, and nothing more goes either way on that
    /// connection, which stays open: the client waits for its deadline.
    Silence,
}

/// Which kind of commit an armed loss waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Explicit,
    Implicit,
}

/// What every connection through the proxy shares: the loss armed, and the
/// losses done.
#[derive(Default)]
struct Faults {
    silent: AtomicBool,
    /// New connections are closed at once (a server that is down).
    refusing: AtomicBool,
    /// Commits of the armed kind still to let through, plus one (0: none armed).
    countdown: AtomicUsize,
    armed: Mutex<Option<(Kind, Loss)>>,
    lost: AtomicUsize,
    /// Added before each forwarded read, either way (0: none).
    latency_ms: AtomicU64,
    /// The open connections (the client's side, the server's), by a number
    /// of their own, so that all can be dropped at once.
    open: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
    next: AtomicU64,
}

impl Faults {
    fn delay(&self) {
        let ms = self.latency_ms.load(Ordering::SeqCst);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    /// Whether a commit of `kind` is the one to lose (counting it down), and how.
    fn take(&self, kind: Kind) -> Option<Loss> {
        let armed = self.armed.lock().unwrap();
        let (k, how) = (*armed)?;
        if k != kind {
            return None;
        }
        match self.countdown.load(Ordering::SeqCst) {
            0 => None,
            1 => {
                self.countdown.store(0, Ordering::SeqCst);
                self.lost.fetch_add(1, Ordering::SeqCst);
                Some(how)
            }
            n => {
                self.countdown.store(n - 1, Ordering::SeqCst);
                None
            }
        }
    }
}

pub struct Proxy {
    pub port: u16,
    faults: Arc<Faults>,
}

impl Proxy {
    pub fn to(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let shared = faults.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if shared.refusing.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                // Set before the client's message that commits is forwarded,
                // so that no answer to it can slip through.
                let cut = Arc::new(AtomicBool::new(false));
                let id = shared.next.fetch_add(1, Ordering::SeqCst);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    shared.open.lock().unwrap().insert(id, (c, s));
                }
                let up = Upstream {
                    client: client.try_clone().unwrap(),
                    server: server.try_clone().unwrap(),
                    faults: shared.clone(),
                    cut: cut.clone(),
                };
                std::thread::spawn(move || up.run());
                let faults = shared.clone();
                std::thread::spawn(move || {
                    down(server, client, &faults, &cut);
                    faults.open.lock().unwrap().remove(&id);
                });
            }
        });
        Proxy { port, faults }
    }

    /// A PostgreSQL URL `url` with its host and port replaced by a proxy's
    /// (started to that host and port), and the proxy.
    pub fn for_postgres(url: &str) -> (Proxy, String) {
        let (head, rest) = url.split_once('@').unwrap();
        let slash = rest.find('/').unwrap();
        let upstream: SocketAddr = rest[..slash]
            .replace("localhost", "127.0.0.1")
            .parse()
            .unwrap();
        let proxy = Proxy::to(upstream);
        let proxied = format!("{head}@127.0.0.1:{}{}", proxy.port, &rest[slash..]);
        (proxy, proxied)
    }

    pub fn go_silent(&self, yes: bool) {
        self.faults.silent.store(yes, Ordering::SeqCst);
    }

    /// Delays every forwarded read by `latency` from now on (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.faults.latency_ms.store(ms, Ordering::SeqCst);
    }

    /// Closes every connection open through the proxy, both sides, as a
    /// network that resets them; returns how many there were. New
    /// connections are let through as before.
    pub fn drop_connections(&self) -> usize {
        let open: Vec<_> = self.faults.open.lock().unwrap().drain().collect();
        for (_, (client, server)) in &open {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        open.len()
    }

    /// Refuses the store (`yes`): every open connection closed and each new
    /// one closed as soon as it is made, until called with `false`.
    pub fn refuse(&self, yes: bool) {
        self.faults.refusing.store(yes, Ordering::SeqCst);
        if yes {
            self.drop_connections();
        }
    }

    /// Loses the `nth` explicit commit from now (1: the next), on whichever
    /// connection sends it, as `how` says.
    pub fn lose_commit(&self, nth: usize, how: Loss) {
        self.arm(Kind::Explicit, nth, how);
    }

    /// Loses the answer to the next implicit commit (a statement that
    /// commits on its own), as [`Loss::Answer`] does.
    pub fn lose_implicit_commit_answer(&self) {
        self.arm(Kind::Implicit, 1, Loss::Answer);
    }

    /// No commit is to be lost any more (one armed and not met yet).
    pub fn disarm(&self) {
        self.faults.countdown.store(0, Ordering::SeqCst);
    }

    /// How many commits were lost so far.
    pub fn lost(&self) -> usize {
        self.faults.lost.load(Ordering::SeqCst)
    }

    fn arm(&self, kind: Kind, nth: usize, how: Loss) {
        let mut armed = self.faults.armed.lock().unwrap();
        *armed = Some((kind, how));
        self.faults.countdown.store(nth, Ordering::SeqCst);
    }
}

/// The server's side to the client's: everything, unless silent or cut.
fn down(mut server: TcpStream, mut client: TcpStream, faults: &Faults, cut: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = client.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
        };
        faults.delay();
        // Read after the read, so an answer read after the cut is dropped.
        if faults.silent.load(Ordering::SeqCst) || cut.load(Ordering::SeqCst) {
            continue;
        }
        if client.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// The client's side to the server's, read message by message.
struct Upstream {
    client: TcpStream,
    server: TcpStream,
    faults: Arc<Faults>,
    cut: Arc<AtomicBool>,
}

impl Upstream {
    fn run(mut self) {
        let mut msgs = Messages::default();
        let mut buf = [0u8; 16 * 1024];
        // After a commit lost to `Loss::Silence`: nothing more goes through.
        let mut muted = false;
        loop {
            let n = match self.client.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = self.server.shutdown(Shutdown::Write);
                    return;
                }
                Ok(n) => n,
            };
            msgs.pending.extend_from_slice(&buf[..n]);
            let mut out = Vec::new();
            while let Some((bytes, commit)) = msgs.next() {
                let loss = commit.and_then(|k| self.faults.take(k));
                let Some(how) = loss else {
                    out.extend_from_slice(&bytes);
                    continue;
                };
                self.cut.store(true, Ordering::SeqCst);
                if how == Loss::Silence {
                    let _ = self.server.write_all(&out);
                    out.clear();
                    muted = true;
                    break;
                }
                if how == Loss::Answer {
                    out.extend_from_slice(&bytes);
                }
                let _ = self.server.write_all(&out);
                if how != Loss::CommitUnseen {
                    let _ = self.server.shutdown(Shutdown::Write);
                }
                let _ = self.client.shutdown(Shutdown::Both);
                // The server's side stays open while `down` reads it (its
                // own handle on the socket): closed only when the server
                // closes it, for `CommitUnseen`.
                return;
            }
            self.faults.delay();
            if self.faults.silent.load(Ordering::SeqCst) {
                continue;
            }
            if !muted && self.server.write_all(&out).is_err() {
                return;
            }
        }
    }
}

/// The SSL and GSSAPI encryption requests: the message after one is
/// untyped again.
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;

/// The client's byte stream cut into messages, with what the block state
/// says about each.
#[derive(Default)]
struct Messages {
    pending: Vec<u8>,
    /// Past the startup message (every message is typed from then on).
    started: bool,
    /// Inside a block a `BEGIN` opened.
    in_block: bool,
    /// An `Execute` since the last `Sync`.
    executed: bool,
}

impl Messages {
    /// The next whole message's bytes, and whether it commits (and how).
    fn next(&mut self) -> Option<(Vec<u8>, Option<Kind>)> {
        let typed = usize::from(self.started);
        let head = typed + 4;
        if self.pending.len() < head {
            return None;
        }
        let len = i32::from_be_bytes(self.pending[typed..head].try_into().unwrap());
        let total = typed + usize::try_from(len).unwrap();
        if self.pending.len() < total {
            return None;
        }
        let bytes: Vec<u8> = self.pending.drain(..total).collect();
        if !self.started {
            let code = i32::from_be_bytes(bytes[4..8].try_into().unwrap());
            self.started = code != SSL_REQUEST && code != GSSENC_REQUEST;
            return Some((bytes, None));
        }
        let commit = match bytes[0] {
            b'Q' => {
                let text = String::from_utf8_lossy(&bytes[5..bytes.len() - 1]).to_string();
                self.query(&text).then_some(Kind::Explicit)
            }
            b'E' => {
                self.executed = true;
                None
            }
            b'S' => {
                let implicit = std::mem::take(&mut self.executed) && !self.in_block;
                implicit.then_some(Kind::Implicit)
            }
            _ => None,
        };
        Some((bytes, commit))
    }

    /// Follows a simple query's statements through the block; whether its
    /// last one commits the block.
    fn query(&mut self, text: &str) -> bool {
        let mut commits = false;
        for stmt in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let word = |w: &str| {
                let s = stmt.to_ascii_uppercase();
                s == w || s.starts_with(&format!("{w} "))
            };
            commits = false;
            if word("BEGIN") || word("START") {
                self.in_block = true;
            } else if word("COMMIT") || word("END") {
                commits = self.in_block;
                self.in_block = false;
            } else if word("ROLLBACK") || word("ABORT") {
                self.in_block = false;
            }
        }
        commits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(t: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![t];
        v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn query(text: &str) -> Vec<u8> {
        let mut body = text.as_bytes().to_vec();
        body.push(0);
        typed(b'Q', &body)
    }

    #[test]
    fn commits_are_found_in_a_stream_cut_anywhere() {
        let mut startup = 8i32.to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608i32.to_be_bytes());
        let stream = [
            startup,
            query("BEGIN"),
            typed(b'E', b"\0\0\0\0\0"),
            typed(b'S', b""),
            query("commit"),
            typed(b'E', b"\0\0\0\0\0"),
            typed(b'S', b""),
            query("BEGIN; SELECT 1; END"),
            query("BEGIN"),
            query("ROLLBACK"),
        ]
        .concat();
        let mut m = Messages::default();
        let mut found = Vec::new();
        // One byte at a time: a message is whole only once its last byte came.
        for b in stream {
            m.pending.push(b);
            while let Some((_, commit)) = m.next() {
                found.push(commit);
            }
        }
        let e = Some(Kind::Explicit);
        let i = Some(Kind::Implicit);
        assert_eq!(
            found,
            [None, None, None, None, e, None, i, e, None, None],
            "startup, BEGIN, Execute, Sync, COMMIT, Execute, Sync alone, a block in one query, BEGIN, ROLLBACK"
        );
    }
}
