//! An agent's live entry (`Live`): what the dispatcher holds for an agent
//! it runs, from its admission (or its claim, its resume) until its end is
//! recorded, and what waits for a slot (`Pending`) or to be recorded
//! (`UnrecordedEnd`).

use std::path::PathBuf;

use brood_core::policy::Policy;
use brood_core::{AgentName, RunId, SessionName, Terminal};
use brood_launch::cgroup::Group;
use brood_proto::DoneResult;
use brood_store::{Agent, Protocol};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Reply, collect};
use crate::paths::Paths;

pub(in crate::supervisor) struct Live {
    pub(in crate::supervisor) run: RunId,
    pub(in crate::supervisor) session: SessionName,
    pub(in crate::supervisor) parent: Option<AgentName>,
    pub(in crate::supervisor) parent_session: Option<SessionName>,
    pub(in crate::supervisor) protocol: Protocol,
    pub(in crate::supervisor) group: Option<Group>,
    pub(in crate::supervisor) pid: Option<i32>,
    pub(in crate::supervisor) stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    pub(in crate::supervisor) ready: bool,
    pub(in crate::supervisor) done: Option<DoneResult>,
    pub(in crate::supervisor) error: Option<String>,
    pub(in crate::supervisor) protocol_error: Option<String>,
    pub(in crate::supervisor) exec_out: Vec<u8>,
    /// What the agent streamed (`chunk`) since its last whole message of
    /// this turn, recorded as its message at the turn's end or its `done`.
    pub(in crate::supervisor) unsaid: String,
    /// It sent an assistant message of its own in this turn.
    pub(in crate::supervisor) said_this_turn: bool,
    pub(in crate::supervisor) stderr_tail: String,
    pub(in crate::supervisor) exit: Option<i32>,
    /// Set when a stop (cancel or parent death) covers this agent.
    pub(in crate::supervisor) stopping: Option<u64>,
    /// Cancelled while its launch was in flight: kill whatever starts.
    pub(in crate::supervisor) cancelled_before_start: bool,
    /// A stop covered it while its start was being recorded
    /// (`starts_writer`): made, with this outcome, once it is.
    pub(in crate::supervisor) stop_after_start: Option<Terminal>,
    pub(in crate::supervisor) spawn_reply: Option<(Reply<brood_api::Agent>, bool)>,
    /// The node that admitted it for this one and holds a `--ready` spawn
    /// open: told when it is ready (routed.rs).
    pub(in crate::supervisor) ready_news: Option<String>,
    /// What a resumed run is told to do (its new input); the original task otherwise.
    pub(in crate::supervisor) instruction: Option<String>,
    /// The init frame of the run being launched (protocol agents), until
    /// `on_launched` has sent what the launch could not pre-write.
    pub(in crate::supervisor) init: Option<Vec<u8>>,
    /// The agent's effective policy (SPEC 5), checked at admission.
    pub(in crate::supervisor) policy: Policy,
    /// The values of its policy's `secrets` (issue 25), held here and in
    /// its process's environment only: from its caller for a root, from its
    /// parent's for a child. Gone with the live entry, so a new run needs
    /// them again.
    pub(in crate::supervisor) secrets: brood_api::Secrets,
    /// Children created by this run so far: what the attenuation check of its
    /// next child needs (SPEC 5 create_limit).
    pub(in crate::supervisor) creates_used: u32,
    /// Dollars this run has spent: the more of what it reported and what
    /// the model gateway metered (issue 31), never lowered.
    pub(in crate::supervisor) run_usd: f64,
    /// What the run reported (SPEC 7 `usage`, cumulative), kept for display.
    pub(in crate::supervisor) reported_usd: f64,
    pub(in crate::supervisor) reported_in: u64,
    pub(in crate::supervisor) reported_out: u64,
    /// What brood metered of its calls through the model gateway.
    pub(in crate::supervisor) metered_usd: f64,
    pub(in crate::supervisor) metered_in: u64,
    pub(in crate::supervisor) metered_out: u64,
    /// Its run's model gateway endpoint, open while the run may call.
    pub(in crate::supervisor) gateway: Option<crate::agent_socket::Listener>,
    /// Its run's calls in the current minute, against its `model_rate`
    /// (issue 31); gone with the live entry.
    pub(in crate::supervisor) model_window: brood_core::rate::Window,
    /// Dollars spent by the agent (every run) and its whole subtree, finished
    /// descendants included: what its `cost_limit` is held to (SPEC 9). Kept up to
    /// date as usage arrives, so a budget is checked without a store read.
    pub(in crate::supervisor) subtree_usd: f64,
    /// Why its budget stopped it, for the record's detail.
    pub(in crate::supervisor) budget_note: Option<String>,
    /// When this run was admitted (the invocation duration metric).
    pub(in crate::supervisor) admitted: std::time::Instant,
    /// Its sandbox as specified: the result collector is confined with it
    /// (prepared again then), so that it opens the child's files with the
    /// child's rights. The spec, not the prepared ruleset, is kept: a
    /// ruleset is a descriptor, and the daemon holds as few as it can a
    /// live agent (`brood bench memory`).
    pub(in crate::supervisor) sandbox: Option<collect::KeptSandbox>,
    /// When this run must end (its start plus `timeout_s`), in Unix seconds.
    pub(in crate::supervisor) deadline_unix_s: Option<u64>,
    /// `iso = ns`: the agent runs in a private mount namespace.
    pub(in crate::supervisor) iso_ns: bool,
    /// With `iso = ns`: the directory that becomes its `/`, if the request named one.
    pub(in crate::supervisor) ns_root: Option<PathBuf>,
    /// It or an ancestor has resource limits: its processes join the limit groups.
    pub(in crate::supervisor) limited: bool,
    /// The supervisor's side of its run's door, served while it lives.
    pub(in crate::supervisor) door: Option<crate::agent_socket::Listener>,
    /// What to start once a concurrency slot is free (SPEC 9: `queued`).
    pub(in crate::supervisor) pending: Option<Pending>,
    /// Its launch was handed to the spawner (it holds a concurrency slot).
    pub(in crate::supervisor) launching: bool,
    /// Its run ended but the end could not be recorded (the store was
    /// away): kept, and recorded at a later tick, so the record never says
    /// running for a process that is gone.
    pub(in crate::supervisor) unrecorded: Option<Box<UnrecordedEnd>>,
    /// Its place in its tree's trace, as its spec records it (issue 30):
    /// kept so a child's admission here reads no record for it. `None`
    /// where the live entry was made from a record (read then).
    pub(in crate::supervisor) trace: Option<crate::trace::Placed>,
}

/// An admitted agent's launch, waiting for a concurrency slot.
/// A run's end as `finish` was given it, kept while it cannot be recorded.
pub(in crate::supervisor) struct UnrecordedEnd {
    pub(in crate::supervisor) outcome: Terminal,
    pub(in crate::supervisor) exit_code: Option<i32>,
    pub(in crate::supervisor) result: Option<String>,
    pub(in crate::supervisor) detail: Option<String>,
    pub(in crate::supervisor) harvest: Option<crate::channel::Harvest>,
}

pub(in crate::supervisor) struct Pending {
    /// The record its admission wrote, when it was admitted by this run of
    /// the loop: what the launch reads of it (the task, the customer) is
    /// fixed at admission, so the launch need not read it again.
    pub(in crate::supervisor) admitted: Option<Agent>,
    pub(in crate::supervisor) argv: Vec<String>,
    pub(in crate::supervisor) cwd: Option<String>,
    pub(in crate::supervisor) group_parent: Option<Group>,
}

impl Live {
    /// Its parent's channel to it (`None` for a root), from what the live
    /// entry knows, without a store read.
    pub(in crate::supervisor) fn channel_dir(
        &self,
        paths: &Paths,
        name: &AgentName,
    ) -> Option<PathBuf> {
        let (p, ps) = self.parent.as_ref().zip(self.parent_session.as_ref())?;
        Some(paths.channel_dir(p, ps, name))
    }

    /// The live entry of a run already recorded (resumed, taken up at a
    /// restart, claimed from another node's placement): its run, session
    /// and protocol from its record `a`, its namespace from its `spec`.
    pub(in crate::supervisor) fn of_record(
        a: &Agent,
        spec: &Value,
        parent: Option<(AgentName, SessionName)>,
        policy: Policy,
        instruction: Option<String>,
    ) -> Live {
        let mut live = Live::new(
            a.run.clone(),
            a.session.clone(),
            parent,
            a.protocol,
            policy,
            instruction,
        );
        live.iso_ns = spec["iso"] == "ns";
        live.ns_root = spec["root"].as_str().map(PathBuf::from);
        live
    }

    pub(in crate::supervisor) fn new(
        run: RunId,
        session: SessionName,
        parent: Option<(AgentName, SessionName)>,
        protocol: Protocol,
        policy: Policy,
        instruction: Option<String>,
    ) -> Live {
        let (parent, parent_session) = match parent {
            Some((p, s)) => (Some(p), Some(s)),
            None => (None, None),
        };
        Live {
            run,
            session,
            parent,
            parent_session,
            protocol,
            group: None,
            pid: None,
            stdin: None,
            ready: false,
            done: None,
            error: None,
            protocol_error: None,
            exec_out: Vec::new(),
            unsaid: String::new(),
            said_this_turn: false,
            stderr_tail: String::new(),
            exit: None,
            stopping: None,
            cancelled_before_start: false,
            stop_after_start: None,
            spawn_reply: None,
            ready_news: None,
            instruction,
            init: None,
            policy,
            secrets: brood_api::Secrets::new(),
            creates_used: 0,
            run_usd: 0.0,
            reported_usd: 0.0,
            reported_in: 0,
            reported_out: 0,
            metered_usd: 0.0,
            metered_in: 0,
            metered_out: 0,
            gateway: None,
            model_window: brood_core::rate::Window::default(),
            subtree_usd: 0.0,
            budget_note: None,
            admitted: std::time::Instant::now(),
            sandbox: None,
            deadline_unix_s: None,
            iso_ns: false,
            ns_root: None,
            limited: false,
            door: None,
            trace: None,
            pending: None,
            launching: false,
            unrecorded: None,
        }
    }
}
