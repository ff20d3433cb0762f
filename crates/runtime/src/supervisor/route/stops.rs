//! Routing for the stops' part ([`super::super::stops`]): the entry points
//! the rest of the supervisor calls to stop agents or remove a group, and
//! `Cmd::StopDone`, each lending the part what it reads and applying what
//! it returns: a stopped agent's end projected and told, its live entry
//! forgotten, a result collected once its group is empty.

use std::collections::VecDeque;

use brood_core::{AgentName, Terminal};
use brood_launch::cgroup::Group;

use crate::supervisor::disk::ToClear;
use crate::supervisor::stops::{Env, StopFollow, Stops};
use crate::supervisor::{Collect, Dispatcher};

impl Dispatcher {
    /// Removes the group of a run that ended (nothing left in it to stop).
    pub(in crate::supervisor) fn remove_group(&self, group: Option<Group>) {
        self.stops.remove_group(group, None, false);
    }

    /// [`Self::remove_group`], then (the group empty) the `artifact/` of
    /// `clear`, a channel whose run recorded no result, and the run's slot
    /// given back when it kept one (`slot`).
    pub(in crate::supervisor) fn remove_group_then_clear(
        &self,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
    ) {
        self.stops.remove_group(group, clear, slot);
    }

    /// Parent death for the descendants of an agent whose run already
    /// ended; `clear`: the parent's own channel, when its run recorded no
    /// result; `slot`: the parent's slot, kept until its group is empty.
    pub(in crate::supervisor) fn stop_descendants(
        &mut self,
        parent: &AgentName,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
    ) {
        let kept = self.with_stops(|stops, env| stops.descendants(parent, group, clear, slot, env));
        // No stop was begun: nothing empties the group now, and the slot
        // is not kept for ever (the orphan sweeper takes up the rest).
        if kept {
            self.launcher.emptied(1);
        }
    }

    /// Stops an agent and its whole subtree: the agent with `outcome`, every
    /// descendant with `parent_dead`.
    pub(in crate::supervisor) fn stop_subtree(&mut self, name: &AgentName, outcome: Terminal) {
        self.with_stops(|stops, env| stops.subtree(name, outcome, env));
    }

    /// Stops `targets` (in post-order, each with its outcome), `group`
    /// holding their processes.
    pub(in crate::supervisor) fn begin_stop(
        &mut self,
        targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
    ) {
        self.with_stops(|stops, env| stops.begin(targets, group, None, Vec::new(), 0, env));
    }

    /// [`Self::begin_stop`], then the collection of a result once the group
    /// is empty.
    pub(in crate::supervisor) fn begin_stop_then(
        &mut self,
        targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
        then: Option<Box<Collect>>,
    ) {
        self.with_stops(|stops, env| stops.begin(targets, group, then, Vec::new(), 0, env));
    }

    /// `Cmd::StopDone`: a stop's group is empty (its records are written
    /// and told) or could not be emptied (tried again).
    pub(in crate::supervisor) fn on_stop_done(&mut self, id: u64, emptied: Result<(), String>) {
        let follows = self.with_stops(|stops, env| stops.done(id, emptied, env));
        self.apply_stops(follows);
    }

    /// The part, lent what it reads and writes of the other parts.
    fn with_stops<R>(&mut self, f: impl FnOnce(&mut Stops, &mut Env<'_>) -> R) -> R {
        let mut env = Env {
            records: &self.records,
            agents: &mut self.agents,
            sockets: &mut self.sockets,
            ends_writer: &self.ends_writer,
            starts_writer: &self.starts_writer,
            me: &self.host.me,
            paths: &self.host.paths,
            metrics: &self.host.metrics,
        };
        f(&mut self.stops, &mut env)
    }

    /// The part's follow-ups, one at a time in order; what a step gives
    /// back comes before the rest.
    fn apply_stops(&mut self, follows: Vec<StopFollow>) {
        let mut todo = VecDeque::from(follows);
        while let Some(f) = todo.pop_front() {
            let more = match f {
                StopFollow::ProjectEnd {
                    events,
                    agent,
                    result,
                } => {
                    self.records.project_events(&events);
                    self.project_end(&agent, result.as_deref(), None);
                    Vec::new()
                }
                StopFollow::NotifyEnd { agent, result } => {
                    self.notify_end(&agent, result.as_deref(), None);
                    Vec::new()
                }
                StopFollow::Forget(name) => {
                    self.forget(&name);
                    Vec::new()
                }
                StopFollow::Collect(c) => {
                    self.collect(*c);
                    Vec::new()
                }
                StopFollow::Emptied(n) => {
                    self.launcher.emptied(n);
                    Vec::new()
                }
                StopFollow::Then(step) => self.with_stops(|stops, env| stops.resume(step, env)),
            };
            for m in more.into_iter().rev() {
                todo.push_front(m);
            }
        }
    }
}
