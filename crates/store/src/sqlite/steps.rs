//! The event log on SQLite: events appended with the tenant's next
//! sequence numbers, inside the caller's transaction.

use super::{I_EVENT, Q_NEXT_SEQ, Tx, U_NEXT_SEQ, not_found};
use crate::db::{Db as _, Known};
use crate::types::Event;
use crate::types::NewEvent;
use brood_core::RunId;
use brood_core::TenantId;
use rusqlite::Connection;

/// Appends `events` (each with its time) to the tenant's log with the next
/// sequence numbers. Runs inside the caller's transaction, so the numbers and
/// the change they describe commit together, and `BEGIN IMMEDIATE` keeps two
/// writers from taking the same numbers. The agents they name are checked
/// unless this transaction read them ([`Known::Read`]).
pub(super) fn append_events_tx(
    tx: &Connection,
    tenant: &TenantId,
    events: &[(&NewEvent, i64)],
    known: Known,
) -> Tx<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    crate::checks::check_events(events.iter().map(|(e, _)| *e))?;
    if known == Known::No {
        for (e, _) in events {
            // The foreign key would refuse it too, with a message that names nothing.
            if !tx.exists(tenant, &e.agent)? {
                return Err(not_found(tenant, &e.agent));
            }
        }
    }
    insert_events_tx(tx, tenant, events)
}

/// [`append_events_tx`] without its checks, for events already checked
/// (an admission's, by `crate::admission::decide`).
pub(super) fn insert_events_tx(
    tx: &Connection,
    tenant: &TenantId,
    events: &[(&NewEvent, i64)],
) -> Tx<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let next: i64 = tx
        .prepare_cached(Q_NEXT_SEQ)?
        .query_row([tenant.as_str()], |r| r.get(0))?;
    let mut insert = tx.prepare_cached(I_EVENT)?;
    for (seq, (e, ts_ms)) in (next..).zip(events) {
        insert.execute((
            tenant.as_str(),
            seq,
            ts_ms,
            e.agent.as_str(),
            e.run.as_ref().map(RunId::as_str),
            e.session.as_str(),
            e.kind.as_str(),
            e.payload.as_str(),
        ))?;
    }
    crate::bell::note_appended();
    let after = next + i64::try_from(events.len()).unwrap_or(i64::MAX);
    tx.prepare_cached(U_NEXT_SEQ)?
        .execute((tenant.as_str(), after))?;
    Ok(crate::checks::numbered(tenant, next, events))
}
