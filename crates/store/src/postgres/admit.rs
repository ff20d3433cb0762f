//! Admission on PostgreSQL (SPEC 9), a group at a time: the admissions a
//! node's requesters queued for one tenant (`crate::group`) are decided
//! together, in arrival order, each against the store and the ones admitted
//! before it in the group, and written together. A group costs the same few
//! statements and round trips whatever its size: the tenant's lock and three
//! set-based reads (the parents, their counts, which names exist) in one
//! round trip, then every row of every admitted agent in one more (one
//! `INSERT ... SELECT FROM unnest(...)` per table). Only a parent with a
//! `create_limit` or a child with a `cost_limit` costs its own reads.
//!
//! Exactness: the counts read under the tenant's lock, plus what the group
//! admitted before, are what the store would hold had each admission been
//! written on its own, so the quotas hold across nodes as before. Every
//! refusal comes before the writes, so a refused admission writes nothing;
//! a write that fails (which a check missed) fails the group's transaction,
//! and the caller runs each admission alone instead, so it fails alone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use brood_core::{AgentName, Code, Quotas, Status};
use tokio_postgres::types::ToSql;

use super::db::{LOCK_TENANT, Params};
use super::rows::{agent_from, collect};
use super::steps::{U_TENANT_SEQ, check_events, check_json_object};
use super::{Db, Tx, corrupt, not_found, refused};
use crate::group::Ticket;
use crate::sqlite::MAX_WALK_DEPTH;
use crate::types::{Agent, NewAgent, NewEvent};

// Planned at each execution, for this transaction only. A prepared
// statement's plan is otherwise made once and kept, and on a new database
// that happens while the tables are nearly empty: the plan then reads a
// parent's children through whichever index matches the tenant, and stays
// that way as the tables grow, until an ANALYZE invalidates it (measured:
// 170 admissions a second in a new database's first minute, against 2,100
// planned each time). A group plans its few statements once for all its
// admissions.
const CUSTOM_PLANS: &str = "SELECT set_config('plan_cache_mode', 'force_custom_plan', true)";

// The group's reads. The parents' rows; per distinct parent, its unfinished
// children and the agents of its tree; which of the names the group needs
// (new names, customers, agents its events name) exist.
const Q_PARENTS: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND name = ANY(?2)"
);
const Q_COUNTS: &str = concat!(
    "SELECT u.p, ",
    "(SELECT COUNT(*) FROM agents a WHERE a.tenant = ?1 AND a.parent = u.p AND ",
    unfinished!("a."),
    "), ",
    "(SELECT COUNT(*) FROM agents a WHERE a.tenant = ?1 AND a.root = ",
    "(SELECT b.root FROM agents b WHERE b.tenant = ?1 AND b.name = u.p)) ",
    "FROM unnest(CAST(?2 AS TEXT[])) AS u(p)"
);
const Q_EXISTING: &str = "SELECT name FROM agents WHERE tenant = ?1 AND name = ANY(?2)";

// The group's writes, one statement per table. `I_EVENTS` numbers each event
// back from the tenant's next number, which `U_TENANT_SEQ` has just advanced
// past all of the group's events in the same round trip.
const I_AGENTS: &str = "INSERT INTO agents (tenant, name, parent, customer, root, depth, session, \
     protocol, spec, status, detail, run, supervisor, created_ms, updated_ms) \
     SELECT ?1, u.name, u.parent, u.customer, u.root, u.depth, u.session, u.protocol, u.spec, ?2, \
      NULL, u.run, u.supervisor, u.created, u.created \
     FROM unnest(CAST(?3 AS TEXT[]), CAST(?4 AS TEXT[]), CAST(?5 AS TEXT[]), CAST(?6 AS TEXT[]), \
      CAST(?7 AS BIGINT[]), CAST(?8 AS TEXT[]), CAST(?9 AS TEXT[]), CAST(?10 AS TEXT[]), \
      CAST(?11 AS TEXT[]), CAST(?12 AS TEXT[]), CAST(?13 AS BIGINT[])) \
      AS u(name, parent, customer, root, depth, session, protocol, spec, run, supervisor, created)";
const I_RUNS: &str = "INSERT INTO runs (id, tenant, agent, seq, created_ms) \
     SELECT u.id, ?1, u.agent, 1, u.created \
     FROM unnest(CAST(?2 AS TEXT[]), CAST(?3 AS TEXT[]), CAST(?4 AS BIGINT[])) AS u(id, agent, created)";
const I_EDGES: &str = "INSERT INTO edges (tenant, parent, child, created_ms) \
     SELECT ?1, u.parent, u.child, u.created \
     FROM unnest(CAST(?2 AS TEXT[]), CAST(?3 AS TEXT[]), CAST(?4 AS BIGINT[])) AS u(parent, child, created)";
const I_CHANNELS: &str = "INSERT INTO channels \
     (tenant, parent, parent_session, child, child_session, handoff, result) \
     SELECT ?1, u.parent, u.psession, u.child, u.csession, u.handoff, NULL \
     FROM unnest(CAST(?2 AS TEXT[]), CAST(?3 AS TEXT[]), CAST(?4 AS TEXT[]), CAST(?5 AS TEXT[]), \
      CAST(?6 AS TEXT[])) AS u(parent, psession, child, csession, handoff)";
const I_EVENTS: &str = "INSERT INTO events (tenant, seq, ts_ms, agent, run, session, kind, payload) \
     SELECT ?1, t.next_seq - u.back, u.ts, u.agent, u.run, u.session, u.kind, u.payload \
     FROM tenants t, unnest(CAST(?2 AS BIGINT[]), CAST(?3 AS BIGINT[]), CAST(?4 AS TEXT[]), \
      CAST(?5 AS TEXT[]), CAST(?6 AS TEXT[]), CAST(?7 AS TEXT[]), CAST(?8 AS TEXT[])) \
      AS u(back, ts, agent, run, session, kind, payload) \
     WHERE t.id = ?1";

/// What the group's reads found, under the tenant's lock.
struct Facts {
    parents: HashMap<String, Agent>,
    /// Per parent: its unfinished children, and its tree's agents.
    counts: HashMap<String, (i64, i64)>,
    existing: HashSet<String>,
}

/// Admits `tickets` (all of one tenant, in arrival order) inside the
/// caller's transaction: one answer per ticket. The outer error is the
/// transaction's (a read or the writes failed): nothing of the group stands.
pub(crate) fn admit_group_tx(db: &Db<'_>, tickets: &[Arc<Ticket>]) -> Tx<Vec<Tx<Agent>>> {
    let Some(first) = tickets.first() else {
        return Ok(Vec::new());
    };
    let ts = first.new.tenant.as_str();
    // The checks that need no store first: a ticket failing them is answered
    // and takes no part in the rest.
    let mut answers: Vec<Option<Tx<Agent>>> = tickets
        .iter()
        .map(|t| {
            check_json_object(
                || format!("spec of agent {}", t.new.name),
                &t.new.spec,
                false,
            )
            .and_then(|()| check_events(&t.events))
            .err()
            .map(Err)
        })
        .collect();
    let facts = read_facts(db, ts, tickets, &answers)?;
    // The agents admitted so far, and which ticket each answers.
    let mut admitted: Vec<Agent> = Vec::new();
    let mut of_ticket: Vec<usize> = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        if answers[i].is_some() {
            continue;
        }
        match decide(db, &t.new, t.quotas.as_ref(), &t.events, &facts, &admitted) {
            Ok(a) => {
                admitted.push(a);
                of_ticket.push(i);
            }
            Err(e) => answers[i] = Some(Err(e)),
        }
    }
    let news: Vec<&Ticket> = of_ticket.iter().map(|i| &*tickets[*i]).collect();
    write(db, ts, &news, &facts, &admitted)?;
    for (i, a) in of_ticket.into_iter().zip(admitted) {
        answers[i] = Some(Ok(a));
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(corrupt("admission", "a ticket got no answer"))))
        .collect())
}

/// The tenant's lock and the three reads, in one round trip (the server runs
/// them in order, so the reads see what the lock protects).
fn read_facts(
    db: &Db<'_>,
    ts: &str,
    tickets: &[Arc<Ticket>],
    answered: &[Option<Tx<Agent>>],
) -> Tx<Facts> {
    let live = || {
        tickets
            .iter()
            .zip(answered)
            .filter(|(_, a)| a.is_none())
            .map(|(t, _)| t)
    };
    let mut parents: Vec<&str> = live()
        .filter_map(|t| t.new.parent.as_ref().map(AgentName::as_str))
        .collect();
    parents.sort_unstable();
    parents.dedup();
    let mut names: Vec<&str> = live()
        .flat_map(|t| {
            std::iter::once(t.new.name.as_str())
                .chain(t.new.customer.as_ref().map(AgentName::as_str))
                .chain(t.events.iter().map(|e| e.agent.as_str()))
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    let lock_p: [&(dyn ToSql + Sync); 1] = [&ts];
    let parents_p: [&(dyn ToSql + Sync); 2] = [&ts, &parents];
    let names_p: [&(dyn ToSql + Sync); 2] = [&ts, &names];
    let read = db.pipeline(&[
        (CUSTOM_PLANS, &[]),
        (LOCK_TENANT, &lock_p),
        (Q_PARENTS, &parents_p),
        (Q_COUNTS, &parents_p),
        (Q_EXISTING, &names_p),
    ])?;
    let mut facts = Facts {
        parents: HashMap::new(),
        counts: HashMap::new(),
        existing: HashSet::new(),
    };
    for r in &read[2] {
        let a = agent_from(r)?;
        facts.parents.insert(a.name.as_str().to_owned(), a);
    }
    for r in &read[3] {
        facts
            .counts
            .insert(r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?));
    }
    for r in &read[4] {
        facts.existing.insert(r.try_get(0)?);
    }
    Ok(facts)
}

/// One admission's verdict, on the facts read plus the agents admitted
/// before it in the group (`pending`), with the refusals in a fixed order so
/// a request wrong in several ways always gets the same answer: the parent,
/// the name, the customer, the quotas, `create_limit`, the budget, the
/// events' agents. The agent it would record, when admitted.
fn decide(
    db: &Db<'_>,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
    facts: &Facts,
    pending: &[Agent],
) -> Tx<Agent> {
    let t = &new.tenant;
    let exists =
        |n: &AgentName| facts.existing.contains(n.as_str()) || pending.iter().any(|a| &a.name == n);
    let parent = match &new.parent {
        None => None,
        Some(p) => {
            let found = facts
                .parents
                .get(p.as_str())
                .or_else(|| pending.iter().find(|a| &a.name == p));
            let Some(pa) = found else {
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
    if exists(&new.name) {
        return Err(refused(
            Code::NameTaken,
            format!("agent name {} is taken in tenant {t}", new.name),
        ));
    }
    if let Some(c) = &new.customer
        && !exists(c)
    {
        return Err(refused(
            Code::ParentMismatch,
            format!("customer {c} does not exist in tenant {t}"),
        ));
    }
    if let Some(q) = quotas {
        let (fanout, size) = match parent {
            None => (0, 0),
            Some(p) => {
                let (f, s) = facts.counts.get(p.name.as_str()).copied().unwrap_or((0, 0));
                let kids = pending
                    .iter()
                    .filter(|a| a.parent.as_ref() == Some(&p.name));
                let tree = pending.iter().filter(|a| a.root == p.root);
                (f + count(kids), s + count(tree))
            }
        };
        quota_verdict(new, parent, q, fanout, size)?;
        if let Some(p) = parent {
            let kids: Vec<&Agent> = pending
                .iter()
                .filter(|a| a.parent.as_ref() == Some(&p.name))
                .collect();
            check_create_limit(db, new, p, kids.len())?;
            let held = kids.iter().filter_map(|a| cost_limit_of(&a.spec)).sum();
            check_budget(db, new, p, held)?;
        }
    }
    // Events name the new agent or its parent (known to exist by now); any
    // other must exist too.
    for e in events {
        if e.agent != new.name && Some(&e.agent) != new.parent.as_ref() && !exists(&e.agent) {
            return Err(not_found(t, &e.agent));
        }
    }
    let (root, depth) = match parent {
        Some(p) => (p.root.clone(), p.depth + 1),
        None => (new.name.clone(), 0),
    };
    Ok(Agent {
        tenant: t.clone(),
        name: new.name.clone(),
        parent: new.parent.clone(),
        customer: new.customer.clone(),
        root,
        depth,
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

fn count<T>(it: impl Iterator<Item = T>) -> i64 {
    i64::try_from(it.count()).unwrap_or(i64::MAX)
}

/// Every admitted agent's rows (`admitted[k]` answers `tickets[k]`), one
/// statement per table, in one round trip: the tenant's row (made if new)
/// advanced past all their events first.
fn write(db: &Db<'_>, ts: &str, tickets: &[&Ticket], facts: &Facts, admitted: &[Agent]) -> Tx<()> {
    if admitted.is_empty() {
        return Ok(());
    }
    let news: Vec<&NewAgent> = tickets.iter().map(|t| &t.new).collect();
    let agents: Vec<&Agent> = admitted.iter().collect();
    let queued = Status::Queued.encode();
    let name: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
    let parent: Vec<Option<&str>> = agents
        .iter()
        .map(|a| a.parent.as_ref().map(AgentName::as_str))
        .collect();
    let customer: Vec<Option<&str>> = agents
        .iter()
        .map(|a| a.customer.as_ref().map(AgentName::as_str))
        .collect();
    let root: Vec<&str> = agents.iter().map(|a| a.root.as_str()).collect();
    let depth: Vec<i64> = agents.iter().map(|a| i64::from(a.depth)).collect();
    let session: Vec<&str> = agents.iter().map(|a| a.session.as_str()).collect();
    let protocol: Vec<&str> = agents.iter().map(|a| a.protocol.as_str()).collect();
    let spec: Vec<&str> = agents.iter().map(|a| a.spec.as_str()).collect();
    let run: Vec<&str> = agents.iter().map(|a| a.run.as_str()).collect();
    let supervisor: Vec<&str> = agents.iter().map(|a| a.supervisor.as_str()).collect();
    let created: Vec<i64> = agents.iter().map(|a| a.created_ms).collect();
    let agents_p: [&(dyn ToSql + Sync); 13] = [
        &ts,
        &queued,
        &name,
        &parent,
        &customer,
        &root,
        &depth,
        &session,
        &protocol,
        &spec,
        &run,
        &supervisor,
        &created,
    ];
    let runs_p: [&(dyn ToSql + Sync); 4] = [&ts, &run, &name, &created];
    // Edges and channels: the children among them, with their parents' sessions.
    let kids: Vec<(&Agent, &NewAgent)> = agents
        .iter()
        .zip(&news)
        .filter(|(a, _)| a.parent.is_some())
        .map(|(a, n)| (*a, *n))
        .collect();
    let k_parent: Vec<&str> = kids
        .iter()
        .map(|(a, _)| a.parent.as_ref().map_or("", AgentName::as_str))
        .collect();
    // Every child's parent was read (a parent admitted in the group is
    // queued, and its children refused).
    let k_psession: Vec<&str> = k_parent
        .iter()
        .map(|p| facts.parents.get(*p).map_or("", |pa| pa.session.as_str()))
        .collect();
    let k_child: Vec<&str> = kids.iter().map(|(a, _)| a.name.as_str()).collect();
    let k_csession: Vec<&str> = kids.iter().map(|(a, _)| a.session.as_str()).collect();
    let k_handoff: Vec<&str> = kids.iter().map(|(_, n)| n.handoff.as_str()).collect();
    let k_created: Vec<i64> = kids.iter().map(|(a, _)| a.created_ms).collect();
    let edges_p: [&(dyn ToSql + Sync); 4] = [&ts, &k_parent, &k_child, &k_created];
    let channels_p: [&(dyn ToSql + Sync); 6] = [
        &ts,
        &k_parent,
        &k_psession,
        &k_child,
        &k_csession,
        &k_handoff,
    ];
    // Events in the group's order, each numbered back from the advanced next number.
    let evs: Vec<&NewEvent> = tickets.iter().flat_map(|t| t.events.iter()).collect();
    let n = i64::try_from(evs.len()).unwrap_or(i64::MAX);
    let e_back: Vec<i64> = (1..=n).rev().collect();
    let e_ts: Vec<i64> = tickets
        .iter()
        .zip(admitted)
        .flat_map(|(t, a)| t.events.iter().map(|_| a.created_ms))
        .collect();
    let e_agent: Vec<&str> = evs.iter().map(|e| e.agent.as_str()).collect();
    let e_run: Vec<Option<&str>> = evs
        .iter()
        .map(|e| e.run.as_ref().map(|r| r.as_str()))
        .collect();
    let e_session: Vec<&str> = evs.iter().map(|e| e.session.as_str()).collect();
    let e_kind: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
    let e_payload: Vec<&str> = evs.iter().map(|e| e.payload.as_str()).collect();
    let events_p: [&(dyn ToSql + Sync); 8] = [
        &ts, &e_back, &e_ts, &e_agent, &e_run, &e_session, &e_kind, &e_payload,
    ];
    let now = created.first().copied().unwrap_or_default();
    let seq_p: [&(dyn ToSql + Sync); 3] = [&ts, &n, &now];
    let mut writes: Vec<(&str, Params<'_>)> = vec![
        (U_TENANT_SEQ, &seq_p),
        (I_AGENTS, &agents_p),
        (I_RUNS, &runs_p),
    ];
    if !kids.is_empty() {
        writes.push((I_EDGES, &edges_p));
        writes.push((I_CHANNELS, &channels_p));
    }
    if !evs.is_empty() {
        writes.push((I_EVENTS, &events_p));
    }
    db.pipeline(&writes)?;
    Ok(())
}

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
fn create_limit_of(spec: &str) -> Option<u64> {
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
///
/// `pending`: the parent's children admitted earlier in the same group, not
/// written yet (created in this run too).
fn check_create_limit(db: &Db<'_>, new: &NewAgent, p: &Agent, pending: usize) -> Tx<()> {
    let Some(limit) = create_limit_of(&p.spec) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let since: i64 = db
        .query_one(Q_RUN_CREATED, &[&p.run.as_str()])?
        .try_get(0)?;
    let used: i64 = db
        .query_one(Q_CREATED_SINCE, &[&t, &p.name.as_str(), &since])?
        .try_get::<_, i64>(0)?
        .saturating_add(i64::try_from(pending).unwrap_or(i64::MAX));
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
fn cost_limit_of(spec: &str) -> Option<f64> {
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
///
/// `pending`: what the parent's children admitted earlier in the same group,
/// not written yet, reserve (each its whole `cost_limit`: none has spent).
fn check_budget(db: &Db<'_>, new: &NewAgent, p: &Agent, pending: f64) -> Tx<()> {
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
    let mut held = pending;
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
