//! A run's life, written once for both stores (the `Runs` contract and
//! recovery's ends): start, status changes, the intent of a stop, a run's
//! end (alone or a stop's in post-order), usage, resume, and the end of
//! what a dead supervisor ran. Each body runs inside the store's
//! transaction ([`Db`]), which keeps what it reads true until the commit;
//! every status change goes through `Status::transition` (`checks`).

use brood_core::{
    AgentName, CancelReason, Code, FailReason, Quotas, RunId, Status, TenantId, Terminal,
};

use crate::admission::fanout;
use crate::changed::{Changed, only};
use crate::checks::refused;
use crate::checks::{check_current_run, check_move, encode_artifacts, stop_event, to_sql_count};
use crate::db::{Db, Known, Value};
use crate::types::{
    Agent, EndItem, NewEvent, Placing, Recovered, Resuming, RunEnd, StartItem, StoreError,
};

fn text(s: &str) -> Value<'_> {
    Value::from(s)
}

/// `Runs::start_run`: `queued` → `running`, the run gets its pid, cgroup
/// and deadline.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_run<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    pid: i32,
    cgroup: &str,
    now_ms: i64,
    events: &[NewEvent],
    supervisor: Option<&str>,
) -> Result<Agent, D::Err> {
    // A start is news to the event log's readers alone: a node waiting for
    // it to be ready hears through its inbox.
    only(Changed::EVENTS);
    let agent = start_writes(db, tenant, name, run, pid, cgroup, now_ms, supervisor)?;
    append_of(db, tenant, events, now_ms, &[name])?;
    Ok(agent)
}

/// [`start_run`]'s checks and writes, its events left to the caller; the
/// agent as written.
#[allow(clippy::too_many_arguments)]
fn start_writes<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    pid: i32,
    cgroup: &str,
    now_ms: i64,
    supervisor: Option<&str>,
) -> Result<Agent, D::Err> {
    let agent = db.must_agent(tenant, name)?;
    if let Some(s) = supervisor
        && agent.supervisor != s
    {
        return Err(refused(
            Code::Conflict,
            format!(
                "agent {name} is hosted by {}, not {s}: this start is refused (its queue was placed again while {s} was declared lost)",
                agent.supervisor
            ),
        )
        .into());
    }
    let to = check_move(&agent, Status::Running)?;
    check_current_run(&agent, run)?;
    let (t, n) = (text(tenant.as_str()), text(name.as_str()));
    db.exec(
        D::SQL.status,
        &[t, n, text(&to.encode()), Value::from(now_ms)],
    )?;
    db.exec(
        D::SQL.run_started,
        &[
            t,
            text(run.as_str()),
            Value::from(i64::from(pid)),
            text(cgroup),
            Value::from(now_ms),
        ],
    )?;
    Ok(as_written(agent, to, None, now_ms))
}

/// The agent as this transaction's status write left it: the row it read,
/// with the status (and `detail`, when the write set it) and time written,
/// so that no write is followed by a read of what it wrote.
fn as_written(mut agent: Agent, to: Status, detail: Option<Option<&str>>, now_ms: i64) -> Agent {
    agent.status = to;
    if let Some(d) = detail {
        agent.detail = d.map(str::to_owned);
    }
    agent.updated_ms = now_ms;
    agent
}

/// Appends `events`, all at `now_ms`; the agents in `read` were read by
/// this transaction, so events naming only them are not checked again.
fn append_of<D: Db>(
    db: &D,
    tenant: &TenantId,
    events: &[NewEvent],
    now_ms: i64,
    read: &[&AgentName],
) -> Result<(), D::Err> {
    let timed: Vec<(&NewEvent, i64)> = events.iter().map(|e| (e, now_ms)).collect();
    db.append_timed(tenant, &timed, known(&timed, read))?;
    Ok(())
}

/// Whether every event of `events` names an agent of `read`.
fn known(events: &[(&NewEvent, i64)], read: &[&AgentName]) -> Known {
    if events.iter().all(|(e, _)| read.contains(&&e.agent)) {
        Known::Read
    } else {
        Known::No
    }
}

/// `Runs::set_status`: any other legal move, with its detail.
pub(crate) fn set_status<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    to: Status,
    detail: Option<&str>,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<Agent, D::Err> {
    let agent = db.must_agent(tenant, name)?;
    let to = check_move(&agent, to)?;
    // Legal moves that need more than a status write have their own
    // methods; doing them here would leave the run record behind.
    let other = match (agent.status, to) {
        (_, Status::Ended(_)) => Some("end_run (the run's record must end too)"),
        (_, Status::Queued) => Some("resume (a new run is needed)"),
        (Status::Queued, Status::Running) => {
            Some("start_run (the run's pid and cgroup are needed)")
        }
        _ => None,
    };
    if let Some(method) = other {
        return Err(refused(
            Code::BadRequest,
            format!(
                "agent {name}: {} -> {} goes through {method}, not set_status",
                agent.status.encode(),
                to.encode()
            ),
        )
        .into());
    }
    db.exec(
        D::SQL.status_detail,
        &[
            text(tenant.as_str()),
            text(name.as_str()),
            text(&to.encode()),
            Value::Text(detail),
            Value::from(now_ms),
        ],
    )?;
    append_of(db, tenant, events, now_ms, &[name])?;
    Ok(as_written(agent, to, Some(detail), now_ms))
}

/// Ends the agent's current run with `outcome`: the agent's status and
/// detail, and the run's outcome, exit code, result and end time. The
/// caller has checked the move.
pub(crate) fn write_end<D: Db>(
    db: &D,
    agent: &Agent,
    outcome: Terminal,
    exit_code: Option<i32>,
    result: Option<&str>,
    detail: Option<&str>,
    now_ms: i64,
) -> Result<(), D::Err> {
    let t = text(agent.tenant.as_str());
    db.exec(
        D::SQL.status_detail,
        &[
            t,
            text(agent.name.as_str()),
            text(&Status::Ended(outcome).encode()),
            Value::Text(detail),
            Value::from(now_ms),
        ],
    )?;
    db.exec(
        D::SQL.run_ended,
        &[
            t,
            text(agent.run.as_str()),
            text(&outcome.encode()),
            Value::Int(exit_code.map(i64::from)),
            Value::Text(result),
            Value::from(now_ms),
        ],
    )?;
    Ok(())
}

/// `Runs::mark_stopping`: the status read here decides the write, so the
/// transaction must keep another end of the same run from falling between.
pub(crate) fn mark_stopping<D: Db>(
    db: &D,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Result<Vec<Agent>, D::Err> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let agent = db.must_agent(tenant, name)?;
        let written = match agent.status {
            Status::Running | Status::Blocked => {
                let to = check_move(&agent, Status::Stopping(outcome))?;
                db.exec(
                    D::SQL.status,
                    &[
                        text(tenant.as_str()),
                        text(name.as_str()),
                        text(&to.encode()),
                        Value::from(now_ms),
                    ],
                )?;
                as_written(agent, to, None, now_ms)
            }
            // No process yet, so nothing to stop: the run ends here.
            Status::Queued => {
                check_move(&agent, Status::Ended(outcome))?;
                let detail = agent.detail.as_deref();
                write_end(db, &agent, outcome, None, None, detail, now_ms)?;
                // `write_end` writes this status, whatever the move allowed.
                as_written(agent, Status::Ended(outcome), None, now_ms)
            }
            // Already stopping keeps the intent recorded first; finished stays.
            Status::Stopping(_) | Status::Ended(_) | Status::Closed(_) => agent,
        };
        out.push(written);
    }
    Ok(out)
}

/// `Runs::end_run`: the run's end, and its result on the parent's channel.
pub(crate) fn end_run<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Result<Agent, D::Err> {
    only(Changed::EVENTS | Changed::ENDS);
    let agent = end_writes(db, tenant, name, run, end)?;
    append_of(db, tenant, events, end.now_ms, &[name])?;
    Ok(agent)
}

/// [`end_run`]'s checks and writes, its events left to the caller; the
/// agent as written.
fn end_writes<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
) -> Result<Agent, D::Err> {
    let agent = db.must_agent(tenant, name)?;
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
        let artifacts = out.map(|o| encode_artifacts(&o.artifacts));
        db.exec(
            D::SQL.channel_result,
            &[
                text(tenant.as_str()),
                text(parent.as_str()),
                text(name.as_str()),
                Value::Text(end.result.as_deref()),
                Value::Text(out.map(|o| o.refs.as_str())),
                Value::Text(artifacts.as_deref()),
            ],
        )?;
    }
    let ended = Status::Ended(outcome);
    Ok(as_written(
        agent,
        ended,
        Some(end.detail.as_deref()),
        end.now_ms,
    ))
}

/// `Runs::end_runs`: a stop's ends in the order given (post-order); an item
/// without an end only appends its events. The events of them all are
/// appended once, after the ends, in the items' order: one numbering (one
/// hold of the tenant's sequence) for the lot.
pub(crate) fn end_runs<D: Db>(
    db: &D,
    tenant: &TenantId,
    items: &[EndItem],
) -> Result<Vec<Agent>, D::Err> {
    only(Changed::EVENTS | Changed::ENDS);
    let mut out = Vec::with_capacity(items.len());
    let mut events: Vec<(&NewEvent, i64)> = Vec::new();
    for it in items {
        out.push(match &it.end {
            Some(end) => end_writes(db, tenant, &it.name, &it.run, end)?,
            None => db.must_agent(tenant, &it.name)?,
        });
        events.extend(it.events.iter().map(|e| (e, it.now_ms)));
    }
    let read: Vec<&AgentName> = items.iter().map(|it| &it.name).collect();
    db.append_timed(tenant, &events, known(&events, &read))?;
    Ok(out)
}

/// `Runs::start_runs`: each start as `start_run`, in one transaction; a
/// refused one (checked before it writes) refuses only itself, a failed
/// statement fails them all. The events of the started are appended once,
/// after the starts, in the items' order.
pub(crate) fn start_runs<D: Db>(
    db: &D,
    tenant: &TenantId,
    items: &[StartItem],
) -> Result<Vec<Result<Agent, StoreError>>, D::Err> {
    only(Changed::EVENTS);
    let mut out = Vec::with_capacity(items.len());
    let mut events: Vec<(&NewEvent, i64)> = Vec::new();
    let mut read: Vec<&AgentName> = Vec::new();
    for it in items {
        // A malformed event refuses its start before any of it is written.
        let started = crate::checks::check_events(&it.events)
            .map_err(D::Err::from)
            .and_then(|()| {
                start_writes(
                    db,
                    tenant,
                    &it.name,
                    &it.run,
                    it.pid,
                    &it.cgroup,
                    it.now_ms,
                    it.supervisor.as_deref(),
                )
            });
        out.push(match started {
            Ok(a) => {
                events.extend(it.events.iter().map(|e| (e, it.now_ms)));
                read.push(&it.name);
                Ok(a)
            }
            Err(e) => Err(D::refusal(e)?),
        });
    }
    db.append_timed(tenant, &events, known(&events, &read))?;
    Ok(out)
}

/// [`start_run`] of one [`StartItem`], fenced by the supervisor it names.
pub(crate) fn start_item<D: Db>(
    db: &D,
    tenant: &TenantId,
    it: &StartItem,
) -> Result<Agent, D::Err> {
    start_run(
        db,
        tenant,
        &it.name,
        &it.run,
        it.pid,
        &it.cgroup,
        it.now_ms,
        &it.events,
        it.supervisor.as_deref(),
    )
}

/// `Runs::record_usage`: one update, no read before it.
pub(crate) fn record_usage<D: Db>(
    db: &D,
    tenant: &TenantId,
    run: &RunId,
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
) -> Result<(), D::Err> {
    let changed = db.exec(
        D::SQL.run_usage,
        &[
            text(tenant.as_str()),
            text(run.as_str()),
            Value::from(to_sql_count(tokens_in)),
            Value::from(to_sql_count(tokens_out)),
            Value::from(cost_usd),
        ],
    )?;
    if changed == 0 {
        return Err(refused(
            Code::NotFound,
            format!("run {run} does not exist in tenant {tenant}"),
        )
        .into());
    }
    Ok(())
}

/// `Runs::resume` (and `resume_within`, with `quotas`): the parent's status
/// and its fanout are read here and must still hold at the commit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resume<D: Db>(
    db: &D,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    supervisor: &str,
    now_ms: i64,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Result<Agent, D::Err> {
    let agent = db.must_agent(tenant, name)?;
    if !agent.status.is_finished() {
        return Err(refused(
            Code::Conflict,
            format!(
                "agent {name} is {}: only a finished (ended or closed) agent can be resumed",
                agent.status.encode()
            ),
        )
        .into());
    }
    // An owned child never outlives its parent: a child resumed under a parent
    // that is stopping or over would be missed by every cascade. A queued parent is
    // fine (a restart resumes parents and children together); its own end will
    // plan this child in.
    if let Some(p) = &agent.parent {
        let parent_status = db.agent(tenant, p)?.map(|pa| pa.status);
        if !matches!(
            parent_status,
            Some(Status::Queued | Status::Running | Status::Blocked)
        ) {
            let shown = parent_status.map_or_else(|| "missing".to_owned(), Status::encode);
            return Err(refused(
                Code::ParentMismatch,
                format!("agent {name} cannot be resumed: its parent {p} is {shown}"),
            )
            .into());
        }
        // The resumed agent is finished, so it is not among the counted.
        if let Some(q) = quotas {
            let fanout = fanout(db, tenant, p)?;
            if fanout >= i64::from(q.max_fanout) {
                return Err(refused(
                    Code::QuotaFanout,
                    format!(
                        "fanout quota: resuming {name} would give its parent {p} in tenant \
                         {tenant} {} unfinished children, and max_fanout is {}",
                        fanout + 1,
                        q.max_fanout
                    ),
                )
                .into());
            }
        }
    }
    let to = check_move(&agent, Status::Queued)?;
    let (t, n) = (text(tenant.as_str()), text(name.as_str()));
    let last = db.int(D::SQL.last_run_seq, &[t, n])?;
    db.exec(
        D::SQL.insert_run,
        &[
            text(run.as_str()),
            t,
            n,
            Value::from(last + 1),
            Value::from(now_ms),
        ],
    )?;
    db.exec(
        D::SQL.resumed,
        &[
            t,
            n,
            text(&to.encode()),
            text(run.as_str()),
            text(supervisor),
            Value::from(now_ms),
        ],
    )?;
    // The channel shows the current run: no result until this run ends (SPEC 4,
    // `result.md` only with a terminal status). The old result stays on its run.
    if let Some(p) = &agent.parent {
        let none = Value::Text(None);
        db.exec(
            D::SQL.channel_result,
            &[t, text(p.as_str()), n, none, none, none],
        )?;
    }
    db.append_events(tenant, events, now_ms)?;
    db.must_agent(tenant, name)
}

/// `Recovery::recover` (and `recover_lost`, with `lost`): every unfinished
/// agent of the `dead` supervisors ends. It spans tenants: where tenants
/// are locked (PostgreSQL), it locks each tenant it ends agents in before
/// it reads them for good, so an admission or a resume under one of them,
/// on any node, either sees the end or is seen by it.
pub(crate) fn recover<D: Db>(
    db: &D,
    dead: &[String],
    lost: bool,
    now_ms: i64,
) -> Result<Vec<Agent>, D::Err> {
    let found = read_locked(db, dead, &[])?;
    let mut out = Vec::with_capacity(found.len());
    for (supervisor, agent) in found {
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
        write_end(db, &agent, outcome, None, None, detail.as_deref(), now_ms)?;
        db.append_events(&agent.tenant, &[stop_event(&agent, outcome)], now_ms)?;
        out.push(db.must_agent(&agent.tenant, &agent.name)?);
    }
    Ok(out)
}

/// The unfinished agents of the `dead` supervisors, read once every tenant
/// they are in, and each of `also`, is locked (where tenants are locked:
/// PostgreSQL). A supervisor named twice is read once.
///
/// Read, lock the tenants not locked yet, read again, until a read finds no
/// new tenant: that read came after every lock it needs, so it is the one
/// acted on. Each batch is locked in name order, so two recoveries starting
/// together (two nodes) do not each hold a lock the other waits for; a
/// tenant found only by a later read (an agent moved onto a dead supervisor
/// meanwhile, which nothing does) may break that order, and PostgreSQL then
/// ends one of the two with a deadlock error, and the store runs it again
/// (`postgres::commit`). Locking a tenant this transaction holds already
/// does not wait.
fn read_locked<'d, D: Db>(
    db: &D,
    dead: &'d [String],
    also: &[&str],
) -> Result<Vec<(&'d str, Agent)>, D::Err> {
    // A supervisor named twice is recovered once: its agents are read up front
    // here, so a second pass would find them already ended and refuse the move.
    let mut supervisors: Vec<&str> = Vec::with_capacity(dead.len());
    for s in dead {
        if !supervisors.contains(&s.as_str()) {
            supervisors.push(s.as_str());
        }
    }
    let mut locked: Vec<String> = Vec::new();
    let mut also: Vec<&str> = also.to_vec();
    loop {
        let mut found: Vec<(&str, Agent)> = Vec::new();
        for &supervisor in &supervisors {
            for agent in db.agents(D::SQL.unfinished_of, &[text(supervisor)])? {
                found.push((supervisor, agent));
            }
        }
        if !D::LOCKS_TENANTS {
            return Ok(found);
        }
        let mut new: Vec<String> = found
            .iter()
            .map(|(_, a)| a.tenant.as_str())
            .chain(std::mem::take(&mut also))
            .filter(|t| !locked.iter().any(|l| l == t))
            .map(str::to_owned)
            .collect();
        if new.is_empty() {
            return Ok(found);
        }
        new.sort_unstable();
        new.dedup();
        for t in new {
            db.lock_tenant(&t)?;
            locked.push(t);
        }
    }
}

/// `Recovery::recover_resuming`: [`recover`], then, in the same
/// transaction, each of `resume` (parents before children) started again
/// as a new run on `supervisor`, as [`resume`] does. Only an agent this
/// recovery ended `cancelled (runtime_restart)` is resumed, and a child only
/// when its parent was resumed just before it: whatever else the list
/// names stays ended, so a list read before the transaction can never
/// resume what the recovery did not end, nor a child without its parent.
pub(crate) fn recover_resuming<D: Db>(
    db: &D,
    dead: &[String],
    resuming: &[Resuming],
    supervisor: &str,
    now_ms: i64,
) -> Result<Recovered, D::Err> {
    // A stop recorded before the crash is carried out, whatever it ends as.
    let mut stopping: Vec<(&TenantId, &AgentName)> = Vec::new();
    for r in resuming {
        if db
            .agent(&r.tenant, &r.name)?
            .is_some_and(|a| matches!(a.status, Status::Stopping(_)))
        {
            stopping.push((&r.tenant, &r.name));
        }
    }
    let mut agents = recover(db, dead, false, now_ms)?;
    let mut resumed: Vec<(TenantId, AgentName)> = Vec::new();
    for r in resuming {
        if stopping.contains(&(&r.tenant, &r.name)) {
            continue;
        }
        let Some(i) = agents
            .iter()
            .position(|a| a.tenant == r.tenant && a.name == r.name)
        else {
            continue;
        };
        let restarted =
            agents[i].status == Status::Ended(Terminal::Cancelled(CancelReason::RuntimeRestart));
        let parent_resumed = agents[i]
            .parent
            .as_ref()
            .is_none_or(|p| resumed.iter().any(|(t, n)| *t == r.tenant && n == p));
        if !restarted || !parent_resumed {
            continue;
        }
        agents[i] = resume(
            db, &r.tenant, &r.name, &r.run, supervisor, now_ms, None, &r.events,
        )?;
        resumed.push((r.tenant.clone(), r.name.clone()));
    }
    Ok(Recovered {
        agents,
        resumed,
        replaced: Vec::new(),
    })
}

/// `Recovery::recover_lost_placing` (issue 29 item 4): a lost node's queue
/// and its resumable agents placed on live nodes in the one transaction
/// that ends the rest lost. First each queued agent of `placing` still
/// queued on one of the `dead` hosts is placed again as it is (its run
/// unchanged, so the lost node's start of it stays refused: the record
/// names another host); then [`recover`] ends everything left of `dead`
/// lost; then each agent of `placing` this recovery ended `failed (lost)`
/// is started again as its new run, `placed_on(to)`, as [`resume`] does,
/// when its parent is resumed just before it or is itself unfinished (it
/// runs on a live node, or was placed again above). What the list names
/// otherwise (a stop recorded before the loss, a child whose parent ended)
/// stays as the recovery left it, so a plan read before the transaction
/// can never move what the recovery did not end nor orphan a child.
pub(crate) fn recover_lost_placing<D: Db>(
    db: &D,
    dead: &[String],
    placing: &[Placing],
    now_ms: i64,
) -> Result<Recovered, D::Err> {
    let mut replaced: Vec<(TenantId, AgentName)> = Vec::new();
    // Every tenant this transaction writes in is locked before its first
    // write, in name order: the queued agents placed again below are
    // written before `recover` would lock them, and a node's own recovery
    // holding a tenant's lock while it waited for one of those rows, as
    // this one waited for its lock, was a deadlock (issue 28's campaign: the
    // node restarted after SIGKILL exited at its start).
    let tenants: Vec<&str> = placing.iter().map(|p| p.agent.tenant.as_str()).collect();
    read_locked(db, dead, &tenants)?;
    // A stop recorded before the loss is carried out, whatever it ends as
    // (`failed (lost)` included).
    let mut stopping: Vec<(&TenantId, &AgentName)> = Vec::new();
    for p in placing {
        let r = &p.agent;
        let Some(a) = db.agent(&r.tenant, &r.name)? else {
            continue;
        };
        if matches!(a.status, Status::Stopping(_)) {
            stopping.push((&r.tenant, &r.name));
        }
        if a.status != Status::Queued || !dead.contains(&a.supervisor) {
            continue;
        }
        let from = crate::placed_for(&a.supervisor).unwrap_or(&a.supervisor);
        if crate::nodes::replace_queued(db, &r.tenant, &r.name, from, &p.to)? {
            replaced.push((r.tenant.clone(), r.name.clone()));
        }
    }
    let mut agents = recover(db, dead, true, now_ms)?;
    let lost = Status::Ended(Terminal::Failed(FailReason::Lost));
    let mut resumed: Vec<(TenantId, AgentName)> = Vec::new();
    for p in placing {
        let r = &p.agent;
        let Some(i) = agents
            .iter()
            .position(|a| a.tenant == r.tenant && a.name == r.name)
        else {
            continue;
        };
        if agents[i].status != lost || stopping.contains(&(&r.tenant, &r.name)) {
            continue;
        }
        let parent_lives = match &agents[i].parent {
            None => true,
            Some(parent) => {
                resumed.iter().any(|(t, n)| *t == r.tenant && n == parent)
                    || db.agent(&r.tenant, parent)?.is_some_and(|pa| {
                        matches!(
                            pa.status,
                            Status::Queued | Status::Running | Status::Blocked
                        )
                    })
            }
        };
        if !parent_lives {
            continue;
        }
        let host = crate::placed_on(&p.to);
        agents[i] = resume(
            db, &r.tenant, &r.name, &r.run, &host, now_ms, None, &r.events,
        )?;
        resumed.push((r.tenant.clone(), r.name.clone()));
    }
    Ok(Recovered {
        agents,
        resumed,
        replaced,
    })
}
