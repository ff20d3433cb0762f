//! Issue 29: trees that survive a restart. `brood serve` killed with
//! SIGKILL in the middle of a tree; its next start resumes the agents whose
//! policy says `on_restart: resume` (parents before children, each a new
//! run with its history) and cancels the rest as before; nothing is done
//! twice: no second child, no tool's side effect repeated, no job item
//! reported twice. On SQLite and on PostgreSQL (one node).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// A root and where its store is (`None`: the root's SQLite file).
struct Root {
    dir: PathBuf,
    store: Option<String>,
}

impl Root {
    /// `brood` on this root and its store (a URL with a password goes in
    /// the environment, never on a command line).
    fn command(&self) -> Command {
        #[allow(clippy::disallowed_methods)]
        let mut c = Command::new(exe());
        c.arg("--root").arg(&self.dir).env_remove("BROOD_SOCKET");
        match &self.store {
            Some(s) => c.env("BROOD_STORE", s),
            None => c.env_remove("BROOD_STORE"),
        };
        c
    }

    fn brood(&self, args: &[&str]) -> std::process::Output {
        self.command().args(args).output().expect("brood runs")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.brood(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|_| panic!("{args:?}: {out}"))
    }

    fn show(&self, name: &str) -> Value {
        self.json(&["show", name, "--json"])
    }

    /// `brood serve` on this root, its log in `serve.log` beside it.
    fn serve(&self) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("serve.log"))
            .unwrap();
        let child = self
            .command()
            .args(["serve", "--grace", "0.3"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let d = Daemon(child);
        let sock = self.dir.join("brood.sock");
        assert!(
            eventually(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&sock).is_ok()
            }),
            "the daemon serves {}: {}",
            sock.display(),
            self.log()
        );
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("serve.log")).unwrap_or_default()
    }

    fn session_file(&self, agent: &str, file: &str) -> PathBuf {
        // SAFETY: geteuid(2) has no failure mode.
        let uid = unsafe { libc::geteuid() };
        self.dir
            .join(format!("ctx/home/{uid}/agent/{agent}/session/default"))
            .join(file)
    }

    /// Waits until `name` is finished; its record.
    fn finished(&self, name: &str, limit: Duration) -> Value {
        let mut last = Value::Null;
        let done = eventually(limit, || {
            last = self.show(name);
            !matches!(
                last["status"].as_str(),
                Some("queued" | "running" | "blocked" | "stopping")
            )
        });
        assert!(done, "{name} never finished: {last}\n{}", self.log());
        last
    }
}

/// SIGKILL: no shutdown, no chance to tidy anything.
fn kill9(mut d: Daemon) {
    d.0.kill().unwrap();
    d.0.wait().unwrap();
    // Reaped: dropping it must not signal a pid that may be reused.
    std::mem::forget(d);
}

fn root(dir: &Path, pg: Option<&brood_store_conformance::pg::Fresh>) -> Root {
    Root {
        dir: dir.join("root"),
        store: pg.map(|p| p.url.clone()),
    }
}

fn write(dir: &Path, file: &str, v: &Value) -> String {
    let p = dir.join(file);
    std::fs::write(&p, v.to_string()).unwrap();
    p.to_string_lossy().into_owned()
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The plan of a three-level tree of reference agents, replayed whole from
/// its first turn by every run (`"replay": true`): each agent appends a
/// line to `log` with `shell`, creates its child by name and waits for it;
/// the leaf's last turn is slow, so the tree is caught in the middle.
fn tree_script(log: &Path, slow_ms: u64) -> Value {
    let append = |who: &str| json!({"name": "shell", "arguments": {"command": format!("echo {who} >> {}", log.display())}});
    let create = |name: &str| json!({"name": "create", "arguments": {"task": format!("the {name}'s task"), "name": name}});
    let wait = |name: &str| json!({"name": "wait", "arguments": {"names": [name]}});
    json!({
        "replay": true,
        "agents": {
            "top": [
                {"tool_calls": [append("top"), create("mid")]},
                {"tool_calls": [wait("mid")]},
                {"text": "top done"}
            ],
            "mid": [
                {"tool_calls": [append("mid"), create("leaf")]},
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

/// Starts the tree's top with `on_restart: resume`.
fn start_tree(r: &Root, work: &Path, slow_ms: u64) -> PathBuf {
    let log = work.join("side-effects.log");
    let script = write(work, "tree.json", &tree_script(&log, slow_ms));
    let policy = write(work, "resume.json", &json!({"on_restart": "resume"}));
    r.ok(&[
        "spawn",
        "--name",
        "top",
        "--policy",
        &policy,
        "--",
        exe(),
        "agent",
        "--script",
        &script,
    ]);
    log
}

/// What a finished tree shows: each agent's status and result, and the
/// children each has.
fn outcome(r: &Root) -> Vec<(String, String, String, Vec<String>)> {
    ["top", "mid", "leaf"]
        .iter()
        .map(|n| {
            let a = r.show(n);
            let kids = r.json(&["ps", "--json", "--all"]);
            let mut children: Vec<String> = kids
                .as_array()
                .or_else(|| kids["agents"].as_array())
                .unwrap()
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

fn tree_survives_a_sigkill(pg: Option<&brood_store_conformance::pg::Fresh>) {
    let work = tempfile::tempdir().unwrap();

    // The same tree, uninterrupted: what the interrupted one must end with.
    let calm_dir = work.path().join("calm");
    std::fs::create_dir_all(&calm_dir).unwrap();
    let calm_pg = pg.map(|_| brood_store_conformance::pg::Fresh::new());
    let calm = root(&calm_dir, calm_pg.as_ref());
    let d = calm.serve();
    let calm_log = start_tree(&calm, &calm_dir, 300);
    calm.finished("top", Duration::from_secs(60));
    let want = outcome(&calm);
    drop(d);
    assert_eq!(lines(&calm_log), ["top", "mid", "leaf"]);
    assert_eq!(want, three_levels_completed());

    // Killed while the leaf thinks, the top and the middle wait.
    let r = root(work.path(), pg);
    let d = r.serve();
    let log = start_tree(&r, work.path(), 5000);
    let leaf_messages = r.session_file("leaf", "messages.jsonl");
    let caught = eventually(Duration::from_secs(30), || {
        lines(&log).len() == 3
            && lines(&leaf_messages)
                .iter()
                .any(|l| l.contains(r#""role":"tool""#))
    });
    assert!(caught, "the tree never reached its leaf: {}", r.log());
    for n in ["top", "mid", "leaf"] {
        assert_eq!(r.show(n)["status"], "running", "{n}");
    }
    kill9(d);

    let _d = r.serve();
    let top = r.finished("top", Duration::from_secs(60));
    assert_eq!(top["status"], "completed", "{top}\n{}", r.log());
    // The same ending as the uninterrupted tree: the same results, one
    // child each (the resumed parents asked again for theirs by name, or
    // answered their replayed `create` from the record), and every side
    // effect once.
    assert_eq!(outcome(&r), want, "{}", r.log());
    assert_eq!(lines(&log), ["top", "mid", "leaf"], "a tool ran twice");
    for n in ["top", "mid", "leaf"] {
        let runs = r.show(n)["runs"].as_array().unwrap().clone();
        let outcomes: Vec<&str> = runs
            .iter()
            .map(|x| x["outcome"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            runs.len(),
            2,
            "{n}: the run the crash ended, then one resumed: {runs:?}"
        );
        assert!(outcomes[0].contains("runtime_restart"), "{n}: {outcomes:?}");
        // Resumed with its history: the second run's transcript follows
        // the first's in the same session.
        let messages = lines(&r.session_file(n, "messages.jsonl"));
        let first = runs[0]["id"].as_str().unwrap();
        let second = runs[1]["id"].as_str().unwrap();
        let of = |run: &str| messages.iter().filter(|m| m.contains(run)).count();
        assert!(of(first) > 0 && of(second) > 0, "{n}: {messages:?}");
        let events = lines(&r.session_file(n, "events.jsonl"));
        assert!(
            events
                .iter()
                .any(|e| e.contains(r#""type":"agent.resume""#)),
            "{n}: {events:?}"
        );
        // Nothing refused: no NameTaken for a child asked for again.
        assert!(
            !events.iter().any(|e| e.contains("agent.child.refused")),
            "{n}: {events:?}"
        );
    }
}

#[test]
fn a_resumable_tree_survives_a_sigkill_of_its_supervisor_on_sqlite() {
    tree_survives_a_sigkill(None);
}

#[test]
fn a_resumable_tree_survives_a_sigkill_of_its_supervisor_on_postgresql() {
    let db = brood_store_conformance::pg::Fresh::new();
    tree_survives_a_sigkill(Some(&db));
}

/// A tree of test agents that spawn their children at every start: a
/// resumed parent asks again, by name, for the child its first run made,
/// and gets it (no refusal, no second child); a child asking `cancel`
/// under it is cancelled as before and its end told to the resumed parent;
/// a tree with the default policy is cancelled as before.
#[test]
fn a_resumed_parent_gets_its_child_again_and_a_cancel_child_is_ended_and_told() {
    let work = tempfile::tempdir().unwrap();
    let r = root(work.path(), None);
    let d = r.serve();
    let resume = write(work.path(), "resume.json", &json!({"on_restart": "resume"}));
    let again = json!({"name": "again", "argv": agent(&["--hang"]), "await_ready": true});
    let quits = json!({"name": "quits", "argv": agent(&["--hang"]), "policy": {"on_restart": "cancel"}, "await_ready": true});
    let mut top = vec![
        "spawn", "--name", "top", "--ready", "--policy", &resume, "--",
    ];
    let a = agent(&[
        "--spawn",
        &again.to_string(),
        "--spawn",
        &quits.to_string(),
        "--hang",
    ]);
    top.extend(a.iter().map(String::as_str));
    r.ok(&top);
    // Resumable, but its secret's value lived in the dead supervisor only.
    let mut secretive = vec![
        "spawn",
        "--name",
        "secretive",
        "--ready",
        "--policy",
        &resume,
        "--secret",
        "RESTART_TEST_KEY",
        "--",
    ];
    let h = agent(&["--hang"]);
    secretive.extend(h.iter().map(String::as_str));
    let o = r
        .command()
        .env("RESTART_TEST_KEY", "k")
        .args(&secretive)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut plain = vec!["spawn", "--name", "plain", "--ready", "--"];
    let b = agent(&[
        "--spawn",
        &json!({"name": "plain-kid", "argv": agent(&["--hang"])}).to_string(),
        "--hang",
    ]);
    plain.extend(b.iter().map(String::as_str));
    r.ok(&plain);
    assert!(eventually(Duration::from_secs(20), || {
        ["again", "quits", "plain-kid"]
            .iter()
            .all(|n| r.show(n)["status"] == "running")
    }));
    for (n, want) in [
        ("top", "resume"),
        ("again", "resume"),
        ("quits", "cancel"),
        ("plain", "cancel"),
    ] {
        assert_eq!(r.show(n)["on_restart"], want, "{n}");
    }
    kill9(d);

    let _d = r.serve();
    assert!(
        eventually(Duration::from_secs(20), || {
            ["top", "again"]
                .iter()
                .all(|n| r.show(n)["status"] == "running")
        }),
        "{}",
        r.log()
    );
    for n in ["quits", "plain", "plain-kid", "secretive"] {
        let a = r.show(n);
        assert_eq!(
            (a["status"].as_str(), a["reason"].as_str()),
            (Some("cancelled"), Some("runtime_restart")),
            "{n}: {a}"
        );
    }
    // The resumed top asked for `again` once more: it got the one it had.
    let all = r.json(&["ps", "--json", "--all"]);
    let names: Vec<&str> = all
        .as_array()
        .or_else(|| all["agents"].as_array())
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "again").count(),
        1,
        "{names:?}"
    );
    let events = lines(&r.session_file("top", "events.jsonl"));
    assert!(
        !events.iter().any(|e| e.contains("agent.child.refused")),
        "{events:?}"
    );
    assert_eq!(r.show("again")["runs"].as_array().unwrap().len(), 2);
    // The child the restart ended is told to its resumed parent (its log).
    assert!(
        eventually(Duration::from_secs(10), || {
            // Its stderr as written, whatever pieces it was read in.
            let text: String = r
                .ok(&["logs", "top", "--json"])
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|v| v["log"]["text"].as_str().map(str::to_owned))
                .collect();
            text.lines()
                .any(|l| l.contains("child quits") && l.contains("runtime_restart"))
        }),
        "logs: {:?}\nshow: {}\nserve: {}",
        r.ok(&["logs", "top", "--json"]),
        r.show("top"),
        r.log()
    );
    r.ok(&["cancel", "top"]);
}

/// A child may hold `resume` only when its parent does: asked under a
/// parent that is cancelled at a restart, it is refused naming the field,
/// with nothing created.
#[test]
fn a_child_asking_to_resume_under_a_cancel_parent_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let r = root(work.path(), None);
    let _d = r.serve();
    let mut p = vec!["spawn", "--name", "parent", "--ready", "--"];
    let a = agent(&["--hang"]);
    p.extend(a.iter().map(String::as_str));
    r.ok(&p);
    let resume = write(work.path(), "resume.json", &json!({"on_restart": "resume"}));
    let mut c = vec![
        "spawn", "--name", "kid", "--parent", "parent", "--policy", &resume, "--",
    ];
    c.extend(a.iter().map(String::as_str));
    let o = r.brood(&c);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let said = text(&o);
    assert!(said.contains("PolicyExpansion"), "{said}");
    assert!(
        said.contains("on_restart: resume, but the parent's is cancel"),
        "{said}"
    );
    let o = r.brood(&["show", "kid", "--json"]);
    assert_ne!(o.status.code(), Some(0), "nothing created: {}", text(&o));
    // A bad value is refused naming the field too.
    let bad = write(work.path(), "bad.json", &json!({"on_restart": "sometimes"}));
    let mut c = vec!["spawn", "--name", "kid", "--policy", &bad, "--"];
    c.extend(a.iter().map(String::as_str));
    let o = r.brood(&c);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("on_restart"), "{}", text(&o));
    r.ok(&["cancel", "parent"]);
}

fn items(r: &Root, id: &str) -> std::collections::BTreeMap<String, Value> {
    r.json(&["job", "items", id, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["id"].as_str().unwrap().to_owned(), i.clone()))
        .collect()
}

fn completed(r: &Root, id: &str) -> u64 {
    r.json(&["job", "get", id, "--json"])["counts"]["completed"]
        .as_u64()
        .unwrap()
}

/// A job of 200 items whose owner is resumable goes on by itself across two
/// SIGKILLs of its supervisor, and every item is completed and reported
/// exactly once.
#[test]
fn a_job_of_200_items_completes_across_two_restarts_each_item_reported_once() {
    let work = tempfile::tempdir().unwrap();
    let r = root(work.path(), None);
    let d = r.serve();
    let resume = write(work.path(), "resume.json", &json!({"on_restart": "resume"}));
    let mut spawn = vec![
        "spawn", "--name", "owner", "--ready", "--policy", &resume, "--",
    ];
    let a = agent(&["--hang"]);
    spawn.extend(a.iter().map(String::as_str));
    r.ok(&spawn);
    let mut csv = String::from("id,text\n");
    for i in 0..200 {
        csv.push_str(&format!("k{i},row {i}\n"));
    }
    let input = work.path().join("rows.csv");
    std::fs::write(&input, &csv).unwrap();
    let argv = json!([exe(), "test-agent", "--job-worker", "--item-delay", "40"]).to_string();
    r.ok(&[
        "job",
        "create",
        "--owner",
        "owner",
        "--id",
        "big",
        "--instruction",
        "Echo {text}",
        "--input",
        input.to_str().unwrap(),
        "--id-column",
        "id",
        "--concurrency",
        "4",
        "--worker-argv",
        &argv,
    ]);
    r.ok(&["job", "start", "big"]);

    let mut d = Some(d);
    for at_least in [40, 110] {
        assert!(
            eventually(Duration::from_secs(60), || completed(&r, "big") >= at_least),
            "{}",
            r.log()
        );
        kill9(d.take().unwrap());
        d = Some(r.serve());
    }
    // Nobody resumes the owner by hand: the job goes on by itself.
    let mut job = Value::Null;
    let done = eventually(Duration::from_secs(120), || {
        job = r.json(&["job", "get", "big", "--json"]);
        job["status"] != "running"
    });
    assert!(done, "the job never ended: {job}\n{}", r.log());
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["counts"]["completed"], 200, "{job}");
    let after = items(&r, "big");
    assert_eq!(after.len(), 200);
    let mut restarted = 0;
    for (k, i) in &after {
        assert_eq!(i["status"], "completed", "{k}: {i}");
        assert_eq!(
            i["result"],
            json!({"echo": format!("Echo {}", i["input"]["text"].as_str().unwrap())})
        );
        if i["attempts"].as_u64().unwrap() > 1 {
            restarted += 1;
        }
    }
    assert!(restarted > 0, "some items were running at a kill");
    // Reported exactly once: one `job.item.completed` per item, whatever
    // the restarts did.
    // The ctx tree's log is written after the store, off the loop: read
    // once it holds the job's end.
    let log = r.session_file("owner", "events.jsonl");
    assert!(eventually(Duration::from_secs(10), || {
        lines(&log)
            .iter()
            .any(|e| e.contains(r#""type":"job.completed""#))
    }));
    let events = lines(&log);
    let mut per_item: std::collections::BTreeMap<String, u32> = Default::default();
    for e in &events {
        let v: Value = serde_json::from_str(e).unwrap();
        // Only the restarts failed an attempt (none was refused for an
        // owner not started yet, say).
        if v["type"] == "job.item.failed" {
            assert_eq!(v["error"], "runtime_restart", "{v}");
        }
        if v["type"] == "job.item.completed" {
            *per_item
                .entry(v["item"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    assert_eq!(per_item.len(), 200, "{per_item:?}");
    assert!(per_item.values().all(|n| *n == 1), "{per_item:?}");
    assert_eq!(r.show("owner")["runs"].as_array().unwrap().len(), 3);
    // Its workers were not resumed: each had one run; the items they held
    // went to new workers.
    let all = r.json(&["ps", "--json", "--all"]);
    let workers: Vec<String> = all
        .as_array()
        .or_else(|| all["agents"].as_array())
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .filter(|n| n.starts_with("big-w"))
        .map(str::to_owned)
        .collect();
    assert!(!workers.is_empty());
    for w in &workers {
        assert_eq!(r.show(w)["runs"].as_array().unwrap().len(), 1, "{w}");
    }
    drop(d);
}
