//! What `POST /api/mcp/session` tells the `brood mcp` that opened it: whom
//! the session's tools act as (docs/mcp.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::agents::Agent;

/// The one event of `POST /api/mcp/session`'s stream: whom the session's
/// tools act as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionStart {
    /// The agent the session works for: the new root, or the calling agent.
    pub owner: String,
    /// True when the session made a root of its own (the operator's).
    pub root: bool,
    /// The root as it was admitted (the operator's sessions only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Agent>,
    /// What `/mcp` takes from the session's `brood mcp` to act as its root
    /// (the operator's sessions only), good while the stream is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
}
