//! Removals on the dispatcher (issue 25): a finished tree (`brood rm`,
//! `DELETE /api/agents/{name}`) and a job (`brood job rm`, `DELETE
//! /api/jobs/{id}`). On the loop, like every other write, so a removal and
//! a resume (or a job's start) of the same names are ordered; each is one
//! store transaction (`brood_store::Removal`), and the files it leaves go
//! through the projection thread, after every write queued before them.
//! A prune is many tree removals, each its own command (`Supervisor::prune`),
//! so the loop answers between them.
//!
//! Removal holds no state of its own: each call is lent what it reads and
//! writes of the other parts ([`Env`]) by `route::remove`.

use std::path::Path;

use brood_core::{AgentName, Code};
use brood_store::Removed;
use serde_json::json;

use brood_launch::cgroup::Cgroups;

use super::agents::Agents;
use super::jobs::Runner;
use super::records::Records;
use super::{Reply, answer, internal, now_ms};
use crate::api::{ApiError, Caller};
use crate::paths::Paths;
use crate::remove;

/// What is removed, and where its typed answer goes.
pub(crate) enum RemoveOp {
    /// A root's whole tree, every agent of it finished.
    Tree(AgentName, Reply<brood_api::RemovedTree>),
    /// A job that is not running, with its own workers' subtrees.
    Job(String, Reply<brood_api::RemovedJob>),
}

/// What a removal reads and writes of the rest of the supervisor.
pub(super) struct Env<'a> {
    pub(super) records: &'a Records,
    /// Who is still held here, and what is remembered of the removed.
    pub(super) agents: &'a mut Agents,
    /// Whether a job runs.
    pub(super) jobs: &'a Runner,
    pub(super) paths: &'a Paths,
    pub(super) cgroups: Option<&'a std::sync::Arc<Cgroups>>,
}

impl Env<'_> {
    pub(super) fn on_remove(mut self, caller: &Caller, op: RemoveOp) {
        match op {
            RemoveOp::Tree(name, reply) => answer(reply, self.remove_tree(caller, &name)),
            RemoveOp::Job(id, reply) => answer(reply, self.remove_job(caller, &id)),
        }
    }

    fn remove_tree(
        &mut self,
        caller: &Caller,
        name: &AgentName,
    ) -> Result<brood_api::RemovedTree, ApiError> {
        remove::removable_root(
            self.records.store.as_ref(),
            &self.records.tenant,
            caller,
            name,
        )?;
        let removed = self.remove_subtree(name)?;
        let last = removed.agents.iter().map(|a| a.updated_ms).max();
        Ok(remove::removed_tree(name, removed.agents.len(), last))
    }

    /// Whether this supervisor still holds `name`: a run whose end is being
    /// recorded or whose files are being fetched. Its record may say it
    /// ended; what follows the end has not happened yet.
    fn held_here(&self, name: &AgentName) -> Option<ApiError> {
        (self.agents.live.contains_key(name) || self.agents.fetching.contains(name)).then(|| {
            ApiError::new(
                Code::Conflict,
                format!("agent {name} is still being finished here; ask again in a moment"),
            )
        })
    }

    /// `top`'s subtree out of the store, then out of the ctx tree.
    fn remove_subtree(&mut self, top: &AgentName) -> Result<Removed, ApiError> {
        let below = self
            .records
            .store
            .descendants_post_order(&self.records.tenant, top)
            .map_err(ApiError::from)?;
        // An agent whose record has not ended is the store's to refuse, by
        // its status; one whose record has is not gone until this
        // supervisor lets it go.
        let top_ended = self
            .records
            .store
            .agent(&self.records.tenant, top)
            .map_err(ApiError::from)?
            .is_some_and(|a| a.status.is_finished());
        if top_ended && below.iter().all(|a| a.status.is_finished()) {
            for n in std::iter::once(top).chain(below.iter().map(|a| &a.name)) {
                if let Some(e) = self.held_here(n) {
                    return Err(e);
                }
            }
        }
        let removed = self
            .records
            .store
            .remove_tree(&self.records.tenant, top)
            .map_err(ApiError::from)?;
        self.after_removal(&removed);
        Ok(removed)
    }

    fn remove_job(&mut self, caller: &Caller, id: &str) -> Result<brood_api::RemovedJob, ApiError> {
        let job = crate::jobs::get(
            self.records.store.as_ref(),
            &self.records.tenant,
            caller,
            id,
        )?;
        if self.jobs.runs_job(id) {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "job {id} is running: cancel it first (brood job cancel {id}), then remove \
                     it once its workers have ended"
                ),
            ));
        }
        let own = self.agents.live.iter().find(|(n, l)| {
            brood_store::is_job_worker(id, n.as_str()) && l.parent.as_ref() == Some(&job.owner)
        });
        if let Some((n, _)) = own {
            return Err(ApiError::new(
                Code::Conflict,
                format!("job {id}'s worker {n} has not ended yet; remove the job once it has"),
            ));
        }
        let events = super::jobs::job_event(
            &*self.agents,
            &job.owner,
            json!({"type": "job.removed", "job": id}),
        );
        let r = self
            .records
            .store
            .remove_job(&self.records.tenant, id, now_ms(), &events)
            .map_err(|e| match e {
                brood_store::StoreError::Refused { code, message } => ApiError::new(code, message),
                other => internal(other),
            })?;
        self.records.project_events(&events);
        self.after_removal(&r.workers);
        Ok(brood_api::RemovedJob {
            job: r.job.id,
            status: r.job.status.as_str().to_owned(),
            agents: r
                .workers
                .agents
                .iter()
                .map(|a| a.name.to_string())
                .collect(),
        })
    }

    /// What a committed removal leaves: its ctx files and the blobs no
    /// record names (through the projection, after what was queued before
    /// them, so a caller that flushes sees them gone), any cgroup of this
    /// incarnation its runs left (off the loop), and what the dispatcher
    /// remembered of its agents.
    fn after_removal(&mut self, removed: &Removed) {
        for p in remove::ctx_paths(self.paths, removed)
            .into_iter()
            .chain(remove::blob_paths(self.paths, removed))
        {
            self.records.projection.remove_dir(p);
        }
        if let Some(cg) = self.cgroups.cloned() {
            let groups: Vec<_> = removed
                .cgroups
                .iter()
                .filter_map(|dir| cg.group_at(Path::new(dir)))
                .collect();
            if !groups.is_empty() {
                tokio::task::spawn_blocking(move || {
                    for g in groups {
                        if let Err(e) = cg.remove(&g) {
                            tracing::warn!(group = %g.dir.display(), error = %e, "removing a removed agent's cgroup");
                        }
                    }
                });
            }
        }
        let gone: std::collections::HashSet<&AgentName> =
            removed.agents.iter().map(|a| &a.name).collect();
        self.agents
            .ends_told
            .retain(|child, (parent, _)| !gone.contains(child) && !gone.contains(parent));
    }
}
