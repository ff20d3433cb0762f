//! The transactions: admission with its quotas, `create_limit` and budget,
//! the intent of a stop, a run's end, resume and recovery.

use super::{
    I_AGENT, I_CHANNEL, I_EDGE, I_RUN, I_TENANT, MAX_WALK_DEPTH, Q_CREATED_SINCE, Q_FANOUT,
    Q_LAST_RUN_SEQ, Q_RUN_CREATED, Q_SUBTREE_USAGE, Q_TREE_SIZE, Q_UNFINISHED_CHILDREN_SPECS,
    Q_UNFINISHED_OF, Tx, U_CHANNEL_RESULT, U_RESUMED, U_STATUS, agent_at, agent_exists,
    append_events_tx, check_current_run, check_json_object, check_move, collect, corrupt,
    encode_artifacts, load_agent, must_agent, refused, stop_event, write_end,
};
use crate::types::Agent;
use crate::types::NewAgent;
use crate::types::NewEvent;
use crate::types::RunEnd;
use brood_core::AgentName;
use brood_core::CancelReason;
use brood_core::Code;
use brood_core::FailReason;
use brood_core::Quotas;
use brood_core::RunId;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::Terminal;
use rusqlite::Transaction;

// ---- the transactions -----------------------------------------------------------

/// Admission, with the quota checks when `quotas` is given (`admit_with_quotas`)
/// and without them (`admit`): one body, so the two can never disagree on
/// anything but the quotas.
pub(super) fn admit_tx(
    tx: &Transaction<'_>,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Tx<Agent> {
    let t = &new.tenant;
    check_json_object(|| format!("spec of agent {}", new.name), &new.spec, false)?;
    // The refusals in a fixed order, so a request wrong in several ways always
    // gets the same answer: the parent, then the name, then the customer.
    let parent = match &new.parent {
        None => None,
        Some(p) => {
            let Some(pa) = load_agent(tx, t, p)? else {
                return Err(refused(
                    Code::ParentMismatch,
                    format!("parent {p} does not exist in tenant {t}"),
                ));
            };
            // A stopping parent is live but dying: a child admitted now would be
            // missed by the cascade already planned (SPEC 6 step 1).
            if !pa.status.is_live() || matches!(pa.status, Status::Stopping(_)) {
                return Err(refused(
                    Code::ParentMismatch,
                    format!(
                        "parent {p} is {}: children are admitted only under a running or blocked parent",
                        pa.status.encode()
                    ),
                ));
            }
            Some(pa)
        }
    };
    if agent_exists(tx, t, &new.name)? {
        return Err(refused(
            Code::NameTaken,
            format!("agent name {} is taken in tenant {t}", new.name),
        ));
    }
    if let Some(c) = &new.customer
        && !agent_exists(tx, t, c)?
    {
        return Err(refused(
            Code::ParentMismatch,
            format!("customer {c} does not exist in tenant {t}"),
        ));
    }
    if let Some(q) = quotas {
        check_quotas(tx, new, parent.as_ref(), q)?;
    }

    tx.prepare_cached(I_TENANT)?
        .execute((t.as_str(), new.now_ms))?;
    let (root, depth) = match &parent {
        Some(p) => (p.root.clone(), i64::from(p.depth) + 1),
        None => (new.name.clone(), 0),
    };
    tx.prepare_cached(I_AGENT)?.execute(rusqlite::params![
        t.as_str(),
        new.name.as_str(),
        new.parent.as_ref().map(AgentName::as_str),
        new.customer.as_ref().map(AgentName::as_str),
        root.as_str(),
        depth,
        new.session.as_str(),
        new.protocol.as_str(),
        new.spec,
        Status::Queued.encode(),
        new.run.as_str(),
        new.supervisor,
        new.now_ms,
    ])?;
    tx.prepare_cached(I_RUN)?.execute((
        new.run.as_str(),
        t.as_str(),
        new.name.as_str(),
        1,
        new.now_ms,
    ))?;
    if let Some(p) = &parent {
        tx.prepare_cached(I_EDGE)?.execute((
            t.as_str(),
            p.name.as_str(),
            new.name.as_str(),
            new.now_ms,
        ))?;
        tx.prepare_cached(I_CHANNEL)?.execute((
            t.as_str(),
            p.name.as_str(),
            p.session.as_str(),
            new.name.as_str(),
            new.session.as_str(),
            new.handoff.as_str(),
        ))?;
    }
    append_events_tx(tx, t, events, new.now_ms)?;
    // The row just inserted, built from the values it was inserted with: reading
    // it back cost a query and a decode of every column on each admission.
    Ok(Agent {
        tenant: t.clone(),
        name: new.name.clone(),
        parent: new.parent.clone(),
        customer: new.customer.clone(),
        root,
        depth: u32::try_from(depth).map_err(|_| corrupt("agents.depth", depth.to_string()))?,
        session: new.session.clone(),
        protocol: new.protocol,
        spec: new.spec.clone(),
        status: Status::Queued,
        detail: None,
        run: new.run.clone(),
        supervisor: new.supervisor.clone(),
        created_ms: new.now_ms,
        updated_ms: new.now_ms,
    })
}

/// The quota checks of SPEC 9, in the order documented on
/// `Store::admit_with_quotas`: depth, fanout, tree size. Reads only; the caller's
/// `BEGIN IMMEDIATE` holds the write lock, so no other admission can change a
/// count between this check and the insert that follows it.
pub(super) fn check_quotas(
    tx: &Transaction<'_>,
    new: &NewAgent,
    parent: Option<&Agent>,
    q: &Quotas,
) -> Tx<()> {
    let t = &new.tenant;
    let name = &new.name;
    let Some(p) = parent else {
        // A root starts its own tree: depth 0 and no siblings, so only the tree
        // size applies, and its tree would hold just the root.
        if q.max_tree_size == 0 {
            return Err(refused(
                Code::QuotaTreeSize,
                format!(
                    "tree size quota: root {name} would start a tree of 1 agent \
                     in tenant {t}, and max_tree_size is 0"
                ),
            ));
        }
        return Ok(());
    };
    let depth = u64::from(p.depth) + 1;
    if depth > u64::from(q.max_depth) {
        return Err(refused(
            Code::QuotaDepth,
            format!(
                "depth quota: {name} would be at depth {depth} under {} (depth {}) \
                 in tenant {t}, and max_depth is {}",
                p.name, p.depth, q.max_depth
            ),
        ));
    }
    let fanout: i64 = tx
        .prepare_cached(Q_FANOUT)?
        .query_row((t.as_str(), p.name.as_str()), |r| r.get(0))?;
    if fanout >= i64::from(q.max_fanout) {
        return Err(refused(
            Code::QuotaFanout,
            format!(
                "fanout quota: parent {} in tenant {t} already has {fanout} unfinished \
                 children, and max_fanout is {}",
                p.name, q.max_fanout
            ),
        ));
    }
    let size: i64 = tx
        .prepare_cached(Q_TREE_SIZE)?
        .query_row((t.as_str(), p.root.as_str()), |r| r.get(0))?;
    if size >= i64::from(q.max_tree_size) {
        return Err(refused(
            Code::QuotaTreeSize,
            format!(
                "tree size quota: the tree of root {} in tenant {t} already holds {size} \
                 agents (every one ever created under it, finished or not, the root \
                 included), and max_tree_size is {}",
                p.root, q.max_tree_size
            ),
        ));
    }
    check_create_limit(tx, new, p)?;
    check_budget(tx, new, p)
}

/// The `policy.create_limit` recorded in a spec, if any.
pub(super) fn create_limit_of(spec: &str) -> Option<u64> {
    if !spec.contains("\"create_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("create_limit")?
        .as_u64()
}

/// SPEC 5's `create_limit`, inside the admission transaction: the children the
/// parent's current run has created so far (read through `agents_by_parent`,
/// from the run's creation on) must be fewer than its limit. The supervisor
/// checks the same from memory first; this makes it exact when supervisors
/// sharing the store admit children of one parent at once.
pub(super) fn check_create_limit(tx: &Transaction<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let Some(limit) = create_limit_of(&p.spec) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let since: i64 = tx
        .prepare_cached(Q_RUN_CREATED)?
        .query_row([p.run.as_str()], |r| r.get(0))?;
    let used: i64 = tx
        .prepare_cached(Q_CREATED_SINCE)?
        .query_row((t, p.name.as_str(), since), |r| r.get(0))?;
    if used as u64 >= limit {
        return Err(refused(
            Code::CreateLimit,
            format!(
                "create_limit: the parent {} has already created {used} of its {limit} children \
                 in this run (counted in the store, across every supervisor)",
                p.name
            ),
        ));
    }
    Ok(())
}

/// The `policy.cost_limit` recorded in a spec, if any.
pub(super) fn cost_limit_of(spec: &str) -> Option<f64> {
    // Most specs name no limit: skip the parse then.
    if !spec.contains("\"cost_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("cost_limit")?
        .as_f64()
}

/// The budget of SPEC 9, inside the admission transaction: a child naming a
/// `cost_limit` reserves it from what its parent has left — the parent's limit,
/// less its subtree's spend, less what its unfinished children with limits have
/// reserved and not spent. The supervisor checks the same from memory first;
/// this makes it exact when supervisors sharing the store admit children of one
/// parent at once.
pub(super) fn check_budget(tx: &Transaction<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let (Some(want), Some(limit)) = (cost_limit_of(&new.spec), cost_limit_of(&p.spec)) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let subtree_cost = |name: &str| -> Tx<f64> {
        Ok(tx
            .prepare_cached(Q_SUBTREE_USAGE)?
            .query_row((t, name, MAX_WALK_DEPTH), |r| r.get::<_, f64>(2))?)
    };
    let spent = subtree_cost(p.name.as_str())?;
    let kids = collect(tx, Q_UNFINISHED_CHILDREN_SPECS, (t, p.name.as_str()), |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut held = 0.0;
    for (kid, spec) in kids {
        if let Some(cl) = cost_limit_of(&spec) {
            held += (cl - subtree_cost(&kid)?).max(0.0);
        }
    }
    let left = (limit - spent - held).max(0.0);
    if want > left + 1e-9 {
        return Err(refused(
            Code::BudgetExceeded,
            format!(
                "cost_limit: {want} is more than the parent's remaining budget {left} \
                 ({} has {limit}, its subtree spent {spent}, its live children hold {held})",
                p.name
            ),
        ));
    }
    Ok(())
}

pub(super) fn mark_stopping_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let agent = must_agent(tx, tenant, name)?;
        match agent.status {
            Status::Running | Status::Blocked => {
                let to = check_move(&agent, Status::Stopping(outcome))?;
                tx.prepare_cached(U_STATUS)?.execute((
                    tenant.as_str(),
                    name.as_str(),
                    to.encode(),
                    now_ms,
                ))?;
            }
            // No process yet, so nothing to stop: the run ends here.
            Status::Queued => {
                check_move(&agent, Status::Ended(outcome))?;
                write_end(
                    tx,
                    &agent,
                    outcome,
                    None,
                    None,
                    agent.detail.as_deref(),
                    now_ms,
                )?;
            }
            // Already stopping keeps the intent recorded first; finished stays.
            Status::Stopping(_) | Status::Ended(_) | Status::Closed(_) => {}
        }
        out.push(must_agent(tx, tenant, name)?);
    }
    Ok(out)
}

pub(super) fn end_run_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(tx, tenant, name)?;
    // The outcome recorded with the stop intent stands, whatever the process did.
    let outcome = match agent.status {
        Status::Stopping(t) => t,
        _ => end.outcome,
    };
    check_move(&agent, Status::Ended(outcome))?;
    check_current_run(&agent, run)?;
    write_end(
        tx,
        &agent,
        outcome,
        end.exit_code,
        end.result.as_deref(),
        end.detail.as_deref(),
        end.now_ms,
    )?;
    if let Some(parent) = &agent.parent {
        let out = end.output.as_ref();
        tx.prepare_cached(U_CHANNEL_RESULT)?.execute((
            tenant.as_str(),
            parent.as_str(),
            name.as_str(),
            end.result.as_deref(),
            out.map(|o| o.refs.as_str()),
            out.map(|o| encode_artifacts(&o.artifacts)),
        ))?;
    }
    append_events_tx(tx, tenant, events, end.now_ms)?;
    must_agent(tx, tenant, name)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn resume_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    supervisor: &str,
    now_ms: i64,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(tx, tenant, name)?;
    if !agent.status.is_finished() {
        return Err(refused(
            Code::Conflict,
            format!(
                "agent {name} is {}: only a finished (ended or closed) agent can be resumed",
                agent.status.encode()
            ),
        ));
    }
    // An owned child never outlives its parent: a child resumed under a parent
    // that is stopping or over would be missed by every cascade. A queued parent is
    // fine (a restart resumes parents and children together); its own end will
    // plan this child in.
    if let Some(p) = &agent.parent {
        let parent_status = load_agent(tx, tenant, p)?.map(|pa| pa.status);
        if !matches!(
            parent_status,
            Some(Status::Queued | Status::Running | Status::Blocked)
        ) {
            let shown = parent_status.map_or_else(|| "missing".to_owned(), Status::encode);
            return Err(refused(
                Code::ParentMismatch,
                format!("agent {name} cannot be resumed: its parent {p} is {shown}"),
            ));
        }
        // The resumed agent is finished, so it is not among the counted.
        if let Some(q) = quotas {
            let fanout: i64 = tx
                .prepare_cached(Q_FANOUT)?
                .query_row((tenant.as_str(), p.as_str()), |r| r.get(0))?;
            if fanout >= i64::from(q.max_fanout) {
                return Err(refused(
                    Code::QuotaFanout,
                    format!(
                        "fanout quota: resuming {name} would give its parent {p} in tenant \
                         {tenant} {} unfinished children, and max_fanout is {}",
                        fanout + 1,
                        q.max_fanout
                    ),
                ));
            }
        }
    }
    let to = check_move(&agent, Status::Queued)?;
    let last: i64 = tx
        .prepare_cached(Q_LAST_RUN_SEQ)?
        .query_row((tenant.as_str(), name.as_str()), |r| r.get(0))?;
    tx.prepare_cached(I_RUN)?.execute((
        run.as_str(),
        tenant.as_str(),
        name.as_str(),
        last + 1,
        now_ms,
    ))?;
    tx.prepare_cached(U_RESUMED)?.execute((
        tenant.as_str(),
        name.as_str(),
        to.encode(),
        run.as_str(),
        supervisor,
        now_ms,
    ))?;
    // The channel shows the current run: no result until this run ends (SPEC 4,
    // `result.md` only with a terminal status). The old result stays on its run.
    if let Some(p) = &agent.parent {
        tx.prepare_cached(U_CHANNEL_RESULT)?.execute((
            tenant.as_str(),
            p.as_str(),
            name.as_str(),
            None::<&str>,
            None::<&str>,
            None::<&str>,
        ))?;
    }
    append_events_tx(tx, tenant, events, now_ms)?;
    must_agent(tx, tenant, name)
}

pub(super) fn recover_tx(
    tx: &Transaction<'_>,
    dead: &[String],
    lost: bool,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    let mut out = Vec::new();
    for supervisor in dead {
        let agents = collect(tx, Q_UNFINISHED_OF, [supervisor.as_str()], |r| {
            agent_at(r, 0)
        })?;
        for agent in agents {
            let (outcome, detail) = match agent.status {
                // The intent recorded before the crash is carried out.
                Status::Stopping(t) => (t, agent.detail.clone()),
                // Declared dead by the other nodes: what it ran is lost.
                _ if lost => (
                    Terminal::Failed(FailReason::Lost),
                    Some(format!(
                        "node {supervisor} was lost (its heartbeat expired)"
                    )),
                ),
                _ => (
                    Terminal::Cancelled(CancelReason::RuntimeRestart),
                    Some(format!("supervisor {supervisor} is gone (runtime restart)")),
                ),
            };
            check_move(&agent, Status::Ended(outcome))?;
            write_end(tx, &agent, outcome, None, None, detail.as_deref(), now_ms)?;
            append_events_tx(tx, &agent.tenant, &[stop_event(&agent, outcome)], now_ms)?;
            out.push(must_agent(tx, &agent.tenant, &agent.name)?);
        }
    }
    Ok(out)
}
