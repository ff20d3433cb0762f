//! The steps many transactions share, written once for both stores over
//! [`Db`]: an agent decoded, loaded, checked to exist (a run's end is
//! written by `runs::write_end`).
//! Appending events is each store's own ([`Db::append_events`]): they make
//! a different number of round trips.

use brood_core::{AgentName, RunId, SessionName, Status, TenantId};

use crate::db::{Db, Row, narrow, parse};
use crate::types::{Agent, Protocol, StoreError};

pub(crate) const Q_AGENT: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND name = ?2"
);
pub(crate) const Q_AGENT_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM agents WHERE tenant = ?1 AND name = ?2)";
pub(crate) const U_STATUS_DETAIL: &str = "UPDATE agents SET status = ?3, detail = ?4, updated_ms = ?5 \
     WHERE tenant = ?1 AND name = ?2";
pub(crate) const U_RUN_ENDED: &str = "UPDATE runs SET outcome = ?3, exit_code = ?4, result = ?5, ended_ms = ?6 \
     WHERE id = ?2 AND tenant = ?1";

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

pub(crate) fn load_agent<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
) -> Result<Option<Agent>, D::Err> {
    db.query_opt(
        Q_AGENT,
        &[tenant.as_str().into(), name.as_str().into()],
        |r| agent_at(r, 0),
    )
}

pub(crate) fn must_agent<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
) -> Result<Agent, D::Err> {
    load_agent(db, tenant, name)?.ok_or_else(|| {
        StoreError::NotFound {
            tenant: tenant.to_string(),
            name: name.to_string(),
        }
        .into()
    })
}

pub(crate) fn agent_exists<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
) -> Result<bool, D::Err> {
    let params = [tenant.as_str().into(), name.as_str().into()];
    db.query_one(Q_AGENT_EXISTS, &params, |r| r.bool(0))
}
