//! Stops (SPEC 6 "Parent death"): the intent recorded for every target, the
//! whole subtree signalled at once, its group emptied off the dispatcher
//! (SIGTERM, the grace, `cgroup.kill`, confirmed empty, removed; retried with
//! backoff when that fails, the agents staying `stopping`), the stopped
//! runs' `artifact/` emptied (they hand nothing back, issue 24), then the
//! records and events written in post-order.
//!
//! [`Stops`] is a part of the supervisor: it owns the stops in flight and
//! what only they use (their ids, the cgroups handle, the grace, the loop's
//! inbox for `Cmd::StopDone`), and holds no dispatcher. Each call is lent
//! what it reads and writes of the other parts ([`Env`]: the records, the
//! live set, the agent sockets, the ends in flight, who this supervisor is);
//! what belongs to another flow (an end projected and told, a live entry
//! forgotten, a result collected once its group is empty) it returns as
//! [`StopFollow`]s, in order, for the loop to apply
//! (`supervisor::route::stops`), with its own next step ([`Step`]) where
//! that must wait for the follow-ups before it.
//!
//! - `mod.rs`: the part, what it is lent, the stops planned and begun;
//! - `empty.rs`: a group emptied off the loop (a stop's, or one whose run
//!   ended with nothing left in it);
//! - `record.rs`: a stop whose group is empty recorded in post-order, and
//!   one whose group could not be emptied retried.

mod empty;
mod record;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use brood_core::AgentName;
use brood_core::CancelReason;
use brood_core::Terminal;
use brood_launch::cgroup::Cgroups;
use brood_launch::cgroup::Group;
use brood_proto::ToAgent;
use brood_store::{Agent, NewEvent};
use tokio::sync::mpsc;

pub(in crate::supervisor) use empty::empty_group;

use crate::metrics::Metrics;
use crate::objects::project_agent;
use crate::paths::Paths;
use crate::supervisor::agents::Agents;
use crate::supervisor::disk::{ToClear, channels_of};
use crate::supervisor::ends_writer::EndsWriter;
use crate::supervisor::records::Records;
use crate::supervisor::sockets::Sockets;
use crate::supervisor::starts_writer::StartsWriter;
use crate::supervisor::{Cmd, Collect, now_ms};

/// One stop in flight: the targets in post-order with the outcome each gets, and
/// the group whose emptiness ends it.
struct Stop {
    targets: Vec<(AgentName, Terminal)>,
    /// The group whose emptiness ends it, kept to retry when emptying fails.
    group: Option<Group>,
    /// Failed attempts at emptying it so far (the retry backs off).
    attempts: u32,
    /// A result to collect once the group is empty (the agent whose run ended
    /// with it heads the group; its descendants were the targets).
    then: Option<Box<Collect>>,
    /// Channels whose `artifact/` is emptied once the group is: the
    /// targets' (a stopped run hands nothing back), and that of a run which
    /// ended without a result and left these descendants.
    clear: Vec<ToClear>,
    /// Slots of ended runs (the one that left these descendants) given back
    /// once the group is empty.
    slots: usize,
}

/// The stops in flight and what only they use: the part that owns them.
pub(in crate::supervisor) struct Stops {
    stops: HashMap<u64, Stop>,
    next_id: u64,
    /// The agents' groups, when this host contains them in cgroups.
    cgroups: Option<Arc<Cgroups>>,
    /// SIGTERM to SIGKILL (SPEC 6).
    grace: Duration,
    /// The loop's inbox: where a stop whose group is emptied reports
    /// (`Cmd::StopDone`).
    tx: mpsc::UnboundedSender<Cmd>,
}

/// What a stop reads and writes of the rest of the supervisor, lent for one
/// call. Nothing in it lets the part end a run or tell anyone of one: that
/// it returns ([`StopFollow`]).
pub(in crate::supervisor) struct Env<'a> {
    /// The store and tenant where intents and ends are recorded, and the ctx
    /// projection where a stopping agent shows.
    pub(in crate::supervisor) records: &'a Records,
    /// The live set: who runs here, marked stopping, told to cancel, its
    /// model gateway cut.
    pub(in crate::supervisor) agents: &'a mut Agents,
    /// The agent sockets, closed for every target.
    pub(in crate::supervisor) sockets: &'a mut Sockets,
    /// The ends in flight: an agent whose end is being recorded is no stop's.
    pub(in crate::supervisor) ends_writer: &'a EndsWriter,
    /// The starts in flight: an agent whose start is being recorded is
    /// stopped once it is (`Live::stop_after_start`).
    pub(in crate::supervisor) starts_writer: &'a StartsWriter,
    /// This supervisor's id: an agent another node hosts is that node's to
    /// stop.
    pub(in crate::supervisor) me: &'a str,
    pub(in crate::supervisor) paths: &'a Paths,
    pub(in crate::supervisor) metrics: &'a Metrics,
}

/// What a stop needs another flow of the supervisor to do, in the order
/// given.
pub(in crate::supervisor) enum StopFollow {
    /// A stopped agent's end is recorded: its events and its end projected
    /// (every file of a stop comes before its first notification).
    ProjectEnd {
        events: Vec<NewEvent>,
        agent: Agent,
        result: Option<String>,
    },
    /// A stopped agent's end told: its parent, a pending spawn, the waiters.
    NotifyEnd {
        agent: Agent,
        result: Option<String>,
    },
    /// A stopped agent leaves the live set.
    Forget(AgentName),
    /// A result that waited on the stop is read now that its group is empty.
    Collect(Box<Collect>),
    /// The slots of `n` ended runs, kept until this stop's group was empty.
    Emptied(usize),
    /// The part's own next step, once the follow-ups before it are applied:
    /// handed back with [`Stops::resume`].
    Then(Step),
}

/// A step of the part's own work, waiting for the follow-ups before it.
pub(in crate::supervisor) struct Step(Next);

enum Next {
    /// A stopped agent, told of: forgotten unless its launch is in flight.
    Forget(AgentName),
    /// A stop's records are all written and told (the log says how long).
    Recorded {
        targets: usize,
        since: std::time::Instant,
    },
    /// A result waiting on a recorded stop: collected unless its agent was
    /// stopped meanwhile.
    Collect(Box<Collect>),
}

impl Stops {
    pub(in crate::supervisor) fn new(
        cgroups: Option<Arc<Cgroups>>,
        grace: Duration,
        tx: mpsc::UnboundedSender<Cmd>,
    ) -> Stops {
        Stops {
            stops: HashMap::new(),
            next_id: 0,
            cgroups,
            grace,
            tx,
        }
    }

    /// Stops in flight (`held`).
    pub(in crate::supervisor) fn len(&self) -> usize {
        self.stops.len()
    }

    /// The room their map keeps (`held`).
    pub(in crate::supervisor) fn room(&self) -> usize {
        self.stops.capacity()
    }

    /// No stop is in flight (a shutdown waits for that).
    pub(in crate::supervisor) fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Parent death (SPEC 6 steps 1-5) for the descendants of an agent whose run
    /// already ended (its own record is written: that is the recorded intent).
    /// `clear`: the parent's own channel, when its run recorded no result.
    ///
    /// `slot`: the parent's slot, given back once the group is empty.
    /// Returns whether the caller keeps it (no stop was begun).
    pub(in crate::supervisor) fn descendants(
        &mut self,
        parent: &AgentName,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
        env: &mut Env<'_>,
    ) -> bool {
        let plan = match env
            .records
            .store
            .descendants_post_order(&env.records.tenant, parent)
        {
            Ok(p) => p,
            Err(e) => {
                // A planning error changes nothing (step 2); the orphan sweeper
                // of a later version retries.
                tracing::error!(agent = %parent, error = %e, "planning a cascade failed");
                return slot;
            }
        };
        let targets: Vec<(AgentName, Terminal)> = plan
            .into_iter()
            .filter(|a| !a.status.is_finished())
            .map(|a| (a.name, Terminal::Cancelled(CancelReason::ParentDead)))
            .collect();
        self.begin(
            targets,
            group,
            None,
            clear.into_iter().collect(),
            usize::from(slot),
            env,
        );
        false
    }

    /// Stops an agent and its whole subtree: the agent with `outcome`, every
    /// descendant with `parent_dead`.
    pub(in crate::supervisor) fn subtree(
        &mut self,
        name: &AgentName,
        outcome: Terminal,
        env: &mut Env<'_>,
    ) {
        let plan = match env
            .records
            .store
            .descendants_post_order(&env.records.tenant, name)
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(agent = %name, error = %e, "planning a stop failed");
                return;
            }
        };
        let mut targets: Vec<(AgentName, Terminal)> = plan
            .into_iter()
            .filter(|a| !a.status.is_finished())
            .map(|a| (a.name, Terminal::Cancelled(CancelReason::ParentDead)))
            .collect();
        targets.push((name.clone(), outcome));
        let group = env.agents.live.get(name).and_then(|l| l.group.clone());
        self.begin(targets, group, None, Vec::new(), 0, env);
    }

    /// Records the intent for every target, signals the whole subtree at once, and
    /// hands the waiting and killing to a task that reports `StopDone`; then
    /// (`then`) the collection of a result once the group is empty, `also`
    /// emptied besides the targets' channels and `slots` of ended runs given
    /// back.
    pub(in crate::supervisor) fn begin(
        &mut self,
        mut targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
        then: Option<Box<Collect>>,
        also: Vec<ToClear>,
        slots: usize,
        env: &mut Env<'_>,
    ) {
        // An agent whose end is being recorded (`ends_writer`) is ending
        // already: no stop of it is recorded or carried out.
        targets.retain(|(n, _)| !env.ends_writer.flight.contains(n));
        // A stop that carries nothing else (a collection, channels, slots)
        // may wait whole for an agent whose start is in flight.
        let bare = then.is_none() && also.is_empty() && slots == 0;
        if !defer_starting(&mut targets, group.as_ref(), bare, env) {
            return;
        }
        let id = self.id();
        // Agents hosted by another supervisor sharing the store get the intent
        // recorded here, like every target; their host sees it on its next tick
        // and carries it out (it alone can signal them and knows when they are
        // gone), so they are not this stop's to finish.
        let mut remote = std::collections::HashSet::new();
        let now = now_ms();
        // The intent first (one transaction per outcome; in practice one or two).
        let mut by_outcome: Vec<(Terminal, Vec<AgentName>)> = Vec::new();
        for (n, t) in &targets {
            match by_outcome.iter_mut().find(|(o, _)| o == t) {
                Some((_, v)) => v.push(n.clone()),
                None => by_outcome.push((*t, vec![n.clone()])),
            }
        }
        // The top of the stop (last in post-order) is recorded first.
        by_outcome.reverse();
        for (t, names) in &by_outcome {
            match env
                .records
                .store
                .mark_stopping(&env.records.tenant, names, *t, now)
            {
                Ok(agents) => {
                    for a in agents {
                        if a.supervisor != env.me && !env.agents.live.contains_key(&a.name) {
                            remote.insert(a.name.clone());
                            continue;
                        }
                        let pid = env.agents.live.get(&a.name).and_then(|l| l.pid);
                        project_agent(&env.records.projection, env.paths, &a, pid);
                        env.records.project_channel(env.agents, &a, None);
                    }
                }
                Err(e) => tracing::error!(error = %e, "recording a stop failed"),
            }
        }
        targets.retain(|(n, _)| !remote.contains(n));
        let mut pgids = Vec::new();
        for (n, t) in &targets {
            if let Some(l) = env.agents.live.get_mut(n) {
                l.stopping = Some(id);
                // A stopped run calls no model: its gateway's connections
                // are cut now, not when its group is empty (issue 31).
                l.gateway = None;
                if l.pid.is_none() {
                    l.cancelled_before_start = true;
                }
                if let Some(p) = l.pid {
                    pgids.push(p);
                }
            }
            env.sockets.close(n);
            let reason = t.reason().unwrap_or("stopped").to_owned();
            env.agents.to_agent(n, &ToAgent::Cancel { reason });
        }
        if let Some(c) = &then
            && let Some(p) = env.agents.live.get(&c.ending.name).and_then(|l| l.pid)
        {
            // Without cgroups, what the collected agent left behind is in its
            // own process group.
            pgids.push(p);
        }
        let mut clear = channels_of(env.agents, env.paths, &targets);
        clear.extend(also);
        self.stops.insert(
            id,
            Stop {
                targets,
                group: group.clone(),
                attempts: 0,
                then,
                clear: clear.clone(),
                slots,
            },
        );
        self.empty(id, group, pgids, true, Duration::ZERO, clear);
    }

    /// The part's next step, the follow-ups before it applied.
    pub(in crate::supervisor) fn resume(
        &mut self,
        step: Step,
        env: &mut Env<'_>,
    ) -> Vec<StopFollow> {
        match step.0 {
            Next::Forget(name) => {
                if let Some(l) = env.agents.live.get(&name)
                    && l.pid.is_none()
                    && l.cancelled_before_start
                    && l.launching
                {
                    // Its launch is still in flight: keep the entry so the launch result
                    // finds it and kills what started.
                    return Vec::new();
                }
                vec![StopFollow::Forget(name)]
            }
            Next::Recorded { targets, since } => {
                tracing::debug!(
                    targets,
                    elapsed_us = since.elapsed().as_micros() as u64,
                    "stop recorded"
                );
                Vec::new()
            }
            Next::Collect(c) => {
                // The result's agent may have been stopped meanwhile (cancelled): that
                // stop records its end, and nothing is collected.
                if env
                    .agents
                    .live
                    .get(&c.ending.name)
                    .is_some_and(|l| l.run == c.ending.run && l.stopping.is_none())
                {
                    vec![StopFollow::Collect(c)]
                } else {
                    Vec::new()
                }
            }
        }
    }
}

/// Leaves out of a stop the targets whose start is in flight
/// (`starts_writer`): the loop knows no process of theirs yet, so each is
/// stopped, with its outcome, once its start is recorded
/// (`Live::stop_after_start`), and one whose start the store refuses is
/// killed as any refused start is. When the stop's `group` is one of
/// theirs and the stop carries nothing else (`bare`), the whole stop waits:
/// its other targets are that agent's descendants, planned again when it is
/// stopped. `false` when nothing is left to stop now.
fn defer_starting(
    targets: &mut Vec<(AgentName, Terminal)>,
    group: Option<&Group>,
    bare: bool,
    env: &mut Env<'_>,
) -> bool {
    if !targets
        .iter()
        .any(|(n, _)| env.starts_writer.flight.contains(n))
    {
        return true;
    }
    let mut whole = false;
    for (n, t) in targets.iter() {
        if !env.starts_writer.flight.contains(n) {
            continue;
        }
        if let Some(l) = env.agents.live.get_mut(n) {
            if l.stop_after_start.is_none() {
                l.stop_after_start = Some(*t);
            }
            let its = l.group.as_ref().map(|g| &g.dir);
            whole |= its.is_some() && its == group.map(|g| &g.dir);
        }
    }
    if whole && bare {
        return false;
    }
    targets.retain(|(n, _)| !env.starts_writer.flight.contains(n));
    true
}
