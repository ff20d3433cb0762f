//! The transaction both stores offer, for the logic written once over it
//! (`jobs`, `steps`, `sweeps`, `nodes`, `shares`, ...): statements with
//! typed parameters ([`Value`]), rows read by typed columns ([`Row`]), and
//! the few steps each store does its own way (events appended). SQLite
//! implements it on its connection (`sqlite::db`), PostgreSQL on its
//! transaction or connection (`postgres::db`).
//!
//! The SQL is the standard both speak, with `?N` parameters (PostgreSQL
//! reads them as `$N`, `postgres::db::to_pg`). Every integer is an i64 on
//! both sides (PostgreSQL's columns are all BIGINT), so a value is narrowed
//! with [`narrow`] where a record holds a smaller one. What only one store
//! can say (a lock clause, a collation, `GREATEST`) stays in its module and
//! reaches the shared logic as the statement to run.

use brood_core::TenantId;

use crate::types::{Event, NewEvent, StoreError};

/// A statement's parameter: the few kinds the store's columns hold, each
/// typed even when NULL (PostgreSQL checks a parameter's type).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<&'a str>),
    Bytes(&'a [u8]),
}

impl From<i64> for Value<'_> {
    fn from(v: i64) -> Self {
        Value::Int(Some(v))
    }
}

impl From<u32> for Value<'_> {
    fn from(v: u32) -> Self {
        Value::Int(Some(i64::from(v)))
    }
}

impl From<Option<i64>> for Value<'_> {
    fn from(v: Option<i64>) -> Self {
        Value::Int(v)
    }
}

impl From<f64> for Value<'_> {
    fn from(v: f64) -> Self {
        Value::Real(Some(v))
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(v: &'a str) -> Self {
        Value::Text(Some(v))
    }
}

impl<'a> From<&'a String> for Value<'a> {
    fn from(v: &'a String) -> Self {
        Value::Text(Some(v))
    }
}

impl<'a> From<Option<&'a str>> for Value<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Value::Text(v)
    }
}

impl<'a> From<&'a [u8]> for Value<'a> {
    fn from(v: &'a [u8]) -> Self {
        Value::Bytes(v)
    }
}

/// One row of an answer, read column by column (from 0).
pub(crate) trait Row {
    type Err: From<StoreError>;
    fn int(&self, i: usize) -> Result<i64, Self::Err>;
    fn int_opt(&self, i: usize) -> Result<Option<i64>, Self::Err>;
    // Spend's cost is the one real column; its reads are not shared yet.
    #[allow(dead_code)]
    fn real(&self, i: usize) -> Result<f64, Self::Err>;
    fn text(&self, i: usize) -> Result<String, Self::Err>;
    fn text_opt(&self, i: usize) -> Result<Option<String>, Self::Err>;
    fn bytes(&self, i: usize) -> Result<Vec<u8>, Self::Err>;
    /// A truth value (SQLite's 0 or 1, PostgreSQL's BOOLEAN).
    fn bool(&self, i: usize) -> Result<bool, Self::Err>;
}

/// Where the shared logic's SQL runs: a store's transaction (or, for a
/// read, its connection). The store opens, locks and commits it; the
/// shared logic only reads and writes inside.
pub(crate) trait Db {
    type Err: From<StoreError>;
    type Row<'r>: Row<Err = Self::Err>;

    /// Runs `sql`; how many rows it changed.
    fn exec(&self, sql: &str, params: &[Value<'_>]) -> Result<u64, Self::Err>;

    /// Every row `sql` gives, each decoded by `each`, in order.
    fn query<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        each: impl FnMut(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<Vec<T>, Self::Err>;

    /// The one row `sql` gives (a lookup by key), decoded by `one`, or none.
    /// More than one row is an error on PostgreSQL; SQLite takes the first.
    fn query_opt<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<Option<T>, Self::Err>;

    /// The row `sql` always gives (an aggregate, `EXISTS`), decoded by `one`.
    fn query_one<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<T, Self::Err> {
        self.query_opt(sql, params, one)?.ok_or_else(|| {
            StoreError::Corrupt {
                what: "an answer of one row",
                value: format!("no row from {sql}"),
            }
            .into()
        })
    }

    /// Appends `events` to the tenant's log with its next sequence numbers,
    /// inside this transaction: each store numbers them its own way.
    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>, Self::Err>;
}

/// An i64 column's value narrowed to `T`, or a corrupt value naming it.
pub(crate) fn narrow<T: TryFrom<i64>>(v: i64, what: &'static str) -> Result<T, StoreError> {
    T::try_from(v).map_err(|_| StoreError::Corrupt {
        what,
        value: v.to_string(),
    })
}

/// A count or size as a column's i64 (saturating: none reaches 2^63).
pub(crate) fn int(n: impl TryInto<i64>) -> Value<'static> {
    Value::Int(Some(n.try_into().unwrap_or(i64::MAX)))
}

/// A text column parsed into a name or id, or a corrupt value naming it.
pub(crate) fn parse<T, E>(
    what: &'static str,
    s: String,
    new: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, StoreError> {
    new(&s).map_err(|_| StoreError::Corrupt { what, value: s })
}
