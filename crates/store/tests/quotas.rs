//! Quotas in the admission transaction (SPEC 9) on real SQLite files: each limit
//! refused at exactly its bound with its code and nothing written, finished
//! children freeing fanout but not tree size, the check order, the fanout bomb
//! (100 concurrent creations under one parent with `max_fanout` 8) on one store
//! and on two stores sharing the file, tenant overrides surviving a reopen, the
//! cycle check, the migration of a version-1 file, the query plans of the counts,
//! and a timing print of `admit_with_quotas`.

// Test code: a failed unwrap is a failed test, and the helpers (outside `#[test]`
// functions, where clippy's test allowance does not reach) are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The shared helpers of the conformance suite; its cases run in store.rs.
#[allow(dead_code)]
use brood_store_conformance as conformance;

use std::path::{Path, PathBuf};
use std::sync::{Barrier, Mutex};

use brood_core::{
    CancelReason, Code, QuotaConfig, Quotas, Status, TenantId, TenantQuotas, Terminal,
};
use brood_store::prelude::*;
use brood_store::{Agent, SqliteStore, StoreError};
use conformance::{end, name, new_agent, now, refusal, snapshot, spawn_events, start, tenant};

const USER: Terminal = Terminal::Cancelled(CancelReason::User);

fn fresh() -> (tempfile::TempDir, PathBuf, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("brood.db");
    let store = SqliteStore::open(&path).unwrap();
    (dir, path, store)
}

/// Quotas with the three limits under test; `max_concurrent` plays no part in
/// admission.
fn quotas(max_depth: u32, max_fanout: u32, max_tree_size: u32) -> Quotas {
    Quotas {
        max_depth,
        max_fanout,
        max_tree_size,
        max_concurrent: 16,
    }
}

fn try_admit(
    store: &dyn Store,
    t: &TenantId,
    n: &str,
    parent: Option<&str>,
    q: &Quotas,
) -> brood_store::Result<Agent> {
    let new = new_agent(t, n, parent, &format!("sup-{t}"));
    store.admit_with_quotas(&new, q, &spawn_events(&new))
}

fn admit_q(store: &dyn Store, t: &TenantId, n: &str, parent: Option<&str>, q: &Quotas) -> Agent {
    try_admit(store, t, n, parent, q).unwrap()
}

/// Admitted and started: a running agent, as a parent must be.
fn running_q(store: &dyn Store, t: &TenantId, n: &str, parent: Option<&str>, q: &Quotas) -> Agent {
    let a = admit_q(store, t, n, parent, q);
    start(store, &a)
}

/// The number of rows of each table for the tenant, read through a second
/// connection: what the file holds, not what the store shows.
fn rows(path: &Path, t: &TenantId) -> Vec<(&'static str, i64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    [
        ("tenants", "id"),
        ("agents", "tenant"),
        ("edges", "tenant"),
        ("runs", "tenant"),
        ("channels", "tenant"),
        ("events", "tenant"),
        ("messages", "tenant"),
        ("tenant_quotas", "tenant"),
    ]
    .into_iter()
    .map(|(table, col)| {
        let n = conn
            .query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE {col} = ?1"),
                [t.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        (table, n)
    })
    .collect()
}

/// Tries an admission that must be refused with `code`, and checks that it wrote
/// nothing, through the store and in the file. Returns the message.
#[track_caller]
fn refused(
    store: &dyn Store,
    path: &Path,
    t: &TenantId,
    n: &str,
    parent: Option<&str>,
    q: &Quotas,
    code: Code,
) -> String {
    let before = (snapshot(store, t), rows(path, t));
    let (got, message) = refusal(try_admit(store, t, n, parent, q));
    assert_eq!(got, code, "{message}");
    assert_eq!((snapshot(store, t), rows(path, t)), before, "{message}");
    message
}

// ---- each limit at its bound ------------------------------------------------------

#[test]
fn depth_is_refused_just_past_max_depth() {
    let (_dir, path, store) = fresh();
    let t = tenant("depth");
    let q = quotas(2, 100, 100);
    running_q(&store, &t, "r", None, &q);
    running_q(&store, &t, "a", Some("r"), &q);
    // Depth 2 = max_depth: admitted.
    let b = running_q(&store, &t, "b", Some("a"), &q);
    assert_eq!(b.depth, 2);
    // Depth 3: one past the bound.
    let m = refused(&store, &path, &t, "c", Some("b"), &q, Code::QuotaDepth);
    assert!(m.contains("depth 3") && m.contains("max_depth is 2"), "{m}");
    assert!(m.contains("under b (depth 2)"), "{m}");

    // max_depth 0: roots only; a root skips the depth check.
    let q0 = quotas(0, 100, 100);
    running_q(&store, &t, "r0", None, &q0);
    let m = refused(&store, &path, &t, "c0", Some("r0"), &q0, Code::QuotaDepth);
    assert!(m.contains("max_depth is 0"), "{m}");
}

#[test]
fn fanout_is_refused_at_max_fanout() {
    let (_dir, path, store) = fresh();
    let t = tenant("fanout");
    let q = quotas(5, 3, 100);
    running_q(&store, &t, "p", None, &q);
    // With max_fanout - 1 unfinished children, one more is admitted.
    for i in 0..3 {
        admit_q(&store, &t, &format!("c{i}"), Some("p"), &q);
    }
    let m = refused(&store, &path, &t, "c3", Some("p"), &q, Code::QuotaFanout);
    assert!(
        m.contains("parent p") && m.contains("already has 3 unfinished children"),
        "{m}"
    );
    assert!(m.contains("max_fanout is 3"), "{m}");
    // Another parent's children are not this parent's: its own budget is whole.
    running_q(&store, &t, "other", None, &q);
    for i in 0..3 {
        admit_q(&store, &t, &format!("o{i}"), Some("other"), &q);
    }
    // A child that is stopping still holds its place: it is not finished yet.
    let c0 = start(&store, &store.agent(&t, &name("c0")).unwrap().unwrap());
    let stopping = store
        .mark_stopping(&t, std::slice::from_ref(&c0.name), USER, now())
        .unwrap();
    assert_eq!(stopping[0].status, Status::Stopping(USER));
    refused(&store, &path, &t, "c3", Some("p"), &q, Code::QuotaFanout);
    // Once it has ended, its place is free.
    end(&store, &c0, USER, None);
    admit_q(&store, &t, "c3", Some("p"), &q);
    refused(&store, &path, &t, "c4", Some("p"), &q, Code::QuotaFanout);
}

#[test]
fn tree_size_is_refused_at_max_tree_size() {
    let (_dir, path, store) = fresh();
    let t = tenant("tree");
    let q = quotas(5, 100, 4);
    running_q(&store, &t, "r", None, &q);
    running_q(&store, &t, "a", Some("r"), &q);
    // A grandchild is in the root's tree too.
    admit_q(&store, &t, "x", Some("a"), &q);
    // 3 agents in the tree, max_tree_size 4: the fourth is admitted...
    admit_q(&store, &t, "b", Some("r"), &q);
    // ...and the fifth refused, wherever in the tree it would go.
    for parent in ["r", "a"] {
        let m = refused(
            &store,
            &path,
            &t,
            "c",
            Some(parent),
            &q,
            Code::QuotaTreeSize,
        );
        assert!(
            m.contains("tree of root r") && m.contains("already holds 4 agents"),
            "{m}"
        );
        assert!(m.contains("max_tree_size is 4"), "{m}");
    }
    // Another tree is counted on its own.
    running_q(&store, &t, "r2", None, &q);
    admit_q(&store, &t, "r2-a", Some("r2"), &q);

    // A root starts a tree of 1: refused only by max_tree_size 0.
    let one = quotas(5, 100, 1);
    running_q(&store, &t, "solo", None, &one);
    let m = refused(
        &store,
        &path,
        &t,
        "solo-a",
        Some("solo"),
        &one,
        Code::QuotaTreeSize,
    );
    assert!(m.contains("already holds 1 agents"), "{m}");
    let m = refused(
        &store,
        &path,
        &t,
        "none",
        None,
        &quotas(5, 100, 0),
        Code::QuotaTreeSize,
    );
    assert!(
        m.contains("root none") && m.contains("max_tree_size is 0"),
        "{m}"
    );
}

#[test]
fn finished_children_free_fanout_but_still_count_for_tree_size() {
    let (_dir, path, store) = fresh();
    let t = tenant("finished");
    let q = quotas(5, 2, 5);
    running_q(&store, &t, "p", None, &q);
    let c1 = running_q(&store, &t, "c1", Some("p"), &q);
    let c2 = running_q(&store, &t, "c2", Some("p"), &q);
    refused(&store, &path, &t, "c3", Some("p"), &q, Code::QuotaFanout);
    end(&store, &c1, Terminal::Completed, Some("done"));
    let c3 = running_q(&store, &t, "c3", Some("p"), &q);
    // A queued child ended before it ever ran frees its place as well.
    end(&store, &c2, Terminal::Completed, Some("done"));
    let c4 = admit_q(&store, &t, "c4", Some("p"), &q);
    store
        .mark_stopping(&t, std::slice::from_ref(&c4.name), USER, now())
        .unwrap();
    assert!(
        store
            .agent(&t, &c4.name)
            .unwrap()
            .unwrap()
            .status
            .is_finished()
    );
    end(&store, &c3, Terminal::Completed, Some("done"));
    // p, c1..c4: 5 agents, all children finished. Fanout would allow two more;
    // the tree size allows none.
    let m = refused(&store, &path, &t, "c5", Some("p"), &q, Code::QuotaTreeSize);
    assert!(m.contains("already holds 5 agents"), "{m}");
}

#[test]
fn the_checks_run_in_the_documented_order() {
    let (_dir, path, store) = fresh();
    let t = tenant("order");
    let loose = quotas(10, 10, 10);
    running_q(&store, &t, "r", None, &loose);
    running_q(&store, &t, "a", Some("r"), &loose);
    admit_q(&store, &t, "b", Some("a"), &loose);
    // Depth, fanout and tree size all exceeded: depth answers.
    let all = quotas(1, 1, 3);
    refused(&store, &path, &t, "x", Some("a"), &all, Code::QuotaDepth);
    // Fanout and tree size exceeded: fanout answers.
    refused(
        &store,
        &path,
        &t,
        "x",
        Some("a"),
        &quotas(9, 1, 3),
        Code::QuotaFanout,
    );
    // Only tree size.
    refused(
        &store,
        &path,
        &t,
        "x",
        Some("a"),
        &quotas(9, 9, 3),
        Code::QuotaTreeSize,
    );
    // `admit`'s own refusals come before any quota.
    refused(&store, &path, &t, "b", Some("a"), &all, Code::NameTaken);
    refused(
        &store,
        &path,
        &t,
        "x",
        Some("nobody"),
        &all,
        Code::ParentMismatch,
    );
    let mut new = new_agent(&t, "x", Some("a"), "sup-order");
    new.customer = Some(name("nobody"));
    let (code, _) = refusal(store.admit_with_quotas(&new, &all, &[]));
    assert_eq!(code, Code::ParentMismatch);
    new.customer = None;
    new.spec = "not json".to_owned();
    let (code, _) = refusal(store.admit_with_quotas(&new, &all, &[]));
    assert_eq!(code, Code::BadRequest);
}

#[test]
fn admit_without_quotas_is_unchanged() {
    let (_dir, _path, store) = fresh();
    let t = tenant("plain");
    let q = quotas(0, 0, 1);
    running_q(&store, &t, "r", None, &q);
    // `admit` knows no quotas: a caller that does not ask for them is not limited.
    conformance::running(&store, &t, "a", Some("r"));
    conformance::admit(&store, &t, "b", Some("a"));
    let with = admit_q(&store, &t, "c", Some("r"), &quotas(5, 5, 5));
    assert_eq!((with.depth, with.root.as_str()), (1, "r"));
    let plain = store.agent(&t, &name("b")).unwrap().unwrap();
    assert_eq!((plain.depth, plain.root.as_str()), (2, "r"));
}

// ---- the fanout bomb ----------------------------------------------------------------

const BOMB: usize = 100;

/// 100 threads, released together by a barrier, each admitting one child under
/// `p` with `max_fanout` 8, thread `i` through `stores[i % stores.len()]`.
/// Exactly 8 must be admitted and 92 refused with `QuotaFanout`.
fn fanout_bomb(path: &Path, stores: &[&SqliteStore]) {
    let t = tenant("bomb");
    let q = quotas(3, 8, 64);
    running_q(stores[0], &t, "p", None, &q);
    let barrier = Barrier::new(BOMB);
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..BOMB {
            let (store, t, q, barrier, outcomes) =
                (stores[i % stores.len()], &t, &q, &barrier, &outcomes);
            s.spawn(move || {
                let new = new_agent(t, &format!("c{i}"), Some("p"), &format!("sup-{}", i % 2));
                let events = spawn_events(&new);
                barrier.wait();
                let r = store.admit_with_quotas(&new, q, &events);
                outcomes.lock().unwrap().push((i, r));
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for (i, r) in outcomes {
        match r {
            Ok(a) => admitted.push(a.name.to_string()),
            Err(StoreError::Refused {
                code: Code::QuotaFanout,
                message,
            }) => {
                assert!(
                    message.contains("already has 8 unfinished children"),
                    "{message}"
                );
                refused += 1;
            }
            Err(e) => panic!("creation c{i}: expected admission or QuotaFanout, got {e}"),
        }
    }
    assert_eq!((admitted.len(), refused), (8, 92), "admitted {admitted:?}");
    // The file agrees, read through a fresh connection: 8 children, 8 edges, 8
    // channels, and the events of p's start and of 8 creations, nothing more.
    let mut kids: Vec<String> = stores[0]
        .children(&t, &name("p"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    kids.sort();
    admitted.sort();
    assert_eq!(kids, admitted);
    let counts = rows(path, &t);
    let want = [
        ("tenants", 1),
        ("agents", 9),
        ("edges", 8),
        ("runs", 9),
        ("channels", 8),
        ("events", 2 + 2 * 8),
        ("messages", 0),
        ("tenant_quotas", 0),
    ];
    assert_eq!(counts, want);
}

#[test]
fn fanout_bomb_on_one_store_admits_exactly_max_fanout() {
    let (_dir, path, store) = fresh();
    fanout_bomb(&path, &[&store]);
}

#[test]
fn fanout_bomb_on_two_stores_sharing_the_file_admits_exactly_max_fanout() {
    // Two stores opened separately: two connections to the file, as two
    // supervisor processes would have; only SQLite's lock orders them.
    let (_dir, path, one) = fresh();
    let two = SqliteStore::open(&path).unwrap();
    fanout_bomb(&path, &[&one, &two]);
}

/// Concurrent admissions share group commits, each in its own savepoint: half of
/// 100 fail late (an event names an agent that does not exist, after the agent,
/// run, edge and channel rows are written), and each of those must roll back
/// alone while the others commit. The event log stays gapless, and every
/// admitted agent is what the file holds.
#[test]
fn a_failing_admission_in_a_group_commit_rolls_back_alone() {
    let (_dir, path, store) = fresh();
    let t = tenant("group");
    let q = Quotas::CEILINGS;
    running_q(&store, &t, "p", None, &q);
    let before = rows(&path, &t);
    let barrier = Barrier::new(BOMB);
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..BOMB {
            let (store, t, q, barrier, outcomes) = (&store, &t, &q, &barrier, &outcomes);
            s.spawn(move || {
                let new = new_agent(t, &format!("c{i}"), Some("p"), "sup");
                let mut events = spawn_events(&new);
                if i % 2 == 1 {
                    events.push(conformance::event(&name("ghost"), None, "agent.note"));
                }
                barrier.wait();
                let r = store.admit_with_quotas(&new, q, &events);
                outcomes.lock().unwrap().push((i, r));
            });
        }
    });
    for (i, r) in outcomes.into_inner().unwrap() {
        match (i % 2, r) {
            (0, Ok(a)) => assert_eq!(Some(a), store.agent(&t, &name(&format!("c{i}"))).unwrap()),
            (1, Err(StoreError::NotFound { name, .. })) => {
                assert_eq!(name, "ghost");
                assert_eq!(
                    store
                        .agent(&t, &conformance::name(&format!("c{i}")))
                        .unwrap(),
                    None
                );
            }
            (_, r) => panic!("creation c{i}: unexpected {r:?}"),
        }
    }
    let half = i64::try_from(BOMB / 2).unwrap();
    let grew: Vec<(&str, i64)> = rows(&path, &t)
        .into_iter()
        .zip(before)
        .map(|((table, after), (_, was))| (table, after - was))
        .collect();
    let want = [
        ("tenants", 0),
        ("agents", half),
        ("edges", half),
        ("runs", half),
        ("channels", half),
        ("events", 2 * half),
        ("messages", 0),
        ("tenant_quotas", 0),
    ];
    assert_eq!(grew, want);
    let seqs: Vec<i64> = store
        .events(&t, 0, None, 10_000)
        .unwrap()
        .into_iter()
        .map(|e| e.seq)
        .collect();
    let gapless: Vec<i64> = (1..=i64::try_from(seqs.len()).unwrap()).collect();
    assert_eq!(seqs, gapless);
}

// ---- tenant overrides ---------------------------------------------------------------

#[test]
fn tenant_quota_overrides_persist_across_reopening() {
    let (_dir, path, store) = fresh();
    let t = tenant("acme");
    let other = tenant("other");
    assert_eq!(store.tenant_quotas(&t).unwrap(), TenantQuotas::default());
    // A tenant with no agents yet may be given quotas.
    store.set_tenant_quota(&t, "max_fanout", 2).unwrap();
    store.set_tenant_quota(&t, "max_depth", 40).unwrap();
    store.set_tenant_quota(&t, "max_depth", 7).unwrap();
    store
        .set_tenant_quota(&t, "max_concurrent", u32::MAX)
        .unwrap();
    store.set_tenant_quota(&other, "max_tree_size", 0).unwrap();

    for key in ["max_fanuot", "MAX_DEPTH", "", "max_depth;"] {
        let before = store.tenant_quotas(&t).unwrap();
        let (code, message) = refusal(store.set_tenant_quota(&t, key, 1));
        assert_eq!(code, Code::BadRequest);
        assert!(message.contains(&format!("{key:?}")), "{message}");
        assert!(message.contains("acme"), "{message}");
        assert_eq!(store.tenant_quotas(&t).unwrap(), before);
    }
    drop(store);

    let store = SqliteStore::open(&path).unwrap();
    let want = TenantQuotas {
        max_depth: Some(7),
        max_fanout: Some(2),
        max_tree_size: None,
        max_concurrent: Some(u32::MAX),
    };
    assert_eq!(store.tenant_quotas(&t).unwrap(), want);
    assert_eq!(
        store.tenant_quotas(&other).unwrap(),
        TenantQuotas {
            max_tree_size: Some(0),
            ..TenantQuotas::default()
        }
    );
    // Stored as asked, clamped when used.
    let effective = QuotaConfig::default().effective(Some(&want));
    assert_eq!(
        effective,
        Quotas {
            max_depth: 7,
            max_fanout: 2,
            max_tree_size: 64,
            max_concurrent: 4096,
        }
    );
    // And the stored overrides are what admission then enforces.
    running_q(&store, &t, "r", None, &effective);
    admit_q(&store, &t, "a", Some("r"), &effective);
    admit_q(&store, &t, "b", Some("r"), &effective);
    refused(
        &store,
        &path,
        &t,
        "c",
        Some("r"),
        &effective,
        Code::QuotaFanout,
    );
}

// ---- cycles -----------------------------------------------------------------------

#[test]
fn ancestor_or_self_on_a_three_level_tree() {
    let (_dir, path, store) = fresh();
    let t = tenant("cycle");
    let q = quotas(5, 10, 100);
    running_q(&store, &t, "r", None, &q);
    running_q(&store, &t, "a", Some("r"), &q);
    running_q(&store, &t, "s", Some("r"), &q);
    admit_q(&store, &t, "b", Some("a"), &q);
    running_q(&store, &t, "r2", None, &q);
    let is = |candidate: &str, agent: &str| {
        store
            .is_ancestor_or_self(&t, &name(candidate), &name(agent))
            .unwrap()
    };
    // Itself and every ancestor...
    assert!(is("b", "b") && is("a", "b") && is("r", "b"));
    assert!(is("r", "a") && is("r", "r"));
    // ...and nothing else: not a descendant, a sibling, an uncle, another tree,
    // an unknown name.
    assert!(!is("b", "a") && !is("b", "r") && !is("a", "r"));
    assert!(!is("s", "a") && !is("s", "b") && !is("a", "s"));
    assert!(!is("r2", "b") && !is("b", "r2"));
    assert!(!is("ghost", "b"));
    // The same name in another tenant is not this one's ancestor.
    let t2 = tenant("cycle2");
    running_q(&store, &t2, "x", None, &q);
    assert!(matches!(
        store.is_ancestor_or_self(&t2, &name("x"), &name("x")),
        Ok(true)
    ));
    assert!(matches!(
        store.is_ancestor_or_self(&t2, &name("r"), &name("x")),
        Ok(false)
    ));
    // An unknown agent is an error, not "no cycle".
    match store.is_ancestor_or_self(&t, &name("r"), &name("ghost")) {
        Err(StoreError::NotFound { tenant, name }) => {
            assert_eq!((tenant.as_str(), name.as_str()), ("cycle", "ghost"));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }

    // A parent chain that loops (only corruption makes one) is reported as such.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE agents SET parent = 'b' WHERE tenant = 'cycle' AND name = 'r'",
        [],
    )
    .unwrap();
    // The candidate on the loop is still found...
    assert!(is("a", "b"));
    // ...one off the loop is not, and the walk says why it gave up.
    match store.is_ancestor_or_self(&t, &name("s"), &name("b")) {
        Err(StoreError::Corrupt { what, value }) => {
            assert_eq!(what, "agents.parent");
            assert!(value.contains("loop"), "{value}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

// ---- migration and plans ------------------------------------------------------------

#[test]
fn a_version_1_file_is_migrated_and_its_agents_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        // The file as a build with only migration 1 left it: a root running with
        // two queued children and one finished one.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(include_str!("../src/schema/0001_init.sql"))
            .unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, \
               applied_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_migrations VALUES (1, 0);
             INSERT INTO tenants (id, next_seq, created_ms) VALUES ('old', 1, 0);
             INSERT INTO agents (tenant, name, parent, customer, root, depth, session, protocol,
               spec, status, detail, run, supervisor, created_ms, updated_ms) VALUES
               ('old', 'r', NULL, NULL, 'r', 0, 'default', 'brood', '{}', 'running', NULL,
                '0190a0a0-0000-7000-8000-000000000001', 'sup', 1, 1),
               ('old', 'k1', 'r', NULL, 'r', 1, 'default', 'brood', '{}', 'queued', NULL,
                '0190a0a0-0000-7000-8000-000000000002', 'sup', 2, 2),
               ('old', 'k2', 'r', NULL, 'r', 1, 'default', 'brood', '{}', 'queued', NULL,
                '0190a0a0-0000-7000-8000-000000000003', 'sup', 3, 3),
               ('old', 'k3', 'r', NULL, 'r', 1, 'default', 'brood', '{}', 'completed', NULL,
                '0190a0a0-0000-7000-8000-000000000004', 'sup', 4, 4);
             INSERT INTO runs (id, tenant, agent, seq, created_ms) VALUES
               ('0190a0a0-0000-7000-8000-000000000001', 'old', 'r', 1, 1),
               ('0190a0a0-0000-7000-8000-000000000002', 'old', 'k1', 1, 2),
               ('0190a0a0-0000-7000-8000-000000000003', 'old', 'k2', 1, 3),
               ('0190a0a0-0000-7000-8000-000000000004', 'old', 'k3', 1, 4);
             INSERT INTO edges (tenant, parent, child, created_ms) VALUES
               ('old', 'r', 'k1', 2), ('old', 'r', 'k2', 3), ('old', 'r', 'k3', 4);
             INSERT INTO channels (tenant, parent, parent_session, child, child_session,
               handoff, result) VALUES
               ('old', 'r', 'default', 'k1', 'default', 'task', NULL),
               ('old', 'r', 'default', 'k2', 'default', 'task', NULL),
               ('old', 'r', 'default', 'k3', 'default', 'task', 'done');",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let versions: Vec<i64> = conn
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Every migration since, in order.
    let all: Vec<i64> = (1..=brood_store::sqlite::MIGRATION_COUNT as i64).collect();
    assert_eq!(versions, all);
    let t = tenant("old");
    // The partial index was built over the old rows (and built again, respelt,
    // by migration 5): two unfinished children.
    refused(
        &store,
        &path,
        &t,
        "k4",
        Some("r"),
        &quotas(3, 2, 64),
        Code::QuotaFanout,
    );
    // And the finished one counts for the tree: 4 agents.
    refused(
        &store,
        &path,
        &t,
        "k4",
        Some("r"),
        &quotas(3, 3, 4),
        Code::QuotaTreeSize,
    );
    admit_q(&store, &t, "k4", Some("r"), &quotas(3, 3, 5));
}

#[test]
fn the_counts_and_the_walk_read_indexes() {
    let (_dir, _path, store) = fresh();
    let plans = store.query_plans().unwrap();
    let steps = |name: &str| -> Vec<String> {
        plans
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no plan named {name}"))
            .steps
            .clone()
    };
    let uses = |name: &str, what: &str| {
        let s = steps(name);
        assert!(s.iter().any(|step| step.contains(what)), "{name}: {s:?}");
        assert!(
            !s.iter().any(|step| step.starts_with("SCAN agents")),
            "{name}: {s:?}"
        );
    };
    uses(
        "fanout",
        "COVERING INDEX agents_unfinished_by_parent (tenant=? AND parent=?)",
    );
    uses(
        "tree_size",
        "COVERING INDEX agents_by_root (tenant=? AND root=?)",
    );
    uses(
        "ancestor_or_self",
        "sqlite_autoindex_agents_1 (tenant=? AND name=?)",
    );
}

/// Ten admissions at once, alternating between two stores on one file (as two
/// supervisors sharing the store would), released together by a barrier.
fn race(
    one: &dyn Store,
    two: &dyn Store,
    q: &Quotas,
    new: impl Fn(usize) -> brood_store::NewAgent,
) -> Vec<brood_store::Result<brood_store::Agent>> {
    let barrier = Barrier::new(10);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..10 {
            let store = if i % 2 == 0 { one } else { two };
            let new = new(i);
            let (barrier, results) = (&barrier, &results);
            s.spawn(move || {
                barrier.wait();
                let r = store.admit_with_quotas(&new, q, &spawn_events(&new));
                results.lock().unwrap().push(r);
            });
        }
    });
    results.into_inner().unwrap()
}

/// How many were admitted, and how many refused with `code`.
fn tally(results: &[brood_store::Result<brood_store::Agent>], code: Code) -> (usize, usize) {
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::Refused { code: c, .. }) if *c == code))
        .count();
    (results.iter().filter(|r| r.is_ok()).count(), refused)
}

/// `create_limit` is counted inside the admission transaction: 10 children of
/// a parent whose run may create 3, through two stores on one file at once
/// (as two supervisors sharing the store would), admit exactly 3.
#[test]
fn create_limit_holds_across_two_stores_at_once() {
    let (_dir, path, one) = fresh();
    let two = SqliteStore::open(&path).unwrap();
    let t = tenant("create-limit");
    let q = Quotas::CEILINGS;
    let mut p = new_agent(&t, "p", None, "sup");
    p.spec = r#"{"argv":["x"],"policy":{"create_limit":3}}"#.to_owned();
    let p = one.admit_with_quotas(&p, &q, &[]).unwrap();
    start(&one, &p);
    let results = race(&one, &two, &q, |i| {
        new_agent(&t, &format!("c{i}"), Some("p"), "sup")
    });
    assert_eq!(tally(&results, Code::CreateLimit), (3, 7), "{results:?}");
    assert_eq!(one.children(&t, &name("p")).unwrap().len(), 3);
}

/// The budget reservation is part of the admission transaction: 10 children of a
/// parent with `cost_limit` 1.0, each asking 0.3, through two stores on one file
/// at once, admit exactly 3; spend and an ended child's return are counted.
#[test]
fn budget_reservations_hold_across_two_stores_at_once() {
    let (_dir, path, one) = fresh();
    let two = SqliteStore::open(&path).unwrap();
    let t = tenant("budget");
    let q = Quotas::CEILINGS;
    let with_limit = |n: &str, parent: Option<&str>, limit: f64| {
        let mut a = new_agent(&t, n, parent, "sup");
        a.spec = format!(r#"{{"argv":["x"],"policy":{{"cost_limit":{limit}}}}}"#);
        a
    };
    let p = one
        .admit_with_quotas(&with_limit("p", None, 1.0), &q, &[])
        .unwrap();
    start(&one, &p);
    let results = race(&one, &two, &q, |i| {
        with_limit(&format!("c{i}"), Some("p"), 0.3)
    });
    assert_eq!(tally(&results, Code::BudgetExceeded), (3, 7), "{results:?}");
    // 1.0 - 3 * 0.3 = 0.1 left: a child asking 0.1 fits, one asking 0.2 does not.
    let refuse = |new: brood_store::NewAgent| {
        let before = rows(&path, &t);
        let (code, msg) = refusal(one.admit_with_quotas(&new, &q, &[]));
        assert_eq!(code, Code::BudgetExceeded, "{msg}");
        assert_eq!(rows(&path, &t), before, "nothing written: {msg}");
        msg
    };
    let msg = refuse(with_limit("big", Some("p"), 0.2));
    assert!(msg.contains("remaining budget"), "{msg}");
    // One child spends 0.05 of its 0.3 and ends: 0.25 returns, 0.05 stays spent.
    let kid = results
        .iter()
        .find_map(|r| r.as_ref().ok())
        .unwrap()
        .clone();
    let kid = start(&one, &kid);
    one.record_usage(&t, &kid.run, 1, 1, 0.05).unwrap();
    end(&one, &kid, Terminal::Completed, None);
    // Left: 1.0 - 0.05 spent - 2 * 0.3 held = 0.35.
    one.admit_with_quotas(&with_limit("fits", Some("p"), 0.35), &q, &[])
        .unwrap();
    refuse(with_limit("over", Some("p"), 0.01));
}
