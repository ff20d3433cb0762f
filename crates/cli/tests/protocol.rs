//! Bad input on the child protocol (SPEC 7): a line that is not JSON, a 2 MiB line,
//! invalid UTF-8, end of file without `done` fail that run with the reason the spec
//! gives (with the line number where there is one), while the supervisor and the
//! sibling agents go on; an unknown message type is logged and ignored.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn child(name: &str, flags: &[&str]) -> String {
    json!({"name": name, "argv": agent(flags), "task": format!("be {name}")}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_fail_only_their_own_run() {
    let env = start(Duration::from_millis(500));
    let specs = [
        child("notjson", &["--malformed", "notjson", "--hang"]),
        child("long", &["--malformed", "long", "--hang"]),
        child("utf8", &["--malformed", "utf8", "--hang"]),
        child(
            "noresult",
            &["--no-result", "--stderr", "about to leave without a word"],
        ),
        child("unknown", &["--malformed", "unknown", "--result", "fine"]),
        child(
            "sibling",
            &["--sleep-ms", "300", "--result", "sibling done"],
        ),
    ];
    let mut flags: Vec<&str> = Vec::new();
    for s in &specs {
        flags.extend(["--spawn", s.as_str()]);
    }
    flags.extend(["--wait", "--result", "parent done"]);
    env.sup
        .spawn(me(), req("parent", agent(&flags)))
        .await
        .expect("spawn parent");
    let r = env
        .sup
        .wait(me(), vec![name("parent")], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["timed_out"], false);

    env.sup.flush().await;
    let expect = |n: &str, status: &str, reason: Option<&str>| {
        let a = show(&env, n);
        assert_eq!(a["status"], status, "{n}: {a}");
        assert_eq!(a["reason"].as_str(), reason, "{n}: {a}");
        a
    };
    for (n, line_kind) in [
        ("notjson", "not JSON"),
        ("long", "longer than"),
        ("utf8", "UTF-8"),
    ] {
        let a = expect(n, "failed", Some("protocol_error"));
        let detail = a["detail"].as_str().unwrap_or("");
        // Line 1 is `ready`; the bad line is line 2.
        assert!(
            detail.contains("line 2"),
            "{n}: detail {detail:?} names no line number"
        );
        assert!(detail.contains(line_kind), "{n}: detail {detail:?}");
        let ev = json_lines(session_dir(&env, n).join("events.jsonl"));
        assert!(
            ev.iter()
                .any(|e| e["type"] == "agent.protocol.error" && e["line"] == 2),
            "{n}: no protocol error event with its line: {ev:?}"
        );
    }
    let a = expect("noresult", "failed", Some("exited_without_result"));
    assert!(
        a["detail"]
            .as_str()
            .unwrap_or("")
            .contains("about to leave without a word"),
        "the stderr tail is kept: {a}"
    );
    expect("unknown", "completed", None);
    let ev = json_lines(session_dir(&env, "unknown").join("events.jsonl"));
    assert!(
        ev.iter()
            .any(|e| e["type"] == "agent.protocol.unknown" && e["message_type"] == "whatever")
    );
    let s = expect("sibling", "completed", None);
    assert_eq!(s["result"], "sibling done");
    let p = expect("parent", "completed", None);
    let res = p["result"].as_str().unwrap_or("");
    assert!(res.contains("notjson: failed"), "{res}");
    assert!(res.contains("sibling: completed"), "{res}");
    // The supervisor goes on: a new agent still runs.
    let r = env
        .sup
        .spawn(me(), req("after", agent(&["--result", "still here"])))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["status"], "running");
    let w = env
        .sup
        .wait(me(), vec![name("after")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["result"], "still here");
    // The failed children left no process behind.
    for n in ["notjson", "long", "utf8", "noresult"] {
        assert!(processes_of(&env, n).is_empty(), "{n} left a process");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_output_is_drained_and_the_run_completes() {
    let env = start(Duration::from_millis(500));
    env.sup
        .spawn(
            me(),
            req(
                "flood",
                agent(&["--flood", "8388608", "--result", "flooded"]),
            ),
        )
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("flood")], Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    assert_eq!(w["agents"][0]["result"], "flooded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_and_exit_code_and_error_and_exec_outcomes() {
    let env = start(Duration::from_millis(500));
    let mut exec = req(
        "exec-ok",
        vec![
            "sh".into(),
            "-c".into(),
            "read line; echo \"got: $line\"".into(),
        ],
    );
    exec.protocol = brood_store::Protocol::Exec;
    exec.task = "the handoff\n".into();
    exec.await_ready = false;
    let mut exec_bad = req("exec-bad", vec!["sh".into(), "-c".into(), "exit 3".into()]);
    exec_bad.protocol = brood_store::Protocol::Exec;
    exec_bad.await_ready = false;
    for r in [
        req("crash", agent(&["--crash"])),
        req("errs", agent(&["--error", "it went wrong"])),
        exec,
        exec_bad,
    ] {
        env.sup.spawn(me(), r).await.unwrap();
    }
    let w = env
        .sup
        .wait(
            me(),
            ["crash", "errs", "exec-ok", "exec-bad"].map(name).to_vec(),
            Some(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let by = |n: &str| -> Value {
        w["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by("crash")["state"], "failed:crashed");
    assert_eq!(by("errs")["state"], "failed:exit_code");
    assert_eq!(by("errs")["result"], "it went wrong");
    assert_eq!(by("exec-ok")["state"], "completed");
    assert_eq!(by("exec-ok")["result"], "got: the handoff\n");
    assert_eq!(by("exec-bad")["state"], "failed:exit_code");
    assert_eq!(by("exec-bad")["exit_code"], 3);
}

/// Issue 25 item 8: a child speaking the seed's sub-agent protocol exactly
/// (`init`, `ready`, `chunk`s, `done` with `response` and usage; seed 004)
/// has what it said in its session's transcript, once: its response as the
/// assistant's message, whether or not `done` repeats what it streamed; a
/// child that only streams gets its chunks as its message; a child that
/// sends its words whole is not recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_protocol_childs_words_land_in_its_transcript_once() {
    let env = start(Duration::from_millis(500));
    let seed = |chunks: &[&str], response: &str| -> Vec<String> {
        let mut script = String::from("read init; echo '{\"type\":\"ready\"}'; ");
        for c in chunks {
            script.push_str(&format!(
                "echo '{{\"type\":\"chunk\",\"delta\":\"{c}\"}}'; "
            ));
        }
        script.push_str(&format!(
            "echo '{{\"type\":\"done\",\"result\":{{\"success\":true,\"response\":\"{response}\",\"tokensIn\":100,\"tokensOut\":50,\"costUsd\":0.001,\"durationMs\":800}}}}'"
        ));
        vec!["sh".into(), "-c".into(), script]
    };
    for r in [
        req("repeats", seed(&["Hello, ", "world"], "Hello, world")),
        req(
            "summarises",
            seed(&["step one. ", "step two."], "Done: two steps"),
        ),
        req("streams", seed(&["only ", "chunks"], "")),
        req(
            "whole",
            agent(&["--message", "said whole", "--result", "said whole"]),
        ),
    ] {
        env.sup.spawn(me(), r).await.unwrap();
    }
    let names = ["repeats", "summarises", "streams", "whole"];
    let w = env
        .sup
        .wait(
            me(),
            names.map(name).to_vec(),
            Some(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    for a in w["agents"].as_array().unwrap() {
        assert_eq!(a["state"], "completed", "{a}");
    }
    env.sup.flush().await;
    let said = |n: &str| -> Vec<String> {
        json_lines(session_dir(&env, n).join("messages.jsonl"))
            .into_iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(said("repeats"), ["Hello, world"]);
    assert_eq!(said("summarises"), ["Done: two steps"]);
    assert_eq!(said("streams"), ["only chunks"]);
    assert_eq!(said("whole"), ["said whole"]);
    // Its cost is counted as before (the `done`'s figures).
    let a = show(&env, "repeats");
    assert_eq!(a["cost_usd"], 0.001, "{a}");
}
