//! The transactions, as in `sqlite::tx`: admission with its quotas,
//! `create_limit` and budget, the intent of a stop, a run's end, resume and
//! recovery. Each body runs inside the caller's transaction; the ones on one
//! tenant expect it to hold that tenant's advisory lock (`PgStore::write`),
//! which is what keeps a count read here true until the commit, on any node.
//! Recovery spans tenants and takes the locks it needs itself.

use brood_core::{AgentName, CancelReason, Code, Quotas, RunId, Status, TenantId, Terminal};

use super::rows::{agent_from, collect, encode_artifacts};

use super::db::LOCK_TENANT;
use super::steps::{
    append_events_tx, check_current_run, check_move, load_agent, must_agent, stop_event, write_end,
};
use super::{Db, Tx, refused};
use crate::sqlite::sql::{
    I_RUN, Q_FANOUT, Q_LAST_RUN_SEQ, Q_UNFINISHED_OF, U_CHANNEL_RESULT, U_RESUMED, U_STATUS,
};
use crate::types::{Agent, NewEvent, RunEnd};

// ---- the transactions -----------------------------------------------------------

/// `Runs::mark_stopping` inside the caller's transaction, which must hold the
/// tenant's advisory lock (`PgStore::write`): the status read here decides the
/// write, and another node's end of the same run must not fall in between.
pub(crate) fn mark_stopping_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let agent = must_agent(db, tenant, name)?;
        match agent.status {
            Status::Running | Status::Blocked => {
                let to = check_move(&agent, Status::Stopping(outcome))?;
                db.exec(
                    U_STATUS,
                    &[&tenant.as_str(), &name.as_str(), &to.encode(), &now_ms],
                )?;
            }
            // No process yet, so nothing to stop: the run ends here.
            Status::Queued => {
                check_move(&agent, Status::Ended(outcome))?;
                write_end(
                    db,
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
        out.push(must_agent(db, tenant, name)?);
    }
    Ok(out)
}

/// `Runs::end_run` inside the caller's transaction, which must hold the
/// tenant's advisory lock (`PgStore::write`), as for [`mark_stopping_tx`].
pub(crate) fn end_run_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(db, tenant, name)?;
    // The outcome recorded with the stop intent stands, whatever the process did.
    let outcome = match agent.status {
        Status::Stopping(t) => t,
        _ => end.outcome,
    };
    check_move(&agent, Status::Ended(outcome))?;
    check_current_run(&agent, run)?;
    write_end(
        db,
        &agent,
        outcome,
        end.exit_code,
        end.result.as_deref(),
        end.detail.as_deref(),
        end.now_ms,
    )?;
    if let Some(parent) = &agent.parent {
        let out = end.output.as_ref();
        db.exec(
            U_CHANNEL_RESULT,
            &[
                &tenant.as_str(),
                &parent.as_str(),
                &name.as_str(),
                &end.result.as_deref(),
                &out.map(|o| o.refs.as_str()),
                &out.map(|o| encode_artifacts(&o.artifacts)),
            ],
        )?;
    }
    append_events_tx(db, tenant, events, end.now_ms)?;
    must_agent(db, tenant, name)
}

/// `Runs::resume` (and `resume_within`, with `quotas`) inside the caller's
/// transaction, which must hold the tenant's advisory lock (`PgStore::write`):
/// the parent's status and its fanout are read here and must still hold at the
/// commit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resume_tx(
    db: &Db<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    supervisor: &str,
    now_ms: i64,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(db, tenant, name)?;
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
        let parent_status = load_agent(db, tenant, p)?.map(|pa| pa.status);
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
            let fanout: i64 = db
                .query_one(Q_FANOUT, &[&tenant.as_str(), &p.as_str()])?
                .try_get(0)?;
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
    let last: i64 = db
        .query_one(Q_LAST_RUN_SEQ, &[&tenant.as_str(), &name.as_str()])?
        .try_get(0)?;
    db.exec(
        I_RUN,
        &[
            &run.as_str(),
            &tenant.as_str(),
            &name.as_str(),
            &(last + 1),
            &now_ms,
        ],
    )?;
    db.exec(
        U_RESUMED,
        &[
            &tenant.as_str(),
            &name.as_str(),
            &to.encode(),
            &run.as_str(),
            &supervisor,
            &now_ms,
        ],
    )?;
    // The channel shows the current run: no result until this run ends (SPEC 4,
    // `result.md` only with a terminal status). The old result stays on its run.
    if let Some(p) = &agent.parent {
        db.exec(
            U_CHANNEL_RESULT,
            &[
                &tenant.as_str(),
                &p.as_str(),
                &name.as_str(),
                &None::<&str>,
                &None::<&str>,
                &None::<&str>,
            ],
        )?;
    }
    append_events_tx(db, tenant, events, now_ms)?;
    must_agent(db, tenant, name)
}

/// `Recovery::recover` inside the caller's transaction (`PgStore::write_any`:
/// it spans tenants, so it holds none of their locks when it starts). It takes
/// the advisory lock of every tenant it ends agents in before it reads them for
/// good, so an admission or a resume under one of those agents, on any node,
/// either sees the end or is seen by it.
pub(crate) fn recover_tx(db: &Db<'_>, dead: &[String], lost: bool, now_ms: i64) -> Tx<Vec<Agent>> {
    // A supervisor named twice is recovered once: its agents are read up front
    // here, so a second pass would find them already ended and refuse the move.
    let mut supervisors: Vec<&str> = Vec::with_capacity(dead.len());
    for s in dead {
        if !supervisors.contains(&s.as_str()) {
            supervisors.push(s.as_str());
        }
    }
    // Read, lock the tenants not locked yet, read again, until a read finds no
    // new tenant: that read came after every lock it needs, so it is the one
    // acted on. Each batch is locked in name order, so two recoveries starting
    // together (two nodes) do not each hold a lock the other waits for; a
    // tenant found only by a later read (an agent moved onto a dead supervisor
    // meanwhile, which nothing does) may break that order, and PostgreSQL then
    // ends one of the two with a deadlock error, which its caller retries.
    let mut locked: Vec<String> = Vec::new();
    let found = loop {
        let mut found: Vec<(&str, Agent)> = Vec::new();
        for &supervisor in &supervisors {
            for agent in collect(db, Q_UNFINISHED_OF, &[&supervisor], agent_from)? {
                found.push((supervisor, agent));
            }
        }
        let mut new: Vec<String> = found
            .iter()
            .map(|(_, a)| a.tenant.as_str())
            .filter(|t| !locked.iter().any(|l| l == t))
            .map(str::to_owned)
            .collect();
        if new.is_empty() {
            break found;
        }
        new.sort_unstable();
        new.dedup();
        for t in new {
            db.exec(LOCK_TENANT, &[&t.as_str()])?;
            locked.push(t);
        }
    };
    let mut out = Vec::with_capacity(found.len());
    for (supervisor, agent) in found {
        let (outcome, detail) = match agent.status {
            // The intent recorded before the crash is carried out.
            Status::Stopping(t) => (t, agent.detail.clone()),
            // Declared dead by the other nodes: what it ran is lost.
            _ if lost => (
                Terminal::Failed(brood_core::FailReason::Lost),
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
        write_end(db, &agent, outcome, None, None, detail.as_deref(), now_ms)?;
        append_events_tx(db, &agent.tenant, &[stop_event(&agent, outcome)], now_ms)?;
        out.push(must_agent(db, &agent.tenant, &agent.name)?);
    }
    Ok(out)
}
