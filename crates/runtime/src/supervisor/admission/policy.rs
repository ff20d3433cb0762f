//! A new agent's effective policy (SPEC 5): derived from its parent's (or,
//! for a root, the operator's) and checked against it (attenuation), with
//! the parent's live state: its budget left, its creates used, its
//! deadline. A parent hosted by another supervisor is read from the store.

use brood_core::Code;
use brood_core::ParentView;
use brood_core::policy::Policy;
use brood_core::policy::PolicyRequest;
use brood_core::{AgentName, Status};
use brood_store::Agent;
use serde_json::Value;

use super::Env;
use crate::api::{ApiError, SpawnRequest, internal};
use crate::hosts::host_alive;
use crate::hosts::registered_nodes;
use crate::supervisor::host::Host;
use crate::supervisor::{Live, deadline_unix_s, now_unix_s, stored_policy};

/// The quotas that apply to this supervisor's tenant now.
pub(in crate::supervisor) fn tenant_quotas(
    env: &Env<'_>,
) -> Result<brood_core::quota::Quotas, ApiError> {
    let own = env
        .records
        .store
        .tenant_quotas(&env.records.tenant)
        .map_err(internal)?;
    Ok(env.host.cfg.quotas.effective(Some(&own)))
}

/// What a root holds (SPEC 5 defaults): everything the operator holds.
pub(in crate::supervisor) fn operator_policy(host: &Host) -> Policy {
    Policy::operator(host.uid, host.gid, host.groups.clone())
}

/// A parent live on another supervisor sharing the store (SPEC 15: an agent
/// runs on one supervisor, its children may run on another): it must be
/// running or blocked, and its host alive. Anything else is the same
/// `ParentMismatch` a parent with no live process here gets.
pub(in crate::supervisor) fn remote_parent(
    p: &AgentName,
    env: &Env<'_>,
) -> Result<Agent, ApiError> {
    let a = env
        .records
        .store
        .agent(&env.records.tenant, p)
        .map_err(internal)?;
    match a {
        Some(a)
            if matches!(a.status, Status::Running | Status::Blocked)
                && a.supervisor != env.host.me
                && host_alive(
                    &a.supervisor,
                    &registered_nodes(env.records.store.as_ref()).map_err(internal)?,
                ) =>
        {
            Ok(a)
        }
        _ => Err(ApiError::new(
            Code::ParentMismatch,
            format!("parent {p} has no live process here or on another live supervisor"),
        )),
    }
}

/// A remote parent's effective policy, budget left, creates used and
/// deadline, read from the store (what its host keeps in memory).
fn remote_parent_view(
    pa: &Agent,
    env: &Env<'_>,
) -> Result<(Policy, Option<f64>, u32, Option<u64>), ApiError> {
    let spec: Value = serde_json::from_str(&pa.spec).unwrap_or(Value::Null);
    let policy = stored_policy(&spec, &operator_policy(env.host))?;
    let children = env
        .records
        .store
        .children(&env.records.tenant, &pa.name)
        .map_err(internal)?;
    let run = env
        .records
        .store
        .run(&env.records.tenant, &pa.run)
        .map_err(internal)?;
    let creates_used = children
        .iter()
        .filter(|c| run.as_ref().is_some_and(|r| c.created_ms >= r.created_ms))
        .count() as u32;
    let budget = match policy.cost_limit {
        None => None,
        Some(limit) => {
            let spent = env
                .records
                .store
                .spend(&env.records.tenant, &pa.name)
                .map_err(internal)?;
            let mut held = 0.0;
            for c in children.iter().filter(|c| !c.status.is_finished()) {
                let cspec: Value = serde_json::from_str(&c.spec).unwrap_or(Value::Null);
                if let Some(cl) = cspec["policy"]["cost_limit"].as_f64() {
                    let cs = env
                        .records
                        .store
                        .spend(&env.records.tenant, &c.name)
                        .map_err(internal)?;
                    held += (cl - cs.subtree.cost_usd).max(0.0);
                }
            }
            Some((limit - spent.subtree.cost_usd - held).max(0.0))
        }
    };
    let deadline = match (policy.timeout_s, run.and_then(|r| r.started_ms)) {
        (Some(t), Some(started)) => Some(deadline_unix_s(started, t)),
        _ => None,
    };
    Ok((policy, budget, creates_used, deadline))
}

/// What is left of a live agent's budget for a new child (SPEC 9): its limit,
/// less what its subtree has spent, less what its live children with limits
/// of their own have reserved and not yet spent. A child's unspent reservation
/// returns when it ends, simply because it is no longer live here; what it did
/// spend stays in `subtree_usd`. `None` when the agent has no limit.
fn budget_remaining(name: &AgentName, l: &Live, env: &Env<'_>) -> Option<f64> {
    let limit = l.policy.cost_limit?;
    let held: f64 = env
        .agents
        .live
        .values()
        .filter(|c| c.parent.as_ref() == Some(name))
        .filter_map(|c| c.policy.cost_limit.map(|cl| (cl - c.subtree_usd).max(0.0)))
        .sum();
    Some((limit - l.subtree_usd - held).max(0.0))
}

/// `policy` with the platform's `disk_max` where neither it nor an
/// ancestor set one (issue 24 item 6): every agent's writes are bounded,
/// and its children inherit the bound like any other limit. Filled in
/// before the attenuation check, which a parent without one (recorded
/// before there was a default) then passes.
fn with_disk_default(mut policy: Policy, host: &Host) -> Policy {
    if policy.resources.disk_max.is_none() {
        policy.resources.disk_max = Some(host.cfg.resource_defaults.disk_max);
    }
    policy
}

/// The effective policy of a new agent, or the refusal naming the first check
/// it fails (SPEC 5's order). A root is checked against the operator, a child
/// against its parent's effective policy and live state.
pub(super) fn child_policy(
    parent: Option<&AgentName>,
    remote: Option<&Agent>,
    req: &SpawnRequest,
    env: &Env<'_>,
) -> Result<Policy, ApiError> {
    let mut preq = match &req.policy {
        Some(v) => brood_proto::policy::from_value(v)
            .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?,
        None => PolicyRequest::default(),
    };
    // The spawn request's `env` is the policy's `env` given inline.
    if !req.env.is_empty() {
        let mut vars = preq.env.take().unwrap_or_default();
        vars.extend(req.env.iter().cloned());
        preq.env = Some(vars);
    }
    // The names of the secret values it gives join the policy's secrets
    // (issue 25); where the values come from is `admitted_secrets`'s.
    if !req.secrets.is_empty() {
        let mut names = preq.secrets.take().unwrap_or_default();
        names.extend(req.secrets.names().map(str::to_owned));
        preq.secrets = Some(names);
    }
    if !req.env.is_empty() || !req.secrets.is_empty() {
        // Checked again as a whole: a name given both ways is refused.
        preq = preq
            .normalise()
            .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?;
    }
    let now = now_unix_s();
    if let Some(pa) = remote {
        // A parent hosted by another supervisor: its effective policy and live
        // state come from the store, where that supervisor recorded them.
        let (policy, budget_remaining, creates_used, deadline) = remote_parent_view(pa, env)?;
        let view = ParentView {
            policy: &policy,
            budget_remaining,
            creates_used,
            deadline_unix_s: deadline,
            now_unix_s: now,
        };
        let child = with_disk_default(brood_core::attenuation::derive(&view, &preq), env.host);
        brood_core::attenuation::check(&view, &child)
            .map_err(|r| ApiError::new(r.code, r.message))?;
        return Ok(child);
    }
    match parent.and_then(|p| env.agents.live.get(p).map(|l| (p, l))) {
        Some((p, l)) => {
            let view = ParentView {
                policy: &l.policy,
                budget_remaining: budget_remaining(p, l, env),
                creates_used: l.creates_used,
                deadline_unix_s: l.deadline_unix_s,
                now_unix_s: now,
            };
            let child = with_disk_default(brood_core::attenuation::derive(&view, &preq), env.host);
            brood_core::attenuation::check(&view, &child)
                .map_err(|r| ApiError::new(r.code, r.message))?;
            Ok(child)
        }
        None => {
            // The operator is the source of a root's environment, mount table,
            // tool tiers and rules: whatever it gives a root, it holds.
            let mut op = operator_policy(env.host);
            if let Some(vars) = &preq.env {
                op.env = vars.clone();
            }
            if let Some(s) = &preq.secrets {
                op.secrets = s.clone();
            }
            if let Some(m) = &preq.mounts {
                op.mounts = m.clone();
            }
            if let Some(p) = &preq.path {
                op.path = p.clone();
            }
            if let Some(r) = &preq.rules {
                op.rules = r.clone();
            }
            // Resuming after a restart is the operator's to give a
            // root: a root is resumed by asking for it.
            if let Some(o) = preq.on_restart {
                op.on_restart = o;
            }
            let view = ParentView {
                policy: &op,
                budget_remaining: None,
                creates_used: 0,
                deadline_unix_s: None,
                now_unix_s: now,
            };
            let root = with_disk_default(brood_core::policy::effective(&op, &preq), env.host);
            brood_core::attenuation::check(&view, &root)
                .map_err(|r| ApiError::new(r.code, r.message))?;
            Ok(root)
        }
    }
}
