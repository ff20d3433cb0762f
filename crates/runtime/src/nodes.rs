//! The nodes sharing the store, as the surfaces show them (issue 15).

use brood_api as api;
use brood_core::Code;
use brood_store::Store;

use crate::api::ApiError;

/// A node whose heartbeat is older than this is not counted alive.
pub const EXPIRY_MS: i64 = 10_000;

/// Every registered node with its load and the age of its heartbeat.
pub fn list(store: &dyn Store, now_ms: i64) -> Result<api::NodeList, ApiError> {
    let nodes = store.nodes().map_err(|e| {
        tracing::error!(error = %e, "reading the nodes");
        ApiError::new(Code::Internal, "store error (see the supervisor's log)")
    })?;
    Ok(api::NodeList {
        nodes: nodes
            .into_iter()
            .map(|n| {
                let age = (now_ms - n.heartbeat_ms).max(0);
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
