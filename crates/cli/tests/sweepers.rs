//! Sweepers (SPEC 9, issue 4 items 6-7): runs past their timeout, orphans made
//! by editing the store by hand, agents whose process is gone, only one of two
//! supervisors sharing a store sweeping, and the metrics at `/metrics`.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use brood_runtime::Sweeper;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};

fn fast_sweeps() -> Env {
    start_with(Duration::from_millis(300), |c| {
        c.sweep_every = Some(Duration::from_millis(100))
    })
}

async fn spawn(env: &Env, args: Value) {
    let mut args = args;
    args["await_ready"] = json!(true);
    handle(&env.sup, &me(), "spawn", &args)
        .await
        .unwrap_or_else(|e| panic!("spawn {args}: {e}"));
}

fn state(env: &Env, n: &str) -> (String, String) {
    let v = show(env, n);
    (
        v["status"].as_str().unwrap_or("").to_owned(),
        v["reason"].as_str().unwrap_or("").to_owned(),
    )
}

fn sql(db: &Path, stmt: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c.execute_batch(stmt).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_timeout_fails_timed_out_with_its_subtree() {
    let env = fast_sweeps();
    // Deadlines are whole seconds: a parent in the last second of its run may
    // create no child (its deadline has come). With 4 s, `kid` (created right
    // after `slow` is ready) is inside the first three seconds even on a
    // machine busy enough to take a second over a spawn.
    spawn(
        &env,
        json!({"name": "slow", "argv": agent(&["--hang"]), "policy": {"timeout_s": 4}}),
    )
    .await;
    spawn(
        &env,
        json!({"name": "kid", "parent": "slow", "argv": agent(&["--hang"])}),
    )
    .await;
    let pids: Vec<i32> = ["slow", "kid"]
        .iter()
        .flat_map(|n| processes_of(&env, n))
        .collect();
    assert!(pids.len() >= 2, "both agents have a process: {pids:?}");
    let r = env
        .sup
        .wait(
            me(),
            vec![name("slow"), name("kid")],
            Some(Duration::from_secs(15)),
        )
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["timed_out"], false, "{r}");
    assert_eq!(state(&env, "slow"), ("failed".into(), "timed_out".into()));
    assert_eq!(
        state(&env, "kid"),
        ("cancelled".into(), "parent_dead".into())
    );
    // Every process has exited by the time the records say so (their
    // cgroup is empty); the keeper may reap one a moment later (`alive`
    // counts a zombie).
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "no process left"
    );
    let started = show(&env, "slow")["started_ms"].as_i64().unwrap();
    let ended = show(&env, "slow")["ended_ms"].as_i64().unwrap();
    assert!(
        ended - started >= 3000,
        "not before its timeout: {}",
        ended - started
    );
    assert!(env.sup.metrics().sweeper_actions(Sweeper::Timeouts) >= 1);
    // The ctx files catch up on their own thread.
    env.sup.flush().await;
    let events = json_lines(session_dir(&env, "slow").join("events.jsonl"));
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "agent.sweep" && e["sweeper"] == "timeouts"),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_and_lost_agents_made_by_hand_are_repaired() {
    let env = fast_sweeps();
    let db = env.sup.paths().db();
    let t = env.sup.tenant().as_str().to_owned();
    let me_id = env.sup.host_info().supervisor_id.clone();
    spawn(&env, json!({"name": "p", "argv": agent(&["--hang"])})).await;
    spawn(
        &env,
        json!({"name": "c", "parent": "p", "argv": agent(&["--hang"])}),
    )
    .await;
    let c_pids = processes_of(&env, "c");
    assert!(!c_pids.is_empty());
    // 1. An agent running whose parent the store says is finished.
    sql(
        &db,
        "UPDATE agents SET status = 'completed' WHERE name = 'p'",
    );
    // 2. An agent the store calls running, hosted here, with no process at all,
    //    and its child hosted by a supervisor that is long gone.
    sql(
        &db,
        &format!(
            "INSERT INTO agents (tenant, name, parent, customer, root, depth, session, protocol, spec,
                 status, detail, run, supervisor, created_ms, updated_ms)
             VALUES ('{t}', 'ghost', NULL, NULL, 'ghost', 0, 'default', 'brood', '{{}}', 'running',
                 NULL, '0190a0a0-0000-7000-8000-00000000aa01', '{me_id}', 1, 1),
                    ('{t}', 'ghostkid', 'ghost', NULL, 'ghost', 1, 'default', 'brood', '{{}}', 'running',
                 NULL, '0190a0a0-0000-7000-8000-00000000aa02', 's1-1', 1, 1);
             INSERT INTO edges (tenant, parent, child, created_ms) VALUES ('{t}', 'ghost', 'ghostkid', 1);
             INSERT INTO runs (id, tenant, agent, seq, pid, created_ms, started_ms)
             VALUES ('0190a0a0-0000-7000-8000-00000000aa01', '{t}', 'ghost', 1, 999999, 1, 1),
                    ('0190a0a0-0000-7000-8000-00000000aa02', '{t}', 'ghostkid', 1, 999998, 1, 1);"
        ),
    );
    let repaired = eventually(Duration::from_secs(10), || {
        state(&env, "c").0 == "cancelled"
            && state(&env, "ghost").0 == "failed"
            && ["cancelled", "failed"].contains(&state(&env, "ghostkid").0.as_str())
    });
    assert!(
        repaired,
        "c {:?}, ghost {:?}, ghostkid {:?}",
        state(&env, "c"),
        state(&env, "ghost"),
        state(&env, "ghostkid")
    );
    assert_eq!(state(&env, "c").1, "parent_dead");
    assert_eq!(state(&env, "ghost").1, "lost");
    assert!(
        show(&env, "ghost")["detail"]
            .as_str()
            .unwrap()
            .contains("process is gone")
    );
    // Its host is gone too: whichever the sweeper met first, lost itself or
    // cancelled with its parent, it is finished and says why.
    let kid = state(&env, "ghostkid");
    assert!(
        kid == ("failed".into(), "lost".into())
            || kid == ("cancelled".into(), "parent_dead".into()),
        "{kid:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || c_pids.iter().all(|p| !alive(*p))),
        "the orphan's processes are gone"
    );
    assert!(env.sup.metrics().sweeper_actions(Sweeper::Orphans) >= 3);
    // Idempotent: another pass finds nothing more to do.
    let before = env.sup.metrics().sweeper_actions(Sweeper::Orphans);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(env.sup.metrics().sweeper_actions(Sweeper::Orphans), before);
    env.sup.shutdown().await;
}

fn serve(root: &Path, store: &Path) -> Daemon {
    #[allow(clippy::disallowed_methods)]
    let child = Command::new(exe())
        .arg("--root")
        .arg(root)
        .arg("--store")
        .arg(store)
        .args(["serve", "--grace", "0.3", "--sweep-every", "0.1"])
        // Its name (a, b) as a label, so a creation can ask for it.
        .arg("--label")
        .arg(format!(
            "side={}",
            root.file_name().unwrap().to_string_lossy()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    assert!(eventually(Duration::from_secs(10), || root
        .join("brood.sock")
        .exists()));
    d
}

/// `GET /metrics` on a control socket, parsed into `name{labels} -> value`.
fn metrics(root: &Path) -> std::collections::HashMap<String, f64> {
    let mut s = std::os::unix::net::UnixStream::connect(root.join("brood.sock")).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: brood\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

fn cli(root: &Path, store: &Path, args: &[&str]) -> std::process::Output {
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

/// Two `brood serve` processes with roots of their own sharing one store.
struct TwoSupervisors {
    // Dropped first: the daemons stop before their directory goes.
    _daemons: (Daemon, Daemon),
    a: std::path::PathBuf,
    b: std::path::PathBuf,
    store: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TwoSupervisors {
    fn start() -> TwoSupervisors {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("shared.db");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let daemons = (serve(&a, &store), serve(&b, &store));
        TwoSupervisors {
            _daemons: daemons,
            a,
            b,
            store,
            _dir: dir,
        }
    }
}

#[test]
fn of_two_supervisors_sharing_a_store_only_the_lease_holder_sweeps() {
    let two = TwoSupervisors::start();
    let (ra, rb, store) = (two.a.clone(), two.b.clone(), two.store.clone());
    let epoch = |m: &std::collections::HashMap<String, f64>| m["subagent_sweeper_lease_epoch"];
    assert!(eventually(Duration::from_secs(5), || {
        epoch(&metrics(&ra)) + epoch(&metrics(&rb)) > 0.0
    }));
    let (ma, mb) = (metrics(&ra), metrics(&rb));
    assert!(
        (epoch(&ma) > 0.0) != (epoch(&mb) > 0.0),
        "exactly one holds the lease: a {} b {}",
        epoch(&ma),
        epoch(&mb)
    );
    // An orphan on supervisor a, made by hand.
    let hang = agent(&["--hang"]);
    let mut args = vec!["spawn", "--name", "p", "--ready", "--"];
    args.extend(hang.iter().map(String::as_str));
    assert!(cli(&ra, &store, &args).status.success());
    let mut args = vec!["spawn", "--parent", "p", "--name", "c", "--ready", "--"];
    args.extend(hang.iter().map(String::as_str));
    assert!(cli(&ra, &store, &args).status.success());
    // The gauges count each supervisor's own agents.
    assert_eq!(metrics(&ra)["subagent_live_agents"], 2.0);
    assert_eq!(metrics(&rb)["subagent_live_agents"], 0.0);
    sql(
        &store,
        "UPDATE agents SET status = 'completed' WHERE name = 'p'",
    );
    // Recorded by the lease holder, carried out by a, which hosts c.
    assert!(
        eventually(Duration::from_secs(10), || {
            metrics(&ra)["subagent_cascade_terminations_total"] == 1.0
        }),
        "{}",
        String::from_utf8_lossy(&cli(&ra, &store, &["show", "c"]).stdout)
    );
    let o = cli(&ra, &store, &["show", "c"]);
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("status") && l.contains("cancelled")),
        "{shown}"
    );
    let orphans = |m: &std::collections::HashMap<String, f64>| m["subagent_sweeper_actions_total{sweeper=\"orphans\"}"];
    let (ma, mb) = (metrics(&ra), metrics(&rb));
    let (holder, other) = if epoch(&ma) > 0.0 {
        (&ma, &mb)
    } else {
        (&mb, &ma)
    };
    assert_eq!(orphans(holder), 1.0, "the holder swept the orphan once");
    assert_eq!(orphans(other), 0.0, "the other never sweeps");
    for m in [&ma, &mb] {
        for k in [
            "subagent_invocations_total{outcome=\"completed\"}",
            "subagent_quota_denials_total{quota=\"max_fanout\"}",
            "subagent_sweeper_cross_tenant_reads_total",
            "subagent_invoke_duration_seconds_count",
            "subagent_live_agents",
            "subagent_queued_agents",
            "subagent_blocked_agents",
        ] {
            assert!(m.contains_key(k), "{k} missing");
        }
    }
}

/// One verb through a supervisor's API, answered as `{"ok": true, "result"}`
/// or `{"ok": false, "error"}`.
fn request(root: &Path, op: &str, args: Value) -> Value {
    let sock = root.join("brood.sock");
    let answer = |(status, v): (u16, Value)| {
        if (200..300).contains(&status) {
            json!({"ok": true, "result": v})
        } else {
            json!({"ok": false, "error": v["error"]})
        }
    };
    match op {
        "spawn" => answer(http(&sock, "POST", "/api/agents", Some(&args))),
        "cancel" => answer(http(
            &sock,
            "POST",
            &format!("/api/agents/{}/cancel", args["name"].as_str().unwrap()),
            None,
        )),
        "wait" => {
            let mut agents = Vec::new();
            let mut timed_out = false;
            for n in args["names"].as_array().unwrap() {
                let (status, v) = http(
                    &sock,
                    "POST",
                    &format!("/api/agents/{}/wait", n.as_str().unwrap()),
                    Some(&json!({"timeout_s": args["timeout_s"]})),
                );
                assert_eq!(status, 200, "{v}");
                timed_out |= v["timed_out"] == true;
                agents.push(v["agents"][0].clone());
            }
            json!({"ok": true, "result": {"agents": agents, "timed_out": timed_out}})
        }
        other => panic!("no such verb {other}"),
    }
}

#[test]
fn a_fanout_bomb_through_two_supervisors_admits_exactly_the_fanout_and_the_cascade_crosses() {
    let two = TwoSupervisors::start();
    let (ra, rb) = (two.a.clone(), two.b.clone());
    let r = request(
        &ra,
        "spawn",
        json!({"name": "p", "argv": agent(&["--hang"]), "await_ready": true}),
    );
    assert_eq!(r["ok"], true, "{r}");
    // 100 creations under p at once, half through each supervisor; p runs on a.
    let replies: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..100)
            .map(|i| {
                let root = if i % 2 == 0 { ra.clone() } else { rb.clone() };
                sc.spawn(move || {
                    request(
                        &root,
                        "spawn",
                        // Each on the supervisor asked (a child runs on its
                        // parent's by default).
                        json!({"parent": "p", "name": format!("c{i}"), "argv": agent(&["--hang"]), "await_ready": true,
                               "placement": {"labels": {"side": if i % 2 == 0 { "a" } else { "b" }}}}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: Vec<&Value> = replies.iter().filter(|r| r["ok"] == true).collect();
    let fanout = replies
        .iter()
        .filter(|r| r["error"]["code"] == "QuotaFanout")
        .count();
    let other: Vec<&Value> = replies
        .iter()
        .filter(|r| r["ok"] != true && r["error"]["code"] != "QuotaFanout")
        .collect();
    assert!(other.is_empty(), "unexpected replies: {other:?}");
    assert_eq!((ok.len(), fanout), (8, 92));
    let kids: Vec<String> = ok
        .iter()
        .map(|r| r["result"]["name"].as_str().unwrap().to_owned())
        .collect();
    let on_b = kids
        .iter()
        .filter(|k| k[1..].parse::<u32>().unwrap() % 2 == 1)
        .count();
    // The parity of a child's name says which supervisor admitted it.
    let pids_b: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env = String::from_utf8_lossy(&env);
            env.contains(&format!("CTX_ROOT={}", rb.join("ctx").display()))
        })
        .collect();
    // Children admitted through b run on b: one process each.
    assert_eq!(
        pids_b.len(),
        on_b,
        "b hosts its children: {pids_b:?} for {kids:?}"
    );
    // p is cancelled on a; the children on b die too (b carries out the stop a
    // recorded), and every record says cancelled.
    let r = request(&ra, "cancel", json!({"name": "p"}));
    assert_eq!(r["ok"], true, "{r}");
    let mut names = vec!["p".to_owned()];
    names.extend(kids.iter().cloned());
    let r = request(&ra, "wait", json!({"names": names, "timeout_s": 10}));
    assert_eq!(r["result"]["timed_out"], false, "{r}");
    for a in r["result"]["agents"].as_array().unwrap() {
        assert_eq!(a["status"], "cancelled", "{a}");
    }
    assert!(
        eventually(Duration::from_secs(3), || pids_b.iter().all(|p| !alive(*p))),
        "b's children are gone"
    );
}

/// Every refused creation is counted by its code in `/metrics`, attenuation
/// codes included, scraped from a real `brood serve` over its socket.
#[test]
fn every_refusal_is_counted_by_code_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store) = (dir.path().join("r"), dir.path().join("brood.db"));
    let _d = serve(&root, &store);
    let spawn = |args: Value| request(&root, "spawn", args);
    let r = spawn(json!({
        "name": "p", "argv": agent(&["--hang"]), "await_ready": true,
        "policy": {"tools": ["create"], "create_limit": 1},
    }));
    assert_eq!(r["ok"], true, "{r}");
    let refused = [
        (
            json!({"name": "bad name!", "argv": agent(&[])}),
            "InvalidName",
        ),
        (
            json!({"name": "x", "parent": "ghost", "argv": agent(&[])}),
            "ParentMismatch",
        ),
        (
            json!({"name": "x", "parent": "p", "argv": agent(&[]), "policy": {"tools": ["create", "shell"]}}),
            "ToolExpansion",
        ),
        (json!({"name": "p", "argv": agent(&[])}), "NameTaken"),
    ];
    for (args, code) in &refused {
        let r = spawn(args.clone());
        assert_eq!(r["ok"], false, "{args}: {r}");
        assert_eq!(r["error"]["code"], *code, "{args}: {r}");
    }
    // The first child fits p's create_limit of 1; the second does not.
    let ok = spawn(json!({"name": "c1", "parent": "p", "argv": agent(&["--hang"])}));
    assert_eq!(ok["ok"], true, "{ok}");
    let r = spawn(json!({"name": "c2", "parent": "p", "argv": agent(&["--hang"])}));
    assert_eq!(r["error"]["code"], "CreateLimit", "{r}");
    let m = metrics(&root);
    let count = |code: &str| m[&format!("subagent_refusals_total{{code=\"{code}\"}}")];
    for code in [
        "InvalidName",
        "ParentMismatch",
        "ToolExpansion",
        "NameTaken",
        "CreateLimit",
    ] {
        assert_eq!(count(code), 1.0, "{code}");
    }
    // Codes never met are listed at 0, so a scrape always sees every series.
    assert_eq!(count("QuotaFanout"), 0.0);
    assert_eq!(
        m["subagent_quota_denials_total{quota=\"create_limit\"}"],
        1.0
    );
    request(&root, "cancel", json!({"name": "p"}));
}
