//! The world a campaign runs in: three real `brood serve` nodes whose roots
//! are on a small tmpfs of the campaign's own (so that "the filesystem is
//! full" can be made and undone), sharing a PostgreSQL server of the
//! campaign's own (`initdb`, so it can be stopped and started) reached
//! through a TCP proxy that can delay, drop and black-hole, and a Redis of
//! its own for the tenant's slots (so it can be restarted). Nothing here
//! touches the machine's shared PostgreSQL or Redis.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brood_store_conformance::pg::Private;
use brood_store_conformance::proxy::Proxy;

use crate::http;

/// The quotas every node reads from its root's `config.toml`: low enough
/// that a few trees reach each of them.
pub const MAX_DEPTH: u64 = 2;
pub const MAX_FANOUT: u64 = 3;
pub const MAX_TREE_SIZE: u64 = 8;
pub const MAX_CONCURRENT: u64 = 6;

/// The sweepers' tick of every node, and how long a node may miss its
/// heartbeats before the others declare it lost.
pub const SWEEP_EVERY_S: f64 = 0.2;
pub const NODE_EXPIRY_S: f64 = 4.0;

/// The tmpfs of the roots.
const FS_SIZE: &str = "64m";

pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_brood")
}

/// The test agent's argv with these flags.
pub fn agent(flags: &[&str]) -> Vec<String> {
    let mut v = vec![exe().to_owned(), "test-agent".to_owned()];
    v.extend(flags.iter().map(|s| (*s).to_owned()));
    v
}

/// Asks the kernel to SIGKILL the child when the thread that started it
/// (the campaign's main thread) ends, so a campaign killed outright leaves
/// no server behind.
fn die_with_us(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling a process this campaign started and has not reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port: {e}"))
}

/// One `brood serve`.
pub struct Node {
    pub index: usize,
    pub root: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pub paused: bool,
    store: String,
    slots: String,
}

impl Node {
    pub fn sock(&self) -> PathBuf {
        self.root.join("brood.sock")
    }

    pub fn zone(&self) -> String {
        format!("z{}", self.index)
    }

    /// Its process while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Running (maybe stopped by SIGSTOP).
    pub fn up(&self) -> bool {
        self.child.is_some()
    }

    /// Running and not stopped: it can be asked something.
    pub fn usable(&self) -> bool {
        self.up() && !self.paused
    }

    /// The last lines of its log (each cut short), for a violation that
    /// names it; the whole log is kept when a campaign finds a violation.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.chars().take(300).collect())
            .collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    }

    pub fn log(&self) -> &std::path::Path {
        &self.log
    }

    /// Starts it and waits until its API answers `/healthz`.
    pub fn start(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        #[allow(clippy::disallowed_methods)] // the campaign's nodes, not agents
        let mut cmd = Command::new(exe());
        cmd.arg("--root")
            .arg(&self.root)
            .env("BROOD_STORE", &self.store)
            .env_remove("BROOD_SOCKET")
            // What the nodes did, for whoever reads a violation's logs.
            .env("BROOD_LOG", "info")
            .args(["serve", "--grace", "0.3"])
            .args(["--sweep-every", &SWEEP_EVERY_S.to_string()])
            .args(["--node-expiry", &NODE_EXPIRY_S.to_string()])
            .args(["--label", &format!("zone={}", self.zone())])
            .args(["--capacity", "50", "--slots", &self.slots])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_us(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting node {}: {e}", self.index))?;
        self.child = Some(child);
        self.paused = false;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(40) {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "node {} exited at start ({status}): {}",
                    self.index,
                    self.log_tail()
                ));
            }
            if let Ok(a) = http::call(
                &self.sock(),
                "GET",
                "/healthz",
                None,
                Duration::from_secs(2),
            ) && a.status == 200
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "node {} did not answer /healthz within 40 s: {}",
            self.index,
            self.log_tail()
        ))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, libc::SIGKILL);
            let _ = c.wait();
        }
        self.paused = false;
    }

    pub fn pause(&mut self) {
        if let Some(c) = &self.child {
            signal(c, libc::SIGSTOP);
            self.paused = true;
        }
    }

    pub fn resume(&mut self) {
        if let Some(c) = &self.child {
            signal(c, libc::SIGCONT);
        }
        self.paused = false;
    }

    /// SIGTERM, and a clean exit (status 0) within 30 s; past it, SIGKILL
    /// and the error.
    pub fn stop(&mut self) -> Result<(), String> {
        self.resume();
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        signal(&c, libc::SIGTERM);
        let t0 = Instant::now();
        loop {
            match c.try_wait() {
                Ok(Some(s)) if s.success() => {
                    // A shutdown that ran out of patience stopped cleanly
                    // (what was left died with its groups), but what it
                    // waited for is a finding: shown, not judged.
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    if let Some(l) = log
                        .lines()
                        .find(|l| l.contains("the shutdown ends without"))
                    {
                        println!(
                            "chaos: NOTE node {}'s shutdown ran out of patience: {}",
                            self.index,
                            l.chars().take(1200).collect::<String>()
                        );
                    }
                    return Ok(());
                }
                Ok(Some(s)) => {
                    return Err(format!(
                        "node {} stopped with {s}: {}",
                        self.index,
                        self.log_tail()
                    ));
                }
                Ok(None) if t0.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    // Where each of its threads waits, read before the
                    // kill: the log says nothing of a node that hangs.
                    let threads = threads_of(c.id());
                    signal(&c, libc::SIGKILL);
                    let _ = c.wait();
                    return Err(format!(
                        "node {} did not stop within 30 s of SIGTERM; its threads: {threads}; its log: {}",
                        self.index,
                        self.log_tail()
                    ));
                }
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            signal(c, libc::SIGCONT);
        }
        self.kill();
    }
}

/// A `redis-server` of the campaign's own, restarted on the same port.
pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn up(&self) -> bool {
        self.child.is_some()
    }

    pub fn start(&mut self) -> Result<(), String> {
        #[allow(clippy::disallowed_methods)] // the campaign's Redis
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_us(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            format!("redis-server cannot start ({e}): install it (apt-get install redis-server)")
        })?;
        self.child = Some(child);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if redis_pings(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "redis-server on port {} never answered PING",
            self.port
        ))
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, libc::SIGKILL);
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn redis_pings(port: u16) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// The campaign's PostgreSQL: its server, the proxy the nodes reach it
/// through, and the nodes' database.
pub struct Pg {
    pub proxy: Proxy,
    /// The nodes' URL (through the proxy).
    pub url: String,
    /// The administrator's URL on the nodes' database, straight to the server.
    direct: String,
    pub down: bool,
    // Last: stopped after the proxy is dropped.
    pub server: Private,
}

const DB: &str = "chaos";

impl Pg {
    fn new() -> Result<Pg, String> {
        let server = Private::new();
        sql(&server.url, &format!("CREATE DATABASE {DB}"))?;
        let direct = server.url.replace("/postgres", &format!("/{DB}"));
        let (proxy, url) = Proxy::for_postgres(&direct);
        Ok(Pg {
            proxy,
            url,
            direct,
            down: false,
            server,
        })
    }

    /// `pg_terminate_backend` of every connection to the nodes' database
    /// but this one; how many.
    pub fn terminate_backends(&self) -> Result<u64, String> {
        let rows = query_i64(
            &self.direct,
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
        )?;
        Ok(rows.max(0) as u64)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime: {e}"))
}

fn sql(url: &str, stmt: &str) -> Result<(), String> {
    runtime()?.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let task = tokio::spawn(conn);
        let r = c
            .batch_execute(stmt)
            .await
            .map_err(|e| format!("{stmt}: {e}"));
        drop(c);
        let _ = task.await;
        r
    })
}

fn query_i64(url: &str, stmt: &str) -> Result<i64, String> {
    runtime()?.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let task = tokio::spawn(conn);
        let r = c
            .query_one(stmt, &[])
            .await
            .map(|row| row.get::<_, i64>(0))
            .map_err(|e| format!("{stmt}: {e}"));
        drop(c);
        let _ = task.await;
        r
    })
}

pub struct World {
    // Dropped in this order: the nodes before what they use.
    pub nodes: Vec<Node>,
    pub redis: Redis,
    pub pg: Pg,
    pub mount: Mount,
}

/// The roots' tmpfs and the campaign's directory around it: unmounted and
/// removed when dropped, whatever happened.
pub struct Mount {
    /// The tmpfs the roots are on.
    pub fs: PathBuf,
    pub dir: PathBuf,
    mounted: bool,
}

impl Mount {
    fn new(tag: &str) -> Result<Mount, String> {
        let dir = std::env::temp_dir().join(format!("brood-chaos-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let fs = dir.join("fs");
        std::fs::create_dir_all(&fs).map_err(|e| format!("{}: {e}", fs.display()))?;
        let mut m = Mount {
            fs,
            dir,
            mounted: false,
        };
        let at = m.fs.to_string_lossy().into_owned();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={FS_SIZE}"),
                "tmpfs",
                &at,
            ],
        )
        .map_err(|e| format!("the roots' tmpfs (the campaign runs as root): {e}"))?;
        m.mounted = true;
        Ok(m)
    }

    /// Unmounted (it must not be busy) and the directory removed.
    pub fn remove(&mut self) -> Result<(), String> {
        if self.mounted {
            run("umount", &[&self.fs.to_string_lossy()])?;
            self.mounted = false;
        }
        std::fs::remove_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &["-l", &self.fs.to_string_lossy()]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    /// Everything started, the nodes answering.
    pub fn new(tag: &str) -> Result<World, String> {
        let mount = Mount::new(tag)?;
        let pg = Pg::new()?;
        let mut redis = Redis {
            port: free_port()?,
            dir: mount.dir.join("redis"),
            child: None,
        };
        std::fs::create_dir_all(&redis.dir).map_err(|e| format!("redis dir: {e}"))?;
        redis.start()?;
        let config = format!(
            "[quotas.defaults]\nmax_depth = {MAX_DEPTH}\nmax_fanout = {MAX_FANOUT}\n\
             max_tree_size = {MAX_TREE_SIZE}\nmax_concurrent = {MAX_CONCURRENT}\n"
        );
        let mut nodes = Vec::new();
        for i in 0..3 {
            let root = mount.fs.join(format!("n{i}"));
            std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
            File::create(root.join("config.toml"))
                .and_then(|mut f| f.write_all(config.as_bytes()))
                .map_err(|e| format!("config.toml: {e}"))?;
            let mut node = Node {
                index: i,
                root,
                log: mount.dir.join(format!("n{i}.log")),
                child: None,
                paused: false,
                store: pg.url.clone(),
                slots: redis.url(),
            };
            node.start()?;
            nodes.push(node);
        }
        Ok(World {
            nodes,
            redis,
            pg,
            mount,
        })
    }

    /// Fills the roots' filesystem until a write fails; how many bytes.
    pub fn fill_disk(&self) -> u64 {
        let Ok(mut f) = File::create(self.mount.fs.join("fill")) else {
            return 0;
        };
        let chunk = vec![0x5a_u8; 256 * 1024];
        let mut n = 0u64;
        while f.write_all(&chunk).is_ok() {
            n += chunk.len() as u64;
        }
        n
    }

    pub fn free_disk(&self) {
        let _ = std::fs::remove_file(self.mount.fs.join("fill"));
    }

    pub fn usable(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|n| n.usable())
            .map(|n| n.index)
            .collect()
    }

    /// Stops every node with SIGTERM; each that did not stop cleanly.
    pub fn stop_nodes(&mut self) -> Vec<String> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.stop().err())
            .collect()
    }
}

fn run(exe: &str, args: &[&str]) -> Result<(), String> {
    #[allow(clippy::disallowed_methods)] // mount and umount of the campaign's tmpfs
    let out = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| format!("{exe}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{exe} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The roots' paths, for the kernel-side checks.
pub fn roots(world: &World) -> Vec<PathBuf> {
    world.nodes.iter().map(|n| n.root.clone()).collect()
}

/// Each thread of process `pid`: its name, state and the kernel function it
/// waits in, and the top of its kernel stack (root reads it), one per line.
fn threads_of(pid: u32) -> String {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(gone)".to_owned();
    };
    let mut out = Vec::new();
    for t in rd.flatten() {
        let dir = t.path();
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let stat = read("stat");
        // The state follows the name in parentheses.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split(' ').next())
            .unwrap_or("?")
            .to_owned();
        let stack: Vec<String> = read("stack")
            .lines()
            .take(4)
            .map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_owned())
            .collect();
        out.push(format!(
            "{} {} {state} {} [{}]",
            t.file_name().to_string_lossy(),
            read("comm"),
            read("wchan"),
            stack.join(" < ")
        ));
    }
    out.sort();
    out.join(" | ")
}
