//! The nodes sharing the store (`Nodes`, issue 15) on PostgreSQL, with the
//! SQLite store's SQL (`GREATEST` for SQLite's two-argument `MAX`).

use super::rows::{narrow, narrow_opt};
use super::{PgStore, Tx};
use crate::contract::Nodes;
use crate::sqlite::nodes::{D_NODE, Q_NODES, U_NODE, check_labels, node_missing};
use crate::types::{NewNode, Node, Result};

const U_HEARTBEAT: &str =
    "UPDATE nodes SET heartbeat_ms = GREATEST(heartbeat_ms, ?2) WHERE id = ?1";

impl Nodes for PgStore {
    fn register_node(&self, node: &NewNode, now_ms: i64) -> Result<Node> {
        check_labels(node)?;
        self.write_any(|db| {
            db.exec(
                U_NODE,
                &[
                    &node.id,
                    &node.address,
                    &node.labels,
                    &node.capacity.map(i64::from),
                    &now_ms,
                ],
            )?;
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
        let n = self.write_any(|db| db.exec(U_HEARTBEAT, &[&id, &now_ms]))?;
        if n == 0 {
            return Err(node_missing(id));
        }
        Ok(())
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.write_any(|db| db.exec(D_NODE, &[&id]))?;
        Ok(())
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.read(|db| {
            // Ids in byte order, as SQLite orders them (not the database's
            // collation).
            db.query(
                &Q_NODES.replace("ORDER BY n.id", "ORDER BY n.id COLLATE \"C\""),
                &[],
            )?
            .iter()
            .map(|r| -> Tx<Node> {
                Ok(Node {
                    id: r.try_get(0)?,
                    address: r.try_get(1)?,
                    labels: r.try_get(2)?,
                    capacity: narrow_opt(r, 3, "nodes.capacity")?,
                    started_ms: r.try_get(4)?,
                    heartbeat_ms: r.try_get(5)?,
                    live_agents: narrow(r, 6, "nodes.live_agents")?,
                })
            })
            .collect()
        })
    }
}
