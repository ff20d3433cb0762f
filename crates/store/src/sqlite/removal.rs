//! [`Removal`] on SQLite: the shared removal (`crate::removal`) inside one
//! `BEGIN IMMEDIATE` transaction, so a resume or an admission on another
//! connection waits for it and then sees the tree whole or gone.

use brood_core::{AgentName, TenantId};

use super::SqliteStore;
use crate::contract::Removal;
use crate::removal::{finished_trees, remove_job, remove_subtree};
use crate::types::{FinishedTree, NewEvent, Removed, RemovedJob, Result};

impl Removal for SqliteStore {
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed> {
        self.write(|tx| remove_subtree(tx, tenant, top))
    }

    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>> {
        self.read(|conn| finished_trees(conn, tenant, ended_before_ms, limit))
    }

    fn remove_job(
        &self,
        tenant: &TenantId,
        id: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<RemovedJob> {
        self.write(|tx| remove_job(tx, tenant, id, events, now_ms))
    }
}
