//! The sweepers' lease across nodes (SPEC 9), what only PostgreSQL has of
//! `Sweeps` (the rest is `crate::sweeps`, written once): a session advisory
//! lock on a connection of its own, which goes with the holder's
//! connection (a dead node releases it), and the ending of another node's
//! session that holds it (`break_lease`, for a node declared lost whose
//! connection stays open).

use super::PgStore;

/// The key of a lease's session advisory lock: the lease's name hashed by
/// the server (`hashtextextended`), so every node computes the same.
const Q_LEASE_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 1))";
/// The sessions holding that lock (a bigint key is split into classid, the
/// high half, and objid, the low half), ended, each waited for up to 5 s
/// (`pg_terminate_backend`'s timeout, PostgreSQL 14): the lock is free
/// once this answers, not only asked to be (a node that takes the lease
/// right after found it still held).
const Q_BREAK_LEASE_LOCK: &str = "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
     AND l.classid::bigint = ((hashtextextended($1, 1) >> 32) & 4294967295) \
     AND l.objid::bigint = (hashtextextended($1, 1) & 4294967295) \
     AND l.pid <> pg_backend_pid()";

/// A lease's lock: a connection of its own holding the session lock; the
/// lock goes with the connection (this value dropped, the process gone, the
/// session ended by another node).
struct SessionLock {
    conn: super::Conn,
}

impl crate::types::HeldLock for SessionLock {
    fn is_held(&self) -> bool {
        !self.conn.is_closed()
    }
}

impl PgStore {
    pub(crate) fn try_lease_lock(
        &self,
        name: &str,
    ) -> crate::types::Result<crate::types::LeaseLock> {
        let target = self.pool.target.clone();
        let conn = self.pool.dedicated().map_err(|e| e.at(&target))?;
        let got: bool = conn
            .db()
            .query_one(Q_LEASE_LOCK, &[&name])
            .and_then(|r| Ok(r.try_get(0)?))
            .map_err(|e| e.at(&target))?;
        Ok(if got {
            crate::types::LeaseLock::Held(Box::new(SessionLock { conn }))
        } else {
            crate::types::LeaseLock::Taken
        })
    }

    pub(crate) fn break_lease(&self, name: &str) -> crate::types::Result<bool> {
        self.read(|db| Ok(!db.query(Q_BREAK_LEASE_LOCK, &[&name])?.is_empty()))
    }
}
