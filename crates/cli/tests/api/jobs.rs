//! The OpenAPI test's part for the jobs' routes: creation and its refusals,
//! reads, start and cancel, export, evidence and replay, retries, assigning
//! an item and an agent reporting it with its own credentials, and the
//! idempotency keys of each mutation. Jobs are owned by the earlier parts'
//! agent `p`.

use serde_json::{Value, json};

use super::{JOBS, N, SPAWN, WAIT, each, key_reused, script};
use crate::common::wire::*;
use crate::common::*;

/// Every job route, on jobs `j1`..`j9` owned by `p`.
pub async fn exercised(s: &Served) {
    let dir = tempfile::tempdir().unwrap();
    // Jobs: created (whole, or refused naming why) and read.
    let csv = "id,text\na,hello\nb,world\n";
    let jb = |id: &str, owner: &str, instruction: &str| json!({"id": id, "owner": owner, "instruction": instruction, "input": csv, "id_column": "id"});
    let r = each(
        s,
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
        s,
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
    key_reused(s, "k-6", JOBS, JOBS, j4.as_bytes(), j5.as_bytes(), 201).await;
    key_reused(
        s,
        "k-7",
        "/api/jobs/{id}/start",
        "/api/jobs/j4/start",
        b"",
        b"{ }",
        200,
    )
    .await;
    key_reused(
        s,
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
        s,
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
    let failed = |id: &'static str| async move {
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
    };
    each(
        s,
        &[
            (201, "POST", JOBS, JOBS, j7),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j7/start", N),
        ],
    )
    .await;
    assert!(failed("j7").await, "j7 fails");
    let rt = "/api/jobs/{id}/items/{item}/retry";
    let r = each(
        s,
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
        s,
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
        s,
        &[
            (201, "POST", JOBS, JOBS, j8),
            (200, "POST", "/api/jobs/{id}/start", "/api/jobs/j8/start", N),
        ],
    )
    .await;
    let asg = "/api/jobs/{id}/items/{item}/assign";
    let rep = "/api/jobs/{id}/items/{item}/report";
    let r = each(
        s,
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
        s,
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
        s,
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
            s,
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
        s,
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
}
