//! The sweepers' clock routed: each tick, every part's periodic work in
//! turn, the sweepers' passes (`sweep`) lent what they read and their
//! follow-ups applied: ends told, queued agents dropped, recorded stops
//! carried out, lost nodes declared.

use brood_core::Code;
use brood_store::{Agent, Fence, StoreError};

use crate::supervisor::Dispatcher;
use crate::supervisor::sweep::{self, Due, Env, SweepFollow, Sweeps};

impl Dispatcher {
    /// `Cmd::Tick`.
    pub(in crate::supervisor) fn on_tick(&mut self) {
        let due = self.sweep.tick();
        self.launcher.give_spare(&self.records.tenant);
        self.record_unrecorded_ends();
        self.node_tick();
        if due.orphans {
            self.end_records_without_agents();
        }
        self.orphans.reap(&self.launcher.spawner, &self.agents);
        self.orphans.watch_keeper(&self.launcher.spawner);
        // Every supervisor for the agents it hosts, lease or not: only it
        // can stop their processes.
        self.disk.start(
            &self.agents,
            &self.host.paths,
            self.host.cfg.resource_defaults.disk_max,
            self.launcher.cgroups.clone(),
            &self.host.tx,
        );
        if let Some(fence) = self.with_sweeps(|s, env| s.hold_lease(env))
            && let Err(e) = self.sweep_passes(&fence, due)
        {
            if matches!(&e, StoreError::Refused { code, .. } if *code == Code::Conflict) {
                // Fenced off: someone else holds the lease now.
                tracing::warn!(error = %e, "sweeper lease lost");
                self.sweep.fenced_off();
            } else {
                tracing::error!(error = %e, "a sweeper pass failed; the next tick retries");
            }
        }
        self.carry_out_recorded_stops();
        self.answer_remote_waits();
        if due.reconcile {
            let holder = self.sweep.holds_lease();
            let shared = self.host.cfg.slots.is_some() || self.host.cfg.node.is_some();
            sweep::reconcile_slots(
                &mut self.launcher,
                &self.agents,
                self.records.store.as_ref(),
                &self.records.tenant,
                &self.host.metrics,
                holder,
                shared,
            );
        }
    }

    /// The lease holder's passes, each one's follow-ups applied before the
    /// next pass reads: what a pass wrote before an error is still
    /// followed up.
    fn sweep_passes(&mut self, fence: &Fence, due: Due) -> Result<(), StoreError> {
        let mut follows = Vec::new();
        let r = self.with_sweeps(|s, env| s.timeouts(env, fence, &mut follows));
        self.apply_sweeps(std::mem::take(&mut follows));
        r?;
        if due.orphans {
            let r = self.with_sweeps(|s, env| s.orphans(env, fence, &mut follows));
            self.apply_sweeps(std::mem::take(&mut follows));
            let lost = r?;
            // The nodes first: what of theirs can move moves, before the
            // agents of supervisors that are not nodes end.
            for id in &lost.nodes {
                self.declare_lost(id);
            }
            let r = self.with_sweeps(|s, env| s.end_lost(env, fence, lost, &mut follows));
            self.apply_sweeps(follows);
            r?;
        }
        if due.reconcile {
            let over = sweep::over_budget(
                &mut self.agents,
                self.records.store.as_ref(),
                &self.records.tenant,
                &self.host.metrics,
            );
            for n in over {
                // An ancestor's stop may already cover it.
                if self
                    .agents
                    .live
                    .get(&n)
                    .is_some_and(|l| l.stopping.is_none())
                {
                    self.stop_for_budget(&n);
                }
            }
        }
        Ok(())
    }

    /// Every supervisor, every tick and on news: the stops recorded for its
    /// agents that it is not carrying out yet, carried out (`sweep::recorded_stops`).
    pub(in crate::supervisor) fn carry_out_recorded_stops(&mut self) {
        let follows = self.with_sweeps(|_, env| sweep::recorded_stops(env));
        self.apply_sweeps(follows);
    }

    /// The sweepers, lent what they read of the other parts.
    fn with_sweeps<R>(&mut self, f: impl FnOnce(&mut Sweeps, &Env<'_>) -> R) -> R {
        let records = &self.records;
        let project = |events: &[brood_store::NewEvent]| records.project_events(events);
        let env = Env {
            store: records.store.as_ref(),
            tenant: &records.tenant,
            me: &self.host.me,
            metrics: &self.host.metrics,
            paths: &self.host.paths,
            project: &project,
            agents: &self.agents,
            admitting: &self.admitting,
            ends_writer: &self.ends_writer,
        };
        f(&mut self.sweep, &env)
    }

    /// The passes' follow-ups, in order.
    fn apply_sweeps(&mut self, follows: Vec<SweepFollow>) {
        for f in follows {
            match f {
                SweepFollow::Ended(a) => self.after_end(&a, None, None),
                SweepFollow::EndedQueued(a) => self.drop_unstarted(&a),
                SweepFollow::Stop(targets, group) => self.begin_stop(targets, group),
            }
        }
    }

    /// An agent still waiting for a slot whose record a sweeper just ended:
    /// it will never start; tell whoever waits for it.
    fn drop_unstarted(&mut self, a: &Agent) {
        let unstarted = self
            .agents
            .live
            .get(&a.name)
            .is_some_and(|l| l.pending.is_some() && !l.launching);
        if unstarted {
            self.after_end(a, None, None);
            self.forget(&a.name);
            self.launcher.waiting.remove(&a.name);
        }
    }
}
