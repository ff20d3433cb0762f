//! Many nodes on one PostgreSQL (issue 15 items 2 and 6, first part): three
//! real `brood serve` processes, each with a root of its own, sharing one
//! store on the real server (a database of the test's own). Admission stays
//! exact across them: a fanout bomb of 100 creations under one parent,
//! spread over the three, admits exactly `max_fanout` (8); a tree-size bomb
//! admits exactly what `max_tree_size` leaves. A cancel on the parent's node
//! reaches the children the other nodes run, every process gone; a budget
//! split over the three admits exactly what it holds. Every node lists every
//! node (`brood nodes`) with its labels, capacity, load and heartbeat. The
//! server dropping every connection loses and doubles nothing. A node killed
//! mid-tree is declared lost and its subtree elsewhere cancelled; a paused
//! node that comes back is fenced off.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brood_store_conformance::pg::{Fresh, Private};
use common::*;
use serde_json::{Value, json};

fn serve_with(root: &Path, store: &str, zone: &str, extra: &[&str]) -> Daemon {
    serve_wrapped(&[], root, store, zone, extra)
}

/// A node started under `wrap` (a command that runs the rest, as `unshare`).
fn serve_wrapped(wrap: &[&str], root: &Path, store: &str, zone: &str, extra: &[&str]) -> Daemon {
    // The node's log beside its root, so a node that fails says why.
    let log_path = root.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = match wrap.split_first() {
        #[allow(clippy::disallowed_methods)]
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe());
            c
        }
        #[allow(clippy::disallowed_methods)]
        None => Command::new(exe()),
    };
    let child = cmd
        .arg("--root")
        .arg(root)
        .arg("--store")
        .arg(store)
        .args(["serve", "--grace", "0.3"])
        // A fast tick unless the test sets its own.
        .args(if extra.contains(&"--sweep-every") {
            &[][..]
        } else {
            &["--sweep-every", "0.1"][..]
        })
        .args(["--label", &format!("zone={zone}"), "--capacity", "50"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let sock = root.join("brood.sock");
    assert!(
        eventually(Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "brood serve on {} did not start: {}",
        root.display(),
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    d
}

fn cli(root: &Path, store: &str, args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    Command::new(exe())
        .arg("--root")
        .arg(root)
        .arg("--store")
        .arg(store)
        .args(args)
        .env_remove("BROOD_SOCKET")
        .output()
        .unwrap()
}

struct Nodes {
    // Dropped first: the daemons stop before their database goes.
    daemons: Vec<Daemon>,
    roots: Vec<PathBuf>,
    store: String,
    db: Option<Fresh>,
    // A server of the test's own, stopped after the database it holds.
    server: Option<Private>,
    _dir: tempfile::TempDir,
}

impl Nodes {
    fn start(n: usize) -> Nodes {
        Nodes::start_with(n, &[])
    }

    fn start_with(n: usize, extra: &[&str]) -> Nodes {
        let db = Fresh::new();
        let mut nodes = Nodes::on(&db.url.clone(), n, extra);
        nodes.db = Some(db);
        nodes
    }

    /// `n` nodes on a PostgreSQL server of the test's own.
    fn on_private_server(n: usize) -> Nodes {
        let server = Private::new();
        let mut nodes = Nodes::on(&server.url.clone(), n, &[]);
        nodes.server = Some(server);
        nodes
    }

    fn on(store: &str, n: usize, extra: &[&str]) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        let roots: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("n{i}"))).collect();
        let mut daemons = Vec::new();
        for (i, r) in roots.iter().enumerate() {
            std::fs::create_dir_all(r).unwrap();
            daemons.push(serve_with(r, store, &format!("z{i}"), extra));
        }
        Nodes {
            daemons,
            roots,
            store: store.to_owned(),
            db: None,
            server: None,
            _dir: dir,
        }
    }

    fn spawn(&self, node: usize, args: Value) -> (u16, Value) {
        http(
            &self.roots[node].join("brood.sock"),
            "POST",
            "/api/agents",
            Some(&args),
        )
    }
}

/// 100 creations under `parent` at once, spread over the nodes, each to run
/// on the node it is asked through.
fn bomb(nodes: &Nodes, parent: &str) -> Vec<(u16, Value)> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..100)
            .map(|i| {
                let nodes = &nodes;
                sc.spawn(move || {
                    // Each on the node asked (by its zone), not the parent's.
                    let node = i % nodes.roots.len();
                    nodes.spawn(
                        node,
                        json!({"parent": parent, "name": format!("{parent}-c{i}"), "argv": agent(&["--hang"]),
                               "placement": {"labels": {"zone": format!("z{node}")}}}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn codes(replies: &[(u16, Value)]) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for (status, v) in replies {
        if *status == 201 {
            ok.push(v["name"].as_str().unwrap().to_owned());
        } else {
            refused.push(v["error"]["code"].as_str().unwrap_or("?").to_owned());
        }
    }
    (ok, refused)
}

fn ctx_pids(root: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&env)
                .contains(&format!("CTX_ROOT={}", root.join("ctx").display()))
        })
        .collect()
}

#[test]
fn a_fanout_bomb_over_three_nodes_admits_exactly_eight_and_a_cancel_crosses_them() {
    let nodes = Nodes::start(3);
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "p", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    let (ok, refused) = codes(&bomb(&nodes, "p"));
    assert!(
        refused.iter().all(|c| c == "QuotaFanout"),
        "only fanout refusals: {refused:?}"
    );
    assert_eq!((ok.len(), refused.len()), (8, 92), "{ok:?}");
    // Each node runs the children admitted through it.
    assert!(eventually(Duration::from_secs(10), || {
        (0..3)
            .map(|i| ctx_pids(&nodes.roots[i]).len())
            .sum::<usize>()
            == 9
    }));
    let elsewhere: Vec<i32> = (1..3).flat_map(|i| ctx_pids(&nodes.roots[i])).collect();
    assert!(!elsewhere.is_empty(), "children run on nodes 1 and 2");
    // Every node is listed by any node, with its labels, capacity and load.
    let listed = |node: usize| -> Vec<Value> {
        let o = cli(&nodes.roots[node], &nodes.store, &["nodes", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<Value>(&o.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let seen = listed(2);
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mut zones: Vec<&str> = seen
        .iter()
        .map(|n| n["labels"]["zone"].as_str().unwrap())
        .collect();
    zones.sort();
    assert_eq!(zones, ["z0", "z1", "z2"]);
    let load: u64 = seen
        .iter()
        .map(|n| n["live_agents"].as_u64().unwrap())
        .sum();
    assert_eq!(load, 9, "p and its 8 children: {seen:?}");
    assert!(
        seen.iter()
            .all(|n| n["alive"] == true && n["capacity"] == 50),
        "{seen:?}"
    );
    let beat = seen[0]["heartbeat_ms"].as_i64().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || listed(1)[0]["heartbeat_ms"]
            .as_i64()
            .unwrap()
            > beat),
        "nodes heartbeat"
    );
    // p is cancelled on its node; the children on the other two die too.
    let t = Instant::now();
    let (s, v) = http(
        &nodes.roots[0].join("brood.sock"),
        "POST",
        "/api/agents/p/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(10), || elsewhere
            .iter()
            .all(|p| !alive(*p))),
        "the other nodes' children are gone"
    );
    eprintln!(
        "cancel on node 0 reached {} processes on nodes 1 and 2 in {:?}",
        elsewhere.len(),
        t.elapsed()
    );
    let o = cli(&nodes.roots[1], &nodes.store, &["ps", "-a", "--json"]);
    let all: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)));
    let unfinished: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| !matches!(a["status"].as_str(), Some("cancelled")))
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || {
            let o = cli(&nodes.roots[1], &nodes.store, &["ps", "-a", "--json"]);
            let all: Value = serde_json::from_slice(&o.stdout).unwrap();
            all.as_array()
                .unwrap()
                .iter()
                .all(|a| a["status"] == "cancelled")
        }),
        "every record says cancelled: {unfinished:?}"
    );
}

#[test]
fn a_tree_size_bomb_over_three_nodes_admits_exactly_what_the_quota_leaves() {
    let nodes = Nodes::start(3);
    // Fanout out of the way; the tree may hold 20 agents, the root included.
    for (k, v) in [("max_fanout", "1000"), ("max_tree_size", "20")] {
        let o = cli(
            &nodes.roots[0],
            &nodes.store,
            &["quota", "set", "user-0", k, v],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "t", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    let (ok, refused) = codes(&bomb(&nodes, "t"));
    assert!(
        refused.iter().all(|c| c == "QuotaTreeSize"),
        "only tree-size refusals: {refused:?}"
    );
    assert_eq!((ok.len(), refused.len()), (19, 81), "{ok:?}");
    let (s, v) = http(
        &nodes.roots[1].join("brood.sock"),
        "POST",
        "/api/agents/t/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(eventually(Duration::from_secs(10), || {
        (0..3).all(|i| ctx_pids(&nodes.roots[i]).is_empty())
    }));
}

#[test]
fn a_budget_split_over_three_nodes_admits_exactly_what_it_holds() {
    let nodes = Nodes::start(3);
    let (s, v) = nodes.spawn(
        2,
        json!({"name": "b", "argv": agent(&["--hang"]), "await_ready": true,
               "policy": {"cost_limit": 1.0}}),
    );
    assert_eq!(s, 201, "{v}");
    // 100 children each reserving a quarter of the parent's budget, spread
    // over the three nodes: exactly four fit.
    let replies: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..100)
            .map(|i| {
                let nodes = &nodes;
                sc.spawn(move || {
                    nodes.spawn(
                        i % 3,
                        json!({"parent": "b", "name": format!("b-c{i}"), "argv": agent(&["--hang"]),
                               "policy": {"cost_limit": 0.25}}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, refused) = codes(&replies);
    assert!(
        refused.iter().all(|c| c == "BudgetExceeded"),
        "only budget refusals: {refused:?}"
    );
    assert_eq!((ok.len(), refused.len()), (4, 96), "{ok:?}");
    let (s, v) = http(
        &nodes.roots[2].join("brood.sock"),
        "POST",
        "/api/agents/b/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(eventually(Duration::from_secs(10), || {
        (0..3).all(|i| ctx_pids(&nodes.roots[i]).is_empty())
    }));
}

/// A tree spanning three nodes: `top` on node 0, `mid` on node 1 and
/// `leaf` on node 2 (placed there by their zones, each asked for through
/// the node it goes to), each running before the next is asked for.
fn spawn_across(nodes: &Nodes, hang: impl Fn(&str, Option<&str>) -> Value) {
    for (node, name, parent) in [
        (0, "top", None),
        (1, "mid", Some("top")),
        (2, "leaf", Some("mid")),
    ] {
        let mut body = hang(name, parent);
        body["placement"] = json!({"labels": {"zone": format!("z{node}")}});
        let (s, v) = nodes.spawn(node, body);
        assert_eq!(s, 201, "{name}: {v}");
        assert!(
            eventually(
                Duration::from_secs(10),
                || agent_on(nodes, node, name)["status"] == "running"
            ),
            "{name} runs: {}",
            agent_on(nodes, node, name)
        );
    }
}

/// Runs `sql` on the test's database as the administrator.
fn admin_sql(db: &str, sql: &str) {
    let base = brood_store_conformance::pg::admin_url();
    let at = base.rfind('/').unwrap();
    let url = format!("{}/{db}", &base[..at]);
    let sql = sql.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let task = tokio::spawn(conn);
            c.batch_execute(&sql).await.unwrap();
            drop(c);
            let _ = task.await;
        });
    })
    .join()
    .unwrap();
}

/// The server drops every node's connections in the middle of a stream of
/// creations (what a restart of PostgreSQL looks like from the nodes): the
/// creations in flight may fail, the nodes reconnect on their next call, and
/// afterwards every creation a node confirmed is recorded once, the event
/// sequence has no gap, and nothing runs without a record.
#[test]
fn nodes_reconnect_after_the_server_drops_their_connections_and_nothing_is_lost_or_doubled() {
    let nodes = Nodes::start(3);
    let db = nodes.db.as_ref().unwrap().name.clone();
    creations_survive(&nodes, || {
        // Every connection of every node to this database, ended by the server.
        admin_sql(
            &db,
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{db}' AND pid <> pg_backend_pid()"
            ),
        );
    });
}

/// PostgreSQL itself restarted under a stream of creations (issue 15 item
/// 6): a server of the test's own, stopped as a crash stops it (every
/// connection cut, no checkpoint) and started again a second later. The
/// nodes reconnect, and nothing a node confirmed is lost or doubled.
#[test]
fn nodes_ride_out_a_postgresql_restart_under_load_and_nothing_is_lost_or_doubled() {
    let nodes = Nodes::on_private_server(3);
    let server = nodes.server.as_ref().unwrap();
    creations_survive(&nodes, || {
        server.stop_hard();
        std::thread::sleep(Duration::from_secs(1));
        server.start();
    });
    // The nodes heartbeat again on the restarted server.
    let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
}

/// A stream of creations from three workers (one per node) while
/// `disrupt` takes the store away under them: the creations in flight may
/// fail, the nodes reconnect on their next call, and afterwards every
/// creation a node confirmed is recorded once, the event sequence has no
/// gap, and nothing runs without a record.
fn creations_survive(nodes: &Nodes, disrupt: impl FnOnce()) {
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "r", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    for (k, v) in [("max_fanout", "1000"), ("max_tree_size", "1000")] {
        let o = cli(
            &nodes.roots[0],
            &nodes.store,
            &["quota", "set", "user-0", k, v],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let replies: Vec<(String, u16, Value)> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let (nodes, stop) = (&nodes, &stop);
                sc.spawn(move || {
                    let mut out = Vec::new();
                    let mut i = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 400 {
                        let name = format!("r-w{w}-{i}");
                        let (s, v) = nodes.spawn(
                            w,
                            json!({"parent": "r", "name": name, "argv": agent(&["--result", "x"])}),
                        );
                        // A client backs off while the store is away.
                        if s != 201 {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        out.push((name, s, v));
                        i += 1;
                    }
                    out
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        disrupt();
        std::thread::sleep(Duration::from_millis(2500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        workers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let confirmed: Vec<&String> = replies
        .iter()
        .filter(|(_, s, _)| *s == 201)
        .map(|(n, _, _)| n)
        .collect();
    let failed: Vec<&(String, u16, Value)> = replies.iter().filter(|(_, s, _)| *s != 201).collect();
    for (n, s, v) in &failed {
        assert!(
            *s >= 500 || v["error"]["code"] == "Unavailable" || v["error"]["code"] == "Internal",
            "{n}: only the server's loss may fail a creation: {s} {v}"
        );
    }
    // The nodes came back: creations succeeded after the drop too.
    let after_drop = replies
        .iter()
        .rev()
        .take_while(|(_, s, _)| *s == 201)
        .count();
    assert!(
        after_drop > 0,
        "nothing succeeded after the drop ({} failed; the last: {:?})",
        failed.len(),
        failed.last()
    );
    // Every confirmed creation is recorded, once; every agent finishes.
    assert!(
        eventually(Duration::from_secs(30), || {
            let o = cli(&nodes.roots[1], &nodes.store, &["ps", "-a", "--json"]);
            let all: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
            all.as_array().is_some_and(|a| {
                a.iter().filter(|x| x["name"] != "r").all(|x| {
                    x["status"] == "completed"
                        || x["status"] == "failed"
                        || x["status"] == "cancelled"
                })
            })
        }),
        "every child ends: {:?}",
        {
            let o = cli(&nodes.roots[1], &nodes.store, &["ps", "--json"]);
            let all: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
            all.as_array().map(|a| {
                a.iter()
                    .map(|x| format!("{} {} {}", x["name"], x["state"], x["node"]))
                    .collect::<Vec<_>>()
            })
        }
    );
    let o = cli(&nodes.roots[1], &nodes.store, &["ps", "-a", "--json"]);
    let all: Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for n in &confirmed {
        assert_eq!(
            names.iter().filter(|x| **x == n.as_str()).count(),
            1,
            "{n} was confirmed: recorded once"
        );
    }
    // The event log has no gap and no repeat.
    let o = cli(&nodes.roots[2], &nodes.store, &["events"]);
    let seqs: Vec<i64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["sequence"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    eprintln!(
        "{} creations confirmed, {} failed with the server's loss, {} after it",
        confirmed.len(),
        failed.len(),
        after_drop
    );
    let (s, v) = http(
        &nodes.roots[0].join("brood.sock"),
        "POST",
        "/api/agents/r/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
}

fn agent_on(nodes: &Nodes, node: usize, name: &str) -> Value {
    agent_on_root(&nodes.roots[node], name)
}

/// A node killed with SIGKILL in the middle of a tree spanning three nodes:
/// its processes die with it; once its heartbeat expires another node marks
/// what it ran `failed (lost)`, the grandchild on a third node is cancelled
/// (`parent_dead`) and its process ends, nothing is left `running` without a
/// process, the event sequence has no gap, and the node is no longer listed.
#[test]
fn a_node_killed_mid_tree_is_declared_lost_and_its_subtree_elsewhere_cancelled() {
    let mut nodes = Nodes::start_with(3, &["--node-expiry", "1.5"]);
    let hang = |name: &str, parent: Option<&str>| {
        let mut v = json!({"name": name, "argv": agent(&["--hang"]), "await_ready": true});
        if let Some(p) = parent {
            v["parent"] = json!(p);
        }
        v
    };
    spawn_across(&nodes, hang);
    let mid_pids = ctx_pids(&nodes.roots[1]);
    let leaf_pids = ctx_pids(&nodes.roots[2]);
    assert!(!mid_pids.is_empty() && !leaf_pids.is_empty());
    let node1 = nodes.daemons[1].0.id() as i32;
    // SAFETY: killing the node this test started.
    unsafe { libc::kill(node1, libc::SIGKILL) };
    assert!(
        eventually(Duration::from_secs(5), || mid_pids
            .iter()
            .all(|p| !alive(*p))),
        "the node's processes die with it"
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            agent_on(&nodes, 0, "mid")["status"] == "failed"
        }),
        "{}",
        agent_on(&nodes, 0, "mid")
    );
    let mid = agent_on(&nodes, 2, "mid");
    assert_eq!(mid["reason"], "lost", "{mid}");
    assert!(
        eventually(Duration::from_secs(10), || {
            agent_on(&nodes, 0, "leaf")["status"] == "cancelled"
        }),
        "{}",
        agent_on(&nodes, 0, "leaf")
    );
    assert_eq!(agent_on(&nodes, 0, "leaf")["reason"], "parent_dead");
    assert!(
        eventually(Duration::from_secs(5), || leaf_pids
            .iter()
            .all(|p| !alive(*p))),
        "the grandchild on the third node is gone"
    );
    // The node is no longer listed; the other two are.
    let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    // Nothing is running without a process: every unfinished agent is top,
    // which runs on node 0.
    let o = cli(&nodes.roots[0], &nodes.store, &["ps", "--json"]);
    let live: Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = live
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["top"]);
    let o = cli(&nodes.roots[2], &nodes.store, &["events"]);
    let seqs: Vec<i64> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["sequence"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    let (s, v) = http(
        &nodes.roots[0].join("brood.sock"),
        "POST",
        "/api/agents/top/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
    nodes.daemons.remove(1);
}

/// A node paused (SIGSTOP) past its heartbeat is declared lost while its
/// agents' processes still run; when it comes back it finds it was, and
/// stops them: the records stay `failed (lost)`, and no process runs that the
/// store says is over.
#[test]
fn a_paused_node_that_comes_back_is_fenced_off() {
    let nodes = Nodes::start_with(2, &["--node-expiry", "1.5"]);
    let (s, v) = nodes.spawn(
        1,
        json!({"name": "sleeper", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(s, 201, "{v}");
    let pids = ctx_pids(&nodes.roots[1]);
    assert!(!pids.is_empty());
    let node1 = nodes.daemons[1].0.id() as i32;
    // SAFETY: pausing the node this test started.
    unsafe { libc::kill(node1, libc::SIGSTOP) };
    assert!(
        eventually(Duration::from_secs(15), || {
            agent_on(&nodes, 0, "sleeper")["status"] == "failed"
        }),
        "the paused node's agent is declared lost"
    );
    assert!(
        pids.iter().all(|p| alive(*p)),
        "its process still runs while the node is paused"
    );
    // SAFETY: resuming it.
    unsafe { libc::kill(node1, libc::SIGCONT) };
    assert!(
        eventually(Duration::from_secs(10), || pids.iter().all(|p| !alive(*p))),
        "the node comes back, finds itself declared lost, and stops what it ran"
    );
    let a = agent_on(&nodes, 0, "sleeper");
    assert_eq!(
        (a["status"].as_str(), a["reason"].as_str()),
        (Some("failed"), Some("lost")),
        "{a}"
    );
    // It heartbeats again, registered afresh.
    assert!(eventually(Duration::from_secs(5), || {
        let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
        serde_json::from_slice::<Value>(&o.stdout)
            .map(|v| v.as_array().map_or(0, |a| a.len()) == 2)
            .unwrap_or(false)
    }));
}

/// News cross nodes at once (issue 15 items 3 and 4): with ticks ten
/// minutes apart, nothing but `LISTEN/NOTIFY` can carry a change on one node
/// to another within the test. An input sent through node 2 to a child node
/// 1 runs is routed there and delivered; the wait on node 0 for that child
/// is answered when it ends; a cancel on node 0 reaches the processes of a
/// tree spanning all three nodes.
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
               "argv": agent(&["--inputs", "1", "--result", "quick's answer"])}),
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
    let quick = agent_on(&nodes, 0, "quick");
    assert_eq!(quick["status"], "completed", "{quick}");

    let elsewhere: Vec<i32> = ctx_pids(&nodes.roots[1])
        .into_iter()
        .chain(ctx_pids(&nodes.roots[2]))
        .collect();
    assert!(!elsewhere.is_empty());
    let (s, v) = http(
        &nodes.roots[0].join("brood.sock"),
        "POST",
        "/api/agents/top/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
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

/// A node started inside `unshare`: stopped by killing `unshare`, whose
/// death the kernel passes on to the node as SIGTERM (`--kill-child`);
/// `unshare` itself ignores SIGTERM while it waits for its child.
struct Unshared(Daemon);

impl Drop for Unshared {
    fn drop(&mut self) {
        // SAFETY: killing the `unshare` this test started.
        unsafe { libc::kill(self.0.0.id() as i32, libc::SIGKILL) };
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
        &["unshare", "--pid", "--mount-proc", "--kill-child=SIGTERM"],
        &roots[1],
        &db.url,
        "far",
        &[],
    ));
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

fn agent_on_root(root: &Path, name: &str) -> Value {
    let (s, a) = http(
        &root.join("brood.sock"),
        "GET",
        &format!("/api/agents/{name}"),
        None,
    );
    assert_eq!(s, 200, "{a}");
    a
}

/// The node ids of a cluster by their `zone` label.
fn node_ids(nodes: &Nodes) -> std::collections::HashMap<String, String> {
    let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        nodes.roots.len(),
        "{listed}"
    );
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["labels"]["zone"].as_str().unwrap().to_owned(),
                n["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
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
    let (s, v) = http(
        &nodes.roots[2].join("brood.sock"),
        "POST",
        "/api/agents/on-z2/cancel",
        None,
    );
    assert_eq!(s, 200, "{v}");
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
        let (s, v) = http(
            &nodes.roots[0].join("brood.sock"),
            "POST",
            &format!("/api/agents/{name}/cancel"),
            None,
        );
        assert_eq!(s, 200, "{name}: {v}");
    }
}
