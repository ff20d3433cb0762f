//! Jobs under pressure (issue 14 item 8): 500 rows where some items fail
//! once and some always, retried exactly up to `max_attempts`; retry of only
//! the failed items; replay of the failed items as a new, linked job; a
//! stale worker's report refused after its attempt timed out; a cancel in
//! the middle keeping what completed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use brood_core::{ItemStatus, JobStatus};
use brood_store::AttemptOutcome;
use common::*;
use serde_json::{Value, json};

/// A supervisor whose quotas let a job's many short-lived workers through
/// (every worker ever started counts in its owner's tree size).
fn roomy() -> Env {
    start_with(Duration::from_millis(300), |c| {
        c.quotas.defaults.max_tree_size = c.quotas.ceilings.max_tree_size;
    })
}

fn worker(flags: &[&str]) -> Value {
    let mut argv = vec![exe().to_owned(), "test-agent".into(), "--job-worker".into()];
    argv.extend(flags.iter().map(|s| s.to_string()));
    json!({"argv": argv})
}

fn create(env: &Env, body: Value) {
    let body: brood_api::JobBody = serde_json::from_value(body).unwrap();
    let store = env.sup.store().clone();
    brood_runtime::jobs::create(store.as_ref(), env.sup.tenant(), &me(), body, 1).unwrap();
}

async fn finished(env: &Env, id: &str, secs: u64) -> brood_store::Job {
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let done = eventually_async(Duration::from_secs(secs), || {
        store.job(&t, id).unwrap().unwrap().status.is_finished()
    })
    .await;
    let job = store.job(&t, id).unwrap().unwrap();
    assert!(done, "job {id} did not finish: {job:?}");
    job
}

fn outcomes(env: &Env, job: &str, item: &str) -> Vec<AttemptOutcome> {
    env.sup
        .store()
        .attempts(env.sup.tenant(), job, item)
        .unwrap()
        .iter()
        .map(|a| a.outcome)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_rows_retry_exactly_up_to_max_attempts_then_retry_and_replay_the_failed() {
    let env = roomy();
    env.sup
        .spawn(me(), req("owner", agent(&["--hang"])))
        .await
        .unwrap();
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let marks = tempfile::tempdir().unwrap();
    let mut csv = String::from("id,text\n");
    for i in 0..500 {
        let text = match i {
            _ if i % 25 == 7 => format!("row {i} FAIL-ALWAYS"),
            _ if i % 10 == 0 => format!("row {i} FAIL-ONCE"),
            _ => format!("row {i}"),
        };
        csv.push_str(&format!("r{i},{text}\n"));
    }
    let dir = marks.path().display().to_string();
    create(
        &env,
        json!({"id": "big", "owner": "owner", "instruction": "Echo {text}", "input": csv,
               "id_column": "id", "concurrency": 8, "max_attempts": 3,
               "worker": worker(&["--fail-first", &dir, "--fail-marked-only"])}),
    );
    env.sup.job_start(me(), "big".into()).await.unwrap();
    let job = finished(&env, "big", 240).await;
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    let items = store.job_items(&t, "big", None).unwrap();
    assert_eq!(items.len(), 500);
    let mut failed = Vec::new();
    for it in &items {
        let o = outcomes(&env, "big", &it.id);
        if it.input.contains("FAIL-ALWAYS") {
            assert_eq!(it.status, ItemStatus::Failed, "{it:?}");
            assert_eq!(
                o,
                [AttemptOutcome::Failed; 3],
                "exactly max_attempts: {}",
                it.id
            );
            assert!(it.result.is_none());
            failed.push(it.id.clone());
        } else {
            assert_eq!(it.status, ItemStatus::Completed, "{it:?}");
            let want: &[AttemptOutcome] = if it.input.contains("FAIL-ONCE") {
                &[AttemptOutcome::Failed, AttemptOutcome::Completed]
            } else {
                &[AttemptOutcome::Completed]
            };
            assert_eq!(o, want, "{}", it.id);
            let r: Value = serde_json::from_str(it.result.as_deref().unwrap()).unwrap();
            let text = serde_json::from_str::<Value>(&it.input).unwrap()["text"].clone();
            assert_eq!(r["echo"], json!(format!("Echo {}", text.as_str().unwrap())));
        }
    }
    assert_eq!(failed.len(), 20);
    let counts = store.item_counts(&t, "big").unwrap();
    assert!(counts.contains(&(ItemStatus::Completed, 480)), "{counts:?}");
    assert!(counts.contains(&(ItemStatus::Failed, 20)), "{counts:?}");

    // Retry only the failed items: the job reopens, each failed item gets
    // one more attempt (they fail again), completed items are untouched.
    let r = env.sup.job_retry(me(), "big".into(), None).await.unwrap();
    assert_eq!(r.retried.len(), 20, "{r:?}");
    let job = finished(&env, "big", 120).await;
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    for it in store.job_items(&t, "big", None).unwrap() {
        let n = outcomes(&env, "big", &it.id).len();
        let want = if failed.contains(&it.id) {
            4
        } else if it.input.contains("FAIL-ONCE") {
            2
        } else {
            1
        };
        assert_eq!(
            n, want,
            "{}: a retry adds one attempt, only to failed items",
            it.id
        );
    }

    // Replay the failed items: a new job of just those, linked to its source.
    let body = brood_api::ReplayBody {
        id: Some("big-again".into()),
        failed_only: Some(true),
        start: None,
    };
    let replay = brood_runtime::jobs::replay(store.as_ref(), &t, &me(), "big", &body, 2).unwrap();
    assert_eq!((replay.source.as_deref(), replay.total), (Some("big"), 20));
    let ids: Vec<String> = store
        .job_items(&t, "big-again", None)
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, failed);
    assert_eq!(replay.spec, store.job(&t, "big").unwrap().unwrap().spec);
    env.sup.job_start(me(), "big-again".into()).await.unwrap();
    let again = finished(&env, "big-again", 120).await;
    assert_eq!(again.status, JobStatus::Failed);
    let none = brood_api::ReplayBody {
        failed_only: Some(true),
        ..Default::default()
    };
    let e = brood_runtime::jobs::replay(store.as_ref(), &t, &me(), "ghost", &none, 3).unwrap_err();
    assert_eq!(e.code, brood_core::Code::NotFound);
    env.sup.cancel(me(), name("owner")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_report_is_refused_and_the_item_keeps_one_result() {
    let env = roomy();
    env.sup
        .spawn(me(), req("owner", agent(&["--hang"])))
        .await
        .unwrap();
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    // Workers that never report on their own: the test speaks for them
    // (the supervisor knows a caller by its cgroup; in process, by name).
    let argv = agent(&["--hang"]);
    create(
        &env,
        json!({"id": "stale", "owner": "owner", "instruction": "Do {text}", "input": "id,text\na,one\n",
               "id_column": "id", "concurrency": 1, "max_attempts": 3, "item_timeout_s": 1,
               "worker": {"argv": argv}}),
    );
    env.sup.job_start(me(), "stale".into()).await.unwrap();
    let w1 = name("stale-w1");
    // Attempt 1 times out (its worker is stopped); attempt 2 goes to w2.
    let second = eventually_async(Duration::from_secs(20), || {
        store.attempts(&t, "stale", "a").unwrap().len() == 2
    })
    .await;
    let attempts = store.attempts(&t, "stale", "a").unwrap();
    assert!(second, "{attempts:?}");
    assert_eq!(attempts[0].outcome, AttemptOutcome::Failed);
    assert!(
        attempts[0].error.as_deref().unwrap().contains("timed out"),
        "{attempts:?}"
    );
    let w2 = attempts[1].worker.clone().unwrap();
    assert_ne!(w2, w1);
    let report = |v: i64| json!({"job": "stale", "item": "a", "result": {"v": v}});
    // The late report of attempt 1's worker: refused, nothing recorded.
    let e = env
        .sup
        .job_report(brood_runtime::Caller::Agent(w1.clone()), report(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code,
            brood_core::Code::Forbidden | brood_core::Code::Conflict
        ),
        "{e:?}"
    );
    // The current holder's report is the one result.
    let r = env
        .sup
        .job_report(brood_runtime::Caller::Agent(w2.clone()), report(2))
        .await
        .unwrap();
    assert!(r.accepted, "{r:?}");
    // Reporting again, or the stale one again: refused.
    for w in [w2, w1] {
        let e = env
            .sup
            .job_report(brood_runtime::Caller::Agent(w.clone()), report(3))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e.code,
                brood_core::Code::Forbidden | brood_core::Code::Conflict
            ),
            "{w}: {e:?}"
        );
    }
    let job = finished(&env, "stale", 20).await;
    assert_eq!(job.status, JobStatus::Completed);
    let it = &store.job_items(&t, "stale", None).unwrap()[0];
    assert_eq!(it.result.as_deref(), Some(r#"{"v":2}"#));
    assert_eq!(
        outcomes(&env, "stale", "a"),
        [AttemptOutcome::Failed, AttemptOutcome::Completed]
    );
    env.sup.cancel(me(), name("owner")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_the_middle_keeps_the_completed_results_and_stops_the_workers() {
    let env = roomy();
    env.sup
        .spawn(me(), req("owner", agent(&["--hang"])))
        .await
        .unwrap();
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let mut csv = String::from("id,text\n");
    for i in 0..60 {
        csv.push_str(&format!("c{i},row {i}\n"));
    }
    create(
        &env,
        json!({"id": "mid", "owner": "owner", "instruction": "Echo {text}", "input": csv,
               "id_column": "id", "concurrency": 2, "worker": worker(&["--item-delay", "100"])}),
    );
    env.sup.job_start(me(), "mid".into()).await.unwrap();
    let some = eventually_async(Duration::from_secs(30), || {
        store.item_counts(&t, "mid").unwrap()[2].1 >= 5
    })
    .await;
    assert!(some);
    let v = env.sup.job_cancel(me(), "mid".into()).await.unwrap();
    assert_eq!(v.status, "cancelled", "{v:?}");
    let done: Vec<(String, Option<String>)> = store
        .job_items(&t, "mid", Some(ItemStatus::Completed))
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.result))
        .collect();
    assert!(done.len() >= 5 && done.len() < 60, "{}", done.len());
    // Its workers end (cancelled), and nothing more completes afterwards.
    let workers_gone = eventually_async(Duration::from_secs(10), || {
        store
            .children(&t, &name("owner"))
            .unwrap()
            .iter()
            .all(|a| a.status.is_finished())
    })
    .await;
    assert!(workers_gone, "the job's workers stop");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<(String, Option<String>)> = store
        .job_items(&t, "mid", Some(ItemStatus::Completed))
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.result))
        .collect();
    assert_eq!(after, done, "completed items are kept as they were");
    assert!(
        store
            .job_items(&t, "mid", Some(ItemStatus::Running))
            .unwrap()
            .is_empty(),
        "no item is left running"
    );
    // A cancelled job is not retried (a replay makes a new one).
    let e = env
        .sup
        .job_retry(me(), "mid".into(), None)
        .await
        .unwrap_err();
    assert_eq!(e.code, brood_core::Code::Conflict);
    env.sup.cancel(me(), name("owner")).await.unwrap();
}

/// SPEC 10's protocol ops from an agent's side: it creates a job of its own
/// (never one for another agent), reads it, starts it (its workers are its
/// own children), is refused a worker's report, and waits for the job to
/// complete while its workers report; then the job is exported and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_its_own_job_through_the_protocol() {
    let env = roomy();
    // Each item takes a while, so the job is still running when the agent's
    // requests after `job.start` (a report, an assign, a retry) arrive: a
    // retry of a completed job is a conflict, not the empty retry asserted.
    let worker = [exe(), "test-agent", "--job-worker", "--item-delay", "2000"];
    let create = json!({"id": "mine", "instruction": "Echo {t}", "input": "id,t\na,x\nb,y\nc,z\n",
                        "id_column": "id", "concurrency": 2, "worker": {"argv": worker}});
    let requests: Vec<(&str, Value)> = vec![
        ("job.create", create),
        (
            "job.create",
            json!({"owner": "someone", "instruction": "x", "input": [{"a": 1}]}),
        ),
        ("job.get", json!({"job": "mine"})),
        ("job.list", json!({})),
        ("job.items", json!({"job": "mine", "status": "pending"})),
        ("job.export", json!({"job": "mine", "format": "csv"})),
        ("job.replay", json!({"job": "mine", "id": "mine-copy"})),
        ("job.cancel", json!({"job": "mine-copy"})),
        ("job.start", json!({"job": "mine"})),
        ("job.report", json!({"result": {"forged": true}})),
        ("job.assign", json!({"job": "mine", "item": "zz"})),
        ("job.retry", json!({"job": "mine"})),
    ];
    let mut flags: Vec<String> = Vec::new();
    for (op, args) in &requests {
        flags.push("--request".into());
        flags.push(format!("{op}={args}"));
    }
    flags.extend(["--await-job".into(), "mine".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.sup
        .spawn(me(), req("orch", agent(&flags)))
        .await
        .unwrap();
    let r = env
        .sup
        .wait(me(), vec![name("orch")], Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    let a = &r["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    let lines: Vec<&str> = a["result"].as_str().unwrap().lines().collect();
    let line = |op: &str, n: usize| {
        *lines
            .iter()
            .filter(|l| l.starts_with(&format!("{op}: ")))
            .nth(n)
            .unwrap_or_else(|| panic!("no reply {n} to {op}: {lines:?}"))
    };
    assert!(
        line("job.create", 0).contains(r#""owner":"orch""#),
        "{lines:?}"
    );
    assert_eq!(line("job.create", 1), "job.create: Forbidden");
    assert!(line("job.get", 0).contains(r#""status":"pending""#));
    assert!(line("job.list", 0).contains(r#""id":"mine""#));
    assert_eq!(
        line("job.items", 0)
            .matches(r#""status":"pending""#)
            .count(),
        3
    );
    assert!(
        line("job.export", 0).contains("id,t,job_id,item_id"),
        "{lines:?}"
    );
    assert!(line("job.replay", 0).contains(r#""source":"mine""#));
    assert!(line("job.cancel", 0).contains(r#""status":"cancelled""#));
    assert!(line("job.start", 0).contains(r#""status":"running""#));
    assert_eq!(line("job.report", 0), "job.report: Forbidden");
    assert_eq!(line("job.assign", 0), "job.assign: Conflict");
    assert!(
        line("job.retry", 0).contains(r#""retried":[]"#),
        "{lines:?}"
    );
    assert_eq!(*lines.last().unwrap(), "job mine: completed");
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let workers: Vec<String> = store
        .children(&t, &name("orch"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert!(
        !workers.is_empty() && workers.iter().all(|w| w.starts_with("mine-w")),
        "the workers are the agent's own children: {workers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_max_runtime_fails_and_its_workers_stop() {
    let env = roomy();
    env.sup
        .spawn(me(), req("owner", agent(&["--hang"])))
        .await
        .unwrap();
    create(
        &env,
        json!({"id": "slow", "owner": "owner", "instruction": "Do {t}", "input": "id,t\na,1\nb,2\nc,3\n",
               "id_column": "id", "concurrency": 1, "max_runtime_s": 1,
               "worker": worker(&["--item-delay", "700"])}),
    );
    env.sup.job_start(me(), "slow".into()).await.unwrap();
    let job = finished(&env, "slow", 20).await;
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    let store = env.sup.store().clone();
    let t = env.sup.tenant().clone();
    let events = store.events(&t, 0, Some(&name("owner")), 10_000).unwrap();
    let failed = events.iter().find(|e| e.kind == "job.failed").unwrap();
    assert!(
        failed.payload.contains("max_runtime_s"),
        "{}",
        failed.payload
    );
    let counts = store.item_counts(&t, "slow").unwrap();
    assert!(counts.contains(&(ItemStatus::Running, 0)), "{counts:?}");
    assert!(
        store
            .job_items(&t, "slow", Some(ItemStatus::Completed))
            .unwrap()
            .len()
            < 3,
        "cut short"
    );
    let stopped = eventually_async(Duration::from_secs(10), || {
        store
            .children(&t, &name("owner"))
            .unwrap()
            .iter()
            .all(|a| a.status.is_finished())
    })
    .await;
    assert!(stopped, "its workers are stopped");
    env.sup.cancel(me(), name("owner")).await.unwrap();
}
