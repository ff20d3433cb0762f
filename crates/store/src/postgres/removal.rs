//! [`Removal`] on PostgreSQL: the shared removal (`crate::removal`) in one
//! transaction under the tenant's advisory lock, so a resume or an
//! admission on any node waits for it and then sees the tree whole or gone.

use brood_core::{AgentName, TenantId};

use super::PgStore;
use crate::contract::Removal;
use crate::removal::{finished_trees, remove_job, remove_subtree};
use crate::types::{FinishedTree, NewEvent, Removed, RemovedJob, Result};

impl Removal for PgStore {
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed> {
        self.write(tenant.as_str(), |db| remove_subtree(db, tenant, top))
    }

    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>> {
        self.read(|db| finished_trees(db, tenant, ended_before_ms, limit))
    }

    fn remove_job(
        &self,
        tenant: &TenantId,
        id: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<RemovedJob> {
        self.write(tenant.as_str(), |db| {
            remove_job(db, tenant, id, events, now_ms)
        })
    }
}
