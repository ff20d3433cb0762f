//! The events brood records in an agent's log (SPEC 3 `events.jsonl`, SPEC 6):
//! one variant per kind, the one place their names and fields are written
//! down. The JSON form is `brood_proto::event`'s (this crate knows no serde);
//! the supervisor builds these and nothing else.

use crate::code::Code;
use crate::name::{AgentName, RunId};
use crate::status::{CancelReason, Terminal};

#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// `agent.spawn`, in the new agent's log.
    Spawn {
        agent: AgentName,
        parent: Option<AgentName>,
        run: RunId,
    },
    /// `agent.child.spawn`, in the parent's log.
    ChildSpawn { parent: AgentName, child: AgentName },
    /// `agent.child.refused`, in the would-be parent's log (SPEC 5).
    ChildRefused {
        parent: AgentName,
        /// The name asked for, if any (it may be the invalid part).
        child: Option<String>,
        code: Code,
        message: String,
    },
    /// `agent.start`: a run's process started (what its launch enforced is
    /// added by the supervisor).
    Start {
        agent: AgentName,
        run: RunId,
        pid: i32,
    },
    /// `agent.input`: a message given to the agent.
    Input {
        agent: AgentName,
        id: String,
        from: String,
    },
    /// `agent.status`: the agent said it is blocked or running again.
    Status {
        agent: AgentName,
        status: String,
        reason: Option<String>,
    },
    /// `agent.protocol.unknown`: a message type this version does not know.
    ProtocolUnknown {
        agent: AgentName,
        message_type: String,
    },
    /// `agent.protocol.error`: a bad line (numbered) or a refused result.
    ProtocolError {
        agent: AgentName,
        line: Option<u64>,
        error: String,
    },
    /// `agent.stop`: its run ended with `outcome`; `swept` names the sweeper
    /// and why, when a sweeper recorded it.
    Stop {
        agent: AgentName,
        outcome: Terminal,
        swept: Option<(&'static str, String)>,
    },
    /// `agent.child.stop`, in the parent's log.
    ChildStop {
        parent: AgentName,
        child: AgentName,
        outcome: Terminal,
    },
    /// `agent.child.cancel`, in the parent's log (SPEC 6 step 5).
    ChildCancel {
        parent: AgentName,
        child: AgentName,
        reason: CancelReason,
    },
    /// `agent.sweep`: a sweeper recorded a stop's intent.
    Sweep {
        agent: AgentName,
        sweeper: &'static str,
        outcome: Terminal,
        detail: String,
    },
    /// `agent.close`.
    Close { agent: AgentName },
    /// `agent.resume`: a new run on the same session.
    Resume { agent: AgentName, run: RunId },
    /// `agent.model.call`: one call of the model gateway (issue 31), as
    /// brood metered it, refused calls included.
    ModelCall(ModelCall),
}

/// One call through the model gateway, as brood counted it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    pub agent: AgentName,
    pub run: RunId,
    /// The model asked for (as the request named it).
    pub model: String,
    /// The endpoint's path (`/v1/messages`, ...).
    pub endpoint: &'static str,
    /// Streamed (server-sent events).
    pub stream: bool,
    /// The request in brief: its body's size and the messages (or input
    /// items) it carried.
    pub request_bytes: u64,
    pub messages: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    /// Some tokens were counted from text, the provider giving none.
    pub estimated: bool,
    /// From the request's arrival to the answer's end (or its refusal).
    pub latency_ms: u64,
    /// The HTTP status the agent got.
    pub status: u16,
    /// `ok`, `refused` (never sent), `cut` (a stream stopped by brood) or
    /// `failed` (the provider could not be reached or answered badly).
    pub outcome: &'static str,
    /// Why it was refused, cut or failed.
    pub detail: Option<String>,
}

impl AgentEvent {
    /// The event's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            AgentEvent::Spawn { .. } => "agent.spawn",
            AgentEvent::ChildSpawn { .. } => "agent.child.spawn",
            AgentEvent::ChildRefused { .. } => "agent.child.refused",
            AgentEvent::Start { .. } => "agent.start",
            AgentEvent::Input { .. } => "agent.input",
            AgentEvent::Status { .. } => "agent.status",
            AgentEvent::ProtocolUnknown { .. } => "agent.protocol.unknown",
            AgentEvent::ProtocolError { .. } => "agent.protocol.error",
            AgentEvent::Stop { .. } => "agent.stop",
            AgentEvent::ChildStop { .. } => "agent.child.stop",
            AgentEvent::ChildCancel { .. } => "agent.child.cancel",
            AgentEvent::Sweep { .. } => "agent.sweep",
            AgentEvent::Close { .. } => "agent.close",
            AgentEvent::Resume { .. } => "agent.resume",
            AgentEvent::ModelCall(_) => "agent.model.call",
        }
    }
}
