//! `brood bench memory` (issue 28 item 4), run small with the real binary:
//! `--agents 0,5 --json` on SQLite, and with `--store postgres://…` on
//! SQLite and the real PostgreSQL. The report's shape is checked, and that
//! its figures were read from a real daemon (a pid, descriptors, memory,
//! each agent's descriptors among them); the run leaves nothing behind (its
//! node, its root, its database). No figure is held to the target.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::database_exists;
use serde_json::Value;

/// `brood bench memory --agents 0,5 --json` with `store` as `BROOD_STORE`.
fn bench(store: Option<&str>) -> Value {
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(common::exe());
    for var in [
        "BROOD_STORE",
        "BROOD_STORE_FILE",
        "BROOD_SLOTS",
        "BROOD_SOCKET",
        "BROOD_URL",
    ] {
        cmd.env_remove(var);
    }
    if let Some(s) = store {
        // The URL holds a password: never on a command line.
        cmd.env("BROOD_STORE", s);
    }
    let o = cmd
        .args(["bench", "memory", "--agents", "0,5", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)))
}

/// A reading: memory and descriptors, all positive, the descriptors
/// counted by kind adding up to their number.
fn check_reading(r: &Value, v: &Value) {
    for k in ["rss_kib", "rss_anon_kib", "threads", "fds"] {
        assert!(r[k].as_u64().unwrap() > 0, "{k} > 0 in {r}: {v}");
    }
    let by_kind: u64 = r["fd_kinds"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(by_kind, r["fds"].as_u64().unwrap(), "{r}");
}

/// One store's part of the report.
fn check_store(s: &Value, store: &str, v: &Value) {
    assert_eq!(s["store"], store, "{v}");
    // The pid is the daemon's, which the run stopped.
    let pid = s["pid"].as_u64().unwrap();
    assert!(pid > 0, "{v}");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        !comm.contains(s["root"].as_str().unwrap()),
        "the node was stopped: {v}"
    );
    check_reading(&s["fresh"], v);
    check_reading(&s["after_cancel"], v);
    let levels = s["levels"].as_array().unwrap();
    let agents: Vec<u64> = levels
        .iter()
        .map(|l| l["agents"].as_u64().unwrap())
        .collect();
    assert_eq!(agents, [0, 5], "{v}");
    for l in levels {
        check_reading(l, v);
    }
    let (base, five) = (&levels[0], &levels[1]);
    assert!(
        base.get("rss_kib_per_agent").is_none(),
        "no cost per agent at 0: {v}"
    );
    // Each live agent holds descriptors in the daemon (its stderr pipe at
    // least; its exit is watched on the daemon's one io_uring, no pidfd):
    // the counts are the real daemon's, not the bench's own.
    let fds = |l: &Value| l["fds"].as_f64().unwrap();
    assert!(fds(five) >= fds(base) + 5.0, "{v}");
    let kind = |l: &Value, k: &str| l["fd_kinds"][k].as_u64().unwrap_or(0);
    assert_eq!(kind(five, "pipe"), kind(base, "pipe") + 5, "{v}");
    assert_eq!(kind(five, "anon_inode:[pidfd]"), 0, "{v}");
    assert_eq!(kind(five, "anon_inode:[io_uring]"), 1, "{v}");
    let per = five["fds_per_agent"].as_f64().unwrap();
    assert!((per - (fds(five) - fds(base)) / 5.0).abs() < 0.01, "{v}");
    let kib = five["rss_kib_per_agent"].as_f64().unwrap();
    let rss = |l: &Value| l["rss_kib"].as_f64().unwrap();
    assert!((kib - (rss(five) - rss(base)) / 5.0).abs() < 0.06, "{v}");
    for k in ["rss_met", "fds_met"] {
        assert!(five[k].is_boolean(), "{k}: {v}");
    }
    // Nothing left: the node's root is gone, and no process runs from it.
    let root = s["root"].as_str().unwrap();
    assert!(!Path::new(root).exists(), "{root} was removed");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(root).then_some(cmd)
        })
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
}

fn check(v: &Value) {
    assert_eq!(v["bench"], "memory", "{v}");
    assert_eq!(v["levels"], serde_json::json!([0, 5]), "{v}");
    assert_eq!(v["target_kib_per_agent"], 32.0, "{v}");
    assert_eq!(v["target_fds_per_agent"], 2.0, "{v}");
    assert!(
        v["process"].as_str().unwrap().contains("own process"),
        "says what it reads: {v}"
    );
}

#[test]
fn on_sqlite() {
    let v = bench(None);
    check(&v);
    let stores = v["stores"].as_array().unwrap();
    assert_eq!(stores.len(), 1, "{v}");
    check_store(&stores[0], "SQLite", &v);
}

#[test]
fn on_sqlite_and_postgres() {
    let admin = brood_store_conformance::pg::admin_url();
    let v = bench(Some(&admin));
    check(&v);
    let stores = v["stores"].as_array().unwrap();
    assert_eq!(stores.len(), 2, "{v}");
    check_store(&stores[0], "SQLite", &v);
    check_store(&stores[1], "PostgreSQL", &v);
    // The run's database was dropped.
    let name = stores[1]["database"].as_str().unwrap();
    assert!(name.starts_with("brood_bench_"), "{v}");
    assert!(!database_exists(&admin, name), "{name} was dropped");
}
