//! [`Removal`] once for every [`SqlStore`]: the shared removal
//! (`crate::removal`) in one transaction of the tenant's, so a resume or an
//! admission on another connection (or node) waits for it and then sees
//! the tree whole or gone.

use brood_core::{AgentName, TenantId};

use super::SqlStore;
use crate::contract::Removal;
use crate::removal::{finished_trees, remove_job, remove_subtree};
use crate::types::{FinishedTree, NewEvent, Removed, RemovedJob, Result};

impl<S: SqlStore> Removal for S {
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed> {
        self.writing(tenant, |db| remove_subtree(db, tenant, top))
    }

    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>> {
        self.reading(|db| finished_trees(db, tenant, ended_before_ms, limit))
    }

    fn remove_job(
        &self,
        tenant: &TenantId,
        id: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<RemovedJob> {
        self.writing(tenant, |db| remove_job(db, tenant, id, events, now_ms))
    }
}
