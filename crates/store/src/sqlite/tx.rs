//! Admission's writes on SQLite: an admission decided by the shared
//! decisions (`crate::admission`, on the transaction as it goes) and its
//! rows inserted one statement a row, inside the group commit's savepoint
//! (`SqliteStore::admit_group`). Also the sweepers' entries into the shared
//! run bodies (`crate::runs`).

use super::{I_AGENT, I_CHANNEL, I_EDGE, I_RUN, I_TENANT, Tx, insert_events_tx};
use crate::admission::{Admitted, Live, decide};
use crate::types::Agent;
use crate::types::NewAgent;
use crate::types::NewEvent;
use crate::types::RunEnd;
use brood_core::AgentName;
use brood_core::Quotas;
use brood_core::RunId;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::Terminal;
use rusqlite::Connection;

/// Admission, with the quota checks when `quotas` is given: decided on the
/// transaction, which sees the admissions before it in the group, then
/// written. The agent returned is built from the values it was inserted
/// with: reading it back cost a query and a decode of every column.
pub(super) fn admit_tx(
    tx: &Connection,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Tx<Agent> {
    let facts = Live(tx);
    let Admitted { agent, parent } = decide(&facts, new, quotas, events)?;
    let t = &new.tenant;
    tx.prepare_cached(I_TENANT)?
        .execute((t.as_str(), new.now_ms))?;
    tx.prepare_cached(I_AGENT)?.execute(rusqlite::params![
        t.as_str(),
        agent.name.as_str(),
        agent.parent.as_ref().map(AgentName::as_str),
        agent.customer.as_ref().map(AgentName::as_str),
        agent.root.as_str(),
        i64::from(agent.depth),
        agent.session.as_str(),
        agent.protocol.as_str(),
        agent.spec,
        Status::Queued.encode(),
        agent.run.as_str(),
        agent.supervisor,
        new.now_ms,
    ])?;
    tx.prepare_cached(I_RUN)?.execute((
        agent.run.as_str(),
        t.as_str(),
        agent.name.as_str(),
        1,
        new.now_ms,
    ))?;
    if let Some(p) = &parent {
        tx.prepare_cached(I_EDGE)?.execute((
            t.as_str(),
            p.name.as_str(),
            agent.name.as_str(),
            new.now_ms,
        ))?;
        tx.prepare_cached(I_CHANNEL)?.execute((
            t.as_str(),
            p.name.as_str(),
            p.session.as_str(),
            agent.name.as_str(),
            agent.session.as_str(),
            new.handoff.as_str(),
        ))?;
    }
    // Checked by `decide` already: only the numbering and the rows remain.
    insert_events_tx(tx, t, events, new.now_ms)?;
    Ok(agent)
}

/// `crate::runs::mark_stopping` on a transaction (the sweepers').
pub(super) fn mark_stopping_tx(
    tx: &Connection,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    crate::runs::mark_stopping(tx, tenant, names, outcome, now_ms)
}

/// `crate::runs::end_run` on a transaction (the sweepers').
pub(super) fn end_run_tx(
    tx: &Connection,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Tx<Agent> {
    crate::runs::end_run(tx, tenant, name, run, end, events)
}
