//! Issue 24, "checked at the door": every field of an agent (`POST
//! /api/agents` and the child protocol's `spawn`), of a job and of its
//! worker is checked before 201, against a real `brood serve`. Each bad
//! request is answered 400 naming the field, and leaves no record: nothing
//! admitted can fail later for a reason the door could have seen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

/// A 400 whose message starts with `field` (or, for names, mentions it).
fn refused(sock: &Path, route: &str, body: &Value, field: &str, says: &str) {
    let (status, v) = http(sock, "POST", route, Some(body));
    assert_eq!(status, 400, "{field}: {body} answered {status} {v}");
    let m = message(&v);
    // A policy's own fields are named as such ("policy field timeout_s: ...").
    let named = m.starts_with(field) || m.starts_with(&format!("policy field {field}:"));
    assert!(
        named && m.contains(says),
        "{field}: {body}: the message {m:?} does not name {field:?} with {says:?}"
    );
}

fn absent(sock: &Path, what: &str) {
    let (status, v) = http(sock, "GET", what, None);
    assert_eq!(status, 404, "{what} was recorded: {v}");
}

#[test]
fn every_field_of_an_agent_is_checked_before_it_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let _d = serve_daemon(dir.path(), None);
    let sock = dir.path().join("brood.sock");
    let ok = agent(&["--result", "x"]);
    let file = dir.path().join("plain");
    std::fs::write(&file, "#!/bin/sh\n").unwrap();
    let plain = file.display().to_string();
    let tmp = dir.path().display().to_string();

    let cases: Vec<(&str, Value, &str)> = vec![
        // Numbers the store cannot hold or the kernel refuses.
        (
            "timeout_s",
            json!({"policy": {"timeout_s": u64::MAX}}),
            "at most 315360000",
        ),
        (
            "resources.pids_max",
            json!({"policy": {"resources": {"pids_max": 1u64 << 40}}}),
            "at most",
        ),
        (
            "resources.memory_max",
            json!({"policy": {"resources": {"memory_max": u64::MAX}}}),
            "at most",
        ),
        ("window", json!({"policy": {"window": u64::MAX}}), "at most"),
        ("uid", json!({"policy": {"uid": u32::MAX}}), "not a user id"),
        // NUL bytes.
        (
            "argv[1]",
            json!({"argv": [exe(), "test-\u{0}agent"]}),
            "NUL",
        ),
        ("task", json!({"task": "a\u{0}b"}), "NUL"),
        ("env.A", json!({"env": {"A": "x\u{0}y"}}), "NUL"),
        ("cwd", json!({"cwd": "/tmp/\u{0}x"}), "control"),
        // The working directory.
        ("cwd", json!({"cwd": "tmp"}), "absolute"),
        (
            "cwd",
            json!({"cwd": format!("{tmp}/no-such-dir")}),
            "does not exist",
        ),
        ("cwd", json!({"cwd": plain}), "not a directory"),
        // The program.
        ("argv", json!({"argv": []}), "must name a program"),
        ("argv[0]", json!({"argv": [""]}), "must not be empty"),
        (
            "argv[0]",
            json!({"argv": ["bin/true"]}),
            "give the program's absolute path",
        ),
        (
            "argv[0]",
            json!({"argv": [format!("{tmp}/no-such-program")]}),
            "does not exist",
        ),
        ("argv[0]", json!({"argv": [plain]}), "not executable"),
        ("argv[0]", json!({"argv": [tmp]}), "not a regular file"),
        (
            "argv[0]",
            json!({"argv": ["brood-no-such-program"]}),
            "not found in the agent's PATH",
        ),
        // The PATH the agent gets, not the supervisor's.
        (
            "argv[0]",
            json!({"argv": ["sh"], "env": {"PATH": tmp}}),
            "not found in the agent's PATH",
        ),
    ];
    for (i, (field, extra, says)) in cases.iter().enumerate() {
        let name = format!("bad{i}");
        let mut body = json!({"name": name, "argv": ok});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        refused(&sock, "/api/agents", &body, field, says);
        absent(&sock, &format!("/api/agents/{name}"));
    }
    // A name with a NUL byte is no name.
    let (status, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "a\u{0}b", "argv": ok})),
    );
    assert_eq!(status, 400, "{v}");
    assert!(message(&v).starts_with("name:"), "{v}");

    // Under the daemon's root (outside its ctx/): hidden from every agent
    // by the veil of a root daemon, so refused at the door; a daemon that
    // is not root has no veil, and the agent runs.
    let inside = dir.path().join("bin");
    std::fs::create_dir(&inside).unwrap();
    std::os::unix::fs::symlink(exe(), inside.join("brood-here")).unwrap();
    let veiled = json!({"name": "veiled", "argv": ["brood-here", "test-agent", "--result", "x"],
                        "env": {"PATH": inside.display().to_string()}});
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        refused(
            &sock,
            "/api/agents",
            &veiled,
            "argv[0]",
            "hidden from every agent",
        );
        absent(&sock, "/api/agents/veiled");
        refused(
            &sock,
            "/api/agents",
            &json!({"name": "veiled2", "argv": ok, "cwd": inside.display().to_string()}),
            "cwd",
            "hidden from every agent",
        );
    } else {
        let (status, v) = http(&sock, "POST", "/api/agents", Some(&veiled));
        assert_eq!(status, 201, "{v}");
    }

    // What passes: a program found in the PATH the agent is given, in a
    // working directory that exists; it runs and ends as asked.
    let elsewhere = tempfile::tempdir().unwrap();
    let bin = elsewhere.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(exe(), bin.join("brood-here")).unwrap();
    let (status, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "good", "argv": ["brood-here", "test-agent", "--result", "x"],
                     "env": {"PATH": bin.display().to_string()},
                     "cwd": elsewhere.path().display().to_string()}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let (status, w) = http(
        &sock,
        "POST",
        "/api/agents/good/wait",
        Some(&json!({"timeout_s": 30})),
    );
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
}

#[test]
fn the_child_protocols_spawn_is_checked_at_the_same_door() {
    let dir = tempfile::tempdir().unwrap();
    let _d = serve_daemon(dir.path(), None);
    let sock = dir.path().join("brood.sock");
    let ok = agent(&["--result", "x"]);
    let asks = [
        json!({"name": "c1", "argv": ["bin/true"]}),
        json!({"name": "c2", "argv": ok, "cwd": "/no/such/dir"}),
        json!({"name": "c3", "argv": ok, "policy": {"timeout_s": u64::MAX}}),
        json!({"name": "c4", "argv": [exe(), "a\u{0}b"]}),
    ];
    let mut flags: Vec<String> = Vec::new();
    for a in &asks {
        flags.push("--request".into());
        flags.push(format!("spawn={a}"));
    }
    flags.extend(["--result".into(), "asked".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (status, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "p", "argv": agent(&flags)})),
    );
    assert_eq!(status, 201, "{v}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/p/wait",
        Some(&json!({"timeout_s": 30})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let (_, shown) = http(&sock, "GET", "/api/agents/p", None);
    let result = shown["result"].as_str().unwrap_or("").to_owned();
    assert_eq!(
        result.matches("spawn: BadRequest").count(),
        asks.len(),
        "{result}"
    );
    for c in ["c1", "c2", "c3", "c4"] {
        absent(&sock, &format!("/api/agents/{c}"));
    }
    // Each refusal named its field in p's log of events.
    let events = brood_runtime::paths::Paths::new(dir.path().to_path_buf(), 0)
        .session_dir(
            &brood_core::AgentName::new("p").unwrap(),
            &brood_core::SessionName::default_session(),
        )
        .join("events.jsonl");
    let said: Vec<String> = json_lines(&events)
        .into_iter()
        .filter(|e| e["code"] == "BadRequest")
        .map(|e| e["message"].as_str().unwrap_or("").to_owned())
        .collect();
    for field in ["argv[0]:", "cwd:", "policy field timeout_s:", "argv[1]:"] {
        assert!(
            said.iter().any(|m| m.starts_with(field)),
            "{field} not in {said:?}"
        );
    }
}

#[test]
fn every_field_of_a_job_and_its_worker_is_checked_before_it_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let _d = serve_daemon(dir.path(), None);
    let sock = dir.path().join("brood.sock");
    let (status, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "lead", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(status, 201, "{v}");
    let tmp = dir.path().display().to_string();
    let worker = |argv: Value| json!({"worker": {"argv": argv}});
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "concurrency",
            json!({"concurrency": u32::MAX}),
            "from 1 to 1024",
        ),
        ("max_attempts", json!({"max_attempts": 0}), "from 1 to 100"),
        (
            "item_timeout_s",
            json!({"item_timeout_s": u64::MAX}),
            "from 1 to",
        ),
        ("max_runtime_s", json!({"max_runtime_s": 0}), "from 1 to"),
        ("instruction", json!({"instruction": "a\u{0}{t}"}), "NUL"),
        ("worker.argv", worker(json!([])), "must name a program"),
        (
            "worker.argv[0]",
            worker(json!(["bin/worker"])),
            "absolute path",
        ),
        (
            "worker.argv[0]",
            worker(json!([format!("{tmp}/no-such-worker")])),
            "does not exist",
        ),
        (
            "worker.argv[0]",
            worker(json!(["brood-no-such-worker"])),
            "not found in the agent's PATH",
        ),
        ("worker.argv[1]", worker(json!([exe(), "a\u{0}"])), "NUL"),
        (
            "worker.policy",
            json!({"worker": {"policy": {"timeout_s": u64::MAX}}}),
            "timeout_s",
        ),
        ("id", json!({"id": "-x"}), "not a job id"),
        ("id", json!({"id": "x".repeat(60)}), "not a job id"),
        (
            "input",
            json!({"input": "/etc/passwd"}),
            "looks like a file path",
        ),
        ("input row 1", json!({"input": [{"t": "a\u{0}"}]}), "NUL"),
    ];
    for (i, (field, extra, says)) in cases.iter().enumerate() {
        let id = format!("bad{i}");
        let mut body = json!({"id": id, "owner": "lead", "instruction": "say {t}",
                              "input": "t\na\n"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        refused(&sock, "/api/jobs", &body, field, says);
        let id = body["id"].as_str().unwrap().to_owned();
        absent(&sock, &format!("/api/jobs/{id}"));
    }
    // A job at the edges of every range is created, and runs.
    let (status, v) = http(
        &sock,
        "POST",
        "/api/jobs",
        Some(
            &json!({"id": "edges", "owner": "lead", "instruction": "say {t}",
                     "input": "t\na\n", "concurrency": 1024, "max_attempts": 100,
                     "item_timeout_s": 315360000u64, "max_runtime_s": 315360000u64,
                     "worker": {"argv": agent(&["--job-worker"])}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let (status, v) = http(&sock, "POST", "/api/jobs/edges/start", None);
    assert_eq!(status, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(30), || {
            http(&sock, "GET", "/api/jobs/edges", None).1["status"] == "completed"
        }),
        "the job did not complete"
    );
}
