//! Unit tests of the SQLite store's internals (the contract is checked by
//! `brood-store-conformance` from `tests/store.rs`).
use super::*;
use brood_core::SessionName;

use crate::contract::{Records, Transcripts};
use crate::sweeps::Q_OVERDUE;

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("brood.db")).unwrap();
    (dir, s)
}

/// A statement with `col = ?` beside an ORDER BY is compiled once, not again
/// after every rebind (the QPSG setting of `configure`).
#[test]
fn cached_reads_are_not_prepared_again_when_rebound() {
    let (_dir, s) = store();
    let t = TenantId::new("t").unwrap();
    for i in 0..5 {
        let a = AgentName::new(&format!("a{i}")).unwrap();
        s.runs(&t, &a).unwrap();
        s.messages(&t, &a, &SessionName::default_session()).unwrap();
    }
    let conn = s.lock();
    for sql in [Q_RUNS, Q_MESSAGES] {
        let stmt = conn.prepare_cached(sql).unwrap();
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "{sql}"
        );
    }
}

/// No write of an agent row builds a temporary b-tree: the partial indexes'
/// WHERE (checked on every insert and status change) has no IN list.
#[test]
fn agent_writes_build_no_temporary_btree() {
    let (_dir, s) = store();
    let conn = s.lock();
    for sql in [
        U_STATUS,
        U_STATUS_DETAIL,
        I_AGENT,
        Q_UNFINISHED_OF,
        Q_OVERDUE,
    ] {
        // Run unbound (every parameter NULL): EXPLAIN only lists the program.
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let mut rows = stmt.raw_query();
        let mut ops: Vec<String> = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            ops.push(r.get(1).unwrap());
        }
        assert!(ops.iter().any(|o| o == "Halt"), "{sql}: {ops:?}");
        assert!(
            !ops.iter().any(|o| o == "OpenEphemeral"),
            "{sql} builds a temporary b-tree: {ops:?}"
        );
    }
}
