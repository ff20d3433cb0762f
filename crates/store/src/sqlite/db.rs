//! [`crate::db::Db`] on SQLite: the shared logic's statements on the
//! store's connection (a reader's, or the writer's inside its
//! `BEGIN IMMEDIATE` transaction, which is that connection), each prepared
//! once and kept in the connection's statement cache, every [`Value`]
//! bound as it is (no copy).

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ToSql};

use super::sql::STATEMENTS;
use super::{Fail, Tx, append_events_tx};
use crate::db::{Db, Known, Row, Statements, Value};
use crate::types::{Event, NewEvent};
use brood_core::TenantId;

impl ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Int(Some(v)) => ValueRef::Integer(v),
            Value::Real(Some(v)) => ValueRef::Real(v),
            Value::Text(Some(v)) => ValueRef::Text(v.as_bytes()),
            Value::Bytes(v) => ValueRef::Blob(v),
            Value::Int(None) | Value::Real(None) | Value::Text(None) => ValueRef::Null,
        }))
    }
}

impl Row for rusqlite::Row<'_> {
    type Err = Fail;

    fn int(&self, i: usize) -> Tx<i64> {
        Ok(self.get(i)?)
    }

    fn int_opt(&self, i: usize) -> Tx<Option<i64>> {
        Ok(self.get(i)?)
    }

    fn real(&self, i: usize) -> Tx<f64> {
        Ok(self.get(i)?)
    }

    fn text(&self, i: usize) -> Tx<String> {
        Ok(self.get(i)?)
    }

    fn text_opt(&self, i: usize) -> Tx<Option<String>> {
        Ok(self.get(i)?)
    }

    fn bytes(&self, i: usize) -> Tx<Vec<u8>> {
        Ok(self.get(i)?)
    }
}

impl Db for Connection {
    type Err = Fail;
    fn refusal(e: Fail) -> Result<crate::StoreError, Fail> {
        match e {
            Fail::Store(e) => Ok(e),
            e => Err(e),
        }
    }
    type Row<'r> = rusqlite::Row<'r>;
    const LOCKS_TENANTS: bool = false;
    const SQL: &'static Statements = &STATEMENTS;

    fn exec(&self, sql: &str, params: &[Value<'_>]) -> Tx<u64> {
        let n = self
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(params))?;
        Ok(n as u64)
    }

    fn query<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        mut each: impl FnMut(&rusqlite::Row<'_>) -> Tx<T>,
    ) -> Tx<Vec<T>> {
        let mut stmt = self.prepare_cached(sql)?;
        let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(each(row)?);
        }
        Ok(out)
    }

    fn query_opt<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&rusqlite::Row<'_>) -> Tx<T>,
    ) -> Tx<Option<T>> {
        let mut stmt = self.prepare_cached(sql)?;
        let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
        match rows.next()? {
            Some(row) => Ok(Some(one(row)?)),
            None => Ok(None),
        }
    }

    fn append_timed(
        &self,
        tenant: &TenantId,
        events: &[(&NewEvent, i64)],
        known: Known,
    ) -> Tx<Vec<Event>> {
        append_events_tx(self, tenant, events, known)
    }

    fn lock_tenant(&self, _tenant: &str) -> Tx<()> {
        // `BEGIN IMMEDIATE` already holds the file's one write lock.
        Ok(())
    }
}
