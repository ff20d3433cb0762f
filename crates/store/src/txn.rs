//! What the transaction bodies written once for both stores (`admission`,
//! `runs`, `records`) need of a store: [`Txn`], a few reads and writes on one
//! of its connections or transactions, with parameters given as [`Val`]s,
//! and [`Statements`], the SQL they run as that store speaks it. Each store
//! implements [`Txn`] once (`sqlite::txn`, `postgres::txn`); what differs
//! between them (binding, decoding, the event log's numbering) stays there.

use brood_core::{AgentName, TenantId};

use crate::types::{Agent, Channel, Event, Message, NewEvent, Run, StoreError, Usage};

/// The recursion guard of the descendants and ancestors walks. Depth quotas
/// stop far below this (SPEC 9 ceiling: 32); reaching it means the edges
/// (or the agents' parents) are corrupt.
pub(crate) const MAX_WALK_DEPTH: i64 = 10_000;

/// A value bound to a statement's parameter, borrowed from the caller: what
/// both drivers take without a copy.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Val<'a> {
    Text(&'a str),
    MaybeText(Option<&'a str>),
    Int(i64),
    MaybeInt(Option<i64>),
    Real(f64),
}

/// The statements the shared bodies run, in a store's SQL. SQLite's are
/// `sqlite::sql::STATEMENTS`; PostgreSQL's are the same but where its
/// dialect reads the text otherwise (collations, casts, JSON).
pub(crate) struct Statements {
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
    /// `?1` tenant, `?2` agent: its runs' usage summed.
    pub own_usage: &'static str,
    /// `?1` tenant, `?2` agent, `?3` the walk's guard: its subtree's usage.
    pub subtree_usage: &'static str,
    /// `?1` tenant, `?2` candidate, `?3` agent, `?4` guard: agents met on
    /// the walk up, whether the candidate was one (1 or 0), the top level.
    pub ancestor_or_self: &'static str,
    /// `?1` tenant, `?2` agent, `?3` guard: name, level, then the agent's
    /// columns (NULL for an edge without an agent), deepest first.
    pub descendants: &'static str,
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
    pub channel: &'static str,
    pub messages: &'static str,
    pub events: &'static str,
    pub events_of_agent: &'static str,
    pub last_event_seq: &'static str,
    pub tenant_quotas: &'static str,
    pub set_tenant_quota: &'static str,
}

/// A row of [`Statements::descendants`]: the name reached, its level, and
/// its agent (`None` for an edge without an agent row).
pub(crate) type PlanRow = (String, i64, Option<Agent>);

/// A store's connection or transaction, as the shared bodies use it. A body
/// that writes runs inside the store's transaction, which holds what makes
/// its reads still true at the commit (SQLite's write lock, PostgreSQL's
/// tenant lock).
pub(crate) trait Txn {
    type Err: From<StoreError>;
    /// Whether a transaction must lock a tenant before it reads that
    /// tenant's rows for good (PostgreSQL's advisory locks); SQLite's write
    /// lock covers every tenant at once.
    const LOCKS_TENANTS: bool;
    const SQL: &'static Statements;

    /// Runs `sql`; how many rows it changed.
    fn exec(&self, sql: &str, params: &[Val<'_>]) -> Result<u64, Self::Err>;
    /// The first `N` columns of the one row `sql` gives, each an integer.
    fn ints<const N: usize>(&self, sql: &str, params: &[Val<'_>]) -> Result<[i64; N], Self::Err>;
    /// The one row of a usage sum: tokens in, tokens out, cost.
    fn usage(&self, sql: &str, params: &[Val<'_>]) -> Result<Usage, Self::Err>;
    /// Every row of two text columns.
    fn pairs(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<(String, String)>, Self::Err>;
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>, Self::Err>;
    /// Every agent `sql` gives (its columns first, `agent_cols!` order).
    fn agents(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<Agent>, Self::Err>;
    fn runs(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<Run>, Self::Err>;
    fn channels(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<Channel>, Self::Err>;
    fn messages(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<Message>, Self::Err>;
    fn events(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<Event>, Self::Err>;
    /// Every row of one text column.
    fn texts(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<String>, Self::Err>;
    /// Every row of a text column and an integer one.
    fn named_ints(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<(String, i64)>, Self::Err>;
    /// The rows of [`Statements::descendants`].
    fn plan(&self, sql: &str, params: &[Val<'_>]) -> Result<Vec<PlanRow>, Self::Err>;
    /// Appends `events` to the tenant's log with the next numbers, after
    /// checking their payloads and that the agents they name exist.
    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>, Self::Err>;
    /// Takes `tenant`'s lock to the end of the transaction (only called
    /// when [`Txn::LOCKS_TENANTS`]).
    fn lock_tenant(&self, tenant: &str) -> Result<(), Self::Err>;

    fn int(&self, sql: &str, params: &[Val<'_>]) -> Result<i64, Self::Err> {
        self.ints::<1>(sql, params).map(|[v]| v)
    }

    fn exists(&self, tenant: &TenantId, name: &AgentName) -> Result<bool, Self::Err> {
        let [found] = self.ints(
            Self::SQL.agent_exists,
            &[Val::Text(tenant.as_str()), Val::Text(name.as_str())],
        )?;
        Ok(found != 0)
    }

    fn must_agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Agent, Self::Err> {
        self.agent(tenant, name)?
            .ok_or_else(|| not_found(tenant, name).into())
    }
}

pub(crate) fn refused(code: brood_core::Code, message: String) -> StoreError {
    StoreError::Refused { code, message }
}

pub(crate) fn not_found(tenant: &TenantId, name: &AgentName) -> StoreError {
    StoreError::NotFound {
        tenant: tenant.to_string(),
        name: name.to_string(),
    }
}
