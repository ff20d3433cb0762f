//! The OpenAPI test's part for what is read and ended: an agent calling
//! with its own credentials (refused outside its subtree), close and cancel,
//! the event stream, the web UI's reads and an artifact's download.

use serde_json::{Value, json};

use super::{CANCEL, CLOSE, JOBS, N, SPAWN, WAIT, agent_requests, each, key_reused, script};
use crate::common::wire::*;
use crate::common::*;

/// The views and the ends, after the agents' and jobs' parts.
pub async fn exercised(s: &Served) {
    let dir = tempfile::tempdir().unwrap();
    let hang = agent(&["--hang"]);
    // An agent, with its own credentials, refused outside its subtree.
    let reqs = dir.path().join("reqs.json");
    let out = dir.path().join("out.json");
    std::fs::write(&reqs, agent_requests().to_string()).unwrap();
    let argv = json!(["/usr/bin/python3", script("as_agent.py"), reqs, out]);
    each(
        s,
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
        s,
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
        s,
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
    key_reused(s, "k-4", CLOSE, "/api/agents/f0/close", b"", b"{ }", 200).await;
    key_reused(s, "k-5", CANCEL, "/api/agents/p/cancel", b"", b"{}", 200).await;

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
        s,
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
        s,
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
    each(s, &[(204, "POST", "/api/ui/logout", "/api/ui/logout", N)]).await;
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
        s,
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
        s,
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
}
