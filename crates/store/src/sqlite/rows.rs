//! Decoding rows into records, refusing what no version of brood writes.

use super::{Tx, corrupt};
use crate::types::Artifact;
use crate::types::Channel;
use crate::types::Event;
use crate::types::Message;
use crate::types::Run;
use brood_core::AgentName;
use brood_core::RunId;
use brood_core::SessionName;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::Terminal;
use rusqlite::Connection;
use rusqlite::Row;

// ---- row decoding -------------------------------------------------------------

pub(super) fn parse_name<T>(
    what: &'static str,
    s: String,
    new: impl FnOnce(&str) -> std::result::Result<T, brood_core::NameError>,
) -> Tx<T> {
    new(&s).map_err(|_| corrupt(what, s))
}

pub(super) fn decode_status(s: String) -> Tx<Status> {
    Status::decode(&s).ok_or_else(|| corrupt("agents.status", s))
}

pub(super) use crate::steps::agent_at;

pub(super) fn run_from(row: &Row<'_>) -> Tx<Run> {
    let seq: i64 = row.get(3)?;
    let pid: Option<i64> = row.get(4)?;
    let outcome: Option<String> = row.get(6)?;
    let exit_code: Option<i64> = row.get(7)?;
    let count = |i: usize, what| -> Tx<u64> {
        let v: i64 = row.get(i)?;
        u64::try_from(v).map_err(|_| corrupt(what, v.to_string()))
    };
    Ok(Run {
        id: parse_name("runs.id", row.get(0)?, RunId::parse)?,
        tenant: parse_name("runs.tenant", row.get(1)?, TenantId::new)?,
        agent: parse_name("runs.agent", row.get(2)?, AgentName::new)?,
        seq: u32::try_from(seq).map_err(|_| corrupt("runs.seq", seq.to_string()))?,
        pid: pid
            .map(|p| i32::try_from(p).map_err(|_| corrupt("runs.pid", p.to_string())))
            .transpose()?,
        cgroup: row.get(5)?,
        outcome: outcome
            .map(|o| Terminal::decode(&o).ok_or_else(|| corrupt("runs.outcome", o)))
            .transpose()?,
        exit_code: exit_code
            .map(|c| i32::try_from(c).map_err(|_| corrupt("runs.exit_code", c.to_string())))
            .transpose()?,
        result: row.get(8)?,
        tokens_in: count(9, "runs.tokens_in")?,
        tokens_out: count(10, "runs.tokens_out")?,
        cost_usd: row.get(11)?,
        started_ms: row.get(12)?,
        ended_ms: row.get(13)?,
        created_ms: row.get(14)?,
    })
}

pub(super) fn event_from(row: &Row<'_>) -> Tx<Event> {
    let run: Option<String> = row.get(4)?;
    Ok(Event {
        tenant: parse_name("events.tenant", row.get(0)?, TenantId::new)?,
        seq: row.get(1)?,
        ts_ms: row.get(2)?,
        agent: parse_name("events.agent", row.get(3)?, AgentName::new)?,
        run: run
            .map(|r| parse_name("events.run", r, RunId::parse))
            .transpose()?,
        session: parse_name("events.session", row.get(5)?, SessionName::new)?,
        kind: row.get(6)?,
        payload: row.get(7)?,
    })
}

pub(super) fn message_from(row: &Row<'_>) -> Tx<Message> {
    Ok(Message {
        tenant: parse_name("messages.tenant", row.get(0)?, TenantId::new)?,
        agent: parse_name("messages.agent", row.get(1)?, AgentName::new)?,
        session: parse_name("messages.session", row.get(2)?, SessionName::new)?,
        seq: row.get(3)?,
        run: parse_name("messages.run", row.get(4)?, RunId::parse)?,
        role: row.get(5)?,
        content: row.get(6)?,
        ts_ms: row.get(7)?,
    })
}

pub(super) fn decode_artifacts(text: &str) -> Tx<Vec<Artifact>> {
    Ok(crate::checks::decode_artifacts(text)?)
}

pub(super) fn channel_from(row: &Row<'_>) -> Tx<Channel> {
    Ok(Channel {
        tenant: parse_name("channels.tenant", row.get(0)?, TenantId::new)?,
        parent: parse_name("channels.parent", row.get(1)?, AgentName::new)?,
        parent_session: parse_name("channels.parent_session", row.get(2)?, SessionName::new)?,
        child: parse_name("channels.child", row.get(3)?, AgentName::new)?,
        child_session: parse_name("channels.child_session", row.get(4)?, SessionName::new)?,
        handoff: row.get(5)?,
        result: row.get(6)?,
        status: decode_status(row.get(7)?)?,
        refs: row.get(8)?,
        artifacts: match row.get::<_, Option<String>>(9)? {
            None => Vec::new(),
            Some(text) => decode_artifacts(&text)?,
        },
    })
}

/// Runs a cached query and decodes every row with `decode`.
pub(super) fn collect<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> Tx<T>,
) -> Tx<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(row)?);
    }
    Ok(out)
}
