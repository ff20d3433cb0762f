//! PostgreSQL as a [`SqlStore`] (the contract's `Admission`, `Runs`,
//! `Transcripts`, `Records` and `Recovery`, written once in
//! `crate::sql_store`): every read-then-write runs in a transaction under
//! its tenant's advisory lock (`PgStore::write`), so it is exact across
//! nodes; and admission's group commit, with the statements this dialect
//! reads otherwise than SQLite (the walk up the parents, a run's deadline).
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

use brood_core::{Quotas, TenantId};

use super::admit::admit_group_tx;
use super::db::LOCK_TENANT;
use super::{Db, Fail, PgStore, Tx};
use crate::group::Group;
use crate::sql_store::SqlStore;
use crate::types::{Agent, NewAgent, NewEvent, Result, StoreError};

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

/// The most admissions one group commit takes: about what a burst of
/// requesters on one node queues behind one flush, few enough that the
/// tenant's lock is not held long for the other nodes.
pub(crate) const GROUP_MAX: usize = 64;

impl PgStore {
    fn admit_queued(
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

impl SqlStore for PgStore {
    type Err = Fail;
    type Db<'c> = Db<'c>;

    fn reading<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.read(f)
    }

    fn writing<T>(&self, tenant: &TenantId, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(tenant.as_str(), f)
    }

    fn writing_any<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write_any(f)
    }

    fn admit_grouped(
        &self,
        new: &NewAgent,
        quotas: Option<&Quotas>,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.admit_queued(new, quotas, events)
    }
}
