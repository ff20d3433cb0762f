//! Budgets, leases and sweepers (SPEC 9) on SQLite: the SQL of spend over a
//! subtree, and the shared lease and sweepers (`crate::sweeps`), each write
//! one `BEGIN IMMEDIATE` transaction. The lease's holder is made exclusive
//! by an operating-system lock on a file beside the store (the runtime's),
//! so the lease row is read as it is.

use super::{SqliteStore, append_events_tx, end_run_tx, mark_stopping_tx};
use crate::contract::Sweeps;
use crate::db::Db as _;
use crate::sweeps::{self, Q_LEASE};
use crate::types::Agent;
use crate::types::Fence;
use crate::types::NewEvent;
use crate::types::Result;
use crate::types::RunEnd;
use brood_core::AgentName;
use brood_core::TenantId;
use brood_core::Terminal;

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
impl Sweeps for SqliteStore {
    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        self.write(|tx| sweeps::acquire_lease(tx, name, holder, now_ms))
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.read(|conn| sweeps::lease(conn, name))
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| sweeps::overdue(conn, now_ms, limit))
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| sweeps::orphans(conn, limit))
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
            sweeps::check_fence(tx, Q_LEASE, fence)?;
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
            sweeps::check_fence(tx, Q_LEASE, fence)?;
            let agent = tx.must_agent(tenant, name)?;
            end_run_tx(tx, tenant, name, &agent.run, end, events)
        })
    }
}
