//! [`Sweeps`] once for every [`SqlStore`]: the shared lease, reads and
//! fenced writes (`crate::sweeps`), each fenced write in its tenant's
//! transaction, as every read-then-write on its agents is; the lease's
//! session lock is the store's own (PostgreSQL's, `SqlStore::lease_lock`).

use brood_core::{AgentName, TenantId, Terminal};

use super::SqlStore;
use crate::contract::Sweeps;
use crate::sweeps;
use crate::types::{Agent, Fence, LeaseLock, NewEvent, Result, RunEnd};

impl<S: SqlStore> Sweeps for S {
    fn lease_lock(&self, name: &str) -> Result<LeaseLock> {
        SqlStore::lease_lock(self, name)
    }

    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        SqlStore::break_lease_lock(self, name)
    }

    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        // No tenant's lock: a lease spans tenants, and the upsert is atomic.
        self.writing_any(|db| sweeps::acquire_lease(db, name, holder, now_ms))
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.reading(|db| sweeps::lease(db, name))
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.reading(|db| sweeps::overdue(db, now_ms, limit))
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.reading(|db| sweeps::orphans(db, limit))
    }

    fn sweep_stop(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Vec<Agent>> {
        self.writing(tenant, |db| {
            sweeps::stop(db, fence, tenant, names, outcome, now_ms, events)
        })
    }

    fn sweep_end(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        name: &AgentName,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.writing(tenant, |db| {
            sweeps::end(db, fence, tenant, name, end, events)
        })
    }
}
