//! The nodes sharing the store, as the surfaces show them (issue 15).

use brood_api as api;
use brood_store::Store;

use crate::api::ApiError;

/// A node whose heartbeat is older than this is not counted alive.
pub const EXPIRY_MS: i64 = 10_000;

/// Every registered node with its load and the age of its heartbeat, on the
/// store's clock (issue 28: this node's clock may be off; the store's is the
/// one every heartbeat was written with).
pub fn list(store: &dyn Store) -> Result<api::NodeList, ApiError> {
    let nodes = store.nodes()?;
    Ok(api::NodeList {
        nodes: nodes
            .into_iter()
            .map(|n| {
                let age = n.heartbeat_age_ms.max(0);
                api::NodeView {
                    labels: serde_json::from_str(&n.labels).unwrap_or_default(),
                    id: n.id,
                    address: n.address,
                    capacity: n.capacity,
                    live_agents: n.live_agents,
                    started_ms: n.started_ms,
                    heartbeat_ms: n.heartbeat_ms,
                    heartbeat_age_ms: age,
                    alive: age < EXPIRY_MS,
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use brood_store::prelude::*;
    use brood_store::{NewNode, SqliteStore};

    use super::list;

    /// Issue 28: whether a node is alive is judged on the store's clock. A
    /// heartbeat recorded an hour behind (a node whose clock was skewed) is
    /// dead, whatever this node's clock says; the next heartbeat, on the
    /// store's clock, makes it alive again.
    #[test]
    fn a_node_is_alive_by_the_stores_clock_not_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brood.db");
        let store = SqliteStore::open(&path).unwrap();
        let id = "s1-skewed";
        let node = store
            .register_node(&NewNode {
                id: id.into(),
                address: "127.0.0.1:1".into(),
                labels: "{}".into(),
                capacity: None,
            })
            .unwrap();
        let alive = |store: &SqliteStore| list(store).unwrap().nodes[0].alive;
        assert!(alive(&store), "a node just registered is alive");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute(
                "UPDATE nodes SET heartbeat_ms = ?2 WHERE id = ?1",
                rusqlite::params![id, node.heartbeat_ms - 3_600_000],
            )
            .unwrap();
        assert!(!alive(&store), "a heartbeat an hour old is expired");
        store.heartbeat_node(id).unwrap();
        assert!(alive(&store), "a heartbeat is the store's time");
    }
}
