//! The nodes sharing the store (`Nodes`, issue 15) on SQLite. The SQL is
//! shared with the PostgreSQL store.

use super::{SqliteStore, agent_at, collect, corrupt};
use crate::contract::Nodes;
use crate::types::Agent;
use crate::types::Result;
use crate::types::StoreError;
use crate::types::{Inbound, NewNode, Node};
use brood_core::AgentName;
use brood_core::Code;
use brood_core::TenantId;

pub(crate) const U_NODE: &str = "INSERT INTO nodes (id, address, labels, capacity, started_ms, heartbeat_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?5) \
     ON CONFLICT (id) DO UPDATE SET address = excluded.address, labels = excluded.labels, \
     capacity = excluded.capacity, started_ms = excluded.started_ms, heartbeat_ms = excluded.heartbeat_ms";
pub(crate) const U_HEARTBEAT: &str =
    "UPDATE nodes SET heartbeat_ms = MAX(heartbeat_ms, ?2) WHERE id = ?1";
pub(crate) const D_NODE: &str = "DELETE FROM nodes WHERE id = ?1";
/// Each node with the unfinished agents it runs (the partial index on
/// `agents.supervisor` holds exactly those).
pub(crate) const Q_NODES: &str = "SELECT n.id, n.address, n.labels, n.capacity, n.started_ms, n.heartbeat_ms, \
     (SELECT COUNT(*) FROM agents a WHERE a.supervisor = n.id AND (a.status = 'queued' OR a.status = 'running' \
      OR a.status = 'blocked' OR a.status LIKE 'stopping/%')) \
     FROM nodes n ORDER BY n.id";

/// The unclaimed agents placed on a node (`?2` is `placed_on(node)`),
/// oldest first; the partial index on `agents.supervisor` holds them.
pub(crate) const Q_PLACED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?2 AND tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name LIMIT ?3"
);
pub(crate) const U_CLAIM: &str =
    "UPDATE agents SET supervisor = ?4 WHERE tenant = ?1 AND name = ?2 AND supervisor = ?3";
pub(crate) const U_REPLACE: &str = "UPDATE agents SET supervisor = ?5 \
     WHERE tenant = ?1 AND name = ?2 AND status = 'queued' AND (supervisor = ?3 OR supervisor = ?4)";

pub(crate) const I_INBOX: &str = "INSERT INTO inbox (tenant, host, agent, sender, text, created_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const Q_INBOX: &str = "SELECT id, agent, sender, text FROM inbox \
     WHERE host = ?1 AND tenant = ?2 ORDER BY id LIMIT ?3";
const D_INBOX: &str = "DELETE FROM inbox WHERE id = ?1";

/// A new node's labels must be one JSON object of strings.
pub(crate) fn check_labels(node: &NewNode) -> std::result::Result<(), StoreError> {
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

impl Nodes for SqliteStore {
    fn register_node(&self, node: &NewNode, now_ms: i64) -> Result<Node> {
        check_labels(node)?;
        self.write(|tx| {
            tx.prepare_cached(U_NODE)?.execute(rusqlite::params![
                node.id,
                node.address,
                node.labels,
                node.capacity.map(i64::from),
                now_ms
            ])?;
            Ok(())
        })?;
        Ok(Node {
            id: node.id.clone(),
            address: node.address.clone(),
            labels: node.labels.clone(),
            capacity: node.capacity,
            started_ms: now_ms,
            heartbeat_ms: now_ms,
            live_agents: 0,
        })
    }

    fn heartbeat_node(&self, id: &str, now_ms: i64) -> Result<()> {
        let n = self.write(|tx| Ok(tx.prepare_cached(U_HEARTBEAT)?.execute((id, now_ms))?))?;
        if n == 0 {
            return Err(node_missing(id));
        }
        Ok(())
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.write(|tx| Ok(tx.prepare_cached(D_NODE)?.execute([id])?))?;
        Ok(())
    }

    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>> {
        let placed = crate::placed_on(node);
        self.write(|tx| {
            let mut claimed = collect(
                tx,
                Q_PLACED,
                rusqlite::params![tenant.as_str(), placed, i64::from(limit)],
                |r| agent_at(r, 0),
            )?;
            for a in &mut claimed {
                tx.prepare_cached(U_CLAIM)?.execute(rusqlite::params![
                    tenant.as_str(),
                    a.name.as_str(),
                    placed,
                    node
                ])?;
                a.supervisor = node.to_owned();
            }
            Ok(claimed)
        })
    }

    fn replace_queued(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        from: &str,
        to: &str,
    ) -> Result<bool> {
        let n = self.write(|tx| {
            Ok(tx.prepare_cached(U_REPLACE)?.execute(rusqlite::params![
                tenant.as_str(),
                name.as_str(),
                from,
                crate::placed_on(from),
                crate::placed_on(to)
            ])?)
        })?;
        Ok(n == 1)
    }

    fn post_input(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        host: &str,
        sender: &str,
        text: &str,
        now_ms: i64,
    ) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(I_INBOX)?.execute(rusqlite::params![
                tenant.as_str(),
                host,
                agent.as_str(),
                sender,
                text,
                now_ms
            ])?;
            Ok(())
        })
    }

    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>> {
        self.write(|tx| {
            let rows: Vec<(i64, String, String, String)> = collect(
                tx,
                Q_INBOX,
                rusqlite::params![host, tenant.as_str(), i64::from(limit)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
            let mut out = Vec::with_capacity(rows.len());
            for (id, agent, sender, text) in rows {
                tx.prepare_cached(D_INBOX)?.execute([id])?;
                out.push(Inbound {
                    agent: AgentName::new(&agent).map_err(|_| corrupt("inbox.agent", agent))?,
                    sender,
                    text,
                });
            }
            Ok(out)
        })
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.read(|conn| {
            collect(conn, Q_NODES, [], |r| {
                let capacity: Option<i64> = r.get(3)?;
                let live: i64 = r.get(6)?;
                Ok(Node {
                    id: r.get(0)?,
                    address: r.get(1)?,
                    labels: r.get(2)?,
                    capacity: capacity
                        .map(|c| {
                            u32::try_from(c).map_err(|_| corrupt("nodes.capacity", c.to_string()))
                        })
                        .transpose()?,
                    started_ms: r.get(4)?,
                    heartbeat_ms: r.get(5)?,
                    live_agents: u32::try_from(live)
                        .map_err(|_| corrupt("nodes.live_agents", live.to_string()))?,
                })
            })
        })
    }
}
