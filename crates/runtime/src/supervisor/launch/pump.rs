//! The queue served (SPEC 9): the agents waiting for a concurrency slot
//! started first in first out, their slots taken for the whole line in one
//! call, and what each launch reads of the store before anything is made
//! (its record, a protocol agent's `init` frame with its history).

use brood_core::{AgentName, RunId};
use brood_proto::{HistoryMessage, InitConfig, ToAgent};
use brood_store::{Agent, Protocol, StoreError};
use serde_json::Value;

use super::Env;
use crate::supervisor::launcher::Launcher;
use crate::supervisor::task_of;

impl Launcher {
    /// Starts queued agents, first in first out, while concurrency slots are free
    /// (SPEC 9: a full tenant queues instead of failing). Called after every
    /// command, so a slot freed anywhere is used at once.
    pub(in crate::supervisor) fn pump(&mut self, env: &mut Env<'_>) {
        // Slots are taken for the whole line at once (one call to the
        // counter, one commit with the store's shares), then handed out in
        // order; what is left over goes back with the command's releases.
        let mut held = 0;
        while let Some(name) = self.waiting.front().cloned() {
            let ready = env
                .agents
                .live
                .get(&name)
                .is_some_and(|l| l.pending.is_some() && !l.launching);
            if !ready {
                self.waiting.pop();
                continue;
            }
            if held == 0 {
                // This runs after every command; asking for slots is only
                // worth it when someone is waiting for one.
                let used = self.held(env.agents.slots_used());
                let room = (self.max_concurrent as usize).saturating_sub(used);
                let live = &env.agents.live;
                let want = self
                    .waiting
                    .iter()
                    .filter(|n| {
                        live.get(*n)
                            .is_some_and(|l| l.pending.is_some() && !l.launching)
                    })
                    .take(room)
                    .count();
                held = self.take_slots(
                    &env.records.tenant,
                    want,
                    used,
                    env.records.store.as_ref(),
                    &env.host.me,
                );
                if held == 0 {
                    return;
                }
            }
            let Some(run) = env.agents.live.get(&name).map(|l| l.run.clone()) else {
                self.waiting.pop();
                continue;
            };
            // What the launch reads of the store comes first, before anything
            // is made: an error is not an empty history (issue 28). The agent
            // keeps its place and its turn comes again after the next command
            // (at the latest the next tick).
            let cached = env
                .agents
                .live
                .get(&name)
                .and_then(|l| l.pending.as_ref())
                .and_then(|p| p.admitted.clone());
            let rr = launch_reads(env, &name, &run, cached);
            let read = match rr {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "reading what a launch needs failed; the agent waits and is tried again");
                    break;
                }
            };
            self.waiting.pop();
            let Some(l) = env.agents.live.get_mut(&name) else {
                continue;
            };
            let Some(p) = l.pending.take() else {
                continue;
            };
            l.launching = true;
            held -= 1;
            self.launch(
                &name,
                &run,
                &p.argv,
                p.cwd.as_deref(),
                p.group_parent,
                read,
                env,
            );
        }
        self.give_slots(held);
    }
}

/// What a launch reads of the store: the agent's record and, for a
/// protocol agent, its `init` frame (with the session's history).
fn launch_reads(
    env: &Env<'_>,
    name: &AgentName,
    run: &RunId,
    admitted: Option<Agent>,
) -> Result<LaunchReads, StoreError> {
    let first_run = admitted.is_some();
    let agent = match admitted {
        Some(a) => Some(a),
        None => env.records.store.agent(&env.records.tenant, name)?,
    };
    // A protocol agent's init goes into its stdin pipe before it starts, so
    // it reads it at once instead of waiting for the start to be recorded.
    let init = match (env.agents.live.get(name), &agent) {
        (Some(l), Some(a)) if l.protocol == Protocol::Brood => {
            Some(init_frame(env, run, a, l.instruction.clone())?)
        }
        _ => None,
    };
    Ok(LaunchReads {
        agent,
        init,
        first_run,
    })
}

/// The `init` frame that starts run `run` of protocol agent `agent`: its
/// instruction (the resume's, else its task), history and channel.
fn init_frame(
    env: &Env<'_>,
    run: &RunId,
    agent: &Agent,
    instruction: Option<String>,
) -> Result<Vec<u8>, StoreError> {
    let history = env
        .records
        .store
        .messages(&env.records.tenant, &agent.name, &agent.session)?
        .into_iter()
        .map(|m| HistoryMessage {
            role: m.role,
            content: m.content,
        })
        .collect();
    let init = ToAgent::Init {
        config: InitConfig {
            id: run.to_string(),
            name: agent.name.to_string(),
            run: run.to_string(),
            parent_session_id: agent.parent.as_ref().map(|p| p.to_string()),
            session_id: agent.session.to_string(),
            instruction: instruction.unwrap_or_else(|| task_of(agent)),
            customer: agent
                .customer
                .as_ref()
                .or(agent.parent.as_ref())
                .map(|c| c.to_string()),
            handoff: brood_proto::Handoff {
                dir: env
                    .records
                    .channel_dir_of(env.agents, agent)
                    .map(|d| d.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                refs: Vec::new(),
                output: None,
            },
            history,
            ..InitConfig::default()
        },
        agent_config: Value::Object(Default::default()),
    };
    Ok(brood_proto::encode(&init))
}

/// What a launch read of the store before anything was made
/// ([`launch_reads`]).
pub(super) struct LaunchReads {
    pub(super) agent: Option<Agent>,
    pub(super) init: Option<Vec<u8>>,
    /// Its admission was recorded by this loop (the record is its), so the
    /// run is its first: nothing needs counting its runs.
    pub(super) first_run: bool,
}
