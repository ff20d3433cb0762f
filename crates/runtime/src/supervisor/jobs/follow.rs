//! The runner's entry points and what comes back from them: the follow-ups
//! another part must carry out ([`JobFollow`]), in the order they must
//! happen, interleaved with the runner's own next steps ([`Step`]) where a
//! step must wait for the follow-up before it (a worker is stopped before
//! the next one's attempt is failed; a job is topped up with its next worker
//! only once the last one was admitted). The loop applies them one at a
//! time (`supervisor::route::jobs`), so the store sees the same writes in
//! the same order as if the runner had done everything itself.

use brood_core::{AgentName, Code, JobStatus, Terminal};

use super::{Env, JobOp, Runner};
use crate::api::{ApiError, Caller, SpawnRequest};
use crate::supervisor::{Reply, answer, now_ms};

/// What the runner needs another part of the supervisor to do.
pub(in crate::supervisor) enum JobFollow {
    /// Admit `req` (a worker, a child of its job's owner) as the operator,
    /// then hand what admission said back with [`Runner::admitted`].
    AdmitWorker {
        req: Box<SpawnRequest>,
        then: Admitting,
    },
    /// Stop this agent's subtree with this outcome: an own worker of a job
    /// that ended early, or one whose attempt timed out.
    Stop(AgentName, Terminal),
    /// A worker's creation was refused: noted as any refused child is (its
    /// owner's `child.refused`, the metrics).
    Refused {
        owner: AgentName,
        worker: AgentName,
        error: ApiError,
    },
    /// The runner's own next step, once the follow-ups before it are
    /// applied: handed back with [`Runner::resume`].
    Then(Step),
}

/// A step of the runner's own work, waiting for the follow-ups before it.
pub(in crate::supervisor) struct Step(Next);

enum Next {
    /// One worker of an ending job: its attempt failed with `why`, it
    /// leaves the job, and it is stopped with `stop` if the runner started it.
    EndWorker {
        worker: AgentName,
        why: &'static str,
        stop: Option<Terminal>,
    },
    /// A job ends (its workers planned now, at this step).
    End {
        id: String,
        owner: AgentName,
        to: JobStatus,
        reason: Option<&'static str>,
        then: OnEnd,
    },
    /// An ending job, its workers dealt with: its last progress and status.
    Ended {
        id: String,
        owner: AgentName,
        to: JobStatus,
        reason: Option<&'static str>,
        then: OnEnd,
    },
    /// An attempt past its `item_timeout_s`.
    Late {
        worker: AgentName,
        own: bool,
    },
    /// Jobs past their `max_runtime_s` at `now` end.
    Overdue {
        now: i64,
    },
    /// Every running job's progress, on the clock.
    ProgressAll,
    /// One more worker for the job if it wants one.
    TopUp(String),
    /// The job ends if it is done.
    Finish(String),
    Progress(String),
    /// A worker whose creation was refused: its attempt failed, it forgotten.
    Refused {
        admitting: Admitting,
        error: ApiError,
    },
}

/// Who is told when a job has ended.
pub(super) enum OnEnd {
    /// The caller of `cancel`, with the job's view.
    Answer(Reply<brood_api::JobView>),
    /// Nobody: a failure is logged with this.
    Log(&'static str),
}

/// A worker being admitted, and what its admission was for.
pub(in crate::supervisor) struct Admitting {
    job: String,
    worker: AgentName,
    owner: AgentName,
    purpose: Purpose,
}

enum Purpose {
    /// Topping the job up to its concurrency: the next worker once admitted.
    TopUp,
    /// `assign` without a worker: the caller is answered.
    Assign {
        item: String,
        /// The job's `next_worker` before this one.
        before: u32,
        reply: Reply<brood_api::AssignReply>,
    },
}

impl Admitting {
    /// A worker admitted for `assign` (the job's `next_worker` was
    /// `before`): the caller is answered once admission is known.
    pub(super) fn for_assign(
        job: &str,
        worker: AgentName,
        owner: AgentName,
        item: &str,
        before: u32,
        reply: Reply<brood_api::AssignReply>,
    ) -> Admitting {
        Admitting {
            job: job.to_owned(),
            worker,
            owner,
            purpose: Purpose::Assign {
                item: item.to_owned(),
                before,
                reply,
            },
        }
    }
}

impl Step {
    pub(super) fn end_worker(
        worker: AgentName,
        why: &'static str,
        stop: Option<Terminal>,
    ) -> JobFollow {
        JobFollow::Then(Step(Next::EndWorker { worker, why, stop }))
    }

    pub(super) fn ended(
        id: &str,
        owner: &AgentName,
        to: JobStatus,
        reason: Option<&'static str>,
        then: OnEnd,
    ) -> JobFollow {
        JobFollow::Then(Step(Next::Ended {
            id: id.to_owned(),
            owner: owner.clone(),
            to,
            reason,
            then,
        }))
    }
}

fn then(n: Next) -> JobFollow {
    JobFollow::Then(Step(n))
}

impl Runner {
    /// A job command (SPEC 10 "Control"). Its caller is answered here when
    /// the answer is known now, else by the step that knows it.
    pub(in crate::supervisor) fn op(
        &mut self,
        caller: &Caller,
        op: JobOp,
        env: &Env,
    ) -> Vec<JobFollow> {
        match op {
            JobOp::Start(id, reply) => answer(reply, self.start(caller, &id, env)),
            JobOp::Cancel(id, reply) => return self.cancel(caller, &id, reply, env),
            JobOp::Report(args, reply) => {
                let r = match caller {
                    Caller::Agent(me) => self.report(me, &args, env),
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
            } => return self.assign_op(caller, &job, &item, worker.as_ref(), reply, env),
            JobOp::Retry { job, item, reply } => {
                answer(reply, self.retry(caller, &job, item.as_deref(), env))
            }
        }
        Vec::new()
    }

    /// What the runner does on the sweepers' clock: once, the attempts a
    /// dead incarnation was running are failed; running jobs whose owner
    /// runs here are taken up; attempts and jobs past their time end;
    /// progress is told.
    pub(in crate::supervisor) fn tick(&mut self, env: &Env) -> Vec<JobFollow> {
        if !self.recovered {
            self.recovered = true;
            self.recover_jobs(env);
        }
        self.take_up_jobs(env);
        // Items whose backoff ended wait for a worker: look again each tick.
        let running: Vec<String> = self.runs.keys().cloned().collect();
        self.dirty.extend(running);
        let now = now_ms();
        let mut steps: Vec<JobFollow> = self
            .workers
            .iter()
            .filter(|(_, w)| w.item.as_ref().is_some_and(|(_, _, d)| *d <= now))
            .map(|(n, w)| {
                then(Next::Late {
                    worker: n.clone(),
                    own: w.own,
                })
            })
            .collect();
        steps.push(then(Next::Overdue { now }));
        steps.push(then(Next::ProgressAll));
        steps
    }

    /// After each command: workers that ended, jobs topped up with workers,
    /// jobs that are done, progress.
    pub(in crate::supervisor) fn drive(&mut self, env: &Env) -> Vec<JobFollow> {
        for w in std::mem::take(&mut self.gone) {
            let why = self.worker_end(&w, env);
            self.fail_work(&w, &why, env);
            if let Some(work) = self.workers.remove(&w) {
                if work.own
                    && let Some(run) = self.runs.get_mut(&work.job)
                {
                    run.workers = run.workers.saturating_sub(1);
                }
                self.dirty.insert(work.job);
            }
        }
        std::mem::take(&mut self.dirty)
            .into_iter()
            .flat_map(|job| {
                [
                    then(Next::TopUp(job.clone())),
                    then(Next::Finish(job.clone())),
                    then(Next::Progress(job)),
                ]
            })
            .collect()
    }

    /// A step handed back, its follow-ups before it applied.
    pub(in crate::supervisor) fn resume(&mut self, step: Step, env: &Env) -> Vec<JobFollow> {
        match step.0 {
            Next::EndWorker { worker, why, stop } => {
                self.fail_work(&worker, why, env);
                let own = self.workers.remove(&worker).is_some_and(|w| w.own);
                // An agent given an item by `assign` is not the job's to stop.
                match stop {
                    Some(t) if own => return vec![JobFollow::Stop(worker, t)],
                    _ => {}
                }
            }
            Next::End {
                id,
                owner,
                to,
                reason,
                then,
            } => return self.end_job(&id, &owner, to, reason, then),
            Next::Ended {
                id,
                owner,
                to,
                reason,
                then,
            } => {
                let r = self.ended(&id, &owner, to, reason, env);
                match then {
                    OnEnd::Answer(reply) => {
                        answer(reply, r.and_then(|job| crate::jobs::view(env.store, &job)))
                    }
                    OnEnd::Log(what) => {
                        if let Err(e) = r {
                            tracing::warn!(job = id, error = %e, "{what}");
                        }
                    }
                }
            }
            Next::Late { worker, own } => {
                self.fail_work(&worker, "the attempt timed out (item_timeout_s)", env);
                if own {
                    return vec![JobFollow::Stop(
                        worker,
                        Terminal::Failed(brood_core::FailReason::TimedOut),
                    )];
                }
                // Not the job's agent to stop: it just holds nothing now, and
                // a late report from it is refused.
                self.workers.remove(&worker);
            }
            Next::Overdue { now } => {
                return self
                    .runs
                    .iter()
                    .filter(|(_, r)| r.deadline_ms.is_some_and(|d| d <= now))
                    .map(|(id, r)| {
                        then(Next::End {
                            id: id.clone(),
                            owner: r.owner.clone(),
                            to: JobStatus::Failed,
                            reason: Some("the job ran past max_runtime_s"),
                            then: OnEnd::Log("failing a job past max_runtime_s"),
                        })
                    })
                    .collect();
            }
            Next::ProgressAll => {
                let ids: Vec<String> = self.runs.keys().cloned().collect();
                for id in ids {
                    self.emit_progress(&id, false, env);
                }
            }
            Next::TopUp(job) => {
                if let Some((worker, owner, req)) = self.want_worker(&job, env) {
                    return vec![JobFollow::AdmitWorker {
                        req: Box::new(req),
                        then: Admitting {
                            job,
                            worker,
                            owner,
                            purpose: Purpose::TopUp,
                        },
                    }];
                }
            }
            Next::Finish(job) => return self.maybe_finish(&job, env),
            Next::Progress(job) => self.emit_progress(&job, false, env),
            Next::Refused { admitting, error } => {
                let Admitting {
                    worker, purpose, ..
                } = admitting;
                self.fail_work(
                    &worker,
                    &format!("the worker could not be created: {error}"),
                    env,
                );
                self.workers.remove(&worker);
                match purpose {
                    // A refusal ends this round of topping up.
                    Purpose::TopUp => {}
                    Purpose::Assign { reply, .. } => answer(reply, Err(error)),
                }
            }
        }
        Vec::new()
    }

    /// What admission said of a worker this runner asked for.
    pub(in crate::supervisor) fn admitted(
        &mut self,
        a: Admitting,
        r: Result<(), ApiError>,
    ) -> Vec<JobFollow> {
        if let Err(error) = r {
            return vec![
                JobFollow::Refused {
                    owner: a.owner.clone(),
                    worker: a.worker.clone(),
                    error: error.clone(),
                },
                then(Next::Refused {
                    admitting: a,
                    error,
                }),
            ];
        }
        if let Some(run) = self.runs.get_mut(&a.job) {
            run.workers += 1;
        }
        match a.purpose {
            Purpose::TopUp => vec![then(Next::TopUp(a.job))],
            Purpose::Assign {
                item,
                before,
                reply,
            } => {
                answer(reply, self.assigned_new(&a.job, &item, before));
                Vec::new()
            }
        }
    }
}
