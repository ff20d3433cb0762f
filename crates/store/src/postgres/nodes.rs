//! The nodes sharing the store (`Nodes`, issue 15) on PostgreSQL, with the
//! SQLite store's SQL (`GREATEST` for SQLite's two-argument `MAX`).

use brood_core::{AgentName, TenantId};

use super::rows::{agent_from, collect, narrow, narrow_opt};
use super::{PgStore, Tx};
use crate::contract::Nodes;
use crate::sqlite::nodes::{
    D_NODE, I_INBOX, Q_NODES, U_CLAIM, U_NODE, U_REPLACE, check_labels, node_missing,
};
use crate::types::{Agent, Inbound, NewNode, Node, Result};

/// SQLite's `Q_PLACED`, locking what it reads and skipping what another
/// claim holds: two nodes never claim one agent, and never wait on each other.
const Q_PLACED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?2 AND tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name COLLATE \"C\" LIMIT ?3 FOR UPDATE SKIP LOCKED"
);

/// The oldest inputs for a host's agents, taken: rows another take holds
/// are skipped, so each input is delivered once.
const D_TAKE_INBOX: &str = "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox \
     WHERE host = $1 AND tenant = $2 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
     RETURNING id, agent, sender, text";

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
        // One statement, committed on its own, and not announced: a
        // heartbeat every tick is no news to the other nodes.
        let n = self
            .pool
            .with(|c| c.db().exec(U_HEARTBEAT, &[&id, &now_ms]))?;
        if n == 0 {
            return Err(node_missing(id));
        }
        Ok(())
    }

    fn leave_node(&self, id: &str) -> Result<()> {
        self.write_any(|db| db.exec(D_NODE, &[&id]))?;
        Ok(())
    }

    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>> {
        let placed = crate::placed_on(node);
        let (t, limit) = (tenant.as_str(), i64::from(limit));
        let claimed = self.write_quiet(|db| {
            let mut claimed = collect(db, Q_PLACED, &[&t, &placed, &limit], agent_from)?;
            for a in &mut claimed {
                db.exec(U_CLAIM, &[&t, &a.name.as_str(), &placed, &node])?;
                a.supervisor = node.to_owned();
            }
            Ok(claimed)
        })?;
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
        let (t, n) = (tenant.as_str(), name.as_str());
        let (placed_from, placed_to) = (crate::placed_on(from), crate::placed_on(to));
        let changed = self.write(t, |db| {
            db.exec(U_REPLACE, &[&t, &n, &from, &placed_from, &placed_to])
        })?;
        Ok(changed == 1)
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
        let (t, a) = (tenant.as_str(), agent.as_str());
        self.write_any(|db| {
            db.exec(I_INBOX, &[&t, &host, &a, &sender, &text, &now_ms])?;
            Ok(())
        })
    }

    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>> {
        let (t, limit) = (tenant.as_str(), i64::from(limit));
        let mut rows = self.write_quiet(|db| {
            let rows = db.query(D_TAKE_INBOX, &[&host, &t, &limit])?;
            rows.iter()
                .map(|r| -> Tx<(i64, String, String, String)> {
                    Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))
                })
                .collect::<Tx<Vec<_>>>()
        })?;
        if !rows.is_empty() {
            self.wrote();
        }
        // `RETURNING` follows no order: the posting order is the ids'.
        rows.sort_by_key(|r| r.0);
        rows.into_iter()
            .map(|(_, agent, sender, text)| {
                Ok(Inbound {
                    agent: AgentName::new(&agent)
                        .map_err(|_| super::corrupt("inbox.agent", agent).at(self.target()))?,
                    sender,
                    text,
                })
            })
            .collect()
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
