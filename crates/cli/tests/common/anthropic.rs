//! An Anthropic Messages API server on loopback (the wire protocol Claude
//! Code speaks): `POST /v1/messages` streamed as `message_start`,
//! `content_block_*`, `message_delta`, `message_stop`. It answers the first
//! turn of a conversation with one `Bash` tool call, and a turn that carries
//! a tool result with a final text; every request body is recorded. With
//! `stall`, it never answers (a model mid-call).
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

pub struct Anthropic {
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Anthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Anthropic {
    /// `command` is what the model asks its Bash tool to run; the final
    /// answer is `"done: "` and the tool's output.
    pub async fn start(command: String, stall: bool) -> Anthropic {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (reqs, command) = (reqs.clone(), command.clone());
                tokio::spawn(async move {
                    let Some((path, body)) = super::model::read_request(&mut s).await else {
                        return;
                    };
                    reqs.lock()
                        .unwrap()
                        .push(json!({"path": path, "body": body}));
                    if stall {
                        tokio::time::sleep(Duration::from_secs(120)).await;
                        return;
                    }
                    let _ = answer(&mut s, &path, &body, &command).await;
                });
            }
        });
        Anthropic {
            base_url: format!("http://{addr}"),
            requests,
            task,
        }
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r["body"].clone())
            .collect()
    }
}

/// The tool result of the conversation's last message, if it carries one.
pub fn tool_result(body: &Value) -> Option<String> {
    let last = body["messages"].as_array()?.last()?;
    let r = last["content"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "tool_result")?;
    Some(match &r["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

async fn answer(
    s: &mut tokio::net::TcpStream,
    path: &str,
    body: &Value,
    command: &str,
) -> std::io::Result<()> {
    if !path.starts_with("/v1/messages") {
        return s
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
    }
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    let mut ev = |t: &str, d: Value| out.push_str(&format!("event: {t}\ndata: {d}\n\n"));
    ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 20, "output_tokens": 1}}}),
    );
    match tool_result(body) {
        None => {
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}}),
            );
            let input = json!({"command": command, "description": "do the task"}).to_string();
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input}}),
            );
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            );
            ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 12}}),
            );
        }
        Some(r) => {
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            );
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("done: {}", r.trim())}}),
            );
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            );
            ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 8}}),
            );
        }
    }
    ev("message_stop", json!({"type": "message_stop"}));
    s.write_all(out.as_bytes()).await?;
    s.shutdown().await
}
