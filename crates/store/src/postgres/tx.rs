//! The sweepers' entries into the shared run bodies (`crate::runs`), on a
//! transaction that holds the tenant's advisory lock (`PgStore::write`):
//! the status read there decides the write, and another node's end of the
//! same run must not fall in between.

use brood_core::{AgentName, RunId, TenantId, Terminal};

use super::{Db, Tx};
use crate::types::{Agent, NewEvent, RunEnd};

/// `crate::runs::mark_stopping` on `db`.
pub(crate) fn mark_stopping_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    crate::runs::mark_stopping(db, tenant, names, outcome, now_ms)
}

/// `crate::runs::end_run` on `db`.
pub(crate) fn end_run_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Tx<Agent> {
    crate::runs::end_run(db, tenant, name, run, end, events)
}
