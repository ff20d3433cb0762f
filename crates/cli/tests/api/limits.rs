//! The OpenAPI test's part for issue 24's limits: job creation and replay
//! answered 413 and 429 by a daemon whose limits are small, the answers
//! recorded for the validators with the main daemon's.

use serde_json::{Value, json};

use super::{JOBS, SPAWN, each};
use crate::common::me;
use crate::common::wire::*;

/// The exchanges of a daemon with `items_per_job = 3` and `jobs_per_tenant
/// = 2`: an input over the one, a replay over it, then a job and a replay
/// past the other. `hang` is the test agent's argv for an owner, `rp` the
/// replay route's template.
pub async fn exercised(hang: &[String], rp: &str) -> Vec<Value> {
    let tight = Served::start(|cfg| {
        cfg.limits.items_per_job = 3;
        cfg.limits.jobs_per_tenant = 2;
    })
    .await;
    let rows = |n: usize| {
        std::iter::once("t\n".to_owned())
            .chain((0..n).map(|i| format!("{i}\n")))
            .collect::<String>()
    };
    let tj = |id: &str, n: usize| json!({"id": id, "owner": "o", "instruction": "Say {t}", "input": rows(n)});
    each(
        &tight,
        &[(
            201,
            "POST",
            SPAWN,
            SPAWN,
            json!({"name": "o", "argv": hang, "await_ready": true}),
        )],
    )
    .await;
    // Recorded by a process with the default limits: more items than this
    // daemon lets a job hold, so its replay is refused.
    let big: brood_api::JobBody = serde_json::from_value(tj("big", 4)).unwrap();
    brood_runtime::jobs::create(
        tight.env.sup.store().as_ref(),
        tight.env.sup.tenant(),
        &me(),
        big,
        1,
    )
    .unwrap();
    let r = each(
        &tight,
        &[
            (413, "POST", JOBS, JOBS, tj("t1", 4)),
            (
                413,
                "POST",
                rp,
                "/api/jobs/big/replay",
                json!({"id": "bigr"}),
            ),
            (201, "POST", JOBS, JOBS, tj("t2", 1)),
            (429, "POST", JOBS, JOBS, tj("t3", 1)),
            (429, "POST", rp, "/api/jobs/t2/replay", json!({"id": "t2r"})),
        ],
    )
    .await;
    assert_eq!(code(&r[0]), "TooLarge", "{}", r[0]);
    assert_eq!(code(&r[1]), "TooLarge", "{}", r[1]);
    assert_eq!(code(&r[3]), "QuotaJobs", "{}", r[3]);
    assert_eq!(code(&r[4]), "QuotaJobs", "{}", r[4]);
    tight.log.lock().unwrap().drain(..).collect()
}
