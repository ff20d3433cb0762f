//! SQLite as a [`SqlStore`] (the whole contract, written once in
//! `crate::sql_store`): reads on a free reader connection, every write in
//! one `BEGIN IMMEDIATE` transaction (which locks every tenant, and every
//! tenant's slots, at once), admissions through the group commit. One file
//! has no other nodes to tell of a write, and its sweepers' lease is locked
//! by the runtime on a file beside it, so the contract's defaults stand
//! there.

use brood_core::TenantId;
use rusqlite::Connection;

use super::{Fail, SqliteStore, Tx};
use crate::group::{Group, Groups};
use crate::sql_store::SqlStore;
use crate::types::{Agent, Result, StoreError};

impl SqlStore for SqliteStore {
    type Err = Fail;
    type Db<'c> = Connection;

    fn reading<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.read(f)
    }

    fn writing<T>(&self, _: &TenantId, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(f)
    }

    fn writing_any<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(f)
    }

    fn writing_quiet<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(f)
    }

    fn writing_slots<T>(&self, _: &TenantId, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(f)
    }

    fn writing_one<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(f)
    }

    fn announce(&self) {}

    fn bell(&self) -> &crate::bell::Bell {
        &self.bell
    }

    fn admissions(&self) -> &Groups {
        &self.admissions
    }

    fn commit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>> {
        SqliteStore::commit_group(self, group)
    }

    fn admission_lost(&self, message: String) -> StoreError {
        SqliteStore::admission_lost(self, message)
    }
}
