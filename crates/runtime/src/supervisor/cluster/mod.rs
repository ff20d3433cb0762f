//! This supervisor as a node of the cluster sharing its store (issue 15,
//! docs/many-nodes.md): the part that owns what only the cluster's flows
//! use, who this node is, its node configuration, its heartbeats
//! ([`Beat`]), and decides what the cluster asks of it: which nodes are
//! lost and what moves off them, where a new agent is placed, which agents
//! placed here are claimed, whether this node was fenced off, which records
//! of its own have no agent behind them.
//!
//! The part knows no other part. Each call is lent what it reads ([`Env`]:
//! the store and tenant, the live agents, the admissions in flight, whether
//! this node holds the sweepers' lease, the operator's identity) and makes
//! the cluster's own store calls itself (heartbeats, registering, claims,
//! declaring a node lost, its lease's lock broken, its record removed);
//! what another part must do (end a record without a process, stop or let
//! go of a local agent, host a claimed agent, deliver routed inputs, answer
//! waits, carry out recorded stops) it returns as [`NodeFollow`]s, in
//! order, interleaved with its own next steps ([`Step`]) where a step must
//! wait for the follow-ups before it (the agents moved away are let go of
//! before those that ended are read; a lost node's ends are told before
//! its lease and record go). The loop applies them one at a time
//! (`supervisor::route::cluster`), so the store sees the same calls in the
//! same order as when the dispatcher did all of it itself.
//!
//! - `nodes.rs`: the node's tick and the others' news, its heartbeat, its
//!   fence, the nodes declared lost, its records without agents;
//! - `placement.rs`: where a new agent runs, the live nodes, the claim of
//!   agents placed here;
//! - `moved.rs`: what moves when a node is lost, a moved run taken up, a
//!   node back from a pause heartbeating before it acts.

mod moved;
mod nodes;
mod placement;

use std::collections::BTreeSet;

use brood_core::policy::Policy;
use brood_core::{AgentName, TenantId, Terminal};
use brood_store::{Agent, NewNode, Store};

use super::NodeConfig;
use super::admitting::Admitting;
use super::agents::Agents;
use moved::Beat;
pub(super) use placement::stored_launch;

/// What the cluster's part reads of the rest of the supervisor, lent for
/// one call. Nothing in it lets the part act on another part; what it
/// needs done elsewhere it returns ([`NodeFollow`]).
pub(in crate::supervisor) struct Env<'a> {
    pub(in crate::supervisor) store: &'a dyn Store,
    pub(in crate::supervisor) tenant: &'a TenantId,
    /// The agents this supervisor runs: which are live here, their runs,
    /// parents and stops.
    pub(in crate::supervisor) agents: &'a Agents,
    /// Admissions whose answer is on its way to the loop: their agents are
    /// recorded and not yet live.
    pub(in crate::supervisor) admitting: &'a Admitting,
    /// Whether this supervisor holds the sweepers' lease now.
    pub(in crate::supervisor) holds_lease: bool,
    /// The operator's identity (what a root holds), for the stored policies
    /// of agents that may move.
    pub(in crate::supervisor) uid: u32,
    pub(in crate::supervisor) gid: u32,
    pub(in crate::supervisor) groups: &'a BTreeSet<u32>,
}

impl Env<'_> {
    /// What a root holds (SPEC 5 defaults): everything the operator holds.
    fn operator(&self) -> Policy {
        Policy::operator(self.uid, self.gid, self.groups.clone())
    }
}

/// What the cluster's part needs another part of the supervisor to do.
pub(in crate::supervisor) enum NodeFollow {
    /// What follows a recorded end (its files, its parent here or through
    /// the store, the waiters): an agent a lost node ran, ended lost.
    Ended(Agent),
    /// End the run of an agent no process runs for (never started here)
    /// with `outcome`: the record, its `agent.stop`, what follows an end.
    EndWithoutProcess {
        agent: Agent,
        outcome: Terminal,
        detail: String,
    },
    /// Host an agent claimed for this node as if admitted here; one that
    /// cannot be is handed back with [`Cluster::not_hosted`], or with
    /// [`Cluster::host_later`] when a store call failed.
    Host(Agent),
    /// More placed agents may wait behind a full claim: claimed as the next
    /// command, so the loop answers others in between.
    ClaimMore,
    /// Kill a live agent's processes and drop its entry, writing nothing:
    /// its record moved to another node.
    LetGo(AgentName),
    /// Stop a live agent's subtree as any stop.
    Stop(AgentName, Terminal),
    /// What other nodes posted through the store's inbox (`routed`).
    DeliverRoutedInputs,
    /// `--ready` spawns placed on another node, answered once it is ready.
    AnswerReadyWaits,
    /// Stops recorded by others for agents here (`sweep`).
    CarryOutRecordedStops,
    /// Waits for agents that ended on another node.
    AnswerRemoteWaits,
    /// The part's own next step, once the follow-ups before it are
    /// applied: handed back with [`Cluster::resume`].
    Then(Step),
}

/// A step of the cluster's own work, waiting for the follow-ups before it.
pub(in crate::supervisor) struct Step(Next);

enum Next {
    /// Fenced off, the agents that moved away let go of: the live agents
    /// whose records another node ended are stopped.
    StopEnded,
    /// Fenced off and its agents dealt with: this node registers again.
    Register,
    /// The others' heartbeats judged: each expired node declared lost.
    DeclareLostNodes,
    /// One expired node declared lost.
    DeclareLost(String),
    /// A lost node's ends told: its lease's lock broken, its record gone,
    /// then what it moved here claimed.
    LetGoOfNode(String),
    /// The agents placed on this node claimed.
    Claim,
    /// The claimed agents whose hosting a store call failed, hosted again.
    HostAgain,
    /// The live agents a fence could not read, read again.
    Recheck,
}

/// The node of the cluster this supervisor is: the part that owns it.
pub(in crate::supervisor) struct Cluster {
    /// This supervisor's id: its name among the nodes.
    me: String,
    /// What it says of itself when it registers, and its expiry. `None`
    /// (`brood run`, tests): not a node.
    node: Option<NodeConfig>,
    /// When its heartbeat last went through (`moved`).
    beat: Beat,
    /// Agents claimed for this node whose hosting failed on a store call
    /// (issue 28: an error is never a fact): hosted again at the next tick
    /// from their record read then, and meanwhile not taken for records
    /// without an agent.
    to_host: BTreeSet<AgentName>,
    /// Live agents whose record could not be read after this node was
    /// declared lost: whether they moved or ended is not known yet, so
    /// they run on and are read again at the next tick (`recheck`).
    unchecked: BTreeSet<AgentName>,
}

impl Cluster {
    pub(in crate::supervisor) fn new(me: String, node: Option<NodeConfig>) -> Cluster {
        Cluster {
            me,
            node,
            beat: Beat::default(),
            to_host: BTreeSet::new(),
            unchecked: BTreeSet::new(),
        }
    }

    /// Whether this supervisor is a node of a cluster (`brood serve`).
    pub(in crate::supervisor) fn is_node(&self) -> bool {
        self.node.is_some()
    }

    /// Its own next step, the follow-ups before it applied.
    pub(in crate::supervisor) fn resume(&mut self, step: Step, env: &Env) -> Vec<NodeFollow> {
        match step.0 {
            Next::StopEnded => self.stop_ended(env),
            Next::Register => {
                self.register(env);
                Vec::new()
            }
            Next::DeclareLostNodes => self.declare_lost_nodes(env),
            Next::DeclareLost(id) => self.declare_lost(&id, env),
            Next::LetGoOfNode(id) => self.let_go_of_node(&id, env),
            Next::Claim => self.claim(env),
            Next::HostAgain => self.host_again(env),
            Next::Recheck => self.recheck(env),
        }
    }

    fn node_record(&self) -> Option<NewNode> {
        let node = self.node.as_ref()?;
        Some(NewNode {
            id: self.me.clone(),
            address: node.address.clone(),
            labels: super::node_labels(&node.labels),
            capacity: node.capacity,
        })
    }
}

fn then(next: Next) -> NodeFollow {
    NodeFollow::Then(Step(next))
}
