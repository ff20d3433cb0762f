//! Concurrency-slot shares (issue 15, [`crate::SlotShares`]), written once
//! for both stores over [`Db`]: the tenant's count checked and a share
//! taken, given back, repaired or forgotten, each inside the store's
//! transaction (SQLite's `BEGIN IMMEDIATE`; on PostgreSQL one under the
//! lock of the tenant's slots).

use crate::db::{Db, Row};

/// The tenant's count (cast: PostgreSQL sums BIGINTs as NUMERIC).
const Q_HELD: &str =
    "SELECT CAST(COALESCE(SUM(held), 0) AS BIGINT) FROM slot_shares WHERE tenant = ?1";
const U_ADD: &str = "INSERT INTO slot_shares (tenant, holder, held) VALUES (?1, ?2, ?3) \
     ON CONFLICT (tenant, holder) DO UPDATE SET held = slot_shares.held + excluded.held";
const Q_SHARE: &str = "SELECT held FROM slot_shares WHERE tenant = ?1 AND holder = ?2";
const U_SET: &str = "INSERT INTO slot_shares (tenant, holder, held) VALUES (?1, ?2, ?3) \
     ON CONFLICT (tenant, holder) DO UPDATE SET held = excluded.held";
const D_SHARE: &str = "DELETE FROM slot_shares WHERE tenant = ?1 AND holder = ?2";
/// Every share of a tenant, by holder in `$collate` order.
macro_rules! q_shares {
    ($collate:literal) => {
        concat!(
            "SELECT holder, held FROM slot_shares WHERE tenant = ?1 ORDER BY holder",
            $collate
        )
    };
}
pub(crate) use q_shares;

/// A stored share as a count (a negative one, which no call writes, as 0).
fn count(held: i64) -> u64 {
    u64::try_from(held).unwrap_or(0)
}

/// A count as a stored share.
fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn share<D: Db>(db: &D, tenant: &str, holder: &str) -> Result<u64, D::Err> {
    let held = db.query_opt(Q_SHARE, &[tenant.into(), holder.into()], |r| r.int(0))?;
    Ok(count(held.unwrap_or(0)))
}

/// Sets a share (0 removes it).
fn set<D: Db>(db: &D, tenant: &str, holder: &str, n: u64) -> Result<(), D::Err> {
    if n == 0 {
        db.exec(D_SHARE, &[tenant.into(), holder.into()])?;
    } else {
        db.exec(U_SET, &[tenant.into(), holder.into(), stored(n).into()])?;
    }
    Ok(())
}

/// [`crate::SlotShares::slot_acquire`]: a slot for `holder` unless the
/// tenant holds `max` already.
pub(crate) fn acquire<D: Db>(db: &D, tenant: &str, holder: &str, max: u32) -> Result<bool, D::Err> {
    Ok(acquire_up_to(db, tenant, holder, max, 1)? == 1)
}

/// [`crate::SlotShares::slot_acquire_up_to`]: up to `want` slots for
/// `holder`, as many as leave the tenant at or under `max`; how many.
pub(crate) fn acquire_up_to<D: Db>(
    db: &D,
    tenant: &str,
    holder: &str,
    max: u32,
    want: u32,
) -> Result<u32, D::Err> {
    let held = count(db.query_one(Q_HELD, &[tenant.into()], |r| r.int(0))?);
    let room = u64::from(max).saturating_sub(held);
    let n = u32::try_from(room.min(u64::from(want))).unwrap_or(want);
    if n > 0 {
        db.exec(U_ADD, &[tenant.into(), holder.into(), i64::from(n).into()])?;
    }
    Ok(n)
}

/// [`crate::SlotShares::slot_release`].
pub(crate) fn release<D: Db>(db: &D, tenant: &str, holder: &str) -> Result<(), D::Err> {
    release_n(db, tenant, holder, 1)
}

/// [`crate::SlotShares::slot_release_n`].
pub(crate) fn release_n<D: Db>(db: &D, tenant: &str, holder: &str, n: u32) -> Result<(), D::Err> {
    let held = share(db, tenant, holder)?;
    set(db, tenant, holder, held.saturating_sub(u64::from(n)))
}

/// [`crate::SlotShares::slot_repair`]: the share as it was.
pub(crate) fn repair<D: Db>(
    db: &D,
    tenant: &str,
    holder: &str,
    actual: u64,
) -> Result<u64, D::Err> {
    let old = share(db, tenant, holder)?;
    set(db, tenant, holder, actual)?;
    Ok(old)
}

/// [`crate::SlotShares::slot_shares`], read with the store's `slot_shares`.
pub(crate) fn shares<D: Db>(db: &D, tenant: &str) -> Result<Vec<(String, u64)>, D::Err> {
    db.query(D::SQL.slot_shares, &[tenant.into()], |r| {
        Ok((r.text(0)?, count(r.int(1)?)))
    })
}

/// [`crate::SlotShares::slot_forget`]: how many slots the holders held.
pub(crate) fn forget<D: Db>(db: &D, tenant: &str, holders: &[String]) -> Result<u64, D::Err> {
    let mut freed = 0;
    for h in holders {
        freed += share(db, tenant, h)?;
        set(db, tenant, h, 0)?;
    }
    Ok(freed)
}
