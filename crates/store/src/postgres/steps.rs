//! The event log on PostgreSQL, as `sqlite::steps` on SQLite: events
//! appended with the tenant's next sequence numbers, inside the caller's
//! transaction, in three round trips whatever their number. The SQL is
//! `sqlite::sql`'s, read as PostgreSQL by `db::to_pg`, but the tenant's
//! upsert.

use brood_core::{RunId, TenantId};

use super::{Db, Tx, not_found};
use tokio_postgres::types::ToSql;

use super::db::Params;
use crate::sqlite::sql::{I_EVENT, Q_AGENT_EXISTS};
use crate::types::{Event, NewEvent};

/// Appends `events` to the tenant's log with the next sequence numbers,
/// inside the caller's transaction, in three round trips whatever their
/// number: the agents they name checked together, the tenant's row advanced
/// (an upsert that locks it to the end of the transaction, so the numbers
/// have no gap or repeat across the cluster), the rows inserted together.
pub(crate) fn append_events_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    events: &[NewEvent],
    now_ms: i64,
) -> Tx<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    crate::checks::check_events(events)?;
    let ts = tenant.as_str();
    let names: Vec<&str> = events.iter().map(|e| e.agent.as_str()).collect();
    let checks: Vec<[&(dyn ToSql + Sync); 2]> = names.iter().map(|n| [&ts as _, n as _]).collect();
    let stmts: Vec<(&str, Params<'_>)> = checks.iter().map(|p| (Q_AGENT_EXISTS, &p[..])).collect();
    let found = db.pipeline(&stmts)?;
    for (e, rows) in events.iter().zip(&found) {
        // The foreign key would refuse it too, with a message that names nothing.
        let exists = match rows.first() {
            Some(r) => r.try_get::<_, bool>(0)?,
            None => false,
        };
        if !exists {
            return Err(not_found(tenant, &e.agent));
        }
    }
    let n = i64::try_from(events.len()).unwrap_or(i64::MAX);
    let next: i64 = db
        .query_one(U_TENANT_SEQ, &[&ts, &n, &now_ms])?
        .try_get(0)?;
    let rows: Vec<(i64, Option<&str>, &str, &str)> = events
        .iter()
        .zip(next..)
        .map(|(e, seq)| {
            (
                seq,
                e.run.as_ref().map(RunId::as_str),
                e.agent.as_str(),
                e.session.as_str(),
            )
        })
        .collect();
    let params: Vec<[&(dyn ToSql + Sync); 8]> = events
        .iter()
        .zip(&rows)
        .map(|(e, (seq, run, agent, session))| {
            [
                &ts as &(dyn ToSql + Sync),
                seq,
                &now_ms,
                agent,
                run,
                session,
                &e.kind,
                &e.payload,
            ]
        })
        .collect();
    let inserts: Vec<(&str, Params<'_>)> = params.iter().map(|p| (I_EVENT, &p[..])).collect();
    db.pipeline(&inserts)?;
    crate::bell::note_appended();
    Ok(crate::checks::numbered(tenant, next, now_ms, events))
}

/// The tenant's row, made if new, its next sequence number advanced by `$2`
/// events; the first of them is returned, and the row stays locked to the
/// end of the transaction.
pub(crate) const U_TENANT_SEQ: &str = "INSERT INTO tenants (id, next_seq, created_ms) VALUES ($1, 1 + $2::BIGINT, $3) \
     ON CONFLICT (id) DO UPDATE SET next_seq = tenants.next_seq + $2::BIGINT RETURNING next_seq - $2::BIGINT";
