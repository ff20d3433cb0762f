//! [`Txn`] on SQLite: the shared bodies' reads and writes on a connection
//! (a reader's, or the writer's inside its `BEGIN IMMEDIATE` transaction),
//! every statement cached on the connection, every [`Val`] bound as it is
//! (no copy).

use brood_core::{AgentName, TenantId};
use rusqlite::Connection;
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::rows::{agent_at, channel_from, collect, event_from, message_from, run_from};
use super::sql::STATEMENTS;
use super::steps::{append_events_tx, load_agent};
use super::{Fail, Tx};
use crate::txn::{PlanRow, Statements, Txn, Val};
use crate::types::{Agent, Channel, Event, Message, NewEvent, Run, Usage};

/// The shared bodies' view of a connection.
pub(crate) struct On<'a>(pub(super) &'a Connection);

impl rusqlite::ToSql for Val<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Val::Text(s) | Val::MaybeText(Some(s)) => ValueRef::Text(s.as_bytes()),
            Val::Int(i) | Val::MaybeInt(Some(i)) => ValueRef::Integer(i),
            Val::Real(r) => ValueRef::Real(r),
            Val::MaybeText(None) | Val::MaybeInt(None) => ValueRef::Null,
        }))
    }
}

fn bind<'p>(params: &'p [Val<'p>]) -> impl rusqlite::Params + 'p {
    rusqlite::params_from_iter(params.iter())
}

impl Txn for On<'_> {
    type Err = Fail;
    const LOCKS_TENANTS: bool = false;
    const SQL: &'static Statements = &STATEMENTS;

    fn exec(&self, sql: &str, params: &[Val<'_>]) -> Tx<u64> {
        let n = self.0.prepare_cached(sql)?.execute(bind(params))?;
        Ok(n as u64)
    }

    fn ints<const N: usize>(&self, sql: &str, params: &[Val<'_>]) -> Tx<[i64; N]> {
        Ok(self.0.prepare_cached(sql)?.query_row(bind(params), |r| {
            let mut out = [0; N];
            for (i, v) in out.iter_mut().enumerate() {
                *v = r.get(i)?;
            }
            Ok(out)
        })?)
    }

    fn usage(&self, sql: &str, params: &[Val<'_>]) -> Tx<Usage> {
        Ok(self.0.prepare_cached(sql)?.query_row(bind(params), |r| {
            Ok(Usage {
                tokens_in: r.get::<_, i64>(0)?.max(0).unsigned_abs(),
                tokens_out: r.get::<_, i64>(1)?.max(0).unsigned_abs(),
                cost_usd: r.get(2)?,
            })
        })?)
    }

    fn pairs(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<(String, String)>> {
        collect(self.0, sql, bind(params), |r| Ok((r.get(0)?, r.get(1)?)))
    }

    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Tx<Option<Agent>> {
        load_agent(self.0, tenant, name)
    }

    fn agents(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Agent>> {
        collect(self.0, sql, bind(params), |r| agent_at(r, 0))
    }

    fn runs(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Run>> {
        collect(self.0, sql, bind(params), run_from)
    }

    fn channels(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Channel>> {
        collect(self.0, sql, bind(params), channel_from)
    }

    fn messages(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Message>> {
        collect(self.0, sql, bind(params), message_from)
    }

    fn events(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<Event>> {
        collect(self.0, sql, bind(params), event_from)
    }

    fn texts(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<String>> {
        collect(self.0, sql, bind(params), |r| Ok(r.get(0)?))
    }

    fn named_ints(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<(String, i64)>> {
        collect(self.0, sql, bind(params), |r| Ok((r.get(0)?, r.get(1)?)))
    }

    fn plan(&self, sql: &str, params: &[Val<'_>]) -> Tx<Vec<PlanRow>> {
        collect(self.0, sql, bind(params), |r| {
            let agent = match r.get::<_, Option<String>>(2)? {
                None => None,
                Some(_) => Some(agent_at(r, 2)?),
            };
            Ok((r.get(0)?, r.get(1)?, agent))
        })
    }

    fn append_events(&self, tenant: &TenantId, events: &[NewEvent], now_ms: i64) -> Tx<Vec<Event>> {
        append_events_tx(self.0, tenant, events, now_ms)
    }

    fn lock_tenant(&self, _tenant: &str) -> Tx<()> {
        // `BEGIN IMMEDIATE` already holds the file's one write lock.
        Ok(())
    }
}
