//! [`Txn`] on PostgreSQL: the shared bodies' reads and writes on a
//! connection or a transaction of it (`Db`), SQLite's statements read as
//! PostgreSQL by `db::to_pg` but where [`STATEMENTS`] gives this dialect's
//! own, and every [`Val`] bound by reference (no copy).

use brood_core::{AgentName, TenantId};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::admission::{Q_ANCESTOR_OR_SELF, U_RUN_STARTED};
use super::db::LOCK_TENANT;
use super::records::{
    Q_AGENTS_ALL, Q_AGENTS_UNFINISHED, Q_CHILDREN, Q_DESCENDANTS, Q_OWN_USAGE, Q_STOPPING_OF,
    Q_SUBTREE_USAGE, Q_SUPERVISORS_WITH_UNFINISHED, Q_TENANTS, Q_UNFINISHED_OF,
};
use super::rows::{agent_at, channel_from, collect, event_from, message_from, run_from};
use super::steps::{append_events_tx, load_agent};
use super::{Db, Fail, Tx, corrupt};
use crate::txn::{PlanRow, Statements, Txn, Val};
use crate::types::{Agent, Channel, Event, Message, NewEvent, Run, Usage};

/// SQLite's statements, but those PostgreSQL reads otherwise (see
/// `records` and `admission` for why each differs).
pub(crate) const STATEMENTS: Statements = Statements {
    own_usage: Q_OWN_USAGE,
    subtree_usage: Q_SUBTREE_USAGE,
    ancestor_or_self: Q_ANCESTOR_OR_SELF,
    descendants: Q_DESCENDANTS,
    children: Q_CHILDREN,
    unfinished_of: Q_UNFINISHED_OF,
    agents_all: Q_AGENTS_ALL,
    agents_unfinished: Q_AGENTS_UNFINISHED,
    stopping_of: Q_STOPPING_OF,
    supervisors_with_unfinished: Q_SUPERVISORS_WITH_UNFINISHED,
    tenants: Q_TENANTS,
    run_started: U_RUN_STARTED,
    ..crate::sqlite::sql::STATEMENTS
};

/// The most parameters a shared statement binds.
const MAX_PARAMS: usize = 16;

/// The shared bodies' view of a connection or transaction.
pub(crate) struct On<'a, 'd>(pub(crate) &'a Db<'d>);

/// Runs `f` with `params` as the driver takes them: references to the
/// values inside, on the stack.
fn bound<T>(params: &[Val<'_>], f: impl FnOnce(&[&(dyn ToSql + Sync)]) -> Tx<T>) -> Tx<T> {
    const NULL: Option<&str> = None;
    if params.len() > MAX_PARAMS {
        return Err(corrupt(
            "a statement's parameters",
            format!("{} given, at most {MAX_PARAMS} bound", params.len()),
        ));
    }
    let mut refs: [&(dyn ToSql + Sync); MAX_PARAMS] = [&NULL; MAX_PARAMS];
    for (r, v) in refs.iter_mut().zip(params) {
        *r = match v {
            Val::Text(s) => s,
            Val::MaybeText(s) => s,
            Val::Int(i) => i,
            Val::MaybeInt(i) => i,
            Val::Real(r) => r,
        };
    }
    f(&refs[..params.len()])
}

/// Column `i` as an integer: a BIGINT, or a boolean as 1 or 0 (`EXISTS`,
/// `bool_or`, which SQLite gives as integers).
fn int_at(row: &Row, i: usize) -> Tx<i64> {
    if row.columns().get(i).map(|c| c.type_()) == Some(&Type::BOOL) {
        Ok(i64::from(row.try_get::<_, bool>(i)?))
    } else {
        Ok(row.try_get(i)?)
    }
}

impl Txn for On<'_, '_> {
    type Err = Fail;
    const LOCKS_TENANTS: bool = true;
    const SQL: &'static Statements = &STATEMENTS;

    fn exec(&self, sql: &str, params: &[Val<'_>]) -> Tx<u64> {
        bound(params, |p| self.0.exec(sql, p))
    }

    fn ints<const N: usize>(&self, sql: &str, params: &[Val<'_>]) -> Tx<[i64; N]> {
        let row = bound(params, |p| self.0.query_one(sql, p))?;
        let mut out = [0; N];
        for (i, v) in out.iter_mut().enumerate() {
            *v = int_at(&row, i)?;
        }
        Ok(out)
    }

    fn usage(&self, sql: &str, params: &[Val<'_>]) -> Tx<Usage> {
        let r = bound(params, |p| self.0.query_one(sql, p))?;
        Ok(Usage {
            tokens_in: r.try_get::<_, i64>(0)?.max(0).unsigned_abs(),
            tokens_out: r.try_get::<_, i64>(1)?.max(0).unsigned_abs(),
            cost_usd: r.try_get(2)?,
        })
    }

    fn pairs(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<(String, String)>> {
        bound(params, |p| {
            collect(self.0, sql, p, |r| Ok((r.try_get(0)?, r.try_get(1)?)))
        })
    }

    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Tx<Option<Agent>> {
        load_agent(self.0, tenant, name)
    }

    fn agents(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Agent>> {
        bound(params, |p| collect(self.0, sql, p, |r| agent_at(r, 0)))
    }

    fn runs(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Run>> {
        bound(params, |p| collect(self.0, sql, p, run_from))
    }

    fn channels(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Channel>> {
        bound(params, |p| collect(self.0, sql, p, channel_from))
    }

    fn messages(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Message>> {
        bound(params, |p| collect(self.0, sql, p, message_from))
    }

    fn events(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Event>> {
        bound(params, |p| collect(self.0, sql, p, event_from))
    }

    fn texts(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<String>> {
        bound(params, |p| collect(self.0, sql, p, |r| Ok(r.try_get(0)?)))
    }

    fn named_ints(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<(String, i64)>> {
        bound(params, |p| {
            collect(self.0, sql, p, |r| Ok((r.try_get(0)?, r.try_get(1)?)))
        })
    }

    fn plan(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<PlanRow>> {
        bound(params, |p| {
            collect(self.0, sql, p, |r| {
                let agent = match r.try_get::<_, Option<String>>(2)? {
                    None => None,
                    Some(_) => Some(agent_at(r, 2)?),
                };
                Ok((r.try_get(0)?, r.try_get(1)?, agent))
            })
        })
    }

    fn append_events(&self, tenant: &TenantId, events: &[NewEvent], now_ms: i64) -> Tx<Vec<Event>> {
        append_events_tx(self.0, tenant, events, now_ms)
    }

    fn lock_tenant(&self, tenant: &str) -> Tx<()> {
        self.0.exec(LOCK_TENANT, &[&tenant])?;
        Ok(())
    }
}
