//! The per-agent socket (SPEC 8) and the shim `ctx/agent/<name>` (SPEC 3):
//! real supervisor, real agents (the test agent's `--echo`), real clients on
//! the socket, the shim run as a real program.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

const LONG: Duration = Duration::from_secs(10);

async fn spawn(env: &Env, args: Value) -> Value {
    handle(&env.sup, &me(), "spawn", &args)
        .await
        .unwrap_or_else(|e| panic!("spawn {args}: {e}"))
}

fn sock(env: &Env, n: &str) -> PathBuf {
    env.sup.paths().agent_socket(&name(n))
}

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// An echo agent named `n`, ready, with its socket bound.
async fn echo(env: &Env, n: &str) {
    spawn(
        env,
        json!({"name": n, "argv": agent(&["--echo"]), "await_ready": true}),
    )
    .await;
    let p = sock(env, n);
    assert!(
        eventually_async(LONG, || is_socket(&p)).await,
        "{} never appeared",
        p.display()
    );
}

struct Conn {
    rd: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    wr: OwnedWriteHalf,
}

impl Conn {
    async fn open(env: &Env, n: &str) -> Conn {
        let s = UnixStream::connect(sock(env, n)).await.expect("connect");
        let (rd, wr) = s.into_split();
        Conn {
            rd: BufReader::new(rd).lines(),
            wr,
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.wr.write_all(bytes).await.expect("write");
    }

    async fn ask(&mut self, req: Value) {
        self.write(format!("{req}\n").as_bytes()).await;
    }

    /// The next frame; `None` at end of stream (or a reset after it).
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(LONG, self.rd.next_line())
            .await
            .expect("a frame within 10 s");
        line.ok()
            .flatten()
            .map(|l| serde_json::from_str(&l).expect("frames are JSON"))
    }

    /// Frames up to and including the request's `done` or `error`.
    async fn reply(&mut self) -> Vec<Value> {
        let mut v = Vec::new();
        while let Some(f) = self.next().await {
            let last = matches!(f["type"].as_str(), Some("done" | "error"));
            v.push(f);
            if last {
                return v;
            }
        }
        panic!("the stream ended without done or error: {v:?}");
    }
}

fn types(frames: &[Value]) -> Vec<&str> {
    frames.iter().map(|f| f["type"].as_str().unwrap()).collect()
}

fn messages(env: &Env, n: &str) -> Vec<(String, String)> {
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

fn run_of(env: &Env, n: &str) -> String {
    show(env, n)["run"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_lives_from_ready_to_the_end_and_exec_agents_have_none() {
    let env = start(Duration::from_millis(300));
    spawn(
        &env,
        json!({"name": "x", "protocol": "exec", "argv": ["sleep", "30"], "await_ready": true}),
    )
    .await;
    echo(&env, "a").await;
    let mode = std::fs::metadata(sock(&env, "a"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666, "authorization is by peer credentials");
    // An exec agent takes no input: it never gets a socket, but it has a shim.
    assert_eq!(show(&env, "x")["status"], "running");
    assert!(!sock(&env, "x").exists());
    env.sup.flush().await;
    for n in ["a", "x"] {
        let shim = env.sup.paths().shim(&name(n));
        let m = std::fs::metadata(&shim).unwrap().permissions().mode();
        assert_eq!(m & 0o777, 0o755, "{}", shim.display());
        assert!(read(&shim).starts_with("#!/bin/sh\n"), "{}", read(&shim));
    }
    // `bye` ends the echo agent's run; its socket goes with it.
    env.sup.send(me(), name("a"), "bye".into()).await.unwrap();
    let done = env
        .sup
        .wait(me(), vec![name("a")], Some(LONG))
        .await
        .unwrap();
    let done = serde_json::to_value(&done).unwrap();
    assert_eq!(done["agents"][0]["status"], "completed", "{done}");
    let p = sock(&env, "a");
    assert!(
        eventually_async(LONG, || !p.exists()).await,
        "the socket outlived the run"
    );
    // A resumed run binds it again.
    env.sup.resume(me(), name("a"), None).await.unwrap();
    assert!(eventually_async(LONG, || is_socket(&p)).await);
    env.sup.cancel(me(), name("a")).await.unwrap();
    env.sup.cancel(me(), name("x")).await.unwrap();
    assert!(eventually_async(LONG, || !p.exists()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_a_send_streamed_to_done_blocked_and_recorded() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    let run = run_of(&env, "a");
    let mut c = Conn::open(&env, "a").await;
    c.ask(json!({"op": "ping"})).await;
    assert_eq!(c.next().await.unwrap(), json!({"type": "pong"}));

    c.ask(json!({"op": "send", "id": "t1", "session": "default", "input": "hello"}))
        .await;
    let r = c.reply().await;
    assert_eq!(
        types(&r),
        ["start", "delta", "delta", "message", "done"],
        "{r:?}"
    );
    assert_eq!(r[0]["id"], "t1");
    assert_eq!(r[0]["run"], run.as_str());
    assert_eq!(r[0]["model"], Value::Null);
    let text: String = r[1..3]
        .iter()
        .map(|f| f["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "echo: hello");
    assert!(
        r[1..4]
            .iter()
            .all(|f| f["id"] == "t1" && f["run"] == run.as_str())
    );
    assert_eq!(r[3]["role"], "assistant");
    assert_eq!(r[3]["content"], "echo: hello");
    assert_eq!(r[4]["status"], "blocked");
    assert_eq!(r[4]["run"], run.as_str());
    // The input and the answer are in the transcript, store and file.
    assert_eq!(
        messages(&env, "a"),
        [
            ("user".to_owned(), "hello".to_owned()),
            ("assistant".to_owned(), "echo: hello".to_owned())
        ]
    );
    env.sup.flush().await;
    let lines = json_lines(session_dir(&env, "a").join("messages.jsonl"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["content"], "hello");
    assert_eq!(show(&env, "a")["status"], "blocked");

    // The same connection takes the next request.
    c.ask(json!({"op": "send", "id": "t2", "input": "again"}))
        .await;
    let r = c.reply().await;
    assert_eq!(r.last().unwrap()["status"], "blocked", "{r:?}");
    assert_eq!(r[3]["content"], "echo: again");
    env.sup.cancel(me(), name("a")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_error_codes() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    let mut c = Conn::open(&env, "a").await;
    let code = |f: &Value| f["code"].as_str().unwrap_or("").to_owned();

    c.write(b"this is not json\n").await;
    let f = c.next().await.unwrap();
    assert_eq!(
        (f["type"].as_str(), code(&f).as_str()),
        (Some("error"), "EINVAL"),
        "{f}"
    );
    // The connection still works.
    c.ask(json!({"op": "ping"})).await;
    assert_eq!(c.next().await.unwrap()["type"], "pong");

    for (req, want) in [
        (json!([1, 2]), "EINVAL"),
        (json!({"id": "x"}), "EINVAL"),
        (json!({"op": 7}), "EINVAL"),
        (json!({"op": "frobnicate"}), "EINVAL"),
        (json!({"op": "send", "input": "no id"}), "EINVAL"),
        (json!({"op": "send", "id": "", "input": "x"}), "EINVAL"),
        (
            json!({"op": "send", "id": "x".repeat(129), "input": "x"}),
            "EINVAL",
        ),
        (json!({"op": "send", "id": "n1", "input": 5}), "EINVAL"),
        (
            json!({"op": "send", "id": "n2", "session": "other", "input": "x"}),
            "ENOENT",
        ),
        (json!({"op": "resume", "session": "other"}), "ENOENT"),
        (json!({"op": "resume", "after": -1}), "EINVAL"),
    ] {
        c.ask(req.clone()).await;
        let f = c.next().await.unwrap();
        assert_eq!(f["type"], "error", "{req} -> {f}");
        assert_eq!(code(&f), want, "{req} -> {f}");
        assert!(!f["message"].as_str().unwrap().is_empty());
    }
    // Nothing of that reached the agent.
    assert!(messages(&env, "a").is_empty());

    // A frame over 1 MiB: EMSGSIZE, and the connection is closed.
    let (rd, wr) = UnixStream::connect(sock(&env, "a"))
        .await
        .unwrap()
        .into_split();
    let mut line = format!(
        "{{\"op\":\"send\",\"id\":\"big\",\"input\":\"{}",
        "a".repeat(1 << 20)
    );
    line.push_str("\"}\n");
    // The server may close before the client has written it all (that is what
    // EMSGSIZE does), so the write runs on its own and its error is ignored.
    let writer = tokio::spawn(async move {
        let mut wr = wr;
        let _ = wr.write_all(line.as_bytes()).await;
    });
    let mut big = BufReader::new(rd).lines();
    let f: Value = serde_json::from_str(&big.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(code(&f), "EMSGSIZE", "{f}");
    assert!(
        big.next_line().await.ok().flatten().is_none(),
        "closed after EMSGSIZE"
    );
    let _ = writer.await;
    assert!(messages(&env, "a").is_empty());
    env.sup.cancel(me(), name("a")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_is_delivered_once_and_answered_again() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    let req = json!({"op": "send", "id": "same-id", "input": "once"});
    let mut c1 = Conn::open(&env, "a").await;
    c1.ask(req.clone()).await;
    let first = c1.reply().await;
    assert_eq!(
        types(&first),
        ["start", "delta", "delta", "message", "done"]
    );
    drop(c1);
    // The retry, on a new connection.
    let mut c2 = Conn::open(&env, "a").await;
    c2.ask(req.clone()).await;
    let again = c2.reply().await;
    assert_eq!(types(&again), ["start", "message", "done"], "{again:?}");
    assert_eq!(again[0]["id"], "same-id");
    assert_eq!(again[1]["content"], "echo: once");
    assert_eq!(again[1]["seq"], first[3]["seq"]);
    assert_eq!(again[2]["status"], "blocked");
    // Delivered once: one input, one answer.
    let m = messages(&env, "a");
    let count =
        |role: &str, content: &str| m.iter().filter(|(r, c)| r == role && c == content).count();
    assert_eq!(count("user", "once"), 1, "{m:?}");
    assert_eq!(count("assistant", "echo: once"), 1, "{m:?}");
    assert_eq!(m.len(), 2, "{m:?}");
    env.sup.flush().await;
    let events = json_lines(session_dir(&env, "a").join("events.jsonl"));
    assert_eq!(
        events.iter().filter(|e| e["type"] == "agent.input").count(),
        1,
        "{events:?}"
    );
    env.sup.cancel(me(), name("a")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_retried_mid_turn_follows_the_live_turn_without_a_second_delivery() {
    let env = start(Duration::from_millis(300));
    spawn(&env, json!({"name": "a", "argv": agent(&["--echo", "--echo-pause-ms", "400"]), "await_ready": true})).await;
    let p = sock(&env, "a");
    assert!(eventually_async(LONG, || is_socket(&p)).await);
    let req = json!({"op": "send", "id": "mid", "input": "slow"});
    let mut c1 = Conn::open(&env, "a").await;
    c1.ask(req.clone()).await;
    assert_eq!(c1.next().await.unwrap()["type"], "start");
    let d = c1.next().await.unwrap();
    assert_eq!(
        (d["type"].as_str(), d["text"].as_str()),
        (Some("delta"), Some("echo: "))
    );
    // The client gives up half way through the turn and retries elsewhere.
    drop(c1);
    let mut c2 = Conn::open(&env, "a").await;
    c2.ask(req).await;
    let r = c2.reply().await;
    assert_eq!(r[0]["type"], "start", "{r:?}");
    assert_eq!(r.last().unwrap()["status"], "blocked", "{r:?}");
    let said: Vec<&str> = r
        .iter()
        .filter(|f| f["type"] == "message")
        .map(|f| f["content"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["echo: slow"], "{r:?}");
    let m = messages(&env, "a");
    assert_eq!(m.iter().filter(|(r, _)| r == "user").count(), 1, "{m:?}");
    env.sup.cancel(me(), name("a")).await.unwrap();
}

/// Regression: an agent that never says `running` reports `blocked` twice in
/// a row, which the record refuses as a transition; the turn must end anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ends_on_blocked_even_when_the_status_record_does_not_change() {
    let env = start(Duration::from_millis(300));
    spawn(
        &env,
        json!({"name": "a", "argv": agent(&["--echo", "--echo-quiet"]), "await_ready": true}),
    )
    .await;
    let p = sock(&env, "a");
    assert!(eventually_async(LONG, || is_socket(&p)).await);
    let mut c = Conn::open(&env, "a").await;
    for (i, text) in ["first", "second"].iter().enumerate() {
        c.ask(json!({"op": "send", "id": format!("q{i}"), "input": text}))
            .await;
        let r = c.reply().await;
        assert_eq!(
            types(&r),
            ["start", "delta", "delta", "message", "done"],
            "{r:?}"
        );
        assert_eq!(r[3]["content"], format!("echo: {text}"));
        assert_eq!(r[4]["status"], "blocked");
    }
    env.sup.cancel(me(), name("a")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_replays_only_the_messages_after_the_given_seq() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    let mut c = Conn::open(&env, "a").await;
    c.ask(json!({"op": "send", "id": "1", "input": "one"}))
        .await;
    let one = c.reply().await;
    c.ask(json!({"op": "send", "id": "2", "input": "two"}))
        .await;
    c.reply().await;
    let after = one[3]["seq"].as_i64().unwrap();

    let mut r = Conn::open(&env, "a").await;
    r.ask(json!({"op": "resume", "session": "default", "after": after}))
        .await;
    let got = r.reply().await;
    assert_eq!(
        types(&got),
        ["start", "message", "message", "done"],
        "{got:?}"
    );
    let replayed: Vec<(&str, &str)> = got[1..3]
        .iter()
        .map(|f| (f["role"].as_str().unwrap(), f["content"].as_str().unwrap()))
        .collect();
    assert_eq!(replayed, [("user", "two"), ("assistant", "echo: two")]);
    assert!(got[1..3].iter().all(|f| f["seq"].as_i64().unwrap() > after));
    assert_eq!(got[3]["status"], "blocked");

    // Without `after`: the whole session.
    r.ask(json!({"op": "resume"})).await;
    let all = r.reply().await;
    assert_eq!(types(&all).iter().filter(|t| **t == "message").count(), 4);
    env.sup.cancel(me(), name("a")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_on_the_socket_ends_the_agent_cancelled() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    let run = run_of(&env, "a");
    let mut c = Conn::open(&env, "a").await;
    c.ask(json!({"op": "cancel", "id": "stop-1"})).await;
    let r = c.reply().await;
    assert_eq!(types(&r), ["done"], "{r:?}");
    assert_eq!(r[0]["status"], "cancelled");
    assert_eq!(r[0]["run"], run.as_str());
    assert_eq!(r[0]["id"], "stop-1");
    // Answered once recorded.
    let a = show(&env, "a");
    assert_eq!(a["status"], "cancelled", "{a}");
    assert_eq!(a["reason"], "user", "{a}");
    let p = sock(&env, "a");
    assert!(eventually_async(LONG, || !p.exists()).await);
}

/// Starts `argv` with the process moved into the cgroup `group` before it
/// runs anything (a `sh` that waits for a line on stdin, then execs).
fn run_in_group(group: &str, argv: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read go; exec \"$@\"")
        .arg("sh")
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs");
    std::fs::write(
        Path::new(group).join("cgroup.procs"),
        child.id().to_string(),
    )
    .unwrap_or_else(|e| panic!("moving {} into {group}: {e}", child.id()));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }
    child.wait_with_output().expect("it ends")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_parent_owner_and_operator_may_connect() {
    let env = start(Duration::from_millis(300));
    spawn(
        &env,
        json!({"name": "p", "argv": agent(&["--hang"]), "await_ready": true}),
    )
    .await;
    spawn(
        &env,
        json!({"name": "s", "argv": agent(&["--hang"]), "await_ready": true}),
    )
    .await;
    spawn(
        &env,
        json!({"name": "c", "parent": "p", "argv": agent(&["--echo"]), "await_ready": true}),
    )
    .await;
    let p = sock(&env, "c");
    assert!(eventually_async(LONG, || is_socket(&p)).await);
    env.sup.flush().await;
    let shim = env.sup.paths().shim(&name("c"));
    let shim = shim.to_str().unwrap();

    // An unrelated agent (a process in the sibling's cgroup): refused.
    let sib = show(&env, "s")["cgroup"].as_str().unwrap().to_owned();
    let out = run_in_group(&sib, &[shim, "hi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("EACCES") && err.contains("agent:s"), "{err}");
    assert!(messages(&env, "c").is_empty(), "nothing was delivered");

    // The parent (a process in its cgroup): allowed.
    let parent = show(&env, "p")["cgroup"].as_str().unwrap().to_owned();
    let out = run_in_group(&parent, &[shim, "hi"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hi\n");

    // The agent itself is none of those.
    let own = show(&env, "c")["cgroup"].as_str().unwrap().to_owned();
    let out = run_in_group(&own, &[shim, "hi"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent:c"));
    env.sup.cancel(me(), name("p")).await.unwrap();
    env.sup.cancel(me(), name("s")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_sends_its_arguments_and_prints_the_reply() {
    let env = start(Duration::from_millis(300));
    echo(&env, "a").await;
    env.sup.flush().await;
    let shim = env.sup.paths().shim(&name("a"));
    #[allow(clippy::disallowed_methods)]
    let out = Command::new(&shim)
        .args(["hello", "there"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hello there\n");
    assert!(
        messages(&env, "a").contains(&("user".to_owned(), "hello there".to_owned())),
        "{:?}",
        messages(&env, "a")
    );
    // `bye` ends the agent: the shim's request ends with the run.
    #[allow(clippy::disallowed_methods)]
    let out = Command::new(&shim).arg("bye").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let a = env
        .sup
        .wait(me(), vec![name("a")], Some(LONG))
        .await
        .unwrap();
    let a = serde_json::to_value(&a).unwrap();
    assert_eq!(a["agents"][0]["status"], "completed");
    let p = sock(&env, "a");
    assert!(eventually_async(LONG, || !p.exists()).await);
    // The agent is gone: the shim says so and fails.
    #[allow(clippy::disallowed_methods)]
    let out = Command::new(&shim).arg("anyone?").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("agent a is not live"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temp_agents_shim_goes_with_its_object() {
    let env = start(Duration::from_millis(300));
    spawn(
        &env,
        json!({"name": "t", "life": "temp", "argv": agent(&["--echo"]), "await_ready": true}),
    )
    .await;
    env.sup.flush().await;
    assert!(env.sup.paths().shim(&name("t")).exists());
    env.sup.send(me(), name("t"), "bye".into()).await.unwrap();
    env.sup
        .wait(me(), vec![name("t")], Some(LONG))
        .await
        .unwrap();
    env.sup.flush().await;
    assert!(!env.sup.paths().agent_dir(&name("t")).exists());
    assert!(!env.sup.paths().shim(&name("t")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_starting_removes_sockets_nobody_answers_on() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("ctx").join("agent");
    std::fs::create_dir_all(&agents).unwrap();
    // Left by a dead supervisor: a socket file whose listener is gone.
    let stale = agents.join("old.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(is_socket(&stale));
    // One somebody still serves is not ours to remove.
    let live = agents.join("busy.sock");
    let _keep = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let mut cfg = brood_runtime::Config::new(dir.path().to_path_buf());
    cfg.agent_sockets = Some(brood_server::agent_sockets());
    cfg.bin_dir = Path::new(exe()).parent().map(Path::to_path_buf);
    let sup = brood_runtime::Supervisor::start(cfg).unwrap();
    let env = Env { dir, sup };
    assert!(!stale.exists(), "the stale socket survived the start-up");
    assert!(is_socket(&live));
    drop(env);
}
