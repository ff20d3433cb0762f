//! The blocking facade over `tokio-postgres`: a connection with its
//! prepared statements, and [`Db`], the queries the store's methods make on
//! it or on a transaction of it, each blocking the calling thread until the
//! server answers.
//!
//! Statements are prepared once per connection and kept (the store's SQL is
//! a fixed set of strings), so a call costs one round trip, not two.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

use brood_core::TenantId;

use super::sql::STATEMENTS;
use super::{Fail, Tx};
use crate::db::{Known, Statements, Value};
use crate::types::{Event, NewEvent};

/// Waits for `f` on this thread. Not tokio's `block_on`, which refuses to
/// run inside a runtime: these futures only wait for the connection's task,
/// which runs on the store's own runtime. `unconstrained`: a caller on a
/// tokio worker thread may have spent its task's cooperative budget, and a
/// tokio future polled then (a `JoinHandle`) would defer its wake-up to that
/// scheduler, which never runs while this thread waits here: a hang.
pub(crate) fn block<F: Future>(f: F) -> F::Output {
    futures_executor::block_on(tokio::task::unconstrained(f))
}

/// How long one round trip on a connection may take. A server that stops
/// answering (stopped, black-holed by the network) leaves a call waiting
/// for as long as TCP retries; past the deadline the call fails instead,
/// and the connection is given up (what it was doing is not known), so the
/// pool connects again for the next call.
pub(crate) struct Deadline {
    after: Duration,
    /// The store's runtime, whose timer the wait is measured on.
    rt: tokio::runtime::Handle,
    expired: Cell<bool>,
}

impl Deadline {
    pub(crate) fn new(after: Duration, rt: tokio::runtime::Handle) -> Deadline {
        Deadline {
            after,
            rt,
            expired: Cell::new(false),
        }
    }

    /// Waits for `f` on this thread ([`block`]) at most the deadline.
    fn wait<T, E: Into<Fail>>(&self, f: impl Future<Output = Result<T, E>>) -> Tx<T> {
        if self.expired.get() {
            // A call past a missed deadline would meet the same silence.
            return Err(Fail::Deadline(self.after));
        }
        let sleep = {
            let _on = self.rt.enter();
            tokio::time::sleep(self.after)
        };
        let raced = block(async {
            let f = std::pin::pin!(f);
            let sleep = std::pin::pin!(sleep);
            match futures_util::future::select(f, sleep).await {
                futures_util::future::Either::Left((r, _)) => Some(r),
                futures_util::future::Either::Right(_) => None,
            }
        });
        match raced {
            Some(r) => r.map_err(Into::into),
            None => {
                self.expired.set(true);
                Err(Fail::Deadline(self.after))
            }
        }
    }
}

/// A connection of the pool and the statements prepared on it.
pub(crate) struct Conn {
    pub(crate) client: Client,
    stmts: RefCell<HashMap<String, Statement>>,
    deadline: Deadline,
}

/// How a transaction ended, as far as its client knows.
pub(crate) enum Commit<T> {
    /// The server answered the COMMIT: it is done, and `T` is its answer.
    Done(T),
    /// The COMMIT was sent and its answer never came: the connection was
    /// lost, or the deadline passed (`lost` says which). Transaction `xid`,
    /// of the session `backend`, may or may not have committed; `out` is
    /// what the body answered, true if it did.
    Unanswered {
        out: T,
        xid: i64,
        backend: i32,
        lost: Fail,
    },
}

/// The transaction's id, which assigns it one (a write has one anyway; a
/// body that writes nothing gets one too, so that every transaction's fate
/// can be asked for), and the session's process, in case it must be ended.
const Q_TX_ID: &str = "SELECT txid_current(), pg_backend_pid()";

impl Conn {
    pub(crate) fn new(client: Client, deadline: Deadline) -> Conn {
        Conn {
            client,
            stmts: RefCell::new(HashMap::new()),
            deadline,
        }
    }

    /// The connection ended, or a call on it missed its deadline.
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed() || self.deadline.expired.get()
    }

    /// Queries on the connection: outside a transaction, each statement
    /// commits on its own; inside one (`tx`), they are the transaction's.
    pub(crate) fn db(&self) -> Db<'_> {
        Db {
            client: &self.client,
            stmts: &self.stmts,
            deadline: &self.deadline,
        }
    }

    /// Runs `f` in a transaction, committed when it returns `Ok` and rolled
    /// back otherwise. With `lock`, the transaction first takes the advisory
    /// lock of that key (a tenant's name), so read-then-write bodies on the
    /// same key run one at a time across every node. `BEGIN`, the
    /// transaction's id and the lock go in one round trip. A COMMIT whose
    /// answer never came is [`Commit::Unanswered`], with what the caller
    /// needs to learn its fate (`Pool::transact`).
    pub(crate) fn tx<T>(
        &self,
        lock: Option<&str>,
        f: impl FnOnce(&Db<'_>) -> Tx<T>,
    ) -> Tx<Commit<T>> {
        let db = self.db();
        let mut open = Open {
            db: &db,
            done: false,
        };
        let (xid, backend) = db.begin(lock)?;
        let out = f(&db)?;
        // Answered or not, the transaction is no longer this client's to end.
        open.done = true;
        match self.deadline.wait(self.client.batch_execute("COMMIT")) {
            Ok(()) => Ok(Commit::Done(out)),
            Err(Fail::Pg(e)) if crate::types::connection_lost(&e) => Ok(Commit::Unanswered {
                out,
                xid,
                backend,
                lost: Fail::Pg(e),
            }),
            Err(lost @ Fail::Deadline(_)) => Ok(Commit::Unanswered {
                out,
                xid,
                backend,
                lost,
            }),
            // The server answered with an error: nothing was committed.
            Err(e) => Err(e),
        }
    }
}

/// A transaction this client opened and has not ended yet: dropped so (the
/// body failed), it is rolled back. The `ROLLBACK` is sent, not waited for
/// (as tokio-postgres's own `Transaction` does): the connection answers it
/// before anything sent after it, and a lost connection rolls back anyway.
struct Open<'a, 'c> {
    db: &'a Db<'c>,
    done: bool,
}

impl Drop for Open<'_, '_> {
    fn drop(&mut self) {
        if self.done || self.db.deadline.expired.get() {
            return;
        }
        // The first poll sends it; the answer is the connection's to drop.
        let _ = self.db.client.batch_execute("ROLLBACK").now_or_never();
    }
}

/// Where the store's SQL runs: a connection, or the transaction open on it.
pub(crate) struct Db<'a> {
    client: &'a Client,
    stmts: &'a RefCell<HashMap<String, Statement>>,
    deadline: &'a Deadline,
}

pub(crate) type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// A tenant's advisory transaction lock (its key the tenant's name hashed by
/// the server): what every read-then-write transaction takes first.
pub(crate) const LOCK_TENANT: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

impl Db<'_> {
    fn statement(&self, sql: &str) -> Tx<Statement> {
        if let Some(s) = self.stmts.borrow().get(sql) {
            return Ok(s.clone());
        }
        let text = to_pg(sql);
        let s = self.deadline.wait(self.client.prepare(&text))?;
        self.stmts.borrow_mut().insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    /// Every row `sql` gives.
    pub(crate) fn query(&self, sql: &str, params: Params<'_>) -> Tx<Vec<Row>> {
        let s = self.statement(sql)?;
        self.deadline.wait(self.client.query(&s, params))
    }

    /// The one row `sql` gives, or none.
    pub(crate) fn query_opt(&self, sql: &str, params: Params<'_>) -> Tx<Option<Row>> {
        let s = self.statement(sql)?;
        self.deadline.wait(self.client.query_opt(&s, params))
    }

    /// The one row `sql` gives (an error if it gives none or more).
    pub(crate) fn query_one(&self, sql: &str, params: Params<'_>) -> Tx<Row> {
        let s = self.statement(sql)?;
        self.deadline.wait(self.client.query_one(&s, params))
    }

    /// Runs `sql`; how many rows it changed.
    pub(crate) fn exec(&self, sql: &str, params: Params<'_>) -> Tx<u64> {
        let s = self.statement(sql)?;
        self.deadline.wait(self.client.execute(&s, params))
    }

    /// Runs `statements` in order, sent together: one round trip for all
    /// (tokio-postgres pipelines the queries of one connection polled at
    /// once; the server still runs them one after another, in order, so a
    /// lock taken by the first holds for the rest). Every statement's rows;
    /// the first error stops the rest (the transaction is aborted then).
    pub(crate) fn pipeline(&self, statements: &[(&str, Params<'_>)]) -> Tx<Vec<Vec<Row>>> {
        let prepared: Vec<Statement> = statements
            .iter()
            .map(|(sql, _)| self.statement(sql))
            .collect::<Tx<_>>()?;
        let futures = prepared
            .iter()
            .zip(statements)
            .map(|(s, (_, params))| self.client.query(s, params));
        self.deadline
            .wait(futures_util::future::try_join_all(futures))
    }

    /// Runs statements without parameters (the schema, locks).
    pub(crate) fn batch(&self, sql: &str) -> Tx<()> {
        self.deadline.wait(self.client.batch_execute(sql))
    }

    /// Opens a transaction: `BEGIN`, its id and the session's process
    /// (`Q_TX_ID`), and `lock`'s advisory lock when given, sent together
    /// (one round trip; the server runs them in order, so the id and the
    /// lock are the transaction's).
    fn begin(&self, lock: Option<&str>) -> Tx<(i64, i32)> {
        let id = self.statement(Q_TX_ID)?;
        let locked = match lock {
            Some(key) => Some((self.statement(LOCK_TENANT)?, key)),
            None => None,
        };
        let row = self.deadline.wait(async {
            let lock = async {
                match &locked {
                    Some((s, key)) => {
                        let p: [&(dyn ToSql + Sync); 1] = [key];
                        self.client.execute(s, &p).await.map(drop)
                    }
                    None => Ok(()),
                }
            };
            let begun = futures_util::future::try_join3(
                self.client.batch_execute("BEGIN"),
                self.client.query_one(&id, &[]),
                lock,
            );
            begun.await.map(|((), row, ())| row)
        })?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }
}

/// The most parameters passed without allocating (more go through a `Vec`).
const STACK_PARAMS: usize = 16;

/// `values` as tokio-postgres takes them: each a reference to the typed
/// value inside it (an `Option`, so a NULL keeps its column's type).
fn with_params<T>(values: &[Value<'_>], f: impl FnOnce(Params<'_>) -> T) -> T {
    fn one<'v>(v: &'v Value<'_>) -> &'v (dyn ToSql + Sync) {
        match v {
            Value::Int(x) => x,
            Value::Real(x) => x,
            Value::Text(x) => x,
            Value::Bytes(x) => x,
        }
    }
    if values.len() <= STACK_PARAMS {
        let mut refs: [&(dyn ToSql + Sync); STACK_PARAMS] = [&None::<i64>; STACK_PARAMS];
        for (r, v) in refs.iter_mut().zip(values) {
            *r = one(v);
        }
        f(&refs[..values.len()])
    } else {
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(one).collect();
        f(&refs)
    }
}

impl crate::db::Row for Row {
    type Err = Fail;

    /// A BIGINT, or a boolean as 1 or 0 (`EXISTS`, `bool_or`: SQLite gives
    /// both as integers, and the shared logic reads them as such).
    fn int(&self, i: usize) -> Tx<i64> {
        if self.columns().get(i).map(|c| c.type_()) == Some(&Type::BOOL) {
            Ok(i64::from(self.try_get::<_, bool>(i)?))
        } else {
            Ok(self.try_get(i)?)
        }
    }

    fn int_opt(&self, i: usize) -> Tx<Option<i64>> {
        Ok(self.try_get(i)?)
    }

    fn real(&self, i: usize) -> Tx<f64> {
        Ok(self.try_get(i)?)
    }

    fn text(&self, i: usize) -> Tx<String> {
        Ok(self.try_get(i)?)
    }

    fn text_opt(&self, i: usize) -> Tx<Option<String>> {
        Ok(self.try_get(i)?)
    }

    fn bytes(&self, i: usize) -> Tx<Vec<u8>> {
        Ok(self.try_get(i)?)
    }
}

impl crate::db::Db for Db<'_> {
    type Err = Fail;
    fn refusal(e: Fail) -> Result<crate::StoreError, Fail> {
        match e {
            Fail::Store(e) => Ok(e),
            e => Err(e),
        }
    }
    type Row<'r> = Row;
    const LOCKS_TENANTS: bool = true;
    const SQL: &'static Statements = &STATEMENTS;

    fn exec(&self, sql: &str, params: &[Value<'_>]) -> Tx<u64> {
        with_params(params, |p| Db::exec(self, sql, p))
    }

    fn query<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        each: impl FnMut(&Row) -> Tx<T>,
    ) -> Tx<Vec<T>> {
        with_params(params, |p| Db::query(self, sql, p))?
            .iter()
            .map(each)
            .collect()
    }

    fn query_opt<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&Row) -> Tx<T>,
    ) -> Tx<Option<T>> {
        with_params(params, |p| Db::query_opt(self, sql, p))?
            .map(|r| one(&r))
            .transpose()
    }

    fn append_timed(
        &self,
        tenant: &TenantId,
        events: &[(&NewEvent, i64)],
        known: Known,
    ) -> Tx<Vec<Event>> {
        super::steps::append_events_tx(self, tenant, events, known)
    }

    fn lock_tenant(&self, tenant: &str) -> Tx<()> {
        Db::exec(self, LOCK_TENANT, &[&tenant])?;
        Ok(())
    }
}

/// The SQLite store's SQL as PostgreSQL reads it: `?N` parameters become
/// `$N`, and SQLite's planner hints (`INDEXED BY name`) go (PostgreSQL
/// plans for itself). The rest of the store's SQL is the standard both
/// speak, so most statements are shared with `sqlite::sql`.
pub(crate) fn to_pg(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    while let Some(at) = out.find(" INDEXED BY ") {
        let rest = &out[at + " INDEXED BY ".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.replace_range(at..at + " INDEXED BY ".len() + end, "");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::to_pg;

    #[test]
    fn sqlite_sql_reads_as_postgres() {
        assert_eq!(
            to_pg("SELECT a FROM t INDEXED BY t_by_b WHERE b = ?1 AND c > ?12 LIMIT ?3"),
            "SELECT a FROM t WHERE b = $1 AND c > $12 LIMIT $3"
        );
        assert_eq!(to_pg("SELECT '?' , x"), "SELECT '?' , x");
    }
}
