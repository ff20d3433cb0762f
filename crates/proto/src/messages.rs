//! The messages of the child protocol in both directions, as serde types.
//!
//! This file only describes shapes: which fields each message has, how they are
//! spelled on the wire and which of them may be left out. Turning bytes into
//! these types (and back), with the protocol's failure rules, is `codec.rs`'s job.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A message from the supervisor to an agent (the agent's stdin).
///
/// Tagged by its `"type"` field. Unknown fields are ignored; a `"type"` this
/// version does not know decodes as [`ToAgent::Unknown`] so that an older agent
/// keeps working when the supervisor learns new messages.
// `Init` is much larger than the other variants, but it is sent once per run
// and never stored in bulk, so boxing it would only make every caller's
// construction and matching noisier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ToAgent {
    /// The first line of every run: who the agent is and what it should do.
    Init {
        #[serde(default)]
        config: InitConfig,
        /// The harness's own agent configuration, passed through untouched.
        #[serde(rename = "agentConfig", default)]
        agent_config: Value,
    },
    /// A message sent to the agent by someone (`from`), with a client id.
    Input {
        #[serde(default)]
        id: String,
        #[serde(default)]
        from: String,
        text: String,
    },
    /// The answer to one of the agent's `request`s.
    Reply(Reply),
    /// Something happened to one of the agent's own children.
    Child {
        child: String,
        #[serde(default)]
        event: Value,
    },
    /// Please stop now; SIGTERM follows after the grace period.
    Cancel {
        #[serde(default)]
        reason: String,
    },
    /// Liveness check; the agent answers with `pong`.
    Ping,
    /// A `"type"` this version does not know. Encodes as `{"type":"unknown"}`.
    #[serde(other)]
    Unknown,
}

/// `{"type":"reply","re":N,"ok":true,"result":{..}}` or
/// `{"type":"reply","re":N,"ok":false,"error":{"code","reason","message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The `id` of the request this answers.
    pub re: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Reply {
    /// A successful answer to request `re`.
    pub fn ok(re: u64, result: Value) -> Self {
        Reply {
            re,
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A refusal or failure of request `re`.
    pub fn err(re: u64, e: ErrorBody) -> Self {
        Reply {
            re,
            ok: false,
            result: None,
            error: Some(e),
        }
    }

    /// The reply as a `Result`: the result (null when absent) or the error.
    ///
    /// A reply with `ok:false` but no `error` object still counts as an error,
    /// with code `EIO`, so an agent never mistakes a malformed refusal for success.
    pub fn into_result(self) -> Result<Value, ErrorBody> {
        if self.ok {
            Ok(self.result.unwrap_or(Value::Null))
        } else {
            Err(self.error.unwrap_or_else(|| ErrorBody {
                code: "EIO".to_owned(),
                reason: String::new(),
                message: format!(
                    "reply to request {} said ok:false without an error",
                    self.re
                ),
            }))
        }
    }
}

/// Why a request failed: a machine code (an API code such as `QuotaFanout`, or
/// an errno-like word), a reason word and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.code)?;
        if !self.reason.is_empty() && self.reason != self.code {
            write!(f, " ({})", self.reason)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// The `config` of `init`. Every field may be left out, so a minimal
/// `{"type":"init","config":{}}` parses; the spellings are the seed's camelCase.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InitConfig {
    /// The run's id (the seed's `id`; brood sends the run id here too).
    pub id: String,
    /// The agent's name.
    pub name: String,
    /// The run id (UUIDv7).
    pub run: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    pub session_id: String,
    /// The task, as the parent wrote it (`handoff.md`).
    pub instruction: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_agent_type: Option<String>,
    /// Who receives the result; absent means the parent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    pub handoff: Handoff,
    /// The agent's effective policy (SPEC section 5).
    #[serde(default = "empty_object")]
    pub capabilities: Value,
    /// Model settings: `provider model systemPrompt tools maxTurns timeout`.
    #[serde(default = "empty_object")]
    pub config: Value,
    /// brood's addition: the messages of the session so far, oldest first, so
    /// that a resumed run sees its history.
    pub history: Vec<HistoryMessage>,
}

/// Where the handoff lives and what it carries (SPEC section 4).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Handoff {
    /// The parent's channel directory for this child.
    pub dir: String,
    /// Input references, each an object with at least `path` and `summary`.
    pub refs: Vec<Value>,
    /// The output contract: free text or a JSON Schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// One whole message of the session's transcript.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HistoryMessage {
    pub role: String,
    pub content: String,
}

/// A message from an agent to the supervisor (the agent's stdout).
///
/// Tagged by its `"type"` field; unknown fields are ignored. The decoder
/// (`decode_line`) reports an unknown `"type"` with its name instead of
/// returning [`FromAgent::Unknown`], which exists so that serde has somewhere to
/// put it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FromAgent {
    /// Once, after `init`.
    Ready,
    /// Streamed output.
    Chunk { delta: String },
    /// A whole message for the transcript.
    Message { role: String, content: String },
    /// Spend so far in this run, cumulative (each report replaces the last).
    Usage {
        #[serde(rename = "tokensIn", default, deserialize_with = "lenient_u64")]
        tokens_in: u64,
        #[serde(rename = "tokensOut", default, deserialize_with = "lenient_u64")]
        tokens_out: u64,
        #[serde(rename = "costUsd", default, deserialize_with = "lenient_f64")]
        cost_usd: f64,
    },
    /// `blocked` (with a reason) or `running` again.
    Status {
        status: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Asks the supervisor to do something; answered by one `reply` with `re` = `id`.
    Request {
        id: u64,
        op: String,
        #[serde(default)]
        args: Value,
    },
    /// The run's result; the agent exits after it.
    Done {
        #[serde(default)]
        result: DoneResult,
    },
    /// The run failed; the agent exits after it.
    Error { error: String },
    /// The answer to `ping`.
    Pong,
    /// A `"type"` this version does not know.
    #[serde(other)]
    Unknown,
}

/// The `result` of `done`. Every field may be left out (`success` then means
/// true); unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DoneResult {
    pub success: bool,
    /// The answer, which becomes `result.md`.
    pub response: String,
    #[serde(deserialize_with = "lenient_u64")]
    pub tokens_in: u64,
    #[serde(deserialize_with = "lenient_u64")]
    pub tokens_out: u64,
    #[serde(deserialize_with = "lenient_f64")]
    pub cost_usd: f64,
    #[serde(deserialize_with = "lenient_u64")]
    pub duration_ms: u64,
    /// References handed back, the lines of `refs.jsonl` (checked by the runtime).
    pub refs: Vec<Value>,
}

impl Default for DoneResult {
    fn default() -> Self {
        DoneResult {
            success: true,
            response: String::new(),
            tokens_in: 0,
            tokens_out: 0,
            cost_usd: 0.0,
            duration_ms: 0,
            refs: Vec::new(),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// Reads a count that the seed's TypeScript children may send as a float
/// (`performance.now()` differences) or as null: a whole number is taken as
/// is, a finite non-negative float is rounded, null is 0. Anything else is a
/// shape error, because a negative or textual count is a bug worth seeing.
fn lenient_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(0),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                Ok(u)
            } else if let Some(f) = n.as_f64()
                && f.is_finite()
                && f >= 0.0
            {
                // `as` saturates at u64::MAX, which is the right answer for an
                // absurdly large float.
                Ok(f.round() as u64)
            } else {
                Err(D::Error::custom(format!(
                    "expected a non-negative number, got {n}"
                )))
            }
        }
        other => Err(D::Error::custom(format!("expected a number, got {other}"))),
    }
}

/// Reads a cost: any finite number, or null for 0.
fn lenient_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(0.0),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.is_finite())
            .ok_or_else(|| D::Error::custom(format!("expected a finite number, got {n}"))),
        other => Err(D::Error::custom(format!("expected a number, got {other}"))),
    }
}
