//! Routing for the ends' part ([`crate::supervisor::ends`]): the entry
//! points the rest of the supervisor calls when a run ends (`finish`,
//! `finish_recorded`, `after_end` and its halves, a result harvested and
//! collected, the ends kept to retry), each lending the part what it reads
//! and applying what it returns in order: an end recorded alone or with its
//! batch's, a parent on another node told, the waits answered, the live
//! entry forgotten, descendants stopped or the group removed, a stop before
//! a collection.

use brood_core::{AgentName, Terminal};
use brood_store::{Agent, StoreError};

use crate::supervisor::Dispatcher;
use crate::supervisor::ends::{
    Collect, EndFollow, Ended, Ending, Ends, Env, Finish, Harvested, RunEnding,
};

impl Dispatcher {
    /// A run is over and no stop covers it: record the outcome, tell the parent and
    /// the waiters, then clean up its group (and stop its descendants, if any).
    /// While the loop handles a batch of ends (`batch`), the record waits to
    /// be written with the others' ([`Self::finish_recorded`] follows).
    pub(in crate::supervisor) fn finish(
        &mut self,
        name: &AgentName,
        outcome: Terminal,
        exit_code: Option<i32>,
        result: Option<String>,
        detail: Option<String>,
        harvest: Option<crate::channel::Harvest>,
    ) {
        let Some(e) = self.with_ends(|_, env| {
            Ends::ending(name, outcome, exit_code, result, detail, harvest, env)
        }) else {
            return;
        };
        if let Some(later) = self.ends_together.as_mut() {
            later.push(e);
            return;
        }
        let r = e.record(self.records.store.as_ref(), &self.records.tenant);
        self.finish_recorded(e, r);
    }

    /// What follows a run's end the store recorded (or failed to: kept in
    /// the live entry and tried again at the next tick).
    pub(in crate::supervisor) fn finish_recorded(
        &mut self,
        e: Ending,
        recorded: Result<Agent, StoreError>,
    ) {
        self.finish_recorded_left(e, recorded, None);
    }

    /// [`Self::finish_recorded`], `below` saying whether the run left an
    /// unfinished descendant when that was read with the end's batch
    /// (`None`: read here, `Ends::left_behind`).
    pub(in crate::supervisor) fn finish_recorded_left(
        &mut self,
        e: Ending,
        recorded: Result<Agent, StoreError>,
        below: Option<bool>,
    ) {
        let Some(ended) = self.with_ends(|ends, env| ends.recorded(e, recorded, env)) else {
            return;
        };
        let Ended {
            name,
            agent,
            result,
            harvest,
            clear,
        } = ended;
        self.after_end(&agent, result.as_deref(), harvest.as_ref());
        let group = self.with_ends(|ends, env| ends.leaves(&name, env));
        // What the run left in its group may live until the group is
        // emptied below: its slot is given back then, not now.
        let slot = self.forget_until_emptied(&name, group.as_ref());
        let follow =
            self.with_ends(|ends, env| ends.left_behind(name, group, clear, slot, below, env));
        self.apply_end(follow);
    }

    /// The run ends that could not be recorded, recorded now (each tick).
    pub(in crate::supervisor) fn record_unrecorded_ends(&mut self) {
        let kept = self.with_ends(|ends, env| ends.unrecorded(env));
        for (name, u) in kept {
            let u = *u;
            self.finish(&name, u.outcome, u.exit_code, u.result, u.detail, u.harvest);
        }
    }

    /// Projection, parent notification, waiters: what follows any recorded end.
    pub(in crate::supervisor) fn after_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        self.project_end(agent, result, h);
        self.notify_end(agent, result, h);
    }

    /// An end's files (`Ends::project`).
    pub(in crate::supervisor) fn project_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        self.with_ends(|ends, env| ends.project(agent, result, h, env));
    }

    /// Tells the parent, a pending spawn reply and the waiters. Called only after
    /// the projection writes of the change are queued, so whoever is told and then
    /// flushes sees the files.
    pub(in crate::supervisor) fn notify_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        self.with_ends(|ends, env| ends.tell(agent, result, h, env));
        // A parent or customer another node runs hears of it there.
        self.tell_other_nodes_of_end(agent);
        let done = self.with_ends(|ends, env| ends.answer(agent, env));
        self.answer_waiters(done);
    }

    /// The protocol's `child` event for `p` (a parent or customer that runs
    /// here): the context pack (SPEC 4), the result, the refs' summaries and
    /// the artifacts they name; never the child's transcript.
    pub(in crate::supervisor) fn tell_of_end(
        &mut self,
        p: &AgentName,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        crate::supervisor::ends::tell_parent(p, agent, result, h, &self.agents);
    }

    /// Answers the waiters `ids` with the agents as they are now.
    pub(in crate::supervisor) fn answer_waiters(&mut self, ids: Vec<u64>) {
        for id in ids {
            if let Some(w) = self.waiters.take(id) {
                let r = self.wait_result(&w.names, false);
                crate::supervisor::answer(w.reply, r);
            }
        }
    }

    /// A run that ended with a result: its subtree stopped and its group
    /// emptied, then what it handed back collected (`Ends::harvest`); the
    /// end is recorded when that comes back.
    pub(in crate::supervisor) fn harvest(&mut self, ending: RunEnding) {
        if let Some(f) = self.with_ends(|ends, env| ends.harvest(ending, env)) {
            self.apply_end(f);
        }
    }

    /// Reads what a run handed back, its group empty (`Ends::collect`).
    pub(in crate::supervisor) fn collect(&mut self, c: Collect) {
        self.with_ends(|ends, env| ends.collect(c, env));
    }

    /// `Cmd::Harvested`: a collection's answer.
    pub(in crate::supervisor) fn on_harvested(&mut self, harvested: Harvested) {
        if let Some(f) = self.with_ends(|ends, env| ends.harvested(harvested, env)) {
            self.apply_end(f);
        }
    }

    /// The part, lent what it reads and writes of the other parts.
    fn with_ends<R>(&mut self, f: impl FnOnce(&mut Ends, &mut Env<'_>) -> R) -> R {
        let mut env = Env {
            records: &self.records,
            agents: &mut self.agents,
            waiters: &self.waiters,
            paths: &self.host.paths,
            metrics: &self.host.metrics,
            tracer: &self.host.tracer,
        };
        f(&mut self.ends, &mut env)
    }

    /// A follow-up of the part.
    fn apply_end(&mut self, f: EndFollow) {
        match f {
            EndFollow::Finish(f) => {
                let Finish { ending, harvest } = *f;
                self.finish(
                    &ending.name,
                    ending.outcome,
                    ending.exit_code,
                    ending.result,
                    ending.detail,
                    harvest,
                );
            }
            EndFollow::StopThenCollect {
                targets,
                group,
                collect,
            } => self.begin_stop_then(targets, group, Some(collect)),
            EndFollow::StopDescendants {
                parent,
                group,
                clear,
                slot,
            } => self.stop_descendants(&parent, group, clear, slot),
            EndFollow::RemoveGroup { group, clear, slot } => {
                self.remove_group_then_clear(group, clear, slot)
            }
        }
    }
}
