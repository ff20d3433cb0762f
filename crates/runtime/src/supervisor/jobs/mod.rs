//! Running jobs (SPEC 10): the runner, a part of the supervisor that owns
//! the jobs it runs and their workers. A started job keeps up to
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
//! The runner knows no other part. Each call is lent what it reads
//! ([`Env`]: the store and tenant, where recorded events go, whether an
//! agent runs here) and records its own decisions in the store; what another
//! part must do (admit a worker, stop one, note a refused one) it returns as
//! [`JobFollow`]s, in order, for the loop to apply
//! (`supervisor::route::jobs`), and what admission said comes back through
//! [`Runner::admitted`]. A caller is answered by the runner once the answer
//! is known: at once, or when the step that knows it runs.
//!
//! Durable across a crash: the store holds every job, item and attempt. At
//! start the items a dead incarnation was running get a failed attempt
//! (`runtime_restart`) that does not count against `max_attempts`, and a job
//! still `running` is taken up again as soon as its owner runs here (after
//! `brood resume OWNER`, since a crash cancels every agent).
//!
//! Workers that end are noted in `gone` and dealt with after the command
//! ([`Runner::drive`]; never inside a stop), and jobs are topped up with
//! workers only then.
//!
//! - `mod.rs`: the runner's state, what it is lent, start, cancel, ending a
//!   job, recovery, taking up running jobs, progress;
//! - `follow.rs`: the entry points the loop calls (a command, the clock,
//!   after each command) and the follow-ups and steps they return;
//! - `work.rs`: items to workers (assignment, reports, failures, a job's
//!   next worker, its end when done);
//! - `control.rs`: an operator's or owner's hand on items (assign, retry).

mod control;
mod follow;
mod work;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use brood_core::{AgentName, CancelReason, Code, ItemStatus, JobStatus, RunId, SessionName};
use brood_core::{TenantId, Terminal};
use brood_store::{Job, NewEvent, Store, StoreError};
use serde_json::{Value, json};

use super::{Reply, ev_value, now_ms};
use crate::api::{ApiError, Caller, internal};
pub(super) use follow::JobFollow;
use follow::Step;

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

/// What the runner reads of the rest of the supervisor, lent for one call:
/// the store it records jobs in, where a recorded event goes next, and the
/// agents running here. Nothing in it lets the runner act on another part;
/// what it needs done elsewhere it returns ([`JobFollow`]).
pub(in crate::supervisor) struct Env<'a> {
    pub(in crate::supervisor) store: &'a dyn Store,
    pub(in crate::supervisor) tenant: &'a TenantId,
    /// Called with events once the store holds them (the ctx projection).
    pub(in crate::supervisor) project: &'a dyn Fn(&[NewEvent]),
    pub(in crate::supervisor) agents: &'a dyn RunningHere,
    /// Where an ended job's span goes (issue 30).
    pub(in crate::supervisor) tracer: &'a crate::trace::Tracer,
}

/// The runner's view of the agents this supervisor runs.
pub(in crate::supervisor) trait RunningHere {
    /// `agent` runs here, its process started, and no stop covers it: an
    /// owner whose jobs may start workers, an agent that may be given an
    /// item.
    fn running(&self, agent: &AgentName) -> bool;
    /// The run and session of `agent` while it is live here (stopping or
    /// not): where the events of its jobs go.
    fn run_of(&self, agent: &AgentName) -> Option<(RunId, SessionName)>;
}

/// The jobs this supervisor runs and their workers: the part that owns
/// them. Its methods record what they decide in the store themselves and
/// return, as [`JobFollow`]s, what another part must do.
pub(in crate::supervisor) struct Runner {
    runs: HashMap<String, JobRun>,
    /// What each live worker holds.
    workers: HashMap<AgentName, Work>,
    /// Workers that left the live set since the last command ended.
    gone: Vec<AgentName>,
    /// Jobs to top up with workers (or to finish) after this command.
    dirty: BTreeSet<String>,
    /// Whether the attempts of a dead incarnation were failed yet.
    recovered: bool,
    /// This binary: the program of a worker whose job names none (the
    /// reference agent).
    brood_exe: Option<PathBuf>,
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
    /// The item and result (JSON text) of its last accepted report: a
    /// repeat of it is answered, not recorded again.
    last: Option<(String, String)>,
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

/// A job's event, in its owner's log: in its current run and session while
/// it is live here, else in its default session.
pub(in crate::supervisor) fn job_event(
    agents: &dyn RunningHere,
    owner: &AgentName,
    payload: Value,
) -> Vec<NewEvent> {
    let (run, session) = match agents.run_of(owner) {
        Some((run, session)) => (Some(run), session),
        None => (None, SessionName::default_session()),
    };
    vec![ev_value(owner, run.as_ref(), &session, payload)]
}

impl Runner {
    /// What it holds (`held`): the jobs run here, and their live workers
    /// with those that left since the last command.
    pub(in crate::supervisor) fn held(&self) -> (usize, usize) {
        (self.runs.len(), self.workers.len() + self.gone.len())
    }

    pub(in crate::supervisor) fn new(brood_exe: Option<PathBuf>) -> Runner {
        Runner {
            runs: HashMap::new(),
            workers: HashMap::new(),
            gone: Vec::new(),
            dirty: BTreeSet::new(),
            recovered: false,
            brood_exe,
        }
    }

    /// Whether this runner runs job `id` now.
    pub(in crate::supervisor) fn runs_job(&self, id: &str) -> bool {
        self.runs.contains_key(id)
    }

    /// `name` left the live set: if it was a worker, its end is dealt with
    /// after the command ([`Runner::drive`]), never inside whatever removed it.
    pub(in crate::supervisor) fn note_gone(&mut self, name: &AgentName) {
        if self.workers.contains_key(name) {
            self.gone.push(name.clone());
        }
    }

    /// The runner's view of a job from its record: its spec read, its
    /// counts loaded.
    fn load_run(&self, job: &Job, env: &Env) -> Result<JobRun, ApiError> {
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
        let counts: BTreeMap<ItemStatus, u32> = env
            .store
            .item_counts(env.tenant, id)
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
        run.next_worker = env
            .store
            .children(env.tenant, &job.owner)
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

    fn start(
        &mut self,
        caller: &Caller,
        id: &str,
        env: &Env,
    ) -> Result<brood_api::JobView, ApiError> {
        let job = crate::jobs::get(env.store, env.tenant, caller, id)?;
        let owner = job.owner.clone();
        if !env.agents.running(&owner) {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "job {id}: its owner {owner} is not running on this supervisor; a job runs while its owner does"
                ),
            ));
        }
        let mut run = self.load_run(&job, env)?;
        let events = job_event(
            env.agents,
            &owner,
            json!({"type": "job.started", "job": id}),
        );
        let job = env
            .store
            .set_job_status(env.tenant, id, JobStatus::Running, now_ms(), &events)
            .map_err(job_error)?;
        (env.project)(&events);
        if let (Some(s), Some(started)) = (job_spec_runtime(&job), job.started_ms) {
            run.deadline_ms = Some(started.saturating_add(s));
        }
        self.runs.insert(id.to_owned(), run);
        self.dirty.insert(id.to_owned());
        crate::jobs::view(env.store, &job)
    }

    /// `cancel`: the job ends `cancelled` ([`Runner::end_job`]); the caller
    /// is answered once it has.
    fn cancel(
        &mut self,
        caller: &Caller,
        id: &str,
        reply: Reply<brood_api::JobView>,
        env: &Env,
    ) -> Vec<JobFollow> {
        let job = crate::jobs::get(env.store, env.tenant, caller, id).and_then(|job| {
            job.status
                .transition(JobStatus::Cancelled)
                .map_err(|e| ApiError::new(Code::Conflict, format!("job {id}: {e}")))?;
            Ok(job)
        });
        match job {
            Ok(job) => self.end_job(
                id,
                &job.owner,
                JobStatus::Cancelled,
                None,
                follow::OnEnd::Answer(reply),
            ),
            Err(e) => {
                super::answer(reply, Err(e));
                Vec::new()
            }
        }
    }

    /// Ends a job: no more assignment, its workers' attempts failed with the
    /// reason and the workers stopped (completed items are kept as they are),
    /// a last `job.progress`, then the status with its event. Each worker is
    /// stopped right after its attempt is failed, before the next one's, so
    /// the steps come back as follow-ups in that order.
    fn end_job(
        &mut self,
        id: &str,
        owner: &AgentName,
        to: JobStatus,
        reason: Option<&'static str>,
        then: follow::OnEnd,
    ) -> Vec<JobFollow> {
        let why = match to {
            JobStatus::Completed => "the job completed",
            JobStatus::Failed => "the job failed",
            _ => "the job was cancelled",
        };
        let why = reason.unwrap_or(why);
        // Workers still at work are stopped when the job is cancelled or cut
        // short; a job that ran out of items has only idle workers, which end
        // on their own when told there is no next item.
        let stop = (to == JobStatus::Cancelled || reason.is_some())
            .then_some(Terminal::Cancelled(CancelReason::JobCancelled));
        let mut steps: Vec<JobFollow> = self
            .workers
            .iter()
            .filter(|(_, w)| w.job == id)
            .map(|(n, _)| Step::end_worker(n.clone(), why, stop))
            .collect();
        steps.push(Step::ended(id, owner, to, reason, then));
        steps
    }

    /// The end of a job once its workers are dealt with: a last
    /// `job.progress`, then its status with its event.
    fn ended(
        &mut self,
        id: &str,
        owner: &AgentName,
        to: JobStatus,
        reason: Option<&str>,
        env: &Env,
    ) -> Result<Job, ApiError> {
        let kind = match to {
            JobStatus::Completed => "job.completed",
            JobStatus::Failed => "job.failed",
            _ => "job.cancelled",
        };
        self.emit_progress(id, true, env);
        let counts = match self.runs.remove(id) {
            Some(r) => counts_json(&r.counts),
            None => {
                let c = env
                    .store
                    .item_counts(env.tenant, id)
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
        let events = job_event(env.agents, owner, payload);
        let job = env
            .store
            .set_job_status(env.tenant, id, to, now_ms(), &events)
            .map_err(job_error)?;
        (env.project)(&events);
        // Its span, with its items' attempts under it, built off the loop.
        env.tracer.job_ended(&job);
        Ok(job)
    }

    /// Items left `running` by a dead incarnation (their worker is no live
    /// agent of this runner): a failed attempt each, `runtime_restart`, that
    /// does not use up the item's attempts; what was completed stays as it is.
    fn recover_jobs(&mut self, env: &Env) {
        let jobs = match env.store.jobs(env.tenant) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(error = %e, "reading jobs to recover");
                return;
            }
        };
        for job in jobs.iter().filter(|j| j.status == JobStatus::Running) {
            let items = match env
                .store
                .job_items(env.tenant, &job.id, Some(ItemStatus::Running))
            {
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
                    .is_some_and(|w| self.workers.contains_key(w))
                {
                    continue;
                }
                let events = job_event(
                    env.agents,
                    &job.owner,
                    json!({"type": "job.item.failed", "job": job.id, "item": it.id, "attempt": it.attempts,
                           "worker": it.worker.as_ref().map(|w| w.as_str()), "error": RUNTIME_RESTART}),
                );
                match env.store.fail_attempt(
                    env.tenant,
                    &job.id,
                    &it.id,
                    it.attempts,
                    RUNTIME_RESTART,
                    u32::MAX,
                    now_ms(),
                    &events,
                ) {
                    Ok(_) => (env.project)(&events),
                    Err(e) => {
                        tracing::warn!(job = job.id, item = it.id, error = %e, "failing a crashed attempt")
                    }
                }
            }
        }
    }

    /// Running jobs this runner does not run yet whose owner runs here (a
    /// job taken up after a restart, once its owner is resumed).
    fn take_up_jobs(&mut self, env: &Env) {
        let Ok(jobs) = env.store.jobs(env.tenant) else {
            return;
        };
        for job in jobs {
            if job.status != JobStatus::Running
                || self.runs.contains_key(&job.id)
                || !env.agents.running(&job.owner)
            {
                continue;
            }
            match self.load_run(&job, env) {
                Ok(run) => {
                    tracing::info!(job = job.id, "taking up a running job");
                    self.runs.insert(job.id.clone(), run);
                    self.dirty.insert(job.id);
                }
                Err(e) => tracing::warn!(job = job.id, error = %e, "taking up a job"),
            }
        }
    }

    /// `job.progress`: counts by status, items a second, and an ETA, when
    /// something changed (at most once a second, unless `last`).
    fn emit_progress(&mut self, id: &str, last: bool, env: &Env) {
        let now = now_ms();
        let Some(run) = self.runs.get_mut(id) else {
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
        let events = job_event(env.agents, &run.owner, payload);
        match env.store.append_events(env.tenant, &events, now) {
            Ok(_) => (env.project)(&events),
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
