//! Routing for the cluster's part ([`crate::supervisor::cluster`]): the
//! entry points the rest of the supervisor calls (the tick, the other
//! nodes' news, placement, a node declared lost, the fence before each
//! command, the records without agents), each lending the part what it
//! reads and applying what it returns in order: ends of records without a
//! process, stops, agents let go of, claimed agents hosted, routed inputs
//! and waits, recorded stops, and the part's own next steps.

use std::collections::{BTreeMap, VecDeque};

use brood_core::{AgentName, SessionName, Terminal};
use brood_launch::cgroup::Group;
use brood_store::{Agent, RunEnd};
use serde_json::Value;

use crate::api::ApiError;
use crate::supervisor::admitting::Admitting;
use crate::supervisor::agents::Agents;
use crate::supervisor::cluster::{Cluster, Env, NodeFollow, stored_launch};
use crate::supervisor::host::Host;
use crate::supervisor::records::Records;
use crate::supervisor::sweep::Sweeps;
use crate::supervisor::{Cmd, Dispatcher, Live, Pending, ev, now_ms, stored_policy};

/// What the cluster's part is lent, from the parts it reads.
fn env<'a>(
    host: &'a Host,
    records: &'a Records,
    agents: &'a Agents,
    admitting: &'a Admitting,
    sweep: &Sweeps,
) -> Env<'a> {
    Env {
        store: records.store.as_ref(),
        tenant: &records.tenant,
        agents,
        admitting,
        holds_lease: sweep.holds_lease(),
        uid: host.uid,
        gid: host.gid,
        groups: &host.groups,
    }
}

impl Dispatcher {
    /// `Cmd::News`: another node changed the store, `changed` of it
    /// (`cluster::nodes`).
    pub(in crate::supervisor) fn on_news(&mut self, changed: brood_store::Changed) {
        let follows = self.with_cluster(|c, env| c.news(changed, env));
        self.apply_cluster(follows);
    }

    /// The node's part of each tick: its heartbeat, then the others'.
    pub(in crate::supervisor) fn node_tick(&mut self) {
        if !self.cluster.is_node() {
            return;
        }
        let follows = self.with_cluster(|c, env| c.tick(env));
        self.apply_cluster(follows);
        self.tell_again();
        // A parent gone hears of no more ends.
        let live = &self.agents.live;
        self.agents
            .ends_told
            .retain(|_, (parent, _)| live.contains_key(parent));
    }

    /// Unfinished records of this supervisor's agents that no live agent
    /// accounts for, ended (`Cluster::records_without_agents`).
    pub(in crate::supervisor) fn end_records_without_agents(&mut self) {
        let follows = self.with_cluster(|c, env| c.records_without_agents(env));
        self.apply_cluster(follows);
    }

    /// Declares node `id` lost (`cluster::moved`).
    pub(in crate::supervisor) fn declare_lost(&mut self, id: &str) {
        let follows = self.with_cluster(|c, env| c.declare_lost(id, env));
        self.apply_cluster(follows);
    }

    /// Before any command: a node back from a pause heartbeats before it
    /// acts (`cluster::moved`).
    pub(in crate::supervisor) fn fence_if_stale(&mut self) {
        let follows = self.with_cluster(|c, env| c.fence_if_stale(env));
        self.apply_cluster(follows);
    }

    /// Where a new agent runs: `None` here, `Some(node)` on another node
    /// (`cluster::placement`).
    pub(in crate::supervisor) fn place(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        remote_parent: Option<&Agent>,
    ) -> Result<Option<String>, ApiError> {
        let env = env(
            &self.host,
            &self.records,
            &self.agents,
            &self.admitting,
            &self.sweep,
        );
        self.cluster.place(labels, remote_parent, &env)
    }

    /// The cluster's part, lent what it reads of the other parts.
    fn with_cluster<R>(&mut self, f: impl FnOnce(&mut Cluster, &Env<'_>) -> R) -> R {
        let env = env(
            &self.host,
            &self.records,
            &self.agents,
            &self.admitting,
            &self.sweep,
        );
        f(&mut self.cluster, &env)
    }

    /// The part's follow-ups, one at a time in order; what one gives back
    /// comes before the rest.
    fn apply_cluster(&mut self, follows: Vec<NodeFollow>) {
        let mut todo = VecDeque::from(follows);
        while let Some(f) = todo.pop_front() {
            let more = match f {
                NodeFollow::Ended(a) => {
                    self.after_end(&a, None, None);
                    Vec::new()
                }
                NodeFollow::EndWithoutProcess {
                    agent,
                    outcome,
                    detail,
                } => {
                    self.end_without_process(&agent, outcome, detail);
                    Vec::new()
                }
                NodeFollow::Host(a) => {
                    let name = a.name.clone();
                    match self.host_claimed(a) {
                        Ok(()) => Vec::new(),
                        Err(Unhosted::Store(e)) => {
                            self.cluster.host_later(name, &e);
                            Vec::new()
                        }
                        Err(Unhosted::Refused(e)) => {
                            self.with_cluster(|c, env| c.not_hosted(&name, &e, env))
                        }
                    }
                }
                NodeFollow::ClaimMore => {
                    // As news of agents placed here, folded into any queued.
                    if self.records.heard.heard(brood_store::Changed::PLACED) {
                        let _ = self.host.tx.send(Cmd::News);
                    }
                    Vec::new()
                }
                NodeFollow::LetGo(name) => {
                    self.let_go(&name);
                    Vec::new()
                }
                NodeFollow::Stop(name, outcome) => {
                    self.stop_subtree(&name, outcome);
                    Vec::new()
                }
                NodeFollow::DeliverRoutedInputs => {
                    self.deliver_routed_inputs();
                    Vec::new()
                }
                NodeFollow::AnswerReadyWaits => {
                    self.answer_ready_waits(None);
                    Vec::new()
                }
                NodeFollow::CarryOutRecordedStops => {
                    self.carry_out_recorded_stops();
                    Vec::new()
                }
                NodeFollow::AnswerRemoteWaits => {
                    self.answer_remote_waits();
                    Vec::new()
                }
                NodeFollow::Then(step) => self.with_cluster(|c, env| c.resume(step, env)),
            };
            for m in more.into_iter().rev() {
                todo.push_front(m);
            }
        }
    }

    /// Ends the run of an agent no process runs for (never started here),
    /// with `outcome`: the record, its `agent.stop` event, and what follows
    /// an end (waiters, the parent's channel).
    fn end_without_process(&mut self, a: &Agent, outcome: Terminal, detail: String) {
        let end = RunEnd::without_process(outcome, detail, now_ms());
        let events = [ev(
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

    /// A claimed agent, hosted here from its record as if admitted here: its
    /// files projected, its live entry made, queued for a slot. What it
    /// reads of the store it reads first, so a read that fails leaves
    /// nothing done and the hosting can be tried again.
    fn host_claimed(&mut self, a: Agent) -> Result<(), Unhosted> {
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let policy = stored_policy(&spec, &self.operator_policy()).map_err(Unhosted::Refused)?;
        let parent_live: Option<(Option<Group>, SessionName)> = match &a.parent {
            Some(p) => match self.agents.live.get(p) {
                Some(l) => Some((l.group.clone(), l.session.clone())),
                None => self
                    .records
                    .store
                    .agent(&self.records.tenant, p)?
                    .map(|pa| (None, pa.session)),
            },
            None => None,
        };
        // A run a loss moved here is no new creation of its parent's; the
        // children the loss ended are told to it once it runs.
        let moved = self.with_cluster(|c, env| c.moved_run(&a, env))?;
        // A resumed run's instruction is the input its resume recorded.
        let instruction = self
            .records
            .store
            .messages(&self.records.tenant, &a.name, &a.session)?
            .into_iter()
            .rev()
            .find(|m| m.run == a.run && m.role == "user")
            .map(|m| m.content);
        // Its budget covers what it and its subtree spent in earlier runs.
        let subtree_usd = self
            .records
            .store
            .spend(&self.records.tenant, &a.name)?
            .subtree
            .cost_usd;
        let (argv, cwd) = stored_launch(&spec);
        self.project_admitted(
            &a,
            &policy,
            &spec,
            parent_live.as_ref().map(|(_, s)| s),
            policy.uid,
        );
        let moved = match moved {
            Some(ended) => {
                for k in ended {
                    self.restart.tell_later(a.name.clone(), k);
                }
                true
            }
            None => false,
        };
        if !moved && let Some(pl) = a.parent.as_ref().and_then(|p| self.agents.live.get_mut(p)) {
            pl.creates_used += 1;
        }
        let parent_pair = a
            .parent
            .clone()
            .zip(parent_live.as_ref().map(|(_, s)| s.clone()));
        let secrets = self.agents.claimed_secrets(&a, &policy);
        let mut live = Live::of_record(&a, &spec, parent_pair, policy, instruction);
        live.secrets = secrets;
        live.ready_news = spec["ready_news"]
            .as_str()
            .filter(|n| *n != self.host.me)
            .map(str::to_owned);
        live.subtree_usd = subtree_usd;
        live.pending = Some(Pending {
            argv,
            cwd,
            group_parent: parent_live.and_then(|(g, _)| g),
            admitted: None,
        });
        tracing::info!(agent = %a.name, "claimed an agent placed on this node");
        self.agents.live.insert(a.name.clone(), Box::new(live));
        // A child whose parent was claimed here but has no process yet
        // (both moved off a lost node) waits for it: its group is made in
        // the parent's.
        match a.parent.as_ref().filter(|p| {
            self.agents
                .live
                .get(*p)
                .is_some_and(|l| l.pid.is_none() && l.stopping.is_none())
        }) {
            Some(p) => self.restart.hold(p.clone(), a.name),
            None => self.launcher.waiting.push(a.name),
        }
        Ok(())
    }

    /// Kills `name`'s processes (its group, which holds its subtree here)
    /// and drops its entry, writing nothing: its record moved to another
    /// node while this one was declared lost.
    fn let_go(&mut self, name: &AgentName) {
        self.sockets.close(name);
        let Some(l) = self.forget(name) else {
            return;
        };
        match (l.group, self.launcher.cgroups.clone()) {
            (Some(g), Some(cg)) => {
                let grace = self.host.cfg.grace;
                tokio::spawn(async move {
                    if let Err(e) =
                        crate::supervisor::stops::empty_group(&cg, &g, grace, true).await
                    {
                        tracing::error!(group = %g.dir.display(), error = %e, "emptying a moved agent's group");
                    }
                });
            }
            _ => {
                if let Some(p) = l.pid {
                    // SAFETY: signalling a process group this supervisor made.
                    unsafe { libc::killpg(p, libc::SIGKILL) };
                }
            }
        }
    }
}

/// Why a claimed agent was not hosted.
enum Unhosted {
    /// A store call failed: tried again later, nothing ended for it.
    Store(brood_store::StoreError),
    /// It cannot run here (its stored policy is not one): ended lost.
    Refused(ApiError),
}

impl From<brood_store::StoreError> for Unhosted {
    fn from(e: brood_store::StoreError) -> Unhosted {
        Unhosted::Store(e)
    }
}
