//! A real Redis for tests: the one on 127.0.0.1:6379 when it answers PING,
//! otherwise a `redis-server` started on a free port and stopped when the last
//! test holding it lets go. Neither is a failure that says what to install.
//! Shared by the slot-counter tests of brood-runtime and the supervisor tests
//! of brood-cli (included with `#[path]`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A Redis the tests may use; a spawned one is stopped when the last test holding
/// it drops it.
pub struct Server {
    pub addr: SocketAddr,
    _own: Option<OwnServer>,
}

impl Server {
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

/// A `redis-server` started by these tests. It runs under a thread that lives as
/// long as the server and is its parent for PR_SET_PDEATHSIG, so even a test
/// process killed outright takes the server with it.
struct OwnServer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        // Dropping the sender wakes the owner thread, which kills and reaps.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

static SERVER: Mutex<Weak<Server>> = Mutex::new(Weak::new());

pub fn server() -> Arc<Server> {
    let mut shared = SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = shared.upgrade() {
        return s;
    }
    let local: SocketAddr = "127.0.0.1:6379".parse().unwrap();
    let s = if std::env::var_os("BROOD_TEST_REDIS_SPAWN").is_none() && pings(local) {
        Arc::new(Server {
            addr: local,
            _own: None,
        })
    } else {
        Arc::new(spawn_server())
    };
    *shared = Arc::downgrade(&s);
    s
}

pub fn pings(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

fn spawn_server() -> Server {
    spawn_server_on(free_port())
}

/// A port nothing listens on: bound, read and released.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the caller's own on `port`, stopped when dropped.
pub fn spawn_server_on(port: u16) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (started_tx, started) = mpsc::channel::<Result<(), String>>();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let workdir = dir.path().to_owned();
    let thread = thread::spawn(move || {
        #[allow(clippy::disallowed_methods)] // a test's Redis server, not an agent
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&workdir)
            .stdout(std::process::Stdio::null());
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = started_tx.send(Err(format!(
                    "redis-server is missing or cannot start ({e}), and nothing answers \
                     PING on 127.0.0.1:6379: install it (apt-get install redis-server) \
                     to run the Redis slot-counter tests"
                )));
                return;
            }
        };
        let _ = started_tx.send(Ok(()));
        // Returns when the Server is dropped (the sender goes away).
        let _ = stop_rx.recv();
        let _ = child.kill();
        let _ = child.wait();
    });
    if let Err(e) = started.recv().unwrap() {
        panic!("{e}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pings(addr) {
        assert!(
            Instant::now() < deadline,
            "redis-server started on port {port} but never answered PING"
        );
        thread::sleep(Duration::from_millis(20));
    }
    Server {
        addr,
        _own: Some(OwnServer {
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }),
    }
}

/// One command over a fresh raw connection, independent of the client under
/// test; returns the reply's first line, or the bulk string's content.
pub fn raw(addr: SocketAddr, args: &[&str]) -> String {
    raw_in(addr, 0, args)
}

/// The slots a tenant's key holds in database `db`: the sum of its shares.
pub fn held(addr: SocketAddr, db: u32, key: &str) -> u64 {
    let sum = "local t = 0 for _, v in ipairs(redis.call('HVALS', KEYS[1])) do t = t + tonumber(v) end return t";
    let r = raw_in(addr, db, &["EVAL", sum, "1", key]);
    r.strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key}: {r}"))
}

/// [`raw`] in database `db` (a test that shares the server keeps its keys
/// apart from the others').
pub fn raw_in(addr: SocketAddr, db: u32, args: &[&str]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let db = db.to_string();
    let select = format!("*2\r\n$6\r\nSELECT\r\n${}\r\n{db}\r\n", db.len());
    s.write_all(select.as_bytes()).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK", "SELECT {db}");
    line.clear();
    r.read_line(&mut line).unwrap();
    let line = line.trim_end().to_owned();
    if line.starts_with('$') && line != "$-1" {
        let mut body = String::new();
        r.read_line(&mut body).unwrap();
        return body.trim_end().to_owned();
    }
    line
}
