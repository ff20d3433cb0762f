//! `brood bench cluster` (issue 27 item 1), run small with the real binary:
//! one node on SQLite, and three nodes on the real PostgreSQL sharing a
//! Redis slot counter. Its report is checked for what it must hold and for
//! being consistent (every creation acknowledged, every agent ended, the
//! ratio the two rates'), and the run for leaving nothing behind (nodes,
//! roots, its database, its Redis database's keys). No figure is asserted.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::database_exists;
use serde_json::Value;

const N: u64 = 20;

/// `brood bench cluster --json -n 20 ARGS…` with `store` as `BROOD_STORE`.
fn bench(store: Option<&str>, args: &[&str]) -> Value {
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(common::exe());
    for var in ["BROOD_STORE", "BROOD_SLOTS", "BROOD_SOCKET", "BROOD_URL"] {
        cmd.env_remove(var);
    }
    if let Some(s) = store {
        // The URL holds a password: never on a command line.
        cmd.env("BROOD_STORE", s);
    }
    let o = cmd
        .args(["bench", "cluster", "--json", "-n", &N.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)))
}

/// What every report holds, whatever the deployment.
fn check(v: &Value, nodes: u64, store: &str) {
    assert_eq!(v["bench"], "cluster", "{v}");
    assert_eq!(v["store"], store, "{v}");
    assert_eq!(v["nodes"], nodes, "{v}");
    assert_eq!(v["n"], N, "{v}");
    assert_eq!(v["acknowledged"], N, "every creation answered 201: {v}");
    assert_eq!(v["ended"], N, "every agent ended: {v}");
    assert_eq!(
        v["statuses"],
        serde_json::json!({"completed": N}),
        "every `true` completed: {v}"
    );
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} is not a number: {v}"))
    };
    let (rate, floor) = (f("acknowledged_per_s"), f("floor_per_s"));
    assert!(rate > 0.0 && floor > 0.0, "{v}");
    assert!(
        (f("ratio") - rate / floor).abs() < 0.001,
        "ratio = rate / floor rate: {v}"
    );
    // Each rate is N over its time (the time rounded to the millisecond,
    // the rate to a tenth).
    let over = |rate: f64, secs: &str| {
        let s = f(secs);
        assert!(s > 0.001, "{v}");
        let (lo, hi) = (N as f64 / (s + 0.0005), N as f64 / (s - 0.0005));
        assert!(
            rate >= lo - 0.05 && rate <= hi + 0.05,
            "{rate} = {N} / {secs}: {v}"
        );
    };
    over(rate, "last_ack_s");
    over(floor, "floor_all_ended_s");
    let p = [
        "latency_p50_ms",
        "latency_p90_ms",
        "latency_p99_ms",
        "latency_max_ms",
    ]
    .map(f);
    assert!(
        p.windows(2).all(|w| w[0] <= w[1]),
        "percentiles in order: {v}"
    );
    assert!(f("all_ended_s") >= 0.0, "{v}");
    // Nothing left: the nodes' roots are gone, and no process runs from them.
    let roots = v["roots"].as_str().unwrap();
    assert!(!Path::new(roots).exists(), "{roots} was removed");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(roots).then_some(cmd)
        })
        .collect();
    assert!(left.is_empty(), "processes left: {left:?}");
}

#[test]
fn one_node_on_sqlite() {
    let v = bench(None, &["--clients", "4"]);
    check(&v, 1, "SQLite");
    assert_eq!(v["slots"], "embedded", "{v}");
    assert!(v.get("database").is_none(), "{v}");
}

#[test]
fn three_nodes_on_postgres_with_redis_slots() {
    let admin = brood_store_conformance::pg::admin_url();
    let redis = common::redis::server();
    // A database of the Redis that no other test of this binary uses; a
    // key of an earlier run in it is emptied away.
    let db = 12;
    common::redis::raw_in(redis.addr, db, &["SET", "bench-cluster-stale", "1"]);
    let slots = format!("{}/{db}", redis.url());
    let v = bench(
        Some(&admin),
        &["--nodes", "3", "--clients", "6", "--slots", &slots],
    );
    check(&v, 3, "PostgreSQL");
    assert_eq!(v["slots"], format!("Redis ({slots})"), "{v}");
    assert_eq!(
        common::redis::raw_in(redis.addr, db, &["DBSIZE"]),
        ":0",
        "the counter's database emptied"
    );
    // The run's database was dropped.
    let name = v["database"].as_str().unwrap();
    assert!(name.starts_with("brood_bench_"), "{v}");
    assert!(!database_exists(&admin, name), "{name} was dropped");
}

/// One node on PostgreSQL counting its slots in the store (no Redis).
#[test]
fn one_node_on_postgres_without_redis() {
    let v = bench(
        Some(&brood_store_conformance::pg::admin_url()),
        &["--clients", "4"],
    );
    check(&v, 1, "PostgreSQL");
    assert_eq!(v["slots"], "the store's shares", "{v}");
}
