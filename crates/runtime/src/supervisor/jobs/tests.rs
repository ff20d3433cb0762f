//! The runner's decisions, on a real SQLite store, with the loop's part
//! played by the test: what it is asked to do, and in which order.

use brood_core::{AgentName, Code, ItemStatus, RunId, SessionName, TenantId};
use brood_store::NewEvent;
use serde_json::{Value, json};

use super::{Env, JobFollow, JobOp, Runner, RunningHere};
use crate::api::{ApiError, Caller};
use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};

use brood_store::prelude::*;
use brood_store::{NewAgent, NewItem, NewJob, Protocol, SqliteStore};
use tokio::sync::oneshot;

use crate::api::SpawnRequest;

fn name(s: &str) -> AgentName {
    AgentName::new(s).unwrap()
}

struct Here(HashSet<AgentName>);

impl RunningHere for Here {
    fn running(&self, agent: &AgentName) -> bool {
        self.0.contains(agent)
    }

    fn run_of(&self, _: &AgentName) -> Option<(RunId, SessionName)> {
        None
    }
}

/// A store with a running owner `lead` and its child `helper`, both live
/// here, and a pending job `books` of three items (`a b c`), two workers
/// at a time. `trace` is what happened, in order: each event as the
/// runner's projection saw it (`kind worker`), each follow-up as the loop
/// applied it.
struct Fixture {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    tenant: TenantId,
    here: Here,
    trace: RefCell<Vec<String>>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("brood.db")).unwrap();
        let tenant = TenantId::new("t").unwrap();
        for (seq, (n, parent)) in [("lead", None), ("helper", Some("lead"))]
            .into_iter()
            .enumerate()
        {
            let seq = seq as u64 + 1;
            let a = store
                .admit(
                    &NewAgent {
                        tenant: tenant.clone(),
                        name: name(n),
                        parent: parent.map(name),
                        customer: None,
                        session: SessionName::default_session(),
                        protocol: Protocol::Brood,
                        spec: r#"{"argv":["/bin/true"],"env":{},"cwd":"/"}"#.to_owned(),
                        handoff: String::new(),
                        supervisor: "sup".to_owned(),
                        run: RunId::v7(1_700_000_000_000 + seq, 0, seq),
                        now_ms: 1_700_000_000_000,
                    },
                    &[],
                )
                .unwrap();
            store
                .start_run(&tenant, &a.name, &a.run, 42, "/cg", 1_700_000_000_001, &[])
                .unwrap();
        }
        let spec = json!({"instruction": "Summarise {title}", "concurrency": 2,
                          "worker": {"argv": ["/bin/true"]}});
        let items: Vec<NewItem> = ["a", "b", "c"]
            .iter()
            .zip(1..)
            .map(|(id, row)| NewItem {
                id: (*id).to_owned(),
                row_index: row,
                input: json!({"title": format!("book {id}")}).to_string(),
            })
            .collect();
        let job = NewJob {
            tenant: tenant.clone(),
            id: "books".to_owned(),
            owner: name("lead"),
            spec: spec.to_string(),
            source: None,
            created_ms: 1_700_000_000_100,
        };
        store.create_job(&job, &items, &[]).unwrap();
        Fixture {
            _dir: dir,
            store,
            tenant,
            here: Here([name("lead"), name("helper")].into_iter().collect()),
            trace: RefCell::new(Vec::new()),
        }
    }

    fn with_env<R>(&self, f: impl FnOnce(&Env) -> R) -> R {
        let project = |events: &[NewEvent]| {
            for e in events {
                let p: Value = serde_json::from_str(&e.payload).unwrap();
                let worker = p["worker"].as_str().unwrap_or("-");
                self.trace.borrow_mut().push(format!("{} {worker}", e.kind));
            }
        };
        f(&Env {
            store: &self.store,
            tenant: &self.tenant,
            project: &project,
            agents: &self.here,
            tracer: &crate::trace::Tracer::default(),
        })
    }

    /// The follow-ups applied as the loop does, admission answering with
    /// `admission`; each is traced.
    fn settle(
        &self,
        r: &mut Runner,
        follows: Vec<JobFollow>,
        admission: &dyn Fn(&SpawnRequest) -> Result<(), ApiError>,
    ) {
        let mut todo = VecDeque::from(follows);
        while let Some(f) = todo.pop_front() {
            let more = match f {
                JobFollow::AdmitWorker { req, then } => {
                    let n = req.name.clone().unwrap();
                    self.trace.borrow_mut().push(format!("admit {n}"));
                    r.admitted(then, admission(&req))
                }
                JobFollow::Stop(a, t) => {
                    self.trace.borrow_mut().push(format!("stop {a} {t:?}"));
                    Vec::new()
                }
                JobFollow::Refused { worker, .. } => {
                    self.trace.borrow_mut().push(format!("refused {worker}"));
                    Vec::new()
                }
                JobFollow::Then(step) => self.with_env(|env| r.resume(step, env)),
            };
            for m in more.into_iter().rev() {
                todo.push_front(m);
            }
        }
    }

    /// What was traced since the last call.
    fn traced_all(&self) -> Vec<String> {
        std::mem::take(&mut *self.trace.borrow_mut())
    }

    /// [`Self::traced_all`] without `job.progress`, which comes when a
    /// second has passed.
    fn traced(&self) -> Vec<String> {
        let mut t = self.traced_all();
        t.retain(|e| !e.starts_with("job.progress"));
        t
    }

    fn item(&self, id: &str) -> brood_store::JobItem {
        self.store
            .job_items(&self.tenant, "books", None)
            .unwrap()
            .into_iter()
            .find(|it| it.id == id)
            .unwrap()
    }

    /// `books` started, and topped up after the command as the loop does.
    fn started(&self, admission: &dyn Fn(&SpawnRequest) -> Result<(), ApiError>) -> Runner {
        let mut r = Runner::new(None);
        let (tx, mut rx) = oneshot::channel();
        let f = self.with_env(|env| r.op(&operator(), JobOp::Start("books".into(), tx), env));
        assert!(f.is_empty());
        assert_eq!(rx.try_recv().unwrap().unwrap().status, "running");
        let f = self.with_env(|env| r.drive(env));
        self.settle(&mut r, f, admission);
        r
    }

    fn tick(&self, r: &mut Runner) {
        let f = self.with_env(|env| r.tick(env));
        self.settle(r, f, &|_| panic!("no worker is admitted on the clock"));
    }
}

fn operator() -> Caller {
    Caller::User { uid: 0 }
}

fn admit_all(_: &SpawnRequest) -> Result<(), ApiError> {
    Ok(())
}

/// The attempt `worker` holds is past its `item_timeout_s`.
fn expire(r: &mut Runner, worker: &str) {
    r.workers
        .get_mut(&name(worker))
        .unwrap()
        .item
        .as_mut()
        .unwrap()
        .2 = 0;
}

#[test]
fn a_started_job_asks_for_its_workers_one_admission_at_a_time() {
    let fx = Fixture::new();
    let r = fx.started(&admit_all);
    assert_eq!(
        fx.traced(),
        [
            "job.started -",
            "job.item.started books-w1",
            "admit books-w1",
            "job.item.started books-w2",
            "admit books-w2",
        ]
    );
    assert_eq!(r.runs["books"].workers, 2);
    assert_eq!(fx.item("c").status, ItemStatus::Pending);
}

#[test]
fn a_timed_out_attempt_of_an_own_worker_stops_it() {
    let fx = Fixture::new();
    let mut r = fx.started(&admit_all);
    fx.traced();
    expire(&mut r, "books-w1");
    fx.tick(&mut r);
    assert_eq!(
        fx.traced(),
        ["job.item.failed books-w1", "stop books-w1 Failed(TimedOut)",]
    );
    let a = fx.item("a");
    assert_eq!(a.attempts, 1);
    assert_eq!(
        a.last_error.as_deref(),
        Some("the attempt timed out (item_timeout_s)")
    );
    // It stays the job's until it has ended.
    assert!(r.workers.contains_key(&name("books-w1")));
}

#[test]
fn a_timed_out_attempt_of_an_assigned_agent_stops_nothing() {
    let fx = Fixture::new();
    let mut r = Runner::new(None);
    let (tx, _rx) = oneshot::channel();
    fx.with_env(|env| r.op(&operator(), JobOp::Start("books".into(), tx), env));
    let (tx, mut rx) = oneshot::channel();
    let assign = JobOp::Assign {
        job: "books".into(),
        item: "b".into(),
        worker: Some(name("helper")),
        reply: tx,
    };
    let f = fx.with_env(|env| r.op(&operator(), assign, env));
    assert!(f.is_empty());
    let a = rx.try_recv().unwrap().unwrap();
    assert_eq!(a.assigned, "helper");
    fx.traced();
    expire(&mut r, "helper");
    fx.tick(&mut r);
    assert_eq!(fx.traced(), ["job.item.failed helper"]);
    assert!(!r.workers.contains_key(&name("helper")));
    // Its late report is refused.
    let (tx, mut rx) = oneshot::channel();
    let report = JobOp::Report(json!({"result": "late"}), tx);
    fx.with_env(|env| r.op(&Caller::Agent(name("helper")), report, env));
    assert_eq!(rx.try_recv().unwrap().unwrap_err().code, Code::Forbidden);
}

#[test]
fn a_cancel_stops_each_own_worker_after_failing_its_attempt_then_answers() {
    let fx = Fixture::new();
    let mut r = fx.started(&admit_all);
    let (tx, _rx) = oneshot::channel();
    let assign = JobOp::Assign {
        job: "books".into(),
        item: "c".into(),
        worker: Some(name("helper")),
        reply: tx,
    };
    fx.with_env(|env| r.op(&operator(), assign, env));
    fx.traced();
    let (tx, mut rx) = oneshot::channel();
    let f = fx.with_env(|env| r.op(&operator(), JobOp::Cancel("books".into(), tx), env));
    // Nothing is answered before the workers are dealt with.
    assert!(rx.try_recv().is_err());
    fx.settle(&mut r, f, &|_| panic!("no worker is admitted by a cancel"));
    assert_eq!(rx.try_recv().unwrap().unwrap().status, "cancelled");
    let trace = fx.traced_all();
    // Each own worker is stopped right after its attempt failed; the agent
    // it only assigned to is not the job's to stop.
    for w in ["books-w1", "books-w2"] {
        let failed = trace
            .iter()
            .position(|t| *t == format!("job.item.failed {w}"))
            .unwrap();
        assert_eq!(
            trace[failed + 1],
            format!("stop {w} Cancelled(JobCancelled)")
        );
    }
    assert!(trace.contains(&"job.item.failed helper".to_owned()));
    assert!(!trace.iter().any(|t| t.starts_with("stop helper")));
    assert_eq!(
        &trace[trace.len() - 2..],
        ["job.progress -", "job.cancelled -"]
    );
    assert!(r.workers.is_empty() && !r.runs_job("books"));
}

#[test]
fn a_refused_worker_is_noted_its_attempt_failed_and_no_other_asked_for() {
    let fx = Fixture::new();
    let refuse = |_: &SpawnRequest| Err(ApiError::new(Code::QuotaFanout, "too many children"));
    let r = fx.started(&refuse);
    assert_eq!(
        fx.traced(),
        [
            "job.started -",
            "job.item.started books-w1",
            "admit books-w1",
            "refused books-w1",
            "job.item.failed books-w1",
        ]
    );
    let a = fx.item("a");
    assert!(
        a.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("the worker could not be created: ")),
        "{:?}",
        a.last_error
    );
    assert!(r.workers.is_empty());
    assert_eq!(r.runs["books"].workers, 0);
}

#[test]
fn an_assign_to_a_new_worker_is_answered_once_admission_is_known() {
    let fx = Fixture::new();
    let mut r = Runner::new(None);
    let (tx, _rx) = oneshot::channel();
    fx.with_env(|env| r.op(&operator(), JobOp::Start("books".into(), tx), env));
    let (tx, mut rx) = oneshot::channel();
    let assign = JobOp::Assign {
        job: "books".into(),
        item: "c".into(),
        worker: None,
        reply: tx,
    };
    let f = fx.with_env(|env| r.op(&operator(), assign, env));
    assert!(rx.try_recv().is_err());
    let refuse = |_: &SpawnRequest| Err(ApiError::new(Code::QuotaFanout, "too many children"));
    fx.settle(&mut r, f, &refuse);
    assert_eq!(rx.try_recv().unwrap().unwrap_err().code, Code::QuotaFanout);
    assert_eq!(fx.item("c").attempts, 1);
}

#[test]
fn a_repeated_report_is_answered_and_recorded_once() {
    let fx = Fixture::new();
    let mut r = fx.started(&admit_all);
    fx.traced();
    let report = |r: &mut Runner, args: Value| {
        let (tx, mut rx) = oneshot::channel();
        let f = fx.with_env(|env| {
            r.op(
                &Caller::Agent(name("books-w1")),
                JobOp::Report(args, tx),
                env,
            )
        });
        fx.settle(r, f, &admit_all);
        rx.try_recv().unwrap()
    };
    let first = report(&mut r, json!({"result": {"n": 1}, "stop": true})).unwrap();
    assert!(first.accepted && first.next.is_none());
    assert_eq!(fx.traced(), ["job.item.completed books-w1"]);
    // Its answer lost, the worker says it again, with or without the item:
    // answered, nothing recorded.
    for again in [
        json!({"result": {"n": 1}, "stop": true}),
        json!({"job": "books", "item": "a", "result": {"n": 1}}),
    ] {
        let r2 = report(&mut r, again.clone()).unwrap();
        assert!(r2.accepted && r2.next.is_none(), "{again}");
        assert_eq!(fx.traced(), Vec::<String>::new(), "{again}");
    }
    let a = fx.item("a");
    assert_eq!((a.status, a.attempts), (ItemStatus::Completed, 1));
    assert_eq!(a.result.as_deref(), Some(r#"{"n":1}"#));
    // A different result for it is no repeat: refused, as before.
    let e = report(&mut r, json!({"result": {"n": 2}})).unwrap_err();
    assert_eq!(e.code, Code::Conflict);
    let e = report(&mut r, json!({"item": "a", "result": {"n": 2}})).unwrap_err();
    assert_eq!(e.code, Code::Conflict);
}
