//! SQLite as a [`SqlStore`] (the contract's `Admission`, `Runs`,
//! `Transcripts`, `Records` and `Recovery`, written once in
//! `crate::sql_store`): reads on a free reader connection, every
//! read-then-write in one `BEGIN IMMEDIATE` transaction (which locks every
//! tenant at once), admissions through the group commit. The sweepers'
//! part is in `sweeps`.

use brood_core::{Quotas, TenantId};

use rusqlite::Connection;

use super::{Fail, SqliteStore, Tx};
use crate::sql_store::SqlStore;
use crate::types::{Agent, NewAgent, NewEvent, Result};

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

    fn admit_grouped(
        &self,
        new: &NewAgent,
        quotas: Option<&Quotas>,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.admit_queued(new, quotas, events)
    }
}
