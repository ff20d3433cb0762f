//! The store's shares: the counter of nodes that share a store but no Redis.

use std::sync::Arc;

use brood_core::TenantId;

use super::{SlotError, Slots, drift, gone};

/// The counter of nodes that share a store but no Redis: each supervisor's
/// share a row of the store (`brood_store::SlotShares`), each call one
/// transaction (on PostgreSQL under a lock of the tenant's slots), so the
/// tenant's `max_concurrent` holds across every node.
pub struct StoreShares {
    store: Arc<dyn brood_store::Store>,
    holder: String,
}

impl StoreShares {
    pub fn new(store: Arc<dyn brood_store::Store>, holder: &str) -> StoreShares {
        StoreShares {
            store,
            holder: holder.to_owned(),
        }
    }

    fn failed(command: &'static str) -> impl Fn(brood_store::StoreError) -> SlotError {
        move |e| SlotError::Store {
            command,
            detail: e.to_string(),
        }
    }
}

impl Slots for StoreShares {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        self.store
            .slot_acquire(tenant, &self.holder, max)
            .map_err(Self::failed("acquire"))
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        self.store
            .slot_release(tenant, &self.holder)
            .map_err(Self::failed("release"))
    }

    fn acquire_up_to(&self, tenant: &TenantId, max: u32, want: u32) -> Result<u32, SlotError> {
        self.store
            .slot_acquire_up_to(tenant, &self.holder, max, want)
            .map_err(Self::failed("acquire"))
    }

    fn release_n(&self, tenant: &TenantId, n: u32) -> Result<(), SlotError> {
        self.store
            .slot_release_n(tenant, &self.holder, n)
            .map_err(Self::failed("release"))
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        let shares = self
            .store
            .slot_shares(tenant)
            .map_err(Self::failed("count"))?;
        Ok(shares.iter().map(|s| s.1).sum())
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let old = self
            .store
            .slot_repair(tenant, &self.holder, actual)
            .map_err(Self::failed("repair"))?;
        Ok(drift(i64::try_from(old).unwrap_or(i64::MAX), actual))
    }

    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let shares = self
            .store
            .slot_shares(tenant)
            .map_err(Self::failed("shares"))?;
        let gone: Vec<String> = gone(shares.iter().map(|s| s.0.as_str()), &self.holder, alive)
            .into_iter()
            .map(str::to_owned)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        self.store
            .slot_forget(tenant, &gone)
            .map_err(Self::failed("forget"))
    }

    fn describe(&self) -> String {
        "the store (shared by the nodes)".to_owned()
    }
}
