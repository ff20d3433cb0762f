//! Issue 25 item 4, "one root, many clients", with the real binary on real
//! roots: finished trees are removed (`brood rm`, `brood prune`) with every
//! record and file of theirs, their names free again, through the daemon
//! that serves the root and without one; a tree with a live agent is
//! refused naming it; an agent never removes another tree (the attack,
//! through the API from inside its sandbox); jobs are removed (`brood job
//! rm`); a `job run` that could not start leaves nothing behind; and `job
//! run` gives the default workers (`brood agent`) their configuration.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// SHA-256 of `hello`: the blob of the kid's artifact.
const HELLO_SHA: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `brood run --name NAME` of a root that spawns `NAME-kid`, which hands
/// back an artifact (`hello`), and waits for it.
fn run_tree(root: &Path, name: &str) -> std::process::Output {
    let kid = json!({
        "name": format!("{name}-kid"),
        "argv": agent(&["--artifact", "a.txt=hello", "--result", "kid done"]),
        "task": "hand back a file",
    })
    .to_string();
    let mut args = vec!["run", "--name", name, "--"];
    let a = agent(&["--spawn", &kid, "--wait", "--result", "done"]);
    args.extend(a.iter().map(String::as_str));
    brood(root, &args)
}

fn uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Every path of the ctx tree and the blob store that stands for `name`'s
/// tree (root `name`, child `name-kid`).
fn files_of(root: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let home = root.join(format!("ctx/home/{}/agent", uid()));
    vec![
        root.join(format!("ctx/agent/{name}.d")),
        root.join(format!("ctx/agent/{name}")),
        root.join(format!("ctx/agent/{name}-kid.d")),
        root.join(format!("ctx/agent/{name}-kid")),
        home.join(name),
        home.join(format!("{name}-kid")),
    ]
}

/// What the store holds of agent `n`: its record, runs and events.
fn stored(root: &Path, n: &str) -> (bool, usize, usize) {
    let store = brood_store::open(&root.join("brood.db").to_string_lossy()).unwrap();
    let t = brood_core::TenantId::for_uid(uid());
    let name = brood_core::AgentName::new(n).unwrap();
    (
        store.agent(&t, &name).unwrap().is_some(),
        store.runs(&t, &name).unwrap().len(),
        store.events(&t, 0, Some(&name), 1000).unwrap().len(),
    )
}

#[test]
fn without_a_daemon_a_finished_tree_goes_whole_and_its_names_are_free() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A root with nothing yet: nothing to remove, and nothing made.
    let fresh = root.join("fresh");
    let o = brood(&fresh, &["rm", "x"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(err(&o).contains("no agent named x"), "{}", text(&o));
    let o = brood(&fresh, &["prune", "--older-than", "1d"]);
    assert_eq!(out(&o), "0 trees removed\n", "{}", text(&o));
    assert!(!fresh.join("brood.db").exists());
    let o = run_tree(root, "t");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["run", "--name", "keep", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for p in files_of(root, "t") {
        assert!(p.exists(), "{} before the removal", p.display());
    }
    let blob = root.join("blobs/sha256").join(HELLO_SHA);
    assert!(blob.exists(), "the kid's artifact is in the blob store");
    assert!(stored(root, "t-kid").0);

    // A child is not a tree: its root is named; an unknown name is named.
    let o = brood(root, &["rm", "t-kid"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        err(&o).contains("tree of t") && err(&o).contains("brood rm t"),
        "{}",
        text(&o)
    );
    let o = brood(root, &["rm", "nosuch"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(err(&o).contains("no agent named nosuch"), "{}", text(&o));
    assert!(!err(&o).contains("AgentName"), "{}", text(&o));

    let o = brood(root, &["rm", "t"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        out(&o).starts_with("removed t (2 agents, last ended "),
        "{}",
        text(&o)
    );
    for p in files_of(root, "t") {
        assert!(!p.exists(), "{} is left", p.display());
    }
    assert!(!blob.exists(), "the blob only the tree named is gone");
    for n in ["t", "t-kid"] {
        assert_eq!(stored(root, n), (false, 0, 0), "{n} is left in the store");
    }
    let o = brood(root, &["show", "t"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = brood(root, &["ps", "-a"]);
    assert!(
        out(&o).contains("keep") && !out(&o).contains("t-kid"),
        "{}",
        text(&o)
    );
    let o = brood(root, &["events"]);
    assert!(!out(&o).contains("\"t-kid\""), "{}", text(&o));
    // The other tree is untouched.
    assert!(stored(root, "keep").0);
    assert!(root.join("ctx/agent/keep.d/status").exists());
    // The name is free again: the same command runs as it did.
    let o = run_tree(root, "t");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(blob.exists());
    // Several at once; fsck finds nothing of them left.
    let o = brood(root, &["rm", "t", "keep", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines: Vec<Value> = out(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", text(&o));
    assert_eq!(
        (lines[0]["root"].clone(), lines[0]["agents"].clone()),
        (json!("t"), json!(2))
    );
    let o = brood(root, &["fsck", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let f: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(
        (f["agents"].clone(), f["unrecorded_removed"].clone()),
        (json!(0), json!(0)),
        "{f}"
    );
}

/// A crash between a removal's commit and its files: the records are gone,
/// the files stay; `brood fsck` removes them, and nothing of a tree that
/// still has its records.
#[test]
fn fsck_removes_what_a_removal_that_stopped_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for n in ["gone", "kept"] {
        let o = run_tree(root, n);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    // The store's half of a removal, as the CLI's would do it, and no more.
    let store = brood_store::open(&root.join("brood.db").to_string_lossy()).unwrap();
    let t = brood_core::TenantId::for_uid(uid());
    let removed = store
        .remove_tree(&t, &brood_core::AgentName::new("gone").unwrap())
        .unwrap();
    assert_eq!(removed.agents.len(), 2);
    drop(store);
    for p in files_of(root, "gone") {
        assert!(p.exists(), "{}", p.display());
    }
    let o = brood(root, &["fsck", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let f: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(f["unrecorded_removed"], json!(6), "{f}");
    for p in files_of(root, "gone") {
        assert!(!p.exists(), "{} is left", p.display());
    }
    for p in files_of(root, "kept") {
        assert!(p.exists(), "{} was removed", p.display());
    }
    let o = brood(root, &["fsck"]);
    assert!(!out(&o).contains("no longer holds"), "{}", text(&o));
}

/// An exec agent of its own tree running `script` in `sh`: its stdout once
/// it ended.
fn run_sh(sock: &Path, name: &str, script: &str) -> String {
    let (c, v) = http(
        sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": name, "argv": ["sh", "-c", script], "protocol": "exec"})),
    );
    assert_eq!(c, 201, "{v}");
    let (_, w) = http(
        sock,
        "POST",
        &format!("/api/agents/{name}/wait"),
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    w["agents"][0]["result"].as_str().unwrap().to_owned()
}

/// `curl` on the agent's own `$BROOD_SOCKET`: the body, then the status.
fn curl(method: &str, path: &str, body: &Value) -> String {
    format!(
        "curl -s -w ' %{{http_code}}' --unix-socket \"$BROOD_SOCKET\" -X {method} \
         -H 'Content-Type: application/json' --data '{body}' http://brood{path}"
    )
}

#[test]
fn a_served_root_removes_through_its_daemon_and_an_agent_removes_no_other_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let _d = serve_daemon(root, None);
    let sock = root.join("brood.sock");
    // A tree with live agents is refused, naming one and its status.
    let kid =
        json!({"name": "busy-kid", "argv": agent(&["--hang"]), "await_ready": true}).to_string();
    let mut args = vec!["spawn", "--name", "busy", "--ready", "--"];
    let a = agent(&["--spawn", &kid, "--hang"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(root, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(eventually(Duration::from_secs(10), || {
        http(&sock, "GET", "/api/agents/busy-kid", None).1["status"] == "running"
    }));
    let o = brood(root, &["rm", "busy"]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(err(&o).contains("agent busy is running"), "{}", text(&o));
    assert_eq!(http(&sock, "GET", "/api/agents/busy-kid", None).0, 200);

    // A finished tree, run through the daemon, goes through the daemon.
    let o = run_tree(root, "done");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let blob = root.join("blobs/sha256").join(HELLO_SHA);
    assert!(blob.exists());

    // The attack: an agent of another tree asks the API to remove the
    // finished tree, and to prune; both refused, the tree still there.
    let said = run_sh(
        &sock,
        "evil",
        &curl("DELETE", "/api/agents/done", &json!({})),
    );
    assert!(said.ends_with(" 403"), "{said}");
    assert!(said.contains("operator"), "{said}");
    let said = run_sh(
        &sock,
        "evil2",
        &curl("POST", "/api/prune", &json!({"older_than_s": 0})),
    );
    assert!(said.ends_with(" 403"), "{said}");
    assert_eq!(http(&sock, "GET", "/api/agents/done", None).0, 200);
    assert_eq!(http(&sock, "GET", "/api/agents/done-kid", None).0, 200);
    assert!(blob.exists());

    let o = brood(root, &["rm", "done"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        out(&o).starts_with("removed done (2 agents"),
        "{}",
        text(&o)
    );
    for p in files_of(root, "done") {
        assert!(!p.exists(), "{} is left", p.display());
    }
    assert!(!blob.exists());
    assert_eq!(http(&sock, "GET", "/api/agents/done", None).0, 404);
    // Free again, through the daemon too.
    let o = run_tree(root, "done");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Prune: a dry run lists the finished trees (not the live one) and
    // removes nothing; an age no tree has reached removes none.
    let o = brood(root, &["prune", "--older-than", "0s", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let listed = out(&o);
    for n in ["done", "evil", "evil2"] {
        assert!(
            listed.contains(&format!("would remove {n} (")),
            "{n}: {listed}"
        );
    }
    assert!(!listed.contains("busy"), "{listed}");
    assert!(
        listed.ends_with("3 trees would be removed (a dry run: nothing was)\n"),
        "{listed}"
    );
    assert_eq!(http(&sock, "GET", "/api/agents/done", None).0, 200);
    let o = brood(root, &["prune", "--older-than", "1h"]);
    assert_eq!(out(&o), "0 trees removed\n", "{}", text(&o));
    let o = brood(root, &["prune", "--older-than", "7"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(err(&o).contains("\"7\" is not a duration"), "{}", text(&o));
    // Ended, the busy tree goes with the rest.
    let o = brood(root, &["cancel", "busy"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["wait", "busy"]);
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    let o = brood(root, &["prune", "--older-than", "0s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out(&o).ends_with("4 trees removed\n"), "{}", text(&o));
    let (_, l) = http(&sock, "GET", "/api/agents?all=true", None);
    assert_eq!(l["agents"], json!([]), "{l}");
}

fn write(dir: &Path, file: &str, text: &str) -> String {
    let p = dir.join(file);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// `brood job run` of job `id` on `owner`'s rows of `input`, with `extra`.
fn job_run(root: &Path, id: &str, input: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "job",
        "run",
        "--owner",
        "owner",
        "--id",
        id,
        "--instruction",
        "say {text}",
        "--input",
        input,
    ];
    args.extend(extra);
    brood(root, &args)
}

#[test]
fn jobs_are_removed_and_a_job_run_that_did_not_start_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let _d = serve_daemon(root, None);
    let sock = root.join("brood.sock");
    let input = write(root, "in.csv", "id,text\na,hello\nb,world\n");
    let worker = json!(agent(&["--job-worker"])).to_string();
    // The owner exists but does not run: the job cannot start.
    let mut args = vec!["spawn", "--name", "owner", "--ready", "--"];
    let a = agent(&["--hang"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(root, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["cancel", "owner"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    brood(root, &["wait", "owner"]);
    let o = job_run(root, "j", &input, &["--worker-argv", &worker]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(err(&o).contains("not running"), "{}", text(&o));
    // Nothing of it is left: no job, and its id is free.
    let o = brood(root, &["job", "get", "j"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = brood(root, &["job", "list"]);
    assert_eq!(out(&o), "", "{}", text(&o));
    // Fixed (the owner runs again), the same command runs at once.
    let o = brood(root, &["resume", "owner"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = job_run(root, "j", &input, &["--worker-argv", &worker]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A finished job goes with its items, attempts and workers (once they
    // ended: told there is no next item, they end on their own).
    assert_eq!(http(&sock, "GET", "/api/agents/j-w1", None).0, 200);
    let mut last = None;
    let ended = eventually(Duration::from_secs(20), || {
        let o = brood(root, &["job", "rm", "j"]);
        let done = o.status.code() != Some(5);
        last = Some(o);
        done
    });
    let o = last.unwrap();
    assert!(ended, "{}", text(&o));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        out(&o).starts_with("removed job j (completed, "),
        "{}",
        text(&o)
    );
    let o = brood(root, &["job", "get", "j"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert_eq!(http(&sock, "GET", "/api/agents/j-w1", None).0, 404);
    assert!(!root.join("ctx/agent/j-w1.d").exists());
    // The owner stays, without its channels to the workers.
    let owner_channels = root.join(format!(
        "ctx/home/{}/agent/owner/session/default/context/child",
        uid()
    ));
    let left: Vec<_> = std::fs::read_dir(&owner_channels)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        http(&sock, "GET", "/api/agents/owner", None).1["status"],
        "running"
    );
    let (_, ev) = http(&sock, "GET", "/api/events?agent=owner&follow=false", None);
    assert!(ev.to_string().contains("job.removed"), "{ev}");

    // A running job is refused, naming its status; so is an agent of
    // another tree (the attack); cancelled and its workers ended, it goes.
    let hang = json!(agent(&["--hang"])).to_string();
    let o = brood(
        root,
        &[
            "job",
            "create",
            "--owner",
            "owner",
            "--id",
            "slow",
            "--instruction",
            "x {text}",
            "--input",
            &input,
            "--worker-argv",
            &hang,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["job", "start", "slow"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["job", "rm", "slow"]);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(err(&o).contains("job slow is running"), "{}", text(&o));
    let said = run_sh(&sock, "evil", &curl("DELETE", "/api/jobs/slow", &json!({})));
    assert!(said.ends_with(" 403"), "{said}");
    let o = brood(root, &["job", "cancel", "slow"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut last = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            let o = brood(root, &["job", "rm", "slow"]);
            last = text(&o);
            o.status.code() == Some(0)
        }),
        "{last}"
    );
    for w in ["slow-w1", "slow-w2"] {
        assert_eq!(
            http(&sock, "GET", &format!("/api/agents/{w}"), None).0,
            404,
            "{w}"
        );
    }
}

/// `brood` in `dir` (relative paths are the caller's), on `root`.
fn brood_at(dir: &Path, root: &Path, args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(args)
        .current_dir(dir)
        .env_remove("BROOD_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn job_run_gives_the_default_workers_their_agent_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    // The reference agent's script provider: each worker answers with JSON.
    let script = write(
        dir.path(),
        "turns.json",
        &json!({"turns": [{"text": "{\"answer\": 42}", "usage": {"input": 3, "output": 2}}]})
            .to_string(),
    );
    write(
        dir.path(),
        "worker.toml",
        &format!("provider = \"script\"\nscript = \"{script}\"\nmodel = \"scripted\"\n"),
    );
    let input = write(dir.path(), "in.csv", "id,text\na,hello\nb,world\n");
    let mut args = vec!["spawn", "--name", "owner", "--ready", "--"];
    let a = agent(&["--hang"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(&root, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // A file that is not there is refused before anything is made.
    let o = brood_at(
        dir.path(),
        &root,
        &[
            "job",
            "run",
            "--owner",
            "owner",
            "--id",
            "cfg",
            "--instruction",
            "say {text}",
            "--input",
            &input,
            "--worker-config",
            "missing.toml",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(err(&o).contains("missing.toml"), "{}", text(&o));
    // Given relative to the caller's directory, as every path of the CLI.
    let o = brood_at(
        dir.path(),
        &root,
        &[
            "job",
            "run",
            "--owner",
            "owner",
            "--id",
            "cfg",
            "--instruction",
            "say {text}",
            "--input",
            &input,
            "--worker-config",
            "worker.toml",
            "--max-attempts",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(&root, &["job", "items", "cfg", "--json"]);
    let items: Value = serde_json::from_str(&out(&o)).unwrap();
    let results: Vec<&Value> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["result"])
        .collect();
    assert_eq!(
        results,
        [&json!({"answer": 42}), &json!({"answer": 42})],
        "{items}"
    );
    // The job says what its workers were given, and the worker ran with it:
    // its command line names the file, and its transcript is the script's.
    let o = brood(&root, &["job", "get", "cfg", "--json"]);
    let j: Value = serde_json::from_str(&out(&o)).unwrap();
    let config = dir.path().join("worker.toml").display().to_string();
    assert_eq!(j["spec"]["worker"]["config"], json!(config), "{j}");
    let db = rusqlite::Connection::open(root.join("brood.db")).unwrap();
    let spec: String = db
        .query_row("SELECT spec FROM agents WHERE name = 'cfg-w1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let argv: Vec<String> =
        serde_json::from_value(serde_json::from_str::<Value>(&spec).unwrap()["argv"].clone())
            .unwrap();
    assert_eq!(
        &argv[1..],
        ["agent", "--job-worker", "--config", config.as_str()],
        "{argv:?}"
    );
    let (_, d) = http(&root.join("brood.sock"), "GET", "/api/agents/cfg-w1", None);
    assert_eq!(
        d["tokens_in"],
        json!(3),
        "the script's usage was reported: {d}"
    );
}
