//! Many nodes on one PostgreSQL, live (issue 15 items 3 to 5): news between
//! nodes (`LISTEN/NOTIFY`) carrying a cancel, an input and a child's end
//! with ticks ten minutes apart; placement on the parent's node or by labels
//! and capacity, claimed by the chosen node; a lost node's queue placed
//! again; a resume through any node; a node in a PID namespace of its own
//! judged by the registry, not by this machine's process table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use brood_store_conformance::pg::Fresh;
use common::cluster::*;
use common::*;
use serde_json::{Value, json};

/// Eight chunks of the store's: large enough that fetching them takes
/// longer than answering a wait.
const BIG: usize = 8 << 20;

/// News cross nodes at once (issue 15 items 3 and 4): with ticks ten
/// minutes apart, nothing but `LISTEN/NOTIFY` can carry a change on one node
/// to another within the test. An input sent through node 2 to a child node
/// 1 runs is routed there and delivered; the wait on node 0 for that child
/// is answered when it ends, by which time its result and its artifacts'
/// bytes are in its parent's channel on node 0's disk (carried through the
/// store), and node 2, which neither ran it nor hosts its parent, serves an
/// artifact's bytes too; closed through node 2, it shows closed on node 1's disk;
/// a cancel on node 0 reaches the processes of a tree spanning all three
/// nodes.
#[test]
fn news_carry_a_child_s_end_and_a_cancel_across_nodes_without_a_tick() {
    let nodes = Nodes::start_with(3, &["--sweep-every", "600", "--node-expiry", "3600"]);
    let hang = |name: &str, parent: Option<&str>| {
        let mut v = json!({"name": name, "argv": agent(&["--hang"]), "await_ready": true});
        if let Some(p) = parent {
            v["parent"] = json!(p);
        }
        v
    };
    spawn_across(&nodes, hang);
    // A child on node 1 that ends when told to; its parent's node waits.
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "quick", "parent": "top", "await_ready": true,
               "placement": {"labels": {"zone": "z1"}},
               "argv": agent(&["--inputs", "1", "--result", "quick's answer",
                               "--artifact", "report.txt=quick's report",
                               "--artifact", "deep/er/notes.txt=line one\nline two\n",
                               "--artifact-bytes", &format!("big.bin={BIG}")])}),
    );
    assert_eq!(s, 201, "{v}");
    let sock0 = nodes.roots[0].join("brood.sock");
    let waiter = std::thread::spawn(move || {
        http(
            &sock0,
            "POST",
            "/api/agents/quick/wait",
            Some(&json!({"timeout_s": 60})),
        )
    });
    // The wait is parked on node 0 before the child is told to finish.
    std::thread::sleep(Duration::from_millis(300));
    // Through node 2, which does not run it: posted for node 1.
    let (s, v) = http(
        &nodes.roots[2].join("brood.sock"),
        "POST",
        "/api/agents/quick/input",
        Some(&json!({"text": "finish"})),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["node"], agent_on(&nodes, 0, "quick")["node"], "{v}");
    let (s, v) = waiter.join().unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["timed_out"], false, "answered by node 1's news: {v}");
    // Its parent's node projects what it handed back into its own ctx
    // tree: the channel of top to quick, on node 0's disk. The artifacts
    // are there before the wait is answered, as if quick had run there.
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let channel = nodes.roots[0].join(format!(
        "ctx/home/{uid}/agent/top/session/default/context/child/quick"
    ));
    let big = std::fs::read(channel.join("artifact/big.bin")).unwrap_or_default();
    assert!(
        big == brood_testagent::flags::bytes_of_size(BIG),
        "big.bin in place when the wait is answered, whole and in order ({} bytes)",
        big.len()
    );
    let quick = agent_on(&nodes, 0, "quick");
    assert_eq!(quick["status"], "completed", "{quick}");
    assert!(
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(channel.join("result.md"))
                .is_ok_and(|r| r.contains("quick's answer"))
        }),
        "result.md on the parent's node: {:?}",
        std::fs::read_dir(&channel).map(|d| d.count())
    );
    assert_eq!(read(channel.join("status")).trim(), "done");
    // The bytes node 1 took, fetched from the store and checked against
    // their hashes.
    assert_eq!(read(channel.join("artifact/report.txt")), "quick's report");
    assert_eq!(
        read(channel.join("artifact/deep/er/notes.txt")),
        "line one\nline two\n"
    );
    let sock2 = nodes.roots[2].join("brood.sock");
    // The web UI's tree through node 2 shows the agents of every node.
    let (s, v) = http(&sock2, "GET", "/api/ui/tree", None);
    assert_eq!(s, 200, "{v}");
    let rows = v["agents"].as_array().cloned().unwrap_or_default();
    for name in ["top", "mid", "leaf", "quick"] {
        assert!(rows.iter().any(|r| r["name"] == name), "{name} in {v}");
    }
    let (s, v) = http(&sock2, "GET", "/api/ui/agents/quick", None);
    assert_eq!(s, 200, "{v}");
    let report = v["channel"]["artifacts"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "report.txt"))
        .unwrap_or_else(|| panic!("report.txt among quick's artifacts: {v}"));
    let (s, bytes) = http(
        &sock2,
        "GET",
        &format!(
            "/api/ui/agents/quick/artifacts/{}",
            report["sha256"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(
        (s, bytes),
        (200, json!("quick's report")),
        "served by node 2"
    );
    // Closed through node 2, which did not run it: node 1's ctx tree shows
    // the close as well (its event), not only the store.
    let (s, v) = http(
        &nodes.roots[2].join("brood.sock"),
        "POST",
        "/api/agents/quick/close",
        None,
    );
    assert_eq!(s, 200, "{v}");
    let events = nodes.roots[1].join(format!(
        "ctx/home/{uid}/agent/quick/session/default/events.jsonl"
    ));
    assert!(
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(&events).is_ok_and(|e| e.contains("\"agent.close\""))
        }),
        "the close on node 1's disk: {:?}",
        std::fs::read_to_string(&events)
    );

    // Its parent heard of its end once (the `child` event the test agent
    // logs to stderr), though both the wait and the news of the end could
    // tell it.
    let top_log = nodes.roots[0].join("ctx/agent/top.d/log");
    // The log holds stderr as it was read, a line split across entries.
    let told = || {
        read(&top_log)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["text"].as_str().map(str::to_owned))
            .collect::<String>()
            .matches("test-agent: child quick:")
            .count()
    };
    assert!(
        eventually(Duration::from_secs(10), || told() > 0),
        "{}",
        read(&top_log)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(told(), 1, "{}", read(&top_log));

    let elsewhere: Vec<i32> = ctx_pids(&nodes.roots[1])
        .into_iter()
        .chain(ctx_pids(&nodes.roots[2]))
        .collect();
    assert!(!elsewhere.is_empty());
    nodes.cancel(0, "top");
    assert!(
        eventually(Duration::from_secs(10), || elsewhere
            .iter()
            .all(|p| !alive(*p))),
        "the cancel on node 0 reached nodes 1 and 2 without a tick"
    );
    for name in ["mid", "leaf"] {
        assert!(
            eventually(
                Duration::from_secs(10),
                || agent_on(&nodes, 0, name)["status"] == "cancelled"
            ),
            "{}",
            agent_on(&nodes, 0, name)
        );
    }
}

/// A node on another machine is judged by the store, not by this machine's
/// process table: node 1 runs in a PID namespace of its own (its id names a
/// pid that means nothing, or something else, to node 0, as another
/// machine's would). An agent placed on it by its labels through node 0 is
/// claimed and started there; node 0, sweeping for lost agents every half
/// second, leaves it alone, and so does a node started afterwards; a cancel
/// through node 0 reaches its process.
#[test]
fn a_node_another_machine_runs_is_judged_by_its_heartbeat_not_by_local_pids() {
    let dir = tempfile::tempdir().unwrap();
    let db = Fresh::new();
    let roots: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("n{i}"))).collect();
    for r in &roots {
        std::fs::create_dir_all(r).unwrap();
    }
    let _n0 = serve_with(&roots[0], &db.url, "near", &[]);
    let _n1 = Unshared(serve_wrapped(
        &["unshare", "--pid", "--mount-proc", "--kill-child"],
        &roots[1],
        &db.url,
        "far",
        &[],
    ));
    assert!(
        eventually(Duration::from_secs(20), || {
            let o = cli(&roots[0], &db.url, &["nodes", "--json"]);
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .is_ok_and(|v| v.as_array().is_some_and(|a| a.len() == 2))
        }),
        "node 1 registers"
    );
    let (s, v) = http(
        &roots[0].join("brood.sock"),
        "POST",
        "/api/agents",
        Some(&json!({"name": "far-away", "argv": agent(&["--hang"]),
                     "placement": {"labels": {"zone": "far"}}})),
    );
    assert_eq!(s, 201, "{v}");
    assert!(
        eventually(Duration::from_secs(10), || !ctx_pids(&roots[1]).is_empty()),
        "node 1 claims and starts the agent placed on it: {}",
        std::fs::read_to_string(roots[1].with_extension("log")).unwrap_or_default()
    );
    let pids = ctx_pids(&roots[1]);
    let _n2 = serve_with(&roots[2], &db.url, "later", &[]);
    // Ten orphan passes of nodes 0 and 2 (every 5 ticks of 0.1 s).
    std::thread::sleep(Duration::from_secs(5));
    let a = agent_on_root(&roots[2], "far-away");
    assert_eq!(
        a["status"], "running",
        "nodes 0 and 2 left node 1's agent alone: {a}"
    );
    assert!(pids.iter().all(|p| alive(*p)), "and its process runs");
    let (s, v) = http(
        &roots[0].join("brood.sock"),
        "POST",
        "/api/agents/far-away/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(10), || pids.iter().all(|p| !alive(*p))),
        "a cancel from node 0 reaches it"
    );
}

/// Placement (issue 15 items 3 and 5). A child asked for through node 1,
/// whose parent runs on node 0, runs on node 0, in its parent's cgroup; a
/// creation with labels runs on the node that has them; labels no live node
/// has are refused, naming them. An agent placed on a node that stops
/// answering before it claims it is placed again, by its labels, on the
/// other node that has them, and runs there; the paused node, back, runs
/// nothing of it.
#[test]
fn agents_run_where_their_parent_or_their_labels_say_and_a_lost_node_s_queue_moves() {
    let dir = tempfile::tempdir().unwrap();
    let db = Fresh::new();
    let roots: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let mut daemons = Vec::new();
    // Nodes 1 and 2 share the label pool=gpu.
    for (i, r) in roots.iter().enumerate() {
        std::fs::create_dir_all(r).unwrap();
        let pool = if i == 0 { "pool=cpu" } else { "pool=gpu" };
        daemons.push(serve_with(
            r,
            &db.url,
            &format!("z{i}"),
            &["--label", pool, "--node-expiry", "2"],
        ));
    }
    let nodes = Nodes {
        daemons,
        roots,
        store: db.url.clone(),
        db: Some(db),
        server: None,
        _dir: dir,
    };
    let ids = node_ids(&nodes);
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "top", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    // Through node 1, onto the parent's node 0.
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "kid", "parent": "top", "argv": agent(&["--hang"])}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["node"], ids["z0"], "placed on its parent's node: {v}");
    assert!(
        eventually(
            Duration::from_secs(10),
            || agent_on(&nodes, 1, "kid")["status"] == "running"
        ),
        "node 0 claims and starts it: {}",
        agent_on(&nodes, 1, "kid")
    );
    let kid = agent_on(&nodes, 2, "kid");
    let top = agent_on(&nodes, 2, "top");
    assert_eq!(kid["node"], ids["z0"], "{kid}");
    assert!(
        kid["cgroup"]
            .as_str()
            .unwrap()
            .starts_with(top["cgroup"].as_str().unwrap()),
        "in its parent's group: {kid} {top}"
    );
    assert!(
        ctx_pids(&nodes.roots[1]).is_empty(),
        "nothing runs on node 1"
    );
    // By labels, from node 0.
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "on-z2", "argv": agent(&["--hang"]), "placement": {"labels": {"zone": "z2"}}}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["node"], ids["z2"], "{v}");
    assert!(
        eventually(Duration::from_secs(10), || !ctx_pids(&nodes.roots[2])
            .is_empty()),
        "node 2 runs it"
    );
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "nowhere", "argv": agent(&["--hang"]), "placement": {"labels": {"zone": "mars"}}}),
    );
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "Unavailable", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("mars"),
        "{v}"
    );
    let (s, _) = http(
        &nodes.roots[0].join("brood.sock"),
        "GET",
        "/api/agents/nowhere",
        None,
    );
    assert_eq!(s, 404, "a refused placement leaves no record");

    // Node 2 (the least loaded gpu node) stops answering; an agent placed
    // on it just then is placed again on node 1 once node 2 is declared lost.
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "busy", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    nodes.cancel(2, "on-z2");
    assert!(eventually(Duration::from_secs(10), || agent_on(
        &nodes, 0, "on-z2"
    )["status"]
        == "cancelled"));
    let node2 = nodes.daemons[2].0.id() as i32;
    // SAFETY: pausing a node this test started.
    unsafe { libc::kill(node2, libc::SIGSTOP) };
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "moved", "argv": agent(&["--hang"]), "placement": {"labels": {"pool": "gpu"}}}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["node"], ids["z2"], "the most free gpu node: {v}");
    assert!(
        eventually(Duration::from_secs(20), || {
            let a = agent_on(&nodes, 0, "moved");
            a["status"] == "running" && a["node"] == ids["z1"]
        }),
        "placed again on node 1 and started there: {}",
        agent_on(&nodes, 0, "moved")
    );
    // SAFETY: resuming it.
    unsafe { libc::kill(node2, libc::SIGCONT) };
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        ctx_pids(&nodes.roots[2]).is_empty(),
        "node 2 runs nothing of it"
    );
    // A child of top that finished, resumed through node 1: it runs again
    // on its parent's node 0, its new run given the resume's input.
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "again", "parent": "top", "argv": agent(&["--result", "first"])}),
    );
    assert_eq!(s, 201, "{v}");
    assert!(eventually(Duration::from_secs(10), || agent_on(
        &nodes, 1, "again"
    )["status"]
        == "completed"));
    let (s, v) = http(
        &nodes.roots[1].join("brood.sock"),
        "POST",
        "/api/agents/again/resume",
        Some(&json!({"text": "once more"})),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["node"], ids["z0"], "{v}");
    assert!(
        eventually(Duration::from_secs(10), || {
            let a = agent_on(&nodes, 2, "again");
            a["status"] == "completed" && a["runs"].as_array().is_some_and(|r| r.len() == 2)
        }),
        "resumed on node 0: {}",
        agent_on(&nodes, 2, "again")
    );
    for name in ["top", "busy", "moved"] {
        nodes.cancel(0, name);
    }
}

/// `spawn --ready` through a node that does not run the agent (issue 25
/// item 9): answered once the agent said `ready` on the node that runs it,
/// or once it ended, never `queued` at once. The agent touches a file just
/// before it says `ready`, a second after it starts: the answer comes after
/// the file is there. Through the API with labels, and through the CLI for
/// a child of an agent another node runs.
#[test]
fn spawn_ready_through_another_node_waits_for_ready_there() {
    let nodes = Nodes::start(3);
    let dir = tempfile::tempdir().unwrap();
    let late = |marker: &std::path::Path| {
        format!(
            "read -r init; sleep 1; touch {}; echo '{{\"type\":\"ready\"}}'; read -r x",
            marker.display()
        )
    };
    let m1 = dir.path().join("late-ready");
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "late", "protocol": "brood", "await_ready": true,
               "argv": ["sh", "-c", late(&m1)],
               "placement": {"labels": {"zone": "z2"}}}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["status"], "running", "{v}");
    assert!(m1.exists(), "answered before the agent said ready: {v}");
    let ids: Vec<Value> = (0..3)
        .map(|i| agent_on(&nodes, i, "late")["node"].clone())
        .collect();
    assert!(ids.iter().all(|n| *n == ids[0]), "{ids:?}");

    // The CLI through node 0, for a child of `late` (which runs on node 2).
    let m2 = dir.path().join("kid-ready");
    let o = cli(
        &nodes.roots[0],
        &nodes.store,
        &[
            "spawn",
            "--ready",
            "--parent",
            "late",
            "--name",
            "kid",
            "--protocol",
            "brood",
            "--",
            "sh",
            "-c",
            &late(&m2),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(line.starts_with("kid\trunning\t"), "{line}");
    assert!(m2.exists(), "answered before the child said ready: {line}");
    assert_eq!(agent_on(&nodes, 0, "kid")["node"], ids[0]);

    // An agent that ends before it is ready: answered with its end.
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "never", "protocol": "brood", "await_ready": true,
               "argv": ["sh", "-c", "read -r init; exit 3"],
               "placement": {"labels": {"zone": "z1"}}}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["status"], "failed", "{v}");
    nodes.cancel(0, "late");
}

/// Issue 28's fault campaign: a child whose parent runs on its own node
/// hands back an artifact; every other node serves its bytes (the UI's
/// download), checked against their hash. Its node shared them only for a
/// parent on another node, so every other node answered 404.
#[test]
fn a_child_s_artifacts_are_served_by_every_node_when_its_parent_is_on_its_own() {
    let nodes = Nodes::start(2);
    let kid = json!({"name": "kid", "argv": agent(&["--artifact", "out.txt=the kid's bytes", "--result", "done"])});
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "mum", "argv": agent(&["--spawn", &kid.to_string(), "--wait"]),
               "placement": {"labels": {"zone": "z0"}}}),
    );
    assert_eq!(s, 201, "{v}");
    let sock0 = nodes.roots[0].join("brood.sock");
    let (s, w) = http(
        &sock0,
        "POST",
        "/api/agents/mum/wait",
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(
        (s, &w["agents"][0]["status"]),
        (200, &json!("completed")),
        "{w}"
    );
    // Both ran on node 0.
    let on0 = agent_on(&nodes, 0, "mum")["node"].clone();
    assert_eq!(agent_on(&nodes, 0, "kid")["node"], on0);
    let sock1 = nodes.roots[1].join("brood.sock");
    let (s, v) = http(&sock1, "GET", "/api/ui/agents/kid", None);
    assert_eq!(s, 200, "{v}");
    let art = v["channel"]["artifacts"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == "out.txt"))
        .unwrap_or_else(|| panic!("out.txt among kid's artifacts: {v}"))
        .clone();
    let (s, bytes) = http(
        &sock1,
        "GET",
        &format!(
            "/api/ui/agents/kid/artifacts/{}",
            art["sha256"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(
        (s, bytes),
        (200, json!("the kid's bytes")),
        "served by node 1"
    );
}

/// Issue 28's fault campaign: the store could not take a child's artifacts
/// at the moment it ended (here their table is away for a few seconds), and
/// they were never offered again: every other node answered 404. The node
/// that ran it tries again, backing off, and once the store takes them any
/// node serves them.
#[test]
fn a_child_s_artifacts_the_store_could_not_take_at_once_are_shared_when_it_can() {
    let db = Fresh::new();
    let nodes = Nodes::on(&db.url, 2, &[]);
    let kid = json!({"name": "kid", "argv": agent(&["--sleep-ms", "1500", "--artifact", "out.txt=shared late", "--result", "done"])});
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "mum", "argv": agent(&["--spawn", &kid.to_string(), "--wait"]),
               "placement": {"labels": {"zone": "z0"}}}),
    );
    assert_eq!(s, 201, "{v}");
    brood_store_conformance::pg::admin_on(
        &db.name,
        "ALTER TABLE blob_chunks RENAME TO blob_chunks_away",
    );
    // The kid runs, then ends while the table is away.
    let kid_pids = || -> Vec<i32> {
        ctx_pids(&nodes.roots[0])
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .any(|v| v == b"BROOD_AGENT=kid")
            })
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(30), || !kid_pids().is_empty()),
        "the kid never ran"
    );
    assert!(
        eventually(Duration::from_secs(30), || kid_pids().is_empty()),
        "the kid never ended"
    );
    std::thread::sleep(Duration::from_secs(1));
    brood_store_conformance::pg::admin_on(
        &db.name,
        "ALTER TABLE blob_chunks_away RENAME TO blob_chunks",
    );
    let (s, w) = http(
        &nodes.roots[0].join("brood.sock"),
        "POST",
        "/api/agents/mum/wait",
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(
        (s, &w["agents"][0]["status"]),
        (200, &json!("completed")),
        "{w}"
    );
    let sock1 = nodes.roots[1].join("brood.sock");
    let (s, v) = http(&sock1, "GET", "/api/ui/agents/kid", None);
    assert_eq!(s, 200, "{v}");
    let sha = v["channel"]["artifacts"][0]["sha256"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (s, bytes) = http(
        &sock1,
        "GET",
        &format!("/api/ui/agents/kid/artifacts/{sha}"),
        None,
    );
    assert_eq!(
        (s, bytes),
        (200, json!("shared late")),
        "served by node 1: {v}"
    );
    drop(nodes);
}
