//! The child protocol: the wire types and framing by which the supervisor and an
//! agent process talk over the agent's stdin and stdout. This documentation is
//! the protocol's reference (it implements SPEC section 7); third-party agents
//! can depend on this crate alone.
//!
//! # Lines
//!
//! Each direction is a stream of lines. A line is one JSON object in UTF-8
//! followed by `'\n'`, at most [`MAX_LINE`] (1 MiB = 1,048,576) bytes not counting
//! the `'\n'`. Every object has a string field `"type"` naming the message.
//! Unknown fields are ignored, so both sides may add fields. A line holding only
//! whitespace is ignored. Anything the agent writes to stderr is not part of the
//! protocol: it goes to the agent's `log`.
//!
//! The shapes are compatible with the seed harness's sub-agent protocol: a child
//! written for it works unchanged. Field names are camelCase where the seed
//! spelled them so.
//!
//! # Supervisor to agent ([`ToAgent`])
//!
//! | message | meaning |
//! | --- | --- |
//! | `{"type":"init","config":{..},"agentConfig":{..}}` | Always the first line. `config` ([`InitConfig`]) holds `id`, `name`, `run`, `parentSessionId`, `sessionId`, `instruction`, `subAgentType`, `customer`, `handoff` (`dir`, `refs`, `output`), `capabilities` (the effective policy), `config` (`provider model systemPrompt tools maxTurns timeout`) and, brood's addition, `history`: the session's messages so far (`[{"role","content"}]`), so a resumed run sees its history. Every field may be absent. `agentConfig` is passed through untouched. |
//! | `{"type":"input","id","from","text"}` | A message sent to the agent. |
//! | `{"type":"reply","re":N,"ok":true,"result":{..}}` | Request `N` succeeded. |
//! | `{"type":"reply","re":N,"ok":false,"error":{"code","reason","message"}}` | Request `N` was refused or failed. |
//! | `{"type":"child","child":NAME,"event":{..}}` | Status, output or result of one of the agent's own children. |
//! | `{"type":"cancel","reason"}` | Please stop now; SIGTERM follows after the grace period. |
//! | `{"type":"ping"}` | Answer with `pong`. |
//!
//! # Agent to supervisor ([`FromAgent`])
//!
//! | message | meaning |
//! | --- | --- |
//! | `{"type":"ready"}` | Once, after `init`. |
//! | `{"type":"chunk","delta"}` | Streamed output. |
//! | `{"type":"message","role","content"}` | A whole message for the transcript. |
//! | `{"type":"usage","tokensIn","tokensOut","costUsd"}` | Spend so far in this run, cumulative; used for budgets. |
//! | `{"type":"status","status":"blocked"\|"running","reason"}` | The agent is waiting (and why), or working again. |
//! | `{"type":"request","id":N,"op","args":{..}}` | Asks the supervisor to act; ops `spawn send wait close resume cancel list show tree ping`, and for jobs (docs/jobs.md) `job.create job.get job.list job.items job.start job.cancel job.assign job.retry job.report job.export job.replay`. Answered by exactly one `reply` with `re` = `N`. Ids are the agent's to choose; use each once. |
//! | `{"type":"done","result":{"success","response","tokensIn","tokensOut","costUsd","durationMs","refs"}}` | The result ([`DoneResult`]); then exit. Every field may be absent (`success` defaults to true). Counts may be sent as floats (rounded) or null (0), as the seed's TypeScript children do. |
//! | `{"type":"error","error"}` | The run failed; then exit. |
//! | `{"type":"pong"}` | The answer to `ping`. |
//!
//! # Failure rules
//!
//! On the supervisor's side, each agent line is checked in this order, and the
//! first failure names the line by its number (from 1):
//!
//! 1. longer than [`MAX_LINE`] bytes: [`LineErrorKind::TooLong`]. The
//!    [`Framer`] reports this as soon as the limit is passed, without buffering
//!    the rest of the line;
//! 2. not UTF-8: [`LineErrorKind::NotUtf8`];
//! 3. not JSON: [`LineErrorKind::NotJson`];
//! 4. JSON but not an object: [`LineErrorKind::NotObject`];
//! 5. no string `"type"`: [`LineErrorKind::MissingType`];
//! 6. a known `"type"` whose fields have the wrong shape (a missing required
//!    field, a string where a number belongs): [`LineErrorKind::BadShape`].
//!
//! Each of these is a protocol error: the supervisor records it with its line
//! number and fails the run with `protocol_error`, and keeps running itself.
//! A well-formed object with an unknown `"type"` is not an error: it is logged
//! with its type name ([`Decoded::Unknown`]) and ignored, because the list of
//! messages grows. A run whose stdout reaches end of file without `done` or
//! `error` fails with `exited_without_result` and the tail of its stderr.
//!
//! Agents decoding supervisor lines ([`decode_to_agent`]) get the same checks;
//! an unknown type (or a blank line) decodes as [`ToAgent::Unknown`], which they
//! ignore.
//!
//! # Using this crate
//!
//! Supervisor side: feed stdout bytes to a [`Framer`], pass each
//! [`Frame::Line`] to [`decode_line`], write [`encode`]d messages to stdin.
//! Agent side: decode stdin lines with [`decode_to_agent`], write
//! [`encode_from_agent`]ed lines to stdout and flush after each.

mod codec;
pub mod event;
mod framer;
mod messages;
pub mod policy;

pub use codec::{
    Decoded, LineError, LineErrorKind, decode_line, decode_to_agent, encode, encode_from_agent,
};
pub use framer::{Frame, Framer};
pub use messages::{
    DoneResult, ErrorBody, FromAgent, Handoff, HistoryMessage, InitConfig, Reply, ToAgent,
};

/// The longest line either side may write, in bytes, not counting its `'\n'`.
pub const MAX_LINE: usize = 1 << 20;
