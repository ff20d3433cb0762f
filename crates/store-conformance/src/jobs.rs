//! Jobs (SPEC 10): created whole or not at all; attempts fenced so an item
//! has one result; failures retried until the attempts run out, every
//! attempt kept; the job's own status machine.

use brood_core::{ItemStatus, JobStatus};
use brood_store::{AttemptOutcome, NewItem, NewJob};

use crate::*;

fn new_job(t: &TenantId, id: &str, owner: &str) -> NewJob {
    NewJob {
        tenant: t.clone(),
        id: id.to_owned(),
        owner: name(owner),
        spec: r#"{"instruction": "summarise {text}"}"#.to_owned(),
        source: None,
        created_ms: now(),
    }
}

fn items(ids: &[&str]) -> Vec<NewItem> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| NewItem {
            id: (*id).to_owned(),
            row_index: i as u32,
            input: format!(r#"{{"id": "{id}", "text": "row {i}"}}"#),
        })
        .collect()
}

fn statuses(store: &dyn Store, t: &TenantId, job: &str) -> Vec<(String, ItemStatus)> {
    store
        .job_items(t, job, None)
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.status))
        .collect()
}

pub fn jobs_are_created_whole_or_not_at_all(store: &dyn Store) {
    let t = tenant("conf-jobs-create");
    let owner = running(store, &t, "owner", None);
    let ev = [event(&owner.name, None, "job.created")];
    let j = store
        .create_job(&new_job(&t, "j1", "owner"), &items(&["a", "b", "c"]), &ev)
        .unwrap();
    assert_eq!(
        (j.status, j.total, j.owner.as_str()),
        (JobStatus::Pending, 3, "owner")
    );
    assert_eq!(store.job(&t, "j1").unwrap(), Some(j.clone()));
    assert_eq!(
        statuses(store, &t, "j1"),
        [
            ("a".into(), ItemStatus::Pending),
            ("b".into(), ItemStatus::Pending),
            ("c".into(), ItemStatus::Pending)
        ]
    );
    let counts = store.item_counts(&t, "j1").unwrap();
    assert_eq!(counts[0], (ItemStatus::Pending, 3));
    assert!(counts[1..].iter().all(|(_, n)| *n == 0), "{counts:?}");
    let before = store.events(&t, 0, None, 1000).unwrap().len();
    // Each refusal writes nothing.
    let (code, msg) = refusal(store.create_job(&new_job(&t, "j1", "owner"), &items(&["x"]), &ev));
    assert_eq!(code, Code::Conflict, "{msg}");
    let (code, msg) =
        refusal(store.create_job(&new_job(&t, "j2", "owner"), &items(&["a", "a"]), &ev));
    assert_eq!(code, Code::BadRequest);
    assert!(msg.contains("\"a\""), "{msg}");
    let (code, _) = refusal(store.create_job(&new_job(&t, "j3", "owner"), &[], &ev));
    assert_eq!(code, Code::BadRequest);
    let mut bad = items(&["a", "b"]);
    bad[1].input = "[1, 2]".into();
    let (code, msg) = refusal(store.create_job(&new_job(&t, "j4", "owner"), &bad, &ev));
    assert_eq!(code, Code::BadRequest);
    assert!(msg.contains("item \"b\""), "{msg}");
    assert!(matches!(
        store.create_job(&new_job(&t, "j5", "ghost"), &items(&["a"]), &[]),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.jobs(&t).unwrap(), [j]);
    assert_eq!(store.events(&t, 0, None, 1000).unwrap().len(), before);
    assert!(store.job(&t, "j4").unwrap().is_none());
    // Other tenants see none of it.
    assert!(
        store
            .jobs(&tenant("conf-jobs-create-other"))
            .unwrap()
            .is_empty()
    );
}

pub fn job_status_follows_its_machine(store: &dyn Store) {
    let t = tenant("conf-jobs-status");
    let owner = running(store, &t, "owner", None);
    store
        .create_job(&new_job(&t, "j", "owner"), &items(&["a"]), &[])
        .unwrap();
    let (code, msg) = refusal(store.set_job_status(&t, "j", JobStatus::Completed, now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("from pending to completed"), "{msg}");
    let at = now();
    let j = store
        .set_job_status(
            &t,
            "j",
            JobStatus::Running,
            at,
            &[event(&owner.name, None, "job.started")],
        )
        .unwrap();
    assert_eq!((j.status, j.started_ms), (JobStatus::Running, Some(at)));
    let j = store
        .set_job_status(&t, "j", JobStatus::Cancelled, now(), &[])
        .unwrap();
    assert!(j.ended_ms.is_some());
    let (code, _) = refusal(store.set_job_status(&t, "j", JobStatus::Running, now(), &[]));
    assert_eq!(code, Code::Conflict);
    let (code, _) = refusal(store.set_job_status(&t, "nope", JobStatus::Running, now(), &[]));
    assert_eq!(code, Code::NotFound);
    // A failed job reopens (its failed items retried): it keeps its first
    // start, and is no longer ended.
    store
        .create_job(&new_job(&t, "f", "owner"), &items(&["a"]), &[])
        .unwrap();
    let first = store
        .set_job_status(&t, "f", JobStatus::Running, at, &[])
        .unwrap();
    store
        .set_job_status(&t, "f", JobStatus::Failed, at + 5, &[])
        .unwrap();
    let j = store
        .set_job_status(&t, "f", JobStatus::Running, at + 10, &[])
        .unwrap();
    assert_eq!(
        (j.status, j.started_ms, j.ended_ms),
        (JobStatus::Running, first.started_ms, None)
    );
}

pub fn reports_are_fenced_and_an_item_has_one_result(store: &dyn Store) {
    let t = tenant("conf-jobs-fence");
    running(store, &t, "owner", None);
    let (w1, w2) = (name("w1"), name("w2"));
    store
        .create_job(&new_job(&t, "j", "owner"), &items(&["a"]), &[])
        .unwrap();
    // No attempt before the job runs.
    let (code, _) = refusal(store.start_attempt(&t, "j", "a", &w1, now(), &[]));
    assert_eq!(code, Code::Conflict);
    store
        .set_job_status(&t, "j", JobStatus::Running, now(), &[])
        .unwrap();
    let a = store.start_attempt(&t, "j", "a", &w1, now(), &[]).unwrap();
    assert_eq!((a.number, a.outcome), (1, AttemptOutcome::Running));
    // Only the current attempt's worker, for that attempt.
    let (code, msg) = refusal(store.report_result(&t, "j", "a", 1, &w2, r#"{"n": 1}"#, now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("belongs to w1"), "{msg}");
    let (code, _) = refusal(store.report_result(&t, "j", "a", 2, &w1, r#"{"n": 1}"#, now(), &[]));
    assert_eq!(code, Code::Conflict);
    let (code, _) = refusal(store.report_result(&t, "j", "a", 1, &w1, "not json", now(), &[]));
    assert_eq!(code, Code::BadRequest);
    let it = store
        .report_result(&t, "j", "a", 1, &w1, r#"{"n": 1}"#, now(), &[])
        .unwrap();
    assert_eq!(
        (it.status, it.result.as_deref()),
        (ItemStatus::Completed, Some(r#"{"n": 1}"#))
    );
    // A second report, a late failure, another attempt: all refused; one result.
    let (code, _) = refusal(store.report_result(&t, "j", "a", 1, &w1, r#"{"n": 2}"#, now(), &[]));
    assert_eq!(code, Code::Conflict);
    let (code, _) = refusal(store.fail_attempt(&t, "j", "a", 1, "late", 3, now(), &[]));
    assert_eq!(code, Code::Conflict);
    let (code, _) = refusal(store.start_attempt(&t, "j", "a", &w2, now(), &[]));
    assert_eq!(code, Code::Conflict);
    let it = &store
        .job_items(&t, "j", Some(ItemStatus::Completed))
        .unwrap()[0];
    assert_eq!(it.result.as_deref(), Some(r#"{"n": 1}"#));
    let attempts = store.attempts(&t, "j", "a").unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Completed);
    assert!(attempts[0].ended_ms.is_some());
}

pub fn failures_retry_until_the_attempts_run_out_and_every_attempt_is_kept(store: &dyn Store) {
    let t = tenant("conf-jobs-retry");
    running(store, &t, "owner", None);
    let w = name("w");
    store
        .create_job(&new_job(&t, "j", "owner"), &items(&["a"]), &[])
        .unwrap();
    store
        .set_job_status(&t, "j", JobStatus::Running, now(), &[])
        .unwrap();
    let at = now();
    store.start_attempt(&t, "j", "a", &w, at, &[]).unwrap();
    let it = store
        .fail_attempt(&t, "j", "a", 1, "exited without reporting", 2, at, &[])
        .unwrap();
    assert_eq!(it.status, ItemStatus::Pending);
    assert_eq!(it.last_error.as_deref(), Some("exited without reporting"));
    assert_eq!(
        it.not_before_ms,
        at + 1000,
        "a backoff before the next attempt"
    );
    let (code, msg) = refusal(store.start_attempt(&t, "j", "a", &w, at + 10, &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("backoff"), "{msg}");
    assert_eq!(
        store.next_pending_item(&t, "j", at + 10).unwrap(),
        None,
        "still in its backoff"
    );
    let next = store
        .next_pending_item(&t, "j", at + 1000)
        .unwrap()
        .unwrap();
    assert_eq!(next.id, "a");
    let a2 = store
        .start_attempt(&t, "j", "a", &w, at + 1000, &[])
        .unwrap();
    assert_eq!(a2.number, 2);
    // A stale failure of attempt 1 changes nothing.
    let (code, _) = refusal(store.fail_attempt(&t, "j", "a", 1, "stale", 2, at + 1001, &[]));
    assert_eq!(code, Code::Conflict);
    let it = store
        .fail_attempt(&t, "j", "a", 2, "timed out", 2, at + 1002, &[])
        .unwrap();
    assert_eq!(it.status, ItemStatus::Failed, "no attempt left");
    assert_eq!(
        store.item_counts(&t, "j").unwrap()[3],
        (ItemStatus::Failed, 1)
    );
    // Retried by hand: the count goes on, nothing is overwritten.
    let (code, _) = refusal(store.retry_item(&t, "j", "nope", now(), &[]));
    assert_eq!(code, Code::NotFound);
    let it = store.retry_item(&t, "j", "a", at + 2000, &[]).unwrap();
    assert_eq!((it.status, it.attempts), (ItemStatus::Pending, 2));
    let a3 = store
        .start_attempt(&t, "j", "a", &w, at + 2000, &[])
        .unwrap();
    assert_eq!(a3.number, 3);
    let attempts = store.attempts(&t, "j", "a").unwrap();
    let seen: Vec<(u32, AttemptOutcome, Option<&str>)> = attempts
        .iter()
        .map(|a| (a.number, a.outcome, a.error.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, AttemptOutcome::Failed, Some("exited without reporting")),
            (2, AttemptOutcome::Failed, Some("timed out")),
            (3, AttemptOutcome::Running, None),
        ]
    );
    let (code, _) = refusal(store.retry_item(&t, "j", "a", now(), &[]));
    assert_eq!(code, Code::Conflict, "only a failed item is retried");
}
