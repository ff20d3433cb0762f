//! Concurrency-slot shares (`SlotShares`, issue 15) on SQLite: each call one
//! `BEGIN IMMEDIATE` transaction.

use rusqlite::OptionalExtension;

use super::{SqliteStore, Tx, collect};
use crate::contract::SlotShares;
use crate::shares::{D_SHARE, Q_HELD, Q_SHARE, Q_SHARES, U_ADD, U_SET, count, stored};
use crate::types::Result;
use brood_core::TenantId;
use rusqlite::Transaction;

fn share(tx: &Transaction<'_>, tenant: &str, holder: &str) -> Tx<u64> {
    let held: Option<i64> = tx
        .prepare_cached(Q_SHARE)?
        .query_row((tenant, holder), |r| r.get(0))
        .optional()?;
    Ok(count(held.unwrap_or(0)))
}

/// Sets a share (0 removes it).
fn set(tx: &Transaction<'_>, tenant: &str, holder: &str, n: u64) -> Tx<()> {
    if n == 0 {
        tx.prepare_cached(D_SHARE)?.execute((tenant, holder))?;
    } else {
        tx.prepare_cached(U_SET)?
            .execute(rusqlite::params![tenant, holder, stored(n)])?;
    }
    Ok(())
}

impl SlotShares for SqliteStore {
    fn slot_acquire(&self, tenant: &TenantId, holder: &str, max: u32) -> Result<bool> {
        let t = tenant.as_str();
        self.write(|tx| {
            let held: i64 = tx.prepare_cached(Q_HELD)?.query_row([t], |r| r.get(0))?;
            if count(held) >= u64::from(max) {
                return Ok(false);
            }
            tx.prepare_cached(U_ADD)?.execute((t, holder))?;
            Ok(true)
        })
    }

    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()> {
        let t = tenant.as_str();
        self.write(|tx| {
            let n = share(tx, t, holder)?;
            set(tx, t, holder, n.saturating_sub(1))
        })
    }

    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64> {
        let t = tenant.as_str();
        self.write(|tx| {
            let old = share(tx, t, holder)?;
            set(tx, t, holder, actual)?;
            Ok(old)
        })
    }

    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>> {
        self.read(|conn| {
            collect(conn, Q_SHARES, [tenant.as_str()], |r| {
                Ok((r.get(0)?, count(r.get(1)?)))
            })
        })
    }

    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64> {
        let t = tenant.as_str();
        self.write(|tx| {
            let mut freed = 0;
            for h in holders {
                freed += share(tx, t, h)?;
                set(tx, t, h, 0)?;
            }
            Ok(freed)
        })
    }
}
