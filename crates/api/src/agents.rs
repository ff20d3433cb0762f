//! Agents: what a caller asks for (`POST /api/agents`, the verbs' bodies) and
//! what it is told (an agent's record, its detail, its tree, a wait's answer).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// A creation request (`POST /api/agents`, the protocol's `spawn`/`create`,
/// `brood spawn`). Every field but `argv` is optional; unknown fields are
/// refused so a misspelt one is not silently ignored.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnBody {
    /// The agent's name (SPEC 1: a letter or digit, then letters, digits,
    /// `.`, `_`, `+` and `-`, at most 64, not ending in `.sock` or `.d`);
    /// brood picks one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub name: Option<String>,
    /// The parent. An agent calling for itself may leave it out (it is the
    /// parent) and may name no other; the operator's agents without one are roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub parent: Option<String>,
    /// The program and its arguments: the program an absolute path to an
    /// executable file, or a bare name found in the agent's `PATH`; no NUL
    /// byte anywhere.
    #[schema(min_items = 1)]
    pub argv: Vec<String>,
    /// `exec` (a plain program: the task on stdin, stdout its result) or
    /// `brood` (brood's JSON-lines protocol, the default here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(brood|exec)$")]
    pub protocol: Option<String>,
    /// The task (handoff) given to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Extra environment; `BROOD_*` and `CTX_*` are the runtime's. Its
    /// values are recorded with the policy and never shown: every surface
    /// shows `null` in their place (give a credential in `secrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Secret variables, name to value, for a root (issue 25): each name is
    /// added to the policy's `secrets` and its value put in the agent's
    /// environment at launch. A value is held in the supervisor's memory
    /// only: never stored, echoed, logged or shown (`resume` needs it again).
    /// A child gets its parent's values, never new ones: giving any with a
    /// `parent` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub secrets: Option<crate::Secrets>,
    /// The working directory: an absolute path to an existing directory the
    /// agent may enter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^/[^\\u0000-\\u001f\\u007f-\\u009f]*$", max_length = 4095)]
    pub cwd: Option<String>,
    /// The session (default `default`), named like an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub session: Option<String>,
    /// Answer only once the agent said `ready` (or ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub await_ready: Option<bool>,
    /// The requested policy (SPEC 5 fields, any subset; the rest is inherited
    /// from the parent), checked against the parent's at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub policy: Option<Value>,
    /// `owned` (the default) or `temp`; `detached` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(owned|temp|detached)$")]
    pub life: Option<String>,
    /// `ns` for a private mount namespace, `none` (the default) for the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(ns|none)$")]
    pub iso: Option<String>,
    /// With `iso = ns`: the directory that becomes the agent's `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^/[^\\u0000-\\u001f\\u007f-\\u009f]*$", max_length = 4095)]
    pub root: Option<String>,
    /// Who receives the result when not the parent: an unfinished agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub customer: Option<String>,
    /// Free text for people: one line, at most 256 characters, no control
    /// characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$", max_length = 256)]
    pub label: Option<String>,
    /// Where it runs when brood runs as a cluster of nodes
    /// (docs/many-nodes.md): a node chosen by labels and free capacity.
    /// Without it, the parent's node (a root: the node asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// A creation's placement: a live node whose labels include every one of
/// these, with free capacity (the most free first).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub labels: BTreeMap<String, String>,
}

/// `POST /api/agents/{name}/input`: a user message for a live agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    pub text: String,
}

/// `POST /api/agents/{name}/wait`: how long to wait (seconds) before
/// answering with `timed_out: true`. Default 30, at most 3600.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 3600)]
    pub timeout_s: Option<f64>,
}

/// `POST /api/agents/{name}/resume`: start a new run on a finished agent's
/// session, optionally with a new message.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A root's secret values again (see `SpawnBody.secrets`): each name its
    /// policy's `secrets` holds, since no value outlives the run it was
    /// given for. A child's come from its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub secrets: Option<crate::Secrets>,
}

/// `close` and `cancel` take no arguments; an empty body or `{}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyBody {}

/// An agent's record as every surface shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Agent {
    pub name: String,
    pub parent: Option<String>,
    pub customer: Option<String>,
    /// `queued running blocked stopping completed failed cancelled closed`.
    pub status: String,
    /// The status with its outcome (`failed/exit_code`, `closed/completed`).
    pub state: String,
    pub reason: Option<String>,
    pub detail: Option<String>,
    pub depth: u32,
    pub session: String,
    /// `brood` or `exec`.
    pub protocol: String,
    /// The current (or last) run.
    pub run: String,
    /// The process, while it lives.
    pub pid: Option<i64>,
    pub cgroup: Option<String>,
    /// The supervisor that runs it (a node of the cluster, or this
    /// machine's `brood run`/`serve`); placed on a node that has not claimed
    /// it yet, the node it waits for (docs/many-nodes.md). Absent from the
    /// answers of older daemons.
    #[serde(default)]
    pub node: String,
    /// True when this unfinished agent's supervisor is gone: the record was
    /// read from the store with no supervisor answering, and the one that
    /// ran it no longer runs (its pid, if any, is the last one it had). The
    /// next supervisor of its store ends it. Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub supervisor_gone: bool,
    /// The run's result, once it has one.
    pub result: Option<String>,
    pub exit_code: Option<i64>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub tokens_in: Option<u64>,
    pub tokens_out: Option<u64>,
    pub cost_usd: Option<f64>,
}

/// Tokens and dollars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// An agent's own spend and its subtree's (SPEC 9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Spend {
    pub own: Usage,
    pub subtree: Usage,
}

/// One run of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    pub id: String,
    pub seq: u32,
    pub pid: Option<i64>,
    pub cgroup: Option<String>,
    pub outcome: Option<String>,
    pub exit_code: Option<i64>,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// `GET /api/agents/{name}`: the record, its policy and lifecycle as admitted,
/// its spend and its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentDetail {
    #[serde(flatten)]
    pub agent: Agent,
    /// The effective policy recorded at admission.
    #[schema(value_type = Object)]
    pub policy: Value,
    pub life: String,
    pub iso: String,
    pub allow_weaker_sandbox: bool,
    /// What a start after its supervisor died does with it (the policy's
    /// `on_restart`, issue 29): `cancel` or `resume`. `cancel` in the
    /// answers of older daemons and for agents recorded before it existed.
    #[serde(default = "cancel")]
    pub on_restart: String,
    pub spend: Spend,
    pub cost_limit: Option<f64>,
    pub runs: Vec<RunView>,
}

fn cancel() -> String {
    "cancel".to_owned()
}

/// An agent with its spend and its children, recursively.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TreeNode {
    #[serde(flatten)]
    pub agent: Agent,
    pub spend: Spend,
    #[schema(no_recursion)]
    pub children: Vec<TreeNode>,
}

/// A list of agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<Agent>,
}

/// Trees of agents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Trees {
    pub trees: Vec<TreeNode>,
}

/// What a wait ends with: the agents as they are, and whether the time ran out first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WaitReply {
    pub agents: Vec<Agent>,
    pub timed_out: bool,
}

/// The id of an input message (`in-<seq>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputReply {
    /// The input's id as the agent sees it (`in-<n>`); `routed-<run>` when
    /// it went to another node.
    pub id: String,
    /// Set when the agent runs on another node: the input was posted for
    /// that node, which delivers it as its next input (docs/many-nodes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` when the store does not answer (`store` says
    /// why): the node still answers and its agents keep running.
    pub status: String,
    /// `ok`, or why the store is not answering, as its probe last found
    /// (a read once a second, off the dispatcher).
    pub store: String,
    pub version: String,
    pub tenant: String,
    /// How processes are contained here (cgroup v2, hybrid, ...).
    pub containment: String,
}

/// One piece of what an agent wrote to its stderr, as its log keeps it
/// (`ctx/agent/<name>.d/log`, a JSON line each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    /// When the supervisor read it (milliseconds since the epoch).
    pub ts_ms: i64,
    /// The run that wrote it.
    pub run: String,
    /// `stderr`.
    pub stream: String,
    pub text: String,
}

/// `GET /api/agents/{name}/log`: entries of the agent's log, and where to
/// ask again from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentLog {
    pub entries: Vec<LogEntry>,
    /// The byte offset after the last entry given: ask again with
    /// `after=next` for what is written later.
    pub next: u64,
}
