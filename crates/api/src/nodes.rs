//! The nodes sharing a store (issue 15): `GET /api/nodes`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A node (a `brood serve` process) as every surface shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    /// Its supervisor id: the `supervisor` of the agents it runs.
    pub id: String,
    /// Where its API answers.
    pub address: String,
    pub labels: BTreeMap<String, String>,
    /// Agents it takes at once, when it said.
    pub capacity: Option<u32>,
    /// The unfinished agents it runs.
    pub live_agents: u32,
    pub started_ms: i64,
    pub heartbeat_ms: i64,
    /// How old its last heartbeat is.
    pub heartbeat_age_ms: i64,
    /// Its heartbeat is younger than the expiry (10 s).
    pub alive: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}
