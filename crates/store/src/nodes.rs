//! The nodes sharing the store (issue 15, [`crate::Nodes`]), written once
//! for both stores over [`Db`]: registering, heartbeats, leaving, claiming
//! the agents placed on a node, and the inbox of inputs between nodes.
//! What only one store can say comes from its `Statements` (the macros
//! below build both stores' texts): its clock, PostgreSQL's
//! `FOR UPDATE SKIP LOCKED` (two nodes never claim or take one row, and
//! never wait on each other) and its byte-order collation (`COLLATE "C"`,
//! SQLite's order).
//!
//! Node expiry is judged on the store's clock (issue 28): a heartbeat is
//! written with the store's time, and the nodes are read with each
//! heartbeat's age on that same clock, so no node's own clock enters the
//! judgement. Two machines whose clocks differ by more than the expiry
//! would otherwise declare each other lost, or never expire a dead one.
//! Each dialect reads its clock its own way (`$now` in the macros below).

use brood_core::{AgentName, Code, TenantId};

use crate::db::{Db, Row, agent_at, int, narrow, parse};
use crate::types::{Agent, Inbound, NewNode, Node, StoreError};

const D_NODE: &str = "DELETE FROM nodes WHERE id = ?1";
const U_CLAIM: &str =
    "UPDATE agents SET supervisor = ?4 WHERE tenant = ?1 AND name = ?2 AND supervisor = ?3";
const U_REPLACE: &str = "UPDATE agents SET supervisor = ?5 \
     WHERE tenant = ?1 AND name = ?2 AND status = 'queued' AND (supervisor = ?3 OR supervisor = ?4)";
const I_INBOX: &str = "INSERT INTO inbox (tenant, host, agent, sender, text, created_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// `node` registered (again: its record replaced), started and heartbeating
/// at `$now`, the store's clock in milliseconds (one value a statement on
/// both stores, so the start and the heartbeat are the same time); returns
/// that time.
macro_rules! u_node {
    ($now:expr) => {
        concat!(
            "INSERT INTO nodes (id, address, labels, capacity, started_ms, heartbeat_ms) ",
            "VALUES (?1, ?2, ?3, ?4, ",
            $now,
            ", ",
            $now,
            ") ON CONFLICT (id) DO UPDATE SET address = excluded.address, ",
            "labels = excluded.labels, capacity = excluded.capacity, ",
            "started_ms = excluded.started_ms, heartbeat_ms = excluded.heartbeat_ms ",
            "RETURNING started_ms"
        )
    };
}
pub(crate) use u_node;

/// A node's heartbeat at `$now`, the store's clock. Its time, not the later
/// of it and the one recorded: every heartbeat is on the one clock, so the
/// latest written is the latest, and a time recorded ahead of the store's
/// (by a node on its own clock, before issue 28) must not stay, keeping a
/// dead node alive until the store's clock catches up with it.
macro_rules! u_heartbeat {
    ($now:expr) => {
        concat!("UPDATE nodes SET heartbeat_ms = ", $now, " WHERE id = ?1")
    };
}
pub(crate) use u_heartbeat;

/// Each node with the unfinished agents it runs (the partial index on
/// `agents.supervisor` holds exactly those) and its heartbeat's age at
/// `$now`, the store's clock, ordered by `$collate`d id.
macro_rules! q_nodes {
    ($collate:literal, $now:expr) => {
        concat!(
            "SELECT n.id, n.address, n.labels, n.capacity, n.started_ms, n.heartbeat_ms, ",
            "(SELECT COUNT(*) FROM agents a WHERE a.supervisor = n.id AND ",
            unfinished!("a."),
            "), ",
            $now,
            " - n.heartbeat_ms FROM nodes n ORDER BY n.id",
            $collate
        )
    };
}
pub(crate) use q_nodes;

/// The unclaimed agents placed on a node (`?2` is `placed_on(node)`),
/// oldest first, `$lock`ed as read; the partial index on
/// `agents.supervisor` holds them.
macro_rules! q_placed {
    ($collate:literal, $lock:literal) => {
        concat!(
            "SELECT ",
            agent_cols!(""),
            " FROM agents WHERE supervisor = ?2 AND tenant = ?1 AND ",
            unfinished!(),
            " ORDER BY created_ms, name",
            $collate,
            " LIMIT ?3",
            $lock
        )
    };
}
pub(crate) use q_placed;

/// Whether an unclaimed agent is placed on a node (`?2` is
/// `placed_on(node)`), and whether inputs wait for a host's agents: read
/// outside any transaction before a claim or a take, which most news finds
/// nothing for (issue 27: a cluster's nodes looked after every write any of
/// them committed, each look a transaction of four statements). A row that
/// commits after the read comes with news of its own, which looks again.
/// SQLite is told the index (its planner preferred the tenant's unfinished
/// agents, all of them); `to_pg` drops the clause on PostgreSQL.
pub(crate) const Q_ANY_PLACED: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM agents INDEXED BY agents_unfinished_by_supervisor ",
    "WHERE supervisor = ?2 AND tenant = ?1 AND ",
    unfinished!(),
    ")"
);
pub(crate) const Q_ANY_INPUT: &str =
    "SELECT EXISTS (SELECT 1 FROM inbox WHERE host = ?1 AND tenant = ?2)";

/// Whether [`claim_placed`] would find anything now.
pub(crate) fn any_placed<D: Db>(db: &D, tenant: &TenantId, node: &str) -> Result<bool, D::Err> {
    let placed = crate::placed_on(node);
    Ok(db.int(
        Q_ANY_PLACED,
        &[tenant.as_str().into(), placed.as_str().into()],
    )? != 0)
}

/// Whether [`take_inputs`] would find anything now.
pub(crate) fn any_input<D: Db>(db: &D, tenant: &TenantId, host: &str) -> Result<bool, D::Err> {
    Ok(db.int(Q_ANY_INPUT, &[host.into(), tenant.as_str().into()])? != 0)
}

/// The oldest inputs for a host's agents, taken (deleted and returned);
/// `$lock` on the rows read.
macro_rules! d_take_inbox {
    ($lock:literal) => {
        concat!(
            "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox ",
            "WHERE host = ?1 AND tenant = ?2 ORDER BY id LIMIT ?3",
            $lock,
            ") RETURNING id, agent, sender, text"
        )
    };
}
pub(crate) use d_take_inbox;

/// A new node's labels must be one JSON object of strings.
pub(crate) fn check_labels(node: &NewNode) -> Result<(), StoreError> {
    let ok = serde_json::from_str::<serde_json::Value>(&node.labels)
        .ok()
        .and_then(|v| v.as_object().map(|m| m.values().all(|x| x.is_string())))
        .unwrap_or(false);
    if ok && !node.id.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Refused {
            code: Code::BadRequest,
            message: format!(
                "node {:?}: an id, and labels as a JSON object of strings (got {})",
                node.id, node.labels
            ),
        })
    }
}

pub(crate) fn node_missing(id: &str) -> StoreError {
    StoreError::Refused {
        code: Code::NotFound,
        message: format!("no node {id} is registered"),
    }
}

/// Writes `node`'s row (after [`check_labels`]) with the store's
/// `register_node`, at the store's time; the node as registered.
pub(crate) fn register<D: Db>(db: &D, node: &NewNode) -> Result<Node, D::Err> {
    let at = db.query_one(
        D::SQL.register_node,
        &[
            (&node.id).into(),
            (&node.address).into(),
            (&node.labels).into(),
            node.capacity.map(i64::from).into(),
        ],
        |r| r.int(0),
    )?;
    Ok(Node {
        id: node.id.clone(),
        address: node.address.clone(),
        labels: node.labels.clone(),
        capacity: node.capacity,
        started_ms: at,
        heartbeat_ms: at,
        heartbeat_age_ms: 0,
        live_agents: 0,
    })
}

/// A heartbeat with the store's `heartbeat` statement, at the store's time;
/// a node that is not registered is refused.
pub(crate) fn heartbeat<D: Db>(db: &D, id: &str) -> Result<(), D::Err> {
    if db.exec(D::SQL.heartbeat, &[id.into()])? == 0 {
        return Err(node_missing(id).into());
    }
    Ok(())
}

pub(crate) fn leave<D: Db>(db: &D, id: &str) -> Result<(), D::Err> {
    db.exec(D_NODE, &[id.into()])?;
    Ok(())
}

/// The agents placed on `node` (read with the store's `placed`), now its.
pub(crate) fn claim_placed<D: Db>(
    db: &D,
    tenant: &TenantId,
    node: &str,
    limit: u32,
) -> Result<Vec<Agent>, D::Err> {
    let placed = crate::placed_on(node);
    let t = tenant.as_str();
    let mut claimed = db.query(
        D::SQL.placed,
        &[t.into(), placed.as_str().into(), int(limit)],
        |r| agent_at(r, 0),
    )?;
    for a in &mut claimed {
        db.exec(
            U_CLAIM,
            &[
                t.into(),
                a.name.as_str().into(),
                placed.as_str().into(),
                node.into(),
            ],
        )?;
        a.supervisor = node.to_owned();
    }
    Ok(claimed)
}

/// Whether queued agent `name`, on or placed on `from`, is now placed on `to`.
pub(crate) fn replace_queued<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    from: &str,
    to: &str,
) -> Result<bool, D::Err> {
    let (placed_from, placed_to) = (crate::placed_on(from), crate::placed_on(to));
    let n = db.exec(
        U_REPLACE,
        &[
            tenant.as_str().into(),
            name.as_str().into(),
            from.into(),
            placed_from.as_str().into(),
            placed_to.as_str().into(),
        ],
    )?;
    Ok(n == 1)
}

pub(crate) fn post_input<D: Db>(
    db: &D,
    tenant: &TenantId,
    agent: &AgentName,
    host: &str,
    sender: &str,
    text: &str,
    now_ms: i64,
) -> Result<(), D::Err> {
    db.exec(
        I_INBOX,
        &[
            tenant.as_str().into(),
            host.into(),
            agent.as_str().into(),
            sender.into(),
            text.into(),
            now_ms.into(),
        ],
    )?;
    Ok(())
}

/// The oldest inputs for `host`'s agents, taken with the store's
/// `take_inbox`, in the order they were posted.
pub(crate) fn take_inputs<D: Db>(
    db: &D,
    tenant: &TenantId,
    host: &str,
    limit: u32,
) -> Result<Vec<Inbound>, D::Err> {
    let params = [host.into(), tenant.as_str().into(), int(limit)];
    let mut rows = db.query(D::SQL.take_inbox, &params, |r| {
        Ok((
            r.int(0)?,
            Inbound {
                agent: parse("inbox.agent", r.text(1)?, AgentName::new)?,
                sender: r.text(2)?,
                text: r.text(3)?,
            },
        ))
    })?;
    // `RETURNING` follows no order: the posting order is the ids'.
    rows.sort_by_key(|r| r.0);
    Ok(rows.into_iter().map(|(_, i)| i).collect())
}

/// Every node with its heartbeat's age on the store's clock, read with the
/// store's `nodes`.
pub(crate) fn nodes<D: Db>(db: &D) -> Result<Vec<Node>, D::Err> {
    db.query(D::SQL.nodes, &[], |r| {
        Ok(Node {
            id: r.text(0)?,
            address: r.text(1)?,
            labels: r.text(2)?,
            capacity: r
                .int_opt(3)?
                .map(|c| narrow(c, "nodes.capacity"))
                .transpose()?,
            started_ms: r.int(4)?,
            heartbeat_ms: r.int(5)?,
            live_agents: narrow(r.int(6)?, "nodes.live_agents")?,
            heartbeat_age_ms: r.int(7)?,
        })
    })
}
