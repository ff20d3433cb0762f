//! The in-process counter: one supervisor, no network.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use brood_core::TenantId;

use super::{SlotError, Slots, drift};

/// The in-process counter: one supervisor, no network. Tenants at 0 are removed,
/// so the map holds only tenants with running processes.
#[derive(Debug, Default)]
pub struct Embedded {
    counts: Mutex<HashMap<TenantId, u64>>,
}

impl Embedded {
    pub fn new() -> Embedded {
        Embedded::default()
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<TenantId, u64>> {
        // Every critical section is a single read or write of the map, so a
        // panic elsewhere cannot leave it half-updated: a poisoned lock is safe
        // to keep using, and failing every later start would be worse.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Slots for Embedded {
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError> {
        let mut counts = self.counts();
        let held = counts.get(tenant).copied().unwrap_or(0);
        if held >= u64::from(max) {
            return Ok(false);
        }
        counts.insert(tenant.clone(), held + 1);
        Ok(true)
    }

    fn release(&self, tenant: &TenantId) -> Result<(), SlotError> {
        let mut counts = self.counts();
        match counts.get(tenant).copied() {
            Some(held) if held > 1 => {
                counts.insert(tenant.clone(), held - 1);
            }
            _ => {
                counts.remove(tenant);
            }
        }
        Ok(())
    }

    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError> {
        Ok(self.counts().get(tenant).copied().unwrap_or(0))
    }

    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError> {
        let mut counts = self.counts();
        let old = if actual == 0 {
            counts.remove(tenant)
        } else {
            counts.insert(tenant.clone(), actual)
        }
        .unwrap_or(0);
        Ok(drift(i64::try_from(old).unwrap_or(i64::MAX), actual))
    }

    fn describe(&self) -> String {
        "embedded (in-process)".to_owned()
    }
}
