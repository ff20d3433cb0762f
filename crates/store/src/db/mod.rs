//! The one transaction both stores offer, for the logic written once over
//! it (`admission`, `runs`, `records`, `jobs`, `sweeps`, `nodes`, `shares`,
//! `blobs`, `removal`, ...): statements with typed parameters ([`Value`]),
//! rows read by typed columns ([`Row`]), the statements that differ by
//! dialect ([`Statements`]), and the few steps each store does its own way
//! (events appended, a tenant locked). SQLite implements it once on its
//! connection (`sqlite::db`; a write's transaction is that connection),
//! PostgreSQL once on its transaction or connection (`postgres::db`).
//!
//! The SQL is the standard both speak, with `?N` parameters (PostgreSQL
//! reads them as `$N`, `postgres::db::to_pg`). Every integer is an i64 on
//! both sides (PostgreSQL's columns are all BIGINT), so a value is narrowed
//! with [`narrow`] where a record holds a smaller one. What only one store
//! can say (a lock clause, a collation, `GREATEST`) stays in its module and
//! reaches the shared logic as the statement to run.

use brood_core::{AgentName, TenantId};

mod rows;

use crate::types::{Agent, Channel, Event, Message, NewEvent, Run, StoreError, Usage};
pub(crate) use rows::{agent_at, channel_from, event_from, message_from, run_from};

/// The recursion guard of the descendants and ancestors walks. Depth quotas
/// stop far below this (SPEC 9 ceiling: 32); reaching it means the edges
/// (or the agents' parents) are corrupt.
pub(crate) const MAX_WALK_DEPTH: i64 = 10_000;

/// A statement's parameter: the few kinds the store's columns hold, each
/// typed even when NULL (PostgreSQL checks a parameter's type).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<&'a str>),
    Bytes(&'a [u8]),
}

impl From<i64> for Value<'_> {
    fn from(v: i64) -> Self {
        Value::Int(Some(v))
    }
}

impl From<u32> for Value<'_> {
    fn from(v: u32) -> Self {
        Value::Int(Some(i64::from(v)))
    }
}

impl From<Option<i64>> for Value<'_> {
    fn from(v: Option<i64>) -> Self {
        Value::Int(v)
    }
}

impl From<f64> for Value<'_> {
    fn from(v: f64) -> Self {
        Value::Real(Some(v))
    }
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(v: &'a str) -> Self {
        Value::Text(Some(v))
    }
}

impl<'a> From<&'a String> for Value<'a> {
    fn from(v: &'a String) -> Self {
        Value::Text(Some(v))
    }
}

impl<'a> From<Option<&'a str>> for Value<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Value::Text(v)
    }
}

impl<'a> From<&'a [u8]> for Value<'a> {
    fn from(v: &'a [u8]) -> Self {
        Value::Bytes(v)
    }
}

/// One row of an answer, read column by column (from 0).
pub(crate) trait Row {
    type Err: From<StoreError>;
    fn int(&self, i: usize) -> Result<i64, Self::Err>;
    fn int_opt(&self, i: usize) -> Result<Option<i64>, Self::Err>;
    fn real(&self, i: usize) -> Result<f64, Self::Err>;
    fn text(&self, i: usize) -> Result<String, Self::Err>;
    fn text_opt(&self, i: usize) -> Result<Option<String>, Self::Err>;
    fn bytes(&self, i: usize) -> Result<Vec<u8>, Self::Err>;
}

/// The statements the shared logic runs where the two dialects read the
/// same text otherwise (collations, casts, JSON, `GREATEST`, row locks):
/// SQLite's are `sqlite::sql::STATEMENTS`, PostgreSQL's
/// `postgres::sql::STATEMENTS`. A table of `&str`s rather than an
/// associated const per statement: PostgreSQL's is SQLite's with the few
/// that differ replaced (`..sqlite::sql::STATEMENTS`), which shows at one
/// glance which statements are each dialect's own. A statement both read
/// alike stays a constant beside the logic that runs it.
pub(crate) struct Statements {
    /// `?1` tenant, `?2` name: the agent's columns (`agent_cols!`).
    pub agent: &'static str,
    /// `?1` tenant, `?2` name: whether the agent exists.
    pub agent_exists: &'static str,
    /// `?1` tenant, `?2` parent: its unfinished children.
    pub fanout: &'static str,
    /// `?1` tenant, `?2` root: every agent ever created under it.
    pub tree_size: &'static str,
    /// `?1` run: when it was created.
    pub run_created: &'static str,
    /// `?1` tenant, `?2` parent, `?3` since: its children created since.
    pub created_since: &'static str,
    /// `?1` tenant, `?2` parent: its unfinished children's names and specs.
    pub unfinished_children_specs: &'static str,
    /// `?1` tenant, `?2` candidate, `?3` agent, `?4` guard: agents met on
    /// the walk up, whether the candidate was one (1 or 0), the top level.
    pub ancestor_or_self: &'static str,
    /// `?1` tenant, `?2` agent, `?3` guard: name, level, then the agent's
    /// columns (NULL for an edge without an agent), deepest first.
    pub descendants: &'static str,
    /// `?1` tenant, `?2` names (a JSON array), `?3` guard: those of the
    /// names with an unfinished descendant or a walk not whole.
    pub unfinished_below: &'static str,
    /// `?1` tenant, `?2` parent: its children, in creation order.
    pub children: &'static str,
    /// `?1` supervisor: its unfinished agents.
    pub unfinished_of: &'static str,
    pub status: &'static str,
    pub status_detail: &'static str,
    pub run_started: &'static str,
    pub run_ended: &'static str,
    pub run_usage: &'static str,
    pub channel_result: &'static str,
    pub last_run_seq: &'static str,
    pub insert_run: &'static str,
    pub resumed: &'static str,
    pub run_of_agent: &'static str,
    pub last_message_seq: &'static str,
    pub insert_message: &'static str,
    pub agents_all: &'static str,
    pub agents_unfinished: &'static str,
    pub stopping_of: &'static str,
    pub supervisors_with_unfinished: &'static str,
    pub tenants: &'static str,
    pub run: &'static str,
    pub runs: &'static str,
    pub tenant_runs: &'static str,
    /// `?1` tenant: the current run of every agent, of every unfinished
    /// one, and (`?2` parent) of every child (`Records::current_runs`).
    pub current_runs_all: &'static str,
    pub current_runs_unfinished: &'static str,
    pub current_runs_of_children: &'static str,
    pub channel: &'static str,
    pub messages: &'static str,
    pub events: &'static str,
    pub events_of_agent: &'static str,
    pub last_event_seq: &'static str,
    pub tenant_quotas: &'static str,
    pub set_tenant_quota: &'static str,
    /// `?1` lease: the lease row inside a sweeper's write, as the fence
    /// reads it (PostgreSQL keeps it as read until the commit).
    pub lease_fenced: &'static str,
    /// `?1` id, `?2` address, `?3` labels, `?4` capacity: a node
    /// registered at the store's time, which it returns (`nodes::u_node!`).
    pub register_node: &'static str,
    /// `?1` node: its heartbeat at the store's time (`nodes::u_heartbeat!`).
    pub heartbeat: &'static str,
    /// `?1` tenant, `?2` `placed_on(node)`, `?3` limit: the agents placed
    /// on a node, oldest first, locked as read where nodes race for them.
    pub placed: &'static str,
    /// `?1` host, `?2` tenant, `?3` limit: the oldest inputs for a host's
    /// agents, taken (deleted and returned).
    pub take_inbox: &'static str,
    /// Every node with its unfinished agents and its heartbeat's age on the
    /// store's clock, by id in byte order.
    pub nodes: &'static str,
    /// `?1` tenant: every slot share, by holder in byte order.
    pub slot_shares: &'static str,
}

/// Whether the agents a batch of events names are known to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// Not known: each is checked, and a missing one refuses the lot.
    No,
    /// Each was read by the transaction appending them, which keeps it.
    Read,
}

/// A row of [`Statements::descendants`]: the name reached, its level, and
/// its agent (`None` for an edge without an agent row).
pub(crate) type PlanRow = (String, i64, Option<Agent>);

/// Where the shared logic's SQL runs: a store's transaction (or, for a
/// read, its connection). The store opens, locks and commits it; the
/// shared logic only reads and writes inside. A body that writes runs
/// inside the store's transaction, which holds what makes its reads still
/// true at the commit (SQLite's write lock, PostgreSQL's tenant lock).
pub(crate) trait Db: Sized {
    type Err: From<StoreError>;
    /// The caller's error inside `e`, when `e` is one the shared logic made
    /// (a refusal, a missing row: no statement failed, so the transaction
    /// goes on); `Err(e)` back when a statement failed.
    fn refusal(e: Self::Err) -> Result<StoreError, Self::Err>;
    type Row<'r>: Row<Err = Self::Err>;
    /// Whether a transaction must lock a tenant before it reads that
    /// tenant's rows for good (PostgreSQL's advisory locks); SQLite's write
    /// lock covers every tenant at once.
    const LOCKS_TENANTS: bool;
    /// The statements this store's dialect reads its own way.
    const SQL: &'static Statements;

    /// Runs `sql`; how many rows it changed.
    fn exec(&self, sql: &str, params: &[Value<'_>]) -> Result<u64, Self::Err>;

    /// Every row `sql` gives, each decoded by `each`, in order.
    fn query<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        each: impl FnMut(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<Vec<T>, Self::Err>;

    /// The one row `sql` gives (a lookup by key), decoded by `one`, or none.
    /// More than one row is an error on PostgreSQL; SQLite takes the first.
    fn query_opt<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<Option<T>, Self::Err>;

    /// The row `sql` always gives (an aggregate, `EXISTS`), decoded by `one`.
    fn query_one<T>(
        &self,
        sql: &str,
        params: &[Value<'_>],
        one: impl FnOnce(&Self::Row<'_>) -> Result<T, Self::Err>,
    ) -> Result<T, Self::Err> {
        self.query_opt(sql, params, one)?.ok_or_else(|| {
            StoreError::Corrupt {
                what: "an answer of one row",
                value: format!("no row from {sql}"),
            }
            .into()
        })
    }

    /// Appends `events` to the tenant's log with its next sequence numbers,
    /// after checking their payloads and that the agents they name exist,
    /// inside this transaction: each store numbers them its own way.
    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>, Self::Err> {
        let timed: Vec<(&NewEvent, i64)> = events.iter().map(|e| (e, now_ms)).collect();
        self.append_timed(tenant, &timed, Known::No)
    }

    /// [`Db::append_events`] of events that happened at different times
    /// (each with its own), as a batch of starts or ends gathers them: one
    /// numbering for the lot. With [`Known::Read`] the agents they name were
    /// read by this transaction, so their existence is not checked again.
    fn append_timed(
        &self,
        tenant: &TenantId,
        events: &[(&NewEvent, i64)],
        known: Known,
    ) -> Result<Vec<Event>, Self::Err>;

    /// Takes `tenant`'s lock to the end of the transaction (only called
    /// when [`Db::LOCKS_TENANTS`]).
    fn lock_tenant(&self, tenant: &str) -> Result<(), Self::Err>;

    // The reads below are the same on both stores, given the steps above.

    /// The integer of the one row `sql` gives (a count, `EXISTS`).
    fn int(&self, sql: &str, params: &[Value<'_>]) -> Result<i64, Self::Err> {
        self.query_one(sql, params, |r| r.int(0))
    }

    /// The first `N` columns of the one row `sql` gives, each an integer.
    fn ints<const N: usize>(&self, sql: &str, params: &[Value<'_>]) -> Result<[i64; N], Self::Err> {
        self.query_one(sql, params, |r| {
            let mut out = [0; N];
            for (i, v) in out.iter_mut().enumerate() {
                *v = r.int(i)?;
            }
            Ok(out)
        })
    }

    /// The one row of a usage sum: tokens in, tokens out, cost.
    fn usage(&self, sql: &str, params: &[Value<'_>]) -> Result<Usage, Self::Err> {
        self.query_one(sql, params, |r| {
            Ok(Usage {
                tokens_in: r.int(0)?.max(0).unsigned_abs(),
                tokens_out: r.int(1)?.max(0).unsigned_abs(),
                cost_usd: r.real(2)?,
            })
        })
    }

    /// Every row of two text columns.
    fn pairs(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<(String, String)>, Self::Err> {
        self.query(sql, params, |r| Ok((r.text(0)?, r.text(1)?)))
    }

    /// Every row of one text column.
    fn texts(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<String>, Self::Err> {
        self.query(sql, params, |r| r.text(0))
    }

    /// Every row of a text column and an integer one.
    fn named_ints(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<(String, i64)>, Self::Err> {
        self.query(sql, params, |r| Ok((r.text(0)?, r.int(1)?)))
    }

    /// The agent `name`, if `tenant` has it.
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>, Self::Err> {
        let params = [tenant.as_str().into(), name.as_str().into()];
        self.query_opt(Self::SQL.agent, &params, |r| agent_at(r, 0))
    }

    /// The agent `name`, or not found.
    fn must_agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Agent, Self::Err> {
        self.agent(tenant, name)?
            .ok_or_else(|| not_found(tenant, name).into())
    }

    /// Whether `tenant` has an agent `name`.
    fn exists(&self, tenant: &TenantId, name: &AgentName) -> Result<bool, Self::Err> {
        let params = [tenant.as_str().into(), name.as_str().into()];
        Ok(self.int(Self::SQL.agent_exists, &params)? != 0)
    }

    /// Every agent `sql` gives (its columns first, `agent_cols!` order).
    fn agents(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Agent>, Self::Err> {
        self.query(sql, params, |r| agent_at(r, 0))
    }

    fn runs(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Run>, Self::Err> {
        self.query(sql, params, |r| run_from(r))
    }

    fn channels(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Channel>, Self::Err> {
        self.query(sql, params, |r| channel_from(r))
    }

    fn messages(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Message>, Self::Err> {
        self.query(sql, params, |r| message_from(r))
    }

    fn events(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Event>, Self::Err> {
        self.query(sql, params, |r| event_from(r))
    }

    /// The rows of [`Statements::descendants`].
    fn plan(&self, sql: &str, params: &[Value<'_>]) -> Result<Vec<PlanRow>, Self::Err> {
        self.query(sql, params, |r| {
            let agent = match r.text_opt(2)? {
                None => None,
                Some(_) => Some(agent_at(r, 2)?),
            };
            Ok((r.text(0)?, r.int(1)?, agent))
        })
    }
}

/// An i64 column's value narrowed to `T`, or a corrupt value naming it.
pub(crate) fn narrow<T: TryFrom<i64>>(v: i64, what: &'static str) -> Result<T, StoreError> {
    T::try_from(v).map_err(|_| StoreError::Corrupt {
        what,
        value: v.to_string(),
    })
}

/// A count or size as a column's i64 (saturating: none reaches 2^63).
pub(crate) fn int(n: impl TryInto<i64>) -> Value<'static> {
    Value::Int(Some(n.try_into().unwrap_or(i64::MAX)))
}

/// A text column parsed into a name or id, or a corrupt value naming it.
pub(crate) fn parse<T, E>(
    what: &'static str,
    s: String,
    new: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, StoreError> {
    new(&s).map_err(|_| StoreError::Corrupt { what, value: s })
}

/// The agent `name` of `tenant` was not found.
pub(crate) fn not_found(tenant: &TenantId, name: &AgentName) -> StoreError {
    StoreError::NotFound {
        tenant: tenant.to_string(),
        name: name.to_string(),
    }
}
