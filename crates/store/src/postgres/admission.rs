//! The contract's `Admission` and `Runs` on PostgreSQL, as in `sqlite::store`:
//! every read-then-write runs in a transaction under its tenant's advisory
//! lock (`PgStore::write`), so it is exact across nodes.
//!
//! Admissions are group-committed, as on SQLite (`crate::group`): the
//! tenant's lock is held until the commit, and the commit waits for the WAL
//! flush (milliseconds on a real disk), so one transaction per admission
//! bounds a tenant to one flush per admission on every node together. A
//! node's requesters queue instead, and the one whose turn it is admits what
//! is queued for that tenant in one transaction, each admission in a
//! savepoint of its own: they share the lock's wait and one flush. A group
//! holds one tenant, so it never holds two tenants' locks (no deadlock
//! between two nodes' groups), and admissions in different tenants still run
//! at once on the pool's other connections.

use brood_core::{AgentName, Quotas, RunId, Status, TenantId, TenantQuotas, Terminal};

use super::PgStore;
use super::Tx;
use super::admit::admit_group_tx;
use super::db::LOCK_TENANT;
use super::rows::collect;
use super::txn::On;
use crate::contract::{Admission, Runs};
use crate::group::Group;
use crate::sqlite::sql::{I_TENANT_QUOTA, Q_TENANT_QUOTAS};
use crate::types::{Agent, EndItem, NewAgent, NewEvent, Result, RunEnd, StoreError};
use crate::{admission, runs};

// The cycle check: walk up from ?3 through the parents (the primary key at each
// step), stopping at ?2 when it is met and at the level guard ?4. Returns how many
// agents the walk met (0: ?3 does not exist), whether ?2 was among them, and the
// highest level reached (the guard: a parent chain that loops climbs to it).
// Rewritten from SQLite's: PostgreSQL has no MAX of a boolean (`bool_or`
// instead), and the level is BIGINT in both terms of the recursive CTE (they
// must agree), so `?4` is BIGINT and takes an i64.
pub(super) const Q_ANCESTOR_OR_SELF: &str = "WITH RECURSIVE up(name, parent, level) AS (\
     SELECT name, parent, CAST(0 AS BIGINT) FROM agents WHERE tenant = ?1 AND name = ?3 \
     UNION ALL \
     SELECT agents.name, agents.parent, up.level + 1 FROM up CROSS JOIN agents \
      WHERE agents.tenant = ?1 AND agents.name = up.parent \
       AND up.name <> ?2 AND up.level < ?4\
     ) \
     SELECT COUNT(*), COALESCE(bool_or(name = ?2), FALSE), \
      CAST(COALESCE(MAX(level), 0) AS BIGINT) FROM up";

// The deadline is the start plus the `timeout_s` of the effective policy recorded
// in the agent's spec at admission (NULL, no deadline, when it has none).
// Rewritten from SQLite's `json_extract`: the spec is read as `jsonb`, and only a
// JSON number counts (truncated to whole seconds, as SQLite's CAST does), so an
// odd value gives no deadline instead of failing the cast and the whole start.
pub(super) const U_RUN_STARTED: &str = "UPDATE runs SET pid = ?3, cgroup = ?4, started_ms = ?5, \
     deadline_ms = ?5 + 1000 * (SELECT CASE \
       WHEN jsonb_typeof(CAST(agents.spec AS jsonb) #> '{policy,timeout_s}') = 'number' \
       THEN CAST(trunc(CAST(CAST(agents.spec AS jsonb) #>> '{policy,timeout_s}' AS NUMERIC)) AS BIGINT) \
       END FROM agents WHERE agents.tenant = ?1 AND agents.name = runs.agent) \
     WHERE id = ?2 AND tenant = ?1";

impl Admission for PgStore {
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent> {
        self.admit_grouped(new, None, events)
    }

    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.admit_grouped(new, Some(quotas), events)
    }

    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas> {
        self.read(|db| {
            let rows = collect(db, Q_TENANT_QUOTAS, &[&tenant.as_str()], |r| {
                Ok((r.try_get::<_, String>(0)?, r.try_get::<_, i64>(1)?))
            })?;
            Ok(admission::tenant_quotas(tenant, rows)?)
        })
    }

    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        admission::check_quota_key(tenant, key, value)?;
        // One upsert, no read before it: no tenant lock needed.
        self.write_any(|db| {
            db.exec(I_TENANT_QUOTA, &[&tenant.as_str(), &key, &i64::from(value)])?;
            Ok(())
        })
    }

    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool> {
        self.read(|db| admission::is_ancestor_or_self(&On(db), tenant, candidate, agent))
    }
}

/// The most admissions one group commit takes: about what a burst of
/// requesters on one node queues behind one flush, few enough that the
/// tenant's lock is not held long for the other nodes.
pub(crate) const GROUP_MAX: usize = 64;

impl PgStore {
    fn admit_grouped(
        &self,
        new: &NewAgent,
        quotas: Option<&Quotas>,
        events: &[NewEvent],
    ) -> Result<Agent> {
        let lost = |message: String| StoreError::PostgresSetup {
            target: self.pool.target.clone(),
            message,
        };
        self.admissions
            .admit(new, quotas, events, |g| self.admit_group(g), &lost)
    }

    /// Runs a group (all of one tenant) in one transaction
    /// (`admit::admit_group_tx`): one answer per ticket, in order. The
    /// tenant's lock comes first: when another node's group holds it, the
    /// requesters that queue here meanwhile join this group once it has the
    /// lock, so the groups grow with the contention instead of queueing
    /// behind it. If the transaction fails (a write a check did not foresee,
    /// the commit) and it held more than one admission, each runs again
    /// alone, so that one admission's failure is its own. A connection lost
    /// under it runs it once more on a new one, as any write does
    /// (`Pool::with`).
    fn admit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>> {
        let ran = self.pool.with(|c| {
            c.tx(None, |db| {
                if let Some(first) = group.tickets().first() {
                    let key = first.new.tenant.as_str();
                    let free: bool = db.query_one(TRY_LOCK_TENANT, &[&key])?.try_get(0)?;
                    if !free {
                        db.exec(LOCK_TENANT, &[&key])?;
                        group.take_more();
                    }
                }
                admit_group_tx(db, group.tickets())
            })
        });
        let tickets = group.tickets();
        match ran {
            Ok(answers) => self.answered(answers),
            Err(e) if tickets.len() == 1 => vec![Err(e)],
            Err(_) => tickets
                .iter()
                .flat_map(|t| {
                    let alone = std::slice::from_ref(t);
                    match self
                        .pool
                        .with(|c| c.tx(None, |db| admit_group_tx(db, alone)))
                    {
                        Ok(answers) => self.answered(answers),
                        Err(e) => vec![Err(e)],
                    }
                })
                .collect(),
        }
    }

    /// A committed group's answers, announced to the other nodes when it
    /// admitted any.
    fn answered(&self, answers: Vec<Tx<Agent>>) -> Vec<Result<Agent>> {
        if answers.iter().any(|a| a.is_ok()) {
            self.wrote();
        }
        let target = &self.pool.target;
        answers
            .into_iter()
            .map(|a| a.map_err(|f| f.at(target)))
            .collect()
    }
}

/// The tenant's advisory transaction lock if no one holds it (`LOCK_TENANT`
/// waits for it).
const TRY_LOCK_TENANT: &str = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))";

impl Runs for PgStore {
    fn start_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        pid: i32,
        cgroup: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(tenant.as_str(), |db| {
            runs::start_run(&On(db), tenant, name, run, pid, cgroup, now_ms, events)
        })
    }

    fn set_status(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        to: Status,
        detail: Option<&str>,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(tenant.as_str(), |db| {
            runs::set_status(&On(db), tenant, name, to, detail, now_ms, events)
        })
    }

    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        self.write(tenant.as_str(), |db| {
            runs::mark_stopping(&On(db), tenant, names, outcome, now_ms)
        })
    }

    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(tenant.as_str(), |db| {
            runs::end_run(&On(db), tenant, name, run, end, events)
        })
    }

    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        self.write(tenant.as_str(), |db| runs::end_runs(&On(db), tenant, items))
    }

    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        // One update, no read before it: no tenant lock needed.
        self.write_any(|db| {
            runs::record_usage(&On(db), tenant, run, tokens_in, tokens_out, cost_usd)
        })
    }

    fn resume(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(tenant.as_str(), |db| {
            runs::resume(&On(db), tenant, name, run, supervisor, now_ms, None, events)
        })
    }

    fn resume_within(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        let q = Some(quotas);
        self.write(tenant.as_str(), |db| {
            runs::resume(&On(db), tenant, name, run, supervisor, now_ms, q, events)
        })
    }
}
