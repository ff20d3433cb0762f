//! The SQL of [`SlotShares`](crate::SlotShares), shared by both stores, and
//! what they check alike.

/// The tenant's count (cast: PostgreSQL sums BIGINTs as NUMERIC).
pub(crate) const Q_HELD: &str =
    "SELECT CAST(COALESCE(SUM(held), 0) AS BIGINT) FROM slot_shares WHERE tenant = ?1";
pub(crate) const U_ADD: &str = "INSERT INTO slot_shares (tenant, holder, held) VALUES (?1, ?2, 1) \
     ON CONFLICT (tenant, holder) DO UPDATE SET held = slot_shares.held + 1";
pub(crate) const Q_SHARE: &str = "SELECT held FROM slot_shares WHERE tenant = ?1 AND holder = ?2";
pub(crate) const U_SET: &str = "INSERT INTO slot_shares (tenant, holder, held) VALUES (?1, ?2, ?3) \
     ON CONFLICT (tenant, holder) DO UPDATE SET held = excluded.held";
pub(crate) const D_SHARE: &str = "DELETE FROM slot_shares WHERE tenant = ?1 AND holder = ?2";
pub(crate) const Q_SHARES: &str =
    "SELECT holder, held FROM slot_shares WHERE tenant = ?1 ORDER BY holder";

/// A stored share as a count (a negative one, which no call writes, as 0).
pub(crate) fn count(held: i64) -> u64 {
    u64::try_from(held).unwrap_or(0)
}

/// A count as a stored share.
pub(crate) fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
