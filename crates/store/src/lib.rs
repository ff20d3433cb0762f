//! brood-store: the durable store, the single source of truth (SPEC 2, 14).
//!
//! The [`Store`] trait is the contract the supervisor codes against; [`sqlite`]
//! implements it on one SQLite file (WAL, `busy_timeout`, `BEGIN IMMEDIATE` for
//! every read-then-write), [`postgres`] on a PostgreSQL server that many nodes
//! share, checked by the same conformance tests; [`open`] picks one from
//! `--store`.
//!
//! Every method that changes state commits before it returns, so the caller may
//! acknowledge the change as soon as the call returns (the runtime's invariant
//! "written to the store before it is acknowledged"). Status changes go through
//! `brood_core::Status::transition`; the store refuses an illegal move instead of
//! writing it.

mod admission;
mod bell;
mod blobs;
mod changed;
mod checks;
mod contract;
mod db;
mod group;
mod idempotency;
mod shares;
// First, and with its macros (`agent_cols!`, `unfinished!`, `run_cols!`):
// the PostgreSQL store assembles its own statements from the same column lists.
#[macro_use]
pub mod sqlite;
pub mod postgres;
// After `sqlite`, whose `unfinished!` it uses.
mod jobs;
mod nodes;
mod records;
mod removal;
mod runs;
mod sql_store;
mod sweeps;
mod types;

pub use changed::Changed;
pub use contract::{
    Admission, BLOB_CHUNK, Blobs, Idempotency, Jobs, Nodes, Records, Recovery, Removal, Runs,
    SlotShares, Store, Sweeps, Transcripts,
};
pub use removal::is_job_worker;
pub use sqlite::{Options, QueryPlan, SqliteStore};
pub use types::*;

/// Whether `spec` (`--store`, `BROOD_STORE`) names a PostgreSQL server
/// rather than a SQLite file.
pub fn is_postgres_url(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// The store `spec` names: `postgres://…` a PostgreSQL server, anything
/// else a SQLite file (created if missing).
pub fn open(spec: &str) -> Result<std::sync::Arc<dyn Store>> {
    Ok(if is_postgres_url(spec) {
        std::sync::Arc::new(postgres::PgStore::open(spec)?)
    } else {
        std::sync::Arc::new(SqliteStore::open(std::path::Path::new(spec))?)
    })
}

/// [`open`] for reading only: a SQLite file opened read-only (it must
/// exist); a PostgreSQL server as it is.
pub fn open_read_only(spec: &str) -> Result<std::sync::Arc<dyn Store>> {
    Ok(if is_postgres_url(spec) {
        std::sync::Arc::new(postgres::PgStore::open(spec)?)
    } else {
        std::sync::Arc::new(SqliteStore::open_read_only(std::path::Path::new(spec))?)
    })
}

/// The schema a store holds (`applied`, 0 for none) and the newest this
/// build knows (`latest`): what `brood doctor` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaVersion {
    pub applied: i64,
    pub latest: i64,
}

/// The schema version of the store `spec` names, reading only: `None` for
/// a SQLite file not made yet; a PostgreSQL server must answer.
pub fn schema_version(spec: &str) -> Result<Option<SchemaVersion>> {
    if is_postgres_url(spec) {
        postgres::PgStore::schema_version(spec).map(Some)
    } else {
        SqliteStore::schema_version(std::path::Path::new(spec))
    }
}

/// The wall clock in milliseconds, for what the store stamps itself (a
/// migration's, a blob's time); the rest is stamped by the caller.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Every trait of the contract, for code that calls a concrete store (a
/// `SqliteStore`, not a `dyn Store`): `use brood_store::prelude::*;`.
pub mod prelude {
    pub use crate::contract::{
        Admission, Blobs, Idempotency, Jobs, Nodes, Records, Recovery, Removal, Runs, SlotShares,
        Store, Sweeps, Transcripts,
    };
}
