//! Budgets, leases and sweepers (SPEC 9): spend over a subtree, the fenced
//! lease and the sweepers' fenced writes.

use super::{
    SqliteStore, Tx, agent_at, append_events_tx, collect, end_run_tx, mark_stopping_tx, must_agent,
    refused,
};
use crate::contract::Sweeps;
use crate::types::Agent;
use crate::types::Fence;
use crate::types::NewEvent;
use crate::types::Result;
use crate::types::RunEnd;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::TenantId;
use brood_core::Terminal;
use rusqlite::OptionalExtension;
use rusqlite::Transaction;

// ---- budgets, leases and sweepers (SPEC 9) --------------------------------------

// An agent's own spend: every run of it (the (tenant, agent, seq) index).
pub(super) const Q_OWN_USAGE: &str = "SELECT COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0), \
     COALESCE(SUM(cost_usd), 0.0) FROM runs WHERE tenant = ?1 AND agent = ?2";
// Its subtree's: the walk of `Q_DESCENDANTS` (edges' primary key, level guard),
// then every run of each agent met, plus its own.
pub(super) const Q_SUBTREE_USAGE: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT ?2, 0",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name) AS (SELECT DISTINCT name FROM walk)",
    " SELECT COALESCE(SUM(runs.tokens_in), 0), COALESCE(SUM(runs.tokens_out), 0),",
    "  COALESCE(SUM(runs.cost_usd), 0.0)",
    " FROM plan CROSS JOIN runs WHERE runs.tenant = ?1 AND runs.agent = plan.name"
);
// A parent's unfinished children with their specs (the budget check), through
// the partial index of unfinished agents.
pub(super) const Q_RUN_CREATED: &str = "SELECT created_ms FROM runs WHERE id = ?1";
pub(super) const Q_CREATED_SINCE: &str = "SELECT COUNT(*) FROM agents INDEXED BY agents_by_parent \
     WHERE tenant = ?1 AND parent = ?2 AND created_ms >= ?3";
pub(super) const Q_UNFINISHED_CHILDREN_SPECS: &str = concat!(
    "SELECT name, spec FROM agents INDEXED BY agents_unfinished_by_parent",
    " WHERE tenant = ?1 AND parent = ?2 AND ",
    unfinished!()
);
pub(super) const Q_LEASE: &str = "SELECT name, holder, epoch FROM leases WHERE name = ?1";
pub(super) const U_LEASE: &str = "INSERT INTO leases (name, holder, epoch, acquired_ms) VALUES (?1, ?2, 1, ?3) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leases.epoch + 1, \
     acquired_ms = excluded.acquired_ms";
// Overdue runs, through the partial index of 0003_sweepers.sql; the agent must
// still be on that run and neither finished nor already stopping.
pub(super) const Q_OVERDUE: &str = concat!(
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
pub(super) const Q_ORPHANS: &str = concat!(
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

/// Inside a sweeper's transaction: refuse unless `fence` still names the lease's
/// holder and epoch.
pub(super) fn check_fence(tx: &Transaction<'_>, fence: &Fence) -> Tx<()> {
    let now = tx
        .prepare_cached(Q_LEASE)?
        .query_row([fence.lease.as_str()], |r| {
            Ok((r.get::<_, String>(1)?, r.get::<_, i64>(2)?))
        })
        .optional()?;
    match now {
        Some((holder, epoch)) if holder == fence.holder && epoch as u64 == fence.epoch => Ok(()),
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

impl Sweeps for SqliteStore {
    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        self.write(|tx| {
            tx.prepare_cached(U_LEASE)?
                .execute((name, holder, now_ms))?;
            let epoch: i64 = tx
                .prepare_cached(Q_LEASE)?
                .query_row([name], |r| r.get(2))?;
            Ok(Fence {
                lease: name.to_owned(),
                holder: holder.to_owned(),
                epoch: epoch as u64,
            })
        })
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(Q_LEASE)?
                .query_row([name], |r| {
                    Ok(Fence {
                        lease: r.get(0)?,
                        holder: r.get(1)?,
                        epoch: r.get::<_, i64>(2)? as u64,
                    })
                })
                .optional()?)
        })
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_OVERDUE, (now_ms, limit), |r| agent_at(r, 0)))
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_ORPHANS, [limit], |r| agent_at(r, 0)))
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
        self.write(|tx| {
            check_fence(tx, fence)?;
            let out = mark_stopping_tx(tx, tenant, names, outcome, now_ms)?;
            append_events_tx(tx, tenant, events, now_ms)?;
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
        self.write(|tx| {
            check_fence(tx, fence)?;
            let agent = must_agent(tx, tenant, name)?;
            end_run_tx(tx, tenant, name, &agent.run, end, events)
        })
    }
}
