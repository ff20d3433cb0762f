//! The parent's channel to a child (SPEC 4, issue 5 item 3): refs checked line
//! by line, artifacts taken into the blob store, the context pack delivered to
//! the parent, a bad line refusing the whole result, and the child able to
//! write its `artifact/` and nothing else of its parent's tree.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use brood_core::SessionName;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};

/// sha256 of "hello\n".
const HELLO_SHA: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

fn channel(env: &Env, parent: &str, child: &str) -> PathBuf {
    env.sup
        .paths()
        .channel_dir(&name(parent), &SessionName::default_session(), &name(child))
}

async fn run_child(env: &Env, child: &str, flags: &[&str]) -> Value {
    let args = json!({"name": child, "parent": "p", "task": format!("task of {child}"), "argv": agent(flags)});
    spawn_wait(env, &args).await
}

/// Spawns `args`, waits for that agent to end and for its files; returns
/// what `show` says of it.
async fn spawn_wait(env: &Env, args: &Value) -> Value {
    handle(&env.sup, &me(), "spawn", args).await.unwrap();
    let child = args["name"].as_str().unwrap();
    env.sup
        .wait(me(), vec![name(child)], Some(Duration::from_secs(20)))
        .await
        .unwrap();
    env.sup.flush().await;
    show(env, child)
}

async fn start_parent(env: &Env) {
    env.sup
        .spawn(me(), req("p", agent(&["--hang"])))
        .await
        .unwrap();
}

/// The `child` events the test agent `p` received, from its log (it prints
/// each as `test-agent: child NAME: EVENT` on stderr).
fn child_events(env: &Env, child: &str) -> Vec<Value> {
    let prefix = format!("test-agent: child {child}: ");
    // Stderr arrives in chunks that need not end at a line: join them first.
    let text: String = json_lines(env.sup.paths().agent_dir(&name("p")).join("log"))
        .iter()
        .filter_map(|l| l["text"].as_str().map(str::to_owned))
        .collect();
    text.lines()
        .filter_map(|x| x.strip_prefix(&prefix))
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refs_and_artifacts_come_back_to_the_parent() {
    let env = start(Duration::from_millis(300));
    start_parent(&env).await;
    let r1 = json!({"path": "artifact/out.txt", "summary": "the output", "kind": "artifact", "hash": format!("sha256:{HELLO_SHA}")});
    let r2 = json!({"path": "/src/lib.rs", "summary": "read this first", "id": "lib"});
    let c = run_child(
        &env,
        "c",
        &[
            "--artifact",
            "out.txt=hello\n",
            "--artifact",
            "deep/er.txt=beta",
            "--ref",
            &r1.to_string(),
            "--ref",
            &r2.to_string(),
            "--message",
            "my private reasoning",
            "--result",
            "all done",
        ],
    )
    .await;
    assert_eq!(c["status"], "completed", "{c}");
    let ch = channel(&env, "p", "c");
    assert_eq!(read(ch.join("result.md")), "all done");
    assert_eq!(
        read(ch.join("refs.jsonl")),
        format!(
            "{{\"id\":\"ref-1\",\"kind\":\"artifact\",\"path\":\"artifact/out.txt\",\"summary\":\"the output\",\"hash\":\"sha256:{HELLO_SHA}\"}}\n\
             {{\"id\":\"lib\",\"kind\":\"file\",\"path\":\"/src/lib.rs\",\"summary\":\"read this first\"}}\n"
        )
    );
    assert_eq!(read(ch.join("artifact/out.txt")), "hello\n");
    // Each artifact is in the content-addressed blob store, and the store
    // names it by hash and size.
    let blob = env.root().join("blobs/sha256").join(HELLO_SHA);
    assert_eq!(read(&blob), "hello\n");
    let stored = stored_channel(&env, "c");
    let names: Vec<(&str, u64)> = stored
        .artifacts
        .iter()
        .map(|a| (a.name.as_str(), a.size))
        .collect();
    assert_eq!(names, [("deep/er.txt", 4), ("out.txt", 6)]);
    assert_eq!(
        stored.refs.as_deref(),
        Some(read(ch.join("refs.jsonl")).as_str())
    );

    // The parent's context pack: result, the refs' summaries, the artifact a
    // ref names (with its content), and never the child's transcript.
    assert!(eventually(Duration::from_secs(5), || !child_events(
        &env, "c"
    )
    .is_empty()));
    let e = &child_events(&env, "c")[0];
    assert_eq!(e["status"], "completed");
    assert_eq!(e["result"], "all done");
    assert_eq!(e["refs"][0]["summary"], "the output");
    assert_eq!(e["refs"][1]["id"], "lib");
    assert_eq!(e["artifacts"].as_array().unwrap().len(), 1, "{e}");
    assert_eq!(e["artifacts"][0]["name"], "out.txt");
    assert_eq!(e["artifacts"][0]["content"], "hello\n");
    assert_eq!(e["artifacts"][0]["sha256"], HELLO_SHA);
    assert!(
        !e.to_string().contains("my private reasoning"),
        "the pack carries the child's transcript: {e}"
    );
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_ref_line_refuses_the_whole_result() {
    let env = start(Duration::from_millis(300));
    start_parent(&env).await;
    let ok = json!({"path": "a.txt", "summary": "fine"}).to_string();
    let cases = [
        (
            "nosummary",
            json!({"path": "b.txt"}),
            "refs.jsonl line 2: `summary` is required",
        ),
        (
            "twolines",
            json!({"path": "b.txt", "summary": "one\ntwo"}),
            "refs.jsonl line 2: `summary` must be a single line",
        ),
        (
            "badkind",
            json!({"path": "b.txt", "summary": "s", "kind": "blob"}),
            "refs.jsonl line 2: `kind` \"blob\" is not one of",
        ),
        (
            "badhash",
            json!({"path": "artifact/x", "summary": "s", "hash": format!("sha256:{}", "0".repeat(64))}),
            "refs.jsonl line 2: artifact/x: `hash` does not match its content",
        ),
        (
            "escapes",
            json!({"path": "../../../../x", "summary": "s", "hash": format!("sha256:{HELLO_SHA}")}),
            "refs.jsonl line 2: \"../../../../x\" must stay inside the channel",
        ),
    ];
    for (child, bad, why) in cases {
        let c = run_child(
            &env,
            child,
            &[
                "--artifact",
                "x=hello\n",
                "--ref",
                &ok,
                "--ref",
                &bad.to_string(),
                "--result",
                "would be done",
            ],
        )
        .await;
        assert_eq!(c["status"], "failed", "{child}: {c}");
        assert_eq!(c["reason"], "protocol_error", "{child}: {c}");
        let detail = c["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(why), "{child}: {detail:?} lacks {why:?}");
        // Nothing of the result was kept: no result.md, no refs.jsonl.
        let ch = channel(&env, "p", child);
        assert!(!ch.join("result.md").exists(), "{child}: result.md written");
        assert!(
            !ch.join("refs.jsonl").exists(),
            "{child}: refs.jsonl written"
        );
        let stored = stored_channel(&env, child);
        assert!(stored.result.is_none() && stored.refs.is_none() && stored.artifacts.is_empty());
        // The refusal is in the child's events, naming the line.
        let events = json_lines(session_dir(&env, child).join("events.jsonl"));
        assert!(
            events.iter().any(|e| e["type"] == "agent.protocol.error"
                && e["error"].as_str().unwrap_or_default().contains("line 2")),
            "{child}: {events:?}"
        );
    }
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// SPEC 4: the child can write its `artifact/` and nowhere else in its
/// parent's tree, and reads its handoff but not its parent's transcript;
/// SPEC 3: no program in a sandbox writes a control file. The
/// first child inherits the operator's `/ rw`, so landlock alone would let it:
/// its own view of the ctx tree holds the line (issue 24: only its object,
/// its sessions and its parent's channel to it are there, read-only but for
/// `artifact/`). The second may only read `/`, and still writes its artifacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_writes_its_artifacts_and_nothing_else_of_the_tree() {
    let env = start(Duration::from_millis(300));
    start_parent(&env).await;
    env.sup.flush().await;
    let psess = session_dir(&env, "p");
    let ctx = env.sup.paths().ctx();
    for (child, policy) in [
        ("inherits", None),
        (
            "reads",
            Some(json!({"files": [{"path": "/", "mode": "ro"}]})),
        ),
    ] {
        let ch = channel(&env, "p", child);
        // Refused by landlock, by the view's read-only mounts, or because the
        // view does not have the file at all.
        const ROFS: &str = "error: Read-only file system (os error 30)";
        const GONE: &str = "error: No such file or directory (os error 2)";
        let targets = [
            (ch.join("artifact/mine.txt"), "ok"),
            (ch.join("artifact/handoff.md"), "ok"),
            (ch.join("handoff.md"), "denied"),
            (ch.join("result.md"), ROFS),
            (ch.join("forged.md"), ROFS),
            (psess.join("messages.jsonl"), ROFS),
            // Written by the projection thread, which a fast agent may
            // outrun: refused by landlock when there, by the read-only view
            // when not yet.
            (ctx.join(format!("agent/{child}.d/status")), "refused"),
            (ctx.join("agent/p.d/policy"), GONE),
            (ctx.join("agent/new-file"), ROFS),
        ];
        // What it may read of its parent's session: its channel only, not
        // the transcript (SPEC 4) nor the events (issue 24).
        let reads = [
            (ch.join("handoff.md"), "ok"),
            (psess.join("events.jsonl"), GONE),
            (psess.join("messages.jsonl"), GONE),
            (psess.join("latest.md"), GONE),
        ];
        let mut argv = agent(&[]);
        for (p, _) in &targets {
            argv.push("--probe-write".to_owned());
            argv.push(p.to_string_lossy().into_owned());
        }
        for (p, _) in &reads {
            argv.push("--probe-read".to_owned());
            argv.push(p.to_string_lossy().into_owned());
        }
        let mut args = json!({"name": child, "parent": "p", "task": "probe", "argv": argv});
        if let Some(pol) = &policy {
            args["policy"] = pol.clone();
        }
        assert_eq!(spawn_wait(&env, &args).await["status"], "completed");
        let result = read(ch.join("result.md"));
        for (p, want) in &reads {
            let line = format!("read {}: {want}", p.display());
            assert!(
                result.lines().any(|l| l == line),
                "{child}: expected {line:?} in\n{result}"
            );
        }
        for (p, want) in &targets {
            let wants: &[&str] = if *want == "refused" {
                &["denied", ROFS]
            } else {
                &[want]
            };
            let lines: Vec<String> = wants
                .iter()
                .map(|w| format!("write {}: {w}", p.display()))
                .collect();
            assert!(
                result.lines().any(|l| lines.iter().any(|x| x == l)),
                "{child}: expected one of {lines:?} in\n{result}"
            );
        }
        // What the child was refused left the files as the supervisor wrote them.
        assert_eq!(read(ch.join("handoff.md")), "probe");
        assert!(!ch.join("forged.md").exists());
    }
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// Under `iso = ns` the child's `artifact/` is mounted at its own path, so
/// `BROOD_ARTIFACTS` works inside a private mount table too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_in_its_own_mount_namespace_hands_back_artifacts() {
    let env = start(Duration::from_millis(300));
    let mut p = req("p", agent(&["--hang"]));
    p.policy = Some(json!({"mounts": system_mounts()}));
    env.sup.spawn(me(), p).await.unwrap();
    let args = json!({"name": "c", "parent": "p", "iso": "ns", "argv": agent(&[
        "--artifact", "out.txt=from inside\n", "--probe-read", "/etc/hostname", "--result", "isolated"])});
    let c = spawn_wait(&env, &args).await;
    assert_eq!(c["status"], "completed", "{c}");
    let ch = channel(&env, "p", "c");
    let result = read(ch.join("result.md"));
    assert!(
        result.contains("read /etc/hostname: error"),
        "the host's files are not in its namespace: {result}"
    );
    assert_eq!(read(ch.join("artifact/out.txt")), "from inside\n");
    let stored = stored_channel(&env, "c");
    assert_eq!(stored.artifacts.len(), 1);
    assert_eq!(stored.artifacts[0].name, "out.txt");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// SPEC 4: `handoff.md` is written once, when the channel is created (a resume
/// with new input leaves it); `result.md` appears only with a terminal status
/// and never holds a NUL byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_is_written_once_and_result_md_holds_no_nul() {
    let env = start(Duration::from_millis(300));
    start_parent(&env).await;
    let args = json!({"name": "c", "parent": "p", "task": "the first task", "argv": agent(&["--inputs", "1", "--result", "first"])});
    handle(&env.sup, &me(), "spawn", &args).await.unwrap();
    env.sup.flush().await;
    let ch = channel(&env, "p", "c");
    assert_eq!(read(ch.join("handoff.md")), "the first task");
    assert_eq!(read(ch.join("status")), "active\n");
    assert!(!ch.join("result.md").exists(), "result.md before the end");
    env.sup.send(me(), name("c"), "go".into()).await.unwrap();
    env.sup
        .wait(me(), vec![name("c")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup
        .resume(me(), name("c"), Some("a second task".into()))
        .await
        .unwrap();
    // The resumed run waits for an input again; its end does not matter here.
    env.sup.cancel(me(), name("c")).await.unwrap();
    env.sup.flush().await;
    assert_eq!(read(ch.join("handoff.md")), "the first task");

    // An exec agent's stdout with NUL bytes becomes a result.md without them.
    let args = json!({"name": "nul", "parent": "p", "protocol": "exec", "argv": ["sh", "-c", "printf 'a\\000b\\000'"]});
    spawn_wait(&env, &args).await;
    let bytes = std::fs::read(channel(&env, "p", "nul").join("result.md")).unwrap();
    assert_eq!(bytes, b"ab");
    env.sup.cancel(me(), name("p")).await.unwrap();
}
