//! The model loop (SPEC 13): prompt, stream, tool calls, tool results, until
//! the model answers without a tool call, `maxTurns` is reached (a clear
//! result saying so), or a cancel arrives (the stream stops, the spend so far
//! is reported). Every model message, tool call and tool result goes to the
//! session as a protocol `message`, so `brood show`, the ctx files and
//! `resume` see the whole conversation, and a resumed agent continues from
//! its history: the calls a crash left in flight run first, and a call the
//! history records as done is not run again (`journal`).

use std::time::Instant;

use brood_proto::{DoneResult, FromAgent, HistoryMessage};
use serde_json::{Value, json};

use crate::io::{Halt, Io};
use crate::journal::Journal;
use crate::provider::{ChatMessage, Provider, ProviderError, ToolCall, ToolSpec};
use crate::settings::Settings;
use crate::tools;

pub use crate::journal::{ROLE_CALL, ROLE_RESULT};

/// How a run ended, for the process's exit.
pub enum End {
    Done,
    Cancelled,
    Failed(String),
}

struct Spent {
    input: u64,
    output: u64,
    cost: f64,
    /// A call whose tokens had no price: the cost is not known.
    unpriced: bool,
}

/// The conversation so far from the session's transcript.
pub fn from_history(history: &[HistoryMessage]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::new();
    for m in history {
        match m.role.as_str() {
            "user" => out.push(ChatMessage::User(m.content.clone())),
            "system" => {}
            "assistant" => out.push(ChatMessage::Assistant {
                text: m.content.clone(),
                calls: Vec::new(),
            }),
            ROLE_CALL => {
                let v: Value = serde_json::from_str(&m.content).unwrap_or(Value::Null);
                let call = ToolCall {
                    id: v["id"].as_str().unwrap_or("call").to_owned(),
                    name: v["name"].as_str().unwrap_or("").to_owned(),
                    arguments: v["arguments"].as_str().unwrap_or("{}").to_owned(),
                };
                // Calls belong to the assistant turn just before them.
                match out.last_mut() {
                    Some(ChatMessage::Assistant { calls, .. }) => calls.push(call),
                    _ => out.push(ChatMessage::Assistant {
                        text: String::new(),
                        calls: vec![call],
                    }),
                }
            }
            ROLE_RESULT => {
                let v: Value = serde_json::from_str(&m.content).unwrap_or(Value::Null);
                out.push(ChatMessage::Tool {
                    call_id: v["id"].as_str().unwrap_or("call").to_owned(),
                    content: v["content"].as_str().unwrap_or("").to_owned(),
                });
            }
            _ => {}
        }
    }
    out
}

pub fn run(
    io: &mut Io,
    provider: &mut dyn Provider,
    settings: &Settings,
    instruction: &str,
    history: &[HistoryMessage],
    job_worker: bool,
) -> End {
    let started = Instant::now();
    let mut spent = Spent {
        input: 0,
        output: 0,
        cost: 0.0,
        unpriced: false,
    };
    let r = turns(io, provider, settings, instruction, history, &mut spent);
    let usage = FromAgent::Usage {
        tokens_in: spent.input,
        tokens_out: spent.output,
        cost_usd: spent.cost,
    };
    let _ = io.send(&usage);
    let done = |response: String, success: bool| FromAgent::Done {
        result: DoneResult {
            success,
            response,
            tokens_in: spent.input,
            tokens_out: spent.output,
            cost_usd: spent.cost,
            duration_ms: started.elapsed().as_millis() as u64,
            refs: Vec::new(),
        },
    };
    // An unknown price is said, never guessed: the tokens are counted and
    // the cost reported as 0 in `usage` (the protocol has no "unknown").
    if spent.unpriced {
        eprintln!(
            "brood agent: cost unknown: no price for model {} in the agent configuration ({} tokens in, {} out)",
            settings.model, spent.input, spent.output
        );
    }
    match r {
        Ok(Outcome::Answer(text)) if job_worker => match report(io, &text) {
            Ok(()) => {
                let _ = io.send(&done(text, true));
                End::Done
            }
            Err(Stop::Halt(h)) => End::Failed(h.to_string()),
            Err(Stop::Failed(m)) => {
                let _ = io.send(&FromAgent::Error { error: m.clone() });
                End::Failed(m)
            }
        },
        Ok(Outcome::Answer(text)) => {
            let _ = io.send(&done(text, true));
            End::Done
        }
        Ok(Outcome::OutOfTurns(last)) => {
            let text = format!(
                "stopped: the model used all {} turns (maxTurns of type {}) without a final answer.{}",
                settings.max_turns,
                settings.type_name,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" Its last words:\n{last}")
                }
            );
            let _ = io.send(&done(text, false));
            End::Done
        }
        Err(Stop::Halt(Halt::Cancelled(reason))) => {
            let _ = io.send(&FromAgent::Error {
                error: format!(
                    "cancelled{}; spent {} tokens in, {} out, ${:.6}",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({reason})")
                    },
                    spent.input,
                    spent.output,
                    spent.cost
                ),
            });
            End::Cancelled
        }
        Err(Stop::Halt(h)) => End::Failed(h.to_string()),
        Err(Stop::Failed(m)) => {
            let _ = io.send(&FromAgent::Error { error: m.clone() });
            End::Failed(m)
        }
    }
}

/// A job worker's answer reported as its item's result (`job.report`,
/// SPEC 10), asking for no next item: the job starts a new worker for it.
/// The answer is the result as JSON when it is JSON (a model asked for an
/// object answers with one), else as a string.
fn report(io: &mut Io, answer: &str) -> Result<(), Stop> {
    let result = serde_json::from_str::<Value>(answer.trim())
        .unwrap_or_else(|_| Value::String(answer.to_owned()));
    match io.request("job.report", json!({"result": result, "stop": true}))? {
        Ok(_) => Ok(()),
        Err(e) => Err(Stop::Failed(format!(
            "job.report refused: {}: {}",
            e.code, e.message
        ))),
    }
}

enum Outcome {
    Answer(String),
    OutOfTurns(String),
}

enum Stop {
    Halt(Halt),
    Failed(String),
}

impl From<Halt> for Stop {
    fn from(h: Halt) -> Stop {
        Stop::Halt(h)
    }
}

fn message(io: &mut Io, role: &str, content: String) -> Result<(), Halt> {
    io.send(&FromAgent::Message {
        role: role.to_owned(),
        content,
    })
}

fn turns(
    io: &mut Io,
    provider: &mut dyn Provider,
    settings: &Settings,
    instruction: &str,
    history: &[HistoryMessage],
    spent: &mut Spent,
) -> Result<Outcome, Stop> {
    let specs: Vec<ToolSpec> = settings
        .tools
        .iter()
        .filter_map(|t| tools::spec(t))
        .collect();
    let mut messages = vec![ChatMessage::System(settings.system_prompt.clone())];
    messages.extend(from_history(history));
    // A resumed session holds its instruction already: the runtime recorded
    // a resume's new input, and a run started again after a restart (or a
    // resume without input) is given the task the first run recorded. A
    // first run records it now.
    let recorded = history
        .iter()
        .any(|m| m.role == "user" && m.content == instruction);
    if !recorded && !instruction.is_empty() {
        message(io, "user", instruction.to_owned())?;
        messages.push(ChatMessage::User(instruction.to_owned()));
    }
    // What a crash left in flight runs now, before the model is asked, so
    // every call has its result; what was done is not done again (journal).
    let (mut journal, in_flight) = Journal::read(history);
    for c in in_flight {
        let result = tools::run(&c.name, &c.arguments, settings, io)?;
        message(
            io,
            ROLE_RESULT,
            json!({"id": c.id, "name": c.name, "content": result}).to_string(),
        )?;
        journal.push(&c.name, &c.arguments, &result);
        messages.push(ChatMessage::Tool {
            call_id: c.id,
            content: result,
        });
    }
    let mut last = String::new();
    for _ in 0..settings.max_turns {
        io.poll()?;
        // Inputs that arrived meanwhile are in the transcript already.
        while let Some(t) = io.inputs.pop_front() {
            messages.push(ChatMessage::User(t));
        }
        let cancel = io.cancel.clone();
        let mut lost: Option<Halt> = None;
        let asked_ns = brood_otel::now_ns();
        let turn = provider.complete(
            &messages,
            &specs,
            &mut |d| {
                if lost.is_none()
                    && let Err(h) = io.send(&FromAgent::Chunk {
                        delta: d.to_owned(),
                    })
                {
                    lost = Some(h);
                }
            },
            &cancel,
        );
        if crate::trace::on() {
            let (usage, calls, error) = match &turn {
                Ok(t) => (
                    t.usage.as_ref().map(|u| (u.input, u.output)),
                    t.calls.len(),
                    None,
                ),
                Err(ProviderError::Cancelled) => (None, 0, Some("cancelled".to_owned())),
                Err(ProviderError::Failed(m)) => (None, 0, Some(m.clone())),
            };
            crate::trace::chat(
                &settings.provider,
                &settings.model,
                asked_ns,
                usage,
                calls,
                error.as_deref(),
            );
        }
        if let Some(h) = lost {
            return Err(Stop::Halt(h));
        }
        let turn = match turn {
            Ok(t) => t,
            Err(ProviderError::Cancelled) => {
                io.poll()?;
                return Err(Stop::Halt(Halt::Cancelled(String::new())));
            }
            Err(ProviderError::Failed(m)) => {
                return Err(Stop::Failed(format!("the model call failed: {m}")));
            }
        };
        if let Some(u) = turn.usage {
            spent.input += u.input;
            spent.output += u.output;
            match settings.price {
                Some(p) => {
                    spent.cost += (u.input as f64 * p.input_per_mtok
                        + u.output as f64 * p.output_per_mtok)
                        / 1e6;
                }
                None => spent.unpriced = spent.unpriced || u.input + u.output > 0,
            }
        }
        io.send(&FromAgent::Usage {
            tokens_in: spent.input,
            tokens_out: spent.output,
            cost_usd: spent.cost,
        })?;
        if !turn.text.is_empty() {
            message(io, "assistant", turn.text.clone())?;
            last = turn.text.clone();
        }
        for c in &turn.calls {
            message(
                io,
                ROLE_CALL,
                json!({"id": c.id, "name": c.name, "arguments": c.arguments}).to_string(),
            )?;
        }
        messages.push(ChatMessage::Assistant {
            text: turn.text.clone(),
            calls: turn.calls.clone(),
        });
        if turn.calls.is_empty() {
            return Ok(Outcome::Answer(turn.text));
        }
        for c in &turn.calls {
            let began_ns = brood_otel::now_ns();
            let (result, replayed) = match journal.replayed(&c.name, &c.arguments) {
                Some(recorded) => (recorded, true),
                None => (tools::run(&c.name, &c.arguments, settings, io)?, false),
            };
            crate::trace::tool(&c.name, &c.id, began_ns, &result, replayed);
            message(
                io,
                ROLE_RESULT,
                json!({"id": c.id, "name": c.name, "content": result}).to_string(),
            )?;
            messages.push(ChatMessage::Tool {
                call_id: c.id.clone(),
                content: result,
            });
        }
    }
    Ok(Outcome::OutOfTurns(last))
}
