//! `brood bench nodes --store postgres://…`: a cancel's reach across nodes
//! (issue 15 item 7). Three real `brood serve` processes share the store;
//! each round a parent runs on node 0 with children on nodes 1 and 2, the
//! parent is cancelled through node 0's API, and the time until every child
//! process on the other nodes is gone is taken. The floor: the same cancel
//! with every child on node 0 (one node, no store between them).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::daemons::{Node, call};

fn alive(pid: i64) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    i32::try_from(pid).is_ok_and(|p| unsafe { libc::kill(p, 0) } == 0)
}

/// One round: a parent on node 0, `kids` children spread over `on`, the
/// parent cancelled on node 0; the time until every child's process is gone.
async fn round(nodes: &[Node], on: &[usize], kids: usize, r: usize, exe: &str) -> Result<Duration> {
    let hang = |name: String, parent: Option<&str>| {
        let mut v =
            json!({"name": name, "argv": [exe, "test-agent", "--hang"], "await_ready": true});
        if let Some(p) = parent {
            v["parent"] = json!(p);
        }
        v
    };
    let parent = format!("bp{r}");
    call(
        &nodes[0].root,
        "POST",
        "/api/agents",
        Some(hang(parent.clone(), None)),
    )
    .await?;
    let mut pids = Vec::new();
    for k in 0..kids {
        let i = on[k % on.len()];
        let name = format!("{parent}-k{k}");
        let mut body = hang(name.clone(), Some(&parent));
        body["placement"] = json!({"labels": {"node": i.to_string()}});
        call(&nodes[i].root, "POST", "/api/agents", Some(body)).await?;
        // Placed on another node than its parent's, it starts once claimed.
        let t = Instant::now();
        let pid = loop {
            let a = call(&nodes[i].root, "GET", &format!("/api/agents/{name}"), None).await?;
            if let Some(pid) = a["pid"].as_i64() {
                break pid;
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("round {r}: {name} did not start on node {i}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        pids.push(pid);
    }
    let t = Instant::now();
    call(
        &nodes[0].root,
        "POST",
        &format!("/api/agents/{parent}/cancel"),
        None,
    )
    .await?;
    while pids.iter().any(|p| alive(*p)) {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("round {r}: children still alive 30 s after their parent's cancel");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(t.elapsed())
}

pub async fn run(exe: &str, store: &str, rounds: usize, kids: usize) -> Result<Value> {
    let dir = std::env::temp_dir().join(format!("brood-bench-nodes-{}", std::process::id()));
    let mut nodes = Vec::new();
    for i in 0..3 {
        // Children are placed on a node by this label.
        let label = vec!["--label".to_owned(), format!("node={i}")];
        nodes.push(Node::start(exe, &dir.join(format!("n{i}")), Some(store), &label).await?);
    }
    let mut across = Vec::new();
    let mut local = Vec::new();
    for r in 0..rounds {
        across.push(round(&nodes, &[1, 2], kids, 2 * r, exe).await?);
        local.push(round(&nodes, &[0], kids, 2 * r + 1, exe).await?);
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    across.sort();
    local.sort();
    let ms = |v: &[Duration], p: f64| {
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        (v[i.min(v.len() - 1)].as_secs_f64() * 1e4).round() / 10.0
    };
    let ratio = ms(&across, 0.5) / ms(&local, 0.5).max(0.001);
    Ok(json!({
        "bench": "nodes", "rounds": rounds, "children": kids,
        "across_median_ms": ms(&across, 0.5), "across_p99_ms": ms(&across, 0.99),
        "floor_median_ms": ms(&local, 0.5), "floor_p99_ms": ms(&local, 0.99),
        "ratio": (ratio * 100.0).round() / 100.0,
        "what": "a parent on node 0 cancelled through its API until every child process on nodes 1 and 2 is gone (three brood serve processes on one PostgreSQL store, the default 1 s tick)",
        "floor": "the same cancel with every child on node 0",
    }))
}
