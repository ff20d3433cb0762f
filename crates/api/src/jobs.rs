//! Jobs (SPEC 10): what a caller asks for (`POST /api/jobs`) and what it is
//! shown (a job with its counts, its items).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The workers' settings: what each worker runs as (a child of the owner).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerBody {
    /// The reference agent's type (`brood agent --type`), when `argv` is not given.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\\s\\u0000-\\u001f\\u007f-\\u009f]+$")]
    pub kind: Option<String>,
    /// The worker program (default: `brood agent`): an absolute path, or a
    /// name found in the workers' `PATH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1)]
    pub argv: Option<Vec<String>>,
    /// The workers' policy (no more than the owner holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub policy: Option<Value>,
    /// The reference agent's model (`brood agent --model`), when `argv` is
    /// not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\\s\\u0000-\\u001f\\u007f-\\u009f]+$")]
    pub model: Option<String>,
    /// The reference agent's provider (`brood agent --provider`: `openai`
    /// or `script`), when `argv` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[^\\s\\u0000-\\u001f\\u007f-\\u009f]+$")]
    pub provider: Option<String>,
    /// The reference agent's configuration file (`brood agent --config`,
    /// docs/agent.md), an absolute path the workers read with their own
    /// rights, when `argv` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^/[^\\u0000-\\u001f\\u007f-\\u009f]*$", max_length = 4095)]
    pub config: Option<String>,
}

/// `POST /api/jobs`: one instruction over many items.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobBody {
    /// The job's id (brood picks one when absent): a letter or digit, then
    /// letters, digits, `-` and `_`, at most 52.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,51}$")]
    pub id: Option<String>,
    /// The agent the job belongs to (its workers are its children). Required
    /// of the operator, whom this document describes; an agent calling for
    /// itself may leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        required = true,
        pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
    )]
    pub owner: Option<String>,
    /// The template: `{column}` fills in a field of the item's row, `{{` and
    /// `}}` are literal braces.
    pub instruction: String,
    /// CSV with headers or JSON lines as text, or an array of objects (at
    /// most `items_per_job` rows, 100,000 unless the platform says
    /// otherwise); never a file path.
    #[schema(value_type = Object)]
    pub input: Value,
    /// `csv`, `json` or `jsonl` (guessed from the text when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(csv|json|jsonl)$")]
    pub input_format: Option<String>,
    /// The column holding each row's id (default: the row's place, from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_column: Option<String>,
    /// A JSON Schema every item's result must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerBody>,
    /// Workers at once (default 8; 1 to 1024).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::opt_u32"
    )]
    #[schema(minimum = 1, maximum = 1024)]
    pub concurrency: Option<u32>,
    /// Attempts per item (default 3; 1 to 100).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::opt_u32"
    )]
    #[schema(minimum = 1, maximum = 100)]
    pub max_attempts: Option<u32>,
    /// Seconds an attempt may take (default 1800; 1 to 315360000, ten years).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::opt_u64"
    )]
    #[schema(minimum = 1, maximum = 315360000)]
    pub item_timeout_s: Option<u64>,
    /// Seconds the whole job may take (1 to 315360000, ten years).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::opt_u64"
    )]
    #[schema(minimum = 1, maximum = 315360000)]
    pub max_runtime_s: Option<u64>,
}

/// A job as every surface shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    pub id: String,
    pub owner: String,
    /// `pending running completed failed cancelled`.
    pub status: String,
    pub total: u32,
    /// Items by status (every status, zeros too).
    pub counts: BTreeMap<String, u32>,
    /// The job's settings as created.
    #[schema(value_type = Object)]
    pub spec: Value,
    /// The job this one replays.
    pub source: Option<String>,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// One item of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ItemView {
    pub id: String,
    pub row_index: u32,
    /// `pending running completed failed reported`.
    pub status: String,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// The one result, once completed.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub worker: Option<String>,
    /// The input row.
    #[schema(value_type = Object)]
    pub input: Value,
    pub completed_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ItemList {
    pub items: Vec<ItemView>,
}

/// `POST /api/jobs/{id}/items/{item}/assign`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignBody {
    /// A live agent under the job's owner, holding no item, to hold it (the
    /// caller gives it the instruction); absent: a new worker is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub worker: Option<String>,
}

/// What an assignment gives: the item's attempt and its instruction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    pub job: String,
    pub item: String,
    /// The attempt's number: its fencing token with the worker's name.
    pub attempt: Option<u32>,
    /// The item's instruction (the template filled in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AssignReply {
    /// The agent holding the item now.
    pub assigned: String,
    pub assignment: Option<Assignment>,
}

/// `POST /api/jobs/{id}/items/{item}/report`: the holding worker's result.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    /// The result (it must satisfy the job's `output_schema`).
    #[schema(value_type = Object)]
    pub result: Value,
    /// No next item wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReportReply {
    pub accepted: bool,
    /// The worker's next item, unless it asked to stop or none is left.
    pub next: Option<Assignment>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RetryReply {
    pub job: String,
    /// The items back to pending.
    pub retried: Vec<String>,
}

/// `POST /api/jobs/{id}/replay`: a new job from a recorded one's spec and inputs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// The new job's id (brood picks one when absent), as `JobBody.id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,51}$")]
    pub id: Option<String>,
    /// Only the items that failed (default: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_only: Option<bool>,
    /// Start it at once (default: it is created pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<bool>,
}

/// One file of an evidence bundle (every file is UTF-8 text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EvidenceFile {
    pub path: String,
    pub content: String,
}

/// `GET /api/jobs/{id}/evidence`: the bundle `--evidence DIR` writes, its
/// `manifest.json` holding the sha256 of every other file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EvidenceBundle {
    pub job: String,
    pub files: Vec<EvidenceFile>,
}
