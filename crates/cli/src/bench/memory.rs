//! `brood bench memory`: what a live agent costs the supervisor (issue 28
//! item 4). One real `brood serve` node per store (SQLite in its root; with
//! `--store postgres://…` also PostgreSQL, in a database made for the run),
//! agents created through its API as idle roots (`brood test-agent --hang`)
//! and kept alive, and at each level of live agents the daemon's RSS
//! (`/proc/PID/status`), PSS (`/proc/PID/smaps_rollup`) and open descriptors
//! (`/proc/PID/fd`, counted by kind). Only the daemon's own process is read:
//! the agents, and the keeper that is their PID namespace's init, are
//! processes of their own. The cost per live agent is each level's increase
//! over the level of none, divided by its agents.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brood_server::client::Connection;
use serde_json::{Value, json};

use super::cluster::Database;
use super::daemons::{Node, call, endpoint};

/// Issue 28's target for each live agent: the daemon's RSS grows by at most
/// this many KiB…
const TARGET_KIB: f64 = 32.0;
/// …and it holds at most this many more descriptors.
const TARGET_FDS: f64 = 2.0;

/// Connections creating (and cancelling) agents at once: enough to keep
/// the node's spawner busy, few enough that their own descriptors are gone
/// before a reading.
const CLIENTS: usize = 8;

/// How long the node is left alone before a reading, so the descriptors of
/// the calls just made are closed and the agents' start-up output read.
const SETTLE: Duration = Duration::from_secs(1);

/// The prefix of every agent this bench creates.
const PREFIX: &str = "bm";

pub(super) struct Params {
    /// The numbers of live agents read, ascending; the first is 0 (the
    /// baseline every increase is taken over).
    pub levels: Vec<usize>,
    /// `--store postgres://…` (an administrator's URL: a database is made
    /// on its server for the run); none: SQLite alone.
    pub store: Option<String>,
}

/// The levels as measured: sorted, without repeats, 0 first.
pub(super) fn levels(asked: &[usize]) -> Vec<usize> {
    let mut v: Vec<usize> = asked.to_vec();
    v.push(0);
    v.sort_unstable();
    v.dedup();
    v
}

pub(super) async fn run(root: &Option<PathBuf>, exe: &str, p: &Params) -> Result<Value> {
    let (dir, ours) = super::scratch_dir(root, "memory");
    let out = measure_all(&dir, exe, p).await;
    // Whatever happened: the nodes were stopped (dropped) and the database
    // dropped in `measure_all`; their roots go now.
    if ours {
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}

async fn measure_all(dir: &Path, exe: &str, p: &Params) -> Result<Value> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let args = super::daemons::platform_config(dir)?;
    let mut stores = vec![measure(&dir.join("sqlite"), exe, None, &args, &p.levels).await?];
    if let Some(admin) = &p.store {
        let (one, args) = (dir.join("postgres"), &args);
        stores.push(
            Database::around(admin, |url| async move {
                measure(&one, exe, Some(&url), args, &p.levels).await
            })
            .await?,
        );
    }
    Ok(json!({
        "bench": "memory",
        "levels": p.levels,
        "target_kib_per_agent": TARGET_KIB,
        "target_fds_per_agent": TARGET_FDS,
        "stores": stores,
        "what": "one `brood serve` node per store, N idle roots (`brood test-agent --hang`, created through POST /api/agents with await_ready) live at once; read once they all run and the node has been idle 1 s: VmRSS and RssAnon (/proc/PID/status), Pss (/proc/PID/smaps_rollup), open descriptors (/proc/PID/fd) by kind; per agent: (level - level 0) / N. Level 0 is read after one agent was created and cancelled, so first-use costs are not charged to the agents",
        "process": "the brood serve daemon's own process only: the agents, and the keeper (their PID namespace's init), are processes of their own and not counted",
    }))
}

/// One node on `store` (none: SQLite in its root): its readings fresh, at
/// each level, and once every agent is cancelled again.
async fn measure(
    root: &Path,
    exe: &str,
    store: Option<&str>,
    args: &[String],
    levels: &[usize],
) -> Result<Value> {
    let node = Node::start(exe, root, store, args).await?;
    let pid = node.pid();
    let fresh = Reading::of(pid, root)?;
    let measured = async {
        // One agent created and cancelled before the baseline: what the first
        // spawn sets up once (the spawner, the keeper, the store's prepared
        // statements) is the node's, not each agent's.
        create(root, exe, &["bmw".to_owned()]).await?;
        cancel(root, &["bmw".to_owned()]).await?;
        let mut rows: Vec<Value> = Vec::new();
        let mut base: Option<Reading> = None;
        let mut live = 0;
        for &n in levels {
            let names: Vec<String> = (live..n).map(|i| format!("{PREFIX}{i}")).collect();
            create(root, exe, &names).await?;
            live = n;
            running(root, n).await?;
            tokio::time::sleep(SETTLE).await;
            let r = Reading::of(pid, root)?;
            let mut row = r.json();
            row["agents"] = json!(n);
            if let (Some(b), true) = (&base, n > 0) {
                let kib = round1((r.rss_kib as f64 - b.rss_kib as f64) / n as f64);
                let fds = round2((r.fds as f64 - b.fds as f64) / n as f64);
                row["rss_kib_per_agent"] = json!(kib);
                row["fds_per_agent"] = json!(fds);
                row["rss_met"] = json!(kib <= TARGET_KIB);
                row["fds_met"] = json!(fds <= TARGET_FDS);
            }
            if base.is_none() {
                base = Some(r);
            }
            rows.push(row);
        }
        let names: Vec<String> = (0..live).map(|i| format!("{PREFIX}{i}")).collect();
        cancel(root, &names).await?;
        tokio::time::sleep(SETTLE).await;
        let after = Reading::of(pid, root)?.json();
        Ok::<_, anyhow::Error>((rows, after))
    }
    .await;
    // Stopped whatever happened: its agents end with it.
    drop(node);
    let (rows, after) = measured?;
    Ok(json!({
        "store": if store.is_some() { "PostgreSQL" } else { "SQLite" },
        "pid": pid,
        "root": root.display().to_string(),
        "fresh": fresh.json(),
        "levels": rows,
        "after_cancel": after,
    }))
}

/// `names` created as idle roots from `CLIENTS` kept-alive connections,
/// each answered once its agent is `ready`.
async fn create(root: &Path, exe: &str, names: &[String]) -> Result<()> {
    let exe = exe.to_owned();
    each(root, names, move |name| {
        let body =
            json!({"name": name, "argv": [&exe, "test-agent", "--hang"], "await_ready": true});
        ("POST", "/api/agents".to_owned(), Some(body), 201)
    })
    .await
}

/// `names` cancelled, then waited for until the node lists no live agent.
async fn cancel(root: &Path, names: &[String]) -> Result<()> {
    each(root, names, |name| {
        let path = format!("/api/agents/{name}/cancel");
        ("POST", path, None, 200)
    })
    .await?;
    let t = Instant::now();
    loop {
        let live = listed(root).await?.len();
        if live == 0 {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!(
                "bench memory: {live} agents still live in {} 120 s after their cancel",
                root.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One call a name, from `CLIENTS` connections taking the next name until
/// none is left; a call answering other than its status fails the run.
pub(super) async fn each<F>(root: &Path, names: &[String], what: F) -> Result<()>
where
    F: Fn(&str) -> (&'static str, String, Option<Value>, u16) + Send + Sync + 'static,
{
    if names.is_empty() {
        return Ok(());
    }
    let names: Arc<Vec<String>> = Arc::new(names.to_vec());
    let what = Arc::new(what);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS.min(names.len()) {
        let mut conn = Connection::open(&endpoint(root))
            .await
            .with_context(|| format!("connecting to the node in {}", root.display()))?;
        let (names, what, next) = (names.clone(), what.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(name) = names.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok::<_, anyhow::Error>(());
                };
                let (method, path, body, want) = what(name);
                let a = conn
                    .call(method, &path, body.as_ref())
                    .await
                    .with_context(|| format!("{method} {path}"))?;
                if a.status != want {
                    bail!("{method} {path} answered {}: {}", a.status, a.body);
                }
            }
        }));
    }
    for t in tasks {
        t.await.context("a client task")??;
    }
    Ok(())
}

/// The node's live agents (`GET /api/agents`).
async fn listed(root: &Path) -> Result<Vec<Value>> {
    let a = call(root, "GET", "/api/agents", None).await?;
    Ok(a["agents"].as_array().cloned().unwrap_or_default())
}

/// Waits until the node lists exactly `n` live agents, all of this bench's,
/// each `running` with a process.
async fn running(root: &Path, n: usize) -> Result<()> {
    let t = Instant::now();
    loop {
        let agents = listed(root).await?;
        let ok = agents
            .iter()
            .filter(|a| {
                a["name"].as_str().is_some_and(|s| s.starts_with(PREFIX))
                    && a["status"] == "running"
                    && a["pid"].as_i64().is_some()
            })
            .count();
        if ok == n && agents.len() == n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!(
                "bench memory: {ok} of {n} agents running in {} ({} live) after 60 s",
                root.display(),
                agents.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `/proc` says of the daemon at one moment.
struct Reading {
    rss_kib: u64,
    rss_anon_kib: u64,
    /// Absent where the kernel has no `smaps_rollup` (before 4.14).
    pss_kib: Option<u64>,
    threads: u64,
    fds: usize,
    /// The descriptors by what they point at.
    fd_kinds: BTreeMap<String, usize>,
}

impl Reading {
    fn of(pid: u32, root: &Path) -> Result<Reading> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let status = std::fs::read_to_string(proc.join("status"))
            .with_context(|| format!("reading /proc/{pid}/status (the node's daemon)"))?;
        let field = |text: &str, key: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        let need = |key: &str| {
            field(&status, key).with_context(|| format!("no {key} in /proc/{pid}/status"))
        };
        let pss_kib = std::fs::read_to_string(proc.join("smaps_rollup"))
            .ok()
            .and_then(|t| field(&t, "Pss:"));
        let sockets = unix_sockets(pid);
        let mut fd_kinds = BTreeMap::new();
        let mut fds = 0;
        let dir = proc.join("fd");
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            // A descriptor closed between the listing and its link is not open.
            let Ok(target) = std::fs::read_link(e.path()) else {
                continue;
            };
            fds += 1;
            *fd_kinds
                .entry(kind(&target.to_string_lossy(), root, &sockets))
                .or_insert(0) += 1;
        }
        Ok(Reading {
            rss_kib: need("VmRSS:")?,
            rss_anon_kib: need("RssAnon:")?,
            pss_kib,
            threads: need("Threads:")?,
            fds,
            fd_kinds,
        })
    }

    fn json(&self) -> Value {
        json!({
            "rss_kib": self.rss_kib,
            "rss_anon_kib": self.rss_anon_kib,
            "pss_kib": self.pss_kib,
            "threads": self.threads,
            "fds": self.fds,
            "fd_kinds": self.fd_kinds,
        })
    }
}

/// The Unix sockets of the daemon's network namespace: inode to path
/// (empty for an unnamed one), from `/proc/PID/net/unix` (proc_net(5)).
/// Unreadable, none are known and every socket counts as `socket`.
fn unix_sockets(pid: u32) -> HashMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            // Num RefCount Protocol Flags Type St Inode [Path]
            let mut f = l.split_whitespace();
            let inode = f.nth(6)?;
            Some((inode.to_owned(), f.next().unwrap_or("").to_owned()))
        })
        .collect()
}

/// What a descriptor's link points at, grouped so that one agent's
/// descriptors of a kind add up: `pipe`, `anon_inode:[pidfd]`, a Unix
/// socket by its file's name (`unix socket: bmN.sock`) or as unnamed, any
/// other socket as `socket`; a file under the node's root or the cgroup
/// tree by its name alone, any other by its path; digits read as `N`,
/// since agents' names and pids differ.
fn kind(target: &str, root: &Path, sockets: &HashMap<String, String>) -> String {
    if target.starts_with("anon_inode:") {
        return target.to_owned();
    }
    if let Some(inode) = target
        .strip_prefix("socket:[")
        .and_then(|t| t.strip_suffix(']'))
    {
        return match sockets.get(inode) {
            Some(p) if p.is_empty() => "unix socket, unnamed".to_owned(),
            Some(p) => format!("unix socket: {}", digits(&name_of(Path::new(p)))),
            None => "socket".to_owned(),
        };
    }
    if let Some((k, _)) = target.split_once(":[")
        && !target.starts_with('/')
    {
        return k.to_owned();
    }
    let path = Path::new(target);
    if path.starts_with(root) {
        return format!("a file in the root: {}", digits(&name_of(path)));
    }
    if path.starts_with("/sys/fs/cgroup") {
        return format!("a cgroup file: {}", digits(&name_of(path)));
    }
    digits(target)
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `s` with each run of digits as one `N`.
fn digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('N') {
            out.push('N');
        }
    }
    out
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The human report: one line a store and level.
pub(super) fn print(v: &Value) {
    println!(
        "memory: {}; per live agent over level 0, target ≤ {} KiB and ≤ {} descriptors",
        v["process"].as_str().unwrap_or(""),
        v["target_kib_per_agent"],
        v["target_fds_per_agent"]
    );
    println!(
        "{:<11} {:>7} {:>9} {:>9} {:>9} {:>6} {:>7} {:>10} {:>10}  target",
        "store",
        "agents",
        "rss KiB",
        "pss KiB",
        "anon KiB",
        "fds",
        "threads",
        "KiB/agent",
        "fds/agent"
    );
    for s in v["stores"].as_array().into_iter().flatten() {
        let store = s["store"].as_str().unwrap_or("");
        let line = |label: String, r: &Value| {
            let met = match (r["rss_met"].as_bool(), r["fds_met"].as_bool()) {
                (Some(true), Some(true)) => "met".to_owned(),
                (Some(m), Some(f)) => {
                    let missed: Vec<&str> = [(m, "memory"), (f, "descriptors")]
                        .iter()
                        .filter(|(ok, _)| !ok)
                        .map(|(_, w)| *w)
                        .collect();
                    format!("missed ({})", missed.join(", "))
                }
                _ => String::new(),
            };
            let cell = |k: &str| match &r[k] {
                Value::Null => "—".to_owned(),
                x => x.to_string(),
            };
            println!(
                "{store:<11} {label:>7} {:>9} {:>9} {:>9} {:>6} {:>7} {:>10} {:>10}  {met}",
                cell("rss_kib"),
                cell("pss_kib"),
                cell("rss_anon_kib"),
                cell("fds"),
                cell("threads"),
                cell("rss_kib_per_agent"),
                cell("fds_per_agent"),
            );
        };
        line("fresh".into(), &s["fresh"]);
        for r in s["levels"].as_array().into_iter().flatten() {
            line(r["agents"].to_string(), r);
        }
        line("ended".into(), &s["after_cancel"]);
    }
    // What the descriptors are, at the largest level of each store: what
    // grows with the agents shows there.
    for s in v["stores"].as_array().into_iter().flatten() {
        if let Some(top) = s["levels"].as_array().and_then(|l| l.last()) {
            let kinds: Vec<String> = top["fd_kinds"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            println!(
                "{} descriptors with {} agents: {}",
                s["store"].as_str().unwrap_or(""),
                top["agents"],
                kinds.join(", ")
            );
        }
    }
    println!("`fresh`: the node just started; `ended`: every agent cancelled again.");
}
