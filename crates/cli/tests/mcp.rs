//! MCP (issue 16, docs/mcp.md) with a real MCP client: the official MCP
//! Python SDK (`mcp` on PyPI, installed by `.ci/setup` into
//! `target/ci-python`) drives `brood mcp` over stdio (the newest protocol
//! and the older `2024-11-05` handshake) and the daemon's `/mcp` over
//! streamable HTTP with the bearer token: it lists the tools, spawns a
//! child and waits for its result, cancels a subtree (its processes gone),
//! and is refused a child that asks more than the session holds; killing
//! the client, or `brood mcp` itself, with SIGKILL cancels the session's
//! subtree. A stdio session is confined to its root's subtree (issue 24):
//! every tool aimed at another tree is refused and creates nothing, and the
//! capability that confines it only narrows and dies with the session. The
//! client script is `tests/mcp/client.py`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// The Python with the MCP SDK; a missing SDK fails the test, naming it.
fn python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-python/bin/python3");
    let has_sdk = p.exists() && {
        #[allow(clippy::disallowed_methods)]
        Command::new(&p)
            .args(["-c", "import mcp, mcp_types"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        has_sdk,
        "the MCP Python SDK (`mcp` from PyPI) is missing in {}: run `bash .ci/setup`",
        p.display()
    );
    p
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

/// The session's policy, the operator's for MCP sessions: the runtime's own
/// tools, no `shell`.
fn policy_file(dir: &Path) -> PathBuf {
    let p = dir.join("mcp-policy.json");
    std::fs::write(
        &p,
        json!({"tools": ["create", "send", "wait", "close", "resume"]}).to_string(),
    )
    .unwrap();
    p
}

fn stdio_config(root: &Path, policy: &Path, mode: &str) -> Value {
    json!({
        "transport": "stdio", "brood": exe(), "root": root, "mode": mode,
        "mcp_args": ["--policy", policy], "agent": agent(&[]),
    })
}

/// Runs the client's `session` scenario and returns what it saw.
fn session(cfg: &Value) -> Value {
    scenario("session", cfg)
}

/// Runs one of the client's scenarios and returns what it saw.
fn scenario(what: &str, cfg: &Value) -> Value {
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(python())
        .arg(script())
        .arg(what)
        .arg(cfg.to_string())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "the MCP client failed: {}\nstdout: {out}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn ok<'a>(r: &'a Value, what: &str) -> &'a Value {
    assert_eq!(r["is_error"], false, "{what}: {r}");
    &r["structured"]
}

fn refused<'a>(r: &'a Value, code: &str) -> &'a str {
    assert_eq!(r["is_error"], true, "{r}");
    assert_eq!(r["structured"]["error"]["code"], code, "{r}");
    let text = r["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("{code}: ")), "{text}");
    text
}

/// Every process of the agents shown (their own and their cgroups') is gone.
fn processes_gone(shows: &Value) -> bool {
    shows.as_object().unwrap().values().all(|s| {
        let a = &s["structured"];
        let own = a["pid"].as_i64().map(|p| p as i32);
        let group = a["cgroup"]
            .as_str()
            .map(|c| pids_under(Path::new(c)))
            .unwrap_or_default();
        own.into_iter().chain(group).all(|p| !alive(p))
    })
}

fn live_pids(shows: &Value) -> Vec<i32> {
    shows
        .as_object()
        .unwrap()
        .values()
        .filter_map(|s| s["structured"]["pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

fn status(sock: &Path, name: &str) -> String {
    let (code, v) = http(sock, "GET", &format!("/api/agents/{name}"), None);
    assert_eq!(code, 200, "{name}: {v}");
    v["status"].as_str().unwrap().to_owned()
}

/// What every session scenario must have seen, whatever the transport.
fn check_session(s: &Value, sock: &Path, p: &str) {
    let (h, g) = (format!("{p}-h"), format!("{p}-g"));
    let tools: Vec<&str> = s["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for t in [
        "spawn",
        "send",
        "wait",
        "cancel",
        "close",
        "resume",
        "list",
        "tree",
        "show",
        "events",
        "job_create",
        "job_start",
        "job_show",
        "job_cancel",
        "job_retry",
    ] {
        assert!(tools.contains(&t), "{t} missing from {tools:?}");
    }
    assert_eq!(s["schemas"]["spawn"]["type"], "object");
    assert_eq!(s["schemas"]["spawn"]["required"], json!(["task"]));

    // A child, answered at once, then its result through `wait`.
    let spawned = ok(&s["spawn"], "spawn");
    let name = spawned["name"].as_str().unwrap();
    let w = ok(&s["wait"], "wait");
    assert_eq!(w["timed_out"], false, "{w}");
    assert_eq!(w["agents"][0]["name"], name);
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    assert_eq!(w["agents"][0]["result"], "hello from child", "{w}");
    assert_eq!(ok(&s["show"], "show")["status"], "completed");

    // send, close, resume.
    assert!(ok(&s["send"], "send")["id"].is_string());
    let talk = ok(&s["talk_wait"], "wait for the talker");
    assert_eq!(talk["agents"][0]["status"], "completed", "{talk}");
    let said = talk["agents"][0]["result"].as_str().unwrap();
    assert!(said.contains("a message over MCP"), "{said}");
    assert_eq!(ok(&s["close"], "close")["status"], "closed");
    let resumed = ok(&s["resume"], "resume");
    assert_ne!(resumed["run"], spawned["run"], "{resumed}");
    let rw = ok(&s["resumed_wait"], "wait after resume");
    assert_eq!(rw["agents"][0]["status"], "completed", "{rw}");

    // What a child handed back: refs are its parent's channel (SPEC 4), so
    // a root (the operator's over HTTP) has none.
    let shown = ok(&s["refs_show"], "show refs");
    assert_eq!(shown["result"], "see refs", "{shown}");
    if shown["parent"].is_string() {
        assert_eq!(shown["refs"][0]["summary"], "read this first", "{shown}");
        assert_eq!(shown["refs"][0]["id"], "lib", "{shown}");
    } else {
        assert_eq!(shown["refs"], json!([]), "{shown}");
    }

    // A job run by the session's children.
    ok(&s["job_create"], "job_create");
    let job = ok(&s["job_done"], "job_show")["job"].clone();
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["counts"]["completed"], 2, "{job}");
    let items = ok(&s["job_items"], "job items")["items"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(items.len(), 2, "{items:?}");
    let export = ok(&s["job_export"], "job_export")["items"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(export.len(), 2, "{export:?}");
    assert!(
        export.iter().all(|i| i["status"] == "completed"),
        "{export:?}"
    );
    let replay = ok(&s["job_replay"], "job_replay");
    assert_eq!(replay["source"], json!(format!("{p}-job")), "{replay}");
    assert_eq!(replay["status"], "pending", "{replay}");

    // A bounded wait on a hanging subtree says what is still running.
    let hw = ok(&s["hang_wait"], "wait on a hanging child");
    assert_eq!(hw["timed_out"], true, "{hw}");
    let running = hw["still_running"].as_array().unwrap();
    for n in [&h, &g] {
        assert!(running.contains(&json!(n)), "{n} not in {hw}");
    }
    let listed = ok(&s["list"], "list")["agents"].as_array().unwrap().clone();
    assert!(listed.iter().any(|a| a["name"] == json!(h)), "{listed:?}");
    assert!(ok(&s["tree"], "tree")["trees"].is_array());

    // Cancelling the child cancels its subtree, processes and all.
    ok(&s["cancel"], "cancel");
    let after = ok(&s["after_cancel"], "wait after cancel");
    for a in after["agents"].as_array().unwrap() {
        assert_eq!(a["status"], "cancelled", "{a}");
    }
    assert!(
        eventually(Duration::from_secs(10), || processes_gone(&s["hang_show"])),
        "processes of the cancelled subtree remain: {}",
        s["hang_show"]
    );
    for n in [&h, &g] {
        assert_eq!(status(sock, n), "cancelled");
    }

    // Refusals are tool errors naming the API's code. Over stdio the session
    // acts as its root, which creates only its own children (as any agent);
    // over HTTP the operator names any parent, and the child of `-h` asking
    // for more than `-h` holds is refused by attenuation.
    if s["refused_direct"].is_null() {
        refused(&s["refused"], "ToolExpansion");
    } else {
        refused(&s["refused"], "ParentMismatch");
        refused(&s["refused_direct"], "ToolExpansion");
    }
    refused(&s["bad_args"], "BadRequest");
    refused(&s["unknown"], "NotFound");
    let events = ok(&s["events"], "events")["events"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        events.iter().all(|e| e["type"] == "agent.stop"),
        "{events:?}"
    );
    assert!(ok(&s["jobs"], "job_show")["jobs"].is_array());
}

#[test]
fn a_stdio_session_owns_its_children_with_the_newest_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let policy = policy_file(dir.path());
    // `brood agent` children (`spawn` without `argv`) replay a script.
    let turns = dir.path().join("turns.json");
    std::fs::write(
        &turns,
        json!({"turns": [{"text": "explored: all is well"}]}).to_string(),
    )
    .unwrap();
    let agent_config = dir.path().join("agent.toml");
    std::fs::write(
        &agent_config,
        format!(
            "provider = \"script\"\nscript = {:?}\n",
            turns.display().to_string()
        ),
    )
    .unwrap();
    let mut cfg = stdio_config(&root, &policy, "auto");
    cfg["mcp_args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--agent-config"), json!(agent_config)]);
    cfg["agent_config"] = json!(true);
    let s = session(&cfg);
    assert_eq!(
        s["protocol_version"], "2026-07-28",
        "{}",
        s["protocol_version"]
    );
    let a = ok(&s["agent_spawn"], "spawn brood agent");
    assert_eq!(a["protocol"], "brood", "{a}");
    let aw = ok(&s["agent_wait"], "wait for brood agent");
    assert_eq!(aw["agents"][0]["status"], "completed", "{aw}");
    assert_eq!(aw["agents"][0]["result"], "explored: all is well", "{aw}");
    let sock = root.join("brood.sock");
    check_session(&s, &sock, "t");

    // The session was a root agent of its own, with the operator's policy
    // for MCP sessions, and every child was its child.
    let owner = ok(&s["spawn"], "spawn")["parent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        owner.starts_with("mcp-") || owner.starts_with("test-client-"),
        "{owner}"
    );
    let (_, root_shown) = http(&sock, "GET", &format!("/api/agents/{owner}"), None);
    assert_eq!(root_shown["parent"], Value::Null, "{root_shown}");
    assert_eq!(
        root_shown["policy"]["tools"],
        json!(["close", "create", "resume", "send", "wait"]),
        "{root_shown}"
    );
    // The client has exited: the session's root is cancelled, history kept.
    assert!(
        eventually(Duration::from_secs(10), || status(&sock, &owner)
            == "cancelled"),
        "the session root {owner} is {}",
        status(&sock, &owner)
    );
    let quick = ok(&s["spawn"], "spawn")["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(status(&sock, &quick), "completed");
}

#[test]
fn a_stdio_session_with_the_older_2024_11_05_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let policy = policy_file(dir.path());
    let s = session(&stdio_config(&root, &policy, "2024-11-05"));
    assert_eq!(s["protocol_version"], "2024-11-05");
    check_session(&s, &root.join("brood.sock"), "t");
    // Named after the client (`clientInfo.name`, sanitised).
    let owner = ok(&s["spawn"], "spawn")["parent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(owner.starts_with("test-client-"), "{owner}");
}

#[test]
fn streamable_http_at_mcp_behind_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _d = serve_daemon(&root, Some(&addr));
    let token = std::fs::read_to_string(root.join("token"))
        .unwrap()
        .trim()
        .to_owned();

    // One raw POST of `initialize` with these extra header lines.
    let post = |extra: &str| {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
        write!(
            c,
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    };
    // Without the token: 401, like every route.
    let answer = post("");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("Unauthorized"), "{answer}");
    // With it, but from a web page (an `Origin`): refused.
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let answer = post(&format!("{bearer}Origin: http://evil.example\r\n"));
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    // With it, from a program: the handshake answers.
    let answer = post(&bearer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"serverInfo\""), "{answer}");

    // The operator over HTTP: the hanging child is a root, given only the
    // runtime's tools so a child of it asking for `shell` is refused.
    let cfg = json!({
        "transport": "http", "url": format!("http://{addr}/mcp"), "token": token,
        "mode": "auto", "agent": agent(&[]), "http_root_tools": ["create"],
    });
    let s = session(&cfg);
    assert_eq!(s["protocol_version"], "2026-07-28");
    check_session(&s, &root.join("brood.sock"), "t");
    // The older handshake, with its `Mcp-Session-Id` sessions.
    let mut cfg = cfg;
    cfg["mode"] = json!("legacy");
    cfg["prefix"] = json!("u");
    let s = session(&cfg);
    assert_eq!(s["protocol_version"], "2025-11-25");
    check_session(&s, &root.join("brood.sock"), "u");
}

/// Issue 30: the tasks extension of the 2026-07-28 revision, driven by the
/// official Python SDK over `/mcp`. A client that declares it gets a task
/// from `spawn`: the SDK's claim machinery polls `tasks/get` to the
/// child's result; a raw handle is the child's name, `tasks/get` follows it
/// from working to cancelled after `tasks/cancel`, which stops its whole
/// subtree; a failed child is a completed task with `isError`; a client
/// that reconnects finds its task; a client of the older revision gets the
/// child's record, as before.
#[test]
fn spawn_is_a_task_for_a_client_of_the_tasks_extension() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _d = serve_daemon(&root, Some(&addr));
    let sock = root.join("brood.sock");
    let token = std::fs::read_to_string(root.join("token"))
        .unwrap()
        .trim()
        .to_owned();
    let cfg = json!({
        "transport": "http", "url": format!("http://{addr}/mcp"), "token": token,
        "mode": "auto", "agent": agent(&[]), "prefix": "k",
    });
    let s = scenario("tasks", &cfg);
    assert_eq!(s["protocol_version"], "2026-07-28", "{s}");

    // Resolved by the SDK: the child's detail, its result in it.
    let r = ok(&s["resolved"], "resolved task");
    assert_eq!(r["name"], "k-q", "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["result"], "hello from a task", "{r}");

    // The raw handle: the child's name, working.
    let h = &s["handle"];
    assert_eq!(h["resultType"], "task", "{h}");
    assert_eq!(h["taskId"], "k-h", "{h}");
    assert_eq!(h["status"], "working", "{h}");
    assert!(h["createdAt"].as_str().unwrap().ends_with('Z'), "{h}");
    assert_eq!(
        s["running"]["task"]["status"], "working",
        "{}",
        s["running"]
    );
    // Cancelled through the task: the child and its grandchild process gone.
    assert_eq!(s["cancel"], json!({"ok": true}), "{}", s["cancel"]);
    let c = &s["cancelled"]["task"];
    assert_eq!(c["status"], "cancelled", "{c}");
    assert_eq!(status(&sock, "k-h"), "cancelled");
    let shown = ok(&s["running_show"], "running show");
    let mut shows = serde_json::Map::new();
    shows.insert(
        "k-h".into(),
        json!({"is_error": false, "structured": shown}),
    );
    let shows = Value::Object(shows);
    assert!(
        eventually(Duration::from_secs(10), || processes_gone(&shows)),
        "a process of the cancelled task lives on: {shown}"
    );

    // A failed child: the task completed, its result an error.
    let f = &s["failing"];
    assert_eq!(f["is_error"], true, "{f}");
    assert_eq!(status(&sock, "k-f"), "failed");
    // `tasks/result` (the older name): the finished task's tool result, a
    // cancelled one's error result, and no such task.
    let r = &s["result_of"]["result"];
    assert_eq!(
        r["structuredContent"]["result"], "hello from a task",
        "{}",
        s["result_of"]
    );
    let r = &s["result_of_cancelled"]["result"];
    assert_eq!(r["isError"], true, "{}", s["result_of_cancelled"]);
    // Unknown, or not a name at all: no such task.
    for k in ["unknown", "unknown_cancel", "bad_id", "result_unknown"] {
        let e = s[k]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{k}: {}", s[k]));
        assert!(e.contains("no task"), "{k}: {e}");
    }
    // Reconnected: the first connection's task, with its result.
    let t = &s["reconnected"]["task"];
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(
        t["result"]["structuredContent"]["result"], "hello from a task",
        "{t}"
    );
    // The older revision: the child itself, at once, as before.
    assert_eq!(s["legacy_version"], "2025-11-25", "{s}");
    let l = ok(&s["legacy_spawn"], "legacy spawn");
    assert_eq!(l["name"], "k-l", "{l}");
    assert!(l.get("taskId").is_none(), "{l}");
    let w = ok(&s["legacy_wait"], "legacy wait");
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
}

/// Starts the client's `hold` scenario: a hanging tree, reported on stdout.
fn hold(root: &Path, policy: &Path, prefix: &str) -> (std::process::Child, Value) {
    let mut cfg = stdio_config(root, policy, "auto");
    cfg["prefix"] = json!(prefix);
    #[allow(clippy::disallowed_methods)]
    let mut child = Command::new(python())
        .arg(script())
        .arg("hold")
        .arg(cfg.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (child, v)
}

/// The `brood mcp` process the client started.
fn brood_mcp_of(client: u32) -> i32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(client) && cmd.split(|b| *b == 0).any(|a| a == b"mcp") {
            return pid;
        }
    }
    panic!("no `brood mcp` under the client {client}");
}

#[test]
fn killing_the_client_or_brood_mcp_cancels_the_session_subtree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let policy = policy_file(dir.path());
    for (kill_brood_mcp, k) in [(false, "k0"), (true, "k1")] {
        let (h, g) = (format!("{k}-h"), format!("{k}-g"));
        let (mut client, v) = hold(&root, &policy, k);
        let owner = v["owner"].as_str().unwrap().to_owned();
        let pids = live_pids(&v["shows"]);
        assert_eq!(pids.len(), 2, "{v}");
        assert!(pids.iter().all(|p| alive(*p)), "{v}");
        assert_eq!(status(&sock, &g), "running");
        let victim = if kill_brood_mcp {
            brood_mcp_of(client.id())
        } else {
            client.id() as i32
        };
        // SAFETY: signalling a process this test started (or its child).
        unsafe { libc::kill(victim, libc::SIGKILL) };
        assert!(
            eventually(Duration::from_secs(15), || {
                [&h, &g, &owner]
                    .iter()
                    .all(|n| status(&sock, n) == "cancelled")
            }),
            "after SIGKILL of {}: {owner} {} {h} {} {g} {}",
            if kill_brood_mcp {
                "brood mcp"
            } else {
                "the client"
            },
            status(&sock, &owner),
            status(&sock, &h),
            status(&sock, &g),
        );
        assert!(
            eventually(Duration::from_secs(10), || processes_gone(&v["shows"])),
            "processes remain: {v}"
        );
        // SAFETY: as above; the client may already be gone.
        unsafe { libc::kill(client.id() as i32, libc::SIGKILL) };
        let _ = client.wait();
    }
}

#[test]
fn inside_an_agent_the_sessions_children_are_that_agents() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    // The MCP client and its `brood mcp` run as the program of agent `host`:
    // on the socket the daemon knows them by their cgroup.
    let cfg = json!({"transport": "stdio", "brood": exe(), "root": root, "agent": agent(&[])});
    let argv = json!([python(), script(), "inside", cfg.to_string()]);
    let (code, a) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "host", "argv": argv, "protocol": "exec"})),
    );
    assert_eq!(code, 201, "{a}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/host/wait",
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let out: Value = serde_json::from_str(w["agents"][0]["result"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {w}"));
    assert_eq!(ok(&out["spawn"], "spawn")["parent"], "host", "{out}");
    let waited = ok(&out["wait"], "wait");
    assert_eq!(waited["agents"][0]["name"], "in-c", "{waited}");
    assert_eq!(waited["agents"][0]["result"], "made inside", "{waited}");
    let listed = ok(&out["list"], "list")["agents"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // No session root was made: the only root is `host`.
    let (_, all) = http(&sock, "GET", "/api/agents?all=true", None);
    let roots: Vec<&Value> = all["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["parent"].is_null())
        .collect();
    assert_eq!(roots.len(), 1, "{all}");
    assert_eq!(roots[0]["name"], "host");
}

/// Whether a tool result is a refusal the API answers 403 (`Forbidden`,
/// `ParentMismatch`).
fn refused_403(r: &Value, what: &str) {
    assert_eq!(r["is_error"], true, "{what} got through: {r}");
    let code = r["structured"]["error"]["code"]
        .as_str()
        .unwrap_or_default();
    assert!(
        matches!(code, "Forbidden" | "ParentMismatch"),
        "{what}: refused with {code}, not a 403: {r}"
    );
}

/// Issue 24 attack 3: a stdio session (`brood mcp --policy narrow.json`)
/// driven by a hostile model aims every tool at another tree (an operator's
/// root and its job). Each is refused (403, as a tool error) and nothing is
/// made, sent or changed there; its own subtree still works, and is all it
/// sees. Before the fix `brood mcp` called the socket as the operator: the
/// spawn under `victim` made a child with the victim's rights, and every
/// read answered.
#[test]
fn a_stdio_session_reaches_nothing_outside_its_own_subtree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "victim", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(c, 201, "{v}");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/jobs",
        Some(
            &json!({"id": "vjob", "owner": "victim", "instruction": "x {a}", "input": [{"a": 1}]}),
        ),
    );
    assert_eq!(c, 201, "{v}");
    let policy = policy_file(dir.path());
    let mut cfg = stdio_config(&root, &policy, "auto");
    cfg["victim"] = json!("victim");
    cfg["victim_job"] = json!("vjob");
    let s = scenario("confined", &cfg);

    let own = ok(&s["own_spawn"], "own spawn");
    let session_root = own["parent"].as_str().unwrap().to_owned();
    assert!(session_root.starts_with("test-client-"), "{own}");
    for (what, r) in s["attacks"].as_object().unwrap() {
        refused_403(r, what);
    }
    // Nothing was made, sent or changed in the other tree.
    for n in ["stolen-c", "forged-c"] {
        let (c, v) = http(&sock, "GET", &format!("/api/agents/{n}"), None);
        assert_eq!(c, 404, "{n} was made: {v}");
    }
    let (_, kids) = http(&sock, "GET", "/api/agents/victim/children", None);
    assert_eq!(kids["agents"], json!([]), "{kids}");
    assert_eq!(status(&sock, "victim"), "running");
    // Asked for as a task (issue 30): no such task, nothing cancelled.
    for (what, r) in s["task_attacks"].as_object().unwrap() {
        let e = r["error"].as_str().unwrap_or_else(|| panic!("{what}: {r}"));
        assert!(e.contains("no task \"victim\""), "{what}: {e}");
    }
    let (_, jobs) = http(&sock, "GET", "/api/jobs", None);
    let ids: Vec<&str> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, ["vjob"], "{jobs}");
    assert_eq!(jobs["jobs"][0]["status"], "pending", "{jobs}");
    let (_, ev) = http(&sock, "GET", "/api/events?agent=victim&follow=false", None);
    assert!(
        !ev.to_string().contains("agent.input"),
        "the victim got an input: {ev}"
    );

    // Its own subtree answers, and is all it sees.
    let w = ok(&s["own_wait"], "own wait");
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    ok(&s["own_show"], "own show");
    let trees = ok(&s["own_tree"], "own tree")["trees"].clone();
    assert_eq!(trees.as_array().unwrap().len(), 1, "{trees}");
    assert_eq!(trees[0]["name"], json!(session_root), "{trees}");
    let listed: Vec<&str> = ok(&s["own_list"], "own list")["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(listed, ["own-c"], "{}", s["own_list"]);
    let events = ok(&s["own_events"], "own events")["events"].clone();
    assert!(!events.as_array().unwrap().is_empty(), "{events}");
    for e in events.as_array().unwrap() {
        let a = e["agent"].as_str().unwrap_or_default();
        assert!(
            a == session_root || a == "own-c",
            "another tree's event: {e}"
        );
    }
    assert_eq!(ok(&s["own_jobs"], "own jobs")["jobs"], json!([]));
}

/// `/mcp` over HTTP is confined like any API caller: an agent that speaks
/// MCP to the daemon's socket reaches its own subtree only, whatever tool
/// it aims at another tree.
#[test]
fn an_agent_over_http_mcp_is_confined_like_any_api_caller() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "victim", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(c, 201, "{v}");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/jobs",
        Some(
            &json!({"id": "vjob", "owner": "victim", "instruction": "x {a}", "input": [{"a": 1}]}),
        ),
    );
    assert_eq!(c, 201, "{v}");
    let cfg = json!({"transport": "http_unix", "socket": sock, "agent": agent(&[]),
                     "victim": "victim", "victim_job": "vjob"});
    let argv = json!([python(), script(), "confined", cfg.to_string()]);
    let (c, a) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "host", "argv": argv, "protocol": "exec"})),
    );
    assert_eq!(c, 201, "{a}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/host/wait",
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let s: Value = serde_json::from_str(w["agents"][0]["result"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {w}"));
    assert_eq!(ok(&s["own_spawn"], "own spawn")["parent"], "host", "{s}");
    for (what, r) in s["attacks"].as_object().unwrap() {
        refused_403(r, what);
    }
    for n in ["stolen-c", "forged-c"] {
        let (c, v) = http(&sock, "GET", &format!("/api/agents/{n}"), None);
        assert_eq!(c, 404, "{n} was made: {v}");
    }
    let (_, kids) = http(&sock, "GET", "/api/agents/victim/children", None);
    assert_eq!(kids["agents"], json!([]), "{kids}");
    let (_, jobs) = http(&sock, "GET", "/api/jobs", None);
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1, "{jobs}");
    let trees = ok(&s["own_tree"], "own tree")["trees"].clone();
    assert_eq!(trees.as_array().unwrap().len(), 1, "{trees}");
    assert_eq!(trees[0]["name"], "host", "{trees}");
}

/// The first event of `POST /api/mcp/session`, and the connection holding it.
fn open_session(sock: &Path) -> (std::os::unix::net::UnixStream, Value) {
    let mut c = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = json!({"client": "cap-test"}).to_string();
    write!(
        c,
        "POST /api/mcp/session HTTP/1.1\r\nHost: brood\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the session's stream ended"
        );
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            return (c, serde_json::from_str(d).unwrap());
        }
    }
}

/// One request on the socket with these extra header lines: status and body.
fn http_with(
    sock: &Path,
    method: &str,
    path: &str,
    extra: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        serde_json::from_str(rest).unwrap_or(Value::String(rest.to_owned())),
    )
}

/// The capability behind a stdio session, at the HTTP level: it makes the
/// operator its root (confined), a forged one is refused rather than
/// ignored, an agent that stole a live one gets nothing from it (a
/// capability only narrows), and it is refused once its session ends.
#[test]
fn the_session_capability_only_narrows_and_dies_with_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "victim", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(c, 201, "{v}");
    let (held, first) = open_session(&sock);
    let owner = first["owner"].as_str().unwrap().to_owned();
    let cap = first["capability"].as_str().unwrap().to_owned();
    assert_eq!(cap.len(), 64, "{first}");
    let with = format!("X-Brood-Session: {cap}\r\n");

    // The operator with it is the session root: its own subtree only.
    let (c, v) = http_with(&sock, "GET", &format!("/api/agents/{owner}"), &with, None);
    assert_eq!(c, 200, "{v}");
    let (c, v) = http_with(&sock, "GET", "/api/agents/victim", &with, None);
    assert_eq!(c, 403, "{v}");
    let spawn = |parent: &str, name: &str| json!({"parent": parent, "name": name, "argv": agent(&["--result", "x"])});
    let (c, v) = http_with(
        &sock,
        "POST",
        "/api/agents",
        &with,
        Some(&spawn("victim", "under-victim")),
    );
    assert_eq!(
        (c, v["error"]["code"].as_str()),
        (403, Some("ParentMismatch")),
        "{v}"
    );
    let (c, v) = http_with(
        &sock,
        "POST",
        "/api/agents",
        &with,
        Some(&spawn(&owner, "mine")),
    );
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["parent"], json!(owner), "{v}");
    let (c, v) = http_with(&sock, "GET", "/metrics", &with, None);
    assert_eq!(c, 403, "the host's metrics are not the root's: {v}");
    // A forged capability is refused, never ignored (which would leave the
    // operator's rights).
    let (c, v) = http_with(
        &sock,
        "GET",
        "/api/agents/victim",
        &format!("X-Brood-Session: {}\r\n", "0".repeat(64)),
        None,
    );
    assert_eq!(c, 403, "{v}");
    assert!(v.to_string().contains("no open MCP session"), "{v}");

    // An agent of another tree that stole the live capability gains nothing.
    let curl = format!(
        "curl -s -w ' %{{http_code}}' --unix-socket \"$BROOD_SOCKET\" -H 'X-Brood-Session: {cap}' http://brood/api/agents/{owner}"
    );
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "thief", "argv": ["sh", "-c", curl], "protocol": "exec"})),
    );
    assert_eq!(c, 201, "{v}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/thief/wait",
        Some(&json!({"timeout_s": 30})),
    );
    let said = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(said.ends_with(" 403"), "the thief: {w}");
    assert!(said.contains("only narrows"), "the thief: {said}");

    // The session ends with its connection: the capability is dead, the root cancelled.
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || {
            http_with(&sock, "GET", &format!("/api/agents/{owner}"), &with, None).0 == 403
        }),
        "the capability outlived its session"
    );
    assert!(
        eventually(Duration::from_secs(10), || status(&sock, &owner)
            == "cancelled"),
        "the session root {owner} is {}",
        status(&sock, &owner)
    );
}
