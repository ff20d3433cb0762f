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

// One test per conformance case, each on a database of its own.
conformance::conformance_tests!(fresh());

#[test]
fn the_whole_suite_runs_on_one_shared_database() {
    let (_db, store) = fresh();
    conformance::conformance(&store);
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
