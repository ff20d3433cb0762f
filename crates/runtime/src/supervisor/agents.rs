//! The agents this supervisor runs (the live set, the one place a process's
//! state is held) and what it tracks of children that other nodes ran.

use std::collections::{HashMap, HashSet};

use brood_core::{AgentName, Code, RunId};
use brood_proto::ToAgent;
use brood_store::Protocol;

use serde_json::Value;

use crate::api::{ApiError, Caller};

use super::{Live, Reply};

#[derive(Default)]
pub(super) struct Agents {
    /// Each entry boxed: a map keeps room for about twice its entries, and
    /// a `Live` is over a kilobyte, so inline entries made every live agent
    /// cost twice that in empty slots, kept after the agents ended
    /// (issue 28, `brood bench memory`).
    pub(super) live: HashMap<AgentName, Box<Live>>,
    /// Children of agents here that another node ran, whose artifacts are
    /// being fetched into their channel (issue 15): a wait for one is
    /// answered once its files are in place, as if it had run here.
    pub(super) fetching: HashSet<AgentName>,
    /// Such children whose end (of which run) was told to their parent
    /// here, with the parent: told once, whether the news of it or a wait
    /// that saw it in the store came first. Kept while the parent lives.
    pub(super) ends_told: HashMap<AgentName, (AgentName, RunId)>,
    /// `--ready` spawns placed on another node, answered when it is ready.
    pub(super) ready_waits: Vec<(AgentName, Reply<brood_api::Agent>)>,
    /// Such spawns whose node said they are ready, until their wait is
    /// answered (a read that failed meanwhile does not lose the news).
    pub(super) ready_heard: HashSet<AgentName>,
    /// Ends of agents here not yet told to their parent (or customer) on
    /// another node, because a store call failed: `(child, parent)`, told
    /// again at the next tick (issue 28: an error is never a fact).
    pub(super) ends_to_tell: Vec<(AgentName, AgentName)>,
    /// Ends another node told of whose reads here failed: `(told, child)`,
    /// heard again at the next tick.
    pub(super) ends_to_hear: Vec<(AgentName, AgentName)>,
    /// Closes another node told of whose read here failed, shown again at
    /// the next tick.
    pub(super) closes_to_show: Vec<AgentName>,
}

impl Agents {
    /// The answer to an agent's protocol `request`: a `reply` on its stdin.
    pub(super) fn reply_to_agent(&self, agent: &AgentName, re: u64, r: Result<Value, ApiError>) {
        let msg = match r {
            Ok(v) => brood_proto::Reply::ok(re, v),
            Err(e) => brood_proto::Reply::err(
                re,
                brood_proto::ErrorBody {
                    code: e.code.as_str().to_owned(),
                    reason: e.code.as_str().to_owned(),
                    message: e.message,
                },
            ),
        };
        self.to_agent(agent, &ToAgent::Reply(msg));
    }

    /// A protocol message to a live `brood`-protocol agent; nothing for
    /// any other.
    pub(super) fn to_agent(&self, name: &AgentName, msg: &ToAgent) {
        if let Some(l) = self.live.get(name)
            && l.protocol == Protocol::Brood
            && let Some(tx) = &l.stdin
        {
            let _ = tx.send(brood_proto::encode(msg));
        }
    }

    /// The runtime refuses its own tools (`create send wait close resume job`) to an
    /// agent whose policy does not grant them (SPEC 5).
    pub(super) fn tool_granted(&self, caller: &Caller, tool: &str) -> Result<(), ApiError> {
        let Caller::Agent(me) = caller else {
            return Ok(());
        };
        match self.live.get(me).and_then(|l| l.policy.tools.as_ref()) {
            Some(tools) if !tools.contains(tool) => Err(ApiError::new(
                Code::Forbidden,
                format!("agent {me} was not granted the tool {tool:?}"),
            )),
            _ => Ok(()),
        }
    }

    /// Agents holding a concurrency slot: those whose process was started.
    pub(super) fn slots_used(&self) -> usize {
        self.live.values().filter(|l| l.launching).count()
    }
}

impl super::jobs::RunningHere for Agents {
    fn running(&self, agent: &AgentName) -> bool {
        // Its process has started: a queued owner (a resume, a restart's)
        // can have no child admitted yet, and a worker refused for it would
        // use up an attempt of its item.
        self.live
            .get(agent)
            .is_some_and(|l| l.stopping.is_none() && l.pid.is_some())
    }

    fn run_of(&self, agent: &AgentName) -> Option<(RunId, brood_core::SessionName)> {
        self.live
            .get(agent)
            .map(|l| (l.run.clone(), l.session.clone()))
    }
}
