//! Concurrency-slot shares (`SlotShares`, issue 15) on PostgreSQL: the
//! shared logic (`crate::shares`), each call one transaction under an
//! advisory lock of the tenant's slots (`slots:<tenant>`), apart from the
//! tenant's own lock so that starts and ends never queue behind
//! admissions; none announced (the news of a start or an end is its
//! record's). Holders in byte order (`COLLATE "C"`), as SQLite orders them.

use brood_core::TenantId;

use super::{Db, PgStore, Tx};
use crate::contract::SlotShares;
use crate::shares::{self, q_shares};
use crate::types::Result;

const Q_SHARES: &str = q_shares!(" COLLATE \"C\"");

impl PgStore {
    /// Runs `f` in a transaction holding the lock of `tenant`'s slots.
    fn with_slots<T>(&self, tenant: &str, f: impl Fn(&Db<'_>) -> Tx<T>) -> Result<T> {
        let key = format!("slots:{tenant}");
        self.pool.with(|c| c.tx(Some(&key), &f))
    }
}

impl SlotShares for PgStore {
    fn slot_acquire(&self, tenant: &TenantId, holder: &str, max: u32) -> Result<bool> {
        let t = tenant.as_str();
        self.with_slots(t, |db| shares::acquire(db, t, holder, max))
    }

    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()> {
        let t = tenant.as_str();
        self.with_slots(t, |db| shares::release(db, t, holder))
    }

    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64> {
        let t = tenant.as_str();
        self.with_slots(t, |db| shares::repair(db, t, holder, actual))
    }

    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        self.read(|db| shares::shares(db, Q_SHARES, tenant.as_str()))
    }

    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64> {
        let t = tenant.as_str();
        self.with_slots(t, |db| shares::forget(db, t, holders))
    }
}
