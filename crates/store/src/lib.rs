//! brood-store: the durable store, the single source of truth (SPEC 2, 14).
//!
//! The [`Store`] trait is the contract the supervisor codes against; [`sqlite`]
//! implements it on one SQLite file (WAL, `busy_timeout`, `BEGIN IMMEDIATE` for
//! every read-then-write). PostgreSQL comes as a second implementation behind the
//! same trait, checked by the same conformance tests.
//!
//! Every method that changes state commits before it returns, so the caller may
//! acknowledge the change as soon as the call returns (the runtime's invariant
//! "written to the store before it is acknowledged"). Status changes go through
//! `brood_core::Status::transition`; the store refuses an illegal move instead of
//! writing it.

mod contract;
pub mod postgres;
pub mod sqlite;
mod types;

pub use contract::{
    Admission, Idempotency, Jobs, Records, Recovery, Runs, Store, Sweeps, Transcripts,
};
pub use sqlite::{Options, QueryPlan, SqliteStore};
pub use types::*;

/// Every trait of the contract, for code that calls a concrete store (a
/// `SqliteStore`, not a `dyn Store`): `use brood_store::prelude::*;`.
pub mod prelude {
    pub use crate::contract::{
        Admission, Idempotency, Jobs, Records, Recovery, Runs, Store, Sweeps, Transcripts,
    };
}
