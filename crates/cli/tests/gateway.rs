//! Issue 31, the model gateway, attacked as a hostile child would: a child
//! that reads its environment and every file it can reach finds no
//! provider's key (a daemon's key from its environment and one from a
//! file); a child that reports no usage while it calls is cancelled at its
//! budget, brood's count being the one that holds; a model its policy does
//! not grant is refused naming it and never sent; a child that keeps a
//! stream open after its cancel gets nothing more, and nothing it sends is
//! forwarded. The provider is a loopback server written here that speaks
//! OpenAI's chat completions and responses and Anthropic's messages,
//! streaming included, and records what reached it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brood_runtime::models::{Key, Kind, Price, Providers, Upstream as Provider};
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What reached the loopback provider.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: BTreeMap<String, String>,
    body: Value,
}

/// A loopback provider. Each answer uses 1000 input and 500 output tokens
/// (said in its usage unless the model's name holds `nousage`). A stream
/// for a model whose name holds `slow` sends a chunk every 50 ms for a
/// minute; `written` counts the chunks it could write.
struct Upstream {
    base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    written: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicUsize::new(0));
        let (s2, w2) = (seen.clone(), written.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (s, w) = (s2.clone(), w2.clone());
                tokio::spawn(async move { serve(sock, s, w).await });
            }
        });
        Upstream {
            base_url: format!("http://{addr}"),
            seen,
            written,
            task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn read_request(s: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some(Seen {
        path,
        headers,
        body,
    })
}

/// The events of one streamed answer, in the request's protocol.
fn stream_events(path: &str, model: &str, chunks: usize, usage: bool) -> Vec<String> {
    let data = |v: Value| format!("data: {v}\n\n");
    let mut out = Vec::new();
    if path == "/v1/messages" {
        let u = if usage { 1000 } else { 0 };
        out.push(format!(
            "event: message_start\n{}",
            data(
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [], "usage": {"input_tokens": u, "output_tokens": 1}}})
            )
        ));
        out.push(format!(
            "event: content_block_start\n{}",
            data(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            )
        ));
        for _ in 0..chunks {
            out.push(format!(
                "event: content_block_delta\n{}",
                data(
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello "}})
                )
            ));
        }
        out.push(format!(
            "event: content_block_stop\n{}",
            data(json!({"type": "content_block_stop", "index": 0}))
        ));
        out.push(format!(
            "event: message_delta\n{}",
            data(
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": if usage { 500 } else { 0 }}})
            )
        ));
        out.push(format!(
            "event: message_stop\n{}",
            data(json!({"type": "message_stop"}))
        ));
    } else {
        for _ in 0..chunks {
            out.push(data(
                json!({"object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {"content": "hello "}}]}),
            ));
        }
        if usage {
            out.push(data(
                json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}),
            ));
        }
        out.push("data: [DONE]\n\n".into());
    }
    out
}

async fn serve(
    mut s: tokio::net::TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    written: Arc<AtomicUsize>,
) {
    let Some(req) = read_request(&mut s).await else {
        return;
    };
    seen.lock().unwrap().push(req.clone());
    let model = req.body["model"].as_str().unwrap_or("").to_owned();
    let usage = !model.contains("nousage");
    if req.body["stream"] == json!(true) {
        let slow = model.contains("slow");
        let chunks = if slow { 1200 } else { 5 };
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        for e in stream_events(&req.path, &model, chunks, usage) {
            if s.write_all(e.as_bytes()).await.is_err() || s.flush().await.is_err() {
                return;
            }
            written.fetch_add(1, Ordering::SeqCst);
            if slow {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        return;
    }
    let u = |i: u64, o: u64| {
        if usage {
            json!({"input_tokens": i, "output_tokens": o})
        } else {
            Value::Null
        }
    };
    let body = match req.path.as_str() {
        "/v1/messages" => {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn", "usage": u(1000, 500)})
        }
        "/v1/responses" => {
            json!({"id": "resp_1", "object": "response", "output": [{"type": "message", "content": [{"type": "output_text", "text": "hello"}]}], "usage": u(1000, 500)})
        }
        _ => {
            let usage = if usage {
                json!({"prompt_tokens": 1000, "completion_tokens": 500})
            } else {
                Value::Null
            };
            json!({"id": "c1", "object": "chat.completion", "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}], "usage": usage})
        }
    }
    .to_string();
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
}

/// A price of $1 a million input tokens and $2 a million output: each
/// answer of the loopback provider costs $0.002.
fn price() -> Price {
    Price {
        input: 1.0,
        output: 2.0,
    }
}

const OPENAI_KEY: &str = "sk-gateway-test-openai-4f1c";
const ANTHROPIC_KEY: &str = "sk-ant-gateway-test-9b2e";

/// A supervisor in this process whose gateway forwards to `up`.
fn start_gw(up: &Upstream, models: &[&str], grace: Duration) -> Env {
    let provider = |kind| Provider {
        kind,
        base_url: up.base_url.clone(),
        key: Some(Key::new(match kind {
            Kind::OpenAi => OPENAI_KEY,
            Kind::Anthropic => ANTHROPIC_KEY,
        })),
        key_file: None,
    };
    let providers = Providers {
        openai: Some(provider(Kind::OpenAi)),
        anthropic: Some(provider(Kind::Anthropic)),
        prices: models.iter().map(|m| ((*m).to_owned(), price())).collect(),
    };
    start_with(grace, |cfg| {
        cfg.gateway = Some(brood_runtime::Gateway {
            host: brood_server::gateway::host(),
            providers: Arc::new(providers),
        });
    })
}

/// The JSON of a chat completion for `model`.
fn chat(model: &str, stream: bool) -> String {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

/// A shell line calling the gateway's chat completions with `curl`,
/// writing the answer to `out` and curl's exit code after it.
fn curl_chat(body: &str, out: &Path) -> String {
    format!(
        "curl -sS -N -o {out} -w '%{{http_code}}\\n' -H \"Authorization: Bearer $OPENAI_API_KEY\" \
         -H 'content-type: application/json' -d '{body}' \"$OPENAI_BASE_URL/chat/completions\"; \
         echo \"curl $?\"",
        out = out.display()
    )
}

/// The agent's events of `kind`, from the store (the log's truth; its
/// `events.jsonl` is a projection written after).
fn events_of(env: &Env, n: &str, kind: &str) -> Vec<Value> {
    let view = env.sup.view();
    view.store()
        .events(view.tenant(), 0, Some(&name(n)), 10_000)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| serde_json::from_str(&e.payload).unwrap())
        .collect()
}

fn spawn_json(n: &str, script: &str, policy: Value) -> Value {
    json!({"name": n, "protocol": "exec", "argv": ["/bin/sh", "-c", script], "policy": policy, "await_ready": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_reports_no_usage_is_cancelled_at_its_budget_by_brood_s_count() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-1"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    // Twenty calls at $0.002 each, never a `usage` of its own (an `exec`
    // agent says nothing); its budget ($0.0099) is passed by the fifth.
    let out = dir.path().join("answer");
    let script = format!(
        "for i in $(seq 1 20); do {} >> {log}; done; sleep 30",
        curl_chat(&chat("m-1", false), &out),
        log = dir.path().join("codes").display()
    );
    let policy = json!({"cost_limit": 0.0099, "files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}]});
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("spender", &script, policy),
    )
    .await
    .unwrap();
    let shown = wait_end(&env, "spender").await;
    assert_eq!(shown["reason"], "budget_exceeded", "{shown}");
    let calls = events_of(&env, "spender", "agent.model.call");
    let sent: Vec<&Value> = calls.iter().filter(|c| c["outcome"] == "ok").collect();
    assert_eq!(sent.len(), 5, "the fifth call passed the budget: {calls:?}");
    for c in &sent {
        assert_eq!(
            (
                c["tokens_in"].as_u64(),
                c["tokens_out"].as_u64(),
                c["estimated"].as_bool()
            ),
            (Some(1000), Some(500), Some(false)),
            "{c}"
        );
        assert!(
            (c["cost_usd"].as_f64().unwrap() - 0.002).abs() < 1e-12,
            "{c}"
        );
        assert_eq!(c["model"], "m-1");
    }
    // What reached the provider: those five, no more.
    assert_eq!(up.seen().len(), 5, "{:?}", up.seen());
    // brood's count is the agent's spend.
    let spent = shown["spend"]["own"]["cost_usd"].as_f64().unwrap();
    assert!((spent - 0.01).abs() < 1e-9, "{shown}");
    assert_eq!(
        shown["spend"]["own"]["tokens_in"].as_u64(),
        Some(5000),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_s_lower_usage_report_never_lowers_brood_s_count() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-1"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    // One call brood counts at $0.002, then the test agent (a protocol
    // agent) in the same process reports $0.0001 as its whole usage.
    let script = format!(
        "{{ {}; }} >/dev/null; exec {} test-agent --usage 1,1,0.0001",
        curl_chat(&chat("m-1", false), &dir.path().join("a")),
        exe()
    );
    let body = json!({"name": "liar", "protocol": "brood", "argv": ["/bin/sh", "-c", script], "await_ready": true});
    handle(&env.sup, &me(), "spawn", &body).await.unwrap();
    let shown = wait_end(&env, "liar").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    // It reported its own usage, lower than brood's count.
    assert_eq!(shown["tokens_in"].as_u64(), Some(1000), "{shown}");
    let spent = shown["spend"]["own"]["cost_usd"].as_f64().unwrap();
    assert!((spent - 0.002).abs() < 1e-9, "brood's count holds: {shown}");
    assert_eq!(events_of(&env, "liar", "agent.model.call").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ungranted_or_unpriced_model_is_refused_naming_it_and_never_sent() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-ok", "m-other"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // A key of its own making is no key at all: the last call.
    let forged = format!(
        "curl -sS -o {d}/forged -w '%{{http_code}}' -H 'Authorization: Bearer sk-forged' \
         -H 'content-type: application/json' -d '{}' \"$OPENAI_BASE_URL/chat/completions\"",
        chat("m-ok", false)
    );
    let script = format!(
        "{}; {}; {}; {forged}",
        curl_chat(&chat("m-other", false), &dir.path().join("other")),
        curl_chat(&chat("m-unpriced", false), &dir.path().join("unpriced")),
        curl_chat(&chat("m-ok", false), &dir.path().join("ok")),
    );
    let policy = json!({"models": ["m-ok", "m-unpriced"], "files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}]});
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("picky", &script, policy),
    )
    .await
    .unwrap();
    let shown = wait_end(&env, "picky").await;
    let other: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("other")).unwrap()).unwrap();
    assert!(
        other["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"m-other\" is not granted"),
        "{other} {shown}"
    );
    assert_eq!(other["error"]["code"], "model_not_granted");
    let unpriced: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("unpriced")).unwrap()).unwrap();
    assert!(
        unpriced["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"m-unpriced\" has no price"),
        "{unpriced}"
    );
    let ok: Value = serde_json::from_slice(&std::fs::read(dir.path().join("ok")).unwrap()).unwrap();
    assert_eq!(ok["choices"][0]["message"]["content"], "hello", "{ok}");
    let forged: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("forged")).unwrap()).unwrap();
    assert_eq!(forged["error"]["type"], "authentication_error", "{forged}");
    // Only the granted, priced call reached the provider, with the
    // operator's key and not the agent's token.
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].body["model"], "m-ok");
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    // Each refusal is in the agent's log with its status.
    let calls = events_of(&env, "picky", "agent.model.call");
    let refused: Vec<(String, u64)> = calls
        .iter()
        .filter(|c| c["outcome"] == "refused")
        .map(|c| {
            (
                c["model"].as_str().unwrap().to_owned(),
                c["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        vec![("m-other".to_owned(), 403), ("m-unpriced".to_owned(), 403)],
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_kept_open_after_a_cancel_gets_nothing_more_and_nothing_new_is_sent() {
    let up = Upstream::start().await;
    // A long grace: the child ignores SIGTERM and lives on for a while.
    let env = start_gw(&up, &["m-slow"], Duration::from_secs(6));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "trap '' TERM; ({}) > {d}/first.code 2>&1 & \
         while [ ! -e {d}/go ]; do sleep 0.05; done; \
         ({}) > {d}/second.code 2>&1; sleep 30",
        curl_chat(&chat("m-slow", true), &dir.path().join("stream")),
        curl_chat(&chat("m-slow", false), &dir.path().join("after")),
    );
    let policy = json!({"files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}]});
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("holder", &script, policy),
    )
    .await
    .unwrap();
    let stream = dir.path().join("stream");
    let size = || std::fs::metadata(&stream).map(|m| m.len()).unwrap_or(0);
    assert!(
        eventually_async(Duration::from_secs(10), || size() > 200).await,
        "the stream flows"
    );
    env.sup.cancel(me(), name("holder")).await.unwrap();
    // Cut: curl's transfer ended with an error while the child lives on.
    let first = dir.path().join("first.code");
    assert!(
        eventually_async(Duration::from_secs(3), || read_opt(&first)
            .contains("curl "))
        .await,
        "the stream was cut at the cancel"
    );
    assert!(!read_opt(&first).contains("curl 0"), "{}", read_opt(&first));
    let at_cut = size();
    let written_at_cut = up.written.load(Ordering::SeqCst);
    // The child goes on (it ignores SIGTERM) and calls again.
    std::fs::write(dir.path().join("go"), "").unwrap();
    let second = dir.path().join("second.code");
    assert!(
        eventually_async(Duration::from_secs(3), || read_opt(&second)
            .contains("curl "))
        .await,
        "the second call ended"
    );
    assert!(
        !read_opt(&second).contains("curl 0"),
        "a call after the cancel fails: {}",
        read_opt(&second)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(size(), at_cut, "nothing more reached the child");
    // The provider's stream was let go: it could write at most what its
    // socket held when brood stopped reading.
    let after = up.written.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        up.written.load(Ordering::SeqCst),
        after,
        "the provider's stream is closed (written {written_at_cut} at the cut)"
    );
    // Nothing was forwarded after the cancel: one request only.
    assert_eq!(up.seen().len(), 1, "{:?}", up.seen());
    let shown = wait_end(&env, "holder").await;
    assert_eq!(shown["status"], "cancelled", "{shown}");
    let calls = events_of(&env, "holder", "agent.model.call");
    assert!(
        calls
            .iter()
            .any(|c| c["outcome"] == "cut" && c["stream"] == true),
        "{calls:?}"
    );
}

fn read_opt(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_passes_the_budget_is_cut_and_its_agent_cancelled() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-slow-nousage"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    // No usage in the stream: brood counts the text, six bytes a chunk,
    // at $2 a million output tokens; a budget of $0.0003 is passed after
    // about two hundred chunks, long before the stream's 1200.
    let script = format!(
        "{}; sleep 30",
        curl_chat(&chat("m-slow-nousage", true), &dir.path().join("stream"))
    );
    let policy = json!({"cost_limit": 0.0003, "files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}]});
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("streamer", &script, policy),
    )
    .await
    .unwrap();
    let shown = wait_end(&env, "streamer").await;
    assert_eq!(shown["reason"], "budget_exceeded", "{shown}");
    let calls = events_of(&env, "streamer", "agent.model.call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["outcome"], "cut", "{calls:?}");
    assert_eq!(calls[0]["estimated"], true, "{calls:?}");
    assert!(calls[0]["cost_usd"].as_f64().unwrap() > 0.0003, "{calls:?}");
    assert!(up.written.load(Ordering::SeqCst) < 1200);
}

/// The hostile child of issue 31 under a real `brood serve`: one key in
/// the daemon's environment, one in a file beside the root; the child
/// dumps its environment, every process's environment it can see and
/// every file it can read under the test's directory, `/etc` and `/run`,
/// and calls both protocols through the gateway. No key is in the dump;
/// both reached the provider on the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_child_finds_no_key_in_its_environment_or_any_file() {
    use std::os::unix::fs::PermissionsExt;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let key_file = keys.join("anthropic.key");
    std::fs::write(&key_file, format!("{ANTHROPIC_KEY}\n")).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(dir.path().join("marker.txt"), "marker-readable-7d1").unwrap();
    std::fs::write(
        root.join("config.toml"),
        format!(
            "[models.openai]\nbase_url = \"{u}\"\nkey_env = \"GW_TEST_OPENAI_KEY\"\n\
             [models.anthropic]\nbase_url = \"{u}\"\nkey_file = \"{k}\"\n\
             [models.prices]\n\"m-1\" = {{ input = 1.0, output = 2.0 }}\n",
            u = up.base_url,
            k = key_file.display()
        ),
    )
    .unwrap();
    let _d = serve_daemon_with(&root, None, &[("GW_TEST_OPENAI_KEY", OPENAI_KEY)]);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let o = out.display();
    let script = format!(
        "{{ echo '== env'; env; echo '== environ'; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'; \
           echo '== files'; find {d} /etc /run -path {o} -prune -o -type f -size -2M -print 2>/dev/null \
             | while read -r f; do cat \"$f\" 2>/dev/null; done; \
           echo '== key file'; cat {k}; }} > {o}/dump 2>&1; \
         {chat_call}; \
         curl -sS -N -o {o}/messages -H \"x-api-key: $ANTHROPIC_API_KEY\" -H 'anthropic-version: 2023-06-01' \
           -H 'content-type: application/json' \
           -d '{{\"model\":\"m-1\",\"stream\":true,\"max_tokens\":10,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}' \
           \"$ANTHROPIC_BASE_URL/v1/messages\"; echo done > {o}/finished",
        d = dir.path().display(),
        k = key_file.display(),
        chat_call = curl_chat(&chat("m-1", true), &out.join("chat")),
    );
    let o = brood(
        &root,
        &[
            "spawn",
            "--name",
            "hostile",
            "--protocol",
            "exec",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = brood(&root, &["wait", "hostile", "--timeout", "60"]);
    assert!(o.status.success(), "{}", text(&o));
    let dump = String::from_utf8_lossy(&std::fs::read(out.join("dump")).unwrap()).into_owned();
    // It really read: its own token, and the files beside the key's.
    assert!(
        dump.contains("marker-readable-7d1"),
        "the dump read the test's files"
    );
    assert!(
        dump.contains("OPENAI_API_KEY=brood-"),
        "its token is in its environment"
    );
    assert!(
        dump.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:"),
        "{dump}"
    );
    for key in [OPENAI_KEY, ANTHROPIC_KEY] {
        assert!(!dump.contains(key), "the child found the key {key}");
    }
    // Both calls went through, each with the operator's key added.
    let chat_answer = std::fs::read_to_string(out.join("chat")).unwrap();
    assert!(chat_answer.contains("[DONE]"), "{chat_answer}");
    let messages = std::fs::read_to_string(out.join("messages")).unwrap();
    assert!(messages.contains("message_stop"), "{messages}");
    let seen = up.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let chat_seen = seen
        .iter()
        .find(|s| s.path == "/v1/chat/completions")
        .unwrap();
    assert_eq!(
        chat_seen.headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    let msg_seen = seen.iter().find(|s| s.path == "/v1/messages").unwrap();
    assert_eq!(
        msg_seen.headers.get("x-api-key").map(String::as_str),
        Some(ANTHROPIC_KEY)
    );
    assert_eq!(
        msg_seen
            .headers
            .get("anthropic-version")
            .map(String::as_str),
        Some("2023-06-01")
    );
    // brood counted both: $0.002 each.
    let o = brood(&root, &["show", "hostile", "--json"]);
    let shown: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let spent = shown["spend"]["own"]["cost_usd"].as_f64().unwrap_or(-1.0);
    assert!((spent - 0.004).abs() < 1e-9, "{}", text(&o));
}

/// The real Claude Code CLI (installed from npm by `.ci/setup`) through
/// the gateway: its policy gives it no key and no address; the gateway's
/// variables take it to the loopback Anthropic server, which scripts a
/// Bash tool call and a final answer; brood records each of its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_calls_its_model_through_the_gateway_with_no_key() {
    let claude = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/ci-node/node_modules/@anthropic-ai/claude-code-linux-x64/claude");
    assert!(
        claude.exists(),
        "{} is missing: run `bash .ci/setup` (it installs Claude Code from npm)",
        claude.display()
    );
    let t = tempfile::tempdir().unwrap();
    let (home, work) = (t.path().join("home"), t.path().join("work"));
    for d in [&home, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    let tmp = home.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let command = format!(
        "env | grep -c {ANTHROPIC_KEY} > {w}/found.txt; echo written > {w}/out.txt",
        w = work.display()
    );
    let model = common::anthropic::Anthropic::start(command, false).await;
    let up = Provider {
        kind: Kind::Anthropic,
        base_url: model.base_url.clone(),
        key: Some(Key::new(ANTHROPIC_KEY)),
        key_file: None,
    };
    let providers = Providers {
        openai: None,
        anthropic: Some(up),
        prices: [("m-claude".to_owned(), price())].into(),
    };
    let env = start_with(Duration::from_millis(500), |cfg| {
        cfg.gateway = Some(brood_runtime::Gateway {
            host: brood_server::gateway::host(),
            providers: Arc::new(providers),
        });
    });
    let argv = vec![
        claude.display().to_string(),
        "-p".into(),
        "--model".into(),
        "m-claude".into(),
        "--output-format".into(),
        "text".into(),
        "--allowedTools".into(),
        "Bash".into(),
    ];
    let mut r = req("claude", argv);
    r.protocol = brood_store::Protocol::Exec;
    r.await_ready = false;
    r.task = "Run the command you are given, then report.".into();
    r.cwd = Some(work.display().to_string());
    r.policy = Some(json!({
        "files": [
            {"path": "/", "mode": "ro"},
            {"path": work.display().to_string(), "mode": "rw"},
            {"path": home.display().to_string(), "mode": "rw"},
        ],
        "models": ["m-claude"],
        "env": {
            "HOME": home.display().to_string(),
            "CLAUDE_CODE_TMPDIR": tmp.display().to_string(),
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "m-claude",
            "ANTHROPIC_SMALL_FAST_MODEL": "m-claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
    }));
    env.sup.spawn(me(), r).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("claude")], Some(Duration::from_secs(120)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(
        a["status"],
        "completed",
        "{a}\nlog: {}",
        read(env.sup.paths().agent_dir(&name("claude")).join("log"))
    );
    assert_eq!(read(work.join("out.txt")), "written\n");
    // Its tool's shell found no key in its environment.
    assert_eq!(read(work.join("found.txt")).trim(), "0");
    let calls = events_of(&env, "claude", "agent.model.call");
    let ok: Vec<&Value> = calls.iter().filter(|c| c["outcome"] == "ok").collect();
    assert!(ok.len() >= 2, "the tool call and the answer: {calls:?}");
    assert!(
        ok.iter()
            .all(|c| c["endpoint"] == "/v1/messages" && c["stream"] == true),
        "{calls:?}"
    );
    assert!(model.bodies().len() >= 2);
    let spent = show(&env, "claude")["spend"]["own"]["cost_usd"]
        .as_f64()
        .unwrap();
    assert!(spent > 0.0, "brood counted its calls");
}

/// `network: none` in the host's network namespace gets no endpoint: a TCP
/// socket let through for it could reach that port on any host (landlock
/// checks ports, not addresses), so the agent is given no variable, no
/// socket, and reaches neither a gateway nor the provider. (`iso = ns`
/// gives it one, below.) A policy's `env` value holding a provider's key
/// never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_none_child_in_the_host_namespace_gets_no_gateway_and_no_key() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-1"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        "{gw} > {d}/gw.code; \
         curl -sS -o {d}/direct -w '%{{http_code}}' -H 'content-type: application/json' \
           -d '{body}' {base}/v1/chat/completions > {d}/direct.code 2>&1; echo \" curl $?\" >> {d}/direct.code; \
         env > {d}/env",
        gw = curl_chat(&chat("m-1", false), &dir.path().join("gw")),
        body = chat("m-1", false),
        base = up.base_url,
    );
    let policy = json!({
        "network": "none",
        "env": {"LEAKED": format!("key={OPENAI_KEY}"), "KEPT": "plain"},
        "files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}],
    });
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("closed", &script, policy),
    )
    .await
    .unwrap();
    let shown = wait_end(&env, "closed").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    let child_env = read(dir.path().join("env"));
    for var in ["OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL"] {
        assert!(!child_env.contains(var), "{var} given: {child_env}");
    }
    // Neither the gateway's address nor the provider's port: no socket.
    let gw = read(dir.path().join("gw.code"));
    assert!(!gw.contains("curl 0"), "{gw}");
    let direct = read(dir.path().join("direct.code"));
    assert!(!direct.contains("curl 0"), "{direct}");
    assert!(
        up.seen().is_empty(),
        "a call reached the provider: {:?}",
        up.seen()
    );
    assert!(events_of(&env, "closed", "agent.model.call").is_empty());
    assert!(child_env.contains("KEPT=plain"), "{child_env}");
    assert!(!child_env.contains("LEAKED"), "{child_env}");
    assert!(!child_env.contains(OPENAI_KEY), "{child_env}");
}

/// An endpoint answers its own run alone: a sibling that learns another
/// agent's address is refused there with its own token and with none; the
/// responses endpoint is metered like the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_agent_s_endpoint_refuses_a_sibling_s_token() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-1"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let files = json!({"files": [{"path": "/", "mode": "ro"}, {"path": dir.path().to_str().unwrap(), "mode": "rw"}]});
    // The owner tells the world where its endpoint is, then waits.
    let owner =
        format!("echo \"$OPENAI_BASE_URL\" > {d}/url.tmp; mv {d}/url.tmp {d}/url; sleep 30");
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("owner", &owner, files.clone()),
    )
    .await
    .unwrap();
    let body = json!({"model": "m-1", "input": "hi"}).to_string();
    let thief = format!(
        "while [ ! -e {d}/url ]; do sleep 0.05; done; url=$(cat {d}/url); \
         curl -sS -o /dev/null -w '%{{http_code}}\\n' -H \"Authorization: Bearer $OPENAI_API_KEY\" \
           -H 'content-type: application/json' -d '{body}' \"$url/responses\" > {d}/theirs; \
         curl -sS -o /dev/null -w '%{{http_code}}\\n' -H 'content-type: application/json' \
           -d '{body}' \"$url/responses\" >> {d}/theirs; \
         curl -sS -o {d}/mine -H \"Authorization: Bearer $OPENAI_API_KEY\" \
           -H 'content-type: application/json' -d '{body}' \"$OPENAI_BASE_URL/responses\""
    );
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn_json("thief", &thief, files),
    )
    .await
    .unwrap();
    let shown = wait_end(&env, "thief").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    assert_eq!(read(dir.path().join("theirs")), "401\n401\n");
    let mine: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("mine")).unwrap()).unwrap();
    assert_eq!(mine["object"], "response", "{mine}");
    // One call reached the provider, the thief's own, counted to it alone.
    assert_eq!(up.seen().len(), 1, "{:?}", up.seen());
    assert_eq!(up.seen()[0].path, "/v1/responses");
    let calls = events_of(&env, "thief", "agent.model.call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (
            calls[0]["endpoint"].as_str(),
            calls[0]["tokens_in"].as_u64(),
            calls[0]["tokens_out"].as_u64()
        ),
        (Some("/v1/responses"), Some(1000), Some(500))
    );
    assert!(events_of(&env, "owner", "agent.model.call").is_empty());
    env.sup.cancel(me(), name("owner")).await.unwrap();
}

/// `iso = ns` with `network: none`: an empty network namespace of its own,
/// whose only address is its loopback; its endpoint is bound there by the
/// daemon, and the host's loopback (the provider's port) is not reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_in_an_empty_network_namespace_reaches_its_endpoint_there() {
    let up = Upstream::start().await;
    let env = start_gw(&up, &["m-1"], Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().to_string_lossy().into_owned();
    let mut mounts = system_mounts();
    mounts.push(format!("{w}\t/wdir\trw\tbind,nosuid,nodev"));
    // File rules name host paths, bound to their inodes (what the mounts
    // show inside): the system's directories readable, so runnable.
    let mut files: Vec<Value> = ["/usr", "/lib", "/lib64", "/bin", "/etc"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| json!({"path": p, "mode": "ro"}))
        .collect();
    files.push(json!({"path": w, "mode": "rw"}));
    let policy = json!({
        "files": files,
        "mounts": mounts,
        "network": "none",
    });
    let script = format!(
        "{gw} > /wdir/gw.code 2>&1; \
         curl -sS -o /dev/null -H 'content-type: application/json' -d '{body}' \
           {base}/v1/chat/completions > /wdir/direct.code 2>&1; echo \"curl $?\" >> /wdir/direct.code; \
         echo \"$OPENAI_BASE_URL\" > /wdir/url",
        gw = curl_chat(&chat("m-1", false), Path::new("/wdir/gw")),
        body = chat("m-1", false),
        base = up.base_url,
    );
    let mut q = req("inside", vec!["/bin/sh".into(), "-c".into(), script]);
    q.protocol = brood_store::Protocol::Exec;
    q.policy = Some(policy);
    q.iso = brood_core::Iso::Ns;
    q.await_ready = false;
    env.sup.spawn(me(), q).await.unwrap();
    let shown = wait_end(&env, "inside").await;
    assert_eq!(shown["status"], "completed", "{shown}");
    assert!(
        read(dir.path().join("url")).starts_with("http://127.0.0.1:"),
        "the endpoint is announced"
    );
    let code = read(dir.path().join("gw.code"));
    assert!(code.contains("curl 0"), "{code}");
    let gw: Value = serde_json::from_slice(&std::fs::read(dir.path().join("gw")).unwrap()).unwrap();
    assert_eq!(gw["choices"][0]["message"]["content"], "hello", "{gw}");
    let direct = read(dir.path().join("direct.code"));
    assert!(!direct.contains("curl 0"), "{direct}");
    assert_eq!(up.seen().len(), 1, "{:?}", up.seen());
}
