//! The statements PostgreSQL reads otherwise than SQLite, gathered in
//! [`STATEMENTS`] (this dialect's `crate::db::Statements`).
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
//! - SQLite's two-argument `MIN` is `LEAST`, and the WHERE of a JSON
//!   path is `jsonb`'s;
//! - the store's clock, which node expiry is judged on (`crate::nodes`), is
//!   the server's `statement_timestamp()`;
//! - where nodes race for rows (a claim, a take) they are read
//!   `FOR UPDATE SKIP LOCKED`, so two nodes never get one row and never
//!   wait on each other; a sweeper's fence reads the lease `FOR SHARE`.

use crate::db::Statements;

// The store's clock, in milliseconds since the epoch: the server's, never a
// node's. `statement_timestamp()` rather than `clock_timestamp()`: one value for
// the whole statement, so a node's start and its heartbeat are one time and
// every node read is aged against the same instant.
macro_rules! now_ms {
    () => {
        "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)"
    };
}

/// SQLite's statements, but those PostgreSQL reads otherwise (see above
/// and beside each for why it differs).
pub(crate) const STATEMENTS: Statements = Statements {
    ancestor_or_self: Q_ANCESTOR_OR_SELF,
    descendants: Q_DESCENDANTS,
    unfinished_below: Q_UNFINISHED_BELOW,
    children: Q_CHILDREN,
    unfinished_of: Q_UNFINISHED_OF,
    agents_all: Q_AGENTS_ALL,
    agents_unfinished: Q_AGENTS_UNFINISHED,
    stopping_of: Q_STOPPING_OF,
    supervisors_with_unfinished: Q_SUPERVISORS_WITH_UNFINISHED,
    tenants: Q_TENANTS,
    run_started: U_RUN_STARTED,
    lease_fenced: Q_LEASE_FOR_SHARE,
    register_node: crate::nodes::u_node!(now_ms!()),
    heartbeat: U_HEARTBEAT,
    placed: crate::nodes::q_placed!(" COLLATE \"C\"", " FOR UPDATE SKIP LOCKED"),
    take_inbox: crate::nodes::d_take_inbox!(" FOR UPDATE SKIP LOCKED"),
    nodes: crate::nodes::q_nodes!(" COLLATE \"C\"", now_ms!()),
    slot_shares: crate::shares::q_shares!(" COLLATE \"C\""),
    ..crate::sqlite::sql::STATEMENTS
};

// The cycle check: walk up from ?3 through the parents (the primary key at each
// step), stopping at ?2 when it is met and at the level guard ?4. Returns how many
// agents the walk met (0: ?3 does not exist), whether ?2 was among them, and the
// highest level reached (the guard: a parent chain that loops climbs to it).
// Rewritten from SQLite's: PostgreSQL has no MAX of a boolean (`bool_or`
// instead), and the level is BIGINT in both terms of the recursive CTE (they
// must agree), so `?4` is BIGINT and takes an i64.
const Q_ANCESTOR_OR_SELF: &str = "WITH RECURSIVE up(name, parent, level) AS (\
     SELECT name, parent, CAST(0 AS BIGINT) FROM agents WHERE tenant = ?1 AND name = ?3 \
     UNION ALL \
     SELECT agents.name, agents.parent, up.level + 1 FROM up CROSS JOIN agents \
      WHERE agents.tenant = ?1 AND agents.name = up.parent \
       AND up.name <> ?2 AND up.level < ?4\
     ) \
     SELECT COUNT(*), COALESCE(bool_or(name = ?2), FALSE), \
      CAST(COALESCE(MAX(level), 0) AS BIGINT) FROM up";

// The deadline is the start plus the `timeout_s` of the effective policy recorded
// in the agent's spec at admission (NULL, no deadline, when it has none).
// Rewritten from SQLite's `json_extract`: the spec is read as `jsonb`, and only a
// JSON number counts (truncated to whole seconds, as SQLite's CAST does), so an
// odd value gives no deadline instead of failing the cast and the whole start.
// Capped at the deadline of the parent's run, as SQLite's is (LEAST skips a
// NULL: a parent without a deadline caps nothing, and a run without a timeout
// keeps none).
const U_RUN_STARTED: &str = "UPDATE runs SET pid = ?3, cgroup = ?4, started_ms = ?5, \
     deadline_ms = (SELECT CASE WHEN own.ms IS NULL THEN NULL ELSE LEAST(own.ms, pr.deadline_ms) END \
       FROM agents c \
       CROSS JOIN LATERAL (SELECT ?5 + 1000 * (CASE \
         WHEN jsonb_typeof(CAST(c.spec AS jsonb) #> '{policy,timeout_s}') = 'number' \
         THEN CAST(trunc(CAST(CAST(c.spec AS jsonb) #>> '{policy,timeout_s}' AS NUMERIC)) AS BIGINT) \
         END) AS ms) AS own \
       LEFT JOIN agents p ON p.tenant = c.tenant AND p.name = c.parent \
       LEFT JOIN runs pr ON pr.tenant = p.tenant AND pr.id = p.run AND pr.ended_ms IS NULL \
       WHERE c.tenant = ?1 AND c.name = runs.agent) \
     WHERE id = ?2 AND tenant = ?1";

const U_HEARTBEAT: &str = crate::nodes::u_heartbeat!(now_ms!());

// Inside a sweeper's write: the row stays as read until the write commits
// (an `acquire_lease` meanwhile waits for it).
const Q_LEASE_FOR_SHARE: &str = "SELECT name, holder, epoch FROM leases WHERE name = ?1 FOR SHARE";

const Q_CHILDREN: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND parent = ?2 ORDER BY created_ms, name COLLATE \"C\""
);
const Q_AGENTS_ALL: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 ORDER BY created_ms, name COLLATE \"C\""
);
const Q_AGENTS_UNFINISHED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name COLLATE \"C\""
);
const Q_UNFINISHED_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " ORDER BY tenant COLLATE \"C\", created_ms, name COLLATE \"C\""
);
// The same index as `Q_UNFINISHED_OF` (its WHERE repeated), narrowed to the
// agents whose stop is recorded: what a supervisor carries out each tick.
const Q_STOPPING_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " AND status LIKE 'stopping/%'",
    " ORDER BY tenant COLLATE \"C\", created_ms, name COLLATE \"C\""
);
// The collation is on the selected column, not in the ORDER BY: with
// DISTINCT, PostgreSQL orders only by what is selected.
const Q_SUPERVISORS_WITH_UNFINISHED: &str = concat!(
    "SELECT DISTINCT supervisor COLLATE \"C\" FROM agents WHERE ",
    unfinished!(),
    " ORDER BY 1"
);
const Q_TENANTS: &str = "SELECT id FROM tenants ORDER BY id COLLATE \"C\"";

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
const Q_DESCENDANTS: &str = concat!(
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

// `sqlite::sql::Q_UNFINISHED_BELOW`: the names' JSON array read by
// PostgreSQL's JSON functions (the parameter a TEXT, which the client
// binds a string to), the literal level a BIGINT (above).
const Q_UNFINISHED_BELOW: &str = concat!(
    "WITH RECURSIVE walk(top, name, level) AS (",
    " SELECT edges.parent, edges.child, CAST(1 AS BIGINT)",
    "  FROM json_array_elements_text(CAST(CAST(?2 AS TEXT) AS JSON)) AS tops(value) CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = tops.value",
    " UNION",
    " SELECT walk.top, edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    ")",
    " SELECT DISTINCT walk.top FROM walk",
    " LEFT JOIN agents ON agents.tenant = ?1 AND agents.name = walk.name",
    " WHERE walk.level >= ?3 OR agents.name IS NULL OR ",
    unfinished!("agents.")
);
