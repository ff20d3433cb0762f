//! An operator's or owner's hand on a job's items: `assign` (an item's next
//! attempt now, on a given agent or a new worker) and `retry` (failed items
//! back to pending; a failed job reopens).

use brood_core::{ItemStatus, JobStatus};

use super::follow::{Admitting, JobFollow};
use super::{Env, Runner, job_error, job_event};
use crate::api::ApiError;
use crate::api::Caller;
use crate::supervisor::{Reply, answer, now_ms};
use brood_core::AgentName;
use brood_core::Code;
use serde_json::json;

impl Runner {
    /// `assign`: the pending `item` of a running job gets its next attempt
    /// now, its backoff waived. With `worker`, that agent holds it: a live
    /// agent in the owner's subtree holding no item, which the caller then
    /// gives the returned instruction, and whose `job.report` is the only one
    /// accepted for it. Without, a new worker is started for it (beyond
    /// `concurrency` if need be: the caller asked for this item now), and
    /// the caller is answered once its admission is known.
    pub(super) fn assign_op(
        &mut self,
        caller: &Caller,
        id: &str,
        item: &str,
        worker: Option<&AgentName>,
        reply: Reply<brood_api::AssignReply>,
        env: &Env,
    ) -> Vec<JobFollow> {
        let job = match crate::jobs::get(env.store, env.tenant, caller, id) {
            Ok(job) => job,
            Err(e) => {
                answer(reply, Err(e));
                return Vec::new();
            }
        };
        if !self.runs.contains_key(id) {
            answer(
                reply,
                Err(ApiError::new(
                    Code::Conflict,
                    format!(
                        "job {id} is {} here; items are assigned while it runs (start it first)",
                        job.status.as_str()
                    ),
                )),
            );
            return Vec::new();
        }
        match worker {
            Some(w) => {
                answer(reply, self.assign_to(&job, item, w, env));
                Vec::new()
            }
            None => self.assign_new(id, item, reply, env),
        }
    }

    /// `assign` to `w`, an agent running here under the job's owner.
    fn assign_to(
        &mut self,
        job: &brood_store::Job,
        item: &str,
        w: &AgentName,
        env: &Env,
    ) -> Result<brood_api::AssignReply, ApiError> {
        let id = job.id.as_str();
        if !env.agents.running(w) {
            return Err(ApiError::new(
                Code::Conflict,
                format!("agent {w} is not running here"),
            ));
        }
        let under = env
            .store
            .is_ancestor_or_self(env.tenant, &job.owner, w)
            .map_err(job_error)?;
        if !under || *w == job.owner {
            return Err(ApiError::new(
                Code::Forbidden,
                format!(
                    "agent {w} is not under job {id}'s owner {}; a job's items go to its owner's descendants",
                    job.owner
                ),
            ));
        }
        if let Some(held) = self.workers.get(w)
            && let Some((i, _, _)) = &held.item
        {
            return Err(ApiError::new(
                Code::Conflict,
                format!("agent {w} already holds item {i} of job {}", held.job),
            ));
        }
        // An agent the runner started keeps counting as one of its own.
        let own = self.workers.get(w).is_some_and(|h| h.own && h.job == id);
        let a = self.try_assign(id, w, Some(item), own, env)?;
        self.dirty.insert(id.to_owned());
        Ok(brood_api::AssignReply {
            assigned: w.to_string(),
            assignment: a,
        })
    }

    /// `assign` without a worker: a new one is started for the item.
    fn assign_new(
        &mut self,
        id: &str,
        item: &str,
        reply: Reply<brood_api::AssignReply>,
        env: &Env,
    ) -> Vec<JobFollow> {
        let before = self.runs.get(id).map_or(0, |r| r.next_worker);
        match self.begin_worker(id, Some(item), env) {
            Err(e) => answer(reply, Err(e)),
            Ok(None) => answer(reply, self.assigned_new(id, item, before)),
            Ok(Some((worker, owner, req))) => {
                return vec![JobFollow::AdmitWorker {
                    req: Box::new(req),
                    then: Admitting::for_assign(id, worker, owner, item, before, reply),
                }];
            }
        }
        Vec::new()
    }

    /// The answer to an `assign` that started a new worker: the one named
    /// after the job's `before`-th, and the attempt it holds.
    pub(super) fn assigned_new(
        &mut self,
        id: &str,
        item: &str,
        before: u32,
    ) -> Result<brood_api::AssignReply, ApiError> {
        let name = format!("{id}-w{}", before + 1);
        let attempt = self
            .workers
            .get(&AgentName::new(&name).map_err(|e| ApiError::new(Code::Internal, e.to_string()))?)
            .and_then(|w| w.item.as_ref().map(|(_, a, _)| *a));
        self.dirty.insert(id.to_owned());
        Ok(brood_api::AssignReply {
            assigned: name,
            assignment: Some(brood_api::Assignment {
                job: id.to_owned(),
                item: item.to_owned(),
                attempt,
                instruction: None,
            }),
        })
    }

    /// `retry`: the failed `item` (or every failed item) back to `pending`;
    /// its attempts are kept and the next one continues their count (one
    /// more attempt each). A failed job reopens (`running`, its owner must
    /// run here); a running one takes the items up at once.
    pub(super) fn retry(
        &mut self,
        caller: &Caller,
        id: &str,
        item: Option<&str>,
        env: &Env,
    ) -> Result<brood_api::RetryReply, ApiError> {
        let job = crate::jobs::get(env.store, env.tenant, caller, id)?;
        let items: Vec<String> = match item {
            Some(i) => vec![i.to_owned()],
            None => env
                .store
                .job_items(env.tenant, id, Some(ItemStatus::Failed))
                .map_err(job_error)?
                .into_iter()
                .map(|it| it.id)
                .collect(),
        };
        match job.status {
            JobStatus::Running | JobStatus::Failed => {}
            s => {
                return Err(ApiError::new(
                    Code::Conflict,
                    format!(
                        "job {id} is {}; items are retried in a running or failed job (replay makes a new one)",
                        s.as_str()
                    ),
                ));
            }
        }
        if job.status == JobStatus::Failed && !items.is_empty() {
            if !env.agents.running(&job.owner) {
                return Err(ApiError::new(
                    Code::Conflict,
                    format!(
                        "job {id}: its owner {} is not running on this supervisor; a job runs while its owner does",
                        job.owner
                    ),
                ));
            }
            // Check the one item first, so a refusal reopens nothing.
            if let Some(i) = item {
                let it = env
                    .store
                    .job_items(env.tenant, id, None)
                    .map_err(job_error)?
                    .into_iter()
                    .find(|it| it.id == i)
                    .ok_or_else(|| {
                        ApiError::new(Code::NotFound, format!("job {id} has no item {i}"))
                    })?;
                if it.status != ItemStatus::Failed {
                    return Err(ApiError::new(
                        Code::Conflict,
                        format!(
                            "job {id} item {i} is {}; only a failed item is retried",
                            it.status.as_str()
                        ),
                    ));
                }
            }
            let events = job_event(
                env.agents,
                &job.owner,
                json!({"type": "job.started", "job": id, "reopened": true}),
            );
            let reopened = env
                .store
                .set_job_status(env.tenant, id, JobStatus::Running, now_ms(), &events)
                .map_err(job_error)?;
            (env.project)(&events);
            let mut run = self.load_run(&reopened, env)?;
            // A reopened job's max_runtime_s counts from now.
            run.deadline_ms = super::job_spec_runtime(&reopened).map(|ms| now_ms() + ms);
            self.runs.insert(id.to_owned(), run);
        }
        let mut retried = Vec::new();
        for i in &items {
            // No event of its own (SPEC 10's kinds have none): the retry
            // shows as the item's next `job.item.started`.
            env.store
                .retry_item(env.tenant, id, i, now_ms(), &[])
                .map_err(job_error)?;
            if let Some(r) = self.runs.get_mut(id) {
                r.moved(ItemStatus::Failed, ItemStatus::Pending);
            }
            retried.push(i.clone());
        }
        self.dirty.insert(id.to_owned());
        Ok(brood_api::RetryReply {
            job: id.to_owned(),
            retried,
        })
    }
}
