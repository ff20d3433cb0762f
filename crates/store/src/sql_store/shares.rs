//! [`SlotShares`] once for every [`SqlStore`]: the shared logic
//! (`crate::shares`), each change one transaction that holds the tenant's
//! slots (`SqlStore::writing_slots`).

use brood_core::TenantId;

use super::SqlStore;
use crate::contract::SlotShares;
use crate::shares;
use crate::types::Result;

impl<S: SqlStore> SlotShares for S {
    fn slot_acquire(&self, tenant: &TenantId, holder: &str, max: u32) -> Result<bool> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::acquire(db, t, holder, max))
    }

    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::release(db, t, holder))
    }

    fn slot_acquire_up_to(
        &self,
        tenant: &TenantId,
        holder: &str,
        max: u32,
        want: u32,
    ) -> Result<u32> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::acquire_up_to(db, t, holder, max, want))
    }

    fn slot_release_n(&self, tenant: &TenantId, holder: &str, n: u32) -> Result<()> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::release_n(db, t, holder, n))
    }

    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::repair(db, t, holder, actual))
    }

    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        self.reading(|db| shares::shares(db, tenant.as_str()))
    }

    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64> {
        let t = tenant.as_str();
        self.writing_slots(tenant, |db| shares::forget(db, t, holders))
    }
}
