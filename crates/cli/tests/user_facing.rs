//! Issue 25 item 5 with the real binary on real roots: errors name things as
//! the user wrote them (`no agent named nosuch`, never a Rust debug form),
//! one status rendering on every verb (`cancel` says `cancelled (user)` as
//! `ps` does), `brood events NAME` of no agent fails naming it, and `brood
//! ps` after its daemon was SIGKILLed says the supervisor is gone instead
//! of showing a dead pid running.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `brood ARGS` on `root` must fail with `code` and exactly `stderr`.
fn fails(root: &Path, args: &[&str], code: i32, stderr: &str) {
    let o = brood(root, args);
    assert_eq!(o.status.code(), Some(code), "brood {args:?}: {}", text(&o));
    assert_eq!(err(&o), stderr, "brood {args:?}");
}

/// The line of `brood ps` (and `-a`) for `name`, split into its columns.
fn ps_row(root: &Path, all: bool, name: &str) -> Vec<String> {
    let o = brood(root, if all { &["ps", "-a"] } else { &["ps"] });
    assert!(o.status.success(), "{}", text(&o));
    out(&o)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in brood ps:\n{}", out(&o)))
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn errors_say_names_as_written_and_statuses_read_the_same_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let daemon = serve_daemon(root, None);
    let nosuch = "brood: no agent named nosuch\n";
    for verb in [
        &["show", "nosuch"][..],
        &["cancel", "nosuch"],
        &["close", "nosuch"],
        &["resume", "nosuch"],
        &["wait", "nosuch"],
        &["send", "nosuch", "hi"],
        &["logs", "nosuch"],
        &["tree", "nosuch"],
        &["events", "nosuch"],
    ] {
        fails(root, verb, 4, nosuch);
    }
    fails(root, &["job", "get", "nosuch"], 4, "brood: no job nosuch\n");
    let o = brood(
        root,
        &[
            "spawn",
            "--name",
            "h",
            "--ready",
            "--",
            exe(),
            "test-agent",
            "--hang",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    // spawn: `name status run`, the status as ps prints it.
    let line = out(&o);
    let cols: Vec<&str> = line.trim_end().split('\t').collect();
    assert_eq!(cols[..2], ["h", "running"], "{line}");
    assert_eq!(ps_row(root, false, "h")[2], "running");
    fails(
        root,
        &["job", "items", "nosuch"],
        4,
        "brood: no job nosuch\n",
    );
    // The job routes name the item as it was written too.
    let rows = root.join("rows.csv");
    std::fs::write(&rows, "id,x\na,1\n").unwrap();
    let worker = serde_json::to_string(&agent(&["--hang"])).unwrap();
    let o = brood(
        root,
        &[
            "job",
            "create",
            "--owner",
            "h",
            "--id",
            "j",
            "--instruction",
            "do {x}",
            "--input",
            rows.to_str().unwrap(),
            "--id-column",
            "id",
            "--worker-argv",
            &worker,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = brood(root, &["job", "start", "j"]);
    assert!(o.status.success(), "{}", text(&o));
    fails(
        root,
        &["job", "retry", "j", "zz"],
        4,
        "brood: job j has no item zz\n",
    );
    // cancel: the final status, as every other verb says it.
    let o = brood(root, &["cancel", "h"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(out(&o), "h\tcancelled (user)\n");
    let o = brood(root, &["wait", "h"]);
    assert_eq!(out(&o), "h\tcancelled (user)\n", "{}", text(&o));
    assert_eq!(ps_row(root, true, "h")[2], "cancelled (user)");
    let o = brood(root, &["tree", "h"]);
    assert!(out(&o).starts_with("h  cancelled (user)"), "{}", text(&o));

    let o = brood(root, &["show", "h"]);
    assert!(
        out(&o).lines().any(|l| l == "status      cancelled (user)"),
        "{}",
        text(&o)
    );
    let o = brood(root, &["close", "h"]);
    assert_eq!(out(&o), "h\tclosed (user)\n", "{}", text(&o));
    // An agent's events exist; a filter naming none is an error, not silence.
    let o = brood(root, &["events", "h"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out(&o).contains("\"agent\":\"h\""), "{}", text(&o));
    drop(daemon);
    // Read from the store, with no daemon, the same words.
    fails(root, &["show", "nosuch"], 4, nosuch);
    fails(root, &["events", "nosuch"], 4, nosuch);
    fails(root, &["logs", "nosuch"], 4, nosuch);
    assert_eq!(ps_row(root, true, "h")[2], "closed (user)");
}

#[test]
fn ps_says_when_an_agents_supervisor_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut daemon = serve_daemon(root, None);
    let o = brood(
        root,
        &[
            "spawn",
            "--name",
            "h",
            "--ready",
            "--",
            exe(),
            "test-agent",
            "--hang",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let row = ps_row(root, false, "h");
    assert_eq!(row[2], "running", "{row:?}");
    let pid: i32 = row[3].parse().unwrap();
    // The daemon dies at once, recording nothing.
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGKILL) };
    daemon.0.wait().unwrap();
    // Its agents die with it (their PID namespace's init was its child).
    assert!(
        eventually(Duration::from_secs(5), || !Path::new(&format!(
            "/proc/{pid}"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))),
        "the agent {pid} outlived its supervisor"
    );
    // The store still says running: ps says whose word that is.
    let row = ps_row(root, false, "h");
    assert_eq!(row[2], "running (supervisor gone)", "{row:?}");
    assert_eq!(row[3], "-", "a dead pid is not shown: {row:?}");
    let o = brood(root, &["ps", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["supervisor_gone"], true, "{v}");
    assert_eq!(v[0]["pid"], Value::Null, "{v}");
    let o = brood(root, &["tree"]);
    assert_eq!(out(&o), "h  running (supervisor gone)\n", "{}", text(&o));
    let o = brood(root, &["show", "h"]);
    assert!(
        out(&o)
            .lines()
            .any(|l| l == "status      running (supervisor gone)"),
        "{}",
        text(&o)
    );
    // The next supervisor ends it, and the words say so.
    let daemon = serve_daemon(root, None);
    assert!(eventually(Duration::from_secs(10), || {
        let o = brood(root, &["ps", "-a"]);
        out(&o).contains("cancelled (runtime_restart)")
    }));
    assert!(!out(&brood(root, &["ps", "-a"])).contains("supervisor gone"));
    drop(daemon);
}
