//! Concurrency-slot shares (`SlotShares`, issue 15) on PostgreSQL, with the
//! SQLite store's SQL: each call one transaction under an advisory lock of
//! the tenant's slots (`slots:<tenant>`), apart from the tenant's own lock
//! so that starts and ends never queue behind admissions; none announced
//! (the news of a start or an end is its record's).

use brood_core::TenantId;

use super::{Db, PgStore, Tx};
use crate::contract::SlotShares;
use crate::shares::{D_SHARE, Q_HELD, Q_SHARE, Q_SHARES, U_ADD, U_SET, count, stored};
use crate::types::Result;

fn share(db: &Db<'_>, tenant: &str, holder: &str) -> Tx<u64> {
    let held: Option<i64> = match db.query_opt(Q_SHARE, &[&tenant, &holder])? {
        Some(r) => Some(r.try_get(0)?),
        None => None,
    };
    Ok(count(held.unwrap_or(0)))
}

/// Sets a share (0 removes it).
fn set(db: &Db<'_>, tenant: &str, holder: &str, n: u64) -> Tx<()> {
    if n == 0 {
        db.exec(D_SHARE, &[&tenant, &holder])?;
    } else {
        db.exec(U_SET, &[&tenant, &holder, &stored(n)])?;
    }
    Ok(())
}

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
        self.with_slots(t, |db| {
            let held: i64 = db.query_one(Q_HELD, &[&t])?.try_get(0)?;
            if count(held) >= u64::from(max) {
                return Ok(false);
            }
            db.exec(U_ADD, &[&t, &holder])?;
            Ok(true)
        })
    }

    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()> {
        let t = tenant.as_str();
        self.with_slots(t, |db| {
            let n = share(db, t, holder)?;
            set(db, t, holder, n.saturating_sub(1))
        })
    }

    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64> {
        let t = tenant.as_str();
        self.with_slots(t, |db| {
            let old = share(db, t, holder)?;
            set(db, t, holder, actual)?;
            Ok(old)
        })
    }

    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        let t = tenant.as_str();
        self.read(|db| {
            db.query(
                &Q_SHARES.replace("ORDER BY holder", "ORDER BY holder COLLATE \"C\""),
                &[&t],
            )?
            .iter()
            .map(|r| -> Tx<(String, u64)> { Ok((r.try_get(0)?, count(r.try_get(1)?))) })
            .collect()
        })
    }

    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64> {
        let t = tenant.as_str();
        self.with_slots(t, |db| {
            let mut freed = 0;
            for h in holders {
                freed += share(db, t, h)?;
                set(db, t, h, 0)?;
            }
            Ok(freed)
        })
    }
}
