//! The transactions, as in `sqlite::tx`: admission with its quotas,
//! `create_limit` and budget, the intent of a stop, a run's end, resume and
//! recovery. Each body runs inside the caller's transaction; the ones on one
//! tenant expect it to hold that tenant's advisory lock (`PgStore::write`),
//! which is what keeps a count read here true until the commit, on any node.
//! Recovery spans tenants and takes the locks it needs itself.

use brood_core::{AgentName, CancelReason, Code, Quotas, RunId, Status, TenantId, Terminal};

use super::rows::{agent_from, collect, encode_artifacts};
use tokio_postgres::types::ToSql;

use super::db::{LOCK_TENANT, Params};
use super::steps::{
    U_TENANT_SEQ, agent_exists, append_events_tx, check_current_run, check_events,
    check_json_object, check_move, load_agent, must_agent, stop_event, write_end,
};
use super::{Db, Tx, corrupt, not_found, refused};
use crate::sqlite::sql::{
    I_AGENT, I_CHANNEL, I_EDGE, I_RUN, Q_AGENT, Q_AGENT_EXISTS, Q_FANOUT, Q_LAST_RUN_SEQ,
    Q_UNFINISHED_OF, U_CHANNEL_RESULT, U_RESUMED, U_STATUS,
};
use crate::types::{Agent, NewAgent, NewEvent, RunEnd};

use crate::sqlite::MAX_WALK_DEPTH;

// The statements of `sqlite::sweeps` that the budget and `create_limit` checks
// use; that module is private to the SQLite store, so they are repeated here.
// `INDEXED BY` hints are left out (PostgreSQL plans for itself).

// The run's creation time, from which `create_limit` counts.
const Q_RUN_CREATED: &str = "SELECT created_ms FROM runs WHERE id = ?1";
const Q_CREATED_SINCE: &str =
    "SELECT COUNT(*) FROM agents WHERE tenant = ?1 AND parent = ?2 AND created_ms >= ?3";
// A parent's unfinished children with their specs (the budget check). The WHERE
// repeats the predicate of the partial index `agents_unfinished_by_parent`, so
// the planner can use it.
const Q_UNFINISHED_CHILDREN_SPECS: &str = "SELECT name, spec FROM agents \
     WHERE tenant = ?1 AND parent = ?2 AND (status = 'queued' OR status = 'running' \
     OR status = 'blocked' OR status LIKE 'stopping/%')";
// A subtree's spend: the walk of the descendants (edges' primary key, level
// guard), then every run of each agent met, plus the agent's own. Rewritten from
// SQLite's: the seed's name and level are typed (a recursive CTE's columns must
// have one type in both terms, and `?3` is compared with the level, so it is
// BIGINT and takes an i64), and the SUMs of BIGINT, NUMERIC on PostgreSQL, are
// cast back to BIGINT.
const Q_SUBTREE_USAGE: &str = "WITH RECURSIVE walk(name, level) AS (\
     SELECT CAST(?2 AS TEXT), CAST(0 AS BIGINT) \
     UNION \
     SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges \
      WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3\
     ), \
     plan(name) AS (SELECT DISTINCT name FROM walk) \
     SELECT CAST(COALESCE(SUM(runs.tokens_in), 0) AS BIGINT), \
      CAST(COALESCE(SUM(runs.tokens_out), 0) AS BIGINT), \
      CAST(COALESCE(SUM(runs.cost_usd), 0) AS DOUBLE PRECISION) \
     FROM plan CROSS JOIN runs WHERE runs.tenant = ?1 AND runs.agent = plan.name";

// An admission's event, numbered by the server: `?2` counts back from the
// tenant's next number, which the same round trip has just advanced past the
// admission's events (`U_TENANT_SEQ`), so the events get the numbers the
// advance reserved, in order, with no round trip to learn them. The casts
// type the parameters, which a SELECT list does not.
const I_EVENT_NUMBERED: &str = "INSERT INTO events (tenant, seq, ts_ms, agent, run, session, kind, payload) \
     SELECT id, next_seq - CAST(?2 AS BIGINT), CAST(?3 AS BIGINT), CAST(?4 AS TEXT), CAST(?5 AS TEXT), \
      CAST(?6 AS TEXT), CAST(?7 AS TEXT), CAST(?8 AS TEXT) FROM tenants WHERE id = ?1";

// ---- the transactions -----------------------------------------------------------

/// Admission, with the quota checks when `quotas` is given (`admit_with_quotas`)
/// and without them (`admit`): one body, so the two can never disagree on
/// anything but the quotas. Every refusal comes before the first write, so a
/// refused admission leaves the transaction clean (PostgreSQL aborts a
/// transaction at its first failed statement).
///
/// With `savepoint`, the admission is one of a group committed together
/// (`PgStore::admit_grouped`): it opens that savepoint in its first round
/// trip and releases it in its last, so a group costs no round trip more per
/// admission; the caller rolls back to it when this fails.
pub(crate) fn admit_tx(
    db: &Db<'_>,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
    savepoint: Option<&str>,
) -> Tx<Agent> {
    let t = &new.tenant;
    check_json_object(|| format!("spec of agent {}", new.name), &new.spec, false)?;
    check_events(events)?;
    // One round trip for the tenant's lock and every read the admission
    // decides on: the server runs them in order, so the reads see what the
    // lock protects (docs/decisions.md "The PostgreSQL store").
    let ts = t.as_str();
    let name = new.name.as_str();
    let pname = new.parent.as_ref().map_or("", AgentName::as_str);
    let cname = new.customer.as_ref().map_or("", AgentName::as_str);
    let lock_p: [&(dyn ToSql + Sync); 1] = [&ts];
    let parent_p: [&(dyn ToSql + Sync); 2] = [&ts, &pname];
    let name_p: [&(dyn ToSql + Sync); 2] = [&ts, &name];
    let customer_p: [&(dyn ToSql + Sync); 2] = [&ts, &cname];
    let open = savepoint.map(|s| format!("SAVEPOINT {s}"));
    let mut reads: Vec<(&str, Params<'_>)> = Vec::with_capacity(7);
    if let Some(sql) = &open {
        reads.push((sql, &[]));
    }
    reads.extend([
        (LOCK_TENANT, &lock_p as Params<'_>),
        (Q_AGENT, &parent_p),
        (Q_AGENT_EXISTS, &name_p),
        (Q_AGENT_EXISTS, &customer_p),
        (Q_FANOUT, &parent_p),
        (Q_TREE_SIZE_UNDER, &parent_p),
    ]);
    let mut read = db.pipeline(&reads)?;
    if open.is_some() {
        read.remove(0);
    }
    let first_bool = |i: usize| -> Tx<bool> {
        match read[i].first() {
            Some(r) => Ok(r.try_get(0)?),
            None => Ok(false),
        }
    };
    let first_count = |i: usize| -> Tx<i64> {
        match read[i].first() {
            Some(r) => Ok(r.try_get(0)?),
            None => Ok(0),
        }
    };
    // The refusals in a fixed order, so a request wrong in several ways always
    // gets the same answer: the parent, then the name, then the customer.
    let parent = match &new.parent {
        None => None,
        Some(p) => {
            let Some(pa) = read[1].first().map(agent_from).transpose()? else {
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
    if first_bool(2)? {
        return Err(refused(
            Code::NameTaken,
            format!("agent name {} is taken in tenant {t}", new.name),
        ));
    }
    if let Some(c) = &new.customer
        && !first_bool(3)?
    {
        return Err(refused(
            Code::ParentMismatch,
            format!("customer {c} does not exist in tenant {t}"),
        ));
    }
    if let Some(q) = quotas {
        quota_verdict(new, parent.as_ref(), q, first_count(4)?, first_count(5)?)?;
        if let Some(p) = &parent {
            check_create_limit(db, new, p)?;
            check_budget(db, new, p)?;
        }
    }
    // Events name the new agent or its parent (known to exist by now); any
    // other must exist too.
    for e in events {
        if e.agent != new.name
            && Some(&e.agent) != new.parent.as_ref()
            && !agent_exists(db, t, &e.agent)?
        {
            return Err(not_found(t, &e.agent));
        }
    }

    // The writes, in one round trip: the tenant's row (made if new) advanced
    // by the events' numbers, then every insert, each event numbered by the
    // server from that row (`I_EVENT_NUMBERED`), so no round trip waits for
    // the number.
    let n = i64::try_from(events.len()).unwrap_or(i64::MAX);
    let (root, depth) = match &parent {
        Some(p) => (p.root.clone(), i64::from(p.depth) + 1),
        None => (new.name.clone(), 0),
    };
    let parent_name = new.parent.as_ref().map(AgentName::as_str);
    let customer_name = new.customer.as_ref().map(AgentName::as_str);
    let root_name = root.as_str();
    let session = new.session.as_str();
    let protocol = new.protocol.as_str();
    let queued = Status::Queued.encode();
    let run = new.run.as_str();
    let one = 1_i64;
    let agent_p: [&(dyn ToSql + Sync); 13] = [
        &ts,
        &name,
        &parent_name,
        &customer_name,
        &root_name,
        &depth,
        &session,
        &protocol,
        &new.spec,
        &queued,
        &run,
        &new.supervisor,
        &new.now_ms,
    ];
    let run_p: [&(dyn ToSql + Sync); 5] = [&run, &ts, &name, &one, &new.now_ms];
    let (p_name, p_session) = parent
        .as_ref()
        .map_or(("", ""), |p| (p.name.as_str(), p.session.as_str()));
    let edge_p: [&(dyn ToSql + Sync); 4] = [&ts, &p_name, &name, &new.now_ms];
    let channel_p: [&(dyn ToSql + Sync); 6] =
        [&ts, &p_name, &p_session, &name, &session, &new.handoff];
    let rows: Vec<EventRow<'_>> = events
        .iter()
        .zip((1..=n).rev())
        .map(|(e, back)| {
            (
                back,
                e.run.as_ref().map(RunId::as_str),
                e.agent.as_str(),
                e.session.as_str(),
                e.kind.as_str(),
                e.payload.as_str(),
            )
        })
        .collect();
    let event_ps: Vec<[&(dyn ToSql + Sync); 8]> = rows
        .iter()
        .map(|(k, run, agent, session, kind, payload)| {
            [
                &ts as &(dyn ToSql + Sync),
                k,
                &new.now_ms,
                agent,
                run,
                session,
                kind,
                payload,
            ]
        })
        .collect();
    let seq_p: [&(dyn ToSql + Sync); 3] = [&ts, &n, &new.now_ms];
    let mut writes: Vec<(&str, Params<'_>)> =
        vec![(U_TENANT_SEQ, &seq_p), (I_AGENT, &agent_p), (I_RUN, &run_p)];
    if parent.is_some() {
        writes.push((I_EDGE, &edge_p));
        writes.push((I_CHANNEL, &channel_p));
    }
    for p in &event_ps {
        writes.push((I_EVENT_NUMBERED, p));
    }
    let release = savepoint.map(|s| format!("RELEASE {s}"));
    if let Some(sql) = &release {
        writes.push((sql, &[]));
    }
    db.pipeline(&writes)?;
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

/// An admission's event's columns but the tenant and the time: how far back
/// from the tenant's next number its number is, run, agent, session, kind,
/// payload.
type EventRow<'a> = (i64, Option<&'a str>, &'a str, &'a str, &'a str, &'a str);

/// The size of the tree a new child of `$2` joins (its parent's root's).
const Q_TREE_SIZE_UNDER: &str = "SELECT COUNT(*) FROM agents WHERE tenant = $1 \
     AND root = (SELECT root FROM agents WHERE tenant = $1 AND name = $2)";

/// The quota checks of SPEC 9 on counts already read (`fanout`: the parent's
/// unfinished children; `size`: its tree's agents), in the documented order.
fn quota_verdict(
    new: &NewAgent,
    parent: Option<&Agent>,
    q: &Quotas,
    fanout: i64,
    size: i64,
) -> Tx<()> {
    let t = &new.tenant;
    let name = &new.name;
    let Some(p) = parent else {
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
    Ok(())
}

/// The `policy.create_limit` recorded in a spec, if any.
pub(crate) fn create_limit_of(spec: &str) -> Option<u64> {
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
pub(crate) fn check_create_limit(db: &Db<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let Some(limit) = create_limit_of(&p.spec) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let since: i64 = db
        .query_one(Q_RUN_CREATED, &[&p.run.as_str()])?
        .try_get(0)?;
    let used: i64 = db
        .query_one(Q_CREATED_SINCE, &[&t, &p.name.as_str(), &since])?
        .try_get(0)?;
    // A count is never negative; were it, it would be below any limit.
    if u64::try_from(used).is_ok_and(|u| u >= limit) {
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
pub(crate) fn cost_limit_of(spec: &str) -> Option<f64> {
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
pub(crate) fn check_budget(db: &Db<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let (Some(want), Some(limit)) = (cost_limit_of(&new.spec), cost_limit_of(&p.spec)) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let subtree_cost = |name: &str| -> Tx<f64> {
        Ok(db
            .query_one(Q_SUBTREE_USAGE, &[&t, &name, &MAX_WALK_DEPTH])?
            .try_get(2)?)
    };
    let spent = subtree_cost(p.name.as_str())?;
    let kids = collect(
        db,
        Q_UNFINISHED_CHILDREN_SPECS,
        &[&t, &p.name.as_str()],
        |r| Ok((r.try_get::<_, String>(0)?, r.try_get::<_, String>(1)?)),
    )?;
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
