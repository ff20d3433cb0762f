//! The tools' inputs, each a type with a JSON Schema (schemars) that the
//! client sees in `tools/list`, and the list itself: name, description,
//! input and output schemas.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// `spawn`: a child agent, answered at once with its name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spawn {
    /// The task (handoff) the child works on.
    pub task: String,
    /// The reference agent's type (`explore general plan code research`),
    /// when no `argv` is given.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The model for the reference agent (`brood agent --model`).
    #[serde(default)]
    pub model: Option<String>,
    /// The program and its arguments; default `brood agent`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// `brood` (speaks brood's protocol) or `exec` (a plain program: the task on
    /// stdin, stdout its result). Default: `brood` for brood's own agents,
    /// `exec` for any other program.
    #[serde(default)]
    pub protocol: Option<String>,
    /// The child's capabilities: any SPEC 5 policy fields (`tools`, `files`,
    /// `network`, `cost_limit`, `timeout_s`, `create_limit`, `depth_limit`, ...);
    /// no more than its parent holds, the rest inherited.
    #[serde(default)]
    pub capabilities: Option<JsonObject>,
    /// Who receives the result when not the parent.
    #[serde(default)]
    pub customer: Option<String>,
    /// The child's name (brood picks one when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// The parent, an agent of this session's subtree (default: the session itself).
    #[serde(default)]
    pub parent: Option<String>,
}

/// `send`: a message to a live agent.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Send {
    pub agent: String,
    pub text: String,
}

/// `wait`: until the agents end or the time runs out (bounded).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Wait {
    /// The agents to wait for (default: every unfinished child of the session).
    #[serde(default)]
    pub agents: Option<Vec<String>>,
    /// Seconds to wait at most (default 20, at most 50: clients give up on a
    /// call after about a minute). Call again to wait longer.
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// One agent, for `cancel`, `close` and `show`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub agent: String,
}

/// `resume`: a new run of a finished agent on its session.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    pub agent: String,
    /// A new message for the new run.
    #[serde(default)]
    pub text: Option<String>,
}

/// `list`: agents under a parent.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct List {
    /// Whose children (default: the session's).
    #[serde(default)]
    pub parent: Option<String>,
    /// Finished ones too (default: live ones only).
    #[serde(default)]
    pub all: Option<bool>,
}

/// `tree`: a subtree with spend.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    /// The subtree's root (default: the session).
    #[serde(default)]
    pub root: Option<String>,
}

/// `events`: a subtree's recorded events, read once (not followed).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Events {
    /// Whose subtree (default: the session's).
    #[serde(default)]
    pub agent: Option<String>,
    /// Only events after this sequence number (what `next_after` said last time).
    #[serde(default)]
    pub after: Option<u64>,
    /// Only these types, comma-separated; a trailing `*` matches a prefix
    /// (`agent.stop,agent.child.*`).
    #[serde(default, rename = "type")]
    pub types: Option<String>,
    /// At most this many, the oldest first (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `job_create`: one instruction over many items (docs/jobs.md).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobCreate {
    /// The template: `{column}` fills in a field of the item's row.
    pub instruction: String,
    /// CSV with headers or JSON lines as text, or an array of objects.
    pub input: Value,
    /// `csv`, `json` or `jsonl` (guessed when absent).
    #[serde(default)]
    pub input_format: Option<String>,
    #[serde(default)]
    pub id_column: Option<String>,
    /// A JSON Schema every item's result must satisfy.
    #[serde(default)]
    pub output_schema: Option<JsonObject>,
    /// The workers: `type`, `argv`, `policy`, `model`.
    #[serde(default)]
    pub worker: Option<JsonObject>,
    #[serde(default)]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default)]
    pub item_timeout_s: Option<u64>,
    #[serde(default)]
    pub max_runtime_s: Option<u64>,
    /// The job's id (brood picks one when absent).
    #[serde(default)]
    pub id: Option<String>,
    /// The owning agent (default: the session); its workers are its children.
    #[serde(default)]
    pub owner: Option<String>,
    /// Start it at once (default false: `job_start` starts it).
    #[serde(default)]
    pub start: Option<bool>,
}

/// One job, for `job_start`, `job_cancel`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub id: String,
}

/// `job_show`: a job, or every job of the session when no id is given.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobShow {
    #[serde(default)]
    pub id: Option<String>,
    /// With its items (and their attempts), optionally only of this status.
    #[serde(default)]
    pub items: Option<bool>,
    #[serde(default)]
    pub status: Option<String>,
}

/// `job_retry`: one item, or every failed item when none is named.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRetry {
    pub id: String,
    #[serde(default)]
    pub item: Option<String>,
}

/// `job_export`: the items with their results.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobExport {
    pub id: String,
    /// `jsonl` (the default: one JSON object per item) or `csv`.
    #[serde(default)]
    pub format: Option<String>,
}

/// `job_replay`: a new job from a recorded one's spec and inputs.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobReplay {
    /// The job to replay.
    pub id: String,
    /// The new job's id (brood picks one when absent).
    #[serde(default)]
    pub new_id: Option<String>,
    /// Only the items that failed (default: all of them).
    #[serde(default)]
    pub failed_only: Option<bool>,
    /// Start it at once (default: created pending).
    #[serde(default)]
    pub start: Option<bool>,
}

fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

/// An output schema: an object with these properties described (none
/// required, so an answer that grows a field stays valid).
fn output(props: Value) -> Arc<JsonObject> {
    let mut o = JsonObject::new();
    o.insert("type".into(), json!("object"));
    o.insert("properties".into(), props);
    Arc::new(o)
}

fn agent_out() -> Arc<JsonObject> {
    output(json!({
        "name": {"type": "string"}, "status": {"type": "string"},
        "state": {"type": "string"}, "reason": {"type": ["string", "null"]},
        "parent": {"type": ["string", "null"]}, "result": {"type": ["string", "null"]},
    }))
}

fn tool(
    name: &'static str,
    desc: &'static str,
    input: Arc<JsonObject>,
    out: Arc<JsonObject>,
    read_only: bool,
) -> Tool {
    let mut t = Tool::new(name, desc, input).with_raw_output_schema(out);
    t.annotations = Some(ToolAnnotations::new().read_only(read_only));
    t
}

/// Every tool, as `tools/list` shows it.
pub fn tools() -> Vec<Tool> {
    let agents = || {
        output(json!({
            "agents": {"type": "array", "items": {"type": "object"}},
        }))
    };
    let job = || {
        output(json!({
            "id": {"type": "string"}, "status": {"type": "string"},
            "counts": {"type": "object"}, "owner": {"type": "string"},
        }))
    };
    vec![
        tool(
            "spawn",
            "Start a child agent with a task, sandboxed and owned by this session: it dies when the session ends. Returns at once with the child's name; use `wait` for its result. A child asking more than the session holds is refused with the code (e.g. ToolExpansion, BudgetExceeded).",
            schema::<Spawn>(),
            agent_out(),
            false,
        ),
        tool(
            "send",
            "Send a message to a live agent (as its input).",
            schema::<Send>(),
            output(json!({"id": {"type": "string"}})),
            false,
        ),
        tool(
            "wait",
            "Wait (at most timeout_s, default 20 s) for agents to end; returns each agent's status and result, whether the time ran out, and which of the session's agents are still running. Call again to wait longer.",
            schema::<Wait>(),
            output(json!({
                "agents": {"type": "array", "items": {"type": "object"}},
                "timed_out": {"type": "boolean"},
                "still_running": {"type": "array", "items": {"type": "string"}},
            })),
            true,
        ),
        tool(
            "cancel",
            "Cancel an agent and its whole subtree (processes killed, history kept).",
            schema::<Agent>(),
            agent_out(),
            false,
        ),
        tool(
            "close",
            "Release a finished agent: nothing more can be sent to it except `resume`.",
            schema::<Agent>(),
            agent_out(),
            false,
        ),
        tool(
            "resume",
            "Start a new run of a finished agent on its session (it sees its history), optionally with a new message.",
            schema::<Resume>(),
            agent_out(),
            false,
        ),
        tool(
            "list",
            "List agents under a parent (default: this session's children), live ones unless `all`.",
            schema::<List>(),
            agents(),
            true,
        ),
        tool(
            "tree",
            "The tree under an agent (default: this session) with each agent's status and spend.",
            schema::<Tree>(),
            output(json!({"trees": {"type": "array", "items": {"type": "object"}}})),
            true,
        ),
        tool(
            "show",
            "One agent: status and reason, result, the refs it handed back, spend (own and subtree), policy and runs.",
            schema::<Agent>(),
            output(json!({
                "name": {"type": "string"}, "status": {"type": "string"},
                "result": {"type": ["string", "null"]}, "spend": {"type": "object"},
                "refs": {"type": "array"}, "policy": {"type": "object"},
                "runs": {"type": "array"},
            })),
            true,
        ),
        tool(
            "events",
            "Recorded events of a subtree (default: this session's), oldest first; pass `after` = the returned `next_after` to read on.",
            schema::<Events>(),
            output(json!({
                "events": {"type": "array", "items": {"type": "object"}},
                "next_after": {"type": ["integer", "null"]},
            })),
            true,
        ),
        tool(
            "job_create",
            "Create a job: one instruction over many items (CSV, JSON or JSON lines), run by worker agents that are the owner's (default: this session's) children. `start: true` starts it.",
            schema::<JobCreate>(),
            job(),
            false,
        ),
        tool(
            "job_start",
            "Start a pending job.",
            schema::<Job>(),
            job(),
            false,
        ),
        tool(
            "job_show",
            "A job with its progress by status (and its items with `items: true`), or the list of jobs when no id is given.",
            schema::<JobShow>(),
            output(json!({
                "job": {"type": "object"},
                "items": {"type": "array"},
                "jobs": {"type": "array"},
            })),
            true,
        ),
        tool(
            "job_cancel",
            "Cancel a job: assignment stops, running workers are cancelled, completed items stay.",
            schema::<Job>(),
            job(),
            false,
        ),
        tool(
            "job_export",
            "A job's items with their status, attempts and results: JSON lines (parsed into `items`) or CSV (as `text`).",
            schema::<JobExport>(),
            output(json!({
                "format": {"type": "string"},
                "items": {"type": "array"},
                "text": {"type": "string"},
            })),
            true,
        ),
        tool(
            "job_replay",
            "A new job from a recorded job's spec and inputs, all items or only the failed ones, linked to it; `start: true` starts it.",
            schema::<JobReplay>(),
            job(),
            false,
        ),
        tool(
            "job_retry",
            "Retry one item of a job, or every failed item when no item is named.",
            schema::<JobRetry>(),
            output(json!({"job": {"type": "string"}, "retried": {"type": "array"}})),
            false,
        ),
    ]
}
