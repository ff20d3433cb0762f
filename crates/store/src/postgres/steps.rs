//! The event log on PostgreSQL, as `sqlite::steps` on SQLite: events
//! appended with the tenant's next sequence numbers, inside the caller's
//! transaction, in three round trips whatever their number. The SQL is
//! `sqlite::sql`'s, read as PostgreSQL by `db::to_pg`, but the tenant's
//! upsert.

use brood_core::{RunId, TenantId};

use super::{Db, Tx, not_found};
use tokio_postgres::types::ToSql;

use super::db::Params;
use crate::db::Known;
use crate::sqlite::sql::Q_AGENT_EXISTS;
use crate::types::{Event, NewEvent};

/// Appends `events` (each with its time) to the tenant's log with the next
/// sequence numbers, inside the caller's transaction: the agents they name
/// checked together (one round trip, skipped when this transaction read
/// them: [`Known::Read`]), then the tenant's row advanced (an upsert that
/// locks it to the end of the transaction, so the numbers have no gap or
/// repeat across the cluster) and the rows inserted by one statement, sent
/// together (one round trip whatever their number).
pub(crate) fn append_events_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    events: &[(&NewEvent, i64)],
    known: Known,
) -> Tx<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    crate::checks::check_events(events.iter().map(|(e, _)| *e))?;
    let ts = tenant.as_str();
    if known == Known::No {
        let names: Vec<&str> = events.iter().map(|(e, _)| e.agent.as_str()).collect();
        let checks: Vec<[&(dyn ToSql + Sync); 2]> =
            names.iter().map(|n| [&ts as _, n as _]).collect();
        let stmts: Vec<(&str, Params<'_>)> =
            checks.iter().map(|p| (Q_AGENT_EXISTS, &p[..])).collect();
        let found = db.pipeline(&stmts)?;
        for ((e, _), rows) in events.iter().zip(&found) {
            // The foreign key would refuse it too, with a message that names nothing.
            let exists = match rows.first() {
                Some(r) => r.try_get::<_, bool>(0)?,
                None => false,
            };
            if !exists {
                return Err(not_found(tenant, &e.agent));
            }
        }
    }
    let n = i64::try_from(events.len()).unwrap_or(i64::MAX);
    let now_ms = events.iter().map(|(_, t)| *t).max().unwrap_or_default();
    // Each event numbered back from the tenant's next number, which the
    // upsert sent before it has just advanced past them all.
    let back: Vec<i64> = (1..=n).rev().collect();
    let at: Vec<i64> = events.iter().map(|(_, t)| *t).collect();
    let agent: Vec<&str> = events.iter().map(|(e, _)| e.agent.as_str()).collect();
    let run: Vec<Option<&str>> = events
        .iter()
        .map(|(e, _)| e.run.as_ref().map(RunId::as_str))
        .collect();
    let session: Vec<&str> = events.iter().map(|(e, _)| e.session.as_str()).collect();
    let kind: Vec<&str> = events.iter().map(|(e, _)| e.kind.as_str()).collect();
    let payload: Vec<&str> = events.iter().map(|(e, _)| e.payload.as_str()).collect();
    let seq_p: [&(dyn ToSql + Sync); 3] = [&ts, &n, &now_ms];
    let events_p: [&(dyn ToSql + Sync); 8] =
        [&ts, &back, &at, &agent, &run, &session, &kind, &payload];
    let answers = db.pipeline(&[(U_TENANT_SEQ, &seq_p), (I_EVENTS, &events_p)])?;
    let next: i64 = match answers.first().and_then(|rows| rows.first()) {
        Some(r) => r.try_get(0)?,
        None => {
            return Err(crate::types::StoreError::Corrupt {
                what: "the tenant's next event number",
                value: format!("no row from {U_TENANT_SEQ}"),
            }
            .into());
        }
    };
    crate::bell::note_appended();
    Ok(crate::checks::numbered(tenant, next, events))
}

/// The events of a transaction, one statement for the lot: each numbered
/// back from the tenant's next number, which [`U_TENANT_SEQ`] has just
/// advanced past all of them in the same round trip.
pub(crate) const I_EVENTS: &str = "INSERT INTO events (tenant, seq, ts_ms, agent, run, session, kind, payload) \
     SELECT ?1, t.next_seq - u.back, u.ts, u.agent, u.run, u.session, u.kind, u.payload \
     FROM tenants t, unnest(CAST(?2 AS BIGINT[]), CAST(?3 AS BIGINT[]), CAST(?4 AS TEXT[]), \
      CAST(?5 AS TEXT[]), CAST(?6 AS TEXT[]), CAST(?7 AS TEXT[]), CAST(?8 AS TEXT[])) \
      AS u(back, ts, agent, run, session, kind, payload) \
     WHERE t.id = ?1";

/// The tenant's row, made if new, its next sequence number advanced by `$2`
/// events; the first of them is returned, and the row stays locked to the
/// end of the transaction.
pub(crate) const U_TENANT_SEQ: &str = "INSERT INTO tenants (id, next_seq, created_ms) VALUES ($1, 1 + $2::BIGINT, $3) \
     ON CONFLICT (id) DO UPDATE SET next_seq = tenants.next_seq + $2::BIGINT RETURNING next_seq - $2::BIGINT";
