//! Running jobs (SPEC 10) on the dispatcher: a started job keeps up to
//! `concurrency` workers (children of its owner) busy; each worker is given
//! an item when it starts (its task is the item's instruction) and the next
//! one in the reply to each `job.report`, until none is left or it asks to
//! stop. A report is accepted only from the worker holding the item's current
//! attempt, and only if it satisfies the output schema; anything else fails
//! the attempt. A worker that ends without reporting fails its attempt. The
//! job ends `completed` when every item has its result, `failed` when some
//! ran out of attempts, `cancelled` when cancelled or its owner ended.
//!
//! Workers that end are noted in `forget` and dealt with after the command
//! (never inside a stop), and jobs are topped up with workers only then.

use std::collections::{BTreeSet, HashMap};

use brood_core::{ItemStatus, JobStatus};

use super::*;

#[derive(Default)]
pub(super) struct Runner {
    runs: HashMap<String, JobRun>,
    /// What each live worker holds.
    workers: HashMap<AgentName, Work>,
    /// Workers that left the live set since the last command ended.
    gone: Vec<AgentName>,
    /// Jobs to top up with workers (or to finish) after this command.
    dirty: BTreeSet<String>,
}

struct JobRun {
    owner: AgentName,
    instruction: String,
    schema: Option<Value>,
    concurrency: usize,
    max_attempts: u32,
    item_timeout_ms: i64,
    argv: Vec<String>,
    policy: Option<Value>,
    workers: usize,
    next_worker: u32,
}

struct Work {
    job: String,
    /// The item and attempt it holds now, and when that attempt times out.
    item: Option<(String, u32, i64)>,
}

impl Runner {
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

impl Dispatcher {
    /// The owner is not (or no more) running here: no worker starts under it.
    fn owner_gone(&self, owner: &AgentName) -> bool {
        self.live.get(owner).is_none_or(|l| l.stopping.is_some())
    }

    fn job_event(&self, owner: &AgentName, payload: Value) -> Vec<NewEvent> {
        let (run, session) = match self.live.get(owner) {
            Some(l) => (Some(l.run.clone()), l.session.clone()),
            None => (None, SessionName::default_session()),
        };
        vec![ev_value(owner, run.as_ref(), &session, payload)]
    }

    pub(super) fn on_job_start(&mut self, caller: &Caller, id: &str) -> ApiResult {
        let store = self.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.tenant, caller, id)?;
        let owner = job.owner.clone();
        if self.owner_gone(&owner) {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "job {id}: its owner {owner} is not running on this supervisor; a job runs while its owner does"
                ),
            ));
        }
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
                let mut v = vec![exe, "agent".to_owned()];
                if let Some(t) = worker["type"].as_str() {
                    v.extend(["--type".to_owned(), t.to_owned()]);
                }
                if let Some(m) = worker["model"].as_str() {
                    v.extend(["--model".to_owned(), m.to_owned()]);
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
        let events = self.job_event(&owner, json!({"type": "job.started", "job": id}));
        let job = self
            .store
            .set_job_status(&self.tenant, id, JobStatus::Running, now_ms(), &events)
            .map_err(job_error)?;
        self.project_events(&events);
        self.jobs.runs.insert(
            id.to_owned(),
            JobRun {
                owner,
                instruction: spec["instruction"].as_str().unwrap_or_default().to_owned(),
                schema: spec.get("output_schema").filter(|s| !s.is_null()).cloned(),
                concurrency: spec["concurrency"].as_u64().unwrap_or(8).max(1) as usize,
                max_attempts: spec["max_attempts"].as_u64().unwrap_or(3).max(1) as u32,
                item_timeout_ms: spec["item_timeout_s"]
                    .as_u64()
                    .unwrap_or(1800)
                    .saturating_mul(1000) as i64,
                argv,
                policy: worker.get("policy").filter(|p| !p.is_null()).cloned(),
                workers: 0,
                next_worker: 0,
            },
        );
        self.jobs.dirty.insert(id.to_owned());
        crate::jobs::view(self.store.as_ref(), &job).map(|v| to_json(&v))
    }

    pub(super) fn on_job_cancel(&mut self, caller: &Caller, id: &str) -> ApiResult {
        let store = self.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.tenant, caller, id)?;
        let events = self.job_event(&job.owner, json!({"type": "job.cancelled", "job": id}));
        let job = self
            .store
            .set_job_status(&self.tenant, id, JobStatus::Cancelled, now_ms(), &events)
            .map_err(job_error)?;
        self.project_events(&events);
        self.jobs.runs.remove(id);
        let mine: Vec<AgentName> = self
            .jobs
            .workers
            .iter()
            .filter(|(_, w)| w.job == id)
            .map(|(n, _)| n.clone())
            .collect();
        for w in mine {
            self.fail_work(&w, "the job was cancelled");
            self.jobs.workers.remove(&w);
            self.stop_subtree(&w, Terminal::Cancelled(CancelReason::JobCancelled));
        }
        crate::jobs::view(self.store.as_ref(), &job).map(|v| to_json(&v))
    }

    /// Fails the attempt `worker` holds, if any.
    fn fail_work(&mut self, worker: &AgentName, why: &str) {
        let Some(w) = self.jobs.workers.get_mut(worker) else {
            return;
        };
        let Some((item, attempt, _)) = w.item.take() else {
            return;
        };
        let job = w.job.clone();
        let (owner, max) = match self.jobs.runs.get(&job) {
            Some(r) => (r.owner.clone(), r.max_attempts),
            None => match self.store.job(&self.tenant, &job) {
                Ok(Some(j)) => (j.owner, 1),
                _ => return,
            },
        };
        let events = self.job_event(
            &owner,
            json!({"type": "job.item.failed", "job": job, "item": item, "attempt": attempt, "worker": worker.as_str(), "error": why}),
        );
        match self.store.fail_attempt(
            &self.tenant,
            &job,
            &item,
            attempt,
            why,
            max,
            now_ms(),
            &events,
        ) {
            Ok(_) => self.project_events(&events),
            Err(e) => tracing::warn!(job, item, error = %e, "failing a job attempt"),
        }
        self.jobs.dirty.insert(job);
    }

    /// `job.report` from a worker: its result for the item it holds.
    pub(super) fn on_job_report(&mut self, worker: &AgentName, args: &Value) -> ApiResult {
        let Some(w) = self.jobs.workers.get(worker) else {
            return Err(ApiError::new(
                Code::Forbidden,
                format!("agent {worker} is not working on a job item"),
            ));
        };
        let job = w.job.clone();
        let Some((item, attempt, _)) = w.item.clone() else {
            return Err(ApiError::new(
                Code::Conflict,
                format!("agent {worker} holds no item of job {job} now (its attempt ended)"),
            ));
        };
        for (k, want) in [("job", &job), ("item", &item)] {
            if let Some(v) = args.get(k).and_then(Value::as_str)
                && v != want.as_str()
            {
                return Err(ApiError::new(
                    Code::Conflict,
                    format!("agent {worker} holds item {item} of job {job}, not {k} {v:?}"),
                ));
            }
        }
        let Some(result) = args.get("result") else {
            return Err(ApiError::new(
                Code::BadRequest,
                "job.report needs \"result\"",
            ));
        };
        let stop = args.get("stop").and_then(Value::as_bool).unwrap_or(false);
        let Some(run) = self.jobs.runs.get(&job) else {
            return Err(ApiError::new(
                Code::Conflict,
                format!("job {job} is not running"),
            ));
        };
        let owner = run.owner.clone();
        if let Some(schema) = &run.schema
            && let Err(why) = crate::jobs::validate(schema, result)
        {
            let reason = format!("the result does not satisfy output_schema: {why}");
            self.fail_work(worker, &reason);
            return Err(ApiError::new(Code::BadRequest, reason));
        }
        let events = self.job_event(
            &owner,
            json!({"type": "job.item.completed", "job": job, "item": item, "attempt": attempt, "worker": worker.as_str()}),
        );
        self.store
            .report_result(
                &self.tenant,
                &job,
                &item,
                attempt,
                worker,
                &result.to_string(),
                now_ms(),
                &events,
            )
            .map_err(job_error)?;
        self.project_events(&events);
        if let Some(w) = self.jobs.workers.get_mut(worker) {
            w.item = None;
        }
        self.jobs.dirty.insert(job.clone());
        let next = if stop {
            None
        } else {
            self.assign(&job, worker)
        };
        Ok(json!({"accepted": true, "next": next}))
    }

    /// Gives `worker` the next pending item of `job`: its assignment, or `None`.
    fn assign(&mut self, job: &str, worker: &AgentName) -> Option<Value> {
        let run = self.jobs.runs.get(job)?;
        let (owner, instruction, timeout) = (
            run.owner.clone(),
            run.instruction.clone(),
            run.item_timeout_ms,
        );
        let now = now_ms();
        let next = self
            .store
            .next_pending_item(&self.tenant, job, now)
            .ok()??;
        let fields: serde_json::Map<String, Value> =
            serde_json::from_str(&next.input).unwrap_or_default();
        let text = crate::jobs::template::render(&instruction, &fields).ok()?;
        let events = self.job_event(
            &owner,
            json!({"type": "job.item.started", "job": job, "item": next.id, "attempt": next.attempts + 1, "worker": worker.as_str()}),
        );
        let a = self
            .store
            .start_attempt(&self.tenant, job, &next.id, worker, now, &events)
            .ok()?;
        self.project_events(&events);
        self.jobs.workers.insert(
            worker.clone(),
            Work {
                job: job.to_owned(),
                item: Some((next.id.clone(), a.number, now + timeout)),
            },
        );
        Some(json!({"job": job, "item": next.id, "attempt": a.number, "instruction": text}))
    }

    /// After each command: workers that ended, attempts past their time,
    /// jobs topped up with workers, jobs that are done.
    pub(super) fn drive_jobs(&mut self) {
        for w in std::mem::take(&mut self.jobs.gone) {
            self.fail_work(&w, "the worker ended without reporting");
            if let Some(work) = self.jobs.workers.remove(&w)
                && let Some(run) = self.jobs.runs.get_mut(&work.job)
            {
                run.workers = run.workers.saturating_sub(1);
                self.jobs.dirty.insert(work.job);
            }
        }
        for job in std::mem::take(&mut self.jobs.dirty) {
            self.top_up(&job);
            self.maybe_finish(&job);
        }
    }

    /// Attempts past their `item_timeout_s` fail, and their workers stop.
    pub(super) fn job_timeouts(&mut self) {
        // Items whose backoff ended wait for a worker: look again each tick.
        let running: Vec<String> = self.jobs.runs.keys().cloned().collect();
        self.jobs.dirty.extend(running);
        let now = now_ms();
        let late: Vec<AgentName> = self
            .jobs
            .workers
            .iter()
            .filter(|(_, w)| w.item.as_ref().is_some_and(|(_, _, d)| *d <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for w in late {
            self.fail_work(&w, "the attempt timed out (item_timeout_s)");
            self.stop_subtree(&w, Terminal::Failed(FailReason::TimedOut));
        }
    }

    fn top_up(&mut self, job: &str) {
        loop {
            let Some(run) = self.jobs.runs.get(job) else {
                return;
            };
            if run.workers >= run.concurrency {
                return;
            }
            let owner = run.owner.clone();
            if self.owner_gone(&owner) {
                return;
            }
            let Some(run) = self.jobs.runs.get_mut(job) else {
                return;
            };
            run.next_worker += 1;
            let n = run.next_worker;
            let (argv, policy) = (run.argv.clone(), run.policy.clone());
            let Ok(worker) = AgentName::new(&format!("{job}-w{n}")) else {
                return;
            };
            // The attempt first, so the worker's report finds it.
            let Some(assignment) = self.assign(job, &worker) else {
                self.jobs.workers.remove(&worker);
                return;
            };
            let req = SpawnRequest {
                name: Some(worker.clone()),
                parent: Some(owner.clone()),
                argv,
                protocol: Protocol::Brood,
                task: assignment["instruction"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                env: Vec::new(),
                cwd: None,
                session: SessionName::default_session(),
                await_ready: false,
                policy,
                life: brood_core::Life::Owned,
                iso: brood_core::Iso::None,
                root: None,
                customer: None,
                label: Some(format!("worker of job {job}")),
            };
            let operator = Caller::User { uid: self.uid };
            match self.admit(&operator, req) {
                Ok(_) => {
                    if let Some(run) = self.jobs.runs.get_mut(job) {
                        run.workers += 1;
                    }
                }
                Err(e) => {
                    self.note_refusal(Some(&owner), Some(worker.as_str()), &e);
                    self.fail_work(&worker, &format!("the worker could not be created: {e}"));
                    self.jobs.workers.remove(&worker);
                    return;
                }
            }
        }
    }

    fn maybe_finish(&mut self, job: &str) {
        let Some(run) = self.jobs.runs.get(job) else {
            return;
        };
        let owner = run.owner.clone();
        let Ok(counts) = self.store.item_counts(&self.tenant, job) else {
            return;
        };
        let n = |s: ItemStatus| counts.iter().find(|(k, _)| *k == s).map_or(0, |(_, n)| *n);
        let owner_gone = self.owner_gone(&owner);
        let (to, kind) = if n(ItemStatus::Pending) == 0 && n(ItemStatus::Running) == 0 {
            if n(ItemStatus::Failed) > 0 {
                (JobStatus::Failed, "job.failed")
            } else {
                (JobStatus::Completed, "job.completed")
            }
        } else if owner_gone && run.workers == 0 {
            (JobStatus::Cancelled, "job.cancelled")
        } else {
            return;
        };
        let counts_json: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(s, n)| (s.as_str().to_owned(), json!(n)))
            .collect();
        let events = self.job_event(
            &owner,
            json!({"type": kind, "job": job, "counts": counts_json}),
        );
        match self
            .store
            .set_job_status(&self.tenant, job, to, now_ms(), &events)
        {
            Ok(_) => self.project_events(&events),
            Err(e) => tracing::warn!(job, error = %e, "ending a job"),
        }
        self.jobs.runs.remove(job);
    }
}
