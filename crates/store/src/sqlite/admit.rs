//! Admission's writes on SQLite: an admission decided by the shared
//! decisions (`crate::admission`, on the transaction as it goes) and its
//! rows inserted one statement a row, inside the group commit's savepoint
//! (`SqliteStore::admit_group`).

use super::{I_AGENT, I_CHANNEL, I_EDGE, I_RUN, I_TENANT, Tx, insert_events_tx};
use crate::admission::{Admitted, Live, decide};
use crate::types::{Agent, NewAgent, NewEvent};
use brood_core::{AgentName, Quotas, Status};
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
    let timed: Vec<(&NewEvent, i64)> = events.iter().map(|e| (e, new.now_ms)).collect();
    insert_events_tx(tx, t, &timed)?;
    Ok(agent)
}
