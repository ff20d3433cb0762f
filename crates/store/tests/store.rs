//! The SQLite store against the conformance suite, plus what only SQLite has: the
//! file (migrations, read-only opens, several stores on one file), the raw rows
//! (a refusal writes none; a corrupt edge cycle is caught) and query plans at
//! 100,000 agents.
//!
//! Every test works on a real database file in its own temporary directory.

// Test code: a failed unwrap is a failed test, and the helpers (outside `#[test]`
// functions, where clippy's test allowance does not reach) are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use brood_store_conformance as conformance;

use std::path::{Path, PathBuf};

use brood_core::{AgentName, Code, Status, TenantId, Terminal};
use brood_store::prelude::*;
use brood_store::{Options, SqliteStore, StoreError};
use conformance::{admit, end, name, new_agent, now, running, spawn_events, start, tenant};
use rusqlite::types::ValueRef;

fn fresh() -> (tempfile::TempDir, PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brood.db");
    let store = SqliteStore::open(&path).unwrap();
    (dir, path, store)
}

// One test per conformance case, each on a fresh file, so a failure names its case.
conformance::conformance_tests!({
    let (dir, _path, store) = fresh();
    (dir, store)
});

#[test]
fn the_whole_suite_runs_on_one_shared_database() {
    let (_dir, _path, store) = fresh();
    conformance::conformance(&store);
}

/// Issue 28: node expiry is judged on the store's clock, a heartbeat
/// recorded by a node whose clock was skewed written here through a
/// connection of the test's own.
#[test]
fn node_expiry_is_judged_on_the_stores_clock() {
    let (_dir, path, store) = fresh();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    conformance::node_expiry_is_judged_on_the_stores_clock(&store, &|id, ms| {
        let n = raw
            .execute(
                "UPDATE nodes SET heartbeat_ms = ?2 WHERE id = ?1",
                rusqlite::params![id, ms],
            )
            .unwrap();
        assert_eq!(n, 1, "node {id} is registered");
    });
}

// ---- raw rows -------------------------------------------------------------------

const TABLES: [&str; 12] = [
    "tenants",
    "agents",
    "edges",
    "runs",
    "channels",
    "events",
    "messages",
    "schema_migrations",
    "idempotency",
    "jobs",
    "job_items",
    "job_attempts",
];

/// Every row of every table, as text, read through a second connection: what the
/// file holds, not what the store chooses to show.
fn dump(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut out = Vec::new();
    for table in TABLES {
        let width = conn
            .prepare(&format!("SELECT * FROM {table}"))
            .unwrap()
            .column_count();
        let order: Vec<String> = (1..=width).map(|i| i.to_string()).collect();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT * FROM {table} ORDER BY {}",
                order.join(", ")
            ))
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            let cells: Vec<String> = (0..width)
                .map(|i| match row.get_ref(i).unwrap() {
                    ValueRef::Null => "NULL".to_owned(),
                    ValueRef::Integer(v) => v.to_string(),
                    ValueRef::Real(v) => v.to_string(),
                    ValueRef::Text(v) => String::from_utf8_lossy(v).into_owned(),
                    ValueRef::Blob(v) => format!("{v:?}"),
                })
                .collect();
            out.push(format!("{table}: {}", cells.join(" | ")));
        }
    }
    out
}

#[test]
fn a_refused_call_writes_no_row_in_any_table() {
    let (_dir, path, store) = fresh();
    let t = tenant("raw");
    running(&store, &t, "root", None);
    admit(&store, &t, "kid", Some("root"));
    let done = running(&store, &t, "done", None);
    end(&store, &done, Terminal::Completed, Some("d"));
    let stopping = running(&store, &t, "stopping", None);
    store
        .mark_stopping(
            &t,
            std::slice::from_ref(&stopping.name),
            Terminal::Completed,
            now(),
        )
        .unwrap();
    let before = dump(&path);
    assert!(before.len() > 10);

    type Try<'a> = (&'a str, Box<dyn Fn() -> Result<(), StoreError> + 'a>);
    let tries: Vec<Try> = vec![
        (
            "taken name",
            Box::new(|| {
                let n = new_agent(&t, "kid", Some("root"), "s");
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "missing parent",
            Box::new(|| {
                let n = new_agent(&t, "x", Some("ghost"), "s");
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "finished parent",
            Box::new(|| {
                let n = new_agent(&t, "x", Some("done"), "s");
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "stopping parent",
            Box::new(|| {
                let n = new_agent(&t, "x", Some("stopping"), "s");
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "a job whose second item is not an object",
            Box::new(|| {
                let job = brood_store::NewJob {
                    tenant: t.clone(),
                    id: "j".into(),
                    owner: name("root"),
                    spec: "{}".into(),
                    source: None,
                    created_ms: now(),
                };
                let items = [
                    brood_store::NewItem {
                        id: "a".into(),
                        row_index: 0,
                        input: "{}".into(),
                    },
                    brood_store::NewItem {
                        id: "b".into(),
                        row_index: 1,
                        input: "[]".into(),
                    },
                ];
                let ev = [conformance::event(&name("root"), None, "job.created")];
                store.create_job(&job, &items, &ev).map(drop)
            }),
        ),
        (
            "missing customer",
            Box::new(|| {
                let mut n = new_agent(&t, "x", Some("root"), "s");
                n.customer = Some(name("ghost"));
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "new tenant, missing parent",
            Box::new(|| {
                let n = new_agent(&tenant("raw-new"), "x", Some("ghost"), "s");
                store.admit(&n, &spawn_events(&n)).map(drop)
            }),
        ),
        (
            "illegal transition",
            Box::new(|| {
                store
                    .set_status(&t, &name("done"), Status::Running, None, now(), &[])
                    .map(drop)
            }),
        ),
        (
            "start of a finished agent",
            Box::new(|| {
                let d = store.agent(&t, &name("done")).unwrap().unwrap();
                store
                    .start_run(&t, &d.name, &d.run, 1, "/cg", now(), &[])
                    .map(drop)
            }),
        ),
        (
            "resume of a live agent",
            Box::new(|| {
                store
                    .resume(&t, &name("root"), &conformance::new_run(), "s", now(), &[])
                    .map(drop)
            }),
        ),
        (
            "event of an unknown agent",
            Box::new(|| {
                store
                    .append_events(
                        &t,
                        &[
                            conformance::event(&name("root"), None, "ok"),
                            conformance::event(&name("ghost"), None, "x"),
                        ],
                        now(),
                    )
                    .map(drop)
            }),
        ),
    ];
    for (what, call) in tries {
        assert!(call().is_err(), "{what} was not refused");
        assert_eq!(dump(&path), before, "{what} wrote something");
    }
}

#[test]
fn a_corrupt_edge_cycle_is_refused_and_the_walk_ends() {
    let (_dir, path, store) = fresh();
    let t = tenant("cycle");
    running(&store, &t, "root", None);
    running(&store, &t, "a", Some("root"));
    running(&store, &t, "b", Some("a"));
    running(&store, &t, "c", Some("b"));
    running(&store, &t, "x", Some("root"));
    running(&store, &t, "y", Some("x"));
    assert_eq!(
        store
            .descendants_post_order(&t, &name("root"))
            .unwrap()
            .len(),
        5
    );

    let conn = rusqlite::Connection::open(&path).unwrap();
    let edge = |p: &str, c: &str| {
        conn.execute(
            "INSERT INTO edges (tenant, parent, child, created_ms) VALUES ('cycle', ?1, ?2, 0)",
            [p, c],
        )
        .unwrap();
    };
    // c -> a closes a -> b -> c -> a; y -> x closes a second, separate one.
    edge("c", "a");
    edge("y", "x");
    for top in ["root", "a", "c", "x"] {
        match store.descendants_post_order(&t, &name(top)) {
            Err(StoreError::Corrupt { what, value }) => {
                assert_eq!(what, "edges");
                assert!(value.contains("cycle"), "{value}");
            }
            other => panic!("a cycle under {top} gave {other:?}"),
        }
    }
    // A walk that is not whole leaves a stop to plan, whose plan says why.
    let below = store.unfinished_below(&t, &[name("c"), name("x")]).unwrap();
    assert!(
        below.contains(&name("c")) && below.contains(&name("x")),
        "{below:?}"
    );
    // An agent that corruption gave a second parent is planned once, after all
    // of its descendants and before both of its parents.
    let conn2 = rusqlite::Connection::open(&path).unwrap();
    conn2
        .execute(
            "DELETE FROM edges WHERE tenant = 'cycle' AND parent IN ('c', 'y')",
            [],
        )
        .unwrap();
    assert_eq!(
        store
            .descendants_post_order(&t, &name("root"))
            .unwrap()
            .len(),
        5
    );
    running(&store, &t, "c1", Some("c"));
    conn2
        .execute(
            "INSERT INTO edges (tenant, parent, child, created_ms) VALUES ('cycle', 'x', 'c', 0)",
            [],
        )
        .unwrap();
    let plan = store.descendants_post_order(&t, &name("root")).unwrap();
    let names: Vec<&str> = plan.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "c").count(), 1, "{names:?}");
    let pos = |n: &str| names.iter().position(|x| *x == n).unwrap();
    assert!(
        pos("c1") < pos("c") && pos("c") < pos("b") && pos("c") < pos("x"),
        "{names:?}"
    );
}

// ---- several stores on one file -------------------------------------------------

#[test]
fn two_stores_on_one_file_admit_concurrently_without_gaps() {
    let (_dir, path, store) = fresh();
    let t = tenant("two");
    running(&store, &t, "root", None);
    drop(store);
    const EACH: usize = 50;
    std::thread::scope(|s| {
        for side in ["left", "right"] {
            let (path, t) = (&path, &t);
            s.spawn(move || {
                // Its own store: its own connection, as a second process would have.
                let store = SqliteStore::open(path).unwrap();
                for i in 0..EACH {
                    let new = new_agent(t, &format!("{side}-{i}"), Some("root"), side);
                    store.admit(&new, &spawn_events(&new)).unwrap();
                    if i % 5 == 0 {
                        // Some starts too, so the writes are not all one kind.
                        let a = store.agent(t, &new.name).unwrap().unwrap();
                        start(&store, &a);
                    }
                }
            });
        }
    });
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.children(&t, &name("root")).unwrap().len(), 2 * EACH);
    let evs = store.events(&t, 0, None, u32::MAX).unwrap();
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>());
    // root: spawn + start; each child: spawn + child.spawn; every fifth: start.
    assert_eq!(evs.len(), 2 + 2 * EACH * 2 + 2 * EACH / 5);
}

#[test]
fn many_stores_opening_a_new_file_at_once_migrate_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| SqliteStore::open(&path).unwrap());
        }
    });
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as usize, brood_store::sqlite::MIGRATION_COUNT);
}

// ---- the file ---------------------------------------------------------------------

#[test]
fn reopening_keeps_the_data_and_applies_no_migration_twice() {
    let (_dir, path, store) = fresh();
    let t = tenant("reopen");
    let a = running(&store, &t, "a", None);
    drop(store);
    let applied = |path: &Path| -> Vec<(i64, i64)> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut stmt = conn
            .prepare("SELECT version, applied_ms FROM schema_migrations")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let first = applied(&path);
    assert_eq!(first.len(), brood_store::sqlite::MIGRATION_COUNT);
    for options in [
        Options::default(),
        Options {
            synchronous_full: true,
        },
    ] {
        let store = SqliteStore::open_with(&path, options).unwrap();
        assert_eq!(store.agent(&t, &a.name).unwrap().as_ref(), Some(&a));
        assert_eq!(applied(&path), first);
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_schema_newer_than_the_build_is_refused() {
    let (_dir, path, store) = fresh();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO schema_migrations (version, applied_ms) VALUES (999, 0)",
        [],
    )
    .unwrap();
    drop(conn);
    for r in [SqliteStore::open(&path), SqliteStore::open_read_only(&path)] {
        match r {
            Err(e @ StoreError::Migration { version: 999, .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("newer") && msg.contains(&path.display().to_string()),
                    "{msg}"
                );
            }
            Err(other) => panic!("expected a migration error, got {other}"),
            Ok(_) => panic!("a schema from the future was accepted"),
        }
    }
}

#[test]
fn open_read_only_of_a_missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing-here.db");
    let err = SqliteStore::open_read_only(&path).expect_err("a missing file must not open");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("does not exist"), "{msg}");
    assert!(!path.exists(), "a read-only open must not create the file");
}

#[test]
fn open_read_only_reads_and_refuses_writes() {
    let (_dir, path, store) = fresh();
    let t = tenant("ro");
    let a = running(&store, &t, "a", None);
    let ro = SqliteStore::open_read_only(&path).unwrap();
    assert_eq!(ro.agent(&t, &a.name).unwrap().as_ref(), Some(&a));
    assert_eq!(ro.tenants().unwrap(), vec![t.clone()]);
    let new = new_agent(&t, "b", None, "s");
    let err = ro
        .admit(&new, &[])
        .expect_err("a read-only store must not write");
    assert!(matches!(err, StoreError::Sqlite { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    // The writer is unaffected, and the reader sees its later commits.
    admit(&store, &t, "b", None);
    assert!(ro.agent(&t, &name("b")).unwrap().is_some());
}

#[test]
fn errors_name_the_agent_the_file_and_the_rule() {
    let (_dir, _path, store) = fresh();
    let t = tenant("msgs");
    let a = running(&store, &t, "alpha", None);
    end(&store, &a, Terminal::Completed, None);
    let e = store
        .set_status(&t, &a.name, Status::Running, None, now(), &[])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent alpha: illegal status change from completed to running"
    );
    let e = store
        .start_run(&t, &name("ghost"), &a.run, 1, "/", now(), &[])
        .unwrap_err();
    assert_eq!(e.to_string(), "agent msgs/ghost not found");
    let e = store
        .set_status(&t, &a.name, Status::Queued, None, now(), &[])
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Refused {
                code: Code::BadRequest,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("resume"), "{e}");
}

// ---- 100,000 agents ---------------------------------------------------------------

/// A small deterministic generator (xorshift64*), so the forest is the same on
/// every run without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

const SCAN_TABLES: [&str; 7] = [
    "agents", "edges", "runs", "channels", "events", "messages", "tenants",
];

/// A plan step that reads a whole stored table, or all of a tenant's rows of it
/// (a search on `tenant=?` alone), instead of searching for what it needs.
/// Walking the recursive query's own queue (`SCAN walk`) is fine.
fn full_scan(step: &str) -> bool {
    if let Some(rest) = step.strip_prefix("SCAN ") {
        let table = rest.split_whitespace().next().unwrap_or("");
        return SCAN_TABLES.contains(&table);
    }
    step.starts_with("SEARCH ") && step.ends_with("(tenant=?)")
}

/// One agent of the bulk-built forest.
struct Planted {
    name: String,
    parent: Option<usize>,
}

/// Writes `forest` straight into the file in one transaction, row for row what
/// `admit` writes (agent, first run, edge, channel) except the events, with every
/// agent that has children running and the others completed. Admitting 100,000
/// agents one call at a time takes too long for a debug test run; the calls that
/// the test times go through `admit`.
fn plant(path: &Path, t: &TenantId, forest: &[Planted]) {
    let mut has_children = vec![false; forest.len()];
    for p in forest.iter().filter_map(|a| a.parent) {
        has_children[p] = true;
    }
    let mut roots = Vec::with_capacity(forest.len());
    let mut depths = Vec::with_capacity(forest.len());
    for (i, a) in forest.iter().enumerate() {
        let (root, depth) = match a.parent {
            Some(p) => (roots[p], depths[p] + 1),
            None => (i, 0),
        };
        roots.push(root);
        depths.push(depth);
    }
    let mut conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "foreign_keys", true).unwrap();
    let tx = conn.transaction().unwrap();
    tx.execute(
        "INSERT INTO tenants (id, next_seq, created_ms) VALUES (?1, 1, ?2) ON CONFLICT DO NOTHING",
        (t.as_str(), now()),
    )
    .unwrap();
    {
        let mut agent = tx
            .prepare(
                "INSERT INTO agents (tenant, name, parent, customer, root, depth, session, \
                 protocol, spec, status, detail, run, supervisor, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, NULL, ?4, ?5, 'default', 'brood', '{}', ?6, NULL, ?7, \
                 'sup-scale', ?8, ?8)",
            )
            .unwrap();
        let mut run = tx
            .prepare(
                "INSERT INTO runs (id, tenant, agent, seq, pid, started_ms, outcome, ended_ms, \
                 created_ms) VALUES (?1, ?2, ?3, 1, 1, ?4, ?5, ?6, ?4)",
            )
            .unwrap();
        let mut edge = tx
            .prepare(
                "INSERT INTO edges (tenant, parent, child, created_ms) VALUES (?1, ?2, ?3, ?4)",
            )
            .unwrap();
        let mut channel = tx
            .prepare(
                "INSERT INTO channels (tenant, parent, parent_session, child, child_session, \
                 handoff, result) VALUES (?1, ?2, 'default', ?3, 'default', 'task', ?4)",
            )
            .unwrap();
        for (i, a) in forest.iter().enumerate() {
            let at = now();
            let id = conformance::new_run();
            let parent = a.parent.map(|p| forest[p].name.as_str());
            let (status, outcome, ended, result) = if has_children[i] {
                ("running", None, None, None)
            } else {
                ("completed", Some("completed"), Some(at), Some("done"))
            };
            agent
                .execute(rusqlite::params![
                    t.as_str(),
                    a.name,
                    parent,
                    forest[roots[i]].name,
                    depths[i],
                    status,
                    id.as_str(),
                    at
                ])
                .unwrap();
            run.execute(rusqlite::params![
                id.as_str(),
                t.as_str(),
                a.name,
                at,
                outcome,
                ended
            ])
            .unwrap();
            if let Some(p) = parent {
                edge.execute((t.as_str(), p, &a.name, at)).unwrap();
                channel.execute((t.as_str(), p, &a.name, result)).unwrap();
            }
        }
    }
    tx.commit().unwrap();
    // Copy the big transaction out of the WAL now, so the first timed admit does
    // not pay for checkpointing it.
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
}

#[test]
fn a_forest_of_100000_agents_is_walked_through_indexes() {
    let (_dir, path, store) = fresh();
    let t = tenant("scale");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    const TOTAL: usize = 100_000;
    // Through `admit`: the 51 agents of the checked subtree and this many
    // children of random running agents of the forest.
    const SAMPLE: usize = 2_000;

    let mut forest: Vec<Planted> = Vec::with_capacity(TOTAL);
    let plant_under = |forest: &mut Vec<Planted>, name: String, parent: Option<usize>| {
        forest.push(Planted { name, parent });
        forest.len() - 1
    };
    // A wide tree: one root with 20,000 children.
    let wide = plant_under(&mut forest, "wide".into(), None);
    for i in 0..20_000 {
        plant_under(&mut forest, format!("wide-{i}"), Some(wide));
    }
    // A deep chain of 1,000 (far past any depth quota; the store must not care).
    let mut up = plant_under(&mut forest, "deep-0".into(), None);
    for i in 1..1_000 {
        up = plant_under(&mut forest, format!("deep-{i}"), Some(up));
    }
    // The rest: random recursive trees of 2,000 (each node under a random earlier
    // one of its tree), bushy and around ten levels deep.
    let bulk = TOTAL - SAMPLE - 51;
    let mut tree = 0;
    while forest.len() < bulk {
        let size = (bulk - forest.len()).min(2_000);
        let first = plant_under(&mut forest, format!("t{tree}"), None);
        for k in 1..size {
            let parent = first + rng.below(k);
            plant_under(&mut forest, format!("t{tree}-{k}"), Some(parent));
        }
        tree += 1;
    }
    plant(&path, &t, &forest);

    // Through the store: the subtree whose plan is checked exactly (5 children of
    // 9 children each, under the middle of the chain), then the sample.
    let admit = |n: String, parent: &str| {
        let new = new_agent(&t, &n, Some(parent), "sup-scale");
        let events = spawn_events(&new);
        store.admit(&new, &events).unwrap()
    };
    let sub = admit("sub".into(), "deep-500");
    start(&store, &sub);
    for i in 0..5 {
        let kid = admit(format!("sub-{i}"), "sub");
        start(&store, &kid);
        for j in 0..9 {
            admit(format!("sub-{i}-{j}"), &format!("sub-{i}"));
        }
    }
    let running_parents: Vec<&str> = forest
        .iter()
        .filter(|a| a.name.starts_with('t') && a.name.contains('-'))
        .map(|a| a.name.as_str())
        .take(50_000)
        .collect();
    let mut picked = 0;
    while picked < SAMPLE {
        let p = running_parents[rng.below(running_parents.len())];
        // Only a running agent may have children; leaves of the forest are done.
        if store.agent(&t, &name(p)).unwrap().unwrap().status != Status::Running {
            continue;
        }
        admit(format!("sample-{picked}"), p);
        picked += 1;
    }
    assert_eq!(store.agents(&t, true).unwrap().len(), TOTAL);

    // The plans: every hot query searches an index, none reads a whole table.
    for plan in store.query_plans().unwrap() {
        eprintln!("plan {}: {:?}", plan.name, plan.steps);
        for step in &plan.steps {
            // Listing the supervisors with unfinished agents reads the partial
            // index of unfinished agents whole; that index holds nothing else.
            if plan.name == "supervisors_with_unfinished"
                && step.contains("agents_unfinished_by_supervisor")
            {
                continue;
            }
            // Listing a tenant's agents (or their runs, or the current run
            // of each) reads the tenant's rows by design.
            if plan.name.starts_with("agents_")
                || plan.name == "tenant_runs"
                || plan.name == "current_runs_all"
                || plan.name == "current_runs_unfinished"
            {
                continue;
            }
            assert!(
                !full_scan(step),
                "{}: full scan in {step:?}\n{}",
                plan.name,
                plan.sql
            );
        }
    }
    let uses = |plan: &str, index: &str| {
        let p = store
            .query_plans()
            .unwrap()
            .into_iter()
            .find(|p| p.name == plan)
            .unwrap();
        assert!(
            p.steps.iter().any(|s| s.contains(index)),
            "{plan} does not use {index}: {:?}",
            p.steps
        );
    };
    // The primary key of a rowid table shows as its automatic index.
    uses("agent", "sqlite_autoindex_agents_1 (tenant=? AND name=?)");
    uses(
        "agent_exists",
        "sqlite_autoindex_agents_1 (tenant=? AND name=?)",
    );
    uses("children", "agents_by_parent (tenant=? AND parent=?)");
    // A node's looks after news (issue 27): its placed agents, its inbox.
    uses(
        "any_placed",
        "agents_unfinished_by_supervisor (supervisor=?)",
    );
    uses("any_input", "inbox_by_host (host=? AND tenant=?)");
    uses(
        "descendants",
        "SEARCH edges USING PRIMARY KEY (tenant=? AND parent=?)",
    );
    // The ends' one look below for a batch (issue 27): each name's edges by
    // the key, each agent reached by its key.
    uses(
        "unfinished_below",
        "SEARCH edges USING PRIMARY KEY (tenant=? AND parent=?)",
    );
    uses(
        "unfinished_below",
        "sqlite_autoindex_agents_1 (tenant=? AND name=?)",
    );
    uses(
        "events_of_agent",
        "events_by_agent (tenant=? AND agent=? AND seq>?)",
    );
    uses("agents_unfinished", "agents_unfinished_by_tenant");
    // A listing's runs: its agents as the listing finds them, each run by its key.
    uses("current_runs_unfinished", "agents_unfinished_by_tenant");
    uses("current_runs_unfinished", "sqlite_autoindex_runs_1 (id=?)");
    uses(
        "current_runs_of_children",
        "agents_by_parent (tenant=? AND parent=?)",
    );
    uses("current_runs_of_children", "sqlite_autoindex_runs_1 (id=?)");
    uses("unfinished_of", "agents_unfinished_by_supervisor");

    // The 50-node subtree comes back exactly, in post-order.
    let plan = store.descendants_post_order(&t, &name("sub")).unwrap();
    let mut got: Vec<String> = plan.iter().map(|a| a.name.to_string()).collect();
    got.sort();
    let mut want: Vec<String> = (0..5)
        .flat_map(|i| {
            std::iter::once(format!("sub-{i}")).chain((0..9).map(move |j| format!("sub-{i}-{j}")))
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
    conformance::assert_post_order(&store, &t, &name("sub"), &plan);

    let deep = store.descendants_post_order(&t, &name("deep-0")).unwrap();
    assert_eq!(deep.len(), 999 + 51);
    assert_eq!(deep.last().map(|a| a.name.as_str()), Some("deep-1"));
    let wide = store.descendants_post_order(&t, &name("wide")).unwrap();
    assert_eq!(wide.len(), 20_000);
    let random = store.descendants_post_order(&t, &name("t0")).unwrap();
    // 1,999 planted, plus whatever of the sample landed in this tree.
    assert!(random.len() >= 1_999);
    conformance::assert_post_order(&store, &t, &name("t0"), &random);
    let kids = store.children(&t, &name("wide")).unwrap();
    assert_eq!(kids.len(), 20_000);
    for i in 0..1_000 {
        let n = format!("wide-{i}");
        let a = store.agent(&t, &AgentName::new(&n).unwrap()).unwrap();
        assert!(a.is_some_and(|a| a.name.as_str() == n), "{n} not found");
    }
}
