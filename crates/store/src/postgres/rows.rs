//! Decoding rows into records, refusing what no version of brood writes;
//! the PostgreSQL twin of `sqlite::rows`. Every integer column is BIGINT and
//! read as i64, then narrowed with a check.

use brood_core::{AgentName, RunId, SessionName, Status, TenantId, Terminal};
use tokio_postgres::Row;

use super::{Db, Tx, corrupt};
use crate::types::{Agent, Artifact, Channel, Event, Message, Run};

pub(crate) fn parse_name<T>(
    what: &'static str,
    s: String,
    new: impl FnOnce(&str) -> std::result::Result<T, brood_core::NameError>,
) -> Tx<T> {
    new(&s).map_err(|_| corrupt(what, s))
}

pub(crate) fn decode_status(s: String) -> Tx<Status> {
    Status::decode(&s).ok_or_else(|| corrupt("agents.status", s))
}

/// An i64 column narrowed to `T`, or a corrupt value naming the column.
pub(crate) fn narrow<T: TryFrom<i64>>(row: &Row, i: usize, what: &'static str) -> Tx<T> {
    let v: i64 = row.try_get(i)?;
    T::try_from(v).map_err(|_| corrupt(what, v.to_string()))
}

/// [`narrow`] for a nullable column.
pub(crate) fn narrow_opt<T: TryFrom<i64>>(
    row: &Row,
    i: usize,
    what: &'static str,
) -> Tx<Option<T>> {
    let v: Option<i64> = row.try_get(i)?;
    v.map(|v| T::try_from(v).map_err(|_| corrupt(what, v.to_string())))
        .transpose()
}

pub(crate) use crate::steps::agent_at;

pub(crate) fn agent_from(row: &Row) -> Tx<Agent> {
    agent_at(row, 0)
}

pub(crate) fn run_from(row: &Row) -> Tx<Run> {
    let outcome: Option<String> = row.try_get(6)?;
    Ok(Run {
        id: parse_name("runs.id", row.try_get(0)?, RunId::parse)?,
        tenant: parse_name("runs.tenant", row.try_get(1)?, TenantId::new)?,
        agent: parse_name("runs.agent", row.try_get(2)?, AgentName::new)?,
        seq: narrow(row, 3, "runs.seq")?,
        pid: narrow_opt(row, 4, "runs.pid")?,
        cgroup: row.try_get(5)?,
        outcome: outcome
            .map(|o| Terminal::decode(&o).ok_or_else(|| corrupt("runs.outcome", o)))
            .transpose()?,
        exit_code: narrow_opt(row, 7, "runs.exit_code")?,
        result: row.try_get(8)?,
        tokens_in: narrow(row, 9, "runs.tokens_in")?,
        tokens_out: narrow(row, 10, "runs.tokens_out")?,
        cost_usd: row.try_get(11)?,
        started_ms: row.try_get(12)?,
        ended_ms: row.try_get(13)?,
        created_ms: row.try_get(14)?,
    })
}

pub(crate) fn event_from(row: &Row) -> Tx<Event> {
    let run: Option<String> = row.try_get(4)?;
    Ok(Event {
        tenant: parse_name("events.tenant", row.try_get(0)?, TenantId::new)?,
        seq: row.try_get(1)?,
        ts_ms: row.try_get(2)?,
        agent: parse_name("events.agent", row.try_get(3)?, AgentName::new)?,
        run: run
            .map(|r| parse_name("events.run", r, RunId::parse))
            .transpose()?,
        session: parse_name("events.session", row.try_get(5)?, SessionName::new)?,
        kind: row.try_get(6)?,
        payload: row.try_get(7)?,
    })
}

pub(crate) fn message_from(row: &Row) -> Tx<Message> {
    Ok(Message {
        tenant: parse_name("messages.tenant", row.try_get(0)?, TenantId::new)?,
        agent: parse_name("messages.agent", row.try_get(1)?, AgentName::new)?,
        session: parse_name("messages.session", row.try_get(2)?, SessionName::new)?,
        seq: row.try_get(3)?,
        run: parse_name("messages.run", row.try_get(4)?, RunId::parse)?,
        role: row.try_get(5)?,
        content: row.try_get(6)?,
        ts_ms: row.try_get(7)?,
    })
}

pub(crate) fn decode_artifacts(text: &str) -> Tx<Vec<Artifact>> {
    Ok(crate::checks::decode_artifacts(text)?)
}

/// A channel row: `tenant, parent, parent_session, child, child_session,
/// handoff, result, <the child's status>, refs, artifacts` (the status is
/// the child agent's, joined in by the query, as on SQLite).
pub(crate) fn channel_from(row: &Row) -> Tx<Channel> {
    Ok(Channel {
        tenant: parse_name("channels.tenant", row.try_get(0)?, TenantId::new)?,
        parent: parse_name("channels.parent", row.try_get(1)?, AgentName::new)?,
        parent_session: parse_name("channels.parent_session", row.try_get(2)?, SessionName::new)?,
        child: parse_name("channels.child", row.try_get(3)?, AgentName::new)?,
        child_session: parse_name("channels.child_session", row.try_get(4)?, SessionName::new)?,
        handoff: row.try_get(5)?,
        result: row.try_get(6)?,
        status: decode_status(row.try_get(7)?)?,
        refs: row.try_get(8)?,
        artifacts: match row.try_get::<_, Option<String>>(9)? {
            None => Vec::new(),
            Some(text) => decode_artifacts(&text)?,
        },
    })
}

/// Runs a query and decodes every row with `decode`.
pub(crate) fn collect<T>(
    db: &Db<'_>,
    sql: &str,
    params: super::db::Params<'_>,
    decode: impl Fn(&Row) -> Tx<T>,
) -> Tx<Vec<T>> {
    db.query(sql, params)?.iter().map(decode).collect()
}
