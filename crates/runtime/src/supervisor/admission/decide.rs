//! Everything admission decides before anything is written, in SPEC 5's
//! order: who the parent is, the lifecycle, the child's effective policy
//! (attenuation), brood's machinery refused (the veil), the root, the
//! customer ([`check`]); then, once the loop has placed it and found its
//! secret values, the record and the events to write ([`decision`]).
//! Reads the loop's state and the store, writes nothing.

use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::Iso;
use brood_core::Life;
use brood_core::RunId;
use brood_core::policy::Policy;
use brood_launch::cgroup::Group;
use brood_store::Agent;
use brood_store::NewAgent;
use serde_json::json;

use super::policy::{child_policy, remote_parent};
use super::{Decision, Env};
use crate::api::{ApiError, Caller, SpawnRequest, internal, not_found};
use crate::supervisor::{ev, new_run_id, now_ms, rand_u32};

/// A creation that passed every check that reads no placement: what
/// [`decision`] completes once the loop has placed it
/// (`Dispatcher::place`) and found its secret values
/// (`Dispatcher::admitted_secrets`), which come next in SPEC 5's order.
pub(in crate::supervisor) struct Checked {
    /// Who the parent is, when it has one.
    pub(in crate::supervisor) parent: Option<AgentName>,
    name: AgentName,
    /// The parent's record, when another supervisor hosts it.
    pub(in crate::supervisor) remote: Option<Agent>,
    /// The parent's group (when it runs here) and session.
    parent_live: Option<(Option<Group>, brood_core::SessionName)>,
    /// Its effective policy.
    pub(in crate::supervisor) policy: Policy,
}

/// The checks of a creation up to its placement (module docs), or the
/// refusal naming the first it fails.
pub(in crate::supervisor) fn check(
    caller: &Caller,
    req: &SpawnRequest,
    env: &Env<'_>,
) -> Result<Checked, ApiError> {
    let parent = match (caller, &req.parent) {
        (Caller::Agent(me), None) => Some(me.clone()),
        (Caller::Agent(me), Some(p)) if p == me => Some(me.clone()),
        (Caller::Agent(me), Some(p)) => {
            return Err(ApiError::new(
                Code::ParentMismatch,
                format!(
                    "agent {me} asked to create a child of {p}; an agent creates only its own children"
                ),
            ));
        }
        (Caller::User { .. }, p) => p.clone(),
    };
    let name = match req.name.clone() {
        Some(n) => n,
        None => AgentName::generate("agent", rand_u32()),
    };
    let mut remote: Option<Agent> = None;
    let parent_live = match &parent {
        Some(p) if !env.agents.live.contains_key(p) => {
            let a = remote_parent(p, env)?;
            let session = a.session.clone();
            remote = Some(a);
            Some((None, session))
        }
        Some(p) => {
            let l = env.agents.live.get(p).ok_or_else(|| {
                ApiError::new(
                    Code::ParentMismatch,
                    format!("parent {p} has no live process here"),
                )
            })?;
            if l.stopping.is_some() {
                return Err(ApiError::new(
                    Code::ParentMismatch,
                    format!("parent {p} is stopping; it can admit no new child"),
                ));
            }
            Some((l.group.clone(), l.session.clone()))
        }
        None => None,
    };
    // SPEC 5's order: name, parent (above), lifecycle, then the policy checks.
    if req.life == Life::Detached {
        return Err(ApiError::new(
            Code::UnsupportedLifecycle,
            "life \"detached\" needs a tenant grant; none grants it here",
        ));
    }
    let policy = child_policy(parent.as_ref(), remote.as_ref(), req, env)?;
    // Brood's own machinery is never granted, whoever asks (issue 11).
    if let Some(v) = env.veil {
        v.check(&policy)
            .map_err(|m| ApiError::new(Code::ReservedPath, m))?;
    }
    if let Some(r) = &req.root {
        if req.iso != Iso::Ns {
            return Err(ApiError::new(Code::BadRequest, "root is only for iso = ns"));
        }
        // The new `/` must be something the agent may read at all.
        let p = brood_core::policy::AbsPath::new("root", r)
            .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?;
        if policy.mode_at(&p) == brood_core::policy::Mode::Hidden {
            return Err(ApiError::new(
                Code::FileExpansion,
                format!("root {r} is hidden by the agent's policy"),
            ));
        }
    }
    if let Some(c) = &req.customer {
        // The tree first, so a refused customer's chain (another tree's
        // agents) is never walked nor named; its own customer is a cycle.
        if c != &name {
            check_customer_tree(parent.as_ref(), c, env)?;
        }
        check_customer(&name, c, env)?;
    }
    Ok(Checked {
        parent,
        name,
        remote,
        parent_live,
        policy,
    })
}

/// The record and events of a checked creation, `host` the node that runs
/// it (this one's id when it runs here) and `secrets` its secret values.
pub(in crate::supervisor) fn decision(
    checked: Checked,
    host: String,
    secrets: brood_api::Secrets,
    caller: &Caller,
    req: &SpawnRequest,
    env: &Env<'_>,
) -> Result<Decision, ApiError> {
    let Checked {
        parent,
        name,
        remote,
        parent_live,
        policy,
    } = checked;
    let run = new_run_id();
    // The parent's session and run at creation, and who asked: recorded so
    // the `parent` and `owner` files can always be rebuilt from the store.
    let (parent_session, parent_run) = match (&parent, &remote) {
        (Some(_), Some(pa)) => (Some(pa.session.to_string()), Some(pa.run.to_string())),
        (Some(p), None) => (
            env.agents.live.get(p).map(|l| l.session.to_string()),
            env.agents.live.get(p).map(|l| l.run.to_string()),
        ),
        (None, _) => (None, None),
    };
    let trace = place_in_trace(parent.as_ref(), remote.as_ref(), req, &run, env)?;
    let owner = match caller {
        Caller::Agent(me) => format!("agent:{me}"),
        Caller::User { uid } => format!("user:{uid}"),
    };
    let spec = json!({
        "argv": req.argv,
        "task": req.task,
        "cwd": req.cwd,
        "owner": owner,
        "label": req.label,
        "parent_session": parent_session,
        "parent_run": parent_run,
        "life": req.life.as_str(),
        "iso": req.iso.as_str(),
        "root": req.root,
        // Recorded with the agent, so `brood show` tells a weaker sandbox.
        "allow_weaker_sandbox": env.host.cfg.allow_weaker_sandbox,
        "policy": brood_proto::policy::to_json(&policy),
        // Kept so a lost node's queue is placed again by the same labels.
        "placement": req.placement,
        // A `--ready` spawn placed on another node: the node to tell
        // when it is ready (routed.rs), whichever node hosts it.
        "ready_news": (req.await_ready && host != env.host.me).then(|| env.host.me.clone()),
        // Its place in its tree's trace (issue 30, `crate::trace`).
        "trace": trace.to_json(),
    });
    let now = now_ms();
    let mut events = vec![ev(
        &name,
        Some(&run),
        &req.session,
        AgentEvent::Spawn {
            agent: name.clone(),
            parent: parent.clone(),
            run: run.clone(),
        },
    )];
    if let (Some(p), Some((_, psess))) = (&parent, &parent_live) {
        events.push(ev(
            p,
            None,
            psess,
            AgentEvent::ChildSpawn {
                parent: p.clone(),
                child: name.clone(),
            },
        ));
    }
    let new = NewAgent {
        tenant: env.records.tenant.clone(),
        name: name.clone(),
        parent: parent.clone(),
        customer: req.customer.clone(),
        session: req.session.clone(),
        protocol: req.protocol,
        spec: spec.to_string(),
        handoff: req.task.clone(),
        supervisor: host,
        run: run.clone(),
        now_ms: now,
    };
    Ok(Decision {
        parent_live,
        policy,
        secrets,
        spec,
        new,
        events,
    })
}

/// Where a new agent goes in the traces (`crate::trace::place`): under
/// its parent's current run, read from the live entry or the record.
fn place_in_trace(
    parent: Option<&AgentName>,
    remote: Option<&Agent>,
    req: &SpawnRequest,
    run: &RunId,
    env: &Env<'_>,
) -> Result<crate::trace::Placed, ApiError> {
    let of_parent = match (parent, remote) {
        (Some(_), Some(pa)) => crate::trace::Placed::of_agent(pa).map(|t| (t, pa.run.clone())),
        (Some(p), None) => env.agents.live.get(p).and_then(|l| {
            let t = l.trace.or_else(|| {
                let a = env.records.store.agent(&env.records.tenant, p).ok()??;
                crate::trace::Placed::of_agent(&a)
            })?;
            Some((t, l.run.clone()))
        }),
        (None, _) => None,
    };
    crate::trace::place(
        of_parent.as_ref().map(|(t, r)| (*t, r)),
        req.traceparent.as_ref(),
        run,
    )
    .map_err(|m| ApiError::new(Code::BadRequest, m))
}

/// A customer lies in the new agent's own tree: the same root as its
/// parent (issue 24). Without it an agent could name another tree's agent
/// and have its child's result, whatever it says, delivered on that
/// agent's stdin. A root has no tree yet, so it names no customer. A
/// customer that does not exist is left to the store's admission.
fn check_customer_tree(
    parent: Option<&AgentName>,
    customer: &AgentName,
    env: &Env<'_>,
) -> Result<(), ApiError> {
    let Some(p) = parent else {
        return Err(ApiError::new(
            Code::Forbidden,
            format!(
                "customer {customer}: a root agent has no tree to name a customer in; \
                 a customer must lie in the new agent's own tree"
            ),
        ));
    };
    let Some(c) = env
        .records
        .store
        .agent(&env.records.tenant, customer)
        .map_err(internal)?
    else {
        return Ok(());
    };
    let root = match env
        .records
        .store
        .agent(&env.records.tenant, p)
        .map_err(internal)?
    {
        Some(pa) => pa.root,
        None => return Err(not_found(p)),
    };
    if c.root != root {
        return Err(ApiError::new(
            Code::Forbidden,
            format!(
                "customer {customer} is outside the tree of the parent {p} (root {root}); \
                 a customer must lie in the new agent's own tree"
            ),
        ));
    }
    Ok(())
}

/// SPEC 9 cycles, for a customer: the new agent `name` naming `customer` must
/// not close a loop of "who receives whose result". Walks the customer chain
/// from `customer` (each agent's customer, or its parent when it has none);
/// meeting `name` again, or any agent twice, is a `Cycle`. A customer that
/// does not exist is left to the store's admission, which refuses it.
fn check_customer(name: &AgentName, customer: &AgentName, env: &Env<'_>) -> Result<(), ApiError> {
    let mut chain = vec![customer.clone()];
    let mut cur = Some(customer.clone());
    while let Some(c) = cur {
        if &c == name {
            let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
            return Err(ApiError::new(
                Code::Cycle,
                format!(
                    "agent {name} cannot receive its own result: customer chain {name} -> {}",
                    path.join(" -> ")
                ),
            ));
        }
        let Some(a) = env
            .records
            .store
            .agent(&env.records.tenant, &c)
            .map_err(internal)?
        else {
            return Ok(());
        };
        cur = a.customer.or(a.parent);
        if let Some(n) = &cur {
            if chain.contains(n) {
                let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
                return Err(ApiError::new(
                    Code::Cycle,
                    format!("customer chain loops: {} -> {n}", path.join(" -> ")),
                ));
            }
            chain.push(n.clone());
        }
        if chain.len() > 10_000 {
            return Err(ApiError::new(
                Code::Cycle,
                "customer chain longer than 10000",
            ));
        }
    }
    Ok(())
}
