//! `brood agent` (SPEC 13) under a real supervisor: against an
//! OpenAI-compatible server on loopback (tool calls split across chunks,
//! usage at the end or missing, a 429 then success, a stream cut mid-way, a
//! cancel during a stream, an unknown model, no server at all), and with the
//! script provider: max turns, the kernel's refusals told to the model, a
//! refused `create` asked again narrower, bad tool inputs answered while the
//! agent goes on, and a resumed agent continuing from its history.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::model::{ModelServer, Reply, call_part, text, usage};
use common::*;
use serde_json::{Value, json};

fn agent_argv(flags: &[&str]) -> Vec<String> {
    let mut v = vec![exe().to_owned(), "agent".to_owned()];
    v.extend(flags.iter().map(|s| s.to_string()));
    v
}

fn start_agent(name: &str, flags: &[&str], policy: Value) -> brood_runtime::SpawnRequest {
    let mut r = req(name, agent_argv(flags));
    r.policy = Some(policy);
    r.await_ready = false;
    r
}

async fn wait_for(env: &Env, n: &str) -> Value {
    let r = env
        .sup
        .wait(me(), vec![name(n)], Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["timed_out"], false, "{n} did not finish: {r}");
    r["agents"][0].clone()
}

/// The session's transcript: (role, content).
fn transcript(env: &Env, n: &str) -> Vec<(String, String)> {
    env.sup
        .store()
        .messages(
            env.sup.tenant(),
            &name(n),
            &brood_core::SessionName::default_session(),
        )
        .unwrap()
        .into_iter()
        .map(|m| (m.role, m.content))
        .collect()
}

/// The tool results the model was given, in order.
fn tool_results(env: &Env, n: &str) -> Vec<String> {
    transcript(env, n)
        .into_iter()
        .filter(|(r, _)| r == "tool")
        .map(|(_, c)| {
            serde_json::from_str::<Value>(&c).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The agent's `log` (its stderr), once the projection caught up.
async fn log_of(env: &Env, n: &str) -> String {
    env.sup.flush().await;
    read(env.sup.paths().agent_dir(&name(n)).join("log"))
}

fn write(dir: &Path, file: &str, v: &Value) -> String {
    let p = dir.join(file);
    std::fs::write(&p, v.to_string()).unwrap();
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_streams_tool_calls_retries_and_counts_usage() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("note.txt");
    std::fs::write(&file, "hello from the file\n").unwrap();
    let args = json!({"path": file.display().to_string()}).to_string();
    let (a, b) = args.split_at(5);
    let server = ModelServer::start(vec![
        Reply::Status(429, "slow down".into(), Some(0)),
        // Text, then one tool call in three pieces, without ids, with a
        // field only some servers send; no usage at all.
        Reply::Stream {
            chunks: vec![
                json!({"choices": [{"index": 0, "delta": {"reasoning_content": "thinking"}}]}),
                text("Reading it."),
                call_part(0, Some("file_read"), a),
                call_part(0, None, b),
            ],
            cut: false,
        },
        // Cut mid-way: asked again.
        Reply::Stream {
            chunks: vec![text("The file")],
            cut: true,
        },
        Reply::Stream {
            chunks: vec![text("The file says "), text("hello."), usage(100, 20)],
            cut: false,
        },
    ])
    .await;
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[prices.test-model]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
    )
    .unwrap();
    let flags = [
        "--type",
        "explore",
        "--provider",
        "openai",
        "--model",
        "test-model",
        "--base-url",
        &server.base_url,
        "--config",
        config.to_str().unwrap(),
    ];
    // The policy grants file_read and shell: explore offers file_read only
    // (shell is not its, file_list and the rest are not granted).
    let policy = json!({"tools": ["file_read", "shell"]});
    env.sup
        .spawn(me(), start_agent("reader", &flags, policy))
        .await
        .unwrap();
    let a = wait_for(&env, "reader").await;
    assert_eq!(a["status"], "completed", "{a}");
    assert_eq!(a["result"], "The file says hello.", "{a}");
    let bodies = server.bodies();
    assert_eq!(
        bodies.len(),
        4,
        "429, the tool call, the cut stream, the answer"
    );
    for b in &bodies {
        let offered: Vec<&str> = b["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            offered,
            ["file_read"],
            "only what the type and the policy both allow"
        );
        assert_eq!(b["model"], "test-model");
        assert_eq!(b["stream"], true);
    }
    // The tool's result went back to the model with the call's made-up id.
    let msgs = bodies[3]["messages"].as_array().unwrap();
    let tool = msgs
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a tool message");
    assert_eq!(tool["content"], "hello from the file\n");
    let asked = msgs.iter().find(|m| m["tool_calls"].is_array()).unwrap();
    assert_eq!(asked["tool_calls"][0]["id"], tool["tool_call_id"]);
    assert_eq!(
        asked["tool_calls"][0]["function"]["arguments"],
        args.as_str()
    );
    // Usage: only the last call reported any; priced from the configuration.
    let show = show(&env, "reader");
    assert_eq!(
        (show["tokens_in"].as_u64(), show["tokens_out"].as_u64()),
        (Some(100), Some(20))
    );
    assert!(
        (show["cost_usd"].as_f64().unwrap() - 0.00014).abs() < 1e-12,
        "{show}"
    );
    // The whole conversation is in the session.
    let roles: Vec<String> = transcript(&env, "reader")
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool_call", "tool", "assistant"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_or_no_server_fails_with_a_clear_message() {
    let env = start(Duration::from_millis(500));
    let server = ModelServer::start(vec![Reply::Status(
        404,
        "model 'nope' not found".into(),
        None,
    )])
    .await;
    let flags = [
        "--provider",
        "openai",
        "--model",
        "nope",
        "--base-url",
        &server.base_url,
    ];
    env.sup
        .spawn(me(), start_agent("lost", &flags, json!({})))
        .await
        .unwrap();
    let a = wait_for(&env, "lost").await;
    assert_eq!(a["status"], "failed", "{a}");
    let log = log_of(&env, "lost").await;
    assert!(
        log.contains("answered 404: model 'nope' not found")
            && log.contains("known to this server"),
        "{log}"
    );
    let flags = [
        "--provider",
        "openai",
        "--model",
        "m",
        "--base-url",
        "http://127.0.0.1:9/v1",
    ];
    env.sup
        .spawn(me(), start_agent("alone", &flags, json!({})))
        .await
        .unwrap();
    let a = wait_for(&env, "alone").await;
    assert_eq!(a["status"], "failed", "{a}");
    let log = log_of(&env, "alone").await;
    assert!(
        log.contains("cannot reach the model server at http://127.0.0.1:9/v1"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_stream_stops_the_agent() {
    let env = start(Duration::from_millis(500));
    let server = ModelServer::start(vec![Reply::Stall(vec![text("Let me think")])]).await;
    let flags = [
        "--provider",
        "openai",
        "--model",
        "m",
        "--base-url",
        &server.base_url,
    ];
    env.sup
        .spawn(me(), start_agent("slow", &flags, json!({})))
        .await
        .unwrap();
    assert!(eventually_async(Duration::from_secs(20), || !server.bodies().is_empty()).await);
    let pids = processes_of(&env, "slow");
    env.sup.cancel(me(), name("slow")).await.unwrap();
    let a = wait_for(&env, "slow").await;
    assert_eq!(
        (a["status"].as_str(), a["reason"].as_str()),
        (Some("cancelled"), Some("user")),
        "{a}"
    );
    assert!(eventually(Duration::from_secs(5), || pids
        .iter()
        .all(|p| !alive(*p))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_end_the_run_with_a_result_saying_so() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let listing = json!({"name": "file_list", "arguments": {"path": "/"}});
    let turn = json!({"text": "Still looking.", "tool_calls": [listing]});
    let script = write(
        dir.path(),
        "s.json",
        &json!({"turns": [turn, turn, turn, turn]}),
    );
    env.sup
        .spawn(
            me(),
            start_agent(
                "busy",
                &["--script", &script, "--max-turns", "2"],
                json!({}),
            ),
        )
        .await
        .unwrap();
    let a = wait_for(&env, "busy").await;
    let result = a["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("stopped: the model used all 2 turns (maxTurns of type general)"),
        "{a}"
    );
    assert_eq!(tool_results(&env, "busy").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernels_refusals_and_bad_inputs_go_back_to_the_model() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("key.txt"), "do not read\n").unwrap();
    std::fs::write(work.join("a.txt"), "x\nx\n").unwrap();
    let (w, s) = (work.display().to_string(), secret.display().to_string());
    let c = |name: &str, args: Value| json!({"name": name, "arguments": args});
    let calls = vec![
        c("file_read", json!({"path": format!("{s}/key.txt")})),
        c("shell", json!({"command": format!("cat {s}/key.txt")})),
        c(
            "file_write",
            json!({"path": format!("{s}/planted"), "content": "x"}),
        ),
        c("file_read", json!({})),
        c(
            "file_edit",
            json!({"path": format!("{w}/a.txt"), "old": "x", "new": "y"}),
        ),
        c(
            "file_patch",
            json!({"path": format!("{w}/a.txt"), "patch": "--- a\n+++ b\n@@ -1,1 +1,1 @@\n-nothing\n+else\n"}),
        ),
        c("web_search", json!({"query": "x"})),
        json!({"name": "file_read", "arguments": "not json"}),
    ];
    let script = write(
        dir.path(),
        "s.json",
        &json!({"turns": [
            {"tool_calls": calls},
            {"text": "I could not read the secret, and said so."}
        ]}),
    );
    // The secret directory is hidden by the policy; everything else readable,
    // the work directory writable.
    let policy = json!({"files": [
        {"path": "/", "mode": "ro"}, {"path": w, "mode": "rw"}, {"path": s, "mode": "hidden"}
    ]});
    let flags = ["--type", "code", "--script", script.as_str()];
    env.sup
        .spawn(me(), start_agent("probe", &flags, policy))
        .await
        .unwrap();
    let a = wait_for(&env, "probe").await;
    assert_eq!(a["status"], "completed", "the agent goes on: {a}");
    let r = tool_results(&env, "probe");
    assert_eq!(r.len(), 8, "{r:#?}");
    assert!(
        r[0].contains("permission denied (this agent's sandbox does not grant it)"),
        "{}",
        r[0]
    );
    assert!(
        r[1].starts_with("exit status 1") && r[1].contains("Permission denied"),
        "{}",
        r[1]
    );
    assert!(!r[1].contains("do not read"));
    assert!(r[2].contains("permission denied"), "{}", r[2]);
    assert!(!secret.join("planted").exists());
    assert_eq!(r[3], "error: file_read: missing argument \"path\"");
    assert!(r[4].contains("occurs 2 times"), "{}", r[4]);
    assert!(r[5].contains("does not apply"), "{}", r[5]);
    assert!(
        r[6].contains("web_search needs a search endpoint"),
        "{}",
        r[6]
    );
    assert!(
        r[7].contains("arguments must be a JSON object") || r[7].contains("not JSON"),
        "{}",
        r[7]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_is_asked_again_narrower() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let create = |tools: Value| {
        json!({"name": "create", "arguments": {
        "name": "helper", "task": "say hi", "type": "explore", "capabilities": {"tools": tools}}})
    };
    let script = write(
        dir.path(),
        "s.json",
        &json!({"agents": {
            "boss": [
                {"text": "A helper with a shell.", "tool_calls": [create(json!(["file_read", "shell"]))]},
                {"text": "Refused; with less.", "tool_calls": [create(json!(["file_read"]))]},
                {"tool_calls": [{"name": "wait", "arguments": {"names": ["helper"], "timeout_s": 30}}]},
                {"text": "The helper said hi."}
            ],
            "explore": [{"text": "hi"}]
        }}),
    );
    let policy = json!({"tools": ["create", "wait", "file_read", "file_list"]});
    env.sup
        .spawn(me(), start_agent("boss", &["--script", &script], policy))
        .await
        .unwrap();
    let a = wait_for(&env, "boss").await;
    assert_eq!(
        (a["status"].as_str(), a["result"].as_str()),
        (Some("completed"), Some("The helper said hi.")),
        "{a}"
    );
    let r = tool_results(&env, "boss");
    assert!(
        r[0].starts_with("error: create refused: ToolExpansion"),
        "{}",
        r[0]
    );
    assert!(r[1].starts_with("created helper"), "{}", r[1]);
    assert!(
        r[2].contains("helper: completed") && r[2].contains("hi"),
        "{}",
        r[2]
    );
    let h = show(&env, "helper");
    assert_eq!(h["parent"], "boss");
    assert_eq!(h["policy"]["tools"], json!(["file_read"]));
}

/// docs/agent.md's walk-through: `--config agent.toml` given relative to
/// where the agent starts, its `script` relative too. The child the agent
/// creates starts at `/`, and still reads the same file and script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_config_and_its_script_reach_the_agents_children() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("cfg")).unwrap();
    write(
        &dir.path().join("cfg"),
        "turns.json",
        &json!({"agents": {
            "boss": [
                {"tool_calls": [{"name": "create", "arguments": {
                    "name": "helper", "task": "say hi", "type": "explore"}}]},
                {"tool_calls": [{"name": "wait", "arguments": {"names": ["helper"], "timeout_s": 30}}]},
                {"text": "The helper said hi."}
            ],
            "explore": [{"text": "hi"}]
        }}),
    );
    std::fs::write(
        dir.path().join("cfg/agent.toml"),
        "provider = \"script\"\nscript = \"turns.json\"\n",
    )
    .unwrap();
    let mut r = start_agent(
        "boss",
        &["--config", "cfg/agent.toml"],
        json!({"tools": ["create", "wait", "file_read"]}),
    );
    r.cwd = Some(dir.path().display().to_string());
    env.sup.spawn(me(), r).await.unwrap();
    let a = wait_for(&env, "boss").await;
    assert_eq!(
        (a["status"].as_str(), a["result"].as_str()),
        (Some("completed"), Some("The helper said hi.")),
        "{a}"
    );
    let h = show(&env, "helper");
    assert_eq!(
        (h["status"].as_str(), h["result"].as_str()),
        (Some("completed"), Some("hi")),
        "{h}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_agent_continues_from_its_history() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "s.json",
        &json!({"turns": [
            {"text": "First answer."},
            {"text": "Second answer, after the first."}
        ]}),
    );
    env.sup
        .spawn(me(), start_agent("talk", &["--script", &script], json!({})))
        .await
        .unwrap();
    assert_eq!(wait_for(&env, "talk").await["result"], "First answer.");
    env.sup
        .resume(me(), name("talk"), Some("and then?".into()))
        .await
        .unwrap();
    let a = wait_for(&env, "talk").await;
    assert_eq!(a["result"], "Second answer, after the first.", "{a}");
    let t = transcript(&env, "talk");
    let roles: Vec<&str> = t.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"], "{t:?}");
    assert_eq!(t[2].1, "and then?");
}

/// The environment of a live process, as the kernel has it.
fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reaches_only_the_children_whose_policy_passes_it() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    let create = |name: &str, caps: Value| {
        json!({"name": "create", "arguments": {
        "name": name, "task": "wait a little", "type": "explore", "capabilities": caps}})
    };
    let script = write(
        dir.path(),
        "s.json",
        &json!({"agents": {
            "holder": [
                {"tool_calls": [create("keeps", json!({})), create("without", json!({"env": {}}))]},
                {"tool_calls": [{"name": "wait", "arguments": {"names": ["keeps", "without"], "timeout_s": 30}}]},
                {"text": "done"}
            ],
            // Slow, so the test can read their environments while they live.
            "explore": [{"text": "ok", "delay_ms": 3000}]
        }}),
    );
    let policy =
        json!({"tools": ["create", "wait", "file_read"], "env": {"MODEL_TEST_KEY": "sk-test-123"}});
    env.sup
        .spawn(me(), start_agent("holder", &["--script", &script], policy))
        .await
        .unwrap();
    let has_key = |n: &str| {
        processes_of(&env, n).iter().any(|p| {
            environ(*p)
                .iter()
                .any(|v| v == "MODEL_TEST_KEY=sk-test-123")
        })
    };
    let started = eventually_async(Duration::from_secs(20), || {
        !processes_of(&env, "without").is_empty()
    })
    .await;
    assert!(started, "{:?}", tool_results(&env, "holder"));
    assert!(
        eventually_async(Duration::from_secs(20), || !processes_of(&env, "keeps")
            .is_empty())
        .await
    );
    let holder: Vec<Vec<String>> = processes_of(&env, "holder")
        .into_iter()
        .map(environ)
        .collect();
    assert!(
        has_key("holder"),
        "the holder's policy passes the key: {holder:?}"
    );
    assert!(has_key("keeps"), "a child that inherits the policy has it");
    let without = processes_of(&env, "without");
    assert!(!without.is_empty());
    for p in without {
        let vars = environ(p);
        assert!(!vars.is_empty(), "the child's environment was readable");
        assert!(
            !vars.iter().any(|v| v.starts_with("MODEL_TEST_KEY")),
            "{vars:?}"
        );
    }
    assert_eq!(wait_for(&env, "holder").await["result"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_is_offered_only_with_a_search_endpoint_and_uses_it() {
    let env = start(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    // A search endpoint on loopback: it answers every query with JSON naming it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let line = String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_owned();
            seen2.lock().unwrap().push(line);
            let body = r#"{"results": [{"title": "brood", "url": "https://example.org/brood"}]}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(body.as_bytes()).await;
        }
    });
    let script = write(
        dir.path(),
        "s.json",
        &json!({"turns": [
            {"tool_calls": [{"name": "web_search", "arguments": {"query": "child agents"}}]},
            {"text": "Found it."}
        ]}),
    );
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, format!("search_url = \"http://{addr}/search\"\n")).unwrap();
    let flags = [
        "--type",
        "research",
        "--script",
        script.as_str(),
        "--config",
        config.to_str().unwrap(),
    ];
    env.sup
        .spawn(me(), start_agent("searcher", &flags, json!({})))
        .await
        .unwrap();
    let a = wait_for(&env, "searcher").await;
    assert_eq!(a["status"], "completed", "{a}");
    let r = tool_results(&env, "searcher");
    assert!(r[0].contains("https://example.org/brood"), "{r:?}");
    let q = seen.lock().unwrap().clone();
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(
        q[0].starts_with("GET /search?q=child") && q[0].contains("agents"),
        "{q:?}"
    );
    server.abort();
}

/// With brood's model gateway configured (issue 31) and no `base_url` of
/// its own, the agent calls the gateway its environment announces (without
/// it, it would fail for want of a base URL), and brood counts the call
/// whatever the agent reports (tests/gateway.rs checks the keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_calls_brood_s_model_gateway_by_default() {
    use brood_runtime::models::{Key, Kind, Price, Providers, Upstream};
    let server = ModelServer::start(vec![Reply::Stream {
        chunks: vec![text("Through "), text("brood."), usage(1000, 500)],
        cut: false,
    }])
    .await;
    let providers = Providers {
        openai: Some(Upstream {
            kind: Kind::OpenAi,
            // The server's base is its `/v1`; the gateway adds the path.
            base_url: server.base_url.trim_end_matches("/v1").to_owned(),
            key: Some(Key::new("sk-operator-only")),
            key_file: None,
        }),
        anthropic: None,
        prices: [(
            "gw-model".to_owned(),
            Price {
                input: 1.0,
                output: 2.0,
            },
        )]
        .into(),
    };
    let env = start_with(Duration::from_millis(500), |cfg| {
        cfg.gateway = Some(brood_runtime::Gateway {
            host: brood_server::gateway::host(),
            providers: std::sync::Arc::new(providers),
        });
    });
    let flags = ["--provider", "openai", "--model", "gw-model"];
    env.sup
        .spawn(me(), start_agent("gw", &flags, json!({"tools": []})))
        .await
        .unwrap();
    let a = wait_for(&env, "gw").await;
    assert_eq!(a["status"], "completed", "{a}");
    assert_eq!(a["result"], "Through brood.", "{a}");
    assert_eq!(server.bodies().len(), 1);
    assert_eq!(server.bodies()[0]["model"], "gw-model");
    // The agent priced nothing (no table of its own); brood's count is
    // its spend.
    let shown = show(&env, "gw");
    assert!(
        (shown["cost_usd"].as_f64().unwrap() - 0.002).abs() < 1e-12,
        "{shown}"
    );
}
