//! The OpenAPI test's part for issue 25's removals: `DELETE
//! /api/agents/{name}`, `POST /api/prune` and `DELETE /api/jobs/{id}`, each
//! answering every status its operation declares (403 is the agent's, in
//! `agent_requests`), recorded for the validators with the rest.

use serde_json::json;

use super::{JOBS, N, SPAWN, WAIT, each};
use crate::common::wire::*;

const RM: &str = "/api/agents/{name}";
const PRUNE: &str = "/api/prune";
const JOB_RM: &str = "/api/jobs/{id}";

/// A DELETE of `path` with `key`: its status, and the same key on `other`
/// answering 422.
async fn delete_key_reused(s: &Served, template: &str, key: &str, path: &str, other: &str) {
    let k = [("Idempotency-Key", key)];
    let a = s.on(&s.unix, "DELETE", template, path, &k, b"").await;
    assert_eq!(a.status, 200, "{path}: {}", a.body);
    let again = s.on(&s.unix, "DELETE", template, path, &k, b"").await;
    assert_eq!(
        (again.status, &again.body),
        (200, &a.body),
        "a repeat replays"
    );
    let a = s.on(&s.unix, "DELETE", template, other, &k, b"").await;
    assert_eq!(
        (a.status, code(&a.json())),
        (422, "IdempotencyMismatch"),
        "{other}"
    );
}

/// Every answer of the three routes, on `s` where `quick` is a child of
/// `p`: `hang` is the test agent's argv that never ends, `said` one that
/// ends at once. A root `alive` runs while they are asked, and is cancelled
/// at the end. (After the event stream's check that every number is there:
/// a removal takes its tree's events out of the log.)
pub async fn exercised(s: &Served, hang: &[String], said: &[String]) {
    let r = each(
        s,
        &[
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "alive", "argv": hang, "await_ready": true}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "gone", "argv": said}),
            ),
            (
                201,
                "POST",
                SPAWN,
                SPAWN,
                json!({"name": "gone2", "argv": said}),
            ),
            (
                200,
                "POST",
                WAIT,
                "/api/agents/gone/wait",
                json!({"timeout_s": 60}),
            ),
            (
                200,
                "POST",
                WAIT,
                "/api/agents/gone2/wait",
                json!({"timeout_s": 60}),
            ),
            (200, "DELETE", RM, "/api/agents/gone", N),
            (404, "GET", "/api/agents/{name}", "/api/agents/gone", N),
            (404, "DELETE", RM, "/api/agents/ghost", N),
            (400, "DELETE", RM, "/api/agents/quick", N),
            (409, "DELETE", RM, "/api/agents/alive", N),
        ],
    )
    .await;
    assert_eq!(
        (r[5]["root"].clone(), r[5]["agents"].clone()),
        (json!("gone"), json!(1))
    );
    assert!(
        r[8]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("brood rm p"),
        "{}",
        r[8]
    );
    assert!(
        r[9]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent alive is running"),
        "{}",
        r[9]
    );
    delete_key_reused(s, RM, "k-rm", "/api/agents/gone2", "/api/agents/ghost").await;
    let a = s
        .on(&s.tcp(None), "DELETE", RM, "/api/agents/alive", &[], b"")
        .await;
    assert_eq!((a.status, code(&a.json())), (401, "Unauthorized"));

    // Prune: a dry run lists and removes nothing; the age is checked.
    let r = each(
        s,
        &[
            (
                200,
                "POST",
                PRUNE,
                PRUNE,
                json!({"older_than_s": 0, "dry_run": true}),
            ),
            (400, "POST", PRUNE, PRUNE, json!({"dry_run": true})),
            (400, "POST", PRUNE, PRUNE, json!({"older_than_s": -1})),
            (
                400,
                "POST",
                PRUNE,
                PRUNE,
                json!({"older_than_s": 3153600001_u64}),
            ),
            (200, "GET", "/api/agents/{name}", "/api/agents/quick", N),
        ],
    )
    .await;
    assert_eq!(r[0]["dry_run"], true, "{}", r[0]);
    assert!(
        r[0]["removed"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["root"] != "alive"),
        "a live tree is never listed: {}",
        r[0]
    );
    assert!(
        r[3]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("older_than_s:"),
        "{}",
        r[3]
    );
    let a = s
        .on(
            &s.tcp(None),
            "POST",
            PRUNE,
            PRUNE,
            &[],
            b"{\"older_than_s\": 0}",
        )
        .await;
    assert_eq!((a.status, code(&a.json())), (401, "Unauthorized"));
    let big = vec![b' '; (1 << 20) + 1];
    let a = s.on(&s.unix, "POST", PRUNE, PRUNE, &[], &big).await;
    assert_eq!((a.status, code(&a.json())), (413, "TooLarge"));
    let k = [("Idempotency-Key", "k-prune")];
    let first = br#"{"older_than_s": 3153600000}"#;
    let a = s.on(&s.unix, "POST", PRUNE, PRUNE, &k, first).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = s
        .on(&s.unix, "POST", PRUNE, PRUNE, &k, br#"{"older_than_s": 1}"#)
        .await;
    assert_eq!((a.status, code(&a.json())), (422, "IdempotencyMismatch"));

    // A job: a pending one goes; a running one is refused; gone, not found.
    let job = |id: &str, argv: &[String]| {
        json!({"id": id, "owner": "alive", "instruction": "x", "input": [{"a": 1}],
               "worker": {"argv": argv}})
    };
    let r = each(
        s,
        &[
            (201, "POST", JOBS, JOBS, job("jrm", hang)),
            (201, "POST", JOBS, JOBS, job("jrm2", hang)),
            (201, "POST", JOBS, JOBS, job("jrun", hang)),
            (
                200,
                "POST",
                "/api/jobs/{id}/start",
                "/api/jobs/jrun/start",
                N,
            ),
            (409, "DELETE", JOB_RM, "/api/jobs/jrun", N),
            (200, "DELETE", JOB_RM, "/api/jobs/jrm", N),
            (404, "DELETE", JOB_RM, "/api/jobs/jrm", N),
            (
                200,
                "POST",
                "/api/jobs/{id}/cancel",
                "/api/jobs/jrun/cancel",
                N,
            ),
        ],
    )
    .await;
    assert!(
        r[4]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("job jrun is running"),
        "{}",
        r[4]
    );
    assert_eq!(
        (r[5]["job"].clone(), r[5]["status"].clone()),
        (json!("jrm"), json!("pending"))
    );
    delete_key_reused(s, JOB_RM, "k-jrm", "/api/jobs/jrm2", "/api/jobs/ghost").await;
    let a = s
        .on(
            &s.unix,
            "DELETE",
            JOB_RM,
            "/api/jobs/jrun",
            &[("Idempotency-Key", "")],
            b"",
        )
        .await;
    assert_eq!((a.status, code(&a.json())), (400, "BadRequest"));
    let a = s
        .on(&s.tcp(None), "DELETE", JOB_RM, "/api/jobs/jrun", &[], b"")
        .await;
    assert_eq!((a.status, code(&a.json())), (401, "Unauthorized"));
    each(
        s,
        &[(
            200,
            "POST",
            "/api/agents/{name}/cancel",
            "/api/agents/alive/cancel",
            N,
        )],
    )
    .await;
}
