//! Admission on PostgreSQL (SPEC 9), a group at a time: the admissions a
//! node's requesters queued for one tenant (`crate::group`) are decided
//! together, in arrival order, each against the store and the ones admitted
//! before it in the group, and written together. A group costs the same few
//! statements and round trips whatever its size: the tenant's lock and three
//! set-based reads (the parents, their counts, which names exist) in one
//! round trip, then every row of every admitted agent in one more (one
//! `INSERT ... SELECT FROM unnest(...)` per table). Only a parent with a
//! `create_limit` or a child with a `cost_limit` costs its own reads. The
//! decisions are the shared ones (`crate::admission::decide`), made on
//! what was read ([`GroupFacts`]); what is here is how the group reads and
//! writes.
//!
//! Exactness: the counts read under the tenant's lock, plus what the group
//! admitted before, are what the store would hold had each admission been
//! written on its own, so the quotas hold across nodes as before. Every
//! refusal comes before the writes, so a refused admission writes nothing;
//! a write that fails (which a check missed) fails the group's transaction,
//! and the caller runs each admission alone instead, so it fails alone.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use brood_core::{AgentName, Status, TenantId};
use tokio_postgres::types::ToSql;

use super::db::{LOCK_TENANT, Params};
use super::steps::{I_EVENTS, U_TENANT_SEQ};
use super::{Db, Fail, Tx, corrupt};
use crate::admission::{AdmitFacts, cost_limit_of, created_in_run, decide, held, subtree_cost};
use crate::db::agent_at;
use crate::group::Ticket;
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

// The group's writes, one statement per table (the events' is `steps::I_EVENTS`).
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
/// What the group's reads found, under the tenant's lock.
struct Facts {
    parents: HashMap<String, Agent>,
    /// Per parent: its unfinished children, and its tree's agents.
    counts: HashMap<String, (i64, i64)>,
    existing: HashSet<String>,
}

/// What the group's reads found plus what the group admitted before, as
/// one admission's facts (`crate::admission::decide`): the counts the store
/// would hold had each admission before this one been written alone. Only
/// `create_limit` and the budget read more, on the transaction.
struct GroupFacts<'a, 'd> {
    db: &'a Db<'d>,
    read: &'a Facts,
    pending: &'a [Agent],
}

impl GroupFacts<'_, '_> {
    fn pending_children<'p>(&'p self, p: &'p Agent) -> impl Iterator<Item = &'p Agent> + 'p {
        self.pending
            .iter()
            .filter(move |a| a.parent.as_ref() == Some(&p.name))
    }
}

impl AdmitFacts for GroupFacts<'_, '_> {
    type Err = Fail;

    fn agent(&self, _: &TenantId, name: &AgentName) -> Tx<Option<Cow<'_, Agent>>> {
        Ok(self
            .read
            .parents
            .get(name.as_str())
            .or_else(|| self.pending.iter().find(|a| &a.name == name))
            .map(Cow::Borrowed))
    }

    fn exists(&self, _: &TenantId, name: &AgentName) -> Tx<bool> {
        Ok(self.read.existing.contains(name.as_str())
            || self.pending.iter().any(|a| &a.name == name))
    }

    fn fanout(&self, p: &Agent) -> Tx<i64> {
        let read = self.read.counts.get(p.name.as_str()).map_or(0, |c| c.0);
        Ok(read + count(self.pending_children(p)))
    }

    fn tree_size(&self, p: &Agent) -> Tx<i64> {
        let read = self.read.counts.get(p.name.as_str()).map_or(0, |c| c.1);
        Ok(read + count(self.pending.iter().filter(|a| a.root == p.root)))
    }

    fn created_in_run(&self, p: &Agent) -> Tx<i64> {
        // The children admitted earlier in the group were created in this run too.
        Ok(created_in_run(self.db, p)?.saturating_add(count(self.pending_children(p))))
    }

    fn held(&self, p: &Agent) -> Tx<f64> {
        // A child admitted earlier in the group has spent nothing: it holds
        // its whole `cost_limit`.
        let pending: f64 = self
            .pending_children(p)
            .filter_map(|a| cost_limit_of(&a.spec))
            .sum();
        Ok(held(self.db, p)? + pending)
    }

    fn subtree_cost(&self, tenant: &TenantId, name: &AgentName) -> Tx<f64> {
        subtree_cost(self.db, tenant, name.as_str())
    }
}

/// Admits `tickets` (all of one tenant, in arrival order) inside the
/// caller's transaction: one answer per ticket. The outer error is the
/// transaction's (a read or the writes failed): nothing of the group stands.
pub(crate) fn admit_group_tx(db: &Db<'_>, tickets: &[Arc<Ticket>]) -> Tx<Vec<Tx<Agent>>> {
    let Some(first) = tickets.first() else {
        return Ok(Vec::new());
    };
    let ts = first.new.tenant.as_str();
    let facts = read_facts(db, ts, tickets)?;
    let mut answers: Vec<Option<Tx<Agent>>> = Vec::with_capacity(tickets.len());
    // The agents admitted so far, and which ticket each answers.
    let mut admitted: Vec<Agent> = Vec::new();
    let mut of_ticket: Vec<usize> = Vec::new();
    for (i, t) in tickets.iter().enumerate() {
        let group = GroupFacts {
            db,
            read: &facts,
            pending: &admitted,
        };
        match decide(&group, &t.new, t.quotas.as_ref(), &t.events).map(|d| d.agent) {
            Ok(a) => {
                admitted.push(a);
                of_ticket.push(i);
                answers.push(None);
            }
            Err(e) => answers.push(Some(Err(e))),
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
fn read_facts(db: &Db<'_>, ts: &str, tickets: &[Arc<Ticket>]) -> Tx<Facts> {
    let mut parents: Vec<&str> = tickets
        .iter()
        .filter_map(|t| t.new.parent.as_ref().map(AgentName::as_str))
        .collect();
    parents.sort_unstable();
    parents.dedup();
    let mut names: Vec<&str> = tickets
        .iter()
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
        let a = agent_at(r, 0)?;
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
    if !evs.is_empty() {
        crate::bell::note_appended();
    }
    Ok(())
}
