//! Running jobs (SPEC 10) on the dispatcher: a started job keeps up to
//! `concurrency` workers (children of its owner) busy; each worker is given
//! an item when it starts (its task is the item's instruction) and the next
//! one in the reply to each `job.report`, until none is left or it asks to
//! stop. A report is accepted only from the worker holding the item's current
//! attempt, and only if it satisfies the output schema; anything else fails
//! the attempt. A worker that ends without reporting fails its attempt. The
//! job ends `completed` when every item has its result, `failed` when some
//! ran out of attempts (or it ran past `max_runtime_s`), `cancelled` when
//! cancelled or its owner ended while it ran.
//!
//! Durable across a crash: the store holds every job, item and attempt. At
//! start the items a dead incarnation was running get a failed attempt
//! (`runtime_restart`) that does not count against `max_attempts`, and a job
//! still `running` is taken up again as soon as its owner runs here (after
//! `brood resume OWNER`, since a crash cancels every agent).
//!
//! Workers that end are noted in `gone` and dealt with after the command
//! (never inside a stop), and jobs are topped up with workers only then.
//!
//! - `mod.rs`: the runner's state, start, cancel, ending a job, recovery,
//!   taking up running jobs, progress;
//! - `work.rs`: items to workers (assignment, reports, failures, timeouts);
//! - `control.rs`: an operator's or owner's hand on items (assign, retry).

mod control;
mod work;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use brood_core::{ItemStatus, JobStatus};
use brood_store::Job;

use super::{Dispatcher, Reply, answer, ev_value, now_ms};
use crate::api::ApiError;
use crate::api::Caller;
use crate::api::internal;
use brood_core::AgentName;
use brood_core::CancelReason;
use brood_core::Code;
use brood_core::SessionName;
use brood_core::Terminal;
use brood_store::NewEvent;
use brood_store::StoreError;
use serde_json::Value;
use serde_json::json;

/// What the dispatcher is asked to do with a job (SPEC 10 "Control"), each
/// with where its typed answer goes.
pub(crate) enum JobOp {
    Start(String, Reply<brood_api::JobView>),
    Cancel(String, Reply<brood_api::JobView>),
    /// A worker's `job.report {job?, item?, result, stop?}`.
    Report(Value, Reply<brood_api::ReportReply>),
    /// The item's next attempt now: on `worker` (a live agent under the
    /// job's owner that holds no item), or on a new worker.
    Assign {
        job: String,
        item: String,
        worker: Option<AgentName>,
        reply: Reply<brood_api::AssignReply>,
    },
    /// A failed item (or, without one, every failed item) back to pending.
    Retry {
        job: String,
        item: Option<String>,
        reply: Reply<brood_api::RetryReply>,
    },
}

/// The error every attempt a crashed incarnation was running ends with.
pub const RUNTIME_RESTART: &str = "runtime_restart";

/// At most one `job.progress` a second per job (and one as it ends).
const PROGRESS_EVERY_MS: i64 = 1000;

#[derive(Default)]
pub(super) struct Runner {
    runs: HashMap<String, JobRun>,
    /// What each live worker holds.
    workers: HashMap<AgentName, Work>,
    /// Workers that left the live set since the last command ended.
    gone: Vec<AgentName>,
    /// Jobs to top up with workers (or to finish) after this command.
    dirty: BTreeSet<String>,
    /// Whether the attempts of a dead incarnation were failed yet.
    recovered: bool,
}

struct JobRun {
    owner: AgentName,
    instruction: String,
    schema: Option<Value>,
    concurrency: usize,
    max_attempts: u32,
    item_timeout_ms: i64,
    /// When the job fails for `max_runtime_s`.
    deadline_ms: Option<i64>,
    argv: Vec<String>,
    policy: Option<Value>,
    /// Workers this runner started that are live (at most `concurrency`).
    workers: usize,
    next_worker: u32,
    /// Items by status, kept in step with the store's so that no command
    /// has to count a large job's items.
    counts: BTreeMap<ItemStatus, u32>,
    progress: Progress,
}

struct Progress {
    /// Since when the rate is measured, and how many items were done then.
    since_ms: i64,
    done_then: u32,
    last_ms: i64,
    changed: bool,
}

struct Work {
    job: String,
    /// The item and attempt it holds now, and when that attempt times out.
    item: Option<(String, u32, i64)>,
    /// Started by this runner (counted in its job's `workers`), not an agent
    /// given an item by `assign`.
    own: bool,
}

impl JobRun {
    fn count(&self, s: ItemStatus) -> u32 {
        self.counts.get(&s).copied().unwrap_or(0)
    }

    /// An item moved from one status to another.
    fn moved(&mut self, from: ItemStatus, to: ItemStatus) {
        if from == to {
            return;
        }
        if let Some(n) = self.counts.get_mut(&from) {
            *n = n.saturating_sub(1);
        }
        *self.counts.entry(to).or_insert(0) += 1;
        self.progress.changed = true;
    }

    fn done(&self) -> u32 {
        self.count(ItemStatus::Completed)
            + self.count(ItemStatus::Failed)
            + self.count(ItemStatus::Reported)
    }
}

impl Runner {
    /// Whether this runner runs job `id` now.
    pub(super) fn runs_job(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    pub(super) fn note_gone(&mut self, name: &AgentName) {
        if self.workers.contains_key(name) {
            self.gone.push(name.clone());
        }
    }
}

fn job_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Refused { code, message } => ApiError::new(code, message),
        other => internal(other),
    }
}

fn counts_json(counts: &BTreeMap<ItemStatus, u32>) -> Value {
    let m: serde_json::Map<String, Value> = ItemStatus::ALL
        .iter()
        .map(|s| {
            (
                s.as_str().to_owned(),
                json!(counts.get(s).copied().unwrap_or(0)),
            )
        })
        .collect();
    Value::Object(m)
}

impl Dispatcher {
    pub(super) fn on_job(&mut self, caller: &Caller, op: JobOp) {
        match op {
            JobOp::Start(id, reply) => answer(reply, self.on_job_start(caller, &id)),
            JobOp::Cancel(id, reply) => answer(reply, self.on_job_cancel(caller, &id)),
            JobOp::Report(args, reply) => {
                let r = match caller {
                    Caller::Agent(me) => self.on_job_report(me, &args),
                    Caller::User { .. } => Err(ApiError::new(
                        Code::Forbidden,
                        "a report comes from the worker holding the item, not from the operator",
                    )),
                };
                answer(reply, r)
            }
            JobOp::Assign {
                job,
                item,
                worker,
                reply,
            } => answer(
                reply,
                self.on_job_assign(caller, &job, &item, worker.as_ref()),
            ),
            JobOp::Retry { job, item, reply } => {
                answer(reply, self.on_job_retry(caller, &job, item.as_deref()))
            }
        }
    }

    /// The owner is not (or no more) running here: no worker starts under it.
    fn owner_gone(&self, owner: &AgentName) -> bool {
        self.agents
            .live
            .get(owner)
            .is_none_or(|l| l.stopping.is_some())
    }

    pub(super) fn job_event(&self, owner: &AgentName, payload: Value) -> Vec<NewEvent> {
        let (run, session) = match self.agents.live.get(owner) {
            Some(l) => (Some(l.run.clone()), l.session.clone()),
            None => (None, SessionName::default_session()),
        };
        vec![ev_value(owner, run.as_ref(), &session, payload)]
    }

    /// The runner's view of a job from its record: its spec read, its
    /// counts loaded.
    fn load_run(&self, job: &Job) -> Result<JobRun, ApiError> {
        let id = &job.id;
        let spec: Value = serde_json::from_str(&job.spec).unwrap_or(Value::Null);
        let worker = &spec["worker"];
        let argv: Vec<String> = match worker["argv"].as_array() {
            Some(a) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            None => {
                let exe = self
                    .host
                    .brood_exe
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "brood".into());
                // The reference agent as a worker reports its answer as the
                // item's result (`--job-worker`), with the configuration the
                // job gave it.
                let mut v = vec![exe, "agent".to_owned(), "--job-worker".to_owned()];
                for (key, flag) in [
                    ("type", "--type"),
                    ("provider", "--provider"),
                    ("model", "--model"),
                    ("config", "--config"),
                ] {
                    if let Some(x) = worker[key].as_str() {
                        v.extend([flag.to_owned(), x.to_owned()]);
                    }
                }
                v
            }
        };
        if argv.is_empty() {
            return Err(ApiError::new(
                Code::BadRequest,
                format!("job {id}: worker.argv is empty"),
            ));
        }
        let counts: BTreeMap<ItemStatus, u32> = self
            .records
            .store
            .item_counts(&self.records.tenant, id)
            .map_err(job_error)?
            .into_iter()
            .collect();
        let now = now_ms();
        let started = job.started_ms.unwrap_or(now);
        let mut run = JobRun {
            owner: job.owner.clone(),
            instruction: spec["instruction"].as_str().unwrap_or_default().to_owned(),
            schema: spec.get("output_schema").filter(|s| !s.is_null()).cloned(),
            concurrency: spec["concurrency"].as_u64().unwrap_or(8).max(1) as usize,
            max_attempts: spec["max_attempts"].as_u64().unwrap_or(3).max(1) as u32,
            item_timeout_ms: spec["item_timeout_s"]
                .as_u64()
                .unwrap_or(1800)
                .saturating_mul(1000) as i64,
            deadline_ms: spec["max_runtime_s"]
                .as_u64()
                .map(|s| started.saturating_add(s.saturating_mul(1000) as i64)),
            argv,
            policy: worker.get("policy").filter(|p| !p.is_null()).cloned(),
            workers: 0,
            next_worker: 0,
            counts,
            progress: Progress {
                since_ms: now,
                done_then: 0,
                last_ms: now,
                changed: false,
            },
        };
        run.progress.done_then = run.done();
        // Worker names go on from the ones a job already used, so a taken-up
        // job never asks for a name its earlier workers hold.
        run.next_worker = self
            .records
            .store
            .children(&self.records.tenant, &job.owner)
            .map(|cs| {
                cs.iter()
                    .filter_map(|a| {
                        a.name
                            .as_str()
                            .strip_prefix(&format!("{id}-w"))
                            .and_then(|n| n.parse::<u32>().ok())
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        Ok(run)
    }

    pub(super) fn on_job_start(
        &mut self,
        caller: &Caller,
        id: &str,
    ) -> Result<brood_api::JobView, ApiError> {
        let store = self.records.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.records.tenant, caller, id)?;
        let owner = job.owner.clone();
        if self.owner_gone(&owner) {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "job {id}: its owner {owner} is not running on this supervisor; a job runs while its owner does"
                ),
            ));
        }
        let mut run = self.load_run(&job)?;
        let events = self.job_event(&owner, json!({"type": "job.started", "job": id}));
        let job = self
            .records
            .store
            .set_job_status(
                &self.records.tenant,
                id,
                JobStatus::Running,
                now_ms(),
                &events,
            )
            .map_err(job_error)?;
        self.records.project_events(&events);
        if let (Some(s), Some(started)) = (job_spec_runtime(&job), job.started_ms) {
            run.deadline_ms = Some(started.saturating_add(s));
        }
        self.jobs.runs.insert(id.to_owned(), run);
        self.jobs.dirty.insert(id.to_owned());
        crate::jobs::view(self.records.store.as_ref(), &job)
    }

    pub(super) fn on_job_cancel(
        &mut self,
        caller: &Caller,
        id: &str,
    ) -> Result<brood_api::JobView, ApiError> {
        let store = self.records.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.records.tenant, caller, id)?;
        job.status
            .transition(JobStatus::Cancelled)
            .map_err(|e| ApiError::new(Code::Conflict, format!("job {id}: {e}")))?;
        let job = self.end_job(id, &job.owner, JobStatus::Cancelled, None)?;
        crate::jobs::view(self.records.store.as_ref(), &job)
    }

    /// Ends a job: no more assignment, its workers' attempts failed with the
    /// reason and the workers stopped (completed items are kept as they are),
    /// a last `job.progress`, then the status with its event.
    fn end_job(
        &mut self,
        id: &str,
        owner: &AgentName,
        to: JobStatus,
        reason: Option<&str>,
    ) -> Result<Job, ApiError> {
        let (kind, why) = match to {
            JobStatus::Completed => ("job.completed", "the job completed"),
            JobStatus::Failed => ("job.failed", "the job failed"),
            _ => ("job.cancelled", "the job was cancelled"),
        };
        let why = reason.unwrap_or(why);
        // Workers still at work are stopped when the job is cancelled or cut
        // short; a job that ran out of items has only idle workers, which end
        // on their own when told there is no next item.
        let stop = (to == JobStatus::Cancelled || reason.is_some())
            .then_some(Terminal::Cancelled(CancelReason::JobCancelled));
        let mine: Vec<AgentName> = self
            .jobs
            .workers
            .iter()
            .filter(|(_, w)| w.job == id)
            .map(|(n, _)| n.clone())
            .collect();
        for w in mine {
            self.fail_work(&w, why);
            let own = self.jobs.workers.remove(&w).is_some_and(|w| w.own);
            // An agent given an item by `assign` is not the job's to stop.
            if let Some(t) = stop
                && own
            {
                self.stop_subtree(&w, t);
            }
        }
        self.emit_progress(id, true);
        let counts = match self.jobs.runs.remove(id) {
            Some(r) => counts_json(&r.counts),
            None => {
                let c = self
                    .records
                    .store
                    .item_counts(&self.records.tenant, id)
                    .map_err(job_error)?
                    .into_iter()
                    .collect();
                counts_json(&c)
            }
        };
        let mut payload = json!({"type": kind, "job": id, "counts": counts});
        if let Some(r) = reason {
            payload["reason"] = json!(r);
        }
        let events = self.job_event(owner, payload);
        let job = self
            .records
            .store
            .set_job_status(&self.records.tenant, id, to, now_ms(), &events)
            .map_err(job_error)?;
        self.records.project_events(&events);
        Ok(job)
    }

    /// What the runner does on the sweepers' clock: once, the attempts a
    /// dead incarnation was running are failed; running jobs whose owner
    /// runs here are taken up; attempts and jobs past their time end;
    /// progress is told.
    pub(super) fn job_tick(&mut self) {
        if !self.jobs.recovered {
            self.jobs.recovered = true;
            self.recover_jobs();
        }
        self.take_up_jobs();
        self.job_timeouts();
        let ids: Vec<String> = self.jobs.runs.keys().cloned().collect();
        for id in ids {
            self.emit_progress(&id, false);
        }
    }

    /// Items left `running` by a dead incarnation (their worker is no live
    /// agent of this runner): a failed attempt each, `runtime_restart`, that
    /// does not use up the item's attempts; what was completed stays as it is.
    fn recover_jobs(&mut self) {
        let jobs = match self.records.store.jobs(&self.records.tenant) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(error = %e, "reading jobs to recover");
                return;
            }
        };
        for job in jobs.iter().filter(|j| j.status == JobStatus::Running) {
            let items = match self.records.store.job_items(
                &self.records.tenant,
                &job.id,
                Some(ItemStatus::Running),
            ) {
                Ok(i) => i,
                Err(e) => {
                    tracing::error!(job = job.id, error = %e, "reading running items");
                    continue;
                }
            };
            for it in items {
                if it
                    .worker
                    .as_ref()
                    .is_some_and(|w| self.jobs.workers.contains_key(w))
                {
                    continue;
                }
                let events = self.job_event(
                    &job.owner,
                    json!({"type": "job.item.failed", "job": job.id, "item": it.id, "attempt": it.attempts,
                           "worker": it.worker.as_ref().map(|w| w.as_str()), "error": RUNTIME_RESTART}),
                );
                match self.records.store.fail_attempt(
                    &self.records.tenant,
                    &job.id,
                    &it.id,
                    it.attempts,
                    RUNTIME_RESTART,
                    u32::MAX,
                    now_ms(),
                    &events,
                ) {
                    Ok(_) => self.records.project_events(&events),
                    Err(e) => {
                        tracing::warn!(job = job.id, item = it.id, error = %e, "failing a crashed attempt")
                    }
                }
            }
        }
    }

    /// Running jobs this runner does not run yet whose owner runs here (a
    /// job taken up after a restart, once its owner is resumed).
    fn take_up_jobs(&mut self) {
        let Ok(jobs) = self.records.store.jobs(&self.records.tenant) else {
            return;
        };
        for job in jobs {
            if job.status != JobStatus::Running
                || self.jobs.runs.contains_key(&job.id)
                || self.owner_gone(&job.owner)
            {
                continue;
            }
            match self.load_run(&job) {
                Ok(run) => {
                    tracing::info!(job = job.id, "taking up a running job");
                    self.jobs.runs.insert(job.id.clone(), run);
                    self.jobs.dirty.insert(job.id);
                }
                Err(e) => tracing::warn!(job = job.id, error = %e, "taking up a job"),
            }
        }
    }

    /// `job.progress`: counts by status, items a second, and an ETA, when
    /// something changed (at most once a second, unless `last`).
    fn emit_progress(&mut self, id: &str, last: bool) {
        let now = now_ms();
        let Some(run) = self.jobs.runs.get_mut(id) else {
            return;
        };
        if !run.progress.changed || (!last && now - run.progress.last_ms < PROGRESS_EVERY_MS) {
            return;
        }
        run.progress.changed = false;
        run.progress.last_ms = now;
        let done = run.done();
        let total: u32 = run.counts.values().sum();
        let elapsed_s = (now - run.progress.since_ms).max(1) as f64 / 1000.0;
        let rate = f64::from(done.saturating_sub(run.progress.done_then)) / elapsed_s;
        let left = total.saturating_sub(done);
        let eta_s = if left == 0 {
            Some(0.0)
        } else if rate > 0.0 {
            Some((f64::from(left) / rate * 10.0).round() / 10.0)
        } else {
            None
        };
        let payload = json!({
            "type": "job.progress", "job": id, "counts": counts_json(&run.counts),
            "total": total, "done": done, "items_per_s": (rate * 10.0).round() / 10.0,
            "eta_s": eta_s,
        });
        let owner = run.owner.clone();
        let events = self.job_event(&owner, payload);
        match self
            .records
            .store
            .append_events(&self.records.tenant, &events, now)
        {
            Ok(_) => self.records.project_events(&events),
            Err(e) => tracing::warn!(job = id, error = %e, "recording job progress"),
        }
    }
}

/// `max_runtime_s` in milliseconds, from a job's spec.
fn job_spec_runtime(job: &Job) -> Option<i64> {
    let spec: Value = serde_json::from_str(&job.spec).ok()?;
    spec["max_runtime_s"]
        .as_u64()
        .map(|s| s.saturating_mul(1000) as i64)
}
