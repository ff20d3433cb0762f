//! An operator's or owner's hand on a job's items: `assign` (an item's next
//! attempt now, on a given agent or a new worker) and `retry` (failed items
//! back to pending; a failed job reopens).

use brood_core::{ItemStatus, JobStatus};

use super::job_error;
use crate::api::ApiError;
use crate::api::Caller;
use crate::supervisor::{Dispatcher, now_ms};
use brood_core::AgentName;
use brood_core::Code;
use serde_json::json;

impl Dispatcher {
    /// `assign`: the pending `item` of a running job gets its next attempt
    /// now, its backoff waived. With `worker`, that agent holds it: a live
    /// agent in the owner's subtree holding no item, which the caller then
    /// gives the returned instruction, and whose `job.report` is the only one
    /// accepted for it. Without, a new worker is started for it (beyond
    /// `concurrency` if need be: the caller asked for this item now).
    pub(super) fn on_job_assign(
        &mut self,
        caller: &Caller,
        id: &str,
        item: &str,
        worker: Option<&AgentName>,
    ) -> Result<brood_api::AssignReply, ApiError> {
        let store = self.records.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.records.tenant, caller, id)?;
        if !self.jobs.runs.contains_key(id) {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "job {id} is {} here; items are assigned while it runs (start it first)",
                    job.status.as_str()
                ),
            ));
        }
        match worker {
            Some(w) => {
                if self.agents.live.get(w).is_none_or(|l| l.stopping.is_some()) {
                    return Err(ApiError::new(
                        Code::Conflict,
                        format!("agent {w} is not running here"),
                    ));
                }
                let under = self
                    .records
                    .store
                    .is_ancestor_or_self(&self.records.tenant, &job.owner, w)
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
                if let Some(held) = self.jobs.workers.get(w)
                    && let Some((i, _, _)) = &held.item
                {
                    return Err(ApiError::new(
                        Code::Conflict,
                        format!("agent {w} already holds item {i} of job {}", held.job),
                    ));
                }
                // An agent the runner started keeps counting as one of its own.
                let own = self
                    .jobs
                    .workers
                    .get(w)
                    .is_some_and(|h| h.own && h.job == id);
                let a = self.try_assign(id, w, Some(item), own)?;
                self.jobs.dirty.insert(id.to_owned());
                Ok(brood_api::AssignReply {
                    assigned: w.to_string(),
                    assignment: a,
                })
            }
            None => {
                let before = self.jobs.runs.get(id).map_or(0, |r| r.next_worker);
                self.start_worker(id, Some(item))?;
                let name = format!("{id}-w{}", before + 1);
                let attempt = self
                    .jobs
                    .workers
                    .get(
                        &AgentName::new(&name)
                            .map_err(|e| ApiError::new(Code::Internal, e.to_string()))?,
                    )
                    .and_then(|w| w.item.as_ref().map(|(_, a, _)| *a));
                self.jobs.dirty.insert(id.to_owned());
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
        }
    }

    /// `retry`: the failed `item` (or every failed item) back to `pending`;
    /// its attempts are kept and the next one continues their count (one
    /// more attempt each). A failed job reopens (`running`, its owner must
    /// run here); a running one takes the items up at once.
    pub(super) fn on_job_retry(
        &mut self,
        caller: &Caller,
        id: &str,
        item: Option<&str>,
    ) -> Result<brood_api::RetryReply, ApiError> {
        let store = self.records.store.clone();
        let job = crate::jobs::get(store.as_ref(), &self.records.tenant, caller, id)?;
        let items: Vec<String> = match item {
            Some(i) => vec![i.to_owned()],
            None => self
                .records
                .store
                .job_items(&self.records.tenant, id, Some(ItemStatus::Failed))
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
            if self.owner_gone(&job.owner) {
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
                let it = self
                    .records
                    .store
                    .job_items(&self.records.tenant, id, None)
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
            let events = self.job_event(
                &job.owner,
                json!({"type": "job.started", "job": id, "reopened": true}),
            );
            let reopened = self
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
            let mut run = self.load_run(&reopened)?;
            // A reopened job's max_runtime_s counts from now.
            run.deadline_ms = super::job_spec_runtime(&reopened).map(|ms| now_ms() + ms);
            self.jobs.runs.insert(id.to_owned(), run);
        }
        let mut retried = Vec::new();
        for i in &items {
            // No event of its own (SPEC 10's kinds have none): the retry
            // shows as the item's next `job.item.started`.
            self.records
                .store
                .retry_item(&self.records.tenant, id, i, now_ms(), &[])
                .map_err(job_error)?;
            if let Some(r) = self.jobs.runs.get_mut(id) {
                r.moved(ItemStatus::Failed, ItemStatus::Pending);
            }
            retried.push(i.clone());
        }
        self.jobs.dirty.insert(id.to_owned());
        Ok(brood_api::RetryReply {
            job: id.to_owned(),
            retried,
        })
    }
}
