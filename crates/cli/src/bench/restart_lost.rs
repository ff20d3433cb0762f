//! `brood bench restart`'s PostgreSQL three-node case (issue 29 item 5):
//! three real `brood serve` nodes on one database made for the run (their
//! defaults: the 1 s tick, the 10 s node expiry); N idle resumable roots
//! (`brood test-agent --hang`, `on_restart: resume`) created through node
//! 1's API, so node 1 runs them all; node 1 killed with SIGKILL. The time
//! from the SIGKILL until every one runs again, with a process, on node 0
//! or node 2, against the time node 1 took to start the same N fresh.
//!
//! On one machine the others see node 1's process gone at the lease
//! holder's next orphan sweep (every 5 ticks) rather than at its
//! heartbeat's expiry: `declared_s` is until node 1 leaves the list of
//! nodes (what moves is placed in that same transaction), `moved_s` until
//! the last agent runs again elsewhere.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::daemons::{Node, call};
use super::memory::each;
use super::restart::running;

/// The prefix of every agent this case creates.
const PREFIX: &str = "brl";

/// The case on `store` (a database of the run's own), nodes in `dir`.
pub(super) async fn measure(
    dir: &Path,
    exe: &str,
    store: &str,
    args: &[String],
    n: usize,
) -> Result<Value> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Node::start(exe, &dir.join(format!("n{i}")), Some(store), args).await?);
    }
    let names: Vec<String> = (0..n).map(|i| format!("{PREFIX}{i}")).collect();
    let exe_owned = exe.to_owned();
    let t = Instant::now();
    each(&nodes[1].root, &names, move |name| {
        let body = json!({"name": name, "argv": [&exe_owned, "test-agent", "--hang"],
                          "policy": {"on_restart": "resume"}, "await_ready": true});
        ("POST", "/api/agents".to_owned(), Some(body), 201)
    })
    .await?;
    let fresh = t.elapsed();
    // Node 1's id, as its first agent's record names it.
    let first = call(
        &nodes[1].root,
        "GET",
        &format!("/api/agents/{PREFIX}0"),
        None,
    )
    .await?;
    let Some(lost_id) = first["node"].as_str().map(str::to_owned) else {
        bail!("bench restart: no node in {first}");
    };
    running(&nodes[0].root, PREFIX, n, |a| a["node"] == lost_id.as_str()).await?;

    let t = Instant::now();
    let lost = nodes.remove(1);
    lost.kill()?;
    let declared = loop {
        let listed = call(&nodes[0].root, "GET", "/api/nodes", None).await?;
        let gone = !listed
            .as_array()
            .or_else(|| listed["nodes"].as_array())
            .into_iter()
            .flatten()
            .any(|x| x["id"] == lost_id.as_str());
        if gone {
            break t.elapsed();
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!("bench restart: node 1 still listed 300 s after its SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    running(&nodes[0].root, PREFIX, n, |a| {
        a["node"].as_str().is_some_and(|x| x != lost_id)
    })
    .await?;
    let moved = t.elapsed();
    // Each was moved with its history, not made again: its second run.
    let one = call(
        &nodes[0].root,
        "GET",
        &format!("/api/agents/{PREFIX}0"),
        None,
    )
    .await?;
    let runs = one["runs"].as_array().map_or(0, Vec::len);
    if runs != 2 {
        bail!("bench restart: {PREFIX}0 has {runs} runs after node 1's loss, not 2: {one}");
    }
    each(&nodes[0].root, &names, |name| {
        ("POST", format!("/api/agents/{name}/cancel"), None, 200)
    })
    .await?;
    drop(nodes);
    let s = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
    Ok(json!({
        "store": "PostgreSQL, three nodes, one lost",
        "root": dir.display().to_string(),
        "fresh_s": s(fresh),
        "declared_s": s(declared),
        "moved_s": s(moved),
        "ratio": (moved.as_secs_f64() / fresh.as_secs_f64().max(1e-9) * 100.0).round() / 100.0,
    }))
}
