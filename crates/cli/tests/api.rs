//! The HTTP API (SPEC 11, docs/api.md) against a real supervisor: every route
//! and every error it documents, each answer checked against the OpenAPI
//! document by independent validators (openapi-spec-validator and
//! openapi-core, installed by `.ci/setup`); who may call what on both
//! listeners, an agent among them calling with its own credentials; bodies
//! over the limit and malformed ones; idempotency keys; stalled clients.
//!
//! Requests are written by hand over raw sockets (`common::wire`), not with
//! brood's own client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "api/limits.rs"]
mod limits;
#[path = "api/removal.rs"]
mod removal;

use std::path::{Path, PathBuf};

use common::wire::*;
use common::*;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// The Python of the validators' venv (made by `.ci/setup`).
fn validator_python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-python/bin/python3");
    assert!(
        p.exists(),
        "{} is missing: run `bash .ci/setup` (it installs openapi-core and openapi-spec-validator from PyPI)",
        p.display()
    );
    p
}

/// The validators on a document and the answers recorded against it.
fn validate(python: &Path, spec: &Path, log: &Path) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    std::process::Command::new(python)
        .arg(script("validate.py"))
        .arg(spec)
        .arg(log)
        .output()
        .unwrap()
}

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/openapi")
        .join(name)
        .display()
        .to_string()
}

/// The requests an agent makes with its own credentials: each on something
/// outside its subtree (its parent `p`, its sibling `quick`), each refused.
fn agent_requests() -> Value {
    let r = |method: &str, template: &str, path: &str, body: Value| json!({"method": method, "template": template, "path": path, "body": body});
    json!([
        r(
            "POST",
            "/api/agents",
            "/api/agents",
            json!({"parent": "p", "argv": ["true"]})
        ),
        r("GET", "/api/agents", "/api/agents?parent=p", Value::Null),
        r("GET", "/api/agents", "/api/agents", Value::Null),
        r("GET", "/api/agents/{name}", "/api/agents/p", Value::Null),
        r(
            "GET",
            "/api/agents/{name}/children",
            "/api/agents/p/children",
            Value::Null
        ),
        r(
            "GET",
            "/api/agents/{name}/descendants",
            "/api/agents/p/descendants",
            Value::Null
        ),
        r(
            "GET",
            "/api/agents/{name}/log",
            "/api/agents/p/log",
            Value::Null
        ),
        r(
            "POST",
            "/api/agents/{name}/input",
            "/api/agents/quick/input",
            json!({"text": "hi"})
        ),
        r(
            "POST",
            "/api/agents/{name}/wait",
            "/api/agents/quick/wait",
            json!({})
        ),
        r(
            "POST",
            "/api/agents/{name}/resume",
            "/api/agents/quick/resume",
            json!({})
        ),
        r(
            "POST",
            "/api/agents/{name}/close",
            "/api/agents/quick/close",
            Value::Null
        ),
        r(
            "POST",
            "/api/agents/{name}/cancel",
            "/api/agents/quick/cancel",
            Value::Null
        ),
        r("GET", "/api/tree", "/api/tree?root=p", Value::Null),
        r("GET", "/api/sessions/{id}", "/api/sessions/p", Value::Null),
        r(
            "GET",
            "/api/sessions/{id}/children",
            "/api/sessions/p/children",
            Value::Null
        ),
        r(
            "GET",
            "/api/sessions/{id}/parent",
            "/api/sessions/p/parent",
            Value::Null
        ),
        r(
            "GET",
            "/api/events",
            "/api/events?subtree=p&follow=false",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs",
            "/api/jobs",
            json!({"owner": "p", "instruction": "x", "input": [{"a": 1}]})
        ),
        r("GET", "/api/jobs", "/api/jobs", Value::Null),
        r("GET", "/api/jobs/{id}", "/api/jobs/j1", Value::Null),
        r(
            "GET",
            "/api/jobs/{id}/items",
            "/api/jobs/j1/items",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/start",
            "/api/jobs/j1/start",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/cancel",
            "/api/jobs/j1/cancel",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/items/{item}/assign",
            "/api/jobs/j1/items/a/assign",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/items/{item}/retry",
            "/api/jobs/j1/items/a/retry",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/retry",
            "/api/jobs/j1/retry",
            Value::Null
        ),
        r(
            "POST",
            "/api/jobs/{id}/replay",
            "/api/jobs/j1/replay",
            json!({})
        ),
        r(
            "GET",
            "/api/jobs/{id}/export",
            "/api/jobs/j1/export",
            Value::Null
        ),
        r(
            "GET",
            "/api/jobs/{id}/evidence",
            "/api/jobs/j1/evidence",
            Value::Null
        ),
        r("GET", "/api/ui/tree", "/api/ui/tree", Value::Null),
        r(
            "GET",
            "/api/ui/agents/{name}",
            "/api/ui/agents/p",
            Value::Null
        ),
        r(
            "GET",
            "/api/ui/agents/{name}/transcript",
            "/api/ui/agents/quick/transcript",
            Value::Null
        ),
        r(
            "GET",
            "/api/ui/jobs/{id}/items/{item}/attempts",
            "/api/ui/jobs/j1/items/a/attempts",
            Value::Null
        ),
        r(
            "GET",
            "/api/ui/agents/{name}/artifacts/{sha256}",
            &format!("/api/ui/agents/quick/artifacts/{}", "0".repeat(64)),
            Value::Null
        ),
        // Removing trees is the operator's; an agent's jobs are its subtree's (issue 25).
        r("DELETE", "/api/agents/{name}", "/api/agents/p", Value::Null),
        r(
            "POST",
            "/api/prune",
            "/api/prune",
            json!({"older_than_s": 0})
        ),
        r("DELETE", "/api/jobs/{id}", "/api/jobs/j1", Value::Null),
        // What describes the host or every tree is the operator's (issue 24).
        r("GET", "/metrics", "/metrics", Value::Null),
        r("GET", "/api/nodes", "/api/nodes", Value::Null),
        r("GET", "/api/ui/sequence", "/api/ui/sequence", Value::Null),
    ])
}

/// Requests on the control socket, each answering its status (`Null`: no body).
async fn each(s: &Served, cases: &[(u16, &str, &str, &str, Value)]) -> Vec<Value> {
    let mut out = Vec::new();
    for (status, method, template, path, body) in cases {
        let body = (!body.is_null()).then(|| body.clone());
        out.push(s.expect(*status, method, template, path, body).await);
    }
    out
}

/// A mutation sent twice with one key and two bodies: the first answers
/// `status`, the second 422.
async fn key_reused(
    s: &Served,
    key: &str,
    template: &str,
    path: &str,
    first: &[u8],
    second: &[u8],
    status: u16,
) {
    let k = [("Idempotency-Key", key)];
    let a = s.on(&s.unix, "POST", template, path, &k, first).await;
    assert_eq!(a.status, status, "{path}: {}", a.body);
    let a = s.on(&s.unix, "POST", template, path, &k, second).await;
    assert_eq!(
        (a.status, code(&a.json())),
        (422, "IdempotencyMismatch"),
        "{path}"
    );
}

const SPAWN: &str = "/api/agents";
const SHOW: &str = "/api/agents/{name}";
const WAIT: &str = "/api/agents/{name}/wait";
const INPUT: &str = "/api/agents/{name}/input";
const RESUME: &str = "/api/agents/{name}/resume";
const CLOSE: &str = "/api/agents/{name}/close";
const CANCEL: &str = "/api/agents/{name}/cancel";
const JOBS: &str = "/api/jobs";
const N: Value = Value::Null;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_answers_as_the_openapi_document_says() {
    let python = validator_python();
    // A fanout of 3, so a 4th unfinished child (and a resume that would
    // make one) meets the quota.
    let s = Served::start(|cfg| cfg.quotas.defaults.max_fanout = 3).await;
    let dir = tempfile::tempdir().unwrap();
    let hang = agent(&["--hang"]);
    let said = |w: &str| agent(&["--result", w]);

    let r = each(
        &s,
        &[
            (200, "GET", "/healthz", "/healthz", N),
            (200, "GET", "/metrics", "/metrics", N),
            (200, "GET", "/api/openapi.json", "/api/openapi.json", N),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "p", "argv": hang, "await_ready": true,
            "policy": {"tools": ["create", "send", "wait", "close", "resume"]}}),
            ),
        ],
    )
    .await;
    assert!(r[1].as_str().unwrap().contains("subagent_"), "{}", r[1]);
    let doc = r[2].clone();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        (r[3]["name"].as_str(), r[3]["status"].as_str()),
        (Some("p"), Some("running"))
    );

    // POST /api/agents: each error, named.
    let bad = s
        .on(&s.unix, "POST", SPAWN, SPAWN, &[], b"{\"argv\": [")
        .await;
    assert_eq!((bad.status, code(&bad.json())), (400, "BadRequest"));
    let r = each(
        &s,
        &[
            (400, "POST", SPAWN, SPAWN, json!({"argv": ["sh", 3]})),
            (
                400,
                "POST",
                SPAWN,
                SPAWN,
                json!({"argv": ["sh"], "tsak": "x"}),
            ),
            (
                400,
                "POST",
                SPAWN,
                SPAWN,
                json!({"argv": ["sh"], "name": "no such name!"}),
            ),
            (
                403,
                "POST",
                SPAWN,
                SPAWN,
                json!({"parent": "p", "argv": said("x"), "policy": {"tools": ["shell"]}}),
            ),
            (
                409,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "p", "argv": said("x")}),
            ),
        ],
    )
    .await;
    assert!(
        r[0]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("argv[1]:"),
        "{}",
        r[0]
    );
    assert!(
        r[1]["error"]["message"].as_str().unwrap().contains("tsak"),
        "{}",
        r[1]
    );
    let codes: Vec<&str> = r[2..].iter().map(code).collect();
    assert_eq!(codes, ["InvalidName", "ToolExpansion", "NameTaken"]);
    let a = s.on(&s.tcp(None), "POST", SPAWN, SPAWN, &[], b"{}").await;
    assert_eq!((a.status, code(&a.json())), (401, "Unauthorized"));
    let a = s
        .on(
            &s.unix,
            "POST",
            SPAWN,
            SPAWN,
            &[],
            &vec![b' '; (1 << 20) + 1],
        )
        .await;
    assert_eq!((a.status, code(&a.json())), (413, "TooLarge"));
    // Idempotency: a repeat gets the first answer, marked; another body, 422.
    let first = json!({"name": "quick", "parent": "p", "argv": said("hi")}).to_string();
    let k = [("Idempotency-Key", "k-1")];
    let a = s
        .on(&s.unix, "POST", SPAWN, SPAWN, &k, first.as_bytes())
        .await;
    let again = s
        .on(&s.unix, "POST", SPAWN, SPAWN, &k, first.as_bytes())
        .await;
    assert_eq!(
        (a.status, again.status, &again.body),
        (201, 201, &a.body),
        "the first answer"
    );
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    let other = json!({"name": "other", "parent": "p", "argv": said("x")}).to_string();
    key_reused(
        &s,
        "k-1",
        SPAWN,
        SPAWN,
        first.as_bytes(),
        other.as_bytes(),
        201,
    )
    .await;
    // Fanout: f holds 3 unfinished children; a 4th is refused (429), and so
    // is a resume that would make one.
    let w20 = json!({"timeout_s": 20});
    let r = each(
        &s,
        &[
            (200, "POST", WAIT, "/api/agents/quick/wait", w20.clone()),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f", "argv": hang, "await_ready": true}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f0", "parent": "f", "argv": said("0")}),
            ),
            (200, "POST", WAIT, "/api/agents/f0/wait", w20.clone()),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f1", "parent": "f", "argv": hang}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f2", "parent": "f", "argv": hang}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f3", "parent": "f", "argv": hang}),
            ),
            (
                429,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "f4", "parent": "f", "argv": said("x")}),
            ),
            (429, "POST", RESUME, "/api/agents/f0/resume", N),
        ],
    )
    .await;
    assert_eq!((code(&r[7]), code(&r[8])), ("QuotaFanout", "QuotaFanout"));

    // Reads.
    let r = each(
        &s,
        &[
            (200, "GET", SPAWN, "/api/agents?all=true", N),
            (400, "GET", SPAWN, "/api/agents?all=maybe", N),
            (404, "GET", SPAWN, "/api/agents?parent=ghost", N),
            (200, "GET", SHOW, "/api/agents/p", N),
            (404, "GET", SHOW, "/api/agents/ghost", N),
            (
                200,
                "GET",
                "/api/agents/{name}/children",
                "/api/agents/f/children",
                N,
            ),
            (
                404,
                "GET",
                "/api/agents/{name}/children",
                "/api/agents/ghost/children",
                N,
            ),
            (
                200,
                "GET",
                "/api/agents/{name}/descendants",
                "/api/agents/p/descendants",
                N,
            ),
            (
                404,
                "GET",
                "/api/agents/{name}/descendants",
                "/api/agents/ghost/descendants",
                N,
            ),
            (200, "GET", "/api/tree", "/api/tree?root=f", N),
            (400, "GET", "/api/tree", "/api/tree?rot=f", N),
            (404, "GET", "/api/tree", "/api/tree?root=ghost", N),
            (
                200,
                "GET",
                "/api/agents/{name}/log",
                "/api/agents/f/log?tail=5",
                N,
            ),
            (
                200,
                "GET",
                "/api/agents/{name}/log",
                "/api/agents/f/log?after=0",
                N,
            ),
            (
                400,
                "GET",
                "/api/agents/{name}/log",
                "/api/agents/f/log?tail=5000",
                N,
            ),
            (
                400,
                "GET",
                "/api/agents/{name}/log",
                "/api/agents/f/log?after=-1",
                N,
            ),
            (
                404,
                "GET",
                "/api/agents/{name}/log",
                "/api/agents/ghost/log",
                N,
            ),
        ],
    )
    .await;
    let names = |v: &Value, key: &str, field: &str| -> Vec<String> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a[field].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(names(&r[0], "agents", "name").len() >= 7, "{}", r[0]);
    assert!(
        r[1]["error"]["message"].as_str().unwrap().contains("all"),
        "{}",
        r[1]
    );
    assert_eq!(r[3]["runs"].as_array().unwrap().len(), 1, "{}", r[3]);
    assert_eq!(
        names(&r[5], "agents", "name"),
        ["f0", "f1", "f2", "f3"],
        "start order"
    );
    assert!(names(&r[7], "agents", "name").contains(&"quick".to_owned()));
    assert_eq!(r[9]["trees"][0]["children"].as_array().unwrap().len(), 4);

    // Sessions, as the seed's harness shows them.
    let r = each(
        &s,
        &[
            (200, "GET", "/api/sessions/{id}", "/api/sessions/f1", N),
            (404, "GET", "/api/sessions/{id}", "/api/sessions/ghost", N),
            (
                200,
                "GET",
                "/api/sessions/{id}/children",
                "/api/sessions/f/children",
                N,
            ),
            (
                404,
                "GET",
                "/api/sessions/{id}/children",
                "/api/sessions/ghost/children",
                N,
            ),
            (
                200,
                "GET",
                "/api/sessions/{id}/parent",
                "/api/sessions/f1/parent",
                N,
            ),
            (
                200,
                "GET",
                "/api/sessions/{id}/parent",
                "/api/sessions/f/parent",
                N,
            ),
            (
                404,
                "GET",
                "/api/sessions/{id}/parent",
                "/api/sessions/ghost/parent",
                N,
            ),
            (200, "GET", "/api/sessions/tree", "/api/sessions/tree", N),
        ],
    )
    .await;
    assert_eq!(r[0]["parent_session_id"], "f", "{}", r[0]);
    assert_eq!(names(&r[2], "sessions", "id"), ["f0", "f1", "f2", "f3"]);
    assert_eq!(
        (r[4]["parent"]["id"].as_str(), &r[5]["parent"]),
        (Some("f"), &Value::Null)
    );
    assert!(r[7]["trees"].as_array().unwrap().len() >= 2, "{}", r[7]);

    // Verbs.
    let r = each(
        &s,
        &[
            (
                200,
                "POST",
                INPUT,
                "/api/agents/p/input",
                json!({"text": "hello"}),
            ),
            (400, "POST", INPUT, "/api/agents/p/input", json!({})),
            (
                404,
                "POST",
                INPUT,
                "/api/agents/ghost/input",
                json!({"text": "x"}),
            ),
            (
                409,
                "POST",
                INPUT,
                "/api/agents/quick/input",
                json!({"text": "x"}),
            ),
            (
                200,
                "POST",
                WAIT,
                "/api/agents/p/wait",
                json!({"timeout_s": 0.2}),
            ),
            (
                400,
                "POST",
                WAIT,
                "/api/agents/p/wait",
                json!({"timeout_s": -1}),
            ),
            (404, "POST", WAIT, "/api/agents/ghost/wait", N),
            (
                200,
                "POST",
                RESUME,
                "/api/agents/quick/resume",
                json!({"text": "again"}),
            ),
            (200, "POST", WAIT, "/api/agents/quick/wait", w20),
            (
                400,
                "POST",
                RESUME,
                "/api/agents/quick/resume",
                json!({"text": 5}),
            ),
            (404, "POST", RESUME, "/api/agents/ghost/resume", N),
            (409, "POST", RESUME, "/api/agents/p/resume", N),
        ],
    )
    .await;
    assert!(r[0]["id"].as_str().unwrap().starts_with("in-"), "{}", r[0]);
    assert!(
        r[1]["error"]["message"].as_str().unwrap().contains("text"),
        "{}",
        r[1]
    );
    assert_eq!(r[4]["timed_out"], true, "{}", r[4]);
    assert_eq!(r[8]["agents"][0]["result"], "hi", "{}", r[8]);
    key_reused(
        &s,
        "k-2",
        INPUT,
        "/api/agents/p/input",
        br#"{"text": "one"}"#,
        br#"{"text": "two"}"#,
        200,
    )
    .await;
    key_reused(
        &s,
        "k-3",
        RESUME,
        "/api/agents/p/resume",
        b"",
        br#"{"text": "x"}"#,
        409,
    )
    .await;

    // Jobs: created (whole, or refused naming why) and read.
    let csv = "id,text\na,hello\nb,world\n";
    let jb = |id: &str, owner: &str, instruction: &str| json!({"id": id, "owner": owner, "instruction": instruction, "input": csv, "id_column": "id"});
    let r = each(
        &s,
        &[
            (201, "POST", JOBS, JOBS, jb("j1", "p", "Say {text}")),
            (400, "POST", JOBS, JOBS, jb("j2", "p", "Say {nope}")),
            (
                400,
                "POST",
                JOBS,
                JOBS,
                json!({"owner": "p", "instruction": "x", "input": ""}),
            ),
            (404, "POST", JOBS, JOBS, jb("j3", "ghost", "Say {text}")),
            (409, "POST", JOBS, JOBS, jb("j1", "p", "Say {text}")),
            (200, "GET", JOBS, JOBS, N),
            (200, "GET", "/api/jobs/{id}", "/api/jobs/j1", N),
            (404, "GET", "/api/jobs/{id}", "/api/jobs/nope", N),
            (
                200,
                "GET",
                "/api/jobs/{id}/items",
                "/api/jobs/j1/items?status=pending",
                N,
            ),
            (
                400,
                "GET",
                "/api/jobs/{id}/items",
                "/api/jobs/j1/items?status=weird",
                N,
            ),
            (
                404,
                "GET",
                "/api/jobs/{id}/items",
                "/api/jobs/nope/items",
                N,
            ),
        ],
    )
    .await;
    assert_eq!(
        (r[0]["status"].as_str(), r[0]["total"].as_u64()),
        (Some("pending"), Some(2))
    );
    assert!(
        r[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"nope\""),
        "{}",
        r[1]
    );
    assert!(
        r[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no rows"),
        "{}",
        r[2]
    );
    assert_eq!(r[6]["counts"]["pending"], 2);
    let ids: Vec<&str> = r[8]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    // Started (its workers are test agents reporting at once) and cancelled.
    let workers = json!({"argv": [exe(), "test-agent", "--job-worker"]});
    let mut j6 = jb("j6", "p", "Say {text}");
    j6["worker"] = workers;
    j6["concurrency"] = json!(1);
    let r = each(
        &s,
        &[
            (201, "POST", JOBS, JOBS, j6),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j6/start", N),
            (409, "POST", "/api/jobs/{id}/start", "/api/jobs/j6/start", N),
            (
                404,
                "POST",
                "/api/jobs/{id}/start",
                "/api/jobs/nope/start",
                N,
            ),
            (
                200,
                "POST",
                "/api/jobs/{id}/cancel",
                "/api/jobs/j1/cancel",
                N,
            ),
            (
                409,
                "POST",
                "/api/jobs/{id}/cancel",
                "/api/jobs/j1/cancel",
                N,
            ),
            (
                404,
                "POST",
                "/api/jobs/{id}/cancel",
                "/api/jobs/nope/cancel",
                N,
            ),
        ],
    )
    .await;
    assert_eq!(r[1]["status"], "running", "{}", r[1]);
    assert_eq!(r[4]["status"], "cancelled", "{}", r[4]);
    let done = eventually_async(std::time::Duration::from_secs(30), || {
        s.env
            .sup
            .store()
            .job(s.env.sup.tenant(), "j6")
            .unwrap()
            .unwrap()
            .status
            == brood_core::JobStatus::Completed
    })
    .await;
    assert!(done, "j6 ran to completion");
    let items = s
        .expect(
            200,
            "GET",
            "/api/jobs/{id}/items",
            "/api/jobs/j6/items",
            None,
        )
        .await;
    assert_eq!(
        items["items"][0]["result"],
        json!({"echo": "Say hello"}),
        "{items}"
    );
    let (j4, j5) = (
        jb("j4", "p", "Say {text}").to_string(),
        jb("j5", "p", "Say {text}").to_string(),
    );
    key_reused(&s, "k-6", JOBS, JOBS, j4.as_bytes(), j5.as_bytes(), 201).await;
    key_reused(
        &s,
        "k-7",
        "/api/jobs/{id}/start",
        "/api/jobs/j4/start",
        b"",
        b"{ }",
        200,
    )
    .await;
    key_reused(
        &s,
        "k-8",
        "/api/jobs/{id}/cancel",
        "/api/jobs/j4/cancel",
        b"",
        b"{ }",
        200,
    )
    .await;

    // Export, evidence and replay of the completed j6.
    let ex = "/api/jobs/{id}/export";
    let ev = "/api/jobs/{id}/evidence";
    let rp = "/api/jobs/{id}/replay";
    let r = each(
        &s,
        &[
            (200, "GET", "/api/nodes", "/api/nodes", N),
            (200, "GET", ex, "/api/jobs/j6/export?format=csv", N),
            (200, "GET", ex, "/api/jobs/j6/export?format=jsonl", N),
            (400, "GET", ex, "/api/jobs/j6/export?format=xml", N),
            (404, "GET", ex, "/api/jobs/nope/export", N),
            (200, "GET", ev, "/api/jobs/j6/evidence", N),
            (404, "GET", ev, "/api/jobs/nope/evidence", N),
            (201, "POST", rp, "/api/jobs/j6/replay", json!({"id": "j6r"})),
            (409, "POST", rp, "/api/jobs/j6/replay", json!({"id": "j6r"})),
            (
                409,
                "POST",
                rp,
                "/api/jobs/j6/replay",
                json!({"failed_only": true}),
            ),
            (
                400,
                "POST",
                rp,
                "/api/jobs/j6/replay",
                json!({"id": "-bad"}),
            ),
            (404, "POST", rp, "/api/jobs/nope/replay", N),
        ],
    )
    .await;
    let csv_text = r[1].as_str().unwrap();
    assert!(
        csv_text.starts_with("id,text,job_id,item_id,row_index,status,attempt_count,last_error,result_json,completed_at\n"),
        "{csv_text}"
    );
    assert!(
        r[5]["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "manifest.json"),
        "{}",
        r[5]
    );
    assert_eq!(
        (r[7]["source"].as_str(), r[7]["total"].as_u64()),
        (Some("j6"), Some(2)),
        "{}",
        r[6]
    );
    // Retry: a job whose every item fails, retried whole and item by item.
    let mut j7 = jb("j7", "p", "FAIL-ALWAYS {text}");
    j7["worker"] = json!({"argv": [exe(), "test-agent", "--job-worker"]});
    j7["max_attempts"] = json!(1);
    let failed = |id: &'static str| {
        let s = &s;
        async move {
            eventually_async(std::time::Duration::from_secs(30), || {
                s.env
                    .sup
                    .store()
                    .job(s.env.sup.tenant(), id)
                    .unwrap()
                    .unwrap()
                    .status
                    == brood_core::JobStatus::Failed
            })
            .await
        }
    };
    each(
        &s,
        &[
            (201, "POST", JOBS, JOBS, j7),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j7/start", N),
        ],
    )
    .await;
    assert!(failed("j7").await, "j7 fails");
    let rt = "/api/jobs/{id}/items/{item}/retry";
    let r = each(
        &s,
        &[
            (409, "POST", rt, "/api/jobs/j6/items/a/retry", N),
            (404, "POST", rt, "/api/jobs/j7/items/zz/retry", N),
            (200, "POST", "/api/jobs/{id}/retry", "/api/jobs/j7/retry", N),
        ],
    )
    .await;
    assert_eq!(r[2]["retried"], json!(["a", "b"]), "{}", r[2]);
    assert!(failed("j7").await, "j7 fails again");
    let r = each(
        &s,
        &[
            (200, "POST", rt, "/api/jobs/j7/items/b/retry", N),
            (
                404,
                "POST",
                "/api/jobs/{id}/retry",
                "/api/jobs/nope/retry",
                N,
            ),
        ],
    )
    .await;
    assert_eq!(r[0]["retried"], json!(["b"]), "{}", r[0]);
    assert!(failed("j7").await, "j7 fails a third time");
    let attempts = s
        .env
        .sup
        .store()
        .attempts(s.env.sup.tenant(), "j7", "b")
        .unwrap();
    assert_eq!(
        attempts.len(),
        3,
        "a retry adds an attempt, never overwrites: {attempts:?}"
    );
    // Assign: workers that never report hold their items; one pending item
    // is given a worker of its own at once.
    let mut j8 = jb("j8", "p", "Say {text}");
    j8["worker"] = json!({"argv": [exe(), "test-agent", "--hang"]});
    j8["concurrency"] = json!(1);
    each(
        &s,
        &[
            (201, "POST", JOBS, JOBS, j8),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j8/start", N),
        ],
    )
    .await;
    let asg = "/api/jobs/{id}/items/{item}/assign";
    let rep = "/api/jobs/{id}/items/{item}/report";
    let r = each(
        &s,
        &[
            (409, "POST", asg, "/api/jobs/j8/items/a/assign", N),
            (200, "POST", asg, "/api/jobs/j8/items/b/assign", N),
            (409, "POST", asg, "/api/jobs/j6/items/a/assign", N),
            (
                409,
                "POST",
                asg,
                "/api/jobs/j8/items/b/assign",
                json!({"worker": "ghost"}),
            ),
            (
                400,
                "POST",
                asg,
                "/api/jobs/j8/items/b/assign",
                json!({"worker": "not a name!"}),
            ),
            (404, "POST", asg, "/api/jobs/nope/items/b/assign", N),
            (
                403,
                "POST",
                rep,
                "/api/jobs/j8/items/a/report",
                json!({"result": {"x": 1}}),
            ),
            (
                400,
                "POST",
                rep,
                "/api/jobs/j8/items/a/report",
                json!({"stop": true}),
            ),
            (
                200,
                "POST",
                "/api/jobs/{id}/cancel",
                "/api/jobs/j8/cancel",
                N,
            ),
        ],
    )
    .await;
    assert_eq!(r[1]["assigned"], "j8-w2", "{}", r[1]);
    assert_eq!(r[1]["assignment"]["attempt"], 1, "{}", r[1]);
    // An agent under the owner given an item by `assign` reports it: the
    // one report accepted, a second refused (its attempt ended).
    let now = dir.path().join("now");
    let reqs2 = dir.path().join("reqs2.json");
    let out2 = dir.path().join("out2.json");
    let report = |result: Value| json!({"method": "POST", "template": rep, "path": "/api/jobs/j9/items/b/report", "body": {"result": result}, "wait_for": now});
    std::fs::write(
        &reqs2,
        json!([report(json!({"ok": 1})), report(json!({"ok": 2}))]).to_string(),
    )
    .unwrap();
    let argv2 = json!(["/usr/bin/python3", script("as_agent.py"), reqs2, out2]);
    let mut j9 = jb("j9", "p", "Say {text}");
    j9["worker"] = json!({"argv": [exe(), "test-agent", "--hang"]});
    j9["concurrency"] = json!(1);
    each(
        &s,
        &[
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "py2", "parent": "p", "protocol": "exec", "argv": argv2}),
            ),
            (201, "POST", JOBS, JOBS, j9),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j9/start", N),
            (
                200,
                "POST",
                asg,
                "/api/jobs/j9/items/b/assign",
                json!({"worker": "py2"}),
            ),
            (
                409,
                "POST",
                asg,
                "/api/jobs/j9/items/a/assign",
                json!({"worker": "py2"}),
            ),
            (
                403,
                "POST",
                asg,
                "/api/jobs/j9/items/a/assign",
                json!({"worker": "p"}),
            ),
            (409, "POST", "/api/jobs/{id}/retry", "/api/jobs/j6/retry", N),
        ],
    )
    .await;
    std::fs::write(&now, "").unwrap();
    let w = each(
        &s,
        &[(
            200,
            "POST",
            WAIT,
            "/api/agents/py2/wait",
            json!({"timeout_s": 60}),
        )],
    )
    .await;
    assert_eq!(w[0]["agents"][0]["status"], "completed", "{}", w[0]);
    let theirs: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out2).unwrap()).unwrap();
    let statuses: Vec<u64> = theirs
        .iter()
        .map(|x| x["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 409], "{theirs:?}");
    s.log.lock().unwrap().extend(theirs);
    let b = &s
        .expect(
            200,
            "GET",
            "/api/jobs/{id}/items",
            "/api/jobs/j9/items?status=completed",
            None,
        )
        .await["items"][0];
    assert_eq!(
        (b["id"].as_str(), &b["result"]),
        (Some("b"), &json!({"ok": 1})),
        "{b}"
    );
    for (key, template, path, first, second, status) in [
        (
            "k-9",
            asg,
            "/api/jobs/j9/items/a/assign",
            r#"{"worker": "p"}"#,
            r#"{"worker": "py2"}"#,
            403,
        ),
        (
            "k-10",
            rep,
            "/api/jobs/j9/items/a/report",
            r#"{"result": 1}"#,
            r#"{"result": 2}"#,
            403,
        ),
        (
            "k-11",
            "/api/jobs/{id}/items/{item}/retry",
            "/api/jobs/j9/items/a/retry",
            "{}",
            "{ }",
            409,
        ),
        (
            "k-12",
            "/api/jobs/{id}/retry",
            "/api/jobs/j9/retry",
            "{}",
            "{ }",
            200,
        ),
        (
            "k-13",
            "/api/jobs/{id}/replay",
            "/api/jobs/j9/replay",
            r#"{"id": "j9r"}"#,
            r#"{"id": "j9s"}"#,
            201,
        ),
    ] {
        key_reused(
            &s,
            key,
            template,
            path,
            first.as_bytes(),
            second.as_bytes(),
            status,
        )
        .await;
    }
    each(
        &s,
        &[(
            200,
            "POST",
            "/api/jobs/{id}/cancel",
            "/api/jobs/j9/cancel",
            N,
        )],
    )
    .await;
    let items = s
        .expect(
            200,
            "GET",
            "/api/jobs/{id}/items",
            "/api/jobs/j8/items",
            None,
        )
        .await;
    assert_eq!(items["items"][0]["attempts"], 1, "{items}");
    assert_eq!(items["items"][1]["worker"], "j8-w2", "{items}");

    // An agent, with its own credentials, refused outside its subtree.
    let reqs = dir.path().join("reqs.json");
    let out = dir.path().join("out.json");
    std::fs::write(&reqs, agent_requests().to_string()).unwrap();
    let argv = json!(["/usr/bin/python3", script("as_agent.py"), reqs, out]);
    each(
        &s,
        &[(
            201,
            "POST",
            SPAWN,
            SPAWN,
            json!({"name": "py", "parent": "p", "protocol": "exec", "argv": argv}),
        )],
    )
    .await;
    let w = each(
        &s,
        &[(
            200,
            "POST",
            WAIT,
            "/api/agents/py/wait",
            json!({"timeout_s": 60}),
        )],
    )
    .await;
    assert_eq!(w[0]["agents"][0]["status"], "completed", "{}", w[0]);
    let theirs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(theirs.len(), agent_requests().as_array().unwrap().len());
    for x in &theirs {
        // Listing its own children (none) is the one thing it may do here.
        let own = x["method"] == "GET"
            && x["query"] == json!({})
            && (x["path"] == SPAWN || x["path"] == JOBS || x["path"] == "/api/ui/tree");
        assert_eq!(
            x["status"],
            if own { 200 } else { 403 },
            "as the agent: {x}"
        );
    }
    // The UI's tree, read by an agent, is its own subtree only.
    let tree = theirs.iter().find(|x| x["path"] == "/api/ui/tree").unwrap();
    let rows: Value = serde_json::from_str(tree["body"].as_str().unwrap()).unwrap();
    let names: Vec<&str> = rows["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, ["py"], "{rows}");
    s.log.lock().unwrap().extend(theirs);

    let r = each(
        &s,
        &[
            (200, "POST", CLOSE, "/api/agents/quick/close", N),
            (404, "POST", CLOSE, "/api/agents/ghost/close", N),
            (409, "POST", CLOSE, "/api/agents/p/close", N),
            (200, "POST", CANCEL, "/api/agents/f/cancel", N),
            (404, "POST", CANCEL, "/api/agents/ghost/cancel", N),
        ],
    )
    .await;
    assert_eq!(r[0]["status"], "closed", "{}", r[0]);
    key_reused(&s, "k-4", CLOSE, "/api/agents/f0/close", b"", b"{ }", 200).await;
    key_reused(&s, "k-5", CANCEL, "/api/agents/p/cancel", b"", b"{}", 200).await;

    // Events, not following: every event once, in order.
    let e = s
        .call("GET", "/api/events", "/api/events?follow=false", None)
        .await;
    assert_eq!(e.status, 200);
    assert!(
        header(&e, "content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let seqs: Vec<i64> = e
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["sequence"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    each(
        &s,
        &[
            (
                400,
                "GET",
                "/api/events",
                "/api/events?format=xml&follow=false",
                N,
            ),
            (
                404,
                "GET",
                "/api/events",
                "/api/events?subtree=ghost&follow=false",
                N,
            ),
        ],
    )
    .await;

    // The web UI's reads (docs/ui.md): the compact tree, an agent's objects
    // and transcript.
    let r = each(
        &s,
        &[
            (200, "GET", "/api/ui/tree", "/api/ui/tree", N),
            (200, "GET", "/api/ui/sequence", "/api/ui/sequence", N),
            (200, "GET", "/api/ui/tree", "/api/ui/tree?live=true", N),
            (400, "GET", "/api/ui/tree", "/api/ui/tree?live=maybe", N),
            (
                200,
                "GET",
                "/api/ui/agents/{name}",
                "/api/ui/agents/quick",
                N,
            ),
            (
                404,
                "GET",
                "/api/ui/agents/{name}",
                "/api/ui/agents/ghost",
                N,
            ),
            (
                200,
                "GET",
                "/api/ui/agents/{name}/transcript",
                "/api/ui/agents/p/transcript?after=0",
                N,
            ),
            (
                400,
                "GET",
                "/api/ui/agents/{name}/transcript",
                "/api/ui/agents/p/transcript?after=x",
                N,
            ),
            (
                404,
                "GET",
                "/api/ui/agents/{name}/transcript",
                "/api/ui/agents/ghost/transcript",
                N,
            ),
            (
                200,
                "GET",
                "/api/ui/jobs/{id}/items/{item}/attempts",
                "/api/ui/jobs/j7/items/a/attempts",
                N,
            ),
            (
                404,
                "GET",
                "/api/ui/jobs/{id}/items/{item}/attempts",
                "/api/ui/jobs/ghost/items/a/attempts",
                N,
            ),
        ],
    )
    .await;
    assert!(
        !r[9]["attempts"].as_array().unwrap().is_empty(),
        "j7's item a failed at least once: {}",
        r[9]
    );
    let rows = r[0]["agents"].as_array().unwrap();
    assert!(rows.iter().any(|a| a["name"] == "p"), "{}", r[0]);
    // The UI's logout: without a UI session it ends nothing, and answers the same.
    each(&s, &[(204, "POST", "/api/ui/logout", "/api/ui/logout", N)]).await;
    // `live=true`: exactly the trees that still hold an unfinished agent.
    let trees = |rows: &[Value]| -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = Vec::new();
        for a in rows {
            let unfinished = !["completed", "failed", "cancelled", "closed"]
                .contains(&a["status"].as_str().unwrap());
            if a["parent"].is_null() {
                out.push((a["name"].as_str().unwrap().to_owned(), unfinished));
            } else if let Some(t) = out.last_mut() {
                t.1 |= unfinished;
            }
        }
        out
    };
    let at_work: Vec<(String, bool)> = trees(rows).into_iter().filter(|t| t.1).collect();
    assert_eq!(
        trees(r[2]["agents"].as_array().unwrap()),
        at_work,
        "{}",
        r[2]
    );
    assert!(
        r[1]["sequence"].as_i64().unwrap() >= r[0]["sequence"].as_i64().unwrap(),
        "{} {}",
        r[0],
        r[1]
    );
    assert!(
        r[4]["channel"]["handoff"].is_string(),
        "a child's channel: {}",
        r[4]
    );

    // An artifact a child handed back, downloaded: only by the hash its
    // channel lists.
    const ARTIFACT: &str = "/api/ui/agents/{name}/artifacts/{sha256}";
    let art = agent(&[
        "--artifact",
        "notes/a report.md=hello, artifact",
        "--result",
        "done",
    ]);
    let r = each(
        &s,
        &[
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "ar", "argv": hang, "await_ready": true}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "ar1", "parent": "ar", "argv": art}),
            ),
            (
                200,
                "POST",
                WAIT,
                "/api/agents/ar1/wait",
                json!({"timeout_s": 60}),
            ),
            (200, "GET", "/api/ui/agents/{name}", "/api/ui/agents/ar1", N),
        ],
    )
    .await;
    assert_eq!(r[2]["agents"][0]["status"], "completed", "{}", r[2]);
    let listed = &r[3]["channel"]["artifacts"][0];
    assert_eq!(listed["name"], "notes/a report.md", "{}", r[3]);
    let sha = listed["sha256"].as_str().unwrap();
    let a = s
        .call(
            "GET",
            ARTIFACT,
            &format!("/api/ui/agents/ar1/artifacts/{sha}"),
            None,
        )
        .await;
    assert_eq!((a.status, a.body.as_str()), (200, "hello, artifact"));
    assert!(
        a.headers
            .contains("content-disposition: attachment; filename=\"a_report.md\""),
        "{}",
        a.headers
    );
    each(
        &s,
        &[
            (
                404,
                "GET",
                ARTIFACT,
                &format!("/api/ui/agents/ar1/artifacts/{}", "0".repeat(64)),
                N,
            ),
            (
                404,
                "GET",
                ARTIFACT,
                &format!("/api/ui/agents/ar/artifacts/{sha}"),
                N,
            ),
            (200, "POST", CANCEL, "/api/agents/ar/cancel", N),
        ],
    )
    .await;

    removal::exercised(&s, &hang, &said("gone")).await;

    // Not routes at all.
    let a = raw(&s.unix, "GET", "/api/nothing", &[], b"").await;
    assert_eq!((a.status, code(&a.json())), (404, "NotFound"));
    let a = raw(&s.unix, "DELETE", SPAWN, &[], b"").await;
    assert_eq!(a.status, 405);
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("DELETE")
    );

    // The work one request may cause (issue 24), on a second daemon with
    // small limits; its answers are checked with the first's.
    let tight_log = limits::exercised(&hang, rp).await;
    s.log.lock().unwrap().extend(tight_log);

    // The independent validators: the document, and every answer against it.
    let spec = dir.path().join("openapi.json");
    let log = dir.path().join("exchanges.json");
    std::fs::write(&spec, doc.to_string()).unwrap();
    std::fs::write(
        &log,
        Value::Array(s.log.lock().unwrap().clone()).to_string(),
    )
    .unwrap();
    let o = validate(&python, &spec, &log);
    assert!(
        o.status.success(),
        "the validators found problems:\n{}",
        text(&o)
    );
    // And they do find problems: an answer the document does not allow.
    let mut forged = s.log.lock().unwrap().clone();
    forged.push(
        json!({"method": "GET", "path": "/api/agents/p", "query": {}, "template": SHOW,
        "status": 200, "content_type": "application/json", "body": "{\"name\": 5}"}),
    );
    std::fs::write(&log, Value::Array(forged).to_string()).unwrap();
    let o = validate(&python, &spec, &log);
    assert!(
        !o.status.success() && text(&o).contains("/api/agents/p -> 200"),
        "{}",
        text(&o)
    );
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tcp_listener_takes_the_token_and_only_on_loopback() {
    let s = Served::start(|_| {}).await;
    let right = s.tcp(Some(&s.token));
    let a = raw(&right, "GET", "/api/agents", &[], b"").await;
    assert_eq!(a.status, 200, "{}", a.body);
    let wrong = "0".repeat(s.token.len());
    for to in [s.tcp(None), s.tcp(Some(&wrong)), s.tcp(Some("short"))] {
        let a = raw(&to, "GET", "/api/agents", &[], b"").await;
        assert_eq!((a.status, code(&a.json())), (401, "Unauthorized"));
        assert!(
            a.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("token")
        );
        let a = raw(&to, "POST", "/api/agents", &[], br#"{"argv": ["true"]}"#).await;
        assert_eq!(a.status, 401, "nothing is created without the token");
    }
    assert!(s.env.sup.view().list(None, true).unwrap().agents.is_empty());
    // Liveness needs no token.
    assert_eq!(
        raw(&s.tcp(None), "GET", "/healthz", &[], b"").await.status,
        200
    );

    // The token file: 256 bits in hex, mode 0600, the same at the next start.
    use std::os::unix::fs::PermissionsExt;
    let path = brood_server::Token::path(s.env.root());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(s.token.len(), 64);
    let again = brood_server::Token::load_or_create(s.env.root()).unwrap();
    assert_eq!(again.as_str(), s.token);
    // A token others can read is refused, not used.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = brood_server::Token::load_or_create(s.env.root())
        .err()
        .unwrap();
    assert!(e.to_string().contains("chmod 600"), "{e}");

    // Only loopback addresses are served.
    for addr in ["0.0.0.0:0", "192.0.2.1:8420", "[::]:0"] {
        let e = brood_server::bind_tcp(addr).await.err().unwrap();
        assert!(e.to_string().contains("loopback"), "{addr}: {e}");
    }
    let e = brood_server::bind_tcp("localhost").await.err().unwrap();
    assert!(e.to_string().contains("127.0.0.1:8420"), "{e}");
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_holds_only_its_own_connection() {
    let s = Served::start(|_| {}).await;
    let To::Unix(sock) = &s.unix else {
        unreachable!()
    };
    // Clients that stop mid-head and mid-body, and one that never reads.
    let mut stalled = Vec::new();
    for partial in [
        &b"GET /api/agents HTTP/1.1\r\nHost: x\r\n"[..],
        &b"POST /api/agents HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"argv\""[..],
        &b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n"[..],
    ] {
        let mut c = tokio::net::UnixStream::connect(sock).await.unwrap();
        c.write_all(partial).await.unwrap();
        stalled.push(c);
    }
    // Everyone else is served meanwhile: an agent created, waited for, read.
    let a = raw(
        &s.unix,
        "POST",
        "/api/agents",
        &[],
        json!({"name": "a", "argv": agent(&["--result", "fine"])})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let w = raw(
        &s.unix,
        "POST",
        "/api/agents/a/wait",
        &[],
        br#"{"timeout_s": 20}"#,
    )
    .await;
    assert_eq!(w.json()["agents"][0]["result"], "fine", "{}", w.body);
    let show = raw(&s.unix, "GET", "/api/agents/a", &[], b"").await;
    assert_eq!(show.status, 200);
    drop(stalled);
    s.env.sup.shutdown().await;
}
