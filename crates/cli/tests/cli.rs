//! The command line end to end: `brood run`, `brood serve` and every verb against
//! it, `brood spawn` from inside an agent (caller identified by its cgroup), exit
//! codes, `doctor`.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

#[test]
fn brood_run_prints_the_result_and_exits_like_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["run", "--name", "hello", "--"];
    let a = agent(&["--result", "hello world"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello world\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("hello  completed"),
        "{}",
        text(&o)
    );

    let o = brood(
        dir.path(),
        &["run", "--protocol", "exec", "--", "sh", "-c", "echo hi"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");

    let mut args = vec!["run", "--"];
    let a = agent(&["--error", "nope"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(dir.path(), &args);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = brood(dir.path(), &["run", "--name", "../x", "--", "true"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("InvalidName"),
        "{}",
        text(&o)
    );

    let o = brood(dir.path(), &["ps", "-a", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(names.contains(&"hello"));
    assert!(!names.contains(&"../x"));
}

#[test]
fn the_daemon_carries_every_verb() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    #[allow(clippy::disallowed_methods)]
    let d = Daemon(
        Command::new(exe())
            .arg("--root")
            .arg(root)
            .args(["serve", "--grace", "0.5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(eventually(Duration::from_secs(10), || root
        .join("brood.sock")
        .exists()));
    let b = |args: &[&str]| brood(root, args);

    let mut args = vec!["spawn", "--name", "a", "--ready", "--"];
    let hang = agent(&["--message", "hi", "--hang"]);
    args.extend(hang.iter().map(String::as_str));
    let o = b(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("a\trunning"),
        "{}",
        text(&o)
    );

    // An exec agent that calls `brood spawn` from inside: its parent is decided
    // by its cgroup, and it cannot name another parent.
    let inner = agent(&["--result", "from-inside"]).join(" ");
    let script = format!(
        "brood spawn --name inner -- {inner} >/dev/null && brood wait inner >/dev/null; \
         brood spawn --parent a --name evil -- {inner}; echo \"evil exit $?\""
    );
    let o = b(&[
        "spawn",
        "--name",
        "b",
        "--protocol",
        "exec",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["wait", "b", "--timeout", "20"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["show", "b", "--json"]);
    let bj: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        bj["result"].as_str().unwrap_or("").contains("evil exit 3"),
        "{bj}"
    );
    let o = b(&["show", "inner", "--json"]);
    let ij: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        ij["parent"], "b",
        "inner's parent comes from its caller's cgroup: {ij}"
    );
    assert_eq!(ij["status"], "completed");
    let o = b(&["show", "evil"]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "evil was never created: {}",
        text(&o)
    );

    let o = b(&["wait", "a", "--timeout", "0.2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = b(&["send", "a", "hello there"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["send", "nobody", "x"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = b(&["ps"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("a "),
        "{}",
        text(&o)
    );
    let o = b(&["cancel", "a"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["wait", "a"]);
    assert_eq!(o.status.code(), Some(130), "{}", text(&o));
    let o = b(&["close", "a"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["show", "a"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("closed") && s.contains("cgroup"), "{s}");
    let o = b(&["resume", "a", "back again"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["cancel", "a"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = b(&["tree", "--json"]);
    let t: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        t.as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "b" && t["children"][0]["name"] == "inner"),
        "{t}"
    );
    let o = b(&["events", "a"]);
    let ev: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(ev.iter().any(|e| e["type"] == "agent.input"), "{ev:?}");
    let seqs: Vec<i64> = ev.iter().map(|e| e["sequence"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "sequence is monotonic: {seqs:?}"
    );
    drop(d);
    assert!(
        !root.join("brood.sock").exists(),
        "the daemon removed its socket"
    );
}

#[test]
fn doctor_names_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let o = brood(dir.path(), &["doctor", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let layers: Vec<&str> = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["layer"].as_str())
        .collect();
    for l in [
        "cgroup",
        "kill",
        "landlock",
        "user namespace",
        "mount namespace",
        "pid namespace",
        "network namespace",
        "seccomp",
    ] {
        assert!(layers.contains(&l), "{l} missing: {v}");
    }
    let kill = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "kill")
        .unwrap();
    assert_eq!(
        kill["available"], true,
        "this host kills with cgroup.kill: {kill}"
    );
    // Run as root here, so brood's machinery is covered in every agent's
    // mount namespace, and doctor says what is covered.
    let veil = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "veil")
        .unwrap_or_else(|| panic!("no veil layer: {v}"));
    assert_eq!(veil["available"], true, "{veil}");
    let detail = veil["detail"].as_str().unwrap();
    assert!(
        detail.contains("/sys/fs/cgroup") && detail.contains(&dir.path().display().to_string()),
        "{veil}"
    );
    assert!(
        v["enforced"].as_array().unwrap().iter().any(|e| e
            .as_str()
            .unwrap_or("")
            .starts_with("brood's machinery out of reach")),
        "{v}"
    );
}

#[test]
fn a_policy_file_in_toml_is_read_and_enforced_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "tools = [\"file_read\"]\nnetwork = \"none\"\n[[files]]\npath = \"/\"\nmode = \"ro\"\n",
    )
    .unwrap();
    // Beside brood's root, not in it: the root is out of every agent's reach
    // whatever its policy (the veil), and this test is about the policy file.
    let elsewhere = tempfile::tempdir().unwrap();
    let secret = elsewhere.path().join("new-file");
    let probe = secret.to_string_lossy().into_owned();
    let mut args = vec![
        "run",
        "--name",
        "tomled",
        "--policy",
        policy.to_str().unwrap(),
        "--",
    ];
    let a = agent(&["--probe-write", &probe, "--result", "ran"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(dir.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("write {probe}: denied")),
        "{}",
        text(&o)
    );
    assert!(!secret.exists());
    let o = brood(dir.path(), &["show", "tomled"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("network") && s.contains("none") && s.contains("allow_weaker_sandbox false"),
        "{s}"
    );
    // A malformed policy file is refused naming the field.
    std::fs::write(&policy, "tools = \"not a list\"\n").unwrap();
    let o = brood(
        dir.path(),
        &["run", "--policy", policy.to_str().unwrap(), "--", "true"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("tools"),
        "{}",
        text(&o)
    );
}

/// `brood quota` works on the store `--store` names, not on `$BROOD_ROOT`'s.
#[test]
fn quota_set_and_show_use_the_store_given_by_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let db = dir.path().join("elsewhere/shared.db");
    let db_arg = db.display().to_string();
    let o = brood(
        &root,
        &[
            "--store",
            &db_arg,
            "quota",
            "set",
            "user-0",
            "max_fanout",
            "5",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(db.exists(), "the store named by --store was not written");
    assert!(
        !root.join("brood.db").exists(),
        "the root's store was written"
    );
    let shown = |args: &[&str]| -> serde_json::Value {
        let o = brood(&root, args);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "max_fanout")
            .unwrap()["tenant"]
            .clone()
    };
    let with = shown(&["--store", &db_arg, "quota", "show", "user-0", "--json"]);
    assert_eq!(with, 5);
    let without = shown(&["quota", "show", "user-0", "--json"]);
    assert_eq!(without, serde_json::Value::Null);
    // The tenant's model rate limits of the configuration are shown too.
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("config.toml"),
        "[quotas.models]\nrequests_per_minute = 30\n",
    )
    .unwrap();
    let o = brood(&root, &["quota", "show", "user-0", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["models"],
        serde_json::json!({"requests_per_minute": 30, "tokens_per_minute": null})
    );
    let o = brood(&root, &["quota", "show", "user-0"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("(quotas.models): requests 30, tokens none"),
        "{}",
        text(&o)
    );
}

/// A newcomer's first commands (issue 12 item 8): any program runs as a plain
/// program unless it is brood's own agent or `--protocol brood` is asked for;
/// log lines carry no colour codes when stderr is not a terminal; the help
/// speaks of nothing a user does not have (no "SPEC n").
#[test]
fn a_newcomers_first_commands_work() {
    let dir = tempfile::tempdir().unwrap();
    let o = brood(dir.path(), &["run", "--", "sh", "-c", "echo hi"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
    // brood's own agent is still spoken to in its protocol.
    let mut args = vec!["run", "--"];
    let a = agent(&["--result", "spoken"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(dir.path(), &args);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "spoken\n",
        "{}",
        text(&o)
    );
    // Asked for, the protocol is used, and its failure is logged plainly.
    let o = brood(
        dir.path(),
        &["run", "--protocol", "brood", "--", "sh", "-c", "echo hi"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("protocol error"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
    let o = brood(dir.path(), &["run", "--protocol", "json", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exec, brood or auto"), "{}", text(&o));
    // A word brood does not know is refused, never taken for the default.
    let o = brood(dir.path(), &["run", "--iso", "nss", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--iso must be ns or none"),
        "{}",
        text(&o)
    );
    for cmd in [
        &["--help"][..],
        &["run", "--help"],
        &["spawn", "--help"],
        &["serve", "--help"],
        &["quota", "--help"],
        &["bench", "--help"],
    ] {
        let o = brood(dir.path(), cmd);
        assert!(o.status.success(), "{cmd:?}: {}", text(&o));
        assert!(!text(&o).contains("SPEC"), "{cmd:?}: {}", text(&o));
    }
}

/// brood's main job, as the README runs it: the demo ends well, counts the
/// lines of its files (outside brood's root, which agents cannot see) and
/// shows the killed tree cancelled.
#[test]
fn the_demo_runs_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let o = brood(dir.path(), &["demo"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out.contains("completed  → 492 lines in"), "{out}");
    assert!(out.contains("--- artifact/lines.txt"), "{out}");
    assert!(
        out.contains(
            "after the SIGKILL: 6 of 6 descendants cancelled (parent_dead), 0 of 7 processes left"
        ),
        "{out}"
    );
    assert!(!out.contains("cannot read"), "{out}");
    // Part 3: the model-driven tree, its refusal and its real work, priced.
    assert!(out.contains("lead  completed  spent $"), "{out}");
    assert!(
        out.contains("├── scout  completed") && out.contains("└── writer  completed"),
        "{out}"
    );
    assert!(out.contains("create refused: ToolExpansion"), "{out}");
    assert!(out.contains(" 245 total"), "{out}");
    // Part 4: a job with retries, one item failing every attempt, the
    // results exported and the evidence verified (and verifiable again).
    assert!(out.contains("failed: 23 completed, 1 failed"), "{out}");
    assert!(
        out.contains("item c20 failed after 2 attempts")
            && out.contains("23 items completed (3 after a retry)"),
        "{out}"
    );
    let ev = dir.path().join("cities-evidence");
    let o = brood(dir.path(), &["job", "verify", ev.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.path().join("cities.csv")).unwrap();
    assert_eq!(csv.lines().count(), 25, "{csv}");
}
