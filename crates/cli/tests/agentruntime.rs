//! brood's event stream in the "Agent Runtime" draft standard's form: a whole
//! run (children that complete, fail and are cancelled, an input, a close, a
//! resume) exported through `to_agentruntime` and every event validated against
//! the standard's own event schema; then the same through the control socket
//! and the CLI, and a bad format refused by both.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use brood_runtime::agentruntime::to_agentruntime;
use common::*;
use serde_json::{Value, json};

/// The schema, vendored from the peer standard (tests/peer/README.md).
const SCHEMA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/peer/agentruntime-event.schema.json"
);

/// The schema as published beside the repository, when it is checked out there.
const PUBLISHED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/peer/agentruntime-event.schema.json"
);

/// The event schema compiled with format assertions on (`timestamp` is
/// `format: date-time`, which 2020-12 only annotates unless asked to assert).
struct Validator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl Validator {
    fn load() -> Validator {
        let path = Path::new(SCHEMA);
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "the Agent Runtime event schema is missing: looked for {} ({e})",
                path.display()
            )
        });
        // The vendored copy must not drift from the published one.
        if let Ok(published) = std::fs::read_to_string(PUBLISHED) {
            assert_eq!(
                text, published,
                "{SCHEMA} differs from the published {PUBLISHED}: copy it again"
            );
        }
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        let url = format!("file://{}", path.display());
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        compiler.enable_format_assertions();
        compiler
            .add_resource(&url, doc)
            .unwrap_or_else(|e| panic!("adding {}: {e}", path.display()));
        let index = compiler
            .compile(&url, &mut schemas)
            .unwrap_or_else(|e| panic!("compiling {}: {e:#}", path.display()));
        let v = Validator { schemas, index };
        // The validator really refuses: a bad timestamp and a missing eventId.
        for bad in [
            json!({"type": "subagent.spawned", "eventId": "x-1", "timestamp": "yesterday"}),
            json!({"type": "subagent.spawned", "timestamp": "2024-01-01T00:00:00Z"}),
            json!({"type": "subagent.spawned", "eventId": "x-1", "timestamp": "2024-01-01T00:00:00Z", "sequence": -1}),
        ] {
            assert!(v.check(&bad).is_err(), "the schema accepted {bad}");
        }
        v
    }

    fn check(&self, event: &Value) -> Result<(), String> {
        self.schemas
            .validate(event, self.index)
            .map_err(|e| format!("{e:#}"))
    }

    /// Every event valid, or a failure naming each invalid one and why.
    fn check_all(&self, events: &[Value]) {
        let bad: Vec<String> = events
            .iter()
            .filter_map(|e| self.check(e).err().map(|why| format!("{e}\n  {why}")))
            .collect();
        assert!(
            bad.is_empty(),
            "{} of {} events are not valid against {SCHEMA}:\n{}",
            bad.len(),
            events.len(),
            bad.join("\n")
        );
    }
}

/// The tenant's whole stream, in the standard's form, as the socket and the
/// CLI write it.
fn export(env: &Env) -> Vec<Value> {
    env.sup
        .store()
        .events(env.sup.tenant(), 0, None, 100_000)
        .unwrap()
        .iter()
        .filter_map(to_agentruntime)
        .collect()
}

fn types_of<'a>(events: &'a [Value], agent: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e["subagentId"] == agent)
        .map(|e| e["type"].as_str().unwrap())
        .collect()
}

fn spawn_args(name: &str, flags: &[&str]) -> String {
    json!({"name": name, "argv": agent(flags), "task": format!("task of {name}"), "await_ready": true})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_exports_as_valid_standard_events() {
    let schema = Validator::load();
    let env = start(Duration::from_millis(500));
    let ok = spawn_args("ok", &["--result", "fine"]);
    let bad = spawn_args("bad", &["--error", "boom"]);
    let stuck = spawn_args("stuck", &["--hang"]);
    let root_flags = [
        "--spawn",
        ok.as_str(),
        "--spawn",
        bad.as_str(),
        "--spawn",
        stuck.as_str(),
        "--inputs",
        "1",
        "--result",
        "root done",
    ];
    env.sup
        .spawn(me(), req("root", agent(&root_flags)))
        .await
        .unwrap();
    // The root spawns in order, so once `stuck` runs the other two exist.
    let running = eventually_async(Duration::from_secs(10), || {
        env.sup
            .view()
            .show(&name("stuck"))
            .is_ok_and(|s| s.agent.status == "running")
    })
    .await;
    assert!(running, "stuck never ran: {}", show(&env, "root"));

    let w = env
        .sup
        .wait(
            me(),
            vec![name("ok"), name("bad")],
            Some(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    assert_eq!(w["agents"][1]["status"], "failed", "{w}");
    env.sup.cancel(me(), name("stuck")).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("stuck")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "cancelled", "{w}");

    // Close the finished child, then resume it (its parent still runs).
    env.sup.close(me(), name("ok")).await.unwrap();
    env.sup
        .resume(me(), name("ok"), Some("again".into()))
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("ok")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");

    env.sup.send(me(), name("root"), "go".into()).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("root")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    env.sup.close(me(), name("root")).await.unwrap();

    let events = export(&env);
    schema.check_all(&events);

    // The mapping, agent by agent (agents interleave in the stream).
    let all = |a: &str| types_of(&events, a);
    assert_eq!(
        all("root"),
        [
            "subagent.spawned",
            "subagent.status",
            "subagent.input",
            "subagent.completed",
            "subagent.closed"
        ],
        "{events:#?}"
    );
    assert_eq!(
        all("ok"),
        [
            "subagent.spawned",
            "subagent.status",
            "subagent.completed",
            "subagent.closed",
            "subagent.status",
            "subagent.status",
            "subagent.completed"
        ],
        "{events:#?}"
    );
    assert_eq!(
        all("bad"),
        ["subagent.spawned", "subagent.status", "subagent.failed"],
        "{events:#?}"
    );
    assert_eq!(
        all("stuck"),
        ["subagent.spawned", "subagent.status", "subagent.failed"],
        "{events:#?}"
    );
    assert_eq!(events.len(), 18, "nothing but these: {events:#?}");

    // Sequence numbers strictly increase, event ids are unique, and the
    // first event is the root's spawn.
    let seqs: Vec<i64> = events
        .iter()
        .map(|e| e["sequence"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let mut ids: Vec<&str> = events
        .iter()
        .map(|e| e["eventId"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), events.len(), "event ids repeat");
    assert_eq!(events[0]["type"], "subagent.spawned");
    assert_eq!(events[0]["subagentId"], "root");
    assert_eq!(events[0]["payload"]["parent"], Value::Null);
    assert!(events.iter().all(|e| e["sessionId"] == "default"));

    let find = |ty: &str, agent: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["type"] == ty && e["subagentId"] == agent)
            .collect()
    };
    for child in ["ok", "bad", "stuck"] {
        let s = find("subagent.spawned", child);
        assert_eq!(s[0]["payload"]["parent"], "root", "{s:?}");
    }
    let done = find("subagent.completed", "ok");
    assert_eq!(done.len(), 2, "two runs, two completions");
    assert_ne!(done[0]["runId"], done[1]["runId"], "{done:?}");
    let failed = find("subagent.failed", "bad");
    assert_eq!(failed[0]["status"], "failed", "{failed:?}");
    assert!(failed[0]["statusReason"].is_string(), "{failed:?}");
    let cancelled = find("subagent.failed", "stuck");
    assert_eq!(cancelled[0]["status"], "cancelled", "{cancelled:?}");
    assert_eq!(cancelled[0]["statusReason"], "user", "{cancelled:?}");
    assert_eq!(find("subagent.closed", "ok").len(), 1);
    assert_eq!(find("subagent.closed", "root").len(), 1);
    let input = find("subagent.input", "root");
    assert_eq!(input.len(), 1, "{events:#?}");
    let resumed: Vec<&Value> = find("subagent.status", "ok")
        .into_iter()
        .filter(|e| e["statusReason"] == "resume")
        .collect();
    assert_eq!(resumed.len(), 1, "{events:#?}");
    assert_eq!(resumed[0]["status"], "queued");
}

/// `GET /api/events` (not following) with `args` as its query: the events
/// of the stream, and `{"ok": true}` or `{"ok": false, "error"}`.
async fn socket_events(sock: &Path, args: Value) -> (Vec<Value>, Value) {
    let mut query = vec!["follow=false".to_owned()];
    for (k, v) in args.as_object().unwrap() {
        let k = if k == "name" { "agent" } else { k.as_str() };
        let v = v
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string());
        query.push(format!("{k}={v}"));
    }
    let path = format!("/api/events?{}", query.join("&"));
    let sock = sock.to_owned();
    let (status, body) = tokio::task::spawn_blocking(move || http(&sock, "GET", &path, None))
        .await
        .unwrap();
    if status != 200 {
        return (Vec::new(), json!({"ok": false, "error": body["error"]}));
    }
    let text = body.as_str().unwrap_or_default().to_owned();
    let events = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (events, json!({"ok": true}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_streams_standard_events_and_refuses_a_bad_format() {
    let schema = Validator::load();
    let env = start(Duration::from_millis(500));
    let sock = env.root().join("test.sock");
    let listener = brood_server::bind_unix(&sock).await.unwrap();
    let server = tokio::spawn(brood_server::serve_unix(
        brood_server::Api::new(env.sup.clone(), None),
        listener,
    ));
    env.sup
        .spawn(me(), req("solo", agent(&["--result", "hi"])))
        .await
        .unwrap();
    env.sup
        .wait(me(), vec![name("solo")], Some(Duration::from_secs(10)))
        .await
        .unwrap();

    let (events, end) = socket_events(&sock, json!({"format": "agentruntime"})).await;
    assert_eq!(end["ok"], true, "{end}");
    schema.check_all(&events);
    assert_eq!(
        types_of(&events, "solo"),
        ["subagent.spawned", "subagent.status", "subagent.completed"],
        "{events:#?}"
    );
    // The same as the exported stream.
    assert_eq!(events, export(&env));
    // One agent's only, after a sequence number.
    let after = events[0]["sequence"].as_i64().unwrap();
    let (some, _) = socket_events(
        &sock,
        json!({"format": "agentruntime", "name": "solo", "after": after}),
    )
    .await;
    assert_eq!(some, events[1..], "{some:#?}");
    // The default is still brood's own form.
    let (native, _) = socket_events(&sock, json!({})).await;
    assert_eq!(native[0]["type"], "agent.spawn", "{native:?}");

    for bad in [json!("xml"), json!(5)] {
        let (none, end) = socket_events(&sock, json!({"format": bad})).await;
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(end["ok"], false, "{end}");
        assert_eq!(end["error"]["code"], "BadRequest", "{end}");
        let msg = end["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&bad.to_string()), "{msg}");
    }
    server.abort();
}

#[test]
fn the_cli_prints_standard_events_and_refuses_a_bad_format() {
    let schema = Validator::load();
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["run", "--name", "solo", "--"];
    let a = agent(&["--error", "nope"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(dir.path(), &args);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    let o = brood(dir.path(), &["events", "--format", "agentruntime"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let events: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    schema.check_all(&events);
    assert_eq!(
        types_of(&events, "solo"),
        ["subagent.spawned", "subagent.status", "subagent.failed"],
        "{}",
        text(&o)
    );
    assert_eq!(events.len(), 3, "{}", text(&o));

    let o = brood(dir.path(), &["events", "--format", "xml"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("\"xml\""),
        "{}",
        text(&o)
    );
    assert!(o.stdout.is_empty(), "{}", text(&o));
}

/// A job's events (SPEC 10's nine kinds, `job.progress` with its counts and
/// ETA among them) in the standard's form, each valid against its schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_events_export_as_valid_standard_events() {
    let schema = Validator::load();
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(me(), req("owner", agent(&["--hang"])))
        .await
        .unwrap();
    let argv = [exe(), "test-agent", "--job-worker", "--item-delay", "200"];
    let make = |id: &str, instruction: &str| {
        let body: brood_api::JobBody = serde_json::from_value(json!({
            "id": id, "owner": "owner", "instruction": instruction, "max_attempts": 1,
            "input": "id,text\na,one\nb,two\nc,three\nd,four\ne,five\nf,six\n", "id_column": "id",
            "concurrency": 1, "worker": {"argv": argv},
        }))
        .unwrap();
        brood_runtime::jobs::create(env.sup.store().as_ref(), env.sup.tenant(), &me(), body, 1)
            .unwrap();
    };
    make("fine", "Echo {text}");
    make("bad", "FAIL-ALWAYS {text}");
    make("stopped", "Echo {text}");
    for id in ["fine", "bad", "stopped"] {
        env.sup.job_start(me(), id.into()).await.unwrap();
    }
    env.sup.job_cancel(me(), "stopped".into()).await.unwrap();
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let ended = eventually_async(Duration::from_secs(60), || {
        ["fine", "bad"]
            .iter()
            .all(|j| store.job(&t, j).unwrap().unwrap().status.is_finished())
    })
    .await;
    assert!(ended);
    let events = export(&env);
    let jobs: Vec<Value> = events
        .into_iter()
        .filter(|e| e["type"].as_str().unwrap().starts_with("job."))
        .collect();
    schema.check_all(&jobs);
    for kind in [
        "job.created",
        "job.started",
        "job.progress",
        "job.item.started",
        "job.item.completed",
        "job.item.failed",
        "job.completed",
        "job.failed",
        "job.cancelled",
    ] {
        assert!(jobs.iter().any(|e| e["type"] == kind), "{kind} missing");
    }
    let progress = jobs
        .iter()
        .rfind(|e| e["type"] == "job.progress" && e["jobId"] == "fine")
        .expect("progress of job fine");
    let text = progress.to_string();
    assert!(
        text.contains("\"completed\":6") && text.contains("eta_s"),
        "progress carries counts and an ETA: {progress}"
    );
    env.sup.cancel(me(), name("owner")).await.unwrap();
}
