//! The statements of the records (transcripts, records, recovery, spend)
//! that PostgreSQL reads otherwise than SQLite, gathered with admission's
//! in [`STATEMENTS`] (this dialect's `crate::db::Statements`), and the
//! idempotency keys, ported from `sqlite::idempotency`.
//!
//! Most statements are `sqlite::sql`'s, read as PostgreSQL by `db::to_pg`.
//! Those written here differ where PostgreSQL reads the same text otherwise:
//! - ORDER BY on a name says `COLLATE "C"`: SQLite compares text bytewise,
//!   PostgreSQL by the database's collation, which (en_US and the like)
//!   ignores punctuation and case at first, so `a-b` and `ab`, `B` and `a`
//!   would come back in another order than on SQLite.
//! - the recursive walks cast their literal levels to BIGINT: PostgreSQL
//!   types `1` as INTEGER, and the level guard's parameter would then be an
//!   INTEGER, which an i64 cannot be bound to;
//! - the spend sums are cast back to BIGINT (`SUM(bigint)` is NUMERIC);
//! - `INSERT OR IGNORE` is `ON CONFLICT DO NOTHING`.

use brood_core::TenantId;
use tokio_postgres::Row;

use super::admission::{Q_ANCESTOR_OR_SELF, U_RUN_STARTED};
use super::{PgStore, Tx};
use crate::contract::Idempotency;
use crate::db::{Statements, narrow};
use crate::types::{IdempotentReply, Result};

/// SQLite's statements, but those PostgreSQL reads otherwise (see above
/// and `admission` for why each differs).
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

pub(super) const Q_CHILDREN: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND parent = ?2 ORDER BY created_ms, name COLLATE \"C\""
);
pub(super) const Q_AGENTS_ALL: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 ORDER BY created_ms, name COLLATE \"C\""
);
pub(super) const Q_AGENTS_UNFINISHED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name COLLATE \"C\""
);
pub(super) const Q_UNFINISHED_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " ORDER BY tenant COLLATE \"C\", created_ms, name COLLATE \"C\""
);
// The same index as `Q_UNFINISHED_OF` (its WHERE repeated), narrowed to the
// agents whose stop is recorded: what a supervisor carries out each tick.
pub(super) const Q_STOPPING_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " AND status LIKE 'stopping/%'",
    " ORDER BY tenant COLLATE \"C\", created_ms, name COLLATE \"C\""
);
// The collation is on the selected column, not in the ORDER BY: with
// DISTINCT, PostgreSQL orders only by what is selected.
pub(super) const Q_SUPERVISORS_WITH_UNFINISHED: &str = concat!(
    "SELECT DISTINCT supervisor COLLATE \"C\" FROM agents WHERE ",
    unfinished!(),
    " ORDER BY 1"
);
pub(super) const Q_TENANTS: &str = "SELECT id FROM tenants ORDER BY id COLLATE \"C\"";

// The parent-death plan. `walk` follows the edges' primary key (tenant, parent,
// child) one level at a time, carrying the level. It is a UNION, so a row already
// produced is not produced again, and the level guard stops it: a corrupt cycle
// keeps producing rows with ever higher levels until the guard, which is how it
// shows (a real tree never comes near it; the caller refuses the plan).
// `plan` keeps each agent once, at the deepest level it was reached. Ordering by
// that level, deepest first, is a post-order: an edge p -> c puts c at least one
// level below p, so every agent comes after all of its own descendants (even an
// agent that corruption gave two parents). Within a level, newest first, like
// unwinding a stack. An edge without an agent row (no `created_ms`) comes last
// in its level, where SQLite's NULL (the smallest value) puts it.
pub(super) const Q_DESCENDANTS: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT child, CAST(1 AS BIGINT) FROM edges WHERE tenant = ?1 AND parent = ?2",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name, level) AS (SELECT name, MAX(level) FROM walk GROUP BY name)",
    " SELECT plan.name, plan.level, ",
    agent_cols!("agents."),
    " FROM plan LEFT JOIN agents ON agents.tenant = ?1 AND agents.name = plan.name",
    " ORDER BY plan.level DESC, agents.created_ms DESC NULLS LAST, plan.name COLLATE \"C\" DESC"
);

// An agent's own spend: every run of it (the (tenant, agent, seq) index).
pub(super) const Q_OWN_USAGE: &str = "SELECT CAST(COALESCE(SUM(tokens_in), 0) AS BIGINT), \
     CAST(COALESCE(SUM(tokens_out), 0) AS BIGINT), COALESCE(SUM(cost_usd), 0.0) \
     FROM runs WHERE tenant = ?1 AND agent = ?2";
// Its subtree's: the walk of `Q_DESCENDANTS` (edges' primary key, level guard),
// then every run of each agent met, plus its own. The first row's types are
// given: PostgreSQL does not infer a column's type from the recursive term.
pub(super) const Q_SUBTREE_USAGE: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT CAST(?2 AS TEXT), CAST(0 AS BIGINT)",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name) AS (SELECT DISTINCT name FROM walk)",
    " SELECT CAST(COALESCE(SUM(runs.tokens_in), 0) AS BIGINT),",
    "  CAST(COALESCE(SUM(runs.tokens_out), 0) AS BIGINT),",
    "  COALESCE(SUM(runs.cost_usd), 0.0)",
    " FROM plan CROSS JOIN runs WHERE runs.tenant = ?1 AND runs.agent = plan.name"
);

// The idempotency keys (`sqlite::idempotency`'s statements, private there).
const Q_REPLY: &str = "SELECT caller, key, scope, request_hash, status, body, created_ms, expires_ms \
     FROM idempotency WHERE tenant = ?1 AND caller = ?2 AND key = ?3 AND expires_ms > ?4";
const D_EXPIRED: &str = "DELETE FROM idempotency WHERE tenant = ?1 AND expires_ms <= ?2";
// SQLite's `INSERT OR IGNORE`. A key another transaction is inserting makes
// this one wait for it and then do nothing, so the read after it sees the
// first answer (the tenant's lock already queues them; this holds without it).
const I_REPLY: &str = "INSERT INTO idempotency \
     (tenant, caller, key, scope, request_hash, status, body, created_ms, expires_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (tenant, caller, key) DO NOTHING";

fn reply_row(tenant: &TenantId, r: &Row) -> Tx<IdempotentReply> {
    Ok(IdempotentReply {
        tenant: tenant.clone(),
        caller: r.try_get(0)?,
        key: r.try_get(1)?,
        scope: r.try_get(2)?,
        request_hash: r.try_get(3)?,
        status: narrow(r.try_get(4)?, "idempotency.status")?,
        body: r.try_get(5)?,
        created_ms: r.try_get(6)?,
        expires_ms: r.try_get(7)?,
    })
}

impl Idempotency for PgStore {
    fn idempotent_reply(
        &self,
        tenant: &TenantId,
        caller: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<IdempotentReply>> {
        self.read(|db| {
            db.query_opt(Q_REPLY, &[&tenant.as_str(), &caller, &key, &now_ms])?
                .map(|r| reply_row(tenant, &r))
                .transpose()
        })
    }

    fn keep_idempotent_reply(
        &self,
        reply: &IdempotentReply,
        now_ms: i64,
    ) -> Result<IdempotentReply> {
        let tenant = &reply.tenant;
        let t = tenant.as_str();
        self.write(t, |db| {
            db.exec(D_EXPIRED, &[&t, &now_ms])?;
            db.exec(
                I_REPLY,
                &[
                    &t,
                    &reply.caller,
                    &reply.key,
                    &reply.scope,
                    &reply.request_hash,
                    &i64::from(reply.status),
                    &reply.body,
                    &reply.created_ms,
                    &reply.expires_ms,
                ],
            )?;
            reply_row(
                tenant,
                &db.query_one(Q_REPLY, &[&t, &reply.caller, &reply.key, &now_ms])?,
            )
        })
    }
}
