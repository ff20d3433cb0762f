//! Admission's group commit on PostgreSQL (`SqlStore::commit_group`).
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

use super::admit::admit_group_tx;
use super::db::LOCK_TENANT;
use super::{PgStore, Tx};
use crate::group::Group;
use crate::types::{Agent, Result, StoreError};

/// The most admissions one group commit takes: about what a burst of
/// requesters on one node queues behind one flush, few enough that the
/// tenant's lock is not held long for the other nodes.
pub(crate) const GROUP_MAX: usize = 64;

impl PgStore {
    /// The error of an admission whose group was lost.
    pub(super) fn admission_lost(&self, message: String) -> StoreError {
        StoreError::PostgresSetup {
            target: self.pool.target.clone(),
            message,
        }
    }

    /// Runs a group (all of one tenant) in one transaction
    /// (`admit::admit_group_tx`): one answer per ticket, in order. The
    /// tenant's lock comes first: when another node's group holds it, the
    /// requesters that queue here meanwhile join this group once it has the
    /// lock, so the groups grow with the contention instead of queueing
    /// behind it. If the transaction fails (a write a check did not foresee,
    /// the commit) and it held more than one admission, each runs again
    /// alone, so that one admission's failure is its own; unless the group
    /// is in doubt (its COMMIT unanswered, its fate unknown), which every
    /// admission of it is told. A lost connection or a lost COMMIT is
    /// handled as for any write (`Pool::transact`).
    pub(super) fn commit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>> {
        let ran = self.pool.transact(None, |db| {
            if let Some(first) = group.tickets().first() {
                let key = first.new.tenant.as_str();
                let free: bool = db.query_one(TRY_LOCK_TENANT, &[&key])?.try_get(0)?;
                if !free {
                    db.exec(LOCK_TENANT, &[&key])?;
                    group.take_more();
                }
            }
            admit_group_tx(db, group.tickets())
        });
        let tickets = group.tickets();
        match ran {
            Ok(answers) => self.answered(answers),
            Err(e) if tickets.len() == 1 => vec![Err(e)],
            // The group may have been admitted: run alone, each admission
            // would be a second one.
            Err(StoreError::PostgresInDoubt { target, message }) => tickets
                .iter()
                .map(|_| {
                    Err(StoreError::PostgresInDoubt {
                        target: target.clone(),
                        message: message.clone(),
                    })
                })
                .collect(),
            Err(_) => tickets
                .iter()
                .flat_map(|t| {
                    let alone = std::slice::from_ref(t);
                    match self.pool.transact(None, |db| admit_group_tx(db, alone)) {
                        Ok(answers) => self.answered(answers),
                        Err(e) => vec![Err(e)],
                    }
                })
                .collect(),
        }
    }

    /// A committed group's answers, announced to the other nodes when it
    /// admitted any: as events, and as agents placed when one is another
    /// node's to start.
    fn answered(&self, answers: Vec<Tx<Agent>>) -> Vec<Result<Agent>> {
        let admitted = answers.iter().filter(|a| a.is_ok()).count();
        if admitted > 0 {
            let me = self.announcing_as();
            let elsewhere = answers
                .iter()
                .flatten()
                .any(|a| me.is_none_or(|me| a.supervisor != me));
            let what = if elsewhere {
                crate::Changed::EVENTS | crate::Changed::PLACED
            } else {
                crate::Changed::EVENTS
            };
            self.wrote(what);
            self.young.admitted(admitted as u64, &self.pool);
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
