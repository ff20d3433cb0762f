//! `brood bench restart` (issue 29 item 5), run small with the real binary:
//! `-n 5 --json` on SQLite and on the real PostgreSQL, one node and three
//! nodes of which one is lost. The report's shape is checked, and that it
//! was measured (every figure read, its root gone afterwards). No figure is
//! held to a target.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[test]
fn bench_restart_reports_both_stores_and_leaves_nothing_behind() {
    let admin = brood_store_conformance::pg::admin_url();
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(common::exe());
    for var in [
        "BROOD_STORE_FILE",
        "BROOD_SLOTS",
        "BROOD_SOCKET",
        "BROOD_URL",
    ] {
        cmd.env_remove(var);
    }
    // The URL holds a password: never on a command line.
    let o = cmd
        .env("BROOD_STORE", &admin)
        .args(["bench", "restart", "-n", "5", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::text(&o));
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)));
    assert_eq!(v["bench"], "restart", "{v}");
    assert_eq!(v["agents"], 5, "{v}");
    let stores = v["stores"].as_array().unwrap();
    let names: Vec<&str> = stores
        .iter()
        .map(|s| s["store"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["SQLite", "PostgreSQL", "PostgreSQL, three nodes, one lost"],
        "{v}"
    );
    for s in &stores[..2] {
        for k in ["fresh_s", "restart_s", "serving_s", "ratio"] {
            assert!(s[k].as_f64().unwrap() > 0.0, "{k} in {s}");
        }
        assert!(
            s["serving_s"].as_f64().unwrap() <= s["restart_s"].as_f64().unwrap(),
            "{s}"
        );
    }
    // Three nodes, one SIGKILLed: its agents run again on the others.
    let lost = &stores[2];
    for k in ["fresh_s", "declared_s", "moved_s", "ratio"] {
        assert!(lost[k].as_f64().unwrap() > 0.0, "{k} in {lost}");
    }
    assert!(
        lost["declared_s"].as_f64().unwrap() <= lost["moved_s"].as_f64().unwrap(),
        "{lost}"
    );
    for s in stores {
        let root = s["root"].as_str().unwrap();
        assert!(!Path::new(root).exists(), "{root} left behind");
    }
    for s in &stores[1..] {
        let db = s["database"].as_str().unwrap();
        assert!(!common::database_exists(&admin, db), "{db} left behind");
    }
}
