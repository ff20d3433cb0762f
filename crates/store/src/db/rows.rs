//! Decoding rows into records, written once for both stores over
//! [`Row`], refusing what no version of brood writes. Every integer column
//! is read as i64 (PostgreSQL's are all BIGINT) and narrowed with a check.

use brood_core::{AgentName, RunId, SessionName, Status, TenantId, Terminal};

use super::{Row, narrow, parse};
use crate::types::{Agent, Channel, Event, Message, Protocol, Run};

fn opt_name<R: Row>(row: &R, i: usize, what: &'static str) -> Result<Option<AgentName>, R::Err> {
    match row.text_opt(i)? {
        Some(s) => Ok(Some(parse(what, s, AgentName::new)?)),
        None => Ok(None),
    }
}

/// Reads the agent columns (`agent_cols!`: tenant, name, parent, customer,
/// root, depth, session, protocol, spec, status, detail, run, supervisor,
/// created_ms, updated_ms) starting at column `at`.
pub(crate) fn agent_at<R: Row>(row: &R, at: usize) -> Result<Agent, R::Err> {
    Ok(Agent {
        tenant: parse("agents.tenant", row.text(at)?, TenantId::new)?,
        name: parse("agents.name", row.text(at + 1)?, AgentName::new)?,
        parent: opt_name(row, at + 2, "agents.parent")?,
        customer: opt_name(row, at + 3, "agents.customer")?,
        root: parse("agents.root", row.text(at + 4)?, AgentName::new)?,
        depth: narrow(row.int(at + 5)?, "agents.depth")?,
        session: parse("agents.session", row.text(at + 6)?, SessionName::new)?,
        protocol: parse("agents.protocol", row.text(at + 7)?, |p| {
            Protocol::parse(p).ok_or(())
        })?,
        spec: row.text(at + 8)?,
        status: parse("agents.status", row.text(at + 9)?, |s| {
            Status::decode(s).ok_or(())
        })?,
        detail: row.text_opt(at + 10)?,
        run: parse("agents.run", row.text(at + 11)?, RunId::parse)?,
        supervisor: row.text(at + 12)?,
        created_ms: row.int(at + 13)?,
        updated_ms: row.int(at + 14)?,
    })
}

/// A nullable i64 column narrowed to `T`.
fn narrow_opt<R: Row, T: TryFrom<i64>>(
    row: &R,
    i: usize,
    what: &'static str,
) -> Result<Option<T>, R::Err> {
    match row.int_opt(i)? {
        Some(v) => Ok(Some(narrow(v, what)?)),
        None => Ok(None),
    }
}

/// A run row (`run_cols!`).
pub(crate) fn run_from<R: Row>(row: &R) -> Result<Run, R::Err> {
    Ok(Run {
        id: parse("runs.id", row.text(0)?, RunId::parse)?,
        tenant: parse("runs.tenant", row.text(1)?, TenantId::new)?,
        agent: parse("runs.agent", row.text(2)?, AgentName::new)?,
        seq: narrow(row.int(3)?, "runs.seq")?,
        pid: narrow_opt(row, 4, "runs.pid")?,
        cgroup: row.text_opt(5)?,
        outcome: match row.text_opt(6)? {
            Some(o) => Some(parse("runs.outcome", o, |o| Terminal::decode(o).ok_or(()))?),
            None => None,
        },
        exit_code: narrow_opt(row, 7, "runs.exit_code")?,
        result: row.text_opt(8)?,
        tokens_in: narrow(row.int(9)?, "runs.tokens_in")?,
        tokens_out: narrow(row.int(10)?, "runs.tokens_out")?,
        cost_usd: row.real(11)?,
        started_ms: row.int_opt(12)?,
        ended_ms: row.int_opt(13)?,
        created_ms: row.int(14)?,
    })
}

/// An event row: `tenant, seq, ts_ms, agent, run, session, kind, payload`.
pub(crate) fn event_from<R: Row>(row: &R) -> Result<Event, R::Err> {
    Ok(Event {
        tenant: parse("events.tenant", row.text(0)?, TenantId::new)?,
        seq: row.int(1)?,
        ts_ms: row.int(2)?,
        agent: parse("events.agent", row.text(3)?, AgentName::new)?,
        run: match row.text_opt(4)? {
            Some(r) => Some(parse("events.run", r, RunId::parse)?),
            None => None,
        },
        session: parse("events.session", row.text(5)?, SessionName::new)?,
        kind: row.text(6)?,
        payload: row.text(7)?,
    })
}

/// A message row: `tenant, agent, session, seq, run, role, content, ts_ms`.
pub(crate) fn message_from<R: Row>(row: &R) -> Result<Message, R::Err> {
    Ok(Message {
        tenant: parse("messages.tenant", row.text(0)?, TenantId::new)?,
        agent: parse("messages.agent", row.text(1)?, AgentName::new)?,
        session: parse("messages.session", row.text(2)?, SessionName::new)?,
        seq: row.int(3)?,
        run: parse("messages.run", row.text(4)?, RunId::parse)?,
        role: row.text(5)?,
        content: row.text(6)?,
        ts_ms: row.int(7)?,
    })
}

/// A channel row: `tenant, parent, parent_session, child, child_session,
/// handoff, result, <the child's status>, refs, artifacts` (the status is
/// the child agent's, joined in by the query).
pub(crate) fn channel_from<R: Row>(row: &R) -> Result<Channel, R::Err> {
    Ok(Channel {
        tenant: parse("channels.tenant", row.text(0)?, TenantId::new)?,
        parent: parse("channels.parent", row.text(1)?, AgentName::new)?,
        parent_session: parse("channels.parent_session", row.text(2)?, SessionName::new)?,
        child: parse("channels.child", row.text(3)?, AgentName::new)?,
        child_session: parse("channels.child_session", row.text(4)?, SessionName::new)?,
        handoff: row.text(5)?,
        result: row.text_opt(6)?,
        status: parse("agents.status", row.text(7)?, |s| {
            Status::decode(s).ok_or(())
        })?,
        refs: row.text_opt(8)?,
        artifacts: match row.text_opt(9)? {
            None => Vec::new(),
            Some(text) => crate::checks::decode_artifacts(&text)?,
        },
    })
}
