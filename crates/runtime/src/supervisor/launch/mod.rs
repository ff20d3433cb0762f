//! Launching an admitted agent that holds a slot, as a part of the
//! supervisor: the [`Launcher`] (its state in `launcher`: the spawner, the
//! cgroups, the slots, the network namespace pool, the veil and the queue)
//! serves the queue, works out each launch and takes up the spawner's
//! answer. It holds no dispatcher: each call is lent what it reads and
//! writes of the other parts ([`Env`]: who this supervisor is, the records,
//! the live set), and what belongs to another flow (a group made for
//! nothing removed, a failed launch ended, a launch nobody wants forgotten)
//! it returns as [`LaunchFollow`]s, in order, for the loop to apply
//! (`supervisor::route::launch`). Starts that arrive together are recorded
//! together by `batch`, between [`Launcher::begins`] and
//! [`Launcher::started`].
//!
//! - `mod.rs`: the part's entry points, what it is lent, the spawner's
//!   answer taken up and what its start's record is followed by
//!   (`agent.start`);
//! - `pump.rs`: the queue served, and what each launch reads of the store;
//! - `plan.rs`: a launch worked out on the loop;
//! - `prep.rs`: what a launch does on the spawner's thread.

mod plan;
mod prep;
mod pump;

use brood_core::{AgentEvent, AgentName, RunId};
use brood_launch::{LaunchError, Launched};
use brood_store::{Agent, NewEvent, Protocol, StartItem, StoreError};
use serde_json::Value;
use tokio::sync::mpsc;

pub(crate) use prep::Made;

use crate::objects::project_agent;
use crate::shown::{agent_view, agent_view_of};
use crate::supervisor::agents::Agents;
use crate::supervisor::host::Host;
use crate::supervisor::launcher::Launcher;
use crate::supervisor::outcome::reap_orphan_launch;
use crate::supervisor::records::Records;
use crate::supervisor::routed::tell_ready;
use crate::supervisor::{Live, answer, ev_value, io, now_ms, task_of};

/// What a launch reads and writes of the rest of the supervisor, lent for
/// one call. Nothing in it lets the part end a run or forget an agent: that
/// it returns ([`LaunchFollow`]).
pub(in crate::supervisor) struct Env<'a> {
    /// Who this supervisor is: its config (the door's and the gateway's
    /// hosts, the hooks, the weaker sandbox allowed), paths, base
    /// environment, uid, the containment it reports and the loop's inbox,
    /// where the spawner's answer comes back (`Cmd::Launched`).
    pub(in crate::supervisor) host: &'a Host,
    /// The store and tenant a launch reads (its record, its session's
    /// history, its runs) and the ctx projection a start shows in.
    pub(in crate::supervisor) records: &'a Records,
    /// The live set: who waits, who launches, and what a start fills in
    /// (its pid, stdin, group, sandbox, door, deadline).
    pub(in crate::supervisor) agents: &'a mut Agents,
}

/// What a launch needs another flow of the supervisor to do, in the order
/// given.
pub(in crate::supervisor) enum LaunchFollow {
    /// A group made for a launch that did not start, removed (the stops'
    /// part empties it off the loop).
    RemoveGroup(Option<brood_launch::cgroup::Group>),
    /// A launch that did not start: its run failed, ended and told as any
    /// run's end.
    Fail { name: AgentName, detail: String },
    /// A launch nobody wants any more (cancelled before it started, or its
    /// start refused by the store): its live entry forgotten, then handed
    /// back with [`Launcher::refused`] to kill what started and answer its
    /// creator.
    Refused {
        name: AgentName,
        launched: Option<Box<Launched>>,
    },
}

impl Launcher {
    /// What the spawner's answer needs before its start is recorded: the
    /// process taken up by its live entry, or (nobody wants it any more, or
    /// it did not start) everything of it ended here. `Some`: the start to
    /// record ([`Starting::record`]), then [`Self::started`].
    pub(in crate::supervisor) fn begins(
        &self,
        name: AgentName,
        run: RunId,
        r: Result<Launched, LaunchError>,
        made: Made,
        env: &mut Env<'_>,
    ) -> (Option<Starting>, Vec<LaunchFollow>) {
        let Made {
            group,
            sandbox,
            launch_meta,
        } = made;
        let live = env.agents.live.get_mut(&name).filter(|l| l.run == run);
        let Some(l) = live else {
            // Nobody wants it any more: make sure nothing survives, group included.
            return match r {
                Ok(p) => {
                    reap_orphan_launch(p, group, self.cgroups.clone());
                    (None, Vec::new())
                }
                Err(_) => (None, vec![LaunchFollow::RemoveGroup(group)]),
            };
        };
        l.group = group;
        l.sandbox = sandbox;
        let launched = match r {
            Ok(p) => p,
            Err(e) => {
                let detail = e.to_string();
                let group = l.group.take();
                let cancelled = l.cancelled_before_start;
                let then = if cancelled {
                    // Its record already says cancelled; nothing started.
                    LaunchFollow::Refused {
                        name,
                        launched: None,
                    }
                } else {
                    LaunchFollow::Fail { name, detail }
                };
                return (None, vec![LaunchFollow::RemoveGroup(group), then]);
            }
        };
        let cgroup_path = l
            .group
            .as_ref()
            .map(|g| g.dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        let session = l.session.clone();
        let mut start_payload = brood_proto::event::payload(&AgentEvent::Start {
            agent: name.clone(),
            run: run.clone(),
            pid: launched.pid,
        });
        for k in ["containment", "sandbox"] {
            if let Some(v) = launch_meta.get(k) {
                start_payload[k] = v.clone();
            }
        }
        let start_events = vec![ev_value(&name, Some(&run), &session, start_payload.clone())];
        let s = Starting {
            name,
            run,
            launched,
            cgroup_path,
            start_payload,
            start_events,
        };
        (Some(s), Vec::new())
    }

    /// What follows a start the store recorded (or refused: cancelled
    /// between admission and start): the IO task, the projection, the first
    /// words to the agent, the creator's answer.
    pub(in crate::supervisor) fn started(
        &self,
        s: Starting,
        start: Result<Agent, StoreError>,
        env: &mut Env<'_>,
    ) -> Vec<LaunchFollow> {
        let Starting {
            name,
            run,
            launched,
            cgroup_path,
            start_payload,
            start_events,
        } = s;
        let agent = match start {
            Ok(a) => a,
            Err(e) => {
                // Cancelled between admission and start: the record already says so;
                // kill what just started, leaving no orphan and no group.
                tracing::info!(agent = %name, error = %e, "start refused; killing the new process");
                return vec![LaunchFollow::Refused {
                    name,
                    launched: Some(Box::new(launched)),
                }];
            }
        };
        let pid = launched.pid;
        let written = launched.stdin_written;
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let (protocol, instruction) = match env.agents.live.get_mut(&name) {
            Some(l) => {
                l.pid = Some(pid);
                l.stdin = Some(stdin_tx.clone());
                crate::trace::log_span(&name, &run, l.trace).in_scope(|| {
                    tracing::info!(pid, node = %agent.supervisor, "run started");
                });
                (l.protocol, l.instruction.clone())
            }
            None => return Vec::new(),
        };
        io::start(
            name.clone(),
            run.clone(),
            protocol,
            launched,
            stdin_rx,
            env.host.tx.clone(),
        );
        env.records.project_events(&start_events);
        env.records.projection.write(
            env.host.paths.agent_dir(&name).join("meta.json"),
            crate::objects::agent_meta(&agent, Some(&start_payload)),
        );
        project_agent(&env.records.projection, &env.host.paths, &agent, Some(pid));
        env.records.project_channel(env.agents, &agent, None);
        // First words to the agent: what of its init the launch could not put in
        // the pipe before it started (protocol), or the handoff on stdin (exec).
        match protocol {
            Protocol::Brood => {
                let rest = env
                    .agents
                    .live
                    .get_mut(&name)
                    .and_then(|l| l.init.take())
                    .map(|init| init.get(written..).unwrap_or_default().to_vec())
                    .unwrap_or_default();
                if !rest.is_empty() {
                    let _ = stdin_tx.send(rest);
                }
            }
            Protocol::Exec => {
                let handoff = instruction.unwrap_or_else(|| task_of(&agent));
                let _ = stdin_tx.send(handoff.into_bytes());
                if let Some(l) = env.agents.live.get_mut(&name) {
                    // Dropping the only sender closes the agent's stdin after the handoff.
                    l.stdin = None;
                }
            }
        }
        // A plain program is ready once started.
        if protocol != Protocol::Brood
            && let Some(news) = env
                .agents
                .live
                .get_mut(&name)
                .and_then(|l| l.ready_news.take())
        {
            tell_ready(env.records, &name, Some(news));
        }
        if let Some(l) = env.agents.live.get_mut(&name)
            && let Some((reply, await_ready)) = l.spawn_reply.take()
        {
            if await_ready && protocol == Protocol::Brood {
                l.spawn_reply = Some((reply, true));
            } else {
                // The run as its start just wrote it: nothing read back
                // (the view shows neither its number nor its creation).
                let started = brood_store::Run {
                    id: run.clone(),
                    tenant: agent.tenant.clone(),
                    agent: name.clone(),
                    seq: 0,
                    pid: Some(pid),
                    cgroup: Some(cgroup_path),
                    outcome: None,
                    exit_code: None,
                    result: None,
                    tokens_in: 0,
                    tokens_out: 0,
                    cost_usd: 0.0,
                    started_ms: Some(agent.updated_ms),
                    ended_ms: None,
                    created_ms: agent.updated_ms,
                };
                answer(reply, Ok(agent_view_of(&agent, Some(started))));
            }
        }
        Vec::new()
    }

    /// A launch nobody wants any more, its live entry (`live`) forgotten by
    /// the loop: what started killed with its group, its creator answered
    /// with its record (which already says why).
    pub(in crate::supervisor) fn refused(
        &self,
        name: &AgentName,
        launched: Option<Box<Launched>>,
        live: Option<Live>,
        env: &Env<'_>,
    ) {
        let (group, reply) = match live {
            Some(mut l) => (l.group.take(), l.spawn_reply.take()),
            None => (None, None),
        };
        if let Some(p) = launched {
            reap_orphan_launch(*p, group, self.cgroups.clone());
        }
        if let Some((reply, _)) = reply {
            let r = env
                .records
                .agent(name)
                .map(|a| agent_view(&env.records.store, &a));
            answer(reply, r);
        }
    }
}

/// A launched process whose start is to be recorded ([`Launcher::begins`]).
pub(in crate::supervisor) struct Starting {
    name: AgentName,
    run: RunId,
    launched: Launched,
    cgroup_path: String,
    start_payload: Value,
    start_events: Vec<NewEvent>,
}

impl Starting {
    /// The agent whose start this is.
    pub(in crate::supervisor) fn name(&self) -> &AgentName {
        &self.name
    }

    /// The start's record as one item of the store's `start_runs`: starts
    /// that arrive together are recorded together (`batch`).
    /// `me`: this supervisor, which the record must still name (a node
    /// declared lost may hold a queued agent placed again elsewhere).
    pub(in crate::supervisor) fn item(&self, me: &str) -> StartItem {
        StartItem {
            name: self.name.clone(),
            run: self.run.clone(),
            pid: self.launched.pid,
            cgroup: self.cgroup_path.clone(),
            now_ms: now_ms(),
            events: self.start_events.clone(),
            supervisor: Some(me.to_owned()),
        }
    }
}
