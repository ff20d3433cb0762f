//! OpenAI-compatible chat completions, streamed, with tool calls: hosted
//! services, vLLM, llama.cpp's server, Ollama. What local servers do
//! differently is accepted: usage missing from the stream, tool-call deltas
//! without ids (or without an index), extra fields such as
//! `reasoning_content`. A 429 or 5xx (or a stream cut before `[DONE]`) is
//! retried with backoff, honouring `Retry-After`; an unreachable server, a
//! refused key and an unknown model fail at once with a message naming them.
//!
//! The call runs on a thread of its own and hands events to the agent's
//! thread, which watches for a cancel meanwhile: a cancel is honoured at once,
//! not when the server next sends something.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{ChatMessage, Provider, ProviderError, ToolCall, ToolSpec, Turn, Usage};
use crate::io::CancelFlag;

/// Calls after the first a transient failure allows.
const RETRIES: u32 = 3;
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

pub struct OpenAi {
    base_url: String,
    model: String,
    key: Option<String>,
    key_env: Option<String>,
    timeout: Duration,
    backoff: Duration,
}

impl OpenAi {
    /// `key_env` names the environment variable holding the key; the key
    /// itself is read here and never written anywhere.
    pub fn new(
        base_url: &str,
        model: &str,
        key_env: Option<&str>,
        timeout: Duration,
    ) -> Result<OpenAi, String> {
        let key = match key_env {
            Some(v) => Some(std::env::var(v).map_err(|_| {
                format!("the provider's key variable {v} is not set in this agent's environment (its policy must pass it)")
            })?),
            None => None,
        };
        Ok(OpenAi {
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            key,
            key_env: key_env.map(str::to_owned),
            timeout,
            backoff: Duration::from_millis(500),
        })
    }

    /// A shorter backoff, for tests against a local server.
    pub fn with_backoff(mut self, d: Duration) -> OpenAi {
        self.backoff = d;
        self
    }

    fn body(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> Value {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| match m {
                ChatMessage::System(t) => json!({"role": "system", "content": t}),
                ChatMessage::User(t) => json!({"role": "user", "content": t}),
                ChatMessage::Assistant { text, calls } => {
                    let mut v = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
                    if !calls.is_empty() {
                        v["tool_calls"] = calls
                            .iter()
                            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                            .collect();
                    }
                    v
                }
                ChatMessage::Tool { call_id, content } => {
                    json!({"role": "tool", "tool_call_id": call_id, "content": content})
                }
            })
            .collect();
        let mut body = json!({
            "model": self.model,
            "messages": msgs,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
        }
        body
    }
}

/// What the call's thread reports.
enum Event {
    Text(String),
    End(Ending),
}

/// How a call ended.
enum Ending {
    Done(Turn),
    /// Worth another try (429, 5xx, a cut stream), after this long.
    Transient(String, Option<Duration>),
    Fatal(String),
}

impl Provider for OpenAi {
    fn complete(
        &mut self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        delta: &mut dyn FnMut(&str),
        cancel: &CancelFlag,
    ) -> Result<Turn, ProviderError> {
        let body = self.body(messages, tools).to_string();
        let mut wait = self.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (tx, rx) = mpsc::channel();
            let url = format!("{}/chat/completions", self.base_url);
            let (key, key_env, model, timeout, body) = (
                self.key.clone(),
                self.key_env.clone(),
                self.model.clone(),
                self.timeout,
                body.clone(),
            );
            std::thread::spawn(move || {
                call(
                    &url,
                    key.as_deref(),
                    key_env.as_deref(),
                    &model,
                    timeout,
                    &body,
                    &tx,
                )
            });
            let mut streamed = String::new();
            let outcome = loop {
                if cancel.is_set() {
                    return Err(ProviderError::Cancelled);
                }
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(Event::Text(t)) => {
                        delta(&t);
                        streamed.push_str(&t);
                    }
                    Ok(Event::End(e)) => break e,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        break Ending::Transient("the call ended without an answer".into(), None);
                    }
                }
            };
            match outcome {
                Ending::Done(turn) => return Ok(turn),
                Ending::Fatal(m) => return Err(ProviderError::Failed(m)),
                Ending::Transient(m, after) if attempt <= RETRIES => {
                    let pause = after.unwrap_or(wait).min(MAX_RETRY_AFTER);
                    eprintln!(
                        "brood agent: {m}; trying again in {pause:?} (attempt {} of {})",
                        attempt + 1,
                        RETRIES + 1
                    );
                    if !streamed.is_empty() {
                        delta("\n[the model's stream was cut; asking again]\n");
                    }
                    let until = std::time::Instant::now() + pause;
                    while std::time::Instant::now() < until {
                        if cancel.is_set() {
                            return Err(ProviderError::Cancelled);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    wait *= 2;
                }
                Ending::Transient(m, _) => {
                    return Err(ProviderError::Failed(format!(
                        "{m} (gave up after {attempt} attempts)"
                    )));
                }
            }
        }
    }
}

/// One HTTP call, streamed; events go to `tx`.
fn call(
    url: &str,
    key: Option<&str>,
    key_env: Option<&str>,
    model: &str,
    timeout: Duration,
    body: &str,
    tx: &mpsc::Sender<Event>,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let mut req = agent.post(url).header("Content-Type", "application/json");
    if let Some(k) = key {
        req = req.header("Authorization", format!("Bearer {k}"));
    }
    let resp = match req.send(body) {
        Ok(r) => r,
        Err(e) => {
            let m = format!("cannot reach the model server at {url}: {e}");
            let transient = matches!(e, ureq::Error::Timeout(_));
            let _ = tx.send(Event::End(if transient {
                Ending::Transient(m, None)
            } else {
                Ending::Fatal(m)
            }));
            return;
        }
    };
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let mut body = resp.into_body();
    if status != 200 {
        let text = body.read_to_string().unwrap_or_default();
        let detail = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(300).collect());
        let m = format!("the model server at {url} answered {status}: {detail}");
        let _ = tx.send(Event::End(match status {
            429 | 500..=599 => Ending::Transient(m, retry_after),
            401 | 403 => Ending::Fatal(format!(
                "{m} (check the key in {})",
                key_env.unwrap_or("the provider's key variable, none configured")
            )),
            404 => Ending::Fatal(format!(
                "{m} (is the model {model:?} known to this server?)"
            )),
            _ => Ending::Fatal(m),
        }));
        return;
    }
    let reader = BufReader::new(body.as_reader());
    let mut acc = Accumulator::default();
    for line in reader.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Event::End(Ending::Transient(
                    format!("the model's stream broke: {e}"),
                    None,
                )));
                return;
            }
        };
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            let _ = tx.send(Event::End(Ending::Done(acc.finish())));
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue; // keep-alives and comments some servers send
        };
        if let Some(m) = chunk["error"]["message"].as_str() {
            let _ = tx.send(Event::End(Ending::Fatal(format!(
                "the model server reported: {m}"
            ))));
            return;
        }
        if let Some(t) = acc.take(&chunk)
            && tx.send(Event::Text(t)).is_err()
        {
            return; // cancelled: nobody listens
        }
    }
    let _ = tx.send(Event::End(Ending::Transient(
        "the model's stream ended before [DONE]".into(),
        None,
    )));
}

/// Builds one turn from the stream's chunks.
#[derive(Default)]
struct Accumulator {
    text: String,
    /// By index (or, without one, by order of appearance).
    calls: BTreeMap<u64, (Option<String>, String, String)>,
    usage: Option<Usage>,
}

impl Accumulator {
    /// Takes one chunk; returns its text delta, if any.
    fn take(&mut self, chunk: &Value) -> Option<String> {
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(Usage {
                input: u["prompt_tokens"].as_u64().unwrap_or(0),
                output: u["completion_tokens"].as_u64().unwrap_or(0),
            });
        }
        let d = &chunk["choices"][0]["delta"];
        if let Some(calls) = d["tool_calls"].as_array() {
            for c in calls {
                let index = c["index"].as_u64().unwrap_or_else(|| {
                    // No index: a new call when it carries an id or a name,
                    // else more arguments for the last one.
                    let last = self.calls.keys().next_back().copied();
                    match (
                        last,
                        c["id"].is_string() || c["function"]["name"].is_string(),
                    ) {
                        (Some(l), false) => l,
                        (Some(l), true) => l + 1,
                        (None, _) => 0,
                    }
                });
                let e = self.calls.entry(index).or_default();
                if let Some(id) = c["id"].as_str().filter(|s| !s.is_empty()) {
                    e.0 = Some(id.to_owned());
                }
                if let Some(n) = c["function"]["name"].as_str() {
                    e.1.push_str(n);
                }
                if let Some(a) = c["function"]["arguments"].as_str() {
                    e.2.push_str(a);
                }
            }
        }
        let t = d["content"].as_str().filter(|t| !t.is_empty())?;
        self.text.push_str(t);
        Some(t.to_owned())
    }

    fn finish(self) -> Turn {
        Turn {
            text: self.text,
            calls: self
                .calls
                .into_iter()
                .enumerate()
                .map(|(i, (_, (id, name, args)))| ToolCall {
                    id: id.unwrap_or_else(|| format!("call_{}", i + 1)),
                    name,
                    arguments: if args.trim().is_empty() {
                        "{}".into()
                    } else {
                        args
                    },
                })
                .collect(),
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_split_over_chunks_without_ids_are_joined() {
        let mut a = Accumulator::default();
        let chunks = [
            json!({"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
            json!({"choices": [{"delta": {"content": "Let me look."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "file_read", "arguments": "{\"pa"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\": \"a.txt\"}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "file_list"}}]}}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
        ];
        let texts: Vec<String> = chunks.iter().filter_map(|c| a.take(c)).collect();
        assert_eq!(texts, ["Let me look."]);
        let t = a.finish();
        assert_eq!(t.calls.len(), 2, "{t:?}");
        assert_eq!(
            (t.calls[0].id.as_str(), t.calls[0].name.as_str()),
            ("call_1", "file_read")
        );
        assert_eq!(t.calls[0].arguments, "{\"path\": \"a.txt\"}");
        assert_eq!(
            (t.calls[1].name.as_str(), t.calls[1].arguments.as_str()),
            ("file_list", "{}")
        );
        assert_eq!(
            t.usage,
            Some(Usage {
                input: 10,
                output: 5
            })
        );
    }
}
