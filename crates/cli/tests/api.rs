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

#[path = "api/agents.rs"]
mod agents;
mod common;
#[path = "api/jobs.rs"]
mod jobs;
#[path = "api/limits.rs"]
mod limits;
#[path = "api/removal.rs"]
mod removal;
#[path = "api/views.rs"]
mod views;

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

/// The tests of this binary run one at a time. Their clients are this very
/// process, and the daemon takes a token over TCP only when every process
/// holding the client's socket is the operator: a child that another test's
/// daemon is starting at that moment (a clone that has not exec'd yet holds
/// a copy of every descriptor of this process) is one of those holders, in
/// an agent's PID namespace, and the token is then rightly refused. A real
/// client is a process of its own and never meets this.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SPAWN: &str = "/api/agents";
const SHOW: &str = "/api/agents/{name}";
const WAIT: &str = "/api/agents/{name}/wait";
const INPUT: &str = "/api/agents/{name}/input";
const RESUME: &str = "/api/agents/{name}/resume";
const CLOSE: &str = "/api/agents/{name}/close";
const CANCEL: &str = "/api/agents/{name}/cancel";
const JOBS: &str = "/api/jobs";
const REPLAY: &str = "/api/jobs/{id}/replay";
const N: Value = Value::Null;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_answers_as_the_openapi_document_says() {
    let _alone = ONE_AT_A_TIME.lock().await;
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

    agents::created_and_refused(&s).await;
    agents::read(&s).await;
    agents::verbs(&s).await;
    jobs::exercised(&s).await;
    views::exercised(&s).await;
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

    // A node that is still starting (its supervisor recovering its agents
    // and rebuilding its ctx tree, issue 28): `/healthz` says so at once,
    // and another request waits for the start, then is served.
    {
        let (started, starting) = brood_server::starting();
        let sock = dir.path().join("starting.sock");
        let l = brood_server::bind_unix(&sock).await.unwrap();
        let server = tokio::spawn(brood_server::serve_unix_from_start(starting, l));
        let to = To::Unix(sock);
        let a = s.on(&to, "GET", "/healthz", "/healthz", &[], b"").await;
        assert_eq!(
            (a.status, code(&a.json())),
            (503, "Unavailable"),
            "{}",
            a.body
        );
        assert_eq!(header(&a, "retry-after"), Some("1"), "{}", a.headers);
        let waits = {
            let to = to.clone();
            tokio::spawn(async move { raw(&to, "GET", "/api/agents/p", &[], b"").await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !waits.is_finished(),
            "a request was answered before the start ended"
        );
        started.set(brood_server::Api::new(s.env.sup.clone(), None));
        let a = waits.await.unwrap();
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.json()["name"], "p");
        server.abort();
    }

    // The work one request may cause (issue 24), on a second daemon with
    // small limits; its answers are checked with the first's.
    let tight_log = limits::exercised(&hang, REPLAY).await;
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
    let _alone = ONE_AT_A_TIME.lock().await;
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
    let _alone = ONE_AT_A_TIME.lock().await;
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
