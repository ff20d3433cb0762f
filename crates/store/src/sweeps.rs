//! The sweepers' lease and reads (SPEC 9, [`crate::Sweeps`]), written once
//! for both stores over [`Db`]: the lease taken (one upsert that bumps the
//! epoch and returns it) and read, the fenced writes (the fence checked
//! inside the sweeper's write, then a stop's intent or a run's end), the
//! overdue runs and the orphans. Each store keeps what differs: SQLite's
//! operating-system lock on a file beside the store, PostgreSQL's session
//! lock and the lease row read `FOR SHARE` (`Statements::lease_fenced`).
//!
//! On SQLite an operating-system lock on a file makes a lease's holder
//! exclusive and the store only records epochs. On PostgreSQL the holders
//! are on different nodes, so the lease row itself orders them: taking the
//! lease is one atomic upsert that bumps the epoch (concurrent takers queue
//! on the row's lock), and a fenced write reads the row `FOR SHARE`, so a
//! taker that comes after the check waits for the write to commit; a write
//! whose epoch is stale never commits after the lease moved on.

use brood_core::{AgentName, Code, TenantId, Terminal};

use crate::checks::refused;
use crate::db::{Db, Row, agent_at, int, narrow};
use crate::types::{Agent, Fence, NewEvent, RunEnd};

pub(crate) const Q_LEASE: &str = "SELECT name, holder, epoch FROM leases WHERE name = ?1";
// One statement, so the epoch read back is the one this call wrote: two
// nodes taking the lease at once get one epoch each, one after the other.
const U_LEASE: &str = "INSERT INTO leases (name, holder, epoch, acquired_ms) VALUES (?1, ?2, 1, ?3) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leases.epoch + 1, \
     acquired_ms = excluded.acquired_ms RETURNING epoch";
// Overdue runs, through the partial index of 0003_sweepers.sql; the agent must
// still be on that run and neither finished nor already stopping. (PostgreSQL
// reads it without the planner hint and plans the join itself.)
pub(crate) const Q_OVERDUE: &str = concat!(
    "SELECT ",
    agent_cols!("agents."),
    " FROM runs INDEXED BY runs_due CROSS JOIN agents",
    " WHERE runs.deadline_ms IS NOT NULL AND runs.ended_ms IS NULL AND runs.deadline_ms <= ?1",
    "  AND agents.tenant = runs.tenant AND agents.name = runs.agent AND agents.run = runs.id",
    "  AND (agents.status = 'queued' OR agents.status = 'running' OR agents.status = 'blocked')",
    " ORDER BY runs.deadline_ms LIMIT ?2"
);
// Orphans: the unfinished children (the partial index of 0002_quotas.sql holds
// exactly those, so this reads the live set, not history) whose parent is missing
// or finished. Stopping ones are left out: their intent is already recorded.
// The WHERE repeats the index's predicate so either planner can use it.
const Q_ORPHANS: &str = concat!(
    "SELECT ",
    agent_cols!("c."),
    " FROM agents AS c INDEXED BY agents_unfinished_by_parent",
    " LEFT JOIN agents AS p ON p.tenant = c.tenant AND p.name = c.parent",
    " WHERE c.parent IS NOT NULL",
    "  AND ",
    unfinished!("c."),
    "  AND c.status NOT LIKE 'stopping/%'",
    "  AND (p.name IS NULL OR NOT ",
    unfinished!("p."),
    ")",
    " LIMIT ?1"
);

fn fence_from<R: Row>(r: &R) -> Result<Fence, R::Err> {
    Ok(Fence {
        lease: r.text(0)?,
        holder: r.text(1)?,
        epoch: narrow(r.int(2)?, "leases.epoch")?,
    })
}

/// [`crate::Sweeps::acquire_lease`]: the lease's next epoch, now `holder`'s.
pub(crate) fn acquire_lease<D: Db>(
    db: &D,
    name: &str,
    holder: &str,
    now_ms: i64,
) -> Result<Fence, D::Err> {
    let params = [name.into(), holder.into(), now_ms.into()];
    let epoch = db.query_one(U_LEASE, &params, |r| r.int(0))?;
    Ok(Fence {
        lease: name.to_owned(),
        holder: holder.to_owned(),
        epoch: narrow(epoch, "leases.epoch")?,
    })
}

/// [`crate::Sweeps::lease`].
pub(crate) fn lease<D: Db>(db: &D, name: &str) -> Result<Option<Fence>, D::Err> {
    db.query_opt(Q_LEASE, &[name.into()], |r| fence_from(r))
}

/// Inside a sweeper's transaction: refuse unless `fence` still names the
/// lease's holder and epoch, read with the store's `lease_fenced` ([`Q_LEASE`],
/// or one that also locks the row).
fn check_fence<D: Db>(db: &D, fence: &Fence) -> Result<(), D::Err> {
    let params = [fence.lease.as_str().into()];
    match db.query_opt(D::SQL.lease_fenced, &params, |r| fence_from(r))? {
        Some(now) if now.holder == fence.holder && now.epoch == fence.epoch => Ok(()),
        Some(now) => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: epoch {} of {} is fenced off (the lease is now epoch {}, held by {})",
                fence.lease, fence.epoch, fence.holder, now.epoch, now.holder
            ),
        )
        .into()),
        None => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: nobody holds it (fence of {} epoch {})",
                fence.lease, fence.holder, fence.epoch
            ),
        )
        .into()),
    }
}

/// [`crate::Sweeps::overdue`].
pub(crate) fn overdue<D: Db>(db: &D, now_ms: i64, limit: u32) -> Result<Vec<Agent>, D::Err> {
    db.query(Q_OVERDUE, &[now_ms.into(), int(limit)], |r| agent_at(r, 0))
}

/// [`crate::Sweeps::orphans`].
pub(crate) fn orphans<D: Db>(db: &D, limit: u32) -> Result<Vec<Agent>, D::Err> {
    db.query(Q_ORPHANS, &[int(limit)], |r| agent_at(r, 0))
}

/// [`crate::Sweeps::sweep_stop`], inside the tenant's write: the fence,
/// then the intent recorded as `Runs::mark_stopping` does (the status read
/// there decides the write, so another end of the same run must not fall
/// in between), and the sweeper's events.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stop<D: Db>(
    db: &D,
    fence: &Fence,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<Vec<Agent>, D::Err> {
    check_fence(db, fence)?;
    let out = crate::runs::mark_stopping(db, tenant, names, outcome, now_ms)?;
    db.append_events(tenant, events, now_ms)?;
    Ok(out)
}

/// [`crate::Sweeps::sweep_end`], inside the tenant's write: the fence, then
/// the agent's current run ended as `Runs::end_run` ends it.
pub(crate) fn end<D: Db>(
    db: &D,
    fence: &Fence,
    tenant: &TenantId,
    name: &AgentName,
    end: &RunEnd,
    events: &[NewEvent],
) -> Result<Agent, D::Err> {
    check_fence(db, fence)?;
    let agent = db.must_agent(tenant, name)?;
    crate::runs::end_run(db, tenant, name, &agent.run, end, events)
}
