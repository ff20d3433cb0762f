//! Sessions as the seed's harness exposes them (`GET /api/sessions/...`):
//! every agent is one session of sub-agent work, its id the agent's name,
//! its parent session its parent's.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One agent's session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Session {
    /// The session's id: the agent's name.
    pub id: String,
    pub agent: String,
    /// The session's own name within the agent (`default`).
    pub session: String,
    pub parent_session_id: Option<String>,
    pub status: String,
    pub reason: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// Sessions in start order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
}

/// A session's parent: `null` for a root's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ParentReply {
    pub parent: Option<Session>,
}

/// A session with its children, in start order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionNode {
    #[serde(flatten)]
    pub session: Session,
    #[schema(no_recursion)]
    pub children: Vec<SessionNode>,
}

/// `GET /api/sessions/tree`: every root's session tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionTrees {
    pub trees: Vec<SessionNode>,
}
