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
use brood_store::{Changed, StoreError};

use super::{Cluster, Env, Next, NodeFollow, then};

impl Cluster {
    /// Another node changed the store: what it may have done to this node's
    /// agents (stops recorded for them, ends of agents waited for here) is
    /// carried out now rather than at the next tick, each look only when the
    /// news says its kind of change (`changed`): most writes are an
    /// admission, a start or an end that concerns no other node, and each
    /// look is a read. The ticks make every look whatever the news said. The
    /// event log's readers look again after this command, as after any.
    pub(in crate::supervisor) fn news(&self, changed: Changed, env: &Env) -> Vec<NodeFollow> {
        let mut out = Vec::new();
        if changed.any(Changed::PLACED) {
            out.extend(self.claim(env));
        }
        if changed.any(Changed::INPUTS) {
            out.push(NodeFollow::DeliverRoutedInputs);
        }
        if changed.any(Changed::ENDS) {
            out.push(NodeFollow::AnswerReadyWaits);
        }
        if changed.any(Changed::STOPS) {
            out.push(NodeFollow::CarryOutRecordedStops);
        }
        if changed.any(Changed::ENDS) {
            out.push(NodeFollow::AnswerRemoteWaits);
        }
        out
    }

    /// The node's part of each tick: its heartbeat, then the others'.
    pub(in crate::supervisor) fn tick(&mut self, env: &Env) -> Vec<NodeFollow> {
        if self.node.is_none() {
            return Vec::new();
        }
        let mut out = self.heartbeat(env);
        if !self.unchecked.is_empty() {
            out.push(then(Next::Recheck));
        }
        out.extend([
            then(Next::DeclareLostNodes),
            then(Next::HostAgain),
            then(Next::Claim),
            NodeFollow::DeliverRoutedInputs,
            NodeFollow::AnswerReadyWaits,
        ]);
        out
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
    pub(in crate::supervisor) fn records_without_agents(&self, env: &Env) -> Vec<NodeFollow> {
        let mine = match env.store.unfinished_of(std::slice::from_ref(&self.me)) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading this supervisor's unfinished agents");
                return Vec::new();
            }
        };
        // The lease holder's orphan sweeper ends its own such records too
        // (fenced, counted, with a sweep event); a queued one, which has no
        // pid to check, is ended here whoever holds the lease.
        let holder = env.holds_lease;
        let mut out = Vec::new();
        for a in mine {
            if a.tenant != *env.tenant
                || env.agents.live.contains_key(&a.name)
                || env.admitting.in_flight(&a.name)
                || self.to_host.contains(&a.name)
                || (holder && a.status != Status::Queued)
            {
                continue;
            }
            let outcome = match a.status {
                Status::Stopping(t) => t,
                _ => Terminal::Failed(FailReason::Lost),
            };
            out.push(NodeFollow::EndWithoutProcess {
                agent: a,
                outcome,
                detail: format!(
                    "its process is gone: supervisor {} holds none for it (a store write failed)",
                    self.me
                ),
            });
        }
        out
    }

    /// The heartbeat. A node whose record went was declared lost by the
    /// others (or removed by hand): its agents the store says finished are
    /// stopped here, then it registers again.
    pub(super) fn heartbeat(&mut self, env: &Env) -> Vec<NodeFollow> {
        match env.store.heartbeat_node(&self.me) {
            Ok(()) => {
                self.beat.ok = Some(std::time::Instant::now());
                Vec::new()
            }
            Err(StoreError::Refused {
                code: Code::NotFound,
                ..
            }) => {
                let mut out = self.fence_off(env);
                out.push(then(Next::Register));
                out
            }
            Err(e) => {
                tracing::warn!(error = %e, "this node's heartbeat");
                Vec::new()
            }
        }
    }

    /// Declared lost, fenced off: registered again once its agents are
    /// dealt with.
    pub(super) fn register(&self, env: &Env) {
        if let Some(new) = self.node_record()
            && let Err(e) = env.store.register_node(&new)
        {
            tracing::warn!(error = %e, "registering this node again");
        }
    }

    /// Stops the live agents whose records another node ended (this node was
    /// declared lost), and lets go of those it moved to live nodes: nothing
    /// runs here that the store says is over or runs elsewhere.
    fn fence_off(&mut self, env: &Env) -> Vec<NodeFollow> {
        // What moved to live nodes (a new run there) is let go of without
        // a record; what ended is stopped as any stop.
        let mut out = self.let_go_moved(env);
        out.push(then(Next::StopEnded));
        out
    }

    /// [`Cluster::fence_off`]'s second half, once what moved is let go of:
    /// the live agents the store records as ended, stopped from the top of
    /// each of their subtrees.
    pub(super) fn stop_ended(&mut self, env: &Env) -> Vec<NodeFollow> {
        let live = &env.agents.live;
        let mut ended = Vec::new();
        for (n, l) in live {
            if l.stopping.is_some() || self.unchecked.contains(n) {
                continue;
            }
            match env.store.agent(env.tenant, n) {
                Ok(a) => {
                    if a.is_some_and(|a| a.status.is_finished()) {
                        ended.push(n.clone());
                    }
                }
                // Not "it did not end": looked at again at the next tick.
                Err(e) => {
                    tracing::warn!(agent = %n, error = %e, "reading a live agent's record after this node was declared lost; looking again at the next tick");
                    self.unchecked.insert(n.clone());
                }
            }
        }
        if ended.is_empty() {
            return Vec::new();
        }
        tracing::warn!(
            agents = ended.len(),
            "this node was declared lost; stopping the agents the store records as ended"
        );
        stops_from_the_top(&ended, env)
    }

    /// The live agents whose record could not be read after this node was
    /// declared lost ([`Self::let_go_moved`], [`Self::stop_ended`]), read
    /// again: let go of if they moved, stopped if they ended, kept for the
    /// next tick if the read fails again. Until then they run on: a failed
    /// read ends nothing.
    pub(super) fn recheck(&mut self, env: &Env) -> Vec<NodeFollow> {
        let mut out = Vec::new();
        let mut ended = Vec::new();
        for n in std::mem::take(&mut self.unchecked) {
            let Some(l) = env.agents.live.get(&n).filter(|l| l.stopping.is_none()) else {
                continue;
            };
            match env.store.agent(env.tenant, &n) {
                Ok(Some(a)) if a.status.is_finished() => ended.push(n),
                Ok(Some(a)) if a.run != l.run || a.supervisor != self.me => {
                    tracing::warn!(agent = %n, "this node was declared lost; letting go of an agent that moved to another node");
                    out.push(NodeFollow::LetGo(n));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(agent = %n, error = %e, "reading a live agent's record after this node was declared lost; looking again at the next tick");
                    self.unchecked.insert(n);
                }
            }
        }
        out.extend(stops_from_the_top(&ended, env));
        out
    }

    /// Every other node whose heartbeat is older than the expiry is declared
    /// lost (`declare_lost`: what moves moves, the rest ends lost, its record
    /// goes, and the lease's lock it may hold is broken).
    /// Any node may do it (the store's transaction makes it happen once).
    /// The age is the store's (issue 28): heartbeats are written on the
    /// store's clock and aged on it, so a node whose clock is off by more
    /// than the expiry neither declares live nodes lost nor keeps a dead one
    /// alive. A read that fails judges nothing: the round is skipped.
    pub(super) fn declare_lost_nodes(&self, env: &Env) -> Vec<NodeFollow> {
        let Some(expiry) = self.node.as_ref().map(|n| n.expiry) else {
            return Vec::new();
        };
        let nodes = match env.store.nodes() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading the nodes");
                return Vec::new();
            }
        };
        let expiry_ms = i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX);
        // Each declared in turn, with all that follows it, before the next.
        nodes
            .into_iter()
            .filter(|n| n.id != self.me && n.heartbeat_age_ms > expiry_ms)
            .map(|n| then(Next::DeclareLost(n.id)))
            .collect()
    }
}

/// Stops of `ended` live agents, one for the top of each subtree among
/// them (a stop takes its descendants).
fn stops_from_the_top(ended: &[AgentName], env: &Env) -> Vec<NodeFollow> {
    ended
        .iter()
        .filter(|n| {
            env.agents
                .live
                .get(*n)
                .and_then(|l| l.parent.as_ref())
                .is_none_or(|p| !ended.contains(p))
        })
        .map(|n| NodeFollow::Stop(n.clone(), Terminal::Failed(FailReason::Lost)))
        .collect()
}
