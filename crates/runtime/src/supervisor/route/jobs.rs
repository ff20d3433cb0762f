//! The jobs runner's commands, clock and after-command work routed to it,
//! and its follow-ups applied: admitting a worker, stopping a subtree,
//! noting a refusal, and handing the runner its next step.

use std::collections::VecDeque;

use crate::api::Caller;
use crate::supervisor::Dispatcher;
use crate::supervisor::jobs::{Env, JobFollow, JobOp, Runner};

impl Dispatcher {
    /// `Cmd::Job`.
    pub(in crate::supervisor) fn on_job(&mut self, caller: &Caller, op: JobOp) {
        let follows = self.with_jobs(|jobs, env| jobs.op(caller, op, env));
        self.apply_jobs(follows);
    }

    /// The sweepers' clock, for the runner.
    pub(in crate::supervisor) fn job_tick(&mut self) {
        let follows = self.with_jobs(|jobs, env| jobs.tick(env));
        self.apply_jobs(follows);
    }

    /// After each command: workers that ended, jobs topped up and finished.
    pub(in crate::supervisor) fn drive_jobs(&mut self) {
        let follows = self.with_jobs(|jobs, env| jobs.drive(env));
        self.apply_jobs(follows);
    }

    /// The runner, lent what it reads of the other parts.
    fn with_jobs<R>(&mut self, f: impl FnOnce(&mut Runner, &Env<'_>) -> R) -> R {
        let records = &self.records;
        let project = |events: &[brood_store::NewEvent]| records.project_events(events);
        let env = Env {
            store: records.store.as_ref(),
            tenant: &records.tenant,
            project: &project,
            agents: &self.agents,
            tracer: &self.host.tracer,
        };
        f(&mut self.jobs, &env)
    }

    /// The runner's follow-ups, one at a time in order; what one gives back
    /// comes before the rest.
    fn apply_jobs(&mut self, follows: Vec<JobFollow>) {
        let mut todo = VecDeque::from(follows);
        while let Some(f) = todo.pop_front() {
            let more = match f {
                JobFollow::AdmitWorker { req, then } => {
                    let operator = Caller::User { uid: self.host.uid };
                    let r = self.admit(&operator, *req).map(|_| ());
                    self.jobs.admitted(then, r)
                }
                JobFollow::Stop(agent, outcome) => {
                    self.stop_subtree(&agent, outcome);
                    Vec::new()
                }
                JobFollow::Refused {
                    owner,
                    worker,
                    error,
                } => {
                    self.note_refusal(Some(&owner), Some(worker.as_str()), None, &error);
                    Vec::new()
                }
                JobFollow::Then(step) => self.with_jobs(|jobs, env| jobs.resume(step, env)),
            };
            for m in more.into_iter().rev() {
                todo.push_front(m);
            }
        }
    }
}
