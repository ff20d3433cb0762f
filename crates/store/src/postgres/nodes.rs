//! [`Nodes`] on PostgreSQL: the shared logic (`crate::nodes`) in this
//! store's transactions, with what only it says: `GREATEST` for SQLite's
//! two-argument `MAX`, rows claimed or taken `FOR UPDATE SKIP LOCKED` (two
//! nodes never claim one agent or take one input, and never wait on each
//! other), ids in byte order (`COLLATE "C"`, as SQLite orders them).

use brood_core::{AgentName, TenantId};

use super::PgStore;
use crate::contract::Nodes;
use crate::nodes::{self, d_take_inbox, q_nodes, q_placed};
use crate::types::{Agent, Inbound, NewNode, Node, Result};

const U_HEARTBEAT: &str =
    "UPDATE nodes SET heartbeat_ms = GREATEST(heartbeat_ms, ?2) WHERE id = ?1";
const Q_PLACED: &str = q_placed!(" COLLATE \"C\"", " FOR UPDATE SKIP LOCKED");
const D_TAKE_INBOX: &str = d_take_inbox!(" FOR UPDATE SKIP LOCKED");
const Q_NODES: &str = q_nodes!(" COLLATE \"C\"");

impl Nodes for PgStore {
    fn register_node(&self, node: &NewNode, now_ms: i64) -> Result<Node> {
        nodes::check_labels(node)?;
        self.write_any(|db| nodes::register(db, node, now_ms))
    }

    fn heartbeat_node(&self, id: &str, now_ms: i64) -> Result<()> {
        // One statement, committed on its own, and not announced: a
        // heartbeat every tick is no news to the other nodes.
        self.pool
            .with(|c| nodes::heartbeat(&c.db(), U_HEARTBEAT, id, now_ms))
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.write_any(|db| nodes::leave(db, id))
    }

    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>> {
        let claimed =
            self.write_quiet(|db| nodes::claim_placed(db, Q_PLACED, tenant, node, limit))?;
        if !claimed.is_empty() {
            self.wrote();
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
        self.write(tenant.as_str(), |db| {
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
        self.write_any(|db| nodes::post_input(db, tenant, agent, host, sender, text, now_ms))
    }

    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>> {
        let taken =
            self.write_quiet(|db| nodes::take_inputs(db, D_TAKE_INBOX, tenant, host, limit))?;
        if !taken.is_empty() {
            self.wrote();
        }
        Ok(taken)
    }

    fn hear(&self, me: &str, on_news: std::sync::Arc<dyn Fn() + Send + Sync>) -> Result<()> {
        if self.news.get().is_some() {
            return Ok(());
        }
        let news = super::news::start(&self.pool, me, on_news).map_err(|e| e.at(self.target()))?;
        // Two racing callers would start two announcers; the second's is
        // dropped here and its tasks find nothing to announce.
        let _ = self.news.set(news);
        Ok(())
    }

    fn nodes(&self) -> Result<Vec<Node>> {
        self.read(|db| nodes::nodes(db, Q_NODES))
    }
}
