//! Helpers shared by the end-to-end tests: a supervisor on a fresh root, the test
//! agent's argv, and process/cgroup inspection through /proc and cgroupfs.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod anthropic;
pub mod cluster;
pub mod model;
// The real Redis of the slot-counter tests, shared with brood-runtime's.
#[path = "../../../runtime/tests/support/redis.rs"]
pub mod redis;
pub mod wire;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brood_core::AgentName;
use brood_runtime::{Caller, Config, SpawnRequest, Supervisor};
use serde_json::Value;

pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_brood")
}

/// argv of the test agent with these flags.
pub fn agent(flags: &[&str]) -> Vec<String> {
    let mut v = vec![exe().to_owned(), "test-agent".to_owned()];
    v.extend(flags.iter().map(|s| s.to_string()));
    v
}

pub fn me() -> Caller {
    Caller::User { uid: 0 }
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub sup: Supervisor,
}

impl Env {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// Leaves no stray cgroup behind, even when the test failed: kill and remove this
/// supervisor's groups and its instance directory.
impl Drop for Env {
    fn drop(&mut self) {
        let key = brood_runtime::paths::instance_key(self.dir.path());
        if let Ok(det) = brood_launch::cgroup::detect(Path::new("/"))
            && let Ok(cg) = brood_launch::cgroup::Cgroups::open(&det, &key)
        {
            let _ = cg.destroy();
            cg.remove_instance_dirs();
        }
    }
}

pub fn start(grace: Duration) -> Env {
    start_with(grace, |_| {})
}

pub fn start_with(grace: Duration, f: impl FnOnce(&mut Config)) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::new(dir.path().to_path_buf());
    cfg.agent_sockets = Some(brood_server::agent_sockets());
    cfg.grace = grace;
    cfg.bin_dir = Path::new(exe()).parent().map(Path::to_path_buf);
    f(&mut cfg);
    let sup = Supervisor::start(cfg).expect("supervisor starts");
    Env { dir, sup }
}

pub fn req(name: &str, argv: Vec<String>) -> SpawnRequest {
    SpawnRequest {
        customer: None,
        label: None,
        placement: None,
        traceparent: None,
        name: Some(AgentName::new(name).expect("valid name")),
        parent: None,
        argv,
        protocol: brood_store::Protocol::Brood,
        task: format!("task of {name}"),
        env: Vec::new(),
        secrets: brood_api::Secrets::new(),
        cwd: None,
        session: brood_core::SessionName::default_session(),
        await_ready: true,
        policy: None,
        life: brood_core::Life::Owned,
        iso: brood_core::Iso::None,
        root: None,
    }
}

pub fn name(s: &str) -> AgentName {
    AgentName::new(s).expect("valid name")
}

pub fn show(env: &Env, n: &str) -> Value {
    serde_json::to_value(env.sup.view().show(&name(n)).expect("agent exists")).unwrap()
}

/// `n`'s record once it has ended (waited for up to a minute, as its
/// creator).
pub async fn wait_end(env: &Env, n: &str) -> Value {
    env.sup
        .wait(me(), vec![name(n)], Some(Duration::from_secs(60)))
        .await
        .unwrap();
    show(env, n)
}

/// `r`'s value, or `None` when what was read at `path` is not there (a group
/// removed, a process gone): that is an answer. Any other error fails the
/// test, naming the path: a directory the test cannot read is not an empty
/// one, and a check that could not look must not pass.
pub fn unless_gone<T>(r: std::io::Result<T>, path: &Path) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        // A cgroup's file read while the group is being removed.
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => None,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// Every pid in a cgroup directory and the groups below it.
pub fn pids_under(dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let procs = dir.join("cgroup.procs");
    let Some(text) = unless_gone(std::fs::read_to_string(&procs), &procs) else {
        return out;
    };
    out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    if let Some(rd) = unless_gone(std::fs::read_dir(dir), dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(pids_under(&e.path()));
            }
        }
    }
    out
}

/// True while the process exists, a zombie included: a zombie nobody reaps
/// is a leak the containment must not leave (issue 11 item 3), so it counts
/// as alive until its parent (the agent's own, the keeper, or the supervisor
/// as subreaper) has waited for it.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "X"),
        Err(_) => false,
    }
}

/// Polls `f` until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub async fn eventually_async(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t0.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn read(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p.as_ref()).unwrap_or_default()
}

pub fn session_dir(env: &Env, n: &str) -> PathBuf {
    env.sup
        .paths()
        .session_dir(&name(n), &brood_core::SessionName::default_session())
}

pub fn json_lines(p: impl AsRef<Path>) -> Vec<Value> {
    read(p)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Every process whose environment says it belongs to agent `n` of this root.
pub fn processes_of(env: &Env, n: &str) -> Vec<i32> {
    let want_agent = format!("BROOD_AGENT={n}");
    let want_root = format!("CTX_ROOT={}", env.sup.paths().ctx().display());
    let mut out = Vec::new();
    if let Some(rd) = unless_gone(std::fs::read_dir("/proc"), Path::new("/proc")) {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(env_bytes) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            let vars: Vec<&[u8]> = env_bytes.split(|b| *b == 0).collect();
            let has = |w: &str| vars.contains(&w.as_bytes());
            if has(&want_agent) && has(&want_root) && alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// Runs the `brood` binary on `root` (outside any agent's socket).
pub fn brood(root: &Path, args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    std::process::Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(args)
        .env_remove("BROOD_SOCKET")
        .output()
        .expect("brood runs")
}

/// A command's exit code and output, for assertion messages.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A `brood serve` the test started: stopped (SIGTERM, then reaped) when dropped.
pub struct Daemon(pub std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // Already stopped and reaped by the test: its pid may name another
        // process by now.
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        // SAFETY: signalling the daemon this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The directory of the `brood` binary under test.
pub fn exe_dir() -> String {
    Path::new(exe())
        .parent()
        .expect("the binary has a directory")
        .to_string_lossy()
        .into_owned()
}

/// Mount table lines (SPEC 3) that let the test agent run inside `iso = ns`:
/// the system's program and library directories and the binary's own, read-only.
pub fn system_mounts() -> Vec<String> {
    let exe_dir = exe_dir();
    let mut mounts: Vec<String> = ["/usr", "/lib", "/lib64", "/bin"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| format!("{p}\t{p}\tro\tbind,nosuid,nodev"))
        .collect();
    mounts.push(format!("{exe_dir}\t{exe_dir}\tro\tbind,nosuid,nodev"));
    mounts
}

/// The keeper of the PID namespace `pid` lives in: the process of that
/// namespace whose pid there is 1 (proc(5) `NSpid`).
pub fn keeper_of(pid: i32) -> Option<i32> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{p}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&ns)
        {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let last = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .and_then(|l| l.split_whitespace().last());
        if last == Some("1") {
            return Some(p);
        }
    }
    None
}

/// The channel `p` -> `child` as the store keeps it.
pub fn stored_channel(env: &Env, child: &str) -> brood_store::Channel {
    env.sup
        .store()
        .channel(env.sup.tenant(), &name("p"), &name(child))
        .unwrap()
        .unwrap_or_else(|| panic!("no channel p -> {child}"))
}

/// The narrow policy of the hostile-child tests: the shell, `/` read-only,
/// `dir` writable, and limits.
pub fn narrow_policy(dir: &Path) -> Value {
    serde_json::json!({
        "tools": ["shell"],
        "files": [{"path": "/", "mode": "ro"}, {"path": dir.display().to_string(), "mode": "rw"}],
        "resources": {"pids_max": 64, "memory_max": 268435456},
    })
}

/// One HTTP/1.1 request to the API on a control socket, the connection
/// closed after it: the status and the JSON body (`Null` when empty, a
/// string when not JSON).
pub fn http(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, _, v) = http_full(sock, method, path, body);
    (status, v)
}

/// [`http`] with the answer's head (status line and headers) too.
pub fn http_full(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, String, Value) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", sock.display()));
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let v = if rest.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(rest).unwrap_or_else(|_| Value::String(rest.to_owned()))
    };
    (status, head.to_owned(), v)
}

/// A free loopback port (bound and released: the daemon binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `brood serve` on `root` (and `--listen ADDR` when given), its log on the
/// test's stderr, once its socket accepts.
pub fn serve_daemon(root: &Path, listen: Option<&str>) -> Daemon {
    serve_daemon_with(root, listen, &[])
}

/// [`serve_daemon`] with these variables added to its environment.
pub fn serve_daemon_with(root: &Path, listen: Option<&str>, vars: &[(&str, &str)]) -> Daemon {
    let mut args = vec!["serve", "--grace", "0.3"];
    if let Some(l) = listen {
        args.extend(["--listen", l]);
    }
    #[allow(clippy::disallowed_methods)]
    let child = std::process::Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(&args)
        .envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let sock = root.join("brood.sock");
    assert!(
        eventually(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "the daemon serves {}",
        sock.display()
    );
    d
}

/// Whether the PostgreSQL server that `admin` (a connection URL) reaches
/// has a database named `name` (for the benchmarks' tests: each run's
/// database must be gone afterwards).
pub fn database_exists(admin: &str, name: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(conn);
        let row = c
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap();
        drop(c);
        let _ = task.await;
        row.get::<_, i64>(0) > 0
    })
}

/// Runs `stmt` on the SQLite store at `db` beside the running supervisor
/// (a test's way to make the store fail under it: a table renamed away).
pub fn sql(db: &Path, stmt: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c.execute_batch(stmt).unwrap();
}

/// What the three-level tree of reference agents (`top` > `mid` > `leaf`,
/// each creating the next and reporting "<name> done") ends with when
/// nothing interrupts it: each agent, its status, its result and its
/// children (the restart and moved-node tests compare their runs with it).
pub fn three_levels_completed() -> Vec<(String, String, String, Vec<String>)> {
    vec![
        (
            "top".into(),
            "completed".into(),
            "top done".into(),
            vec!["mid".into()],
        ),
        (
            "mid".into(),
            "completed".into(),
            "mid done".into(),
            vec!["leaf".into()],
        ),
        (
            "leaf".into(),
            "completed".into(),
            "leaf done".into(),
            vec![],
        ),
    ]
}
