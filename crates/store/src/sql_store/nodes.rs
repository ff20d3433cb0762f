//! [`Nodes`] once for every [`SqlStore`]: the shared logic (`crate::nodes`)
//! in the store's transactions. A claim or a take reads its rows with the
//! store's own statement (PostgreSQL's `FOR UPDATE SKIP LOCKED`: two nodes
//! never claim one agent or take one input, and never wait on each other;
//! SQLite's `BEGIN IMMEDIATE` already keeps them apart), and is news to the
//! other nodes only when it found something, who would otherwise look back.

use brood_core::{AgentName, TenantId};

use super::SqlStore;
use crate::contract::Nodes;
use crate::nodes;
use crate::types::{Agent, Inbound, NewNode, Node, Result};

impl<S: SqlStore> Nodes for S {
    fn register_node(&self, node: &NewNode) -> Result<Node> {
        nodes::check_labels(node)?;
        self.writing_any(|db| nodes::register(db, node))
    }

    fn heartbeat_node(&self, id: &str) -> Result<()> {
        self.writing_one(|db| nodes::heartbeat(db, id))
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.writing_any(|db| nodes::leave(db, id))
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.reading(|db| nodes::nodes(db))
    }

    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>> {
        if !self.reading(|db| nodes::any_placed(db, tenant, node))? {
            return Ok(Vec::new());
        }
        let claimed = self.writing_quiet(|db| nodes::claim_placed(db, tenant, node, limit))?;
        if !claimed.is_empty() {
            self.announce();
        }
        Ok(claimed)
    }

    fn replace_queued(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        from: &str,
        to: &str,
    ) -> Result<bool> {
        self.writing(tenant, |db| {
            nodes::replace_queued(db, tenant, name, from, to)
        })
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
        self.writing_any(|db| nodes::post_input(db, tenant, agent, host, sender, text, now_ms))
    }

    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>> {
        if !self.reading(|db| nodes::any_input(db, tenant, host))? {
            return Ok(Vec::new());
        }
        let taken = self.writing_quiet(|db| nodes::take_inputs(db, tenant, host, limit))?;
        if !taken.is_empty() {
            self.announce();
        }
        Ok(taken)
    }

    fn hear(
        &self,
        me: &str,
        on_news: std::sync::Arc<dyn Fn(crate::Changed) + Send + Sync>,
    ) -> Result<()> {
        SqlStore::hear(self, me, on_news)
    }
}
