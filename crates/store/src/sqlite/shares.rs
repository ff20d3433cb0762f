//! Concurrency-slot shares (`SlotShares`, issue 15) on SQLite: the shared
//! logic (`crate::shares`), each call one `BEGIN IMMEDIATE` transaction.

use super::SqliteStore;
use crate::contract::SlotShares;
use crate::shares::{self, q_shares};
use crate::types::Result;
use brood_core::TenantId;

const Q_SHARES: &str = q_shares!("");

impl SlotShares for SqliteStore {
    fn slot_acquire(&self, tenant: &TenantId, holder: &str, max: u32) -> Result<bool> {
        self.write(|tx| shares::acquire(tx, tenant.as_str(), holder, max))
    }

    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()> {
        self.write(|tx| shares::release(tx, tenant.as_str(), holder))
    }

    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64> {
        self.write(|tx| shares::repair(tx, tenant.as_str(), holder, actual))
    }

    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        self.read(|conn| shares::shares(conn, Q_SHARES, tenant.as_str()))
    }

    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64> {
        self.write(|tx| shares::forget(tx, tenant.as_str(), holders))
    }
}
