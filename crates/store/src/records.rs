//! The reads and the one append of the records that are more than a query,
//! written once for both stores: a message appended at the next position
//! of its session, an agent's children (an unknown agent is an error, not
//! an empty family), the parent-death plan with its cycle checks, an
//! agent's spend, the unfinished agents of supervisors.

use brood_core::{AgentName, Code, RunId, SessionName, TenantId};

use crate::admission::Q_SUBTREE_USAGE;
use crate::checks::refused;
use crate::db::{Db, MAX_WALK_DEPTH, Row as _, Value, not_found};
use crate::types::{Agent, Message, Spend, StoreError};

// An agent's own spend: every run of it (the (tenant, agent, seq) index).
// Cast for PostgreSQL, which sums BIGINTs as NUMERIC.
const Q_OWN_USAGE: &str = "SELECT CAST(COALESCE(SUM(tokens_in), 0) AS BIGINT), \
     CAST(COALESCE(SUM(tokens_out), 0) AS BIGINT), COALESCE(SUM(cost_usd), 0.0) \
     FROM runs WHERE tenant = ?1 AND agent = ?2";

/// `Transcripts::append_message`: the position read here must still be the
/// last one when the message is inserted (the store's write lock, or the
/// tenant's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn append_message<D: Db>(
    db: &D,
    tenant: &TenantId,
    agent: &AgentName,
    session: &SessionName,
    run: &RunId,
    role: &str,
    content: &str,
    now_ms: i64,
) -> Result<Message, D::Err> {
    if !db.exists(tenant, agent)? {
        return Err(not_found(tenant, agent).into());
    }
    let (t, a, s) = (
        Value::from(tenant.as_str()),
        Value::from(agent.as_str()),
        Value::from(session.as_str()),
    );
    let r = Value::from(run.as_str());
    if db.int(D::SQL.run_of_agent, &[t, a, r])? == 0 {
        return Err(refused(
            Code::Conflict,
            format!("run {run} is not a run of agent {agent} in tenant {tenant}"),
        )
        .into());
    }
    let seq = 1 + db.int(D::SQL.last_message_seq, &[t, a, s])?;
    db.exec(
        D::SQL.insert_message,
        &[
            t,
            a,
            s,
            Value::from(seq),
            r,
            Value::from(role),
            Value::from(content),
            Value::from(now_ms),
        ],
    )?;
    Ok(Message {
        tenant: tenant.clone(),
        agent: agent.clone(),
        session: session.clone(),
        seq,
        run: run.clone(),
        role: role.to_owned(),
        content: content.to_owned(),
        ts_ms: now_ms,
    })
}

/// `Records::children`.
pub(crate) fn children<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
) -> Result<Vec<Agent>, D::Err> {
    // An unknown agent is an error, not an empty family: a plan built on a
    // misspelt name must not look like "no children".
    if !db.exists(tenant, name)? {
        return Err(not_found(tenant, name).into());
    }
    db.agents(
        D::SQL.children,
        &[Value::from(tenant.as_str()), Value::from(name.as_str())],
    )
}

/// `Records::unfinished_below`: one statement whatever the names' number.
pub(crate) fn unfinished_below<D: Db>(
    db: &D,
    tenant: &TenantId,
    names: &[AgentName],
) -> Result<std::collections::HashSet<AgentName>, D::Err> {
    if names.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let tops = serde_json::to_string(&names.iter().map(AgentName::as_str).collect::<Vec<_>>())
        .map_err(|e| StoreError::Corrupt {
            what: "the names of a walk",
            value: e.to_string(),
        })?;
    let found = db.query(
        D::SQL.unfinished_below,
        &[
            Value::from(tenant.as_str()),
            Value::from(tops.as_str()),
            Value::from(MAX_WALK_DEPTH),
        ],
        |r| r.text(0),
    )?;
    found
        .into_iter()
        .map(|n| {
            AgentName::new(&n).map_err(|e| {
                StoreError::Corrupt {
                    what: "edges",
                    value: format!("parent {n}: {e}"),
                }
                .into()
            })
        })
        .collect()
}

/// `Records::descendants_post_order`.
pub(crate) fn descendants_post_order<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
) -> Result<Vec<Agent>, D::Err> {
    if !db.exists(tenant, name)? {
        return Err(not_found(tenant, name).into());
    }
    let rows = db.plan(
        D::SQL.descendants,
        &[
            Value::from(tenant.as_str()),
            Value::from(name.as_str()),
            Value::from(MAX_WALK_DEPTH),
        ],
    )?;
    let corrupt = |value: String| StoreError::Corrupt {
        what: "edges",
        value,
    };
    let mut out = Vec::with_capacity(rows.len());
    for (found, level, agent) in rows {
        // A planning error changes nothing (SPEC 6 step 2): refuse the plan
        // rather than hand out an order that cannot be right.
        if level >= MAX_WALK_DEPTH || found == name.as_str() {
            return Err(corrupt(format!(
                "the edges under {tenant}/{name} have a cycle \
                 ({found} is reached again at level {level})"
            ))
            .into());
        }
        let Some(agent) = agent else {
            return Err(
                corrupt(format!("edge to {tenant}/{found}, which has no agent row")).into(),
            );
        };
        out.push(agent);
    }
    Ok(out)
}

/// `Records::spend`.
pub(crate) fn spend<D: Db>(db: &D, tenant: &TenantId, name: &AgentName) -> Result<Spend, D::Err> {
    if !db.exists(tenant, name)? {
        return Err(not_found(tenant, name).into());
    }
    let (t, n) = (Value::from(tenant.as_str()), Value::from(name.as_str()));
    let own = db.usage(Q_OWN_USAGE, &[t, n])?;
    let subtree = db.usage(Q_SUBTREE_USAGE, &[t, n, Value::from(MAX_WALK_DEPTH)])?;
    Ok(Spend { own, subtree })
}

/// `Recovery::unfinished_of`: a supervisor named twice is listed once.
pub(crate) fn unfinished_of<D: Db>(db: &D, supervisors: &[String]) -> Result<Vec<Agent>, D::Err> {
    let mut out = Vec::new();
    for (i, s) in supervisors.iter().enumerate() {
        if supervisors[..i].contains(s) {
            continue;
        }
        out.extend(db.agents(D::SQL.unfinished_of, &[Value::from(s)])?);
    }
    Ok(out)
}
