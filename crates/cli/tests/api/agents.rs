//! The OpenAPI test's part for the agents' routes: creation and each of its
//! refusals (bad bodies, names, rights, quotas, idempotency keys), the reads
//! (agents, trees, logs, sessions) and the verbs (input, wait, resume). The
//! agents made here (`p`, `quick`, `f` and its children) are the later parts'.

use serde_json::{Value, json};

use super::{INPUT, N, RESUME, SHOW, SPAWN, WAIT, each, key_reused};
use crate::common::wire::*;
use crate::common::*;

/// `POST /api/agents`: each error, named; an idempotent repeat; the
/// fanout quota. Leaves `p` (running, may create, send, wait, close and
/// resume), its child `quick` (completed, "hi") and `f` with four children.
pub async fn created_and_refused(s: &Served) {
    let hang = agent(&["--hang"]);
    let said = |w: &str| agent(&["--result", w]);
    // POST /api/agents: each error, named.
    let bad = s
        .on(&s.unix, "POST", SPAWN, SPAWN, &[], b"{\"argv\": [")
        .await;
    assert_eq!((bad.status, code(&bad.json())), (400, "BadRequest"));
    let r = each(
        s,
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
        s,
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
        s,
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
}

/// The reads: agents, children, descendants, trees, logs, sessions.
pub async fn read(s: &Served) {
    // Reads.
    let r = each(
        s,
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
        s,
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
}

/// The verbs: input, wait, resume, each refused where it must be.
pub async fn verbs(s: &Served) {
    let w20 = json!({"timeout_s": 20});
    // Verbs.
    let r = each(
        s,
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
        s,
        "k-2",
        INPUT,
        "/api/agents/p/input",
        br#"{"text": "one"}"#,
        br#"{"text": "two"}"#,
        200,
    )
    .await;
    key_reused(
        s,
        "k-3",
        RESUME,
        "/api/agents/p/resume",
        b"",
        br#"{"text": "x"}"#,
        409,
    )
    .await;
}
