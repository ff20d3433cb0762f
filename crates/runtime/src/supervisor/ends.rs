//! A run's end recorded (when no stop covers it) and what follows any end: the
//! projection, the parent's context pack (SPEC 4), a pending spawn reply, the
//! waiters, and the stop of descendants left behind.

use super::{Dispatcher, UnrecordedEnd, answer, ev, now_ms};
use crate::objects::project_agent;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::RunId;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::Terminal;
use brood_proto::ToAgent;
use brood_store::Agent;
use brood_store::EndItem;
use brood_store::NewEvent;
use brood_store::RunEnd;
use brood_store::Store;
use brood_store::StoreError;
use serde_json::json;

impl Dispatcher {
    /// A run is over and no stop covers it: record the outcome, tell the parent and
    /// the waiters, then clean up its group (and stop its descendants, if any).
    /// While the loop handles a batch of ends (`batch`), the record waits to
    /// be written with the others' ([`Self::finish_recorded`] follows).
    pub(super) fn finish(
        &mut self,
        name: &AgentName,
        outcome: Terminal,
        exit_code: Option<i32>,
        result: Option<String>,
        detail: Option<String>,
        harvest: Option<crate::channel::Harvest>,
    ) {
        let Some(e) = self.finish_begins(name, outcome, exit_code, result, detail, harvest) else {
            return;
        };
        if let Some(later) = self.ends_together.as_mut() {
            later.push(e);
            return;
        }
        let r = e.record(self.records.store.as_ref(), &self.records.tenant);
        self.finish_recorded(e, r);
    }

    /// What a run's end records: its outcome and the events of it (in its
    /// log and in its parent's).
    fn finish_begins(
        &self,
        name: &AgentName,
        outcome: Terminal,
        exit_code: Option<i32>,
        result: Option<String>,
        detail: Option<String>,
        harvest: Option<crate::channel::Harvest>,
    ) -> Option<Ending> {
        let l = self.agents.live.get(name)?;
        let run = l.run.clone();
        let session = l.session.clone();
        let mut events = vec![ev(
            name,
            Some(&run),
            &session,
            AgentEvent::Stop {
                agent: name.clone(),
                outcome,
                swept: None,
            },
        )];
        if let (Some(p), Some(ps)) = (&l.parent, &l.parent_session) {
            events.push(ev(
                p,
                None,
                ps,
                AgentEvent::ChildStop {
                    parent: p.clone(),
                    child: name.clone(),
                    outcome,
                },
            ));
        }
        let end = RunEnd {
            outcome,
            exit_code,
            result,
            detail,
            now_ms: now_ms(),
            output: harvest.as_ref().map(|h| h.output.clone()),
        };
        Some(Ending {
            name: name.clone(),
            run,
            end,
            events,
            harvest,
        })
    }

    /// What follows a run's end the store recorded (or failed to: kept in
    /// the live entry and tried again at the next tick).
    pub(super) fn finish_recorded(&mut self, e: Ending, recorded: Result<Agent, StoreError>) {
        let Ending {
            name,
            run,
            end,
            events,
            harvest,
        } = e;
        let name = &name;
        let mut result = end.result;
        let mut harvest = harvest;
        let mut events = events;
        let agent = match recorded {
            Ok(a) => a,
            Err(err) if let Some(a) = self.ended_by_another(name, &run, &err) => {
                // Another writer (a sweeper, another node's recovery) ended
                // this run first: its outcome stands, and retrying ours
                // could only fail again, for ever (issue 28's campaign:
                // the node kept the agent and never stopped). What follows
                // an end follows the one recorded, which handed nothing back.
                tracing::warn!(agent = %name, recorded = %a.status.encode(), ours = %end.outcome.encode(), "the run's end was already recorded; its outcome stands");
                result = None;
                harvest = None;
                // Ours were not written: the log holds the other's.
                events.clear();
                a
            }
            Err(err) => {
                tracing::error!(agent = %name, error = %err, "recording the end of a run failed; retried at the next tick");
                if let Some(l) = self.agents.live.get_mut(name) {
                    l.unrecorded = Some(Box::new(UnrecordedEnd {
                        outcome: end.outcome,
                        exit_code: end.exit_code,
                        result,
                        detail: end.detail,
                        harvest,
                    }));
                }
                return;
            }
        };
        // A run that recorded no result hands nothing back (issue 24): what
        // it left in its channel's `artifact/` is set aside now, before
        // anyone hears of the end (so a resume finds an empty one), and goes
        // once its group is empty.
        let clear = match &harvest {
            None => super::disk::set_aside_artifacts(&self.agents, &self.host.paths, name),
            Some(_) => None,
        };
        self.records.project_events(&events);
        self.after_end(&agent, result.as_deref(), harvest.as_ref());
        let group = self.agents.live.get_mut(name).and_then(|l| l.group.take());
        self.forget(name);
        // Owned children die with their parent (SPEC 6), or at least its leftovers do.
        // A read that fails is not taken for "no children": the stop plans
        // again (issue 28).
        let unfinished = match self
            .records
            .store
            .descendants_post_order(&self.records.tenant, name)
        {
            Ok(d) => d.into_iter().any(|a| !a.status.is_finished()),
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "reading the descendants of an ended agent failed; stopping them as planned again");
                true
            }
        };
        if unfinished {
            self.stop_descendants(name, group, clear);
        } else {
            self.remove_group_then_clear(group, clear);
        }
    }

    /// The record of `name` when `err` refused our end because that run is
    /// already over (its end recorded by another writer); `None` for any
    /// other failure, which is worth retrying. A read that fails is not
    /// taken for an end.
    fn ended_by_another(&self, name: &AgentName, run: &RunId, err: &StoreError) -> Option<Agent> {
        if !matches!(err, StoreError::Transition { .. }) {
            return None;
        }
        let a = self
            .records
            .store
            .agent(&self.records.tenant, name)
            .ok()
            .flatten()?;
        (a.run == *run && a.status.is_finished()).then_some(a)
    }

    /// The run ends that could not be recorded, recorded now (each tick).
    pub(super) fn record_unrecorded_ends(&mut self) {
        let kept: Vec<(AgentName, Box<UnrecordedEnd>)> = self
            .agents
            .live
            .iter_mut()
            .filter_map(|(n, l)| l.unrecorded.take().map(|u| (n.clone(), u)))
            .collect();
        for (name, u) in kept {
            let u = *u;
            self.finish(&name, u.outcome, u.exit_code, u.result, u.detail, u.harvest);
        }
    }

    /// Projection, parent notification, waiters: what follows any recorded end.
    pub(super) fn after_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        self.project_end(agent, result, h);
        self.notify_end(agent, result, h);
    }

    pub(super) fn project_end(
        &self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        project_agent(&self.records.projection, &self.host.paths, agent, None);
        self.records.project_channel(&self.agents, agent, result);
        if let (Some(h), Some(dir)) = (h, self.records.channel_dir_of(&self.agents, agent)) {
            self.records
                .projection
                .write(dir.join("refs.jsonl"), h.output.refs.clone());
        }
        if crate::objects::object_removed(agent) {
            self.records
                .projection
                .remove_dir(self.host.paths.agent_dir(&agent.name));
            self.records
                .projection
                .remove_dir(self.host.paths.shim(&agent.name));
        }
    }

    /// Tells the parent, a pending spawn reply and the waiters. Called only after
    /// the projection writes of the change are queued, so whoever is told and then
    /// flushes sees the files.
    pub(super) fn notify_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        if let Status::Ended(t) = agent.status {
            let took = self
                .agents
                .live
                .get(&agent.name)
                .map(|l| l.admitted.elapsed());
            self.host.metrics.invocation(t.word(), took);
            // Its `invoke_agent` span, built from its records off the loop.
            self.host.tracer.run_ended(&agent.tenant, agent);
            let trace = self
                .agents
                .live
                .get(&agent.name)
                .and_then(|l| l.trace)
                .or_else(|| crate::trace::Placed::of_agent(agent));
            crate::trace::log_span(&agent.name, &agent.run, trace).in_scope(|| {
                tracing::info!(status = %agent.status.encode(), "run ended");
            });
        }
        // The parent hears of its child's end, and so does the customer when it
        // is someone else (SPEC 7 `child`; SPEC 9: the customer takes the result).
        let told = agent.parent.iter().chain(
            agent
                .customer
                .iter()
                .filter(|c| Some(*c) != agent.parent.as_ref()),
        );
        let told: Vec<AgentName> = told.cloned().collect();
        for p in &told {
            self.tell_of_end(p, agent, result, h);
        }
        // A parent or customer another node runs hears of it there.
        self.tell_other_nodes_of_end(agent);
        if let Some(l) = self.agents.live.get_mut(&agent.name)
            && let Some((reply, _)) = l.spawn_reply.take()
        {
            answer(reply, Ok(agent_view(&self.records.store, agent)));
        }
        let done = self
            .waiters
            .done_with(&agent.name, |n| self.finished_in_store(n));
        self.answer_waiters(done);
    }

    /// The protocol's `child` event for `p` (a parent or customer that runs
    /// here): the context pack (SPEC 4), the result, the refs' summaries and
    /// the artifacts they name; never the child's transcript.
    pub(super) fn tell_of_end(
        &mut self,
        p: &AgentName,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        let pack = crate::channel::pack(result, h);
        let event = json!({"status": agent.status.api_word(), "reason": agent.status.reason(), "result": result, "refs": pack["refs"], "artifacts": pack["artifacts"]});
        self.agents.to_agent(
            p,
            &ToAgent::Child {
                child: agent.name.to_string(),
                event,
            },
        );
    }

    pub(super) fn finished_in_store(&self, n: &AgentName) -> bool {
        self.records
            .store
            .agent(&self.records.tenant, n)
            .ok()
            .flatten()
            .is_some_and(|a| a.status.is_finished())
    }

    /// Answers the waiters `ids` with the agents as they are now.
    pub(super) fn answer_waiters(&mut self, ids: Vec<u64>) {
        for id in ids {
            if let Some(w) = self.waiters.take(id) {
                let r = self.wait_result(&w.names, false);
                answer(w.reply, r);
            }
        }
    }
}

/// A run's end, worked out and waiting to be recorded (`finish`).
pub(super) struct Ending {
    pub(super) name: AgentName,
    pub(super) run: RunId,
    pub(super) end: RunEnd,
    pub(super) events: Vec<NewEvent>,
    harvest: Option<crate::channel::Harvest>,
}

impl Ending {
    /// The end as one item of `Store::end_runs`.
    pub(super) fn item(&self) -> EndItem {
        EndItem {
            name: self.name.clone(),
            run: self.run.clone(),
            end: Some(self.end.clone()),
            events: self.events.clone(),
            now_ms: self.end.now_ms,
        }
    }

    /// The end's record, alone (`Store::end_run`); with others, it is one
    /// item of `Store::end_runs` (`batch`).
    pub(super) fn record(&self, store: &dyn Store, tenant: &TenantId) -> Result<Agent, StoreError> {
        store.end_run(tenant, &self.name, &self.run, &self.end, &self.events)
    }
}
