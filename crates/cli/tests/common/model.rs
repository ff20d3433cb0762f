//! An OpenAI-compatible chat-completions server on loopback for the agent's
//! tests: it records each request's body and answers with the next scripted
//! reply: a stream of chunks (ending with `[DONE]`, or cut), an error status,
//! or a stream that stalls.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub enum Reply {
    /// These chunks as `data:` lines, then `[DONE]` unless `cut`.
    Stream { chunks: Vec<Value>, cut: bool },
    /// An error status with a JSON error body and `Retry-After`.
    Status(u16, String, Option<u64>),
    /// These chunks, then nothing for a minute.
    Stall(Vec<Value>),
}

/// A text delta chunk.
pub fn text(t: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": t}}]})
}

/// A tool-call delta chunk (no id: local servers leave it out).
pub fn call_part(index: u64, name: Option<&str>, args: &str) -> Value {
    let mut f = json!({"arguments": args});
    if let Some(n) = name {
        f["name"] = json!(n);
    }
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "function": f}]}}]})
}

/// The last chunk's usage.
pub fn usage(input: u64, output: u64) -> Value {
    json!({"choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})
}

pub struct ModelServer {
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelServer {
    pub async fn start(replies: Vec<Reply>) -> ModelServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let (reqs, reps) = (requests.clone(), replies.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let (reqs, reps) = (reqs.clone(), reps.clone());
                tokio::spawn(async move {
                    let Some((_, body)) = read_request(&mut s).await else {
                        return;
                    };
                    reqs.lock().unwrap().push(body);
                    let reply = reps.lock().unwrap().pop_front();
                    let _ = answer(&mut s, reply).await;
                });
            }
        });
        ModelServer {
            base_url: format!("http://{addr}/v1"),
            requests,
            task,
        }
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request read off `s`: its path and its JSON body (`Null`
/// when it has none or it is not JSON). Shared by the test servers.
pub async fn read_request(s: &mut tokio::net::TcpStream) -> Option<(String, Value)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    let head_end = loop {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Some((
        path,
        serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null),
    ))
}

async fn answer(s: &mut tokio::net::TcpStream, reply: Option<Reply>) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    match reply {
        None => {
            let body = r#"{"error": {"message": "the test server has no more replies"}}"#;
            let h = format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(h.as_bytes()).await?;
            s.write_all(body.as_bytes()).await
        }
        Some(Reply::Status(code, message, retry_after)) => {
            let body = json!({"error": {"message": message}}).to_string();
            let mut h = format!(
                "HTTP/1.1 {code} Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            if let Some(r) = retry_after {
                h.push_str(&format!("Retry-After: {r}\r\n"));
            }
            h.push_str("\r\n");
            s.write_all(h.as_bytes()).await?;
            s.write_all(body.as_bytes()).await
        }
        Some(Reply::Stream { chunks, cut }) => {
            s.write_all(head.as_bytes()).await?;
            for c in chunks {
                s.write_all(format!("data: {c}\n\n").as_bytes()).await?;
                s.flush().await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !cut {
                s.write_all(b"data: [DONE]\n\n").await?;
            }
            s.shutdown().await
        }
        Some(Reply::Stall(chunks)) => {
            s.write_all(head.as_bytes()).await?;
            for c in chunks {
                s.write_all(format!("data: {c}\n\n").as_bytes()).await?;
            }
            s.flush().await?;
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
    }
}

/// A provider on the loopback, plain threads and no script, that answers
/// every chat completion (any model) with the same usage: 1,000 tokens in,
/// 500 out.
pub fn fixed_usage_provider() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            if read_body(&c).is_none() {
                continue;
            }
            let answer = json!({
                "id": "c-1", "object": "chat.completion", "model": "m-ui",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
            });
            write_json(c, &answer);
        }
    });
    port
}

/// The body of one HTTP request read from `c` (blocking; by its
/// `content-length`), or `None` when the connection ended first.
pub fn read_body(c: &std::net::TcpStream) -> Option<Vec<u8>> {
    use std::io::{BufRead, Read};
    let mut r = std::io::BufReader::new(c.try_clone().unwrap());
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(body)
}

/// Answers a request on `c` with `answer`, 200, and closes.
pub fn write_json(mut c: std::net::TcpStream, answer: &Value) {
    use std::io::Write;
    let answer = answer.to_string();
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

pub fn gateway_config(
    dir: &std::path::Path,
    port: u16,
    granted: &str,
    other: &str,
) -> std::path::PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[models.openai]\nbase_url = \"http://127.0.0.1:{port}\"\n\n\
             [models.prices]\n\"{granted}\" = {{ input = 2, output = 10 }}\n\"{other}\" = {{ input = 1, output = 1 }}\n"
        ),
    )
    .unwrap();
    config
}

/// A shell command that calls `model` through the agent's gateway (the
/// variables brood gives it), discarding the answer.
pub fn curl_chat_call(model: &str) -> String {
    format!(
        "curl -sS -o /dev/null -H \"Authorization: Bearer $OPENAI_API_KEY\" \
         -H 'content-type: application/json' \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}]}}' \
         \"$OPENAI_BASE_URL/chat/completions\""
    )
}
