//! `brood bench restart` (issue 29 item 5): how long a supervisor killed
//! with SIGKILL takes, once started again, to have every one of N live
//! resumable agents running again, against the time to start the same N
//! fresh. One real `brood serve` node per store (SQLite in its root; with
//! `--store postgres://…` also PostgreSQL, in a database made for the
//! run); the agents are idle roots (`brood test-agent --hang`, policy
//! `on_restart: resume`) created through its API.
//!
//! Fresh: from the first `POST /api/agents` (with `await_ready`, from a few
//! kept-alive connections) until the last is answered. Restart: from the
//! SIGKILL (the daemon reaped, its agents gone with it) until the node,
//! started again on the same root, lists every agent `running` with a
//! process; it includes the daemon's own start (the store opened, the ctx
//! tree rebuilt), given apart as `serving_s`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::cluster::Database;
use super::daemons::{Node, call};
use super::memory::each;

/// The prefix of every agent this bench creates.
const PREFIX: &str = "brs";

pub(super) struct Params {
    pub n: usize,
    /// `--store postgres://…` (an administrator's URL); none: SQLite alone.
    pub store: Option<String>,
}

pub(super) async fn run(root: &Option<PathBuf>, exe: &str, p: &Params) -> Result<Value> {
    let (dir, ours) = super::scratch_dir(root, "restart");
    let out = measure_all(&dir, exe, p).await;
    if ours {
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}

async fn measure_all(dir: &Path, exe: &str, p: &Params) -> Result<Value> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let args = super::daemons::platform_config(dir)?;
    let mut stores = vec![measure(&dir.join("sqlite"), exe, None, &args, p.n).await?];
    if let Some(admin) = &p.store {
        let (one, args) = (dir.join("postgres"), &args);
        stores.push(
            Database::around(admin, |url| async move {
                measure(&one, exe, Some(&url), args, p.n).await
            })
            .await?,
        );
        // Three nodes, one lost: on a database of its own.
        let nodes = dir.join("nodes");
        stores.push(
            Database::around(admin, |url| async move {
                super::restart_lost::measure(&nodes, exe, &url, args, p.n).await
            })
            .await?,
        );
    }
    Ok(json!({
        "bench": "restart",
        "agents": p.n,
        "stores": stores,
        "what": "N idle roots (`brood test-agent --hang`, on_restart: resume) on one `brood serve` node. fresh_s: creating them through POST /api/agents with await_ready until the last answers; restart_s: from the node's SIGKILL until the node started again on its root lists all N running with a process (serving_s of it until its /healthz answers); ratio: restart_s / fresh_s. With PostgreSQL also three nodes, the N on node 1, node 1 SIGKILLed: declared_s until it leaves the list of nodes, moved_s until all N run again on nodes 0 and 2; ratio: moved_s / fresh_s",
    }))
}

async fn measure(
    root: &Path,
    exe: &str,
    store: Option<&str>,
    args: &[String],
    n: usize,
) -> Result<Value> {
    let node = Node::start(exe, root, store, args).await?;
    let names: Vec<String> = (0..n).map(|i| format!("{PREFIX}{i}")).collect();
    let exe_owned = exe.to_owned();
    let t = Instant::now();
    each(root, &names, move |name| {
        let body = json!({"name": name, "argv": [&exe_owned, "test-agent", "--hang"],
                          "policy": {"on_restart": "resume"}, "await_ready": true});
        ("POST", "/api/agents".to_owned(), Some(body), 201)
    })
    .await?;
    let fresh = t.elapsed();
    running(root, PREFIX, n, |_| true).await?;

    let t = Instant::now();
    node.kill()?;
    let node = Node::start(exe, root, store, args).await?;
    let serving = t.elapsed();
    running(root, PREFIX, n, |_| true).await?;
    let restart = t.elapsed();
    // Each was resumed, not made again: its second run.
    let one = call(root, "GET", &format!("/api/agents/{PREFIX}0"), None).await?;
    let runs = one["runs"].as_array().map_or(0, Vec::len);
    if runs != 2 {
        bail!("bench restart: {PREFIX}0 has {runs} runs after the restart, not 2: {one}");
    }
    each(root, &names, |name| {
        ("POST", format!("/api/agents/{name}/cancel"), None, 200)
    })
    .await?;
    drop(node);
    let s = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
    Ok(json!({
        "store": if store.is_some() { "PostgreSQL" } else { "SQLite" },
        "root": root.display().to_string(),
        "fresh_s": s(fresh),
        "restart_s": s(restart),
        "serving_s": s(serving),
        "ratio": (restart.as_secs_f64() / fresh.as_secs_f64().max(1e-9) * 100.0).round() / 100.0,
    }))
}

/// Waits until `root`'s node lists `n` agents whose names start with
/// `prefix`, each `running` with a process and where `on` says (the
/// restart's and the lost node's cases alike).
pub(super) async fn running(
    root: &Path,
    prefix: &str,
    n: usize,
    on: impl Fn(&Value) -> bool,
) -> Result<()> {
    let t = Instant::now();
    loop {
        let a = call(root, "GET", "/api/agents", None).await?;
        let ok = a["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| {
                a["name"].as_str().is_some_and(|s| s.starts_with(prefix))
                    && a["status"] == "running"
                    && a["pid"].as_i64().is_some()
                    && on(a)
            })
            .count();
        if ok == n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!(
                "bench restart: {ok} of {n} agents running as asked in {} after 300 s",
                root.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) fn print(v: &Value) {
    println!(
        "bench restart: {} live resumable agents, the node SIGKILLed and started again",
        v["agents"]
    );
    for s in v["stores"].as_array().into_iter().flatten() {
        if let Some(moved) = s["moved_s"].as_f64() {
            println!(
                "  {}: fresh {:>8.3} s   moved {:>8.3} s (node declared lost after {:.3} s)   ratio {:.2}",
                s["store"].as_str().unwrap_or("?"),
                s["fresh_s"].as_f64().unwrap_or(0.0),
                moved,
                s["declared_s"].as_f64().unwrap_or(0.0),
                s["ratio"].as_f64().unwrap_or(0.0),
            );
            continue;
        }
        println!(
            "  {:<10} fresh {:>8.3} s   restart {:>8.3} s (serving after {:.3} s)   ratio {:.2}",
            s["store"].as_str().unwrap_or("?"),
            s["fresh_s"].as_f64().unwrap_or(0.0),
            s["restart_s"].as_f64().unwrap_or(0.0),
            s["serving_s"].as_f64().unwrap_or(0.0),
            s["ratio"].as_f64().unwrap_or(0.0),
        );
    }
}
