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

pub mod sqlite;
mod types;

pub use sqlite::{Options, QueryPlan, SqliteStore};
pub use types::*;
