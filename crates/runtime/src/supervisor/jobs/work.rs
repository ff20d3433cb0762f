//! Items to workers: assignment, a worker's report (fenced, checked against
//! the output schema), failed attempts, timeouts, topping a job up with
//! workers and ending it when every item is done.

use brood_core::{ItemStatus, JobStatus};

use super::{Work, job_error};
use crate::api::ApiError;
use crate::api::Caller;
use crate::api::SpawnRequest;
use crate::supervisor::{Dispatcher, now_ms};
use brood_core::AgentName;
use brood_core::Code;
use brood_core::FailReason;
use brood_core::SessionName;
use brood_core::Terminal;
use brood_store::Protocol;
use serde_json::Value;
use serde_json::json;

impl Dispatcher {
    /// Fails the attempt `worker` holds, if any.
    pub(super) fn fail_work(&mut self, worker: &AgentName, why: &str) {
        let Some(w) = self.jobs.workers.get_mut(worker) else {
            return;
        };
        let Some((item, attempt, _)) = w.item.take() else {
            return;
        };
        let job = w.job.clone();
        let (owner, max) = match self.jobs.runs.get(&job) {
            Some(r) => (r.owner.clone(), r.max_attempts),
            None => match self.records.store.job(&self.records.tenant, &job) {
                Ok(Some(j)) => (j.owner, 1),
                _ => return,
            },
        };
        let events = self.job_event(
            &owner,
            json!({"type": "job.item.failed", "job": job, "item": item, "attempt": attempt, "worker": worker.as_str(), "error": why}),
        );
        match self.records.store.fail_attempt(
            &self.records.tenant,
            &job,
            &item,
            attempt,
            why,
            max,
            now_ms(),
            &events,
        ) {
            Ok(it) => {
                self.records.project_events(&events);
                if let Some(r) = self.jobs.runs.get_mut(&job) {
                    r.moved(ItemStatus::Running, it.status);
                }
            }
            Err(e) => tracing::warn!(job, item, error = %e, "failing a job attempt"),
        }
        self.jobs.dirty.insert(job);
    }

    /// `job.report` from a worker: its result for the item it holds.
    pub(super) fn on_job_report(
        &mut self,
        worker: &AgentName,
        args: &Value,
    ) -> Result<brood_api::ReportReply, ApiError> {
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
        self.records
            .store
            .report_result(
                &self.records.tenant,
                &job,
                &item,
                attempt,
                worker,
                &result.to_string(),
                now_ms(),
                &events,
            )
            .map_err(job_error)?;
        self.records.project_events(&events);
        if let Some(r) = self.jobs.runs.get_mut(&job) {
            r.moved(ItemStatus::Running, ItemStatus::Completed);
        }
        if let Some(w) = self.jobs.workers.get_mut(worker) {
            w.item = None;
        }
        self.jobs.dirty.insert(job.clone());
        // Only the runner's own workers are handed the next item: an agent
        // given one by `assign` is its owner's to direct.
        let own = self.jobs.workers.get(worker).is_some_and(|w| w.own);
        let next = if stop || !own {
            None
        } else {
            self.assign(&job, worker, None)
        };
        Ok(brood_api::ReportReply {
            accepted: true,
            next,
        })
    }

    /// Starts the next attempt of `item` (or of the next pending item of
    /// `job`) on `worker`: its assignment, or `None` when none is left.
    pub(super) fn assign(
        &mut self,
        job: &str,
        worker: &AgentName,
        item: Option<&str>,
    ) -> Option<brood_api::Assignment> {
        self.try_assign(job, worker, item, true).ok().flatten()
    }

    /// [`Self::assign`] with the reason when it cannot. `own`: the worker is
    /// one of the runner's (counted in the job's `workers`).
    pub(super) fn try_assign(
        &mut self,
        job: &str,
        worker: &AgentName,
        item: Option<&str>,
        own: bool,
    ) -> Result<Option<brood_api::Assignment>, ApiError> {
        let Some(run) = self.jobs.runs.get(job) else {
            return Ok(None);
        };
        let (owner, instruction, timeout) = (
            run.owner.clone(),
            run.instruction.clone(),
            run.item_timeout_ms,
        );
        let now = now_ms();
        let next = match item {
            Some(i) => {
                let items = self
                    .records
                    .store
                    .job_items(&self.records.tenant, job, Some(ItemStatus::Pending))
                    .map_err(job_error)?;
                match items.into_iter().find(|it| it.id == i) {
                    Some(it) => it,
                    None => {
                        return Err(ApiError::new(
                            Code::Conflict,
                            format!(
                                "job {job} item {i} is not pending (only a pending item is assigned)"
                            ),
                        ));
                    }
                }
            }
            None => match self
                .records
                .store
                .next_pending_item(&self.records.tenant, job, now)
                .map_err(job_error)?
            {
                Some(it) => it,
                None => return Ok(None),
            },
        };
        let fields: serde_json::Map<String, Value> =
            serde_json::from_str(&next.input).unwrap_or_default();
        let text = crate::jobs::template::render(&instruction, &fields)
            .map_err(|e| ApiError::new(Code::Internal, format!("job {job}: {e}")))?;
        let events = self.job_event(
            &owner,
            json!({"type": "job.item.started", "job": job, "item": next.id, "attempt": next.attempts + 1, "worker": worker.as_str()}),
        );
        // An explicit assignment does not wait for the item's backoff.
        let at = if item.is_some() {
            now.max(next.not_before_ms)
        } else {
            now
        };
        let a = self
            .records
            .store
            .start_attempt(&self.records.tenant, job, &next.id, worker, at, &events)
            .map_err(job_error)?;
        self.records.project_events(&events);
        if let Some(r) = self.jobs.runs.get_mut(job) {
            r.moved(ItemStatus::Pending, ItemStatus::Running);
        }
        self.jobs.workers.insert(
            worker.clone(),
            Work {
                job: job.to_owned(),
                item: Some((next.id.clone(), a.number, at + timeout)),
                own,
            },
        );
        Ok(Some(brood_api::Assignment {
            job: job.to_owned(),
            item: next.id,
            attempt: Some(a.number),
            instruction: Some(text),
        }))
    }

    /// After each command: workers that ended, jobs topped up with workers,
    /// jobs that are done, progress.
    pub(crate) fn drive_jobs(&mut self) {
        for w in std::mem::take(&mut self.jobs.gone) {
            let why = self.worker_end(&w);
            self.fail_work(&w, &why);
            if let Some(work) = self.jobs.workers.remove(&w) {
                if work.own
                    && let Some(run) = self.jobs.runs.get_mut(&work.job)
                {
                    run.workers = run.workers.saturating_sub(1);
                }
                self.jobs.dirty.insert(work.job);
            }
        }
        for job in std::mem::take(&mut self.jobs.dirty) {
            self.top_up(&job);
            self.maybe_finish(&job);
            self.emit_progress(&job, false);
        }
    }

    /// Why a worker that held an item ended without reporting, as its
    /// record says (issue 25: the real cause, e.g. the reference agent's
    /// `no provider`, is in the worker's detail and stderr tail, and an
    /// attempt's error is where a job's owner looks).
    fn worker_end(&self, w: &AgentName) -> String {
        let base = "the worker ended without reporting";
        let Ok(Some(a)) = self.records.store.agent(&self.records.tenant, w) else {
            return base.to_owned();
        };
        let mut why = format!("{base}: {w} {}", a.status.api_word());
        if let Some(r) = a.status.reason() {
            why.push_str(&format!(" ({r})"));
        }
        if let Some(d) = a.detail.as_deref().filter(|d| !d.is_empty()) {
            why.push_str(&format!(": {d}"));
        }
        why
    }

    /// Attempts past their `item_timeout_s` fail and their workers stop; a
    /// job past its `max_runtime_s` fails.
    pub(super) fn job_timeouts(&mut self) {
        // Items whose backoff ended wait for a worker: look again each tick.
        let running: Vec<String> = self.jobs.runs.keys().cloned().collect();
        self.jobs.dirty.extend(running);
        let now = now_ms();
        let late: Vec<(AgentName, bool)> = self
            .jobs
            .workers
            .iter()
            .filter(|(_, w)| w.item.as_ref().is_some_and(|(_, _, d)| *d <= now))
            .map(|(n, w)| (n.clone(), w.own))
            .collect();
        for (w, own) in late {
            self.fail_work(&w, "the attempt timed out (item_timeout_s)");
            if own {
                self.stop_subtree(&w, Terminal::Failed(FailReason::TimedOut));
            } else {
                // Not the job's agent to stop: it just holds nothing now, and
                // a late report from it is refused.
                self.jobs.workers.remove(&w);
            }
        }
        let overdue: Vec<(String, AgentName)> = self
            .jobs
            .runs
            .iter()
            .filter(|(_, r)| r.deadline_ms.is_some_and(|d| d <= now))
            .map(|(id, r)| (id.clone(), r.owner.clone()))
            .collect();
        for (id, owner) in overdue {
            if let Err(e) = self.end_job(
                &id,
                &owner,
                JobStatus::Failed,
                Some("the job ran past max_runtime_s"),
            ) {
                tracing::warn!(job = id, error = %e, "failing a job past max_runtime_s");
            }
        }
    }

    fn top_up(&mut self, job: &str) {
        loop {
            let Some(run) = self.jobs.runs.get(job) else {
                return;
            };
            if run.workers >= run.concurrency || run.count(ItemStatus::Pending) == 0 {
                return;
            }
            let owner = run.owner.clone();
            if self.owner_gone(&owner) {
                return;
            }
            // Stop at the first worker not started: no item ready (all in
            // their backoff) or a refusal.
            if !matches!(self.start_worker(job, None), Ok(true)) {
                return;
            }
        }
    }

    /// A new worker (a child of the job's owner) given `item`, or the next
    /// pending item; `Ok(false)` when there was none to give.
    pub(super) fn start_worker(&mut self, job: &str, item: Option<&str>) -> Result<bool, ApiError> {
        let Some(run) = self.jobs.runs.get(job) else {
            return Ok(false);
        };
        let owner = run.owner.clone();
        let n = run.next_worker + 1;
        let (argv, policy) = (run.argv.clone(), run.policy.clone());
        let worker = AgentName::new(&format!("{job}-w{n}"))
            .map_err(|e| ApiError::new(Code::InvalidName, format!("job {job}'s worker: {e}")))?;
        // The attempt first, so the worker's report finds it.
        let Some(assignment) = self.try_assign(job, &worker, item, true)? else {
            self.jobs.workers.remove(&worker);
            return Ok(false);
        };
        // The name is used from here on, whatever admission says.
        if let Some(run) = self.jobs.runs.get_mut(job) {
            run.next_worker = n;
        }
        let req = SpawnRequest {
            name: Some(worker.clone()),
            parent: Some(owner.clone()),
            argv,
            protocol: Protocol::Brood,
            task: assignment.instruction.unwrap_or_default(),
            env: Vec::new(),
            secrets: brood_api::Secrets::new(),
            cwd: None,
            session: SessionName::default_session(),
            await_ready: false,
            policy,
            life: brood_core::Life::Owned,
            iso: brood_core::Iso::None,
            root: None,
            customer: None,
            label: Some(format!("worker of job {job}")),
            placement: None,
        };
        let operator = Caller::User { uid: self.host.uid };
        match self.admit(&operator, req) {
            Ok(_) => {
                if let Some(run) = self.jobs.runs.get_mut(job) {
                    run.workers += 1;
                }
                Ok(true)
            }
            Err(e) => {
                self.note_refusal(Some(&owner), Some(worker.as_str()), &e);
                self.fail_work(&worker, &format!("the worker could not be created: {e}"));
                self.jobs.workers.remove(&worker);
                Err(e)
            }
        }
    }

    fn maybe_finish(&mut self, job: &str) {
        let Some(run) = self.jobs.runs.get(job) else {
            return;
        };
        let owner = run.owner.clone();
        let busy = self.jobs.workers.values().any(|w| w.job == job);
        let (to, reason) =
            if run.count(ItemStatus::Pending) == 0 && run.count(ItemStatus::Running) == 0 {
                if run.count(ItemStatus::Failed) > 0 {
                    (JobStatus::Failed, None)
                } else {
                    (JobStatus::Completed, None)
                }
            } else if self.owner_gone(&owner) && !busy {
                (JobStatus::Cancelled, Some("its owner ended"))
            } else {
                return;
            };
        if let Err(e) = self.end_job(job, &owner, to, reason) {
            tracing::warn!(job, error = %e, "ending a job");
        }
    }
}
