//! Traces over OTLP/HTTP (issue 30, docs/tracing.md), checked against a
//! real decoder: an OTLP/HTTP receiver in Python that decodes every POST
//! with the OpenTelemetry protobuf definitions from PyPI
//! (`opentelemetry-proto`, in `target/ci-python` by `.ci/setup`).
//!
//! A three-level tree across two nodes sharing a PostgreSQL store, its root
//! asked for with the caller's `traceparent`: `top` (a test agent) on node
//! 0; `mid`, a reference agent on the scripted model, on node 1, whose first
//! creation is refused and whose second, `leaf` (a reference agent too), runs
//! beside it. The span tree is checked whole: names, parents across the
//! nodes, the refusal as an error naming its code, token counts as the store
//! has them, the agents' own `chat` and `execute_tool` spans under their run
//! spans, and the `TRACEPARENT` a live child process holds naming its own
//! run's span. Then the log lines of `--log-format json` about the runs
//! carry the same ids; a `traceparent` that is malformed, or that names
//! another trace for a child, is refused; and a node whose collector is away
//! answers as before and counts its dropped spans in `/metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use serde_json::{Value, json};

fn python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-python/bin/python3");
    #[allow(clippy::disallowed_methods)]
    let has = p.exists()
        && Command::new(&p)
            .args([
                "-c",
                "import opentelemetry.proto.collector.trace.v1.trace_service_pb2",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
    assert!(
        has,
        "opentelemetry-proto (PyPI) is missing in {}: run `bash .ci/setup`",
        p.display()
    );
    p
}

/// The receiver: its process (killed on drop), its URL and the file of the
/// spans it decoded.
struct Receiver {
    child: Child,
    url: String,
    spans: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start() -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let spans = dir.path().join("spans.jsonl");
        #[allow(clippy::disallowed_methods)]
        let mut child = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otel/receiver.py"))
            .arg(&spans)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line.trim().parse().expect("the receiver's port");
        Receiver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            spans,
            _dir: dir,
        }
    }

    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.spans).unwrap_or_default();
        // Whole lines only: the receiver may be writing the last one.
        let all: Vec<Value> = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for s in &all {
            assert!(s.get("undecodable").is_none(), "a POST did not decode: {s}");
        }
        all
    }

    /// Waits until a span named `name` arrived, and returns it.
    fn span(&self, name: &str) -> Value {
        let mut found = None;
        assert!(
            eventually(Duration::from_secs(30), || {
                found = self.spans().into_iter().find(|s| s["name"] == name);
                found.is_some()
            }),
            "no span {name:?} arrived; got {:#?}",
            self.spans()
                .iter()
                .map(|s| s["name"].clone())
                .collect::<Vec<_>>()
        );
        found.unwrap()
    }
}

/// `POST path` on a node's socket with a `traceparent` header.
fn post_traced(sock: &Path, path: &str, body: &Value, traceparent: &str) -> (u16, Value) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\n\
         traceparent: {traceparent}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

/// `GET path` on a node's socket: the status and the body as text.
fn http_text(sock: &Path, path: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        rest.to_owned(),
    )
}

/// The environment of a live process, as `KEY=VALUE` lines.
fn environ(pid: i64) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

fn attr<'a>(s: &'a Value, k: &str) -> &'a Value {
    &s["attributes"][k]
}

/// The run's record as the API shows it.
fn runs_of(node_root: &Path, name: &str) -> Vec<Value> {
    let a = agent_on_root(node_root, name);
    a["runs"].as_array().cloned().unwrap_or_default()
}

const CALLER_TRACE: &str = "5b8aa5a2d2c872e8321cf37308d69df2";
const CALLER_SPAN: &str = "051581bf3cb55c13";

#[test]
fn a_tree_across_two_nodes_is_one_trace_under_its_callers_span() {
    let rx = Receiver::start();
    let nodes = Nodes::start_env(
        2,
        &["--otlp-endpoint", &rx.url, "--log-format", "json"],
        &[("BROOD_LOG", "info")],
    );
    let ids = node_ids(&nodes);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    let create = |name: &str, tools: Value| {
        json!({"name": "create", "arguments": {
            "name": name, "task": "say hi", "type": "explore", "capabilities": {"tools": tools}}})
    };
    std::fs::write(
        &script,
        json!({"agents": {
            "mid": [
                {"text": "A helper with a shell.", "tool_calls": [create("helper", json!(["file_read", "shell"]))],
                 "usage": {"input": 100, "output": 10}},
                {"text": "Refused; with less.", "tool_calls": [create("leaf", json!(["file_read"]))],
                 "usage": {"input": 200, "output": 20}},
                {"tool_calls": [{"name": "wait", "arguments": {"names": ["leaf"], "timeout_s": 60}}],
                 "usage": {"input": 300, "output": 30}},
                {"text": "The leaf said hi.", "usage": {"input": 400, "output": 40}}
            ],
            "explore": [{"text": "hi", "usage": {"input": 7, "output": 3}}]
        }})
        .to_string(),
    )
    .unwrap();

    // The root, asked for through node 0 with the caller's trace context.
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (s, v) = post_traced(
        &nodes.roots[0].join("brood.sock"),
        "/api/agents",
        &json!({"name": "top", "argv": agent(&["--hang"]),
                "policy": {"env": {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url}},
                "placement": {"labels": {"zone": "z0"}}}),
        &caller,
    );
    assert_eq!(s, 201, "{v}");
    assert!(
        eventually(
            Duration::from_secs(10),
            || agent_on(&nodes, 0, "top")["status"] == "running"
        ),
        "{}",
        agent_on(&nodes, 0, "top")
    );
    // The child process holds a TRACEPARENT naming its own run's span.
    let top = agent_on(&nodes, 0, "top");
    let top_run = top["run"].as_str().unwrap().replace('-', "");
    let top_span = &top_run[16..];
    let env = environ(top["pid"].as_i64().unwrap());
    assert!(
        env.contains(&format!("TRACEPARENT=00-{CALLER_TRACE}-{top_span}-01")),
        "{env:?}"
    );

    // The middle, asked for through node 1 and run there: a reference agent
    // whose environment names the collector (the policy's `env`, inherited
    // from the root, and by its own child).
    let (s, v) = nodes.spawn(
        1,
        json!({"parent": "top", "name": "mid", "protocol": "brood",
               "argv": [exe(), "agent", "--script", script.to_str().unwrap()],
               "policy": {"tools": ["create", "wait", "file_read"]},
               "placement": {"labels": {"zone": "z1"}}}),
    );
    assert_eq!(s, 201, "{v}");
    let done = Instant::now();
    assert!(
        eventually(
            Duration::from_secs(60),
            || agent_on(&nodes, 1, "mid")["status"] == "completed"
        ),
        "{} after {:?}",
        agent_on(&nodes, 1, "mid"),
        done.elapsed()
    );
    nodes.cancel(0, "top");

    let top_s = rx.span("invoke_agent top");
    let mid_s = rx.span("invoke_agent mid");
    let leaf_s = rx.span("invoke_agent leaf");
    let create_mid = rx.span("create_agent mid");
    let create_leaf = rx.span("create_agent leaf");
    let refused = rx.span("create_agent helper");

    // One trace, the caller's, every span of it.
    for s in [&top_s, &mid_s, &leaf_s, &create_mid, &create_leaf, &refused] {
        assert_eq!(s["trace_id"], CALLER_TRACE, "{s}");
        assert_eq!(s["service"], "brood", "{s}");
    }
    // The root under the caller's span; its span is the one its process was told.
    assert_eq!(top_s["parent_span_id"], CALLER_SPAN);
    assert_eq!(top_s["span_id"], top_span);
    assert_eq!(attr(&top_s, "brood.node"), ids["z0"].as_str());
    assert_eq!(attr(&top_s, "brood.status"), "cancelled");
    assert_eq!(attr(&top_s, "gen_ai.agent.name"), "top");
    assert_eq!(attr(&top_s, "gen_ai.conversation.id"), "default");
    // The middle ran on node 1, under its parent's run on node 0.
    assert_eq!(mid_s["parent_span_id"], top_span);
    assert_eq!(create_mid["parent_span_id"], top_span);
    assert_eq!(attr(&mid_s, "brood.node"), ids["z1"].as_str());
    assert_eq!(attr(&mid_s, "brood.status"), "completed");
    // The usage it reported, as its run's record holds it.
    let mid_run = &runs_of(&nodes.roots[1], "mid")[0];
    assert_eq!(attr(&mid_s, "gen_ai.usage.input_tokens"), 1000, "{mid_s}");
    assert_eq!(attr(&mid_s, "gen_ai.usage.output_tokens"), 100, "{mid_s}");
    assert_eq!(mid_run["tokens_in"], 1000, "{mid_run}");
    // The leaf under the middle's run; the refusal too, an error naming its code.
    let mid_span = mid_s["span_id"].as_str().unwrap();
    assert_eq!(leaf_s["parent_span_id"], mid_span);
    assert_eq!(create_leaf["parent_span_id"], mid_span);
    assert_eq!(attr(&leaf_s, "gen_ai.usage.input_tokens"), 7);
    assert_eq!(refused["parent_span_id"], mid_span);
    assert_eq!(refused["status_code"], 2, "STATUS_CODE_ERROR: {refused}");
    assert!(
        refused["status_message"]
            .as_str()
            .unwrap()
            .starts_with("ToolExpansion"),
        "{refused}"
    );
    assert_eq!(attr(&refused, "brood.refusal.code"), "ToolExpansion");
    assert_eq!(create_mid["status_code"], 0, "{create_mid}");

    // The agents' own spans, under their runs' spans (from their TRACEPARENT).
    rx.span("chat script");
    assert!(
        eventually(Duration::from_secs(20), || {
            let all = rx.spans();
            let under = |p: &str, name: &str| {
                all.iter()
                    .filter(|s| s["parent_span_id"] == p && s["name"] == name)
                    .count()
            };
            under(mid_span, "chat script") == 4
                && under(mid_span, "execute_tool create") == 2
                && under(mid_span, "execute_tool wait") == 1
                && under(leaf_s["span_id"].as_str().unwrap(), "chat script") == 1
        }),
        "{:#?}",
        rx.spans()
    );
    let all = rx.spans();
    let tool_refused = all
        .iter()
        .find(|s| {
            s["name"] == "execute_tool create"
                && s["status_code"] == 2
                && s["parent_span_id"] == mid_span
        })
        .expect("the refused create is an error span");
    assert!(
        tool_refused["status_message"]
            .as_str()
            .unwrap()
            .contains("ToolExpansion"),
        "{tool_refused}"
    );
    let chats: Vec<&Value> = all
        .iter()
        .filter(|s| s["name"] == "chat script" && s["parent_span_id"] == mid_span)
        .collect();
    let tokens: i64 = chats
        .iter()
        .map(|s| attr(s, "gen_ai.usage.input_tokens").as_i64().unwrap())
        .sum();
    assert_eq!(tokens, 1000);
    for s in &all {
        assert_eq!(s["trace_id"], CALLER_TRACE, "{s}");
    }

    // The log of node 1, one JSON object a line: its lines about `mid`'s
    // run carry the same trace and span ids.
    let log = std::fs::read_to_string(nodes.roots[1].with_extension("log")).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let about_mid: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["agent"] == "mid")
        .collect();
    assert!(
        about_mid
            .iter()
            .any(|l| l["fields"]["message"] == "run started"),
        "{log}"
    );
    assert!(
        about_mid
            .iter()
            .any(|l| l["fields"]["message"] == "run ended"),
        "{log}"
    );
    for l in &about_mid {
        assert_eq!(l["span"]["trace_id"], CALLER_TRACE, "{l}");
        assert_eq!(l["span"]["span_id"], mid_span, "{l}");
    }
    // Every line of its log is one JSON object.
    assert!(
        log.lines()
            .all(|l| !l.starts_with('{') || serde_json::from_str::<Value>(l).is_ok()),
        "{log}"
    );
}

#[test]
fn a_bad_or_foreign_traceparent_is_refused_and_a_child_cannot_set_its_own() {
    let rx = Receiver::start();
    let nodes = Nodes::start_with(1, &["--otlp-endpoint", &rx.url]);
    let sock = nodes.roots[0].join("brood.sock");
    for (bad, says) in [
        (
            "00-00000000000000000000000000000000-051581bf3cb55c13-01",
            "all zeros",
        ),
        ("01-zz", "version-traceid"),
        (
            "00-5B8AA5A2D2C872E8321CF37308D69DF2-051581bf3cb55c13-01",
            "lowercase",
        ),
    ] {
        let (s, v) = post_traced(
            &sock,
            "/api/agents",
            &json!({"name": "nope", "argv": agent(&["--hang"])}),
            bad,
        );
        assert_eq!(s, 400, "{bad}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("traceparent: ") && m.contains(says),
            "{bad}: {m}"
        );
    }
    // A root of its own trace; a child asked for under another trace is
    // refused, and its refusal is in the tree's trace, not the other one.
    let (s, v) = nodes.spawn(0, json!({"name": "root", "argv": agent(&["--hang"])}));
    assert_eq!(s, 201, "{v}");
    let foreign = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (s, v) = post_traced(
        &sock,
        "/api/agents",
        &json!({"parent": "root", "name": "kid", "argv": agent(&["--hang"])}),
        &foreign,
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the parent's tree is trace"),
        "{v}"
    );
    // A caller cannot hand an agent a TRACEPARENT of its choosing.
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "forger", "argv": agent(&["--hang"]),
               "env": {"TRACEPARENT": foreign}}),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("env.TRACEPARENT"),
        "{v}"
    );
    // A job of the root's: its span under the root's run, its items'
    // attempts under it, the failed ones errors.
    let job = json!({"id": "j1", "owner": "root", "instruction": "Say {text}",
                     "input": [{"id": "a", "text": "hi"}, {"id": "b", "text": "FAIL-ALWAYS"}],
                     "id_column": "id", "max_attempts": 2,
                     "worker": {"argv": [exe(), "test-agent", "--job-worker"]}});
    let (s, v) = http(&sock, "POST", "/api/jobs", Some(&job));
    assert_eq!(s, 201, "{v}");
    let (s, v) = http(&sock, "POST", "/api/jobs/j1/start", None);
    assert_eq!(s, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(60), || http(
            &sock,
            "GET",
            "/api/jobs/j1",
            None
        )
        .1["status"]
            == "failed"),
        "{}",
        http(&sock, "GET", "/api/jobs/j1", None).1
    );
    let root = agent_on(&nodes, 0, "root");
    let run = root["run"].as_str().unwrap().replace('-', "");
    let job_s = rx.span("job j1");
    assert_eq!(job_s["trace_id"], run.as_str());
    assert_eq!(job_s["parent_span_id"], &run[16..]);
    assert_eq!(attr(&job_s, "brood.status"), "failed");
    let job_span = job_s["span_id"].as_str().unwrap();
    let attempts: Vec<Value> = rx
        .spans()
        .into_iter()
        .filter(|s| s["parent_span_id"] == job_span)
        .collect();
    let named = |n: &str| attempts.iter().filter(|s| s["name"] == n).count();
    assert_eq!(
        (named("attempt a"), named("attempt b")),
        (1, 2),
        "{attempts:#?}"
    );
    for a in attempts.iter().filter(|s| s["name"] == "attempt b") {
        assert_eq!(a["status_code"], 2, "{a}");
        assert_eq!(attr(a, "brood.status"), "failed");
    }
    nodes.cancel(0, "root");
    let refused = rx.span("create_agent kid");
    let root_s = rx.span("invoke_agent root");
    // A root with no caller's trace starts one: its first run's id.
    assert_eq!(root_s["trace_id"], run.as_str());
    assert_eq!(root_s["parent_span_id"], "");
    assert_eq!(refused["trace_id"], run.as_str());
    assert_eq!(refused["parent_span_id"], &run[16..]);
    assert_eq!(attr(&refused, "brood.refusal.code"), "BadRequest");
}

#[test]
fn a_collector_that_is_away_costs_the_node_nothing_but_dropped_spans() {
    // A port nothing listens on: every batch fails.
    let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", away.local_addr().unwrap());
    drop(away);
    let nodes = Nodes::start_with(1, &["--otlp-endpoint", &url]);
    let sock = nodes.roots[0].join("brood.sock");
    let t0 = Instant::now();
    for i in 0..20 {
        let (s, v) = nodes.spawn(
            0,
            json!({"name": format!("a{i}"), "argv": agent(&["--result", "ok"])}),
        );
        assert_eq!(s, 201, "{v}");
    }
    assert!(
        eventually(Duration::from_secs(30), || (0..20).all(|i| agent_on(
            &nodes,
            0,
            &format!("a{i}")
        )["status"]
            == "completed")),
        "the agents ran"
    );
    let took = t0.elapsed();
    let dropped = || -> u64 {
        let (s, text) = http_text(&sock, "/metrics");
        assert_eq!(s, 200);
        text.lines()
            .find_map(|l| l.strip_prefix("brood_trace_spans_dropped_total "))
            .unwrap()
            .parse()
            .unwrap()
    };
    // 20 admissions and 20 runs, every one dropped once its batch failed.
    assert!(
        eventually(Duration::from_secs(30), || dropped() >= 40),
        "dropped: {} after {took:?}",
        dropped()
    );
}

#[test]
fn an_mcp_clients_traceparent_puts_what_it_asks_for_in_its_trace() {
    let rx = Receiver::start();
    let nodes = Nodes::start_with(1, &["--otlp-endpoint", &rx.url]);
    let sock = nodes.roots[0].join("brood.sock");
    let cfg = json!({"transport": "http_unix", "socket": sock, "agent": agent(&[]),
                     "prefix": "traced", "traceparent": format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")});
    // The official MCP Python SDK (the same venv), as crates/cli/tests/mcp.rs drives it.
    #[allow(clippy::disallowed_methods)]
    let out = Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py"))
        .arg("traced")
        .arg(cfg.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(said["spawn"]["is_error"], false, "{said}");
    assert_eq!(said["wait"]["is_error"], false, "{said}");
    let created = rx.span("create_agent traced");
    let ran = rx.span("invoke_agent traced");
    for s in [&created, &ran] {
        assert_eq!(s["trace_id"], CALLER_TRACE, "{s}");
        assert_eq!(s["parent_span_id"], CALLER_SPAN, "{s}");
    }
    assert_eq!(attr(&ran, "brood.status"), "completed");
}

/// Issue 31 with issue 30: a call through the model gateway is a `chat
/// {model}` span under its run's `invoke_agent` span, with the tokens and
/// the cost brood counted; a call for a model the policy does not grant is
/// a failed one, naming its refusal.
#[test]
fn a_call_through_the_model_gateway_is_a_chat_span_under_its_run() {
    let rx = Receiver::start();
    let port = common::model::fixed_usage_provider();
    let dir = tempfile::tempdir().unwrap();
    let config = common::model::gateway_config(dir.path(), port, "m-1", "m-2");
    let nodes = Nodes::start_with(
        1,
        &[
            "--otlp-endpoint",
            &rx.url,
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let call = common::model::curl_chat_call;
    let (s, v) = nodes.spawn(
        0,
        json!({"name": "caller", "protocol": "exec",
               "argv": ["sh", "-c", format!("{}; {}", call("m-1"), call("m-2"))],
               "policy": {"models": ["m-1"]}}),
    );
    assert_eq!(s, 201, "{v}");
    let run = rx.span("invoke_agent caller");
    let chat = rx.span("chat m-1");
    assert_eq!(chat["trace_id"], run["trace_id"], "{chat}");
    assert_eq!(chat["parent_span_id"], run["span_id"], "{chat}");
    assert_eq!(attr(&chat, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(&chat, "gen_ai.request.model"), "m-1");
    assert_eq!(attr(&chat, "gen_ai.usage.input_tokens"), 1000);
    assert_eq!(attr(&chat, "gen_ai.usage.output_tokens"), 500);
    let cost = attr(&chat, "brood.cost_usd").as_f64().unwrap();
    assert!((cost - 0.007).abs() < 1e-9, "{chat}");
    // Refused by the gateway, never sent: an error span naming why.
    let refused = rx.span("chat m-2");
    assert_eq!(refused["parent_span_id"], run["span_id"], "{refused}");
    assert_eq!(attr(&refused, "brood.model.outcome"), "refused");
    assert_eq!(refused["status_code"], 2, "STATUS_CODE_ERROR: {refused}");
    assert!(
        refused["status_message"]
            .as_str()
            .unwrap()
            .starts_with("refused"),
        "{refused}"
    );
    assert_eq!(chat["status_code"], 0, "unset: {chat}");
}
