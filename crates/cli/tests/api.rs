//! The HTTP API (SPEC 11, docs/api.md) against a real supervisor: every route
//! and every error it documents, each answer checked against the OpenAPI
//! document by independent validators (openapi-spec-validator and
//! openapi-core, installed by `.ci/setup`); who may call what on both
//! listeners, an agent among them calling with its own credentials; bodies
//! over the limit and malformed ones; idempotency keys.
//!
//! Requests are written by hand over raw sockets, not with brood's own client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where a request goes.
#[derive(Clone)]
enum To {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr, Option<String>),
}

/// One request and its answer, as the validator reads them.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A raw HTTP/1.1 request, the connection closed after it.
async fn raw(to: &To, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let To::Tcp(_, Some(t)) = to {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    // A server may answer (413) and close before the whole body is written:
    // a failed write is not the test's failure, the answer read after it is.
    let mut out = Vec::new();
    match to {
        To::Unix(p) => {
            let mut s = tokio::net::UnixStream::connect(p).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.read_to_end(&mut out).await;
        }
        To::Tcp(a, _) => {
            let mut s = tokio::net::TcpStream::connect(a).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.read_to_end(&mut out).await;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

/// A chunked body's content.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// The API of a fresh supervisor on both listeners, recording every answer.
struct Served {
    env: Env,
    unix: To,
    tcp: std::net::SocketAddr,
    token: String,
    log: Mutex<Vec<Value>>,
    _servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Served {
    async fn start(f: impl FnOnce(&mut brood_runtime::Config)) -> Served {
        let env = start_with(Duration::from_millis(500), f);
        let sock = env.root().join("brood.sock");
        let token = brood_server::Token::load_or_create(env.root()).unwrap();
        let api = brood_server::Api::new(env.sup.clone(), Some(token.clone()));
        let unix = brood_server::bind_unix(&sock).await.unwrap();
        let tcp = brood_server::bind_tcp("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let servers = vec![
            tokio::spawn(brood_server::serve_unix(api.clone(), unix)),
            tokio::spawn(brood_server::serve_tcp(api, tcp)),
        ];
        Served {
            env,
            unix: To::Unix(sock),
            tcp: addr,
            token: token.as_str().to_owned(),
            log: Mutex::new(Vec::new()),
            _servers: servers,
        }
    }

    fn tcp(&self, token: Option<&str>) -> To {
        To::Tcp(self.tcp, token.map(str::to_owned))
    }

    /// A request on `to`, recorded under the route's `template`.
    async fn on(
        &self,
        to: &To,
        method: &str,
        template: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Answer {
        let a = raw(to, method, path, headers, body).await;
        let (p, q) = path.split_once('?').unwrap_or((path, ""));
        let query: BTreeMap<&str, &str> = q
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .collect();
        self.log.lock().unwrap().push(json!({
            "method": method, "path": p, "query": query, "template": template,
            "status": a.status,
            "content_type": header(&a, "content-type").unwrap_or(""),
            "body": a.body,
        }));
        a
    }

    /// A JSON request on the control socket.
    async fn call(&self, method: &str, template: &str, path: &str, body: Option<Value>) -> Answer {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.on(&self.unix, method, template, path, &[], body.as_bytes())
            .await
    }

    /// A JSON request that must answer `status`: its body.
    async fn expect(
        &self,
        status: u16,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let a = self.call(method, template, path, body).await;
        assert_eq!(a.status, status, "{method} {path}: {}", a.body);
        if a.body.is_empty() {
            Value::Null
        } else if header(&a, "content-type").is_some_and(|c| c.contains("json")) {
            a.json()
        } else {
            Value::String(a.body)
        }
    }
}

/// An error answer's code, checked to have SPEC 11's shape.
fn code(v: &Value) -> &str {
    let e = &v["error"];
    assert!(
        e["code"].is_string() && e["reason"].is_string() && e["message"].is_string(),
        "not an error body: {v}"
    );
    e["code"].as_str().unwrap()
}

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
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_answers_as_the_openapi_document_says() {
    let python = validator_python();
    // A fanout of 3, so a 4th unfinished child (and a resume that would
    // make one) meets the quota.
    let s = Served::start(|cfg| cfg.quotas.defaults.max_fanout = 3).await;
    let dir = tempfile::tempdir().unwrap();

    // The service routes.
    s.expect(200, "GET", "/healthz", "/healthz", None).await;
    let m = s.expect(200, "GET", "/metrics", "/metrics", None).await;
    assert!(m.as_str().unwrap().contains("subagent_"), "{m}");
    let doc = s
        .expect(200, "GET", "/api/openapi.json", "/api/openapi.json", None)
        .await;
    assert_eq!(doc["openapi"], "3.1.0");

    // POST /api/agents: success and each error.
    let p = s
        .expect(
            201,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(
                json!({"name": "p", "argv": agent(&["--hang"]), "await_ready": true,
                        "policy": {"tools": ["create", "send", "wait", "close", "resume"]}}),
            ),
        )
        .await;
    assert_eq!(
        (p["name"].as_str(), p["status"].as_str()),
        (Some("p"), Some("running"))
    );
    let bad = s
        .on(
            &s.unix,
            "POST",
            "/api/agents",
            "/api/agents",
            &[],
            b"{\"argv\": [",
        )
        .await;
    assert_eq!((bad.status, code(&bad.json())), (400, "BadRequest"));
    let bad = s
        .expect(
            400,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"argv": ["sh", 3]})),
        )
        .await;
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("argv[1]:"),
        "{bad}"
    );
    let bad = s
        .expect(
            400,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"argv": ["sh"], "tsak": "x"})),
        )
        .await;
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("tsak"),
        "{bad}"
    );
    let bad = s
        .expect(
            400,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"argv": ["sh"], "name": "no such name!"})),
        )
        .await;
    assert_eq!(code(&bad), "InvalidName");
    let no_token = s
        .on(
            &s.tcp(None),
            "POST",
            "/api/agents",
            "/api/agents",
            &[],
            b"{}",
        )
        .await;
    assert_eq!(
        (no_token.status, code(&no_token.json())),
        (401, "Unauthorized")
    );
    let refused = s
        .expect(
            403,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"parent": "p", "argv": agent(&[]), "policy": {"tools": ["shell"]}})),
        )
        .await;
    assert_eq!(code(&refused), "ToolExpansion");
    let taken = s
        .expect(
            409,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"name": "p", "argv": agent(&[])})),
        )
        .await;
    assert_eq!(code(&taken), "NameTaken");
    let huge = vec![b' '; (1 << 20) + 1];
    let a = s
        .on(&s.unix, "POST", "/api/agents", "/api/agents", &[], &huge)
        .await;
    assert_eq!((a.status, code(&a.json())), (413, "TooLarge"));
    let key = [("Idempotency-Key", "k-1")];
    let first =
        json!({"name": "quick", "parent": "p", "argv": agent(&["--result", "hi"])}).to_string();
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents",
            "/api/agents",
            &key,
            first.as_bytes(),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let again = s
        .on(
            &s.unix,
            "POST",
            "/api/agents",
            "/api/agents",
            &key,
            first.as_bytes(),
        )
        .await;
    assert_eq!(
        (again.status, &again.body),
        (201, &a.body),
        "a repeat gets the first answer"
    );
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    let other = json!({"name": "other", "parent": "p", "argv": agent(&[])}).to_string();
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents",
            "/api/agents",
            &key,
            other.as_bytes(),
        )
        .await;
    assert_eq!((a.status, code(&a.json())), (422, "IdempotencyMismatch"));
    s.expect(
        200,
        "POST",
        "/api/agents/{name}/wait",
        "/api/agents/quick/wait",
        Some(json!({"timeout_s": 20})),
    )
    .await;
    // Fanout: f holds 3 unfinished children; a 4th is refused, and so is
    // resuming a finished one.
    s.expect(
        201,
        "POST",
        "/api/agents",
        "/api/agents",
        Some(json!({"name": "f", "argv": agent(&["--hang"]), "await_ready": true})),
    )
    .await;
    s.expect(
        201,
        "POST",
        "/api/agents",
        "/api/agents",
        Some(json!({"name": "f0", "parent": "f", "argv": agent(&["--result", "0"])})),
    )
    .await;
    s.expect(
        200,
        "POST",
        "/api/agents/{name}/wait",
        "/api/agents/f0/wait",
        Some(json!({"timeout_s": 20})),
    )
    .await;
    for i in 1..=3 {
        s.expect(
            201,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"name": format!("f{i}"), "parent": "f", "argv": agent(&["--hang"])})),
        )
        .await;
    }
    let quota = s
        .expect(
            429,
            "POST",
            "/api/agents",
            "/api/agents",
            Some(json!({"name": "f4", "parent": "f", "argv": agent(&[])})),
        )
        .await;
    assert_eq!(code(&quota), "QuotaFanout");
    let quota = s
        .expect(
            429,
            "POST",
            "/api/agents/{name}/resume",
            "/api/agents/f0/resume",
            None,
        )
        .await;
    assert_eq!(code(&quota), "QuotaFanout");

    // Reads.
    let l = s
        .expect(200, "GET", "/api/agents", "/api/agents?all=true", None)
        .await;
    assert!(l["agents"].as_array().unwrap().len() >= 7, "{l}");
    let bad = s
        .expect(400, "GET", "/api/agents", "/api/agents?all=maybe", None)
        .await;
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("all"),
        "{bad}"
    );
    s.expect(404, "GET", "/api/agents", "/api/agents?parent=ghost", None)
        .await;
    let d = s
        .expect(200, "GET", "/api/agents/{name}", "/api/agents/p", None)
        .await;
    assert_eq!(d["runs"].as_array().unwrap().len(), 1, "{d}");
    s.expect(404, "GET", "/api/agents/{name}", "/api/agents/ghost", None)
        .await;
    let c = s
        .expect(
            200,
            "GET",
            "/api/agents/{name}/children",
            "/api/agents/f/children",
            None,
        )
        .await;
    let names: Vec<&str> = c["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f0", "f1", "f2", "f3"], "children in start order");
    s.expect(
        404,
        "GET",
        "/api/agents/{name}/children",
        "/api/agents/ghost/children",
        None,
    )
    .await;
    let d = s
        .expect(
            200,
            "GET",
            "/api/agents/{name}/descendants",
            "/api/agents/p/descendants",
            None,
        )
        .await;
    assert!(
        d["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "quick"),
        "{d}"
    );
    s.expect(
        404,
        "GET",
        "/api/agents/{name}/descendants",
        "/api/agents/ghost/descendants",
        None,
    )
    .await;
    let t = s
        .expect(200, "GET", "/api/tree", "/api/tree?root=f", None)
        .await;
    assert_eq!(
        t["trees"][0]["children"].as_array().unwrap().len(),
        4,
        "{t}"
    );
    s.expect(400, "GET", "/api/tree", "/api/tree?rot=f", None)
        .await;
    s.expect(404, "GET", "/api/tree", "/api/tree?root=ghost", None)
        .await;

    // Sessions, as the seed's harness shows them.
    let se = s
        .expect(200, "GET", "/api/sessions/{id}", "/api/sessions/f1", None)
        .await;
    assert_eq!(se["parent_session_id"], "f", "{se}");
    s.expect(
        404,
        "GET",
        "/api/sessions/{id}",
        "/api/sessions/ghost",
        None,
    )
    .await;
    let kids = s
        .expect(
            200,
            "GET",
            "/api/sessions/{id}/children",
            "/api/sessions/f/children",
            None,
        )
        .await;
    let ids: Vec<&str> = kids["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["f0", "f1", "f2", "f3"]);
    let none = s
        .expect(
            404,
            "GET",
            "/api/sessions/{id}/children",
            "/api/sessions/ghost/children",
            None,
        )
        .await;
    assert_eq!(code(&none), "NotFound");
    let par = s
        .expect(
            200,
            "GET",
            "/api/sessions/{id}/parent",
            "/api/sessions/f1/parent",
            None,
        )
        .await;
    assert_eq!(par["parent"]["id"], "f");
    let par = s
        .expect(
            200,
            "GET",
            "/api/sessions/{id}/parent",
            "/api/sessions/f/parent",
            None,
        )
        .await;
    assert_eq!(par["parent"], Value::Null);
    s.expect(
        404,
        "GET",
        "/api/sessions/{id}/parent",
        "/api/sessions/ghost/parent",
        None,
    )
    .await;
    let st = s
        .expect(200, "GET", "/api/sessions/tree", "/api/sessions/tree", None)
        .await;
    assert!(st["trees"].as_array().unwrap().len() >= 2, "{st}");

    // Verbs.
    let i = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/input",
            "/api/agents/p/input",
            Some(json!({"text": "hello"})),
        )
        .await;
    assert!(i["id"].as_str().unwrap().starts_with("in-"), "{i}");
    let bad = s
        .expect(
            400,
            "POST",
            "/api/agents/{name}/input",
            "/api/agents/p/input",
            Some(json!({})),
        )
        .await;
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("text"),
        "{bad}"
    );
    s.expect(
        404,
        "POST",
        "/api/agents/{name}/input",
        "/api/agents/ghost/input",
        Some(json!({"text": "x"})),
    )
    .await;
    s.expect(
        409,
        "POST",
        "/api/agents/{name}/input",
        "/api/agents/quick/input",
        Some(json!({"text": "x"})),
    )
    .await;
    let k2 = [("Idempotency-Key", "k-2")];
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/input",
            "/api/agents/p/input",
            &k2,
            br#"{"text": "one"}"#,
        )
        .await;
    assert_eq!(a.status, 200);
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/input",
            "/api/agents/p/input",
            &k2,
            br#"{"text": "two"}"#,
        )
        .await;
    assert_eq!(a.status, 422);

    let w = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/wait",
            "/api/agents/p/wait",
            Some(json!({"timeout_s": 0.2})),
        )
        .await;
    assert_eq!(w["timed_out"], true, "{w}");
    s.expect(
        400,
        "POST",
        "/api/agents/{name}/wait",
        "/api/agents/p/wait",
        Some(json!({"timeout_s": -1})),
    )
    .await;
    s.expect(
        404,
        "POST",
        "/api/agents/{name}/wait",
        "/api/agents/ghost/wait",
        None,
    )
    .await;

    let r = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/resume",
            "/api/agents/quick/resume",
            Some(json!({"text": "again"})),
        )
        .await;
    assert_eq!(r["name"], "quick");
    s.expect(
        200,
        "POST",
        "/api/agents/{name}/wait",
        "/api/agents/quick/wait",
        Some(json!({"timeout_s": 20})),
    )
    .await;
    s.expect(
        400,
        "POST",
        "/api/agents/{name}/resume",
        "/api/agents/quick/resume",
        Some(json!({"text": 5})),
    )
    .await;
    s.expect(
        404,
        "POST",
        "/api/agents/{name}/resume",
        "/api/agents/ghost/resume",
        None,
    )
    .await;
    s.expect(
        409,
        "POST",
        "/api/agents/{name}/resume",
        "/api/agents/p/resume",
        None,
    )
    .await;
    let k3 = [("Idempotency-Key", "k-3")];
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/resume",
            "/api/agents/p/resume",
            &k3,
            b"",
        )
        .await;
    assert_eq!(a.status, 409, "{}", a.body);
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/resume",
            "/api/agents/p/resume",
            &k3,
            br#"{"text": "x"}"#,
        )
        .await;
    assert_eq!(a.status, 422, "{}", a.body);

    // The agent: requests with its own credentials, refused outside its subtree.
    let reqs = dir.path().join("reqs.json");
    let out = dir.path().join("out.json");
    std::fs::write(&reqs, agent_requests().to_string()).unwrap();
    let py = s
        .expect(201, "POST", "/api/agents", "/api/agents", Some(json!({
            "name": "py", "parent": "p", "protocol": "exec",
            "argv": ["/usr/bin/python3", script("as_agent.py"), reqs.display().to_string(), out.display().to_string()],
        })))
        .await;
    assert_eq!(py["name"], "py");
    let w = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/wait",
            "/api/agents/py/wait",
            Some(json!({"timeout_s": 60})),
        )
        .await;
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let theirs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for x in &theirs {
        let want = if x["path"] == "/api/agents"
            && x["method"] == "GET"
            && x["query"].as_object().unwrap().is_empty()
        {
            200 // its own children: none
        } else {
            403
        };
        assert_eq!(x["status"], want, "as the agent: {x}");
    }
    s.log.lock().unwrap().extend(theirs);

    let c = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/close",
            "/api/agents/quick/close",
            None,
        )
        .await;
    assert_eq!(c["status"], "closed", "{c}");
    s.expect(
        404,
        "POST",
        "/api/agents/{name}/close",
        "/api/agents/ghost/close",
        None,
    )
    .await;
    s.expect(
        409,
        "POST",
        "/api/agents/{name}/close",
        "/api/agents/p/close",
        None,
    )
    .await;
    let k4 = [("Idempotency-Key", "k-4")];
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/close",
            "/api/agents/f0/close",
            &k4,
            b"",
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/close",
            "/api/agents/f0/close",
            &k4,
            b"{ }",
        )
        .await;
    assert_eq!(a.status, 422, "{}", a.body);

    let c = s
        .expect(
            200,
            "POST",
            "/api/agents/{name}/cancel",
            "/api/agents/f/cancel",
            None,
        )
        .await;
    assert_eq!(c["name"], "f");
    s.expect(
        404,
        "POST",
        "/api/agents/{name}/cancel",
        "/api/agents/ghost/cancel",
        None,
    )
    .await;
    let k5 = [("Idempotency-Key", "k-5")];
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/cancel",
            "/api/agents/p/cancel",
            &k5,
            b"",
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = s
        .on(
            &s.unix,
            "POST",
            "/api/agents/{name}/cancel",
            "/api/agents/p/cancel",
            &k5,
            b"{}",
        )
        .await;
    assert_eq!(a.status, 422, "{}", a.body);

    // Events, not following: every event, in order, from the store.
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
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "every event once, in order"
    );
    s.expect(
        400,
        "GET",
        "/api/events",
        "/api/events?format=xml&follow=false",
        None,
    )
    .await;
    s.expect(
        404,
        "GET",
        "/api/events",
        "/api/events?subtree=ghost&follow=false",
        None,
    )
    .await;

    // Jobs: not yet.
    for (method, path, template) in [
        ("POST", "/api/jobs", "/api/jobs"),
        ("GET", "/api/jobs", "/api/jobs"),
        ("GET", "/api/jobs/j1", "/api/jobs/{id}"),
        ("POST", "/api/jobs/j1/start", "/api/jobs/{id}/start"),
        ("POST", "/api/jobs/j1/cancel", "/api/jobs/{id}/cancel"),
        ("GET", "/api/jobs/j1/items", "/api/jobs/{id}/items"),
        (
            "POST",
            "/api/jobs/j1/items/i1/assign",
            "/api/jobs/{id}/items/{item}/assign",
        ),
        (
            "POST",
            "/api/jobs/j1/items/i1/retry",
            "/api/jobs/{id}/items/{item}/retry",
        ),
        (
            "POST",
            "/api/jobs/j1/items/i1/report",
            "/api/jobs/{id}/items/{item}/report",
        ),
        ("GET", "/api/jobs/j1/export", "/api/jobs/{id}/export"),
        ("POST", "/api/jobs/j1/replay", "/api/jobs/{id}/replay"),
    ] {
        let v = s.expect(501, method, template, path, None).await;
        assert_eq!(code(&v), "NotImplemented");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("jobs"),
            "{v}"
        );
    }
    // Not routes at all.
    let a = raw(&s.unix, "GET", "/api/nothing", &[], b"").await;
    assert_eq!((a.status, code(&a.json())), (404, "NotFound"));
    let a = raw(&s.unix, "DELETE", "/api/agents", &[], b"").await;
    assert_eq!(a.status, 405);
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("DELETE")
    );

    // The independent validators: the document, and every answer against it.
    let spec = dir.path().join("openapi.json");
    let log = dir.path().join("exchanges.json");
    std::fs::write(&spec, doc.to_string()).unwrap();
    std::fs::write(
        &log,
        Value::Array(s.log.lock().unwrap().clone()).to_string(),
    )
    .unwrap();
    #[allow(clippy::disallowed_methods)]
    let o = std::process::Command::new(&python)
        .arg(script("validate.py"))
        .arg(&spec)
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the validators found problems:\n{}",
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

/// A following SSE connection read as it arrives.
struct Stream {
    s: tokio::net::UnixStream,
    raw: Vec<u8>,
    text: String,
    head_done: bool,
}

impl Stream {
    async fn open(sock: &Path, path: &str, last_event_id: Option<&str>) -> Stream {
        let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: brood\r\nAccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut st = Stream {
            s,
            raw: Vec::new(),
            text: String::new(),
            head_done: false,
        };
        // The answer's head: the subscription is in place once it came.
        while !st.head_done {
            st.fill().await;
        }
        st
    }

    async fn fill(&mut self) {
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(20), self.s.read(&mut buf))
            .await
            .expect("events within 20 s")
            .unwrap();
        assert!(n > 0, "the stream ended");
        self.raw.extend_from_slice(&buf[..n]);
        if !self.head_done {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("text/event-stream"), "{head}");
            self.raw.drain(..end + 4);
            self.head_done = true;
        }
        // Whole chunks into the text.
        loop {
            let Some(nl) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                break;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.raw[..nl]).unwrap().trim(), 16)
                    .unwrap();
            if self.raw.len() < nl + 2 + size + 2 {
                break;
            }
            self.text
                .push_str(std::str::from_utf8(&self.raw[nl + 2..nl + 2 + size]).unwrap());
            self.raw.drain(..nl + 2 + size + 2);
        }
    }

    /// The next event: (id, event type, data).
    async fn next(&mut self) -> (Option<String>, Option<String>, String) {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let (mut id, mut ev, mut data) = (None, None, String::new());
                for l in block.lines() {
                    if let Some(v) = l.strip_prefix("id: ") {
                        id = Some(v.to_owned())
                    }
                    if let Some(v) = l.strip_prefix("event: ") {
                        ev = Some(v.to_owned())
                    }
                    if let Some(v) = l.strip_prefix("data: ") {
                        data.push_str(v)
                    }
                }
                if data.is_empty() && ev.is_none() {
                    continue; // a keep-alive comment
                }
                return (id, ev, data);
            }
            self.fill().await;
        }
    }

    async fn next_seq(&mut self) -> (String, i64) {
        let (id, ev, data) = self.next().await;
        assert_eq!(ev, None, "{data}");
        let v: Value = serde_json::from_str(&data).unwrap();
        let id = id.expect("every event has an id");
        assert_eq!(v["event_id"], id.as_str());
        (id, v["sequence"].as_i64().unwrap())
    }
}

async fn quick_agents(s: &Served, names: &[&str]) {
    for n in names {
        let a = raw(
            &s.unix,
            "POST",
            "/api/agents",
            &[],
            json!({"name": n, "argv": agent(&["--result", n])})
                .to_string()
                .as_bytes(),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    for n in names {
        let w = raw(
            &s.unix,
            "POST",
            &format!("/api/agents/{n}/wait"),
            &[],
            br#"{"timeout_s": 20}"#,
        )
        .await;
        assert_eq!(w.json()["agents"][0]["status"], "completed", "{}", w.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_after_a_dropped_connection_with_no_gap_and_no_repeat() {
    let s = Served::start(|_| {}).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["a1", "a2"]).await;
    let mut first = Stream::open(&sock, "/api/events", None).await;
    let mut got = Vec::new();
    let mut last_id = String::new();
    for _ in 0..5 {
        let (id, seq) = first.next_seq().await;
        got.push(seq);
        last_id = id;
    }
    drop(first); // the connection drops mid-stream
    quick_agents(&s, &["a3", "a4"]).await;
    let head = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let mut second = Stream::open(&sock, "/api/events", Some(&last_id)).await;
    // Followed live too: what happens after the reconnect arrives as well.
    quick_agents(&s, &["a5"]).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    assert!(end > head && head > 5, "{head} {end}");
    while *got.last().unwrap() < end {
        got.push(second.next_seq().await.1);
    }
    assert_eq!(
        got,
        (1..=end).collect::<Vec<_>>(),
        "every event exactly once, in order"
    );

    // Filters: one agent's events, by type, in the agentruntime form.
    let mut only = Stream::open(
        &sock,
        "/api/events?agent=a3&type=agent.stop,agent.start",
        None,
    )
    .await;
    let (_, _, d) = only.next().await;
    let v: Value = serde_json::from_str(&d).unwrap();
    assert_eq!(
        (v["agent"].as_str(), v["type"].as_str()),
        (Some("a3"), Some("agent.start"))
    );
    let (_, _, d) = only.next().await;
    assert_eq!(
        serde_json::from_str::<Value>(&d).unwrap()["type"],
        "agent.stop"
    );
    let mut std = Stream::open(
        &sock,
        "/api/events?format=agentruntime&type=agent.spawn&agent=a1",
        None,
    )
    .await;
    let (_, _, d) = std.next().await;
    let v: Value = serde_json::from_str(&d).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["subagentId"].as_str()),
        (Some("subagent.spawned"), Some("a1"))
    );
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sse_subscribers_each_get_every_event_once() {
    let s = Served::start(|_| {}).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["before"]).await;
    let head = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let from = format!("{}-{head}", s.env.sup.tenant());
    let mut subs = Vec::new();
    for _ in 0..100 {
        subs.push(Stream::open(&sock, "/api/events", Some(&from)).await);
    }
    let names: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    quick_agents(&s, &refs).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let want: Vec<i64> = (head + 1..=end).collect();
    assert!(want.len() >= 15, "{want:?}");
    let tasks: Vec<_> = subs
        .into_iter()
        .map(|mut st| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.last().is_none_or(|l| *l < end) {
                    got.push(st.next_seq().await.1);
                }
                got
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), want);
    }
    s.env.sup.shutdown().await;
}
