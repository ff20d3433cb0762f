//! The SQL: the column lists (macros, so queries are assembled at compile
//! time), every statement the store runs, and the hot queries whose plans
//! `SqliteStore::query_plans` reports.

// The columns of an agent row, in the order `agent_at` reads them. A macro and not
// a const so the queries can be assembled with `concat!` at compile time; the
// prefix qualifies the columns where a join makes `name` ambiguous.
macro_rules! agent_cols {
    ($p:literal) => {
        concat!(
            $p,
            "tenant, ",
            $p,
            "name, ",
            $p,
            "parent, ",
            $p,
            "customer, ",
            $p,
            "root, ",
            $p,
            "depth, ",
            $p,
            "session, ",
            $p,
            "protocol, ",
            $p,
            "spec, ",
            $p,
            "status, ",
            $p,
            "detail, ",
            $p,
            "run, ",
            $p,
            "supervisor, ",
            $p,
            "created_ms, ",
            $p,
            "updated_ms"
        )
    };
}

// "Not finished": exactly the WHERE of the partial indexes (migration 5), which
// SQLite uses only when a query repeats the expression. No IN list: SQLite builds
// a temporary b-tree for an IN of more than two constants on every run.
macro_rules! unfinished {
    () => {
        unfinished!("")
    };
    ($p:literal) => {
        concat!(
            "(",
            $p,
            "status = 'queued' OR ",
            $p,
            "status = 'running' OR ",
            $p,
            "status = 'blocked' OR ",
            $p,
            "status LIKE 'stopping/%')"
        )
    };
}

// The columns of a run row, in the order `run_from` reads them.
macro_rules! run_cols {
    () => {
        "id, tenant, agent, seq, pid, cgroup, outcome, exit_code, result, \
         tokens_in, tokens_out, cost_usd, started_ms, ended_ms, created_ms"
    };
}

pub(crate) const Q_AGENT: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND name = ?2"
);
pub(crate) const Q_AGENT_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM agents WHERE tenant = ?1 AND name = ?2)";
pub(crate) const U_STATUS_DETAIL: &str = "UPDATE agents SET status = ?3, detail = ?4, updated_ms = ?5 \
     WHERE tenant = ?1 AND name = ?2";
pub(crate) const U_RUN_ENDED: &str = "UPDATE runs SET outcome = ?3, exit_code = ?4, result = ?5, ended_ms = ?6 \
     WHERE id = ?2 AND tenant = ?1";

pub(crate) const Q_CHILDREN: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND parent = ?2 ORDER BY created_ms, name"
);
pub(crate) const Q_AGENTS_ALL: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 ORDER BY created_ms, name"
);
pub(crate) const Q_AGENTS_UNFINISHED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name"
);
pub(crate) const Q_UNFINISHED_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " ORDER BY tenant, created_ms, name"
);
// The same index as `Q_UNFINISHED_OF` (its WHERE repeated), narrowed to the
// agents whose stop is recorded: what a supervisor carries out each tick.
pub(crate) const Q_STOPPING_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " AND status LIKE 'stopping/%' ORDER BY tenant, created_ms, name"
);
pub(crate) const Q_SUPERVISORS_WITH_UNFINISHED: &str = concat!(
    "SELECT DISTINCT supervisor FROM agents WHERE ",
    unfinished!(),
    " ORDER BY supervisor"
);

// The parent-death plan. `walk` follows the edges' primary key (tenant, parent,
// child) one level at a time, carrying the level. It is a UNION, so a row already
// produced is not produced again, and the level guard stops it: a corrupt cycle
// keeps producing rows with ever higher levels until the guard, which is how it
// shows (a real tree never comes near it; the caller refuses the plan).
// `plan` keeps each agent once, at the deepest level it was reached. Ordering by
// that level, deepest first, is a post-order: an edge p -> c puts c at least one
// level below p, so every agent comes after all of its own descendants (even an
// agent that corruption gave two parents). Within a level, newest first, like
// unwinding a stack.
// `CROSS JOIN` fixes the join order (SQLite's documented way): without it, and
// without table statistics, the planner may put `edges` outside and read every
// edge of the tenant at each step of the walk.
pub(crate) const Q_DESCENDANTS: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT child, 1 FROM edges WHERE tenant = ?1 AND parent = ?2",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name, level) AS (SELECT name, MAX(level) FROM walk GROUP BY name)",
    " SELECT plan.name, plan.level, ",
    agent_cols!("agents."),
    " FROM plan LEFT JOIN agents ON agents.tenant = ?1 AND agents.name = plan.name",
    " ORDER BY plan.level DESC, agents.created_ms DESC, plan.name DESC"
);

// Of the agents named in the JSON array ?2, those with an unfinished
// descendant, or whose walk is not whole (an edge without an agent row, a
// walk at the guard ?3: a cycle): what an ended agent's descendants need a
// stop planned for. One statement for a batch of ends, where each agent's
// plan (`Q_DESCENDANTS`) would be one, and most agents have no edge at all.
// `CROSS JOIN` keeps the walk's queue outside, as in `Q_DESCENDANTS`.
pub(crate) const Q_UNFINISHED_BELOW: &str = concat!(
    "WITH RECURSIVE walk(top, name, level) AS (",
    " SELECT edges.parent, edges.child, 1 FROM json_each(?2) AS tops CROSS JOIN edges",
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

// The fanout quota's count: a parent's unfinished children. The WHERE repeats
// `unfinished!` so the partial index of 0002_quotas.sql applies, and the index is
// named because without table statistics the planner may prefer
// `agents_by_parent`, which reaches every child ever created.
pub(crate) const Q_FANOUT: &str = concat!(
    "SELECT COUNT(*) FROM agents INDEXED BY agents_unfinished_by_parent",
    " WHERE tenant = ?1 AND parent = ?2 AND ",
    unfinished!()
);
// The tree-size quota's count: every agent ever created under a root, the root
// included; read from the (tenant, root) index alone.
pub(crate) const Q_TREE_SIZE: &str = "SELECT COUNT(*) FROM agents WHERE tenant = ?1 AND root = ?2";
// The cycle check: walk up from ?3 through the parents (the primary key at each
// step), stopping at ?2 when it is met and at the level guard ?4. Returns how many
// agents the walk met (0: ?3 does not exist), whether ?2 was among them, and the
// highest level reached (the guard: a parent chain that loops climbs to it).
// `CROSS JOIN` keeps the walk's queue outside, as in `Q_DESCENDANTS`.
pub(crate) const Q_ANCESTOR_OR_SELF: &str = concat!(
    "WITH RECURSIVE up(name, parent, level) AS (",
    " SELECT name, parent, 0 FROM agents WHERE tenant = ?1 AND name = ?3",
    " UNION ALL",
    " SELECT agents.name, agents.parent, up.level + 1 FROM up CROSS JOIN agents",
    "  WHERE agents.tenant = ?1 AND agents.name = up.parent",
    "   AND up.name <> ?2 AND up.level < ?4",
    ")",
    " SELECT COUNT(*), COALESCE(MAX(name = ?2), 0), COALESCE(MAX(level), 0) FROM up"
);
// A tenant's overrides: at most one row per key, found by the primary key. Not in
// `PLANNED`: its search is on `tenant` alone by design (the key is the rest of the
// primary key), which the plan test would take for reading all of a tenant's rows.
pub(crate) const Q_TENANT_QUOTAS: &str = "SELECT key, value FROM tenant_quotas WHERE tenant = ?1";

pub(crate) const Q_RUN: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE id = ?2 AND tenant = ?1"
);
pub(crate) const Q_RUNS: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE tenant = ?1 AND agent = ?2 ORDER BY seq"
);
pub(crate) const Q_TENANT_RUNS: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE tenant = ?1 ORDER BY agent, seq"
);
// The current runs of what a listing lists: the listing's own WHERE on the
// agents (the unfinished one repeats the partial indexes' expression), each
// run then found by its primary key. Joined from the agents, not `id IN
// (subquery)`: SQLite would read the tenant's every run for that, and a
// tenant's history is long where its unfinished agents are few.
macro_rules! current_runs {
    ($where:expr) => {
        concat!(
            "SELECT r.id, r.tenant, r.agent, r.seq, r.pid, r.cgroup, r.outcome, r.exit_code, \
             r.result, r.tokens_in, r.tokens_out, r.cost_usd, r.started_ms, r.ended_ms, \
             r.created_ms FROM agents AS a JOIN runs AS r ON r.id = a.run WHERE a.tenant = ?1",
            $where
        )
    };
}
pub(crate) const Q_CURRENT_RUNS_ALL: &str = current_runs!("");
pub(crate) const Q_CURRENT_RUNS_UNFINISHED: &str =
    current_runs!(concat!(" AND ", unfinished!("a.")));
pub(crate) const Q_CURRENT_RUNS_OF_CHILDREN: &str = current_runs!(" AND a.parent = ?2");
pub(crate) const Q_LAST_RUN_SEQ: &str =
    "SELECT COALESCE(MAX(seq), 0) FROM runs WHERE tenant = ?1 AND agent = ?2";
pub(crate) const Q_RUN_OF_AGENT: &str =
    "SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?3 AND tenant = ?1 AND agent = ?2)";
pub(crate) const Q_CHANNEL: &str = "SELECT channels.tenant, channels.parent, channels.parent_session, \
     channels.child, channels.child_session, channels.handoff, channels.result, agents.status, \
     channels.refs, channels.artifacts \
     FROM channels JOIN agents ON agents.tenant = channels.tenant AND agents.name = channels.child \
     WHERE channels.tenant = ?1 AND channels.parent = ?2 AND channels.child = ?3";
pub(crate) const Q_MESSAGES: &str = "SELECT tenant, agent, session, seq, run, role, content, ts_ms \
     FROM messages WHERE tenant = ?1 AND agent = ?2 AND session = ?3 ORDER BY seq";
// The tenant's last event: SQLite's min/max optimisation seeks the end of the
// tenant's range of the primary key (tenant, seq), one row. Not in `PLANNED`:
// the plan reads as a search on `tenant` alone, which the plan test would take
// for reading all of a tenant's rows.
pub(crate) const Q_LAST_EVENT_SEQ: &str =
    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE tenant = ?1";
pub(crate) const Q_LAST_MESSAGE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM messages \
     WHERE tenant = ?1 AND agent = ?2 AND session = ?3";
pub(crate) const Q_EVENTS: &str = "SELECT tenant, seq, ts_ms, agent, run, session, kind, payload \
     FROM events WHERE tenant = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";
// Without statistics the planner prefers the primary key's (tenant, seq) range,
// which reads every event of the tenant to find one agent's; the index is named.
pub(crate) const Q_EVENTS_OF_AGENT: &str = "SELECT tenant, seq, ts_ms, agent, run, session, kind, payload \
     FROM events INDEXED BY events_by_agent WHERE tenant = ?1 AND agent = ?4 AND seq > ?2 ORDER BY seq LIMIT ?3";
pub(crate) const Q_NEXT_SEQ: &str = "SELECT next_seq FROM tenants WHERE id = ?1";
pub(crate) const Q_TENANTS: &str = "SELECT id FROM tenants ORDER BY id";

pub(crate) const I_TENANT: &str =
    "INSERT INTO tenants (id, next_seq, created_ms) VALUES (?1, 1, ?2) ON CONFLICT (id) DO NOTHING";
pub(crate) const I_AGENT: &str = concat!(
    "INSERT INTO agents (",
    agent_cols!(""),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, ?11, ?12, ?13, ?13)"
);
pub(crate) const I_RUN: &str =
    "INSERT INTO runs (id, tenant, agent, seq, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)";
pub(crate) const I_EDGE: &str =
    "INSERT INTO edges (tenant, parent, child, created_ms) VALUES (?1, ?2, ?3, ?4)";
pub(crate) const I_CHANNEL: &str = "INSERT INTO channels \
     (tenant, parent, parent_session, child, child_session, handoff, result) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)";
pub(crate) const I_EVENT: &str = "INSERT INTO events (tenant, seq, ts_ms, agent, run, session, kind, payload) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
pub(crate) const I_MESSAGE: &str = "INSERT INTO messages (tenant, agent, session, seq, run, role, content, ts_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
pub(crate) const U_NEXT_SEQ: &str = "UPDATE tenants SET next_seq = ?2 WHERE id = ?1";
pub(crate) const U_STATUS: &str =
    "UPDATE agents SET status = ?3, updated_ms = ?4 WHERE tenant = ?1 AND name = ?2";
// The deadline is the start plus the `timeout_s` of the effective policy recorded
// in the agent's spec at admission (NULL, no deadline, when it has none), and
// never after the deadline of its parent's run (SPEC 5: a child ends no later
// than its parent's deadline; `timeout_s` is whole seconds, this is exact).
pub(crate) const U_RUN_STARTED: &str = "UPDATE runs SET pid = ?3, cgroup = ?4, started_ms = ?5, \
     deadline_ms = (SELECT MIN(?5 + 1000 * CAST(json_extract(c.spec, '$.policy.timeout_s') AS INTEGER), \
         COALESCE(pr.deadline_ms, ?5 + 1000 * CAST(json_extract(c.spec, '$.policy.timeout_s') AS INTEGER))) \
       FROM agents c LEFT JOIN agents p ON p.tenant = c.tenant AND p.name = c.parent \
       LEFT JOIN runs pr ON pr.tenant = p.tenant AND pr.id = p.run AND pr.ended_ms IS NULL \
       WHERE c.tenant = ?1 AND c.name = runs.agent) \
     WHERE id = ?2 AND tenant = ?1";
pub(crate) const U_RUN_USAGE: &str = "UPDATE runs SET tokens_in = ?3, tokens_out = ?4, cost_usd = ?5 \
     WHERE id = ?2 AND tenant = ?1";
pub(crate) const U_CHANNEL_RESULT: &str = "UPDATE channels SET result = ?4, refs = ?5, artifacts = ?6 \
     WHERE tenant = ?1 AND parent = ?2 AND child = ?3";
pub(crate) const I_TENANT_QUOTA: &str = "INSERT INTO tenant_quotas (tenant, key, value) VALUES (?1, ?2, ?3) \
     ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value";
pub(crate) const U_RESUMED: &str = "UPDATE agents SET status = ?3, detail = NULL, run = ?4, supervisor = ?5, \
     updated_ms = ?6 WHERE tenant = ?1 AND name = ?2";

// ---- create_limit and budgets (SPEC 9) -------------------------------------------

// `create_limit`: when the parent's current run was created, and the children
// it has created since (through `agents_by_parent`).
const Q_RUN_CREATED: &str = "SELECT created_ms FROM runs WHERE id = ?1";
const Q_CREATED_SINCE: &str = "SELECT COUNT(*) FROM agents INDEXED BY agents_by_parent \
     WHERE tenant = ?1 AND parent = ?2 AND created_ms >= ?3";
// A parent's unfinished children with their specs (the budget check), through
// the partial index of unfinished agents.
const Q_UNFINISHED_CHILDREN_SPECS: &str = concat!(
    "SELECT name, spec FROM agents INDEXED BY agents_unfinished_by_parent",
    " WHERE tenant = ?1 AND parent = ?2 AND ",
    unfinished!()
);

// ---- what SQLite says its own way of the nodes, the shares and the lease --------

// The store's clock, in milliseconds since the epoch: node expiry is judged on
// it (`crate::nodes`). 'now' is the same for the whole statement, so a node's
// start and its heartbeat are one time.
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

const U_HEARTBEAT: &str = crate::nodes::u_heartbeat!(now_ms!());

/// The hot queries whose plans [`SqliteStore::query_plans`] reports.
pub(crate) const PLANNED: &[(&str, &str)] = &[
    ("agent", Q_AGENT),
    ("agent_exists", Q_AGENT_EXISTS),
    ("children", Q_CHILDREN),
    ("descendants", Q_DESCENDANTS),
    ("unfinished_below", Q_UNFINISHED_BELOW),
    ("fanout", Q_FANOUT),
    ("tree_size", Q_TREE_SIZE),
    ("ancestor_or_self", Q_ANCESTOR_OR_SELF),
    ("agents_all", Q_AGENTS_ALL),
    ("agents_unfinished", Q_AGENTS_UNFINISHED),
    ("unfinished_of", Q_UNFINISHED_OF),
    ("stopping_of", Q_STOPPING_OF),
    ("supervisors_with_unfinished", Q_SUPERVISORS_WITH_UNFINISHED),
    ("run", Q_RUN),
    ("runs", Q_RUNS),
    ("tenant_runs", Q_TENANT_RUNS),
    ("current_runs_all", Q_CURRENT_RUNS_ALL),
    ("current_runs_unfinished", Q_CURRENT_RUNS_UNFINISHED),
    ("current_runs_of_children", Q_CURRENT_RUNS_OF_CHILDREN),
    ("last_run_seq", Q_LAST_RUN_SEQ),
    ("channel", Q_CHANNEL),
    ("messages", Q_MESSAGES),
    ("last_message_seq", Q_LAST_MESSAGE_SEQ),
    ("events", Q_EVENTS),
    ("events_of_agent", Q_EVENTS_OF_AGENT),
    ("next_seq", Q_NEXT_SEQ),
    ("any_placed", crate::nodes::Q_ANY_PLACED),
    ("any_input", crate::nodes::Q_ANY_INPUT),
];

/// The statements the bodies shared with PostgreSQL run (`crate::db`).
pub(crate) const STATEMENTS: crate::db::Statements = crate::db::Statements {
    agent: Q_AGENT,
    agent_exists: Q_AGENT_EXISTS,
    fanout: Q_FANOUT,
    tree_size: Q_TREE_SIZE,
    run_created: Q_RUN_CREATED,
    created_since: Q_CREATED_SINCE,
    unfinished_children_specs: Q_UNFINISHED_CHILDREN_SPECS,
    ancestor_or_self: Q_ANCESTOR_OR_SELF,
    descendants: Q_DESCENDANTS,
    unfinished_below: Q_UNFINISHED_BELOW,
    children: Q_CHILDREN,
    unfinished_of: Q_UNFINISHED_OF,
    status: U_STATUS,
    status_detail: U_STATUS_DETAIL,
    run_started: U_RUN_STARTED,
    run_ended: U_RUN_ENDED,
    run_usage: U_RUN_USAGE,
    channel_result: U_CHANNEL_RESULT,
    last_run_seq: Q_LAST_RUN_SEQ,
    insert_run: I_RUN,
    resumed: U_RESUMED,
    run_of_agent: Q_RUN_OF_AGENT,
    last_message_seq: Q_LAST_MESSAGE_SEQ,
    insert_message: I_MESSAGE,
    agents_all: Q_AGENTS_ALL,
    agents_unfinished: Q_AGENTS_UNFINISHED,
    stopping_of: Q_STOPPING_OF,
    supervisors_with_unfinished: Q_SUPERVISORS_WITH_UNFINISHED,
    tenants: Q_TENANTS,
    run: Q_RUN,
    runs: Q_RUNS,
    tenant_runs: Q_TENANT_RUNS,
    current_runs_all: Q_CURRENT_RUNS_ALL,
    current_runs_unfinished: Q_CURRENT_RUNS_UNFINISHED,
    current_runs_of_children: Q_CURRENT_RUNS_OF_CHILDREN,
    channel: Q_CHANNEL,
    messages: Q_MESSAGES,
    events: Q_EVENTS,
    events_of_agent: Q_EVENTS_OF_AGENT,
    last_event_seq: Q_LAST_EVENT_SEQ,
    tenant_quotas: Q_TENANT_QUOTAS,
    set_tenant_quota: I_TENANT_QUOTA,
    // `BEGIN IMMEDIATE` already holds the write lock: the row as it is, no
    // row locks, SQLite's own byte order.
    lease_fenced: crate::sweeps::Q_LEASE,
    register_node: crate::nodes::u_node!(now_ms!()),
    heartbeat: U_HEARTBEAT,
    placed: crate::nodes::q_placed!("", ""),
    take_inbox: crate::nodes::d_take_inbox!(""),
    nodes: crate::nodes::q_nodes!("", now_ms!()),
    slot_shares: crate::shares::q_shares!(""),
};
