//! PostgreSQL as a [`SqlStore`] (the whole contract, written once in
//! `crate::sql_store`): every read-then-write runs in a transaction under
//! its tenant's advisory lock (`PgStore::write`), so it is exact across
//! nodes; the concurrency slots under a lock of their own; writes announced
//! to the other nodes (`news`) unless they are no news to them; admissions
//! through the group commit (`admission`); and what only this store has:
//! the sweepers' lease locked for its holder's session (`sweeps`), and the
//! other nodes' writes heard.

use brood_core::TenantId;

use super::{Db, Fail, PgStore, Tx};
use crate::group::{Group, Groups};
use crate::sql_store::SqlStore;
use crate::types::{Agent, LeaseLock, Result, StoreError};

impl SqlStore for PgStore {
    type Err = Fail;
    type Db<'c> = Db<'c>;

    fn reading<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.read(f)
    }

    fn writing<T>(&self, tenant: &TenantId, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write(tenant.as_str(), f)
    }

    fn writing_any<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write_any(f)
    }

    fn writing_quiet<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        self.write_quiet(f)
    }

    fn writing_slots<T>(&self, tenant: &TenantId, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        // `slots:<tenant>`: apart from the tenant's own lock, so that starts
        // and ends never queue behind admissions.
        let key = format!("slots:{tenant}");
        self.pool.transact(Some(&key), &f)
    }

    fn writing_one<T>(&self, f: impl Fn(&Self::Db<'_>) -> Tx<T>) -> Result<T> {
        // On the connection: the statement commits on its own, one round
        // trip where a transaction would cost three. Run again when the
        // connection is lost, even after it committed: it sets what it
        // sets (a heartbeat), so twice is once.
        self.pool.with(|c| f(&c.db()))
    }

    fn announce(&self) {
        self.wrote(crate::Changed::ALL);
    }

    fn bell(&self) -> &crate::bell::Bell {
        &self.pool.bell
    }

    fn admissions(&self) -> &Groups {
        &self.admissions
    }

    fn commit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>> {
        PgStore::commit_group(self, group)
    }

    fn admission_lost(&self, message: String) -> StoreError {
        PgStore::admission_lost(self, message)
    }

    fn lease_lock(&self, name: &str) -> Result<LeaseLock> {
        self.try_lease_lock(name)
    }

    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        self.break_lease(name)
    }

    fn hear(
        &self,
        me: &str,
        on_news: std::sync::Arc<dyn Fn(crate::Changed) + Send + Sync>,
    ) -> Result<()> {
        if self.news.get().is_some() {
            return Ok(());
        }
        // The event log's readers hear the news too, without waiting for
        // the one told here (a supervisor's loop) to pass it on.
        let pool = std::sync::Arc::downgrade(&self.pool);
        let on_news = std::sync::Arc::new(move |what: crate::Changed| {
            if what.any(crate::Changed::EVENTS)
                && let Some(p) = pool.upgrade()
            {
                p.bell.ring();
            }
            on_news(what);
        });
        let news = super::news::start(&self.pool, me, on_news).map_err(|e| e.at(self.target()))?;
        // Two racing callers would start two announcers; the second's is
        // dropped here and its tasks find nothing to announce.
        let _ = self.news.set(news);
        Ok(())
    }
}
