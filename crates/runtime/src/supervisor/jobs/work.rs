//! Items to workers: assignment, a worker's report (fenced, checked against
//! the output schema), failed attempts, a job's next worker and its end when
//! every item is done.

use brood_core::{ItemStatus, JobStatus};

use super::follow::{JobFollow, OnEnd};
use super::{Env, Runner, Work, job_error, job_event};
use crate::api::ApiError;
use crate::api::SpawnRequest;
use crate::supervisor::now_ms;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::SessionName;
use brood_store::Protocol;
use serde_json::Value;
use serde_json::json;

impl Runner {
    /// Fails the attempt `worker` holds, if any.
    pub(super) fn fail_work(&mut self, worker: &AgentName, why: &str, env: &Env) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        let Some((item, attempt, _)) = w.item.take() else {
            return;
        };
        let job = w.job.clone();
        let (owner, max) = match self.runs.get(&job) {
            Some(r) => (r.owner.clone(), r.max_attempts),
            None => match env.store.job(env.tenant, &job) {
                Ok(Some(j)) => (j.owner, 1),
                _ => return,
            },
        };
        let events = job_event(
            env.agents,
            &owner,
            json!({"type": "job.item.failed", "job": job, "item": item, "attempt": attempt, "worker": worker.as_str(), "error": why}),
        );
        match env.store.fail_attempt(
            env.tenant,
            &job,
            &item,
            attempt,
            why,
            max,
            now_ms(),
            &events,
        ) {
            Ok(it) => {
                (env.project)(&events);
                if let Some(r) = self.runs.get_mut(&job) {
                    r.moved(ItemStatus::Running, it.status);
                }
            }
            Err(e) => tracing::warn!(job, item, error = %e, "failing a job attempt"),
        }
        self.dirty.insert(job);
    }

    /// `job.report` from a worker: its result for the item it holds.
    pub(super) fn report(
        &mut self,
        worker: &AgentName,
        args: &Value,
        env: &Env,
    ) -> Result<brood_api::ReportReply, ApiError> {
        let Some(w) = self.workers.get(worker) else {
            return Err(ApiError::new(
                Code::Forbidden,
                format!("agent {worker} is not working on a job item"),
            ));
        };
        let job = w.job.clone();
        if repeated(w, worker, args, env) {
            // Its answer was lost (a restart, a worker resumed): answered
            // again, recorded once.
            return Ok(brood_api::ReportReply {
                accepted: true,
                next: None,
            });
        }
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
        let Some(run) = self.runs.get(&job) else {
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
            self.fail_work(worker, &reason, env);
            return Err(ApiError::new(Code::BadRequest, reason));
        }
        let events = job_event(
            env.agents,
            &owner,
            json!({"type": "job.item.completed", "job": job, "item": item, "attempt": attempt, "worker": worker.as_str()}),
        );
        env.store
            .report_result(
                env.tenant,
                &job,
                &item,
                attempt,
                worker,
                &result.to_string(),
                now_ms(),
                &events,
            )
            .map_err(job_error)?;
        (env.project)(&events);
        if let Some(r) = self.runs.get_mut(&job) {
            r.moved(ItemStatus::Running, ItemStatus::Completed);
        }
        if let Some(w) = self.workers.get_mut(worker) {
            w.item = None;
            w.last = Some((item.clone(), result.to_string()));
        }
        self.dirty.insert(job.clone());
        // Only the runner's own workers are handed the next item: an agent
        // given one by `assign` is its owner's to direct.
        let own = self.workers.get(worker).is_some_and(|w| w.own);
        let next = if stop || !own {
            None
        } else {
            self.try_assign(&job, worker, None, true, env)
                .ok()
                .flatten()
        };
        Ok(brood_api::ReportReply {
            accepted: true,
            next,
        })
    }

    /// Starts the next attempt of `item` (or of the next pending item of
    /// `job`) on `worker`: its assignment, `None` when none is left, or the
    /// reason when it cannot. `own`: the worker is one of the runner's
    /// (counted in the job's `workers`).
    pub(super) fn try_assign(
        &mut self,
        job: &str,
        worker: &AgentName,
        item: Option<&str>,
        own: bool,
        env: &Env,
    ) -> Result<Option<brood_api::Assignment>, ApiError> {
        let Some(run) = self.runs.get(job) else {
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
                let items = env
                    .store
                    .job_items(env.tenant, job, Some(ItemStatus::Pending))
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
            None => match env
                .store
                .next_pending_item(env.tenant, job, now)
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
        let events = job_event(
            env.agents,
            &owner,
            json!({"type": "job.item.started", "job": job, "item": next.id, "attempt": next.attempts + 1, "worker": worker.as_str()}),
        );
        // An explicit assignment does not wait for the item's backoff.
        let at = if item.is_some() {
            now.max(next.not_before_ms)
        } else {
            now
        };
        let a = env
            .store
            .start_attempt(env.tenant, job, &next.id, worker, at, &events)
            .map_err(job_error)?;
        (env.project)(&events);
        if let Some(r) = self.runs.get_mut(job) {
            r.moved(ItemStatus::Pending, ItemStatus::Running);
        }
        self.workers.insert(
            worker.clone(),
            Work {
                job: job.to_owned(),
                item: Some((next.id.clone(), a.number, at + timeout)),
                own,
                last: self.workers.get(worker).and_then(|w| w.last.clone()),
            },
        );
        Ok(Some(brood_api::Assignment {
            job: job.to_owned(),
            item: next.id,
            attempt: Some(a.number),
            instruction: Some(text),
        }))
    }

    /// Why a worker that held an item ended without reporting, as its
    /// record says (issue 25: the real cause, e.g. the reference agent's
    /// `no provider`, is in the worker's detail and stderr tail, and an
    /// attempt's error is where a job's owner looks).
    pub(super) fn worker_end(&self, w: &AgentName, env: &Env) -> String {
        let base = "the worker ended without reporting";
        let Ok(Some(a)) = env.store.agent(env.tenant, w) else {
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

    /// The next worker `job` wants to top it up to its concurrency, its
    /// attempt started: `None` when it wants none (enough workers, no item
    /// ready, its owner not running here) or one could not be prepared.
    pub(super) fn want_worker(
        &mut self,
        job: &str,
        env: &Env,
    ) -> Option<(AgentName, AgentName, SpawnRequest)> {
        let run = self.runs.get(job)?;
        if run.workers >= run.concurrency || run.count(ItemStatus::Pending) == 0 {
            return None;
        }
        if !env.agents.running(&run.owner) {
            return None;
        }
        // Stop at the first worker not prepared: no item ready (all in
        // their backoff) or a refusal.
        self.begin_worker(job, None, env).ok().flatten()
    }

    /// A new worker (a child of the job's owner) given `item`, or the next
    /// pending item: its attempt started, and the worker, its owner and the
    /// request that creates it; `Ok(None)` when there was no item to give.
    /// What admission says comes back to [`Runner::admitted`].
    pub(super) fn begin_worker(
        &mut self,
        job: &str,
        item: Option<&str>,
        env: &Env,
    ) -> Result<Option<(AgentName, AgentName, SpawnRequest)>, ApiError> {
        let Some(run) = self.runs.get(job) else {
            return Ok(None);
        };
        let owner = run.owner.clone();
        let n = run.next_worker + 1;
        let (argv, policy) = (run.argv.clone(), run.policy.clone());
        let worker = AgentName::new(&format!("{job}-w{n}"))
            .map_err(|e| ApiError::new(Code::InvalidName, format!("job {job}'s worker: {e}")))?;
        // The attempt first, so the worker's report finds it.
        let Some(assignment) = self.try_assign(job, &worker, item, true, env)? else {
            self.workers.remove(&worker);
            return Ok(None);
        };
        // The name is used from here on, whatever admission says.
        if let Some(run) = self.runs.get_mut(job) {
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
            traceparent: None,
        };
        Ok(Some((worker, owner, req)))
    }

    /// The job ends if every item is done, or if its owner ended and no
    /// worker is left.
    pub(super) fn maybe_finish(&mut self, job: &str, env: &Env) -> Vec<JobFollow> {
        let Some(run) = self.runs.get(job) else {
            return Vec::new();
        };
        let owner = run.owner.clone();
        let busy = self.workers.values().any(|w| w.job == job);
        let (to, reason) =
            if run.count(ItemStatus::Pending) == 0 && run.count(ItemStatus::Running) == 0 {
                if run.count(ItemStatus::Failed) > 0 {
                    (JobStatus::Failed, None)
                } else {
                    (JobStatus::Completed, None)
                }
            } else if !env.agents.running(&owner) && !busy {
                (JobStatus::Cancelled, Some("its owner ended"))
            } else {
                return Vec::new();
            };
        self.end_job(job, &owner, to, reason, OnEnd::Log("ending a job"))
    }
}

/// Whether `args` repeats a report already recorded for `worker` (issue 29
/// "nothing done twice"): the item it names is not the one it holds and
/// is done with this worker's result on record, or it names none, holds
/// none, and gives the result its last accepted report gave.
fn repeated(w: &Work, worker: &AgentName, args: &Value, env: &Env) -> bool {
    let result = args.get("result").map(Value::to_string);
    let holds = w.item.as_ref().map(|(i, _, _)| i.as_str());
    match args.get("item").and_then(Value::as_str) {
        Some(item) if Some(item) != holds => {
            let job = args.get("job").and_then(Value::as_str).unwrap_or(&w.job);
            if job != w.job {
                return false;
            }
            if w.last
                .as_ref()
                .is_some_and(|(i, r)| i == item && Some(r) == result.as_ref())
            {
                return true;
            }
            env.store
                .job_items(env.tenant, job, None)
                .ok()
                .into_iter()
                .flatten()
                .find(|it| it.id == item)
                .is_some_and(|it| {
                    matches!(it.status, ItemStatus::Completed | ItemStatus::Reported)
                        && it.worker.as_ref() == Some(worker)
                        && it
                            .result
                            .as_ref()
                            .and_then(|r| serde_json::from_str::<Value>(r).ok())
                            == args.get("result").cloned()
                })
        }
        Some(_) => false,
        None => {
            holds.is_none()
                && w.last
                    .as_ref()
                    .is_some_and(|(_, r)| Some(r) == result.as_ref())
        }
    }
}
