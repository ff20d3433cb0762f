//! Issue 29 items 4 and 6: trees that survive the loss of a node. Three
//! `brood serve` nodes on one PostgreSQL; a three-level tree of reference
//! agents on the scripted model with `on_restart: resume`, its top on node
//! 0 and its middle and leaf on one of the two nodes labelled `pool=b`.
//! That node is killed (SIGKILL) or paused (SIGSTOP) in the middle of the
//! tree: its agents move to the other `pool=b` node as new runs with their
//! history, and the tree completes with the uninterrupted tree's result, no
//! second child and no tool's side effect repeated. A paused node that comes
//! back neither runs nor ends the moved agents' new runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use brood_store_conformance::pg::Fresh;
use common::cluster::*;
use common::*;
use serde_json::{Value, json};

/// One cluster at a time: six nodes on a small machine starve each other's
/// heartbeats.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Node 0 `pool=a`, nodes 1 and 2 `pool=b`: a node is lost after 15 s
/// without a heartbeat. Longer than the server's `lock_timeout` (10 s): a
/// node paused inside a transaction holds its tenant's lock until the
/// server ends its session (idle in a transaction for 30 s), and the others
/// wait on that lock meanwhile; they must not be declared lost for it.
fn cluster() -> Nodes {
    let dir = tempfile::tempdir().unwrap();
    let db = Fresh::new();
    let roots: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut daemons = Vec::new();
    for (i, r) in roots.iter().enumerate() {
        std::fs::create_dir_all(r).unwrap();
        let pool = if i == 0 { "pool=a" } else { "pool=b" };
        daemons.push(serve_with(
            r,
            &db.url,
            &format!("z{i}"),
            &["--label", pool, "--node-expiry", "15"],
        ));
    }
    Nodes {
        daemons,
        roots,
        store: db.url.clone(),
        db: Some(db),
        server: None,
        _dir: dir,
    }
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The plan of the tree, replayed whole from its first turn by every run
/// (`"replay": true`): each agent appends a line to `log` with `shell`,
/// creates its child by name (the middle one on a `pool=b` node) and waits
/// for it; the leaf's last turn is slow, so the tree is caught in the
/// middle.
fn tree_script(log: &Path, slow_ms: u64) -> Value {
    let append = |who: &str| json!({"name": "shell", "arguments": {"command": format!("echo {who} >> {}", log.display())}});
    let create = |name: &str, placement: Value| json!({"name": "create", "arguments": {"task": format!("the {name}'s task"), "name": name, "placement": placement}});
    let wait = |name: &str| json!({"name": "wait", "arguments": {"names": [name]}});
    json!({
        "replay": true,
        "agents": {
            "top": [
                {"tool_calls": [append("top"), create("mid", json!({"pool": "b"}))]},
                {"tool_calls": [wait("mid")]},
                {"text": "top done"}
            ],
            "mid": [
                {"tool_calls": [append("mid"), create("leaf", Value::Null)]},
                {"tool_calls": [wait("leaf")]},
                {"text": "mid done"}
            ],
            "leaf": [
                {"tool_calls": [append("leaf")]},
                {"text": "leaf done", "delay_ms": slow_ms}
            ]
        }
    })
}

/// Starts the tree's top on node 0 with `on_restart: resume`; the file its
/// side effects are appended to.
fn start_tree(nodes: &Nodes, work: &Path, tag: &str, slow_ms: u64) -> PathBuf {
    let log = work.join(format!("{tag}-side-effects.log"));
    let script = work.join(format!("{tag}-tree.json"));
    std::fs::write(&script, tree_script(&log, slow_ms).to_string()).unwrap();
    let policy = work.join("resume.json");
    std::fs::write(&policy, json!({"on_restart": "resume"}).to_string()).unwrap();
    let o = cli(
        &nodes.roots[0],
        &nodes.store,
        &[
            "spawn",
            "--name",
            "top",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            exe(),
            "agent",
            "--script",
            script.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    log
}

fn logs(nodes: &Nodes) -> String {
    nodes
        .roots
        .iter()
        .map(|r| std::fs::read_to_string(r.with_extension("log")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// Waits until `name` is finished (asked through node 0); its record.
fn finished(nodes: &Nodes, name: &str, limit: Duration) -> Value {
    let mut last = Value::Null;
    let done = eventually(limit, || {
        last = agent_on(nodes, 0, name);
        !matches!(
            last["status"].as_str(),
            Some("queued" | "running" | "blocked" | "stopping")
        )
    });
    assert!(done, "{name} never finished: {last}\n{}", logs(nodes));
    last
}

/// What a finished tree shows: each agent's status and result, and the
/// children each has.
fn outcome(nodes: &Nodes) -> Vec<(String, String, String, Vec<String>)> {
    let o = cli(&nodes.roots[0], &nodes.store, &["ps", "--json", "--all"]);
    let all: Value = serde_json::from_slice(&o.stdout).unwrap();
    let all = all
        .as_array()
        .or_else(|| all["agents"].as_array())
        .unwrap()
        .clone();
    ["top", "mid", "leaf"]
        .iter()
        .map(|n| {
            let a = agent_on(nodes, 0, n);
            let mut children: Vec<String> = all
                .iter()
                .filter(|k| k["parent"] == *n)
                .map(|k| k["name"].as_str().unwrap().to_owned())
                .collect();
            children.sort();
            (
                n.to_string(),
                a["status"].as_str().unwrap().to_owned(),
                a["result"].as_str().unwrap_or("").to_owned(),
                children,
            )
        })
        .collect()
}

/// `agent`'s transcript as the store holds it (through node 0).
fn transcript(nodes: &Nodes, agent: &str) -> Vec<Value> {
    let (s, v) = http(
        &nodes.roots[0].join("brood.sock"),
        "GET",
        &format!("/api/ui/agents/{agent}/transcript"),
        None,
    );
    assert_eq!(s, 200, "{v}");
    v["messages"].as_array().unwrap().clone()
}

/// The events of `agent` of type `kind` in the store (through node 0).
fn events_of(nodes: &Nodes, agent: &str, kind: &str) -> Vec<Value> {
    let o = cli(&nodes.roots[0], &nodes.store, &["events", agent]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == kind)
        .collect()
}

/// The tree run whole without a fault, then removed so its names are free:
/// what an interrupted tree must end with.
fn uninterrupted(nodes: &Nodes, work: &Path) -> Vec<(String, String, String, Vec<String>)> {
    let log = start_tree(nodes, work, "calm", 300);
    let top = finished(nodes, "top", Duration::from_secs(60));
    assert_eq!(top["status"], "completed", "{top}\n{}", logs(nodes));
    let want = outcome(nodes);
    assert_eq!(lines(&log), ["top", "mid", "leaf"]);
    assert_eq!(want, three_levels_completed());
    let o = cli(&nodes.roots[0], &nodes.store, &["rm", "top"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    want
}

/// Starts the slow tree and waits until its leaf has recorded its side
/// effect's result and thinks: the top waits on node 0, the middle and the
/// leaf on one `pool=b` node, whose index is returned.
fn catch_mid_tree(nodes: &Nodes, work: &Path) -> (PathBuf, usize) {
    let log = start_tree(nodes, work, "caught", 5000);
    let caught = eventually(Duration::from_secs(30), || {
        lines(&log).len() == 3
            && transcript(nodes, "leaf")
                .iter()
                .any(|m| m["role"] == "tool")
    });
    assert!(caught, "the tree never reached its leaf: {}", logs(nodes));
    let ids = node_ids(nodes);
    for n in ["top", "mid", "leaf"] {
        assert_eq!(agent_on(nodes, 0, n)["status"], "running", "{n}");
    }
    assert_eq!(agent_on(nodes, 0, "top")["node"], ids["z0"]);
    let mid_node = agent_on(nodes, 0, "mid")["node"].clone();
    assert_eq!(
        agent_on(nodes, 0, "leaf")["node"],
        mid_node,
        "beside its parent"
    );
    let i = (1..3)
        .find(|i| ids[&format!("z{i}")] == mid_node)
        .unwrap_or_else(|| panic!("mid on a pool=b node: {mid_node}"));
    (log, i)
}

/// The interrupted tree's ending: the uninterrupted one's, every side effect
/// once, no child refused, and the middle and the leaf each with the run
/// the loss ended and one run moved to the other `pool=b` node, started
/// once there.
fn ends_as_if_nothing_happened(
    nodes: &Nodes,
    want: &[(String, String, String, Vec<String>)],
    log: &Path,
    lost: usize,
) {
    let top = finished(nodes, "top", Duration::from_secs(90));
    assert_eq!(top["status"], "completed", "{top}\n{}", logs(nodes));
    assert_eq!(outcome(nodes), want, "{}", logs(nodes));
    assert_eq!(lines(log), ["top", "mid", "leaf"], "a tool ran twice");
    let ids = node_ids_of_live(nodes, lost);
    let other = ids[&format!("z{}", 3 - lost)].clone();
    assert_eq!(
        agent_on(nodes, 0, "top")["runs"].as_array().unwrap().len(),
        1
    );
    for n in ["mid", "leaf"] {
        let a = agent_on(nodes, 0, n);
        assert_eq!(a["node"], other, "{n} moved: {a}");
        let runs = a["runs"].as_array().unwrap().clone();
        let outcomes: Vec<&str> = runs
            .iter()
            .map(|x| x["outcome"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            runs.len(),
            2,
            "{n}: the run the loss ended, then one moved: {runs:?}"
        );
        assert!(outcomes[0].contains("lost"), "{n}: {outcomes:?}");
        assert!(outcomes[1].contains("completed"), "{n}: {outcomes:?}");
        // One start a run: the lost node never started the new one.
        assert_eq!(events_of(nodes, n, "agent.start").len(), 2, "{n}");
        assert_eq!(events_of(nodes, n, "agent.resume").len(), 1, "{n}");
        assert!(events_of(nodes, n, "agent.child.refused").is_empty(), "{n}");
    }
    // With its history: the moved run's transcript follows the first's.
    let msgs = transcript(nodes, "mid");
    let runs = agent_on(nodes, 0, "mid")["runs"]
        .as_array()
        .unwrap()
        .clone();
    for r in &runs {
        let id = r["id"].as_str().unwrap();
        assert!(msgs.iter().any(|m| m["run"] == id), "{id}: {msgs:?}");
    }
}

#[test]
fn a_resumable_tree_completes_when_a_node_holding_part_of_it_is_killed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut nodes = cluster();
    let work = tempfile::tempdir().unwrap();
    let want = uninterrupted(&nodes, work.path());
    let (log, i) = catch_mid_tree(&nodes, work.path());
    let pids = ctx_pids(&nodes.roots[i]);
    assert!(!pids.is_empty());
    // SAFETY: killing a node this test started.
    unsafe { libc::kill(nodes.daemons[i].0.id() as i32, libc::SIGKILL) };
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "the node's processes die with it"
    );
    ends_as_if_nothing_happened(&nodes, &want, &log, i);
    nodes.daemons.remove(i);
}

#[test]
fn a_paused_node_that_comes_back_does_not_run_the_moved_agents_again() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let nodes = cluster();
    let work = tempfile::tempdir().unwrap();
    let want = uninterrupted(&nodes, work.path());
    let (log, i) = catch_mid_tree(&nodes, work.path());
    let pids = ctx_pids(&nodes.roots[i]);
    assert!(!pids.is_empty());
    let paused = nodes.daemons[i].0.id() as i32;
    // SAFETY: pausing a node this test started.
    unsafe { libc::kill(paused, libc::SIGSTOP) };
    // Its agents move and run again elsewhere while it is paused (their
    // old processes still live: nothing here can reach them): after its
    // expiry, or, if it was paused inside a transaction, once the server
    // has ended that session and its tenant's lock is free.
    let ids = node_ids_of_live(&nodes, i);
    let other = ids[&format!("z{}", 3 - i)].clone();
    let moved = eventually(Duration::from_secs(90), || {
        ["mid", "leaf"].iter().all(|n| {
            let a = agent_on(&nodes, 0, n);
            a["status"] == "running" && a["node"] == other
        })
    });
    // SAFETY: resuming it, whatever the assertion says.
    let resumed = || unsafe { libc::kill(paused, libc::SIGCONT) };
    if !moved {
        resumed();
        panic!(
            "the paused node's agents never moved: {} {}\n{}",
            agent_on(&nodes, 0, "mid"),
            agent_on(&nodes, 0, "leaf"),
            logs(&nodes)
        );
    }
    // Back while the moved runs are live: it finds itself lost, lets go
    // of its old processes and writes nothing of the new runs.
    resumed();
    assert!(
        eventually(Duration::from_secs(30), || pids.iter().all(|p| !alive(*p))),
        "the node comes back and lets its old processes go"
    );
    // It let go of them itself (they did not just end on their own), and
    // no old process ended a run: the new runs end as the tree's.
    let said = std::fs::read_to_string(nodes.roots[i].with_extension("log")).unwrap();
    assert!(
        said.contains("letting go of the agents that moved to other nodes"),
        "{said}"
    );
    ends_as_if_nothing_happened(&nodes, &want, &log, i);
    assert!(ctx_pids(&nodes.roots[i]).is_empty(), "nothing runs there");
}

/// The node ids by zone, listed while node `paused` may be missing from
/// the list (declared lost).
fn node_ids_of_live(nodes: &Nodes, paused: usize) -> std::collections::HashMap<String, String> {
    let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: std::collections::HashMap<String, String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["labels"]["zone"].as_str().unwrap().to_owned(),
                n["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(ids.contains_key(&format!("z{}", 3 - paused)), "{listed}");
    ids
}
