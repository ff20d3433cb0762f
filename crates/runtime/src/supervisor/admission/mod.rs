//! Admission (SPEC 5, 9): who may create what under whom. A creation is
//! decided without writing anything (the request read, the child's
//! effective policy derived from its parent's and checked (attenuation),
//! brood's machinery refused (the veil), the root and the customer
//! checked), then recorded by the store's admission transaction, which
//! counts the quotas; a refusal leaves an event in the would-be parent's
//! log and a count in `/metrics`. Creations that arrive together, and
//! cannot see each other ([`joins`]), are admitted together: decided one
//! by one, recorded in one group commit, followed up in arrival order.
//!
//! Admission is a part of the supervisor: its state (the admissions in
//! flight off the loop, the store's admission writer, the creations
//! waiting for one) is `supervisor::admitting`'s [`Admitting`]; what it
//! decides is here, as functions lent what they read ([`Env`]: who this
//! supervisor is, the records, the live set, the veil), with no
//! dispatcher. What belongs to another flow (where the agent runs, its
//! secret values, a child created in an earlier run, the queue served,
//! a caller answered) the entry points in `supervisor::route::admission`
//! do, in order, with what these return: a decision to record
//! ([`Decision`]), a refusal, or the live entry to enter and queue for a
//! slot ([`Recorded`]).
//!
//! - `mod.rs`: what the part is lent, what it returns, the batch rule;
//! - `policy.rs`: the child's effective policy and the parent's state it is
//!   checked against (here or on another supervisor), the tenant's quotas;
//! - `decide.rs`: the checks in SPEC 5's order, the record and its events;
//! - `record.rs`: what follows a recorded admission (the projection, the
//!   span, the live entry);
//! - `refusal.rs`: what a refusal leaves.
//!
//! [`Admitting`]: crate::supervisor::admitting::Admitting

mod decide;
mod policy;
mod record;
mod refusal;

pub(in crate::supervisor) use decide::{check, decision};
pub(in crate::supervisor) use policy::{operator_policy, remote_parent, tenant_quotas};
pub(in crate::supervisor) use record::{project_admitted, record};
pub(in crate::supervisor) use refusal::note as note_refusal;

use brood_core::policy::Policy;
use brood_core::{AgentName, SessionName};
use brood_launch::cgroup::Group;
use brood_store::{NewAgent, NewEvent};
use serde_json::Value;

use crate::api::{Caller, SpawnRequest};
use crate::supervisor::agents::Agents;
use crate::supervisor::batch::MAX_BATCH;
use crate::supervisor::host::Host;
use crate::supervisor::records::Records;
use crate::supervisor::{Live, Reply};

/// What admission reads of the rest of the supervisor, lent for one call.
/// Nothing in it is written but the ctx projection and the refused
/// parent's log: the live set, the queue and the callers are the loop's
/// ([`Recorded`]).
pub(in crate::supervisor) struct Env<'a> {
    /// Who this supervisor is, its configuration (quotas, resource
    /// defaults), its metrics and tracer.
    pub(in crate::supervisor) host: &'a Host,
    /// The store and tenant read, and the ctx projection written.
    pub(in crate::supervisor) records: &'a Records,
    /// The live set: a parent's policy, budget, creates and state.
    pub(in crate::supervisor) agents: &'a Agents,
    /// Brood's own machinery, never granted (issue 11).
    pub(in crate::supervisor) veil: Option<&'a crate::veil::Veil>,
}

/// What admission decided, ready to record.
pub(in crate::supervisor) struct Decision {
    /// The parent's group (when it runs here) and session.
    parent_live: Option<(Option<Group>, SessionName)>,
    policy: Policy,
    /// The values of its policy's secrets (never recorded).
    secrets: brood_api::Secrets,
    spec: Value,
    /// The record to write: name, parent, run and time among it.
    pub(in crate::supervisor) new: NewAgent,
    pub(in crate::supervisor) events: Vec<NewEvent>,
}

/// A recorded admission, projected: what the loop does with it.
pub(in crate::supervisor) enum Recorded {
    /// Admitted here for another node to run: nothing is live here.
    Elsewhere { name: AgentName, await_ready: bool },
    /// To run here: its live entry, entered (its parent's creates counted)
    /// and queued for a slot.
    Here {
        name: AgentName,
        parent: Option<AgentName>,
        live: Box<Live>,
        await_ready: bool,
    },
}

/// One creation of a batch, as it came to the loop.
pub(in crate::supervisor) struct Spawn {
    pub(in crate::supervisor) caller: Caller,
    pub(in crate::supervisor) req: SpawnRequest,
    pub(in crate::supervisor) reply: Reply<brood_api::Agent>,
}

impl Spawn {
    /// Who the new agent's parent is asked to be.
    pub(in crate::supervisor) fn parent(&self) -> Option<&AgentName> {
        match &self.caller {
            Caller::Agent(me) => Some(me),
            Caller::User { .. } => self.req.parent.as_ref(),
        }
    }
}

/// Whether `next` may be admitted together with `batch`. A batch holds
/// only creations that cannot see each other: decisions read the loop's
/// state and the store before anything of the batch is written, so two
/// creations under one parent (its `create_limit`, its budget), a creation
/// under another of the batch, two asking for one name, or one naming a
/// customer, each start a batch of their own. The store's transaction
/// checks the quotas either way.
pub(in crate::supervisor) fn joins(batch: &[Spawn], next: &Spawn) -> bool {
    if batch.len() >= MAX_BATCH || next.req.customer.is_some() {
        return false;
    }
    let parent = next.parent();
    let name = next.req.name.as_ref();
    batch.iter().all(|s| {
        let (p, n) = (s.parent(), s.req.name.as_ref());
        let same_parent = parent.is_some() && p == parent;
        let under_it = parent.is_some() && n == parent;
        let over_it = name.is_some() && p == name;
        let same_name = name.is_some() && n == name;
        !(same_parent || under_it || over_it || same_name)
    })
}
