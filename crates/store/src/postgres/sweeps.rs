//! Leases and sweepers (SPEC 9) on PostgreSQL: the shared lease, reads and
//! fenced writes (`crate::sweeps`) in this store's transactions, and what
//! only it has: the lease's session lock and the fence's read `FOR SHARE`.
//!
//! On SQLite an operating-system lock on a file makes a lease's holder
//! exclusive and the store only records epochs. Here the holders are on
//! different nodes, so the lease row itself orders them: taking the lease
//! is one atomic upsert that bumps the epoch (concurrent takers queue on the
//! row's lock), and a fenced write reads the row `FOR SHARE`, so a taker
//! that comes after the check waits for the write to commit; a write whose
//! epoch is stale never commits after the lease moved on.

use brood_core::{AgentName, TenantId, Terminal};

use super::PgStore;
use super::steps::append_events_tx;
use super::tx::{end_run_tx, mark_stopping_tx};
use crate::contract::Sweeps;
use crate::db::Db as _;
use crate::sweeps;
use crate::types::{Agent, Fence, NewEvent, Result, RunEnd};

// Inside a sweeper's write: the row stays as read until the write commits
// (an `acquire_lease` meanwhile waits for it).
const Q_LEASE_FOR_SHARE: &str = "SELECT name, holder, epoch FROM leases WHERE name = ?1 FOR SHARE";

impl Sweeps for PgStore {
    fn lease_lock(&self, name: &str) -> Result<crate::types::LeaseLock> {
        self.try_lease_lock(name)
    }

    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        self.break_lease(name)
    }

    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        // No tenant's lock: a lease spans tenants, and the upsert is atomic.
        self.write_any(|db| sweeps::acquire_lease(db, name, holder, now_ms))
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.read(|db| sweeps::lease(db, name))
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.read(|db| sweeps::overdue(db, now_ms, limit))
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.read(|db| sweeps::orphans(db, limit))
    }

    fn sweep_stop(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Vec<Agent>> {
        // The tenant's lock, as every read-then-write on its agents takes it.
        self.write(tenant.as_str(), |db| {
            sweeps::check_fence(db, Q_LEASE_FOR_SHARE, fence)?;
            let out = mark_stopping_tx(db, tenant, names, outcome, now_ms)?;
            append_events_tx(db, tenant, events, now_ms)?;
            Ok(out)
        })
    }

    fn sweep_end(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        name: &AgentName,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(tenant.as_str(), |db| {
            sweeps::check_fence(db, Q_LEASE_FOR_SHARE, fence)?;
            let agent = db.must_agent(tenant, name)?;
            end_run_tx(db, tenant, name, &agent.run, end, events)
        })
    }
}

/// The key of a lease's session advisory lock: the lease's name hashed by
/// the server (`hashtextextended`), so every node computes the same.
const Q_LEASE_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 1))";
/// The sessions holding that lock (a bigint key is split into classid, the
/// high half, and objid, the low half).
const Q_BREAK_LEASE_LOCK: &str = "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
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
