//! Removing what has finished (issue 25): a tree (`DELETE
//! /api/agents/{name}`), every tree past an age (`POST /api/prune`) and a
//! job (`DELETE /api/jobs/{id}`), and what each answers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The oldest a prune's `older_than_s` may be: 100 years, in seconds.
pub const PRUNE_MAX_AGE_S: u64 = 100 * 365 * 24 * 3600;

/// `POST /api/prune`: remove every finished tree whose last end is at least
/// `older_than_s` seconds old.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// The age, in seconds, a tree's last end must have reached (0: every
    /// finished tree).
    #[schema(minimum = 0, maximum = 3153600000_u64)]
    #[serde(deserialize_with = "crate::whole::u64")]
    pub older_than_s: u64,
    /// List the trees that would be removed, and remove nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A tree removed (in a dry run: one that would be).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RemovedTree {
    /// Its root's name, free again once removed.
    pub root: String,
    /// How many agents it held, the root included.
    pub agents: u64,
    /// Its last end (the latest status change of any of its agents), in
    /// milliseconds since the epoch.
    pub last_end_ms: Option<i64>,
}

/// A tree a prune found finished but did not remove (it was resumed or
/// given a job meanwhile), and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SkippedTree {
    pub root: String,
    pub reason: String,
}

/// What a prune removed (or, in a dry run, would remove), oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PruneReply {
    pub dry_run: bool,
    pub removed: Vec<RemovedTree>,
    pub skipped: Vec<SkippedTree>,
}

/// A job removed, with its items and attempts, and the agents of its own
/// workers' subtrees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RemovedJob {
    pub job: String,
    /// What it was: `pending completed failed cancelled`.
    pub status: String,
    /// The agents removed with it (its workers and theirs), names free again.
    pub agents: Vec<String>,
}
