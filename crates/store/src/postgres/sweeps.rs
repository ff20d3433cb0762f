//! Leases and sweepers (SPEC 9) on PostgreSQL, ported from `sqlite::sweeps`:
//! the fenced lease, the sweepers' reads and their fenced writes.
//!
//! On SQLite an operating-system lock on a file makes a lease's holder
//! exclusive and the store only records epochs. Here the holders are on
//! different nodes, so the lease row itself orders them: taking the lease
//! is one atomic upsert that bumps the epoch (concurrent takers queue on the
//! row's lock), and a fenced write reads the row `FOR SHARE`, so a taker
//! that comes after the check waits for the write to commit; a write whose
//! epoch is stale never commits after the lease moved on.

use brood_core::{AgentName, Code, TenantId, Terminal};

use super::rows::{agent_at, collect, narrow};
use super::steps::{append_events_tx, must_agent};
use super::tx::{end_run_tx, mark_stopping_tx};
use super::{Db, PgStore, Tx, refused};
use crate::contract::Sweeps;
use crate::types::{Agent, Fence, NewEvent, Result, RunEnd};

const Q_LEASE: &str = "SELECT name, holder, epoch FROM leases WHERE name = $1";
// Inside a sweeper's write: the row stays as read until the write commits
// (an `acquire_lease` meanwhile waits for it).
const Q_LEASE_FOR_SHARE: &str = "SELECT name, holder, epoch FROM leases WHERE name = $1 FOR SHARE";
// One statement, so the epoch read back is the one this call wrote: two
// nodes taking the lease at once get one epoch each, one after the other.
const U_LEASE: &str = "INSERT INTO leases (name, holder, epoch, acquired_ms) VALUES ($1, $2, 1, $3) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leases.epoch + 1, \
     acquired_ms = excluded.acquired_ms RETURNING epoch";
// Overdue runs, through the partial index `runs_due`; the agent must still be
// on that run and neither finished nor already stopping.
const Q_OVERDUE: &str = concat!(
    "SELECT ",
    agent_cols!("agents."),
    " FROM runs JOIN agents",
    "  ON agents.tenant = runs.tenant AND agents.name = runs.agent AND agents.run = runs.id",
    " WHERE runs.deadline_ms IS NOT NULL AND runs.ended_ms IS NULL AND runs.deadline_ms <= $1",
    "  AND (agents.status = 'queued' OR agents.status = 'running' OR agents.status = 'blocked')",
    " ORDER BY runs.deadline_ms LIMIT $2"
);
// Orphans: the unfinished children (the partial index `agents_unfinished_by_parent`
// holds exactly those, so this reads the live set, not history) whose parent is
// missing or finished. Stopping ones are left out: their intent is already
// recorded. The WHERE repeats the index's predicate so the planner can use it.
const Q_ORPHANS: &str = concat!(
    "SELECT ",
    agent_cols!("c."),
    " FROM agents AS c",
    " LEFT JOIN agents AS p ON p.tenant = c.tenant AND p.name = c.parent",
    " WHERE c.parent IS NOT NULL",
    "  AND (c.status = 'queued' OR c.status = 'running' OR c.status = 'blocked'",
    "   OR c.status LIKE 'stopping/%')",
    "  AND c.status NOT LIKE 'stopping/%'",
    "  AND (p.name IS NULL OR NOT (p.status = 'queued' OR p.status = 'running'",
    "   OR p.status = 'blocked' OR p.status LIKE 'stopping/%'))",
    " LIMIT $1"
);

/// Inside a sweeper's transaction: refuse unless `fence` still names the lease's
/// holder and epoch. The lease row is read `FOR SHARE`, so it cannot move on
/// before the caller's transaction ends.
pub(crate) fn check_fence(db: &Db<'_>, fence: &Fence) -> Tx<()> {
    let now = match db.query_opt(Q_LEASE_FOR_SHARE, &[&fence.lease.as_str()])? {
        Some(r) => Some((
            r.try_get::<_, String>(1)?,
            narrow::<u64>(&r, 2, "leases.epoch")?,
        )),
        None => None,
    };
    match now {
        Some((holder, epoch)) if holder == fence.holder && epoch == fence.epoch => Ok(()),
        Some((holder, epoch)) => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: epoch {} of {} is fenced off (the lease is now epoch {epoch}, held by {holder})",
                fence.lease, fence.epoch, fence.holder
            ),
        )),
        None => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: nobody holds it (fence of {} epoch {})",
                fence.lease, fence.holder, fence.epoch
            ),
        )),
    }
}

/// A `LIMIT` as PostgreSQL takes it (a BIGINT).
fn limit_param(limit: u32) -> i64 {
    i64::from(limit)
}

impl Sweeps for PgStore {
    fn lease_lock(&self, name: &str) -> Result<crate::types::LeaseLock> {
        self.try_lease_lock(name)
    }

    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        self.break_lease(name)
    }

    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        // No tenant's lock: a lease spans tenants, and the upsert is atomic.
        self.write_any(|db| {
            let row = db.query_one(U_LEASE, &[&name, &holder, &now_ms])?;
            Ok(Fence {
                lease: name.to_owned(),
                holder: holder.to_owned(),
                epoch: narrow(&row, 0, "leases.epoch")?,
            })
        })
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.read(|db| {
            db.query_opt(Q_LEASE, &[&name])?
                .map(|r| {
                    Ok(Fence {
                        lease: r.try_get(0)?,
                        holder: r.try_get(1)?,
                        epoch: narrow(&r, 2, "leases.epoch")?,
                    })
                })
                .transpose()
        })
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.read(|db| {
            collect(db, Q_OVERDUE, &[&now_ms, &limit_param(limit)], |r| {
                agent_at(r, 0)
            })
        })
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.read(|db| collect(db, Q_ORPHANS, &[&limit_param(limit)], |r| agent_at(r, 0)))
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
            check_fence(db, fence)?;
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
            check_fence(db, fence)?;
            let agent = must_agent(db, tenant, name)?;
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
