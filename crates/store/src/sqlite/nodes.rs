//! [`Nodes`] on SQLite: the shared logic (`crate::nodes`), each write one
//! `BEGIN IMMEDIATE` transaction (which already keeps two claims or takes
//! apart, so no row lock is asked for).

use super::SqliteStore;
use crate::contract::Nodes;
use crate::nodes::{self, d_take_inbox, q_nodes, q_placed};
use crate::types::{Agent, Inbound, NewNode, Node, Result};
use brood_core::{AgentName, TenantId};

const U_HEARTBEAT: &str = "UPDATE nodes SET heartbeat_ms = MAX(heartbeat_ms, ?2) WHERE id = ?1";
const Q_PLACED: &str = q_placed!("", "");
const D_TAKE_INBOX: &str = d_take_inbox!("");
const Q_NODES: &str = q_nodes!("");

impl Nodes for SqliteStore {
    fn register_node(&self, node: &NewNode, now_ms: i64) -> Result<Node> {
        nodes::check_labels(node)?;
        self.write(|tx| nodes::register(tx, node, now_ms))
    }

    fn heartbeat_node(&self, id: &str, now_ms: i64) -> Result<()> {
        self.write(|tx| nodes::heartbeat(tx, U_HEARTBEAT, id, now_ms))
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.write(|tx| nodes::leave(tx, id))
    }

    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>> {
        self.write(|tx| nodes::claim_placed(tx, Q_PLACED, tenant, node, limit))
    }

    fn replace_queued(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        from: &str,
        to: &str,
    ) -> Result<bool> {
        self.write(|tx| nodes::replace_queued(tx, tenant, name, from, to))
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
        self.write(|tx| nodes::post_input(tx, tenant, agent, host, sender, text, now_ms))
    }

    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>> {
        self.write(|tx| nodes::take_inputs(tx, D_TAKE_INBOX, tenant, host, limit))
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.read(|conn| nodes::nodes(conn, Q_NODES))
    }
}
