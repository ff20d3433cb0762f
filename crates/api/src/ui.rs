//! What the web UI reads beyond the agents' and jobs' routes (docs/ui.md): a
//! compact listing of every agent for the live tree (one request, whatever
//! the tree's size, and no agent's detail), an agent's objects (its
//! `meta.json` and the channel it handed back) and its transcript, and a
//! job item's attempts.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::Usage;

/// One agent as the tree shows it: enough for a row, nothing more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TreeRow {
    pub name: String,
    pub parent: Option<String>,
    /// The badge: the reference agent's `--type` (`explore`, `code`, ...),
    /// else the protocol (`brood` or `exec`).
    pub kind: String,
    /// `queued running blocked stopping completed failed cancelled closed`.
    pub status: String,
    pub reason: Option<String>,
    /// Why it is blocked, why a run failed.
    pub detail: Option<String>,
    pub label: Option<String>,
    pub depth: u32,
    /// Its children, finished ones too.
    pub children: u32,
    pub created_ms: i64,
    /// When its record last changed: for a blocked agent, when it began to
    /// wait (the timeline's `waiting`).
    pub updated_ms: i64,
    /// The current run's start and end.
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    /// Its own spend over every run, and its subtree's (itself included).
    pub own: Usage,
    pub subtree: Usage,
}

/// `GET /api/ui/tree`: every agent, parents before children, siblings in
/// start order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TreeRows {
    pub agents: Vec<TreeRow>,
    /// The tenant's last event when the listing was read: follow
    /// `/api/events?after=` it and no change is missed.
    pub sequence: i64,
    /// The server's clock (milliseconds since the epoch), for running times.
    pub now_ms: i64,
}

/// One file a child handed back in its `artifact/` directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactView {
    pub name: String,
    pub sha256: String,
    pub size: u64,
}

/// The channel between an agent and its parent (SPEC 4), as handed back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChannelView {
    /// `handoff.md`: the task the parent wrote.
    pub handoff: String,
    /// `result.md`, once the run ended with one.
    pub result: Option<String>,
    /// The channel's status word.
    pub status: String,
    /// `refs.jsonl`'s text, once the run ended with a result.
    pub refs: Option<String>,
    pub artifacts: Vec<ArtifactView>,
}

/// `GET /api/ui/agents/{name}`: the agent's objects the detail does not hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentObjects {
    pub name: String,
    /// `meta.json` as the ctx tree holds it: what the newest run's launch
    /// enforced (containment, sandbox).
    #[schema(value_type = Object)]
    pub meta: Value,
    /// The launch as admitted: argv, cwd, label, lifecycle.
    #[schema(value_type = Object)]
    pub launch: Value,
    /// Its parent's channel to it; `None` for a root.
    pub channel: Option<ChannelView>,
}

/// One message of an agent's session transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MessageView {
    pub seq: i64,
    pub ts_ms: i64,
    pub run: String,
    pub role: String,
    pub content: String,
}

/// `GET /api/ui/agents/{name}/transcript`: the messages after `after`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Transcript {
    pub messages: Vec<MessageView>,
}

/// One attempt at a job's item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AttemptView {
    /// 1 for the first; the fencing token with the worker's name.
    pub number: u32,
    pub worker: Option<String>,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    /// `running completed failed`.
    pub outcome: String,
    pub error: Option<String>,
}

/// `GET /api/ui/jobs/{id}/items/{item}/attempts`: every attempt, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AttemptList {
    pub attempts: Vec<AttemptView>,
}

/// `GET /api/ui/sequence`: where the tenant's event log is now, so a page
/// that read its data can follow `/api/events?after=` it, not from the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sequence {
    pub sequence: i64,
}
