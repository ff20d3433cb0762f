//! What other nodes post for this one through the store (issue 15): inputs
//! for the agents it runs; the ends of their children that other nodes
//! ran, which the parent hears of here as if the child had run here (the
//! protocol's `child` event, its channel's `status`, `result.md`,
//! `refs.jsonl` and `artifact/` in this node's ctx tree, the artifacts'
//! bytes fetched from the store off the dispatcher first); and closes made
//! through another node of agents this node ran, shown in its ctx tree.
//!
//! It holds no state beyond what the live set tracks of children other
//! nodes ran (`Agents::fetching`, `ends_told`, `ready_waits`,
//! `ends_to_tell`, `ends_to_hear`, `closes_to_show`, `ready_heard`): the loop
//! lends it [`Env`], and what belongs to other flows (an input delivered, a
//! child's end told to its parent, waits answered) it returns as
//! [`RoutedFollow`]s, in order, which `route::routed` applies.

use super::agents::Agents;
use super::host::Host;
use super::records::Records;
use super::waiters::Waiters;
use super::{Cmd, Reply, answer, ev, now_ms, stored_policy};
use crate::api::ApiError;
use crate::api::internal;
use crate::hosts::host_alive;
use crate::hosts::registered_nodes;
use crate::objects::project_agent;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::Status;
use brood_core::policy::Policy;
use brood_store::Agent;
use brood_store::Protocol;
use serde_json::Value;
use std::collections::HashSet;

/// The sender of an inbox entry that is no input but news of a child's end:
/// its text names the child. No input's sender looks like it (`user:<uid>`
/// or an agent's name, which holds no `:`).
const CHILD_END: &str = "brood:child-end";

/// The sender of an inbox entry that tells an agent's host it was closed
/// through another node: the host's ctx tree shows it closed too.
const CLOSED: &str = "brood:closed";

/// The sender of an inbox entry that tells the node holding a `--ready`
/// spawn open that the agent it placed elsewhere is ready.
const READY: &str = "brood:ready";

/// A child's end heard from another node, its artifacts fetched.
pub(crate) struct EndedElsewhere {
    told: AgentName,
    child: Agent,
    result: Option<String>,
    harvest: crate::channel::Harvest,
    placed: crate::channel::shared::Placed,
}

/// What the routing reads and writes of the rest of the supervisor, and
/// what it leaves for other flows.
pub(super) struct Env<'a> {
    pub(super) records: &'a Records,
    pub(super) host: &'a Host,
    pub(super) agents: &'a mut Agents,
    pub(super) waiters: &'a Waiters,
    /// What the calls so far left for other flows, in order.
    pub(super) follows: Vec<RoutedFollow>,
}

/// What the routing needs done by other flows.
pub(super) enum RoutedFollow {
    /// An input another node posted for an agent here, delivered as if
    /// sent here.
    DeliverInput {
        agent: AgentName,
        sender: String,
        text: String,
    },
    /// A child's end (another node ran it) told to `told` here.
    TellOfEnd {
        told: AgentName,
        agent: Box<Agent>,
        result: Option<String>,
        harvest: Box<crate::channel::Harvest>,
    },
    /// These waits are done: answered.
    AnswerWaiters(Vec<u64>),
}

impl Env<'_> {
    /// An input for an agent another node runs: posted in the store for its
    /// host, which delivers it when the news of this write reaches it.
    pub(super) fn route_input(
        &mut self,
        a: &Agent,
        from: &str,
        text: &str,
    ) -> Result<brood_api::InputReply, ApiError> {
        let host = brood_store::placed_for(&a.supervisor).unwrap_or(&a.supervisor);
        let takes = a.protocol == Protocol::Brood
            && matches!(a.status, Status::Running | Status::Blocked)
            && self.host.cfg.node.is_some()
            && host_alive(
                host,
                &registered_nodes(self.records.store.as_ref()).map_err(internal)?,
            );
        if !takes {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {} is {} on {host}; it takes no input there (resume it instead)",
                    a.name,
                    a.status.api_word()
                ),
            ));
        }
        self.records
            .store
            .post_input(&self.records.tenant, &a.name, host, from, text, now_ms())
            .map_err(internal)?;
        Ok(brood_api::InputReply {
            id: format!("routed-{}", a.run),
            node: Some(host.to_owned()),
        })
    }

    /// A `--ready` spawn admitted here for another node: answered when
    /// that node says the agent is ready, or when the store shows it ended
    /// (issue 25: it used to be answered `queued` at once).
    pub(super) fn wait_ready_elsewhere(&mut self, name: AgentName, reply: Reply<brood_api::Agent>) {
        self.agents.ready_waits.push((name, reply));
        self.answer_ready_waits(None);
    }

    /// Answers the `--ready` spawns waiting for `ready` (told by its host),
    /// and those whose agent ended (read in the store), each with the
    /// agent as it is now. At each tick and each news of another node.
    pub(super) fn answer_ready_waits(&mut self, ready: Option<&AgentName>) {
        if self.agents.ready_waits.is_empty() {
            return;
        }
        // The news that one is ready comes once: kept until its wait is
        // answered, so a read that fails now does not lose it.
        if let Some(r) = ready.filter(|r| self.agents.ready_waits.iter().any(|(n, _)| n == *r)) {
            self.agents.ready_heard.insert(r.clone());
        }
        let mut still = Vec::new();
        for (name, reply) in std::mem::take(&mut self.agents.ready_waits) {
            let a = match self.records.store.agent(&self.records.tenant, &name) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    let gone = ApiError::new(Code::NotFound, format!("no agent named {name}"));
                    answer(reply, Err(gone));
                    continue;
                }
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "reading an agent placed elsewhere");
                    still.push((name, reply));
                    continue;
                }
            };
            if self.agents.ready_heard.contains(&name) || a.status.is_finished() {
                self.agents.ready_heard.remove(&name);
                answer(reply, Ok(agent_view(&self.records.store, &a)));
            } else {
                still.push((name, reply));
            }
        }
        self.agents.ready_waits = still;
    }

    /// Tells the node holding a `--ready` spawn of `name` open that it is
    /// ready ([`tell_ready`]).
    pub(super) fn tell_ready(&self, name: &AgentName, node: Option<String>) {
        tell_ready(self.records, name, node);
    }

    /// Inputs other nodes posted for agents running here, delivered.
    pub(super) fn deliver_routed_inputs(&mut self) {
        if self.host.cfg.node.is_none() {
            return;
        }
        let inputs = match self
            .records
            .store
            .take_inputs(&self.records.tenant, &self.host.me, 256)
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "taking the inputs other nodes posted");
                return;
            }
        };
        for i in inputs {
            if i.sender == CHILD_END {
                self.on_child_end_elsewhere(&i.agent, &i.text);
                continue;
            }
            if i.sender == CLOSED {
                self.on_closed_elsewhere(&i.agent);
                continue;
            }
            if i.sender == READY {
                self.answer_ready_waits(Some(&i.agent));
                continue;
            }
            self.follows.push(RoutedFollow::DeliverInput {
                agent: i.agent,
                sender: i.sender,
                text: i.text,
            });
        }
    }

    /// Waits for agents hosted elsewhere hear of their end from nobody: the
    /// store tells, on news and once a tick. A child another node ran whose
    /// parent runs here is not done for a wait until its artifacts are in
    /// the parent's channel here, as they would be had it run here: its end
    /// is told to the parent now if the news of it (the store's inbox) has
    /// not come yet, which then finds it told.
    pub(super) fn answer_remote_waits(&mut self) {
        // Each waited-for agent read once: ended elsewhere, or not.
        let mut ended = HashSet::new();
        for n in self.waiters.names() {
            if self.agents.live.contains_key(&n) || self.agents.fetching.contains(&n) {
                continue;
            }
            let a = match self.records.store.agent(&self.records.tenant, &n) {
                Ok(Some(a)) if a.status.is_finished() => a,
                _ => continue,
            };
            if self.end_told_early(&a) {
                // Its artifacts are on their way: not done yet.
                continue;
            }
            ended.insert(n);
        }
        let done = self.waiters.done_by(|n| ended.contains(n));
        self.follows.push(RoutedFollow::AnswerWaiters(done));
    }

    /// Whether `a`'s end (another node's child of an agent here, with
    /// artifacts, the news of it not come yet) was told to its parent now,
    /// which fetches the artifacts first.
    fn end_told_early(&mut self, a: &Agent) -> bool {
        let Some(p) = a.parent.clone() else {
            return false;
        };
        // Only nodes run a child away from its parent.
        if self.host.cfg.node.is_none()
            || a.supervisor == self.host.me
            || !self.agents.live.contains_key(&p)
            || self
                .agents
                .ends_told
                .get(&a.name)
                .is_some_and(|(_, run)| *run == a.run)
        {
            return false;
        }
        let has_artifacts = self
            .records
            .store
            .channel(&self.records.tenant, &p, &a.name)
            .ok()
            .flatten()
            .is_some_and(|c| !c.artifacts.is_empty());
        if has_artifacts {
            self.on_child_end_elsewhere(&p, a.name.as_str());
        }
        self.agents.fetching.contains(&a.name)
    }

    /// After a recorded end: a parent (or customer) that another node runs
    /// hears of it there, through the store.
    pub(super) fn tell_other_nodes_of_end(&mut self, agent: &Agent) {
        if self.host.cfg.node.is_none() {
            return;
        }
        let told: Vec<AgentName> = agent
            .parent
            .iter()
            .chain(agent.customer.iter())
            .filter(|p| !self.agents.live.contains_key(*p))
            .cloned()
            .collect();
        for p in told {
            if !self.tell_of_end(&agent.name, &p) {
                self.agents.ends_to_tell.push((agent.name.clone(), p));
            }
        }
    }

    /// What a failed store call kept from being told, told again: ends
    /// whose parent could not be read and ends told here whose reads
    /// failed, the notes for other nodes' inboxes whose post failed (ends,
    /// closes, ready spawns), closes told here whose read failed. What
    /// fails again waits for the next tick.
    pub(super) fn tell_again(&mut self) {
        for (child, p) in std::mem::take(&mut self.agents.ends_to_tell) {
            if !self.tell_of_end(&child, &p) {
                self.agents.ends_to_tell.push((child, p));
            }
        }
        for (told, child) in std::mem::take(&mut self.agents.ends_to_hear) {
            if !self.hear_end(&told, &child) {
                self.agents.ends_to_hear.push((told, child));
            }
        }
        self.records.post_kept();
        for name in std::mem::take(&mut self.agents.closes_to_show) {
            if !self.show_closed(&name) {
                self.agents.closes_to_show.push(name);
            }
        }
    }

    /// Posts `child`'s end to `p`'s node when `p` runs, or waits, on
    /// another node (a post that fails is kept by the records and posted
    /// again); whether that is done (nothing to tell counts), or the read
    /// of `p` failed and it is to be tried again. A failed read is not "no
    /// such parent": the parent would never hear of its child's end.
    fn tell_of_end(&self, child: &AgentName, p: &AgentName) -> bool {
        let pa = match self.records.store.agent(&self.records.tenant, p) {
            Ok(Some(pa)) => pa,
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!(agent = %child, parent = %p, error = %e, "reading the parent of an agent that ended, to tell its node");
                return false;
            }
        };
        if !matches!(pa.status, Status::Running | Status::Blocked) || pa.supervisor == self.host.me
        {
            return true;
        }
        self.records
            .post_or_keep(p, &pa.supervisor, CHILD_END, child.as_str());
        true
    }

    /// A child another node ran ended: its parent (or customer) here hears
    /// of it as if it had run here. When the parent is here and the child
    /// handed back artifacts, their bytes are fetched from the store into
    /// the channel's `artifact/` first, off the dispatcher (they may be
    /// 1 GiB), and the parent hears of the end once they are in place
    /// ([`Self::on_ended_elsewhere`]).
    fn on_child_end_elsewhere(&mut self, told: &AgentName, child: &str) {
        let Ok(child) = AgentName::new(child) else {
            tracing::warn!(agent = %told, "a child's end named no valid agent");
            return;
        };
        if !self.hear_end(told, &child) {
            self.agents.ends_to_hear.push((told.clone(), child));
        }
    }

    /// [`Self::on_child_end_elsewhere`] for a valid name: whether it is
    /// done (nothing to tell counts), or a store read failed and it is to
    /// be tried again. A failed read is neither "no such child" nor "no
    /// result": the parent would never hear of the end, or hear of it
    /// without what the child handed back.
    fn hear_end(&mut self, told: &AgentName, child: &AgentName) -> bool {
        let a = match self.records.store.agent(&self.records.tenant, child) {
            Ok(Some(a)) if a.status.is_finished() => a,
            Ok(_) => return true,
            Err(e) => {
                tracing::warn!(agent = %child, parent = %told, error = %e, "reading a child's end another node told of");
                return false;
            }
        };
        // Told once a run, whichever comes first: the news of it or a wait
        // that saw it in the store.
        let to_parent = a.parent.as_ref() == Some(told);
        if to_parent
            && self
                .agents
                .ends_told
                .get(&a.name)
                .is_some_and(|(_, run)| *run == a.run)
        {
            return true;
        }
        let channel = match &a.parent {
            Some(p) => match self.records.store.channel(&self.records.tenant, p, child) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(agent = %child, parent = %told, error = %e, "reading the channel of a child's end another node told of");
                    return false;
                }
            },
            None => None,
        };
        if to_parent {
            self.agents
                .ends_told
                .insert(a.name.clone(), (told.clone(), a.run.clone()));
        }
        let result = channel.as_ref().and_then(|c| c.result.clone());
        let output = match channel {
            Some(c) => brood_store::ChannelOutput {
                refs: c.refs.unwrap_or_default(),
                artifacts: c.artifacts,
            },
            None => brood_store::ChannelOutput::default(),
        };
        let dir = self.records.channel_dir_of(self.agents, &a);
        let blobs = self.host.paths.blobs();
        if a.parent.as_ref() == Some(told)
            && !output.artifacts.is_empty()
            && let Some(dir) = dir.clone()
        {
            // `artifact/` is the child's, as on the node that ran it.
            let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
            let operator = Policy::operator(self.host.uid, self.host.gid, self.host.groups.clone());
            let uid = stored_policy(&spec, &operator).map_or(self.host.uid, |p| p.uid);
            self.agents.fetching.insert(a.name.clone());
            let (store, tenant, tx) = (
                self.records.store.clone(),
                self.records.tenant.clone(),
                self.host.tx.clone(),
            );
            let told = told.clone();
            tokio::task::spawn_blocking(move || {
                let placed = crate::channel::shared::place(
                    store.as_ref(),
                    &tenant,
                    &blobs,
                    &output.artifacts,
                    &dir,
                    uid,
                );
                let harvest = crate::channel::recorded(output, Some(&dir), &blobs);
                let _ = tx.send(Cmd::EndedElsewhere(Box::new(EndedElsewhere {
                    told,
                    child: a,
                    result,
                    harvest,
                    placed,
                })));
            });
            return true;
        }
        let harvest = crate::channel::recorded(output, dir.as_deref(), &blobs);
        self.tell_of_end_elsewhere(told, a, result, harvest);
        true
    }

    /// A child's artifacts are in its parent's channel here (or could not
    /// be, each named in the log): the parent hears of its end now, and
    /// waits for the child are answered.
    pub(super) fn on_ended_elsewhere(&mut self, e: EndedElsewhere) {
        self.agents.fetching.remove(&e.child.name);
        if !e.placed.missing.is_empty() {
            tracing::warn!(
                agent = %e.child.name,
                missing = ?e.placed.missing,
                "artifacts of a child another node ran are not in its channel here"
            );
        }
        self.tell_of_end_elsewhere(&e.told, e.child, e.result, e.harvest);
        self.answer_remote_waits();
    }

    fn tell_of_end_elsewhere(
        &mut self,
        told: &AgentName,
        a: Agent,
        result: Option<String>,
        h: crate::channel::Harvest,
    ) {
        if a.parent.as_ref() == Some(told) {
            self.records
                .project_channel(self.agents, &a, result.as_deref());
            if let Some(dir) = self.records.channel_dir_of(self.agents, &a) {
                self.records
                    .projection
                    .write(dir.join("refs.jsonl"), h.output.refs.clone());
            }
        }
        self.follows.push(RoutedFollow::TellOfEnd {
            told: told.clone(),
            agent: Box::new(a),
            result,
            harvest: Box::new(h),
        });
    }

    /// After a close through this node: the agent's host, when another node,
    /// shows it closed in its own ctx tree too (the store has it already).
    pub(super) fn tell_host_of_close(&mut self, a: &Agent) {
        if self.host.cfg.node.is_none() {
            return;
        }
        let host = brood_store::placed_for(&a.supervisor).unwrap_or(&a.supervisor);
        // Unreadable nodes: the host may well be alive, so it is told (a
        // note in a gone node's inbox is harmless).
        if host == self.host.me.as_str()
            || registered_nodes(self.records.store.as_ref())
                .is_ok_and(|nodes| !host_alive(host, &nodes))
        {
            return;
        }
        self.records.post_or_keep(&a.name, host, CLOSED, "");
    }

    /// An agent this node ran was closed through another node: its `close`
    /// event and its status files here, as the close would have written them.
    fn on_closed_elsewhere(&mut self, name: &AgentName) {
        if !self.show_closed(name) {
            self.agents.closes_to_show.push(name.clone());
        }
    }

    /// [`Self::on_closed_elsewhere`]: whether it is done (nothing to show
    /// counts), or the read failed and it is to be tried again (a failed
    /// read is not "not closed": the tree here would say open for good).
    fn show_closed(&mut self, name: &AgentName) -> bool {
        let a = match self.records.store.agent(&self.records.tenant, name) {
            Ok(Some(a)) if matches!(a.status, Status::Closed(_)) => a,
            Ok(_) => return true,
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "reading an agent another node closed");
                return false;
            }
        };
        let close = ev(
            name,
            Some(&a.run),
            &a.session,
            AgentEvent::Close {
                agent: name.clone(),
            },
        );
        self.records.project_events(&[close]);
        project_agent(&self.records.projection, &self.host.paths, &a, None);
        true
    }
}

/// Tells the node holding a `--ready` spawn of `name` open that it is
/// ready (through the store's inbox, as inputs between nodes go); a free
/// function, as the launch's part tells it too (a plain program is ready
/// once started).
pub(super) fn tell_ready(records: &Records, name: &AgentName, node: Option<String>) {
    let Some(node) = node else {
        return;
    };
    records.post_or_keep(name, &node, READY, "");
}
