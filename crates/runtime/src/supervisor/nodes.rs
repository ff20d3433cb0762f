//! This supervisor as a node of the cluster sharing its store (issue 15):
//! its heartbeat on every tick; the nodes whose heartbeat expired, declared
//! lost (their queue and their resumable agents move to live nodes, the
//! rest ends `failed (lost)` and its children elsewhere are then orphans the
//! sweepers cancel `parent_dead`, the lease's lock they may still hold is
//! broken: `moved`); and, when this node finds it was declared lost itself
//! (paused past its heartbeat, cut off from the store), its agents recorded
//! lost stopped and those moved let go of: the fence the others put up
//! holds.

use brood_core::{AgentName, Code, FailReason, Status, Terminal};
use brood_store::{Agent, NewNode, RunEnd, StoreError};

use super::{Dispatcher, now_ms};

impl Dispatcher {
    fn node_record(&self) -> Option<NewNode> {
        let node = self.host.cfg.node.as_ref()?;
        Some(NewNode {
            id: self.host.me.clone(),
            address: node.address.clone(),
            labels: super::node_labels(&node.labels),
            capacity: node.capacity,
        })
    }

    /// Another node changed the store: what it may have done to this node's
    /// agents (stops recorded for them, ends of agents waited for here) is
    /// carried out now rather than at the next tick. The event log's readers
    /// look again after this command, as after any.
    pub(super) fn on_news(&mut self) {
        self.claim_placed_agents();
        self.deliver_routed_inputs();
        self.answer_ready_waits(None);
        self.carry_out_recorded_stops();
        self.answer_remote_waits();
    }

    /// The node's part of each tick: its heartbeat, then the others'.
    pub(super) fn node_tick(&mut self) {
        if self.host.cfg.node.is_none() {
            return;
        }
        self.heartbeat();
        self.declare_lost_nodes();
        self.claim_placed_agents();
        self.deliver_routed_inputs();
        self.answer_ready_waits(None);
        // A parent gone hears of no more ends.
        let live = &self.agents.live;
        self.agents
            .ends_told
            .retain(|_, (parent, _)| live.contains_key(parent));
    }

    /// Unfinished records of this supervisor's agents that no live agent
    /// accounts for: a start whose recording failed when the store was
    /// unreachable (its process killed), a stop whose records could not be
    /// written (its processes gone). Ended, with the stop's recorded outcome
    /// or `failed (lost)`, so nothing is left queued or running for ever,
    /// even on a node that does not hold the sweepers' lease. Every agent admitted here is in
    /// `live` from its admission to its recorded end (claimed and resumed
    /// ones from the command that hosts them), so a record missing from it
    /// has no process behind it.
    pub(super) fn end_records_without_agents(&mut self) {
        let mine = match self
            .records
            .store
            .unfinished_of(std::slice::from_ref(&self.host.me))
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading this supervisor's unfinished agents");
                return;
            }
        };
        // The lease holder's orphan sweeper ends its own such records too
        // (fenced, counted, with a sweep event); a queued one, which has no
        // pid to check, is ended here whoever holds the lease.
        let holder = self.sweep.holds_lease();
        for a in mine {
            if a.tenant != self.records.tenant
                || self.agents.live.contains_key(&a.name)
                || self.admitting.in_flight(&a.name)
                || (holder && a.status != Status::Queued)
            {
                continue;
            }
            let outcome = match a.status {
                Status::Stopping(t) => t,
                _ => Terminal::Failed(FailReason::Lost),
            };
            self.end_without_process(
                &a,
                outcome,
                format!(
                    "its process is gone: supervisor {} holds none for it (a store write failed)",
                    self.host.me
                ),
            );
        }
    }

    /// Ends the run of an agent no process runs for (never started here),
    /// with `outcome`: the record, its `agent.stop` event, and what follows
    /// an end (waiters, the parent's channel).
    pub(super) fn end_without_process(&mut self, a: &Agent, outcome: Terminal, detail: String) {
        let end = RunEnd::without_process(outcome, detail, now_ms());
        let events = [super::ev(
            &a.name,
            Some(&a.run),
            &a.session,
            brood_core::AgentEvent::Stop {
                agent: a.name.clone(),
                outcome,
                swept: None,
            },
        )];
        match self
            .records
            .store
            .end_run(&self.records.tenant, &a.name, &a.run, &end, &events)
        {
            Ok(agent) => {
                tracing::warn!(agent = %a.name, outcome = %outcome.encode(), "an agent without a process ended");
                self.records.project_events(&events);
                self.after_end(&agent, None, None);
            }
            Err(e) => {
                tracing::warn!(agent = %a.name, error = %e, "ending an agent without a process")
            }
        }
    }

    /// The heartbeat. A node whose record went was declared lost by the
    /// others (or removed by hand): its agents the store says finished are
    /// stopped here, then it registers again.
    pub(super) fn heartbeat(&mut self) {
        match self.records.store.heartbeat_node(&self.host.me) {
            Ok(()) => self.restart.beat.ok = Some(std::time::Instant::now()),
            Err(StoreError::Refused {
                code: Code::NotFound,
                ..
            }) => {
                self.fence_off();
                if let Some(new) = self.node_record()
                    && let Err(e) = self.records.store.register_node(&new)
                {
                    tracing::warn!(error = %e, "registering this node again");
                }
            }
            Err(e) => tracing::warn!(error = %e, "this node's heartbeat"),
        }
    }

    /// Stops the live agents whose records another node ended (this node was
    /// declared lost), and lets go of those it moved to live nodes: nothing
    /// runs here that the store says is over or runs elsewhere.
    fn fence_off(&mut self) {
        // What moved to live nodes (a new run there) is let go of without
        // a record; what ended is stopped as any stop.
        self.let_go_moved();
        let ended: Vec<AgentName> = self
            .agents
            .live
            .iter()
            .filter(|(_, l)| l.stopping.is_none())
            .map(|(n, _)| n.clone())
            .filter(|n| {
                self.records
                    .store
                    .agent(&self.records.tenant, n)
                    .ok()
                    .flatten()
                    .is_some_and(|a| a.status.is_finished())
            })
            .collect();
        if ended.is_empty() {
            return;
        }
        tracing::warn!(
            agents = ended.len(),
            "this node was declared lost; stopping the agents the store records as ended"
        );
        let tops: Vec<AgentName> = ended
            .iter()
            .filter(|n| {
                self.agents
                    .live
                    .get(*n)
                    .and_then(|l| l.parent.as_ref())
                    .is_none_or(|p| !ended.contains(p))
            })
            .cloned()
            .collect();
        for n in tops {
            self.stop_subtree(&n, Terminal::Failed(FailReason::Lost));
        }
    }

    /// Every other node whose heartbeat is older than the expiry is declared
    /// lost (`declare_lost`: what moves moves, the rest ends lost, its record
    /// goes, and the lease's lock it may hold is broken).
    /// Any node may do it (the store's transaction makes it happen once).
    /// The age is the store's (issue 28): heartbeats are written on the
    /// store's clock and aged on it, so a node whose clock is off by more
    /// than the expiry neither declares live nodes lost nor keeps a dead one
    /// alive. A read that fails judges nothing: the round is skipped.
    fn declare_lost_nodes(&mut self) {
        let Some(expiry) = self.host.cfg.node.as_ref().map(|n| n.expiry) else {
            return;
        };
        let nodes = match self.records.store.nodes() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading the nodes");
                return;
            }
        };
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        for n in nodes {
            if n.id == self.host.me || n.heartbeat_age_ms <= expiry_ms {
                continue;
            }
            self.declare_lost(&n.id);
        }
    }
}
