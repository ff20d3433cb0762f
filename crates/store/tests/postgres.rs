//! The PostgreSQL store against the conformance suite (issue 15 item 1),
//! on the real server: `BROOD_TEST_POSTGRES` (an administrator's connection
//! string; default `postgres://root:brood@127.0.0.1:5432/postgres`, which
//! `.ci/setup` makes answer). Every test makes a database of its own and
//! drops it when it ends, passed or failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use brood_store::postgres::PgStore;
use brood_store_conformance as conformance;

use conformance::pg::Fresh;

fn fresh() -> (Fresh, PgStore) {
    let db = Fresh::new();
    let store = PgStore::open(&db.url).unwrap();
    (db, store)
}

/// A session of the test's own on `db`'s database, as its administrator,
/// with the runtime that drives it.
fn session_of(db: &Fresh) -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base = conformance::pg::admin_url();
    let admin = format!("{}/{}", &base[..base.rfind('/').unwrap()], db.name);
    let (other, conn) = rt
        .block_on(tokio_postgres::connect(&admin, tokio_postgres::NoTls))
        .unwrap();
    rt.spawn(conn);
    (rt, other)
}

// One test per conformance case, each on a database of its own.
conformance::conformance_tests!(fresh());

#[test]
fn the_whole_suite_runs_on_one_shared_database() {
    let (_db, store) = fresh();
    conformance::conformance(&store);
}

/// Issue 28: node expiry is judged on the store's clock (the server's), a
/// heartbeat recorded by a node whose clock was skewed written here as the
/// administrator.
#[test]
fn node_expiry_is_judged_on_the_stores_clock() {
    let (db, store) = fresh();
    conformance::node_expiry_is_judged_on_the_stores_clock(&store, &|id, ms| {
        conformance::pg::admin_on(
            &db.name,
            &format!("UPDATE nodes SET heartbeat_ms = {ms} WHERE id = '{id}'"),
        );
    });
}

#[test]
fn opening_twice_migrates_once_and_a_bad_url_is_named() {
    let (db, store) = fresh();
    drop(store);
    let again = PgStore::open(&db.url).unwrap();
    assert!(again.target().ends_with(&db.name), "{}", again.target());
    let e = PgStore::open("postgres://root:secret@127.0.0.1:1/nowhere")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("127.0.0.1:1/nowhere") && !e.contains("secret"),
        "{e}"
    );
    let e = PgStore::open("not a url at all").unwrap_err().to_string();
    assert!(e.contains("not a PostgreSQL connection string"), "{e}");
}

/// A server that cannot be reached is the store away (`is_unavailable`: the
/// API answers 503 with `Retry-After`, not 500), found by the fault
/// campaign as 500s while PostgreSQL restarted; a server that answers with
/// an error (no such database) is not away, and says so: its message and
/// SQLSTATE, not the driver's bare "db error".
#[test]
fn a_server_not_reached_is_away_and_one_that_refuses_is_not() {
    use brood_store::StoreError;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = PgStore::open(&format!("postgres://root@127.0.0.1:{closed}/nowhere")).unwrap_err();
    assert!(
        matches!(e, StoreError::PostgresUnreachable { .. }) && e.is_unavailable(),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{closed}/nowhere")) && text.contains("cannot connect"),
        "{text}"
    );

    let (db, store) = fresh();
    drop(store);
    let (head, _) = db.url.rsplit_once('/').unwrap();
    let e = PgStore::open(&format!("{head}/brood_no_such_database")).unwrap_err();
    assert!(!e.is_unavailable(), "{e:?}");
    // What the server said, not the driver's bare "db error".
    let text = e.to_string();
    assert!(
        text.contains("brood_no_such_database")
            && text.contains("does not exist")
            && text.contains("SQLSTATE 3D000"),
        "{text}"
    );
}

/// The sweepers' lease lock across nodes: one holder among every store on
/// the server; another node can break it (a holder declared lost), after
/// which the old holder knows it lost it and another takes it.
#[test]
fn the_lease_lock_has_one_holder_across_stores_and_can_be_broken() {
    use brood_store::{LeaseLock, Sweeps};
    let (db, a) = fresh();
    let b = PgStore::open(&db.url).unwrap();
    let held = match a.lease_lock("sweepers").unwrap() {
        LeaseLock::Held(h) => h,
        _ => panic!("the first store takes the lock"),
    };
    assert!(held.is_held());
    assert!(matches!(
        b.lease_lock("sweepers").unwrap(),
        LeaseLock::Taken
    ));
    // Another lease's lock is another lock.
    assert!(matches!(b.lease_lock("other").unwrap(), LeaseLock::Held(_)));
    assert!(b.break_lease_lock("sweepers").unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while held.is_held() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!held.is_held(), "the broken holder sees it lost the lock");
    assert!(matches!(
        b.lease_lock("sweepers").unwrap(),
        LeaseLock::Held(_)
    ));
    assert!(!a.break_lease_lock("nobody-holds-this").unwrap());
}

use brood_store_conformance::proxy::Proxy;

/// Issue 27: every store call has a deadline. Behind a network that goes
/// silent, a call fails past the deadline naming it, instead of waiting as
/// long as TCP retries; the connection it was on is given up, and once the
/// network is back the next call connects again and works. The server's own
/// limits (`statement_timeout`, `lock_timeout`) are set on every connection.
#[test]
fn a_store_behind_a_silent_network_fails_at_its_deadline_and_recovers() {
    use brood_store::StoreError;
    use brood_store::postgres::Options;
    use brood_store::prelude::*;
    use std::time::Duration;

    let db = Fresh::new();
    // The URL's host and port replaced by the proxy's.
    let (head, rest) = db.url.split_once('@').unwrap();
    let path = &rest[rest.find('/').unwrap()..];
    let upstream: std::net::SocketAddr = rest[..rest.find('/').unwrap()]
        .replace("localhost", "127.0.0.1")
        .parse()
        .unwrap();
    let proxy = Proxy::to(upstream);
    let url = format!("{head}@127.0.0.1:{}{path}", proxy.port);
    let store = std::sync::Arc::new(
        PgStore::open_with(
            &url,
            Options {
                connections: 1,
                call_timeout: Duration::from_secs(2),
                ..Options::default()
            },
        )
        .unwrap(),
    );
    let tenant = brood_core::TenantId::new("t").unwrap();
    let name = brood_core::AgentName::new("nobody-here").unwrap();
    assert!(store.agent(&tenant, &name).unwrap().is_none());

    proxy.go_silent(true);
    // The call runs on a thread of its own, so that a missing deadline
    // fails this test (after a minute) rather than hanging the suite.
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    let (t, n) = (tenant.clone(), name.clone());
    std::thread::spawn(move || {
        let _ = tx.send(s.agent(&t, &n));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a call behind a silent network never came back: it has no deadline");
    match r {
        Err(e @ StoreError::PostgresDeadline { .. }) => {
            let text = e.to_string();
            assert!(text.contains("no answer within 2s"), "{text}");
            assert!(
                text.contains(&format!("127.0.0.1:{}", proxy.port)),
                "{text}"
            );
        }
        other => panic!("expected the deadline's error, got {other:?}"),
    }

    proxy.go_silent(false);
    assert!(
        store.agent(&tenant, &name).unwrap().is_none(),
        "the store connects again once the network is back"
    );
    // The server's limits are on the connection (the URL named none).
    assert_eq!(store.server_setting("statement_timeout").unwrap(), "15s");
    assert_eq!(store.server_setting("lock_timeout").unwrap(), "10s");
}

/// Issue 28's campaign, round 9: a node started again after SIGKILL exited
/// at its start, its recovery ended by PostgreSQL for a deadlock with a live
/// node's recovery of the same supervisor. A transaction the server ends
/// for a conflict was rolled back whole, so the store runs it again. Here
/// the other party is a session of the test that holds the row the store's
/// write needs and then asks for the tenant's lock the write holds: the
/// server ends the store's transaction (its deadlock check comes first),
/// and the write must still be done, once.
#[test]
fn a_transaction_ended_for_a_deadlock_runs_again() {
    use brood_core::{CancelReason, Terminal};
    use brood_store::prelude::*;
    use conformance as helpers;
    let (db, store) = fresh();
    let store = std::sync::Arc::new(store);
    let t = helpers::tenant("dl");
    let a = helpers::running(&*store, &t, "a", None);
    let (rt, other) = session_of(&db);
    // The test's session: the store's transaction is the one the server
    // ends, since its deadlock check (after 1 s) comes before this one's.
    rt.block_on(other.batch_execute(
        "SET deadlock_timeout = '30s'; BEGIN; \
         UPDATE agents SET detail = 'held' WHERE tenant = 'dl' AND name = 'a'",
    ))
    .unwrap();
    let writer = {
        let (store, t, name) = (store.clone(), t.clone(), a.name.clone());
        std::thread::spawn(move || {
            store.mark_stopping(
                &t,
                &[name],
                Terminal::Cancelled(CancelReason::User),
                helpers::now(),
            )
        })
    };
    // The write holds the tenant's lock and waits for the row.
    let waiting = || {
        rt.block_on(other.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted",
            &[],
        ))
        .unwrap()
        .get::<_, i64>(0)
            == 1
    };
    let t0 = std::time::Instant::now();
    while !waiting() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the store's write never waited for the row"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Now the test's session asks for the tenant's lock: a deadlock.
    rt.block_on(
        other.batch_execute("SELECT pg_advisory_xact_lock(hashtextextended('dl', 0)); COMMIT"),
    )
    .unwrap();
    let stopped = writer.join().unwrap();
    let stopped = stopped.expect("the write ended for a deadlock is run again");
    assert_eq!(stopped.len(), 1, "{stopped:?}");
    let now = helpers::get(&*store, &t, "a");
    assert!(
        matches!(now.status, brood_core::Status::Stopping(_)),
        "{:?}",
        now.status
    );
}

/// Issue 27: on a new database a prepared statement's generic plan was made
/// while the tables were empty and never analyzed, and kept: a run's start
/// then scanned every run of the tenant, slower with every agent, until
/// autovacuum's first analyze a minute or more later. The store analyzes
/// the tables that grow with the agents once they hold more than twice
/// what their statistics say (looked at as its admissions pass 64, 128, …),
/// which also makes every connection plan its statements again.
#[test]
fn a_new_databases_growing_tables_are_analyzed_as_agents_are_admitted() {
    use conformance as helpers;
    let (db, store) = fresh();
    let t = helpers::tenant("young");
    let (rt, other) = session_of(&db);
    let tuples = |table: &str| -> f32 {
        rt.block_on(other.query_one(
            "SELECT reltuples FROM pg_class WHERE relname = $1 AND relkind = 'r'",
            &[&table],
        ))
        .unwrap()
        .get(0)
    };
    // No statistics yet (autovacuum has not been here: it visits a
    // database a minute after it was made at the earliest).
    assert_eq!(
        tuples("agents"),
        -1.0,
        "the agents table was analyzed already"
    );
    for i in 0..70 {
        helpers::running(&store, &t, &format!("a{i}"), None);
    }
    // The look runs on a thread of its own: wait for it, bounded.
    let t0 = std::time::Instant::now();
    while tuples("agents") < 64.0 || tuples("runs") < 64.0 || tuples("events") < 64.0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "after 70 admissions the statistics still say agents {}, runs {}, events {}",
            tuples("agents"),
            tuples("runs"),
            tuples("events")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Issue 27: a node's news says what its writes changed, so that the other
/// nodes look only where it concerns them: a start says events, an end
/// events and an end, an admission for this node events alone and one for
/// another node an agent placed; a write whose body says nothing (a stop
/// recorded) says everything.
#[test]
fn news_says_what_a_write_changed() {
    use brood_core::Terminal;
    use brood_store::Changed;
    use brood_store::prelude::*;
    use conformance::*;
    use std::time::Duration;

    let (db, a) = fresh();
    let b = PgStore::open(&db.url).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Changed>();
    b.hear(
        "node-b",
        std::sync::Arc::new(move |c| {
            let _ = tx.send(c);
        }),
    )
    .unwrap();
    a.hear("node-a", std::sync::Arc::new(|_| {})).unwrap();
    // The listener's first look, whatever happened before it listened.
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).unwrap(),
        Changed::ALL
    );
    // The next news heard, what `write` did (coalesced with nothing else:
    // one write at a time, each waited for).
    let heard = |write: &dyn Fn()| {
        while rx.try_recv().is_ok() {}
        write();
        rx.recv_timeout(Duration::from_secs(20)).unwrap()
    };
    let t = tenant("news");
    let here = new_agent(&t, "here", None, "node-a");
    let admitted = heard(&|| drop(a.admit(&here, &spawn_events(&here)).unwrap()));
    assert_eq!(admitted, Changed::EVENTS);
    let there = new_agent(&t, "there", None, "node-b");
    let placed = heard(&|| drop(a.admit(&there, &spawn_events(&there)).unwrap()));
    assert_eq!(placed, Changed::EVENTS | Changed::PLACED);
    let agent = get(&a, &t, "here");
    let started = heard(&|| drop(start(&a, &agent)));
    assert_eq!(started, Changed::EVENTS);
    let running = get(&a, &t, "here");
    let ended = heard(&|| drop(end(&a, &running, Terminal::Completed, None)));
    assert_eq!(ended, Changed::EVENTS | Changed::ENDS);
    let stop = heard(&|| {
        a.mark_stopping(
            &t,
            &[name("there")],
            Terminal::Cancelled(brood_core::CancelReason::User),
            now(),
        )
        .unwrap();
    });
    assert_eq!(stop, Changed::ALL);
}
