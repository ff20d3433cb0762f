//! Reconcile (SPEC 9), every 30 ticks: the running totals kept on the loop
//! made true again from the store, the budgets they show exceeded, and the
//! slot counter.

use brood_core::{AgentName, TenantId};
use brood_store::Store;

use crate::hosts::{host_alive, registered_nodes};
use crate::metrics::{Metrics, Sweeper};
use crate::supervisor::agents::Agents;
use crate::supervisor::launcher::Launcher;

/// Budgets recomputed from the store (SPEC 9 reconcile): the running totals
/// kept from `usage` messages are a fast path; the runs' records are the
/// truth. A drift is logged and repaired; the agents whose budget it shows
/// exceeded are returned, to be stopped.
pub(in crate::supervisor) fn over_budget(
    agents: &mut Agents,
    store: &dyn Store,
    tenant: &TenantId,
    metrics: &Metrics,
) -> Vec<AgentName> {
    let limited: Vec<AgentName> = agents
        .live
        .iter()
        .filter(|(_, l)| l.policy.cost_limit.is_some() && l.stopping.is_none())
        .map(|(n, _)| n.clone())
        .collect();
    let mut over = Vec::new();
    for n in limited {
        let Ok(spend) = store.spend(tenant, &n) else {
            continue;
        };
        let Some(l) = agents.live.get_mut(&n) else {
            continue;
        };
        let truth = spend.subtree.cost_usd;
        if (l.subtree_usd - truth).abs() > 1e-9 {
            tracing::warn!(agent = %n, kept = l.subtree_usd, truth, "budget total drifted; repaired");
            l.subtree_usd = truth;
            metrics.sweeper_action(Sweeper::Reconcile);
        }
        if l.policy.cost_limit.is_some_and(|c| l.subtree_usd >= c) {
            over.push(n);
        }
    }
    over
}

/// The slot counter recomputed from the truth (SPEC 9 reconcile): the
/// embedded counter from this supervisor's own started agents, every
/// supervisor for itself; a shared (Redis, or the store's shares of nodes)
/// counter from the store's count of the tenant's started, unfinished
/// agents, by the lease holder (`holder`) only.
pub(in crate::supervisor) fn reconcile_slots(
    launcher: &mut Launcher,
    agents: &Agents,
    store: &dyn Store,
    tenant: &TenantId,
    metrics: &Metrics,
    holder: bool,
    shared: bool,
) {
    // This supervisor's share: what its own started agents hold, with the
    // ended ones whose group is still being emptied. Exact, since its
    // acquires and releases are made on this loop too (its spare slots are
    // given first).
    launcher.give_spare(tenant);
    let actual = launcher.held(agents.slots_used());
    match launcher.slots.repair(tenant, actual as u64) {
        Ok(0) => {}
        Ok(drift) => {
            tracing::warn!(drift, actual, counter = %launcher.slots.describe(), "slot counter drifted; repaired");
            metrics.sweeper_action(Sweeper::Reconcile);
        }
        Err(e) => tracing::warn!(error = %e, "repairing the slot counter failed"),
    }
    // The shares of supervisors that are gone (their agents died with
    // them), given back by the lease holder of a shared counter.
    if !(holder && shared) {
        return;
    }
    let nodes = match registered_nodes(store) {
        Ok(n) => n,
        Err(e) => {
            // Who is gone is not known: nothing is given back this round.
            tracing::warn!(error = %e, "reading the registered nodes failed; no slot given back this round");
            return;
        }
    };
    let alive = |id: &str| host_alive(id, &nodes);
    match launcher.slots.forget_holders(tenant, &alive) {
        Ok(0) => {}
        Ok(freed) => {
            tracing::warn!(freed, counter = %launcher.slots.describe(), "slots held by supervisors that are gone; given back");
            metrics.sweeper_action(Sweeper::Reconcile);
        }
        Err(e) => {
            tracing::warn!(error = %e, "giving back the slots of supervisors that are gone failed")
        }
    }
}
