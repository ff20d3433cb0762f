//! An agent and its runs as every surface shows them: `brood_api`'s types,
//! built from the store's records.

use std::sync::Arc;

use brood_store::{Agent, Run, Store};
use serde_json::Value;

/// An agent's record as every surface shows it (`brood_api::Agent`).
pub(crate) fn agent_view(store: &Arc<dyn Store>, a: &Agent) -> brood_api::Agent {
    let run = store.run(&a.tenant, &a.run).ok().flatten();
    agent_view_of(a, run)
}

/// [`agent_view`] of an agent whose current run is known without a read
/// (its record as a write just left it).
pub(crate) fn agent_view_of(a: &Agent, run: Option<Run>) -> brood_api::Agent {
    brood_api::Agent {
        name: a.name.to_string(),
        parent: a.parent.as_ref().map(|p| p.to_string()),
        customer: a.customer.as_ref().map(|p| p.to_string()),
        status: a.status.api_word().to_owned(),
        state: a.status.encode(),
        reason: a.status.reason().map(str::to_owned),
        detail: a.detail.clone(),
        depth: a.depth,
        session: a.session.to_string(),
        protocol: a.protocol.as_str().to_owned(),
        run: a.run.to_string(),
        pid: run
            .as_ref()
            .and_then(|r| if a.status.is_live() { r.pid } else { None })
            .map(i64::from),
        cgroup: run.as_ref().and_then(|r| r.cgroup.clone()),
        node: brood_store::placed_for(&a.supervisor)
            .unwrap_or(&a.supervisor)
            .to_owned(),
        supervisor_gone: false,
        result: run.as_ref().and_then(|r| r.result.clone()),
        exit_code: run.as_ref().and_then(|r| r.exit_code).map(i64::from),
        created_ms: a.created_ms,
        updated_ms: a.updated_ms,
        started_ms: run.as_ref().and_then(|r| r.started_ms),
        ended_ms: run.as_ref().and_then(|r| r.ended_ms),
        tokens_in: run.as_ref().map(|r| r.tokens_in),
        tokens_out: run.as_ref().map(|r| r.tokens_out),
        cost_usd: run.as_ref().map(|r| r.cost_usd),
    }
}

/// A typed answer as JSON, for the surfaces that speak JSON (the child
/// protocol's replies, the control socket's ops). Serialising these plain structs cannot
/// fail; `Null` is what a failure would give rather than a panic.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub(crate) fn run_view(r: &brood_store::Run) -> brood_api::RunView {
    brood_api::RunView {
        id: r.id.to_string(),
        seq: r.seq,
        pid: r.pid.map(i64::from),
        cgroup: r.cgroup.clone(),
        outcome: r.outcome.map(|t| t.encode()),
        exit_code: r.exit_code.map(i64::from),
        started_ms: r.started_ms,
        ended_ms: r.ended_ms,
        tokens_in: r.tokens_in,
        tokens_out: r.tokens_out,
        cost_usd: r.cost_usd,
    }
}
