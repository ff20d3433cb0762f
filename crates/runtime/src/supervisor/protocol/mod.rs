//! What an agent's process says (SPEC 7), as a part of the supervisor:
//! protocol messages, usage and budgets, status changes, stderr, and its
//! exit, which ends the run (or waits for the collection of its result).
//!
//! [`Relay`] owns what only this concern uses: the default `disk_max` and
//! the cgroups handle an exit's kill is explained with. It holds no
//! dispatcher. Each call is lent what it reads and writes of the other
//! parts ([`Env`]: the records, the live set, the agent sockets, where the
//! ctx tree is) and records what the agent said itself; what belongs to
//! another flow (a subtree stopped, a run's end, the agent's readiness told,
//! a request answered off the loop, its spend settled with the model
//! gateway's, its socket told of a status) it returns as a [`RelayFollow`],
//! which `supervisor::route::protocol` applies where the dispatcher did it.
//!
//! - `mod.rs`: the part, what it is lent, its follow-ups, a process's
//!   events (unknown or bad lines, its output, its exit);
//! - `said.rs`: its protocol messages, its usage and the budgets above it.

mod said;

use std::sync::Arc;

use brood_core::{AgentEvent, AgentName, FailReason, RunId, Status, Terminal};
use brood_launch::cgroup::Cgroups;
use serde_json::{Value, json};

use crate::paths::Paths;
use crate::supervisor::agents::Agents;
use crate::supervisor::ends::RunEnding;
use crate::supervisor::records::Records;
use crate::supervisor::sockets::Sockets;
use crate::supervisor::{AgentEv, Reply, ev, exit_code, now_ms, outcome_of};

/// At most this much of what an `exec` agent prints is kept as its result.
const EXEC_OUT_MAX: usize = 16 << 20;
/// The end of its stderr kept for its end's detail.
const STDERR_TAIL: usize = 4096;

/// The part that owns what only what a process says uses.
pub(in crate::supervisor) struct Relay {
    /// The largest file an agent may write when its policy sets none (the
    /// operator's `[resources]`): named when the kernel kills for it.
    disk_max: u64,
    /// The agents' groups, when this host contains them in cgroups: an OOM
    /// kill is read from them.
    cgroups: Option<Arc<Cgroups>>,
}

/// What the part reads and writes of the rest of the supervisor, lent for
/// one call.
pub(in crate::supervisor) struct Env<'a> {
    /// The store and tenant where what it says is recorded, and the ctx
    /// projection.
    pub(in crate::supervisor) records: &'a Records,
    /// The live set: its run's state.
    pub(in crate::supervisor) agents: &'a mut Agents,
    /// The agent sockets' followers, who hear what it streams and says.
    pub(in crate::supervisor) sockets: &'a mut Sockets,
    pub(in crate::supervisor) paths: &'a Paths,
}

/// What the agent at hand's words or exit need another flow to do.
pub(in crate::supervisor) enum RelayFollow {
    /// Its subtree stopped with this outcome (a protocol error).
    Stop(Terminal),
    /// It said `ready`: the node holding its `--ready` spawn told, its
    /// socket bound, then a spawn that waited for it answered.
    Ready {
        news: Option<String>,
        reply: Option<(Reply<brood_api::Agent>, bool)>,
    },
    /// A protocol `request`, answered off the loop (`Cmd::AgentReply`).
    Request { id: u64, op: String, args: Value },
    /// Its spend settled: the more of what it reported and what the model
    /// gateway metered, recorded and rolled up (`models`).
    SettleUsage,
    /// Its socket's followers told of its status (a turn's end).
    SockStatus(Status),
}

/// How a run whose process exited ends (no stop covering it).
pub(in crate::supervisor) enum Exit {
    /// With a result: what it handed back collected, then the end
    /// recorded (`ends`).
    Harvest(RunEnding),
    /// Without one: the end recorded now (`ends`).
    Finish(RunEnding),
}

impl Relay {
    pub(in crate::supervisor) fn new(disk_max: u64, cgroups: Option<Arc<Cgroups>>) -> Relay {
        Relay { disk_max, cgroups }
    }

    /// An event of `name`'s process in its run `run` (an event of an older
    /// run, or of an agent no longer live, is dropped); its exit is
    /// [`Self::exited`].
    pub(in crate::supervisor) fn on_agent(
        &mut self,
        name: &AgentName,
        run: &RunId,
        e: AgentEv,
        env: &mut Env<'_>,
    ) -> Option<RelayFollow> {
        let l = env.agents.live.get_mut(name)?;
        if l.run != *run {
            return None;
        }
        match e {
            AgentEv::Msg(m) => self.on_msg(name, run, m, env),
            AgentEv::Unknown(t) => {
                tracing::info!(agent = %name, r#type = %t, "unknown protocol message type ignored");
                let session = l.session.clone();
                env.records.append_events(&[ev(
                    name,
                    Some(run),
                    &session,
                    AgentEvent::ProtocolUnknown {
                        agent: name.clone(),
                        message_type: t,
                    },
                )]);
                None
            }
            AgentEv::Bad(err) => {
                if l.protocol_error.is_some() || l.stopping.is_some() {
                    return None;
                }
                l.protocol_error = Some(err.to_string());
                let session = l.session.clone();
                tracing::warn!(agent = %name, error = %err, "protocol error");
                env.records.append_events(&[ev(
                    name,
                    Some(run),
                    &session,
                    AgentEvent::ProtocolError {
                        agent: name.clone(),
                        line: Some(err.line),
                        error: err.to_string(),
                    },
                )]);
                Some(RelayFollow::Stop(Terminal::Failed(
                    FailReason::ProtocolError,
                )))
            }
            AgentEv::ExecOut(b) => {
                let room = EXEC_OUT_MAX.saturating_sub(l.exec_out.len());
                l.exec_out.extend_from_slice(&b[..b.len().min(room)]);
                None
            }
            AgentEv::Stderr(s) => {
                l.stderr_tail.push_str(&s);
                if l.stderr_tail.len() > STDERR_TAIL {
                    let mut cut = l.stderr_tail.len() - STDERR_TAIL;
                    while !l.stderr_tail.is_char_boundary(cut) {
                        cut += 1;
                    }
                    l.stderr_tail.drain(..cut);
                }
                let line =
                    json!({"ts": now_ms(), "run": run.as_str(), "stream": "stderr", "text": s});
                env.records
                    .projection
                    .append(env.paths.agent_dir(name).join("log"), format!("{line}\n"));
                None
            }
            // The loop hands an exit to `exited`, which takes the name and
            // run into the end.
            AgentEv::Exited { .. } => None,
        }
    }

    /// `name`'s process exited in its run `run`: how the run ends, unless
    /// a stop covers it (that stop records the outcome, in post-order).
    pub(in crate::supervisor) fn exited(
        &mut self,
        name: AgentName,
        run: RunId,
        status: i32,
        env: &mut Env<'_>,
    ) -> Option<Exit> {
        let l = env.agents.live.get_mut(&name)?;
        if l.run != run {
            return None;
        }
        l.exit = Some(status);
        l.stdin = None;
        // Its run is over: nothing more of it reaches a model.
        l.gateway = None;
        if l.stopping.is_some() {
            // The stop in flight records the outcome, in post-order.
            return None;
        }
        let (outcome, result, mut detail) = outcome_of(l, status);
        // A file past RLIMIT_FSIZE: the kernel's SIGXFSZ, for the
        // policy's disk_max (issue 24).
        if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGXFSZ {
            let w = format!(
                "killed by SIGXFSZ: a file it wrote reached the policy's disk_max ({} bytes)",
                crate::enforce::file_size_max(&l.policy, self.disk_max)
            );
            detail = Some(match detail {
                Some(d) => format!("{w}; {d}"),
                None => w,
            });
        }
        // A kill by the kernel for a limit of the policy says which limit
        // (read before the group is removed).
        if libc::WIFSIGNALED(status)
            && let (Some(cg), Some(g)) = (&self.cgroups, &l.group)
        {
            let why = if cg.oom_killed(g) {
                Some(format!(
                    "killed by the OOM killer: the policy's memory_max ({} bytes) was reached",
                    l.policy.resources.memory_max.unwrap_or_default()
                ))
            } else {
                None
            };
            if let Some(w) = why {
                detail = Some(match detail {
                    Some(d) => format!("{w}; {d}"),
                    None => w,
                });
            }
        }
        let ending = RunEnding {
            name,
            run,
            outcome,
            exit_code: exit_code(status),
            result,
            detail,
        };
        if ending.result.is_some() {
            // What it handed back is checked and kept off the dispatcher
            // (hashes, copies); the end is recorded when that comes back.
            Some(Exit::Harvest(ending))
        } else {
            Some(Exit::Finish(ending))
        }
    }
}
