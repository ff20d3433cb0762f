//! The SQLite implementation of [`Store`]: one database file (SPEC 14).
//!
//! Durability. The file is in WAL mode with `synchronous=NORMAL` by default: a
//! committed transaction survives a crash of the process (the WAL is in the OS page
//! cache, which outlives the process), and that is what "written to the store
//! before it is acknowledged" needs, because a supervisor's own crash is the failure
//! the runtime recovers from. A power loss may lose the last transactions before
//! the next checkpoint; [`Options::synchronous_full`] makes every commit wait for
//! the disk (`synchronous=FULL`) when that matters more than latency.
//!
//! Concurrency. One connection behind a mutex serialises the threads of one
//! process. Every method that reads and then writes opens its transaction with
//! `BEGIN IMMEDIATE`, which takes the database's write lock before the first read,
//! so no transaction decides on a state that another writer is changing, and a
//! second writer (another thread's store, another process on the same file) waits
//! up to the 5 s `busy_timeout` instead of failing with `SQLITE_BUSY` halfway
//! through. Reads are single statements and see one consistent snapshot each.
//! Admissions queue in front of the connection, first come first served, and the
//! thread whose turn it is runs what is queued (up to `GROUP_MAX`) as one group
//! commit: one such transaction, with a savepoint per admission so that each
//! still succeeds or fails alone (`admit_grouped`). A thread of the store's own
//! copies the WAL back into the database, off the requesters' path
//! (`Checkpointer`).
//!
//! Schema. The SQL files under `schema/` are embedded, numbered and applied once
//! each, in order, every one in its own transaction, and recorded in
//! `schema_migrations`; opening an up-to-date file changes nothing.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brood_core::{
    AgentName, CancelReason, Code, Quotas, RunId, SessionName, Status, TenantId, TenantQuotas,
    Terminal,
};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior};

use crate::contract::{Admission, Records, Recovery, Runs, Sweeps, Transcripts};
use crate::types::{
    Agent, Artifact, Channel, EndItem, Event, Fence, Message, NewAgent, NewEvent, Protocol, Result,
    Run, RunEnd, Spend, StoreError, Usage,
};

/// The embedded migrations, in the order they apply. A version is never reused or
/// edited once released: a change is a new file.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("schema/0001_init.sql")),
    (2, include_str!("schema/0002_quotas.sql")),
    (3, include_str!("schema/0003_sweepers.sql")),
    (4, include_str!("schema/0004_channel_output.sql")),
    (5, include_str!("schema/0005_unfinished_without_in.sql")),
];

/// How many migrations this build embeds (and so the schema version of a store
/// it has opened).
pub const MIGRATION_COUNT: usize = MIGRATIONS.len();

/// How long a writer waits for another writer's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The recursion guard of the descendants and ancestors walks. Depth quotas stop
/// far below this (SPEC 9 ceiling: 32); reaching it means the edges (or the
/// agents' parents) are corrupt.
const MAX_WALK_DEPTH: i64 = 10_000;

/// How a [`SqliteStore`] opens its file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// `synchronous=FULL` instead of `NORMAL`: every commit is on the disk before
    /// it returns, so it survives a power loss too, at the price of an fsync per
    /// transaction. `NORMAL` already survives a crash of the process.
    pub synchronous_full: bool,
}

/// The plan SQLite chose for one of the store's hot queries (`EXPLAIN QUERY PLAN`),
/// for `brood doctor` and for the tests that pin "no full scans".
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// Which query: `agent`, `children`, `descendants`, ...
    pub name: &'static str,
    pub sql: &'static str,
    /// One line per plan step, as SQLite words it (`SEARCH agents USING ...`).
    pub steps: Vec<String>,
}

/// The store on one SQLite file.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// For error messages: every error names the file it happened in.
    path: String,
    /// Admissions waiting for their group commit, in arrival order.
    admissions: Mutex<Admissions>,
    /// Copies the WAL back into the database on its own thread; `None` when read
    /// only.
    checkpointer: Option<Checkpointer>,
}

/// After how many commits the checkpointer is woken. A lone admission writes
/// about 15 WAL frames, so this is about SQLite's default autocheckpoint of 1,000
/// frames.
const CHECKPOINT_EVERY: u32 = 64;

/// The writer's own autocheckpoint, which keeps the WAL bounded (~40 MiB). SQLite
/// starts the WAL over only at a write that finds it entirely copied back, and
/// under a steady stream of commits the checkpointer's passive rounds always leave
/// the last few frames behind; so the WAL grows to this size, and then one commit
/// runs a checkpoint that has only those few frames left to copy and sync, and the
/// WAL starts over. That is two small fsyncs on the requesters' path every ~600
/// lone admissions, instead of two large ones every ~65 (SQLite's default, 1,000
/// frames). It is also the whole checkpointing when the checkpointer falls behind
/// (a reader holding an old snapshot, a long busy spell).
const WAL_BACKSTOP_FRAMES: i64 = 10_000;

/// The background checkpointer. With `synchronous=NORMAL` a commit does not wait
/// for the disk, but SQLite's autocheckpoint runs in the committing thread, and it
/// fsyncs the WAL and the database: every thousand frames or so, one admission
/// waited for two fsyncs, milliseconds on a busy disk. Here a thread of its own,
/// on its own connection, runs the same `PASSIVE` checkpoint (it never blocks a
/// writer or a reader), so the fsyncs happen off the requesters' path. Durability
/// is unchanged: what a commit guarantees does not depend on who checkpoints.
struct Checkpointer {
    shared: Arc<(Mutex<CheckpointState>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct CheckpointState {
    commits: u32,
    stop: bool,
}

impl Checkpointer {
    fn start(path: &Path) -> rusqlite::Result<Checkpointer> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let shared = Arc::new((Mutex::new(CheckpointState::default()), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("brood-store-checkpoint".into())
            .spawn(move || checkpoint_loop(&conn, &theirs))
            .map_err(|e| sqlite_message(format!("could not start the checkpoint thread: {e}")))?;
        Ok(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }

    /// Counts `n` commits, and wakes the thread when enough have piled up.
    fn committed(&self, n: u32) {
        let (state, wake) = &*self.shared;
        let mut s = lock_ignoring_poison(state);
        s.commits = s.commits.saturating_add(n);
        if s.commits >= CHECKPOINT_EVERY {
            wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (state, wake) = &*self.shared;
        lock_ignoring_poison(state).stop = true;
        wake.notify_one();
        if let Some(t) = self.thread.take() {
            // A panic of the thread has nothing left to clean up: ignore it.
            let _ = t.join();
        }
    }
}

fn checkpoint_loop(conn: &Connection, shared: &(Mutex<CheckpointState>, Condvar)) {
    let (state, wake) = shared;
    loop {
        {
            let mut s = lock_ignoring_poison(state);
            while s.commits < CHECKPOINT_EVERY && !s.stop {
                s = wake.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            if s.stop {
                return;
            }
            s.commits = 0;
        }
        // A failure (SQLITE_BUSY while another connection checkpoints, an I/O
        // error) loses nothing: the WAL still holds every commit, and the next
        // round or the writer's backstop checkpoints it. Nobody to tell here.
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    }
}

/// The most admissions one group commit takes. Enough for a burst of requesters to
/// share one commit (the WAL frames of the index pages they all touch are written
/// once); few enough that the first of them does not wait long for the last.
const GROUP_MAX: usize = 64;

/// One admission waiting for a group commit. The request is owned because the
/// thread that runs it (the group's leader) may be another requester's.
struct Ticket {
    new: NewAgent,
    quotas: Option<Quotas>,
    events: Vec<NewEvent>,
    state: Mutex<TicketState>,
    wake: Condvar,
}

// One per ticket, inside its `Arc`, moved only when answered: boxing the answer
// would cost an allocation per admission to save nothing.
#[allow(clippy::large_enum_variant)]
enum TicketState {
    Waiting,
    /// The previous leader handed this ticket's thread the next group.
    Lead,
    Done(Result<Agent>),
}

/// The queue in front of the connection for admissions. It is FIFO, so under many
/// requesters each waits its turn instead of losing the mutex race again and again
/// (std's mutex is not fair); and whoever leads takes everything waiting, up to
/// `GROUP_MAX`, into one transaction, so many requesters share one commit.
#[derive(Default)]
struct Admissions {
    waiting: VecDeque<Arc<Ticket>>,
    /// A thread is running a group now; new tickets wait for it to hand over.
    leading: bool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

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

const Q_AGENT: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND name = ?2"
);
const Q_AGENT_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM agents WHERE tenant = ?1 AND name = ?2)";
const Q_CHILDREN: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND parent = ?2 ORDER BY created_ms, name"
);
const Q_AGENTS_ALL: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 ORDER BY created_ms, name"
);
const Q_AGENTS_UNFINISHED: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE tenant = ?1 AND ",
    unfinished!(),
    " ORDER BY created_ms, name"
);
const Q_UNFINISHED_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " ORDER BY tenant, created_ms, name"
);
// The same index as `Q_UNFINISHED_OF` (its WHERE repeated), narrowed to the
// agents whose stop is recorded: what a supervisor carries out each tick.
const Q_STOPPING_OF: &str = concat!(
    "SELECT ",
    agent_cols!(""),
    " FROM agents WHERE supervisor = ?1 AND ",
    unfinished!(),
    " AND status LIKE 'stopping/%' ORDER BY tenant, created_ms, name"
);
const Q_SUPERVISORS_WITH_UNFINISHED: &str = concat!(
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
const Q_DESCENDANTS: &str = concat!(
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

// The fanout quota's count: a parent's unfinished children. The WHERE repeats
// `unfinished!` so the partial index of 0002_quotas.sql applies, and the index is
// named because without table statistics the planner may prefer
// `agents_by_parent`, which reaches every child ever created.
const Q_FANOUT: &str = concat!(
    "SELECT COUNT(*) FROM agents INDEXED BY agents_unfinished_by_parent",
    " WHERE tenant = ?1 AND parent = ?2 AND ",
    unfinished!()
);
// The tree-size quota's count: every agent ever created under a root, the root
// included; read from the (tenant, root) index alone.
const Q_TREE_SIZE: &str = "SELECT COUNT(*) FROM agents WHERE tenant = ?1 AND root = ?2";
// The cycle check: walk up from ?3 through the parents (the primary key at each
// step), stopping at ?2 when it is met and at the level guard ?4. Returns how many
// agents the walk met (0: ?3 does not exist), whether ?2 was among them, and the
// highest level reached (the guard: a parent chain that loops climbs to it).
// `CROSS JOIN` keeps the walk's queue outside, as in `Q_DESCENDANTS`.
const Q_ANCESTOR_OR_SELF: &str = concat!(
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
const Q_TENANT_QUOTAS: &str = "SELECT key, value FROM tenant_quotas WHERE tenant = ?1";

const Q_RUN: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE id = ?2 AND tenant = ?1"
);
const Q_RUNS: &str = concat!(
    "SELECT ",
    run_cols!(),
    " FROM runs WHERE tenant = ?1 AND agent = ?2 ORDER BY seq"
);
const Q_LAST_RUN_SEQ: &str =
    "SELECT COALESCE(MAX(seq), 0) FROM runs WHERE tenant = ?1 AND agent = ?2";
const Q_RUN_OF_AGENT: &str =
    "SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?3 AND tenant = ?1 AND agent = ?2)";
const Q_CHANNEL: &str = "SELECT channels.tenant, channels.parent, channels.parent_session, \
     channels.child, channels.child_session, channels.handoff, channels.result, agents.status, \
     channels.refs, channels.artifacts \
     FROM channels JOIN agents ON agents.tenant = channels.tenant AND agents.name = channels.child \
     WHERE channels.tenant = ?1 AND channels.parent = ?2 AND channels.child = ?3";
const Q_MESSAGES: &str = "SELECT tenant, agent, session, seq, run, role, content, ts_ms \
     FROM messages WHERE tenant = ?1 AND agent = ?2 AND session = ?3 ORDER BY seq";
const Q_LAST_MESSAGE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM messages \
     WHERE tenant = ?1 AND agent = ?2 AND session = ?3";
const Q_EVENTS: &str = "SELECT tenant, seq, ts_ms, agent, run, session, kind, payload \
     FROM events WHERE tenant = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";
// Without statistics the planner prefers the primary key's (tenant, seq) range,
// which reads every event of the tenant to find one agent's; the index is named.
const Q_EVENTS_OF_AGENT: &str = "SELECT tenant, seq, ts_ms, agent, run, session, kind, payload \
     FROM events INDEXED BY events_by_agent WHERE tenant = ?1 AND agent = ?4 AND seq > ?2 ORDER BY seq LIMIT ?3";
const Q_NEXT_SEQ: &str = "SELECT next_seq FROM tenants WHERE id = ?1";
const Q_TENANTS: &str = "SELECT id FROM tenants ORDER BY id";

const I_TENANT: &str =
    "INSERT INTO tenants (id, next_seq, created_ms) VALUES (?1, 1, ?2) ON CONFLICT (id) DO NOTHING";
const I_AGENT: &str = concat!(
    "INSERT INTO agents (",
    agent_cols!(""),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, ?11, ?12, ?13, ?13)"
);
const I_RUN: &str =
    "INSERT INTO runs (id, tenant, agent, seq, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)";
const I_EDGE: &str =
    "INSERT INTO edges (tenant, parent, child, created_ms) VALUES (?1, ?2, ?3, ?4)";
const I_CHANNEL: &str = "INSERT INTO channels \
     (tenant, parent, parent_session, child, child_session, handoff, result) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)";
const I_EVENT: &str = "INSERT INTO events (tenant, seq, ts_ms, agent, run, session, kind, payload) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const I_MESSAGE: &str = "INSERT INTO messages (tenant, agent, session, seq, run, role, content, ts_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const U_NEXT_SEQ: &str = "UPDATE tenants SET next_seq = ?2 WHERE id = ?1";
const U_STATUS: &str =
    "UPDATE agents SET status = ?3, updated_ms = ?4 WHERE tenant = ?1 AND name = ?2";
const U_STATUS_DETAIL: &str = "UPDATE agents SET status = ?3, detail = ?4, updated_ms = ?5 \
     WHERE tenant = ?1 AND name = ?2";
// The deadline is the start plus the `timeout_s` of the effective policy recorded
// in the agent's spec at admission (NULL, no deadline, when it has none).
const U_RUN_STARTED: &str = "UPDATE runs SET pid = ?3, cgroup = ?4, started_ms = ?5, \
     deadline_ms = ?5 + 1000 * CAST(json_extract((SELECT spec FROM agents \
       WHERE agents.tenant = ?1 AND agents.name = runs.agent), '$.policy.timeout_s') AS INTEGER) \
     WHERE id = ?2 AND tenant = ?1";
const U_RUN_ENDED: &str = "UPDATE runs SET outcome = ?3, exit_code = ?4, result = ?5, ended_ms = ?6 \
     WHERE id = ?2 AND tenant = ?1";
const U_RUN_USAGE: &str = "UPDATE runs SET tokens_in = ?3, tokens_out = ?4, cost_usd = ?5 \
     WHERE id = ?2 AND tenant = ?1";
const U_CHANNEL_RESULT: &str = "UPDATE channels SET result = ?4, refs = ?5, artifacts = ?6 \
     WHERE tenant = ?1 AND parent = ?2 AND child = ?3";
const I_TENANT_QUOTA: &str = "INSERT INTO tenant_quotas (tenant, key, value) VALUES (?1, ?2, ?3) \
     ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value";
const U_RESUMED: &str = "UPDATE agents SET status = ?3, detail = NULL, run = ?4, supervisor = ?5, \
     updated_ms = ?6 WHERE tenant = ?1 AND name = ?2";

/// The hot queries whose plans [`SqliteStore::query_plans`] reports.
const PLANNED: &[(&str, &str)] = &[
    ("agent", Q_AGENT),
    ("agent_exists", Q_AGENT_EXISTS),
    ("children", Q_CHILDREN),
    ("descendants", Q_DESCENDANTS),
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
    ("last_run_seq", Q_LAST_RUN_SEQ),
    ("channel", Q_CHANNEL),
    ("messages", Q_MESSAGES),
    ("last_message_seq", Q_LAST_MESSAGE_SEQ),
    ("events", Q_EVENTS),
    ("events_of_agent", Q_EVENTS_OF_AGENT),
    ("next_seq", Q_NEXT_SEQ),
];

/// A failure inside a transaction, before it is given the file's path. It lets the
/// transaction bodies use `?` on rusqlite calls and on the store's own refusals
/// alike; [`Fail::at`] turns it into a [`StoreError`] at the method's edge.
enum Fail {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Fail {
        Fail::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Fail {
        Fail::Store(e)
    }
}

impl Fail {
    fn at(self, path: &str) -> StoreError {
        match self {
            Fail::Sql(source) => StoreError::Sqlite {
                path: path.to_owned(),
                source,
            },
            Fail::Store(e) => e,
        }
    }
}

type Tx<T> = std::result::Result<T, Fail>;

fn refused(code: Code, message: String) -> Fail {
    Fail::Store(StoreError::Refused { code, message })
}

fn not_found(tenant: &TenantId, name: &AgentName) -> Fail {
    Fail::Store(StoreError::NotFound {
        tenant: tenant.to_string(),
        name: name.to_string(),
    })
}

fn corrupt(what: &'static str, value: impl Into<String>) -> Fail {
    Fail::Store(StoreError::Corrupt {
        what,
        value: value.into(),
    })
}

/// An error SQLite did not raise but that belongs with its errors (opening and
/// migrating the file), so it travels in the same variants with the path.
fn sqlite_message(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(message),
    )
}

impl SqliteStore {
    /// Opens (creating it if needed) the store file with the default [`Options`]
    /// and brings its schema up to date.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_with(path, Options::default())
    }

    /// Opens (creating it if needed) the store file and brings its schema up to
    /// date. Several stores, in one process or several, may open the same file.
    pub fn open_with(path: &Path, options: Options) -> Result<SqliteStore> {
        let shown = path.display().to_string();
        let sql = |source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        };
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql)?;
        configure(&conn).map_err(sql)?;
        // WAL is a property of the file (it sticks); setting it again is a no-op.
        // Switching a fresh file to WAL needs an exclusive lock, and SQLite answers
        // SQLITE_BUSY at once there instead of calling the busy handler, so when
        // several stores open a new file together, retry for the busy timeout.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let mode: String = loop {
            match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                r => break r.map_err(sql)?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(sql(sqlite_message(format!(
                "could not switch to WAL journal mode (SQLite kept {mode:?})"
            ))));
        }
        let sync = if options.synchronous_full {
            "FULL"
        } else {
            "NORMAL"
        };
        conn.pragma_update(None, "synchronous", sync).map_err(sql)?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_BACKSTOP_FRAMES)
            .map_err(sql)?;
        migrate(&mut conn, &shown)?;
        let checkpointer = Checkpointer::start(path).map_err(sql)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            path: shown,
            admissions: Mutex::default(),
            checkpointer: Some(checkpointer),
        })
    }

    /// Opens an existing store file for reading only, for CLI commands that only
    /// look. Fails, naming the path, when the file does not exist, and when its
    /// schema is older than this build (a read-only open cannot migrate it).
    /// Every mutating method of the result fails with SQLite's "readonly database".
    pub fn open_read_only(path: &Path) -> Result<SqliteStore> {
        let shown = path.display().to_string();
        let sql = |source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        };
        // SQLite's own message for a missing file is "unable to open database
        // file", which does not say that the file is missing; say it.
        if !path.exists() {
            return Err(sql(sqlite_message(
                "the file does not exist (nothing has been stored there yet)".to_owned(),
            )));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql)?;
        configure(&conn).map_err(sql)?;
        conn.pragma_update(None, "query_only", true).map_err(sql)?;
        let latest = latest_version();
        let version = applied_version(&conn).map_err(sql)?;
        if version < latest {
            return Err(StoreError::Migration {
                path: shown.clone(),
                version: version + 1,
                source: sqlite_message(format!(
                    "schema is at version {version}, this build needs {latest}; \
                     open it read-write once to migrate it"
                )),
            });
        }
        if version > latest {
            return Err(newer_schema(&shown, version));
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            path: shown,
            admissions: Mutex::default(),
            checkpointer: None,
        })
    }

    /// The file this store is on, as shown in its error messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `EXPLAIN QUERY PLAN` of the store's hot queries, as SQLite would run them
    /// on this file now.
    pub fn query_plans(&self) -> Result<Vec<QueryPlan>> {
        self.read(|conn| {
            let mut out = Vec::with_capacity(PLANNED.len());
            for (name, sql) in PLANNED {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                // The plan does not depend on the values, so every parameter is
                // bound to NULL.
                for i in 1..=stmt.parameter_count() {
                    stmt.raw_bind_parameter(i, rusqlite::types::Null)?;
                }
                let mut rows = stmt.raw_query();
                let mut steps = Vec::new();
                while let Some(row) = rows.next()? {
                    steps.push(row.get::<_, String>(3)?);
                }
                out.push(QueryPlan { name, sql, steps });
            }
            Ok(out)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while the lock was held dropped that thread's transaction, which
        // rolled it back, so the connection is as good as before: keep using it.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction and commits it; any error
    /// rolls everything back (the transaction is dropped uncommitted).
    fn write<T>(&self, body: impl FnOnce(&Transaction<'_>) -> Tx<T>) -> Result<T> {
        let mut conn = self.lock();
        let run = |conn: &mut Connection| -> Tx<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = body(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        let out = run(&mut conn).map_err(|f| f.at(&self.path))?;
        self.committed(1);
        Ok(out)
    }

    /// Tells the checkpointer about `n` more commits.
    fn committed(&self, n: u32) {
        if let Some(c) = &self.checkpointer {
            c.committed(n);
        }
    }

    fn read<T>(&self, body: impl FnOnce(&Connection) -> Tx<T>) -> Result<T> {
        let conn = self.lock();
        body(&conn).map_err(|f| f.at(&self.path))
    }

    /// Admission through the group commit: queue the request, and either lead the
    /// next group (the queue was idle, or the previous leader handed over) or wait
    /// for a leader to run it. Each admission stays all-or-nothing on its own: it
    /// runs in its own savepoint, inside the group's `BEGIN IMMEDIATE` transaction,
    /// after the admissions queued before it, whose writes it sees (so the quota
    /// counts stay exact), and it is answered only once the group has committed.
    fn admit_grouped(
        &self,
        new: &NewAgent,
        quotas: Option<&Quotas>,
        events: &[NewEvent],
    ) -> Result<Agent> {
        let me = Arc::new(Ticket {
            new: new.clone(),
            quotas: quotas.copied(),
            events: events.to_vec(),
            state: Mutex::new(TicketState::Waiting),
            wake: Condvar::new(),
        });
        let lead = {
            let mut q = lock_ignoring_poison(&self.admissions);
            q.waiting.push_back(Arc::clone(&me));
            !std::mem::replace(&mut q.leading, true)
        };
        if !lead {
            let mut state = lock_ignoring_poison(&me.state);
            loop {
                match std::mem::replace(&mut *state, TicketState::Waiting) {
                    TicketState::Done(answer) => return answer,
                    TicketState::Lead => break,
                    TicketState::Waiting => {
                        state = me.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                    }
                }
            }
        }
        // This ticket is the oldest waiting one, so the group taken now holds it.
        let tickets = {
            let mut q = lock_ignoring_poison(&self.admissions);
            let n = q.waiting.len().min(GROUP_MAX);
            q.waiting.drain(..n).collect()
        };
        let mut group = Group {
            store: self,
            tickets,
        };
        let answers = self.admit_group(&group.tickets);
        // Counted per admission, not per commit: the frames a commit writes grow
        // with its group.
        let admitted = answers.iter().filter(|a| a.is_ok()).count();
        self.committed(u32::try_from(admitted).unwrap_or(u32::MAX));
        for (t, answer) in group.tickets.iter().zip(answers) {
            if Arc::ptr_eq(t, &me) {
                *lock_ignoring_poison(&t.state) = TicketState::Done(answer);
            } else {
                answer_ticket(t, answer);
            }
        }
        drop(std::mem::take(&mut group.tickets));
        drop(group);
        match std::mem::replace(&mut *lock_ignoring_poison(&me.state), TicketState::Waiting) {
            TicketState::Done(answer) => answer,
            // Unreachable: the group held this ticket and every ticket of a group
            // is answered; say so rather than panic.
            TicketState::Waiting | TicketState::Lead => Err(StoreError::Sqlite {
                path: self.path.clone(),
                source: sqlite_message(format!(
                    "admission of agent {} led its group commit but got no answer",
                    new.name
                )),
            }),
        }
    }

    /// Runs `tickets` in one `BEGIN IMMEDIATE` transaction and commits it: one
    /// answer per ticket, in order. With several tickets, each runs in its own
    /// savepoint, so a refused or failing admission rolls back alone; if SQLite
    /// cannot roll back one savepoint, or the transaction itself fails (begin,
    /// commit, SQLite abandoning it after an I/O error), nothing of the group is
    /// committed and every admission that would have been gets that error.
    fn admit_group(&self, tickets: &[Arc<Ticket>]) -> Vec<Result<Agent>> {
        let mut conn = self.lock();
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                return tickets
                    .iter()
                    .map(|_| Err(self.group_failed("begin", &e)))
                    .collect();
            }
        };
        if let [t] = tickets {
            // Alone: the transaction is the admission, as in `write`.
            let answer = admit_tx(&tx, &t.new, t.quotas.as_ref(), &t.events)
                .and_then(|a| tx.commit().map(|()| a).map_err(Fail::from));
            return vec![answer.map_err(|f| f.at(&self.path))];
        }
        let mut answers: Vec<Tx<Agent>> = Vec::with_capacity(tickets.len());
        for t in tickets {
            match admit_in_savepoint(&tx, t) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    // The transaction is dropped, which rolls the whole group back.
                    drop(tx);
                    return self.group_lost(answers, tickets.len(), "savepoint", &e);
                }
            }
        }
        if let Err(e) = tx.commit() {
            return self.group_lost(answers, tickets.len(), "commit", &e);
        }
        answers
            .into_iter()
            .map(|a| a.map_err(|f| f.at(&self.path)))
            .collect()
    }

    /// The answers of a group that committed nothing: the refusals and failures
    /// stand (nothing of theirs would have been written anyway), the admissions
    /// that had succeeded, and those not run yet, fail with `error`.
    fn group_lost(
        &self,
        answers: Vec<Tx<Agent>>,
        len: usize,
        step: &str,
        error: &rusqlite::Error,
    ) -> Vec<Result<Agent>> {
        let ran = answers.len();
        answers
            .into_iter()
            .map(|a| match a {
                Ok(_) => Err(self.group_failed(step, error)),
                Err(f) => Err(f.at(&self.path)),
            })
            .chain((ran..len).map(|_| Err(self.group_failed(step, error))))
            .collect()
    }

    /// One requester's copy of the error that failed its whole group, with the
    /// SQLite code kept so callers can still tell a busy file from a full disk.
    fn group_failed(&self, step: &str, error: &rusqlite::Error) -> StoreError {
        let message = format!("group commit of admissions failed at {step}: {error}");
        let source = match error {
            rusqlite::Error::SqliteFailure(code, _) => {
                rusqlite::Error::SqliteFailure(*code, Some(message))
            }
            _ => sqlite_message(message),
        };
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these mutexes is never left half-updated by a panic (each
    // update is one assignment), so a poisoned lock is as good as a clean one.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn answer_ticket(t: &Ticket, answer: Result<Agent>) {
    *lock_ignoring_poison(&t.state) = TicketState::Done(answer);
    t.wake.notify_one();
}

/// One admission of a group, in its own savepoint. The outer error means the
/// savepoint itself could not be opened, released or rolled back, so the group's
/// transaction can no longer be trusted and must be abandoned whole.
fn admit_in_savepoint(tx: &Transaction<'_>, t: &Ticket) -> rusqlite::Result<Tx<Agent>> {
    // Cached like the admission's own statements: parsed once per connection.
    tx.prepare_cached("SAVEPOINT admission")?.execute([])?;
    let answer = admit_tx(tx, &t.new, t.quotas.as_ref(), &t.events);
    if answer.is_err() {
        tx.prepare_cached("ROLLBACK TO admission")?.execute([])?;
    }
    // After a rollback the savepoint is still open; releasing it closes it.
    tx.prepare_cached("RELEASE admission")?.execute([])?;
    Ok(answer)
}

/// The group a leader took off the queue. Dropping it, however the leader left
/// (even by a panic), answers any ticket still unanswered and hands the queue to
/// the oldest waiting ticket, so no requester waits forever.
struct Group<'a> {
    store: &'a SqliteStore,
    tickets: Vec<Arc<Ticket>>,
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        for t in &self.tickets {
            let mut state = lock_ignoring_poison(&t.state);
            if !matches!(*state, TicketState::Done(_)) {
                *state = TicketState::Done(Err(StoreError::Sqlite {
                    path: self.store.path.clone(),
                    source: sqlite_message(format!(
                        "admission of agent {} was not run: the thread leading its \
                         group commit panicked",
                        t.new.name
                    )),
                }));
                t.wake.notify_one();
            }
        }
        let mut q = lock_ignoring_poison(&self.store.admissions);
        match q.waiting.front() {
            Some(next) => {
                *lock_ignoring_poison(&next.state) = TicketState::Lead;
                next.wake.notify_one();
            }
            None => q.leading = false,
        }
    }
}

/// Per-connection settings (they do not stick to the file).
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // More distinct statements than the default cache of 16 are in use; a
    // statement evicted and prepared again on every call would waste the cache.
    conn.set_prepared_statement_cache_capacity(64);
    // The query planner stability guarantee: no plan depends on the value bound
    // to a parameter. Without it SQLite marks a parameter "re-prepare when
    // rebound" whenever it glances at its value (any `col = ?` beside an ORDER
    // BY), and rusqlite clears the bindings of every statement it takes back into
    // its cache, so such statements were compiled again on every use (measured:
    // the runs, messages and descendants reads of every spawn). brood's plans
    // come from its indexes, never from values: it keeps no statistics tables
    // and binds no LIKE patterns.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

fn newer_schema(path: &str, version: i64) -> StoreError {
    StoreError::Migration {
        path: path.to_owned(),
        version,
        source: sqlite_message(format!(
            "schema is at version {version}, newer than this build knows ({}); \
             refusing to use it",
            latest_version()
        )),
    }
}

/// The newest applied migration, 0 for a file that has none.
fn applied_version(conn: &Connection) -> rusqlite::Result<i64> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(0);
    }
    conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )
}

/// Applies the migrations the file lacks, each in its own `BEGIN IMMEDIATE`
/// transaction that checks again whether it is needed, so two processes opening
/// a new file at once apply each migration exactly once.
fn migrate(conn: &mut Connection, path: &str) -> Result<()> {
    let failed = |version, source| StoreError::Migration {
        path: path.to_owned(),
        version,
        source,
    };
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (\
           version INTEGER NOT NULL PRIMARY KEY, applied_ms INTEGER NOT NULL) STRICT",
    )
    .map_err(|e| failed(0, e))?;
    let version = applied_version(conn).map_err(|e| failed(0, e))?;
    if version > latest_version() {
        return Err(newer_schema(path, version));
    }
    for &(version, sql) in MIGRATIONS {
        let apply = |conn: &mut Connection| -> rusqlite::Result<()> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let done: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?1)",
                [version],
                |r| r.get(0),
            )?;
            if !done {
                tx.execute_batch(sql)?;
                // Bookkeeping only, so the store reads the clock here instead of
                // asking the caller for one.
                let now_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                tx.execute(
                    "INSERT INTO schema_migrations (version, applied_ms) VALUES (?1, ?2)",
                    [version, now_ms],
                )?;
            }
            tx.commit()
        };
        apply(conn).map_err(|e| failed(version, e))?;
    }
    Ok(())
}

// ---- row decoding -------------------------------------------------------------

fn parse_name<T>(
    what: &'static str,
    s: String,
    new: impl FnOnce(&str) -> std::result::Result<T, brood_core::NameError>,
) -> Tx<T> {
    new(&s).map_err(|_| corrupt(what, s))
}

fn decode_status(s: String) -> Tx<Status> {
    Status::decode(&s).ok_or_else(|| corrupt("agents.status", s))
}

/// Reads the agent columns (`agent_cols!`) starting at column `at`.
fn agent_at(row: &Row<'_>, at: usize) -> Tx<Agent> {
    let opt_name = |i: usize, what| -> Tx<Option<AgentName>> {
        row.get::<_, Option<String>>(at + i)?
            .map(|s| parse_name(what, s, AgentName::new))
            .transpose()
    };
    let depth: i64 = row.get(at + 5)?;
    let protocol: String = row.get(at + 7)?;
    Ok(Agent {
        tenant: parse_name("agents.tenant", row.get(at)?, TenantId::new)?,
        name: parse_name("agents.name", row.get(at + 1)?, AgentName::new)?,
        parent: opt_name(2, "agents.parent")?,
        customer: opt_name(3, "agents.customer")?,
        root: parse_name("agents.root", row.get(at + 4)?, AgentName::new)?,
        depth: u32::try_from(depth).map_err(|_| corrupt("agents.depth", depth.to_string()))?,
        session: parse_name("agents.session", row.get(at + 6)?, SessionName::new)?,
        protocol: Protocol::parse(&protocol).ok_or_else(|| corrupt("agents.protocol", protocol))?,
        spec: row.get(at + 8)?,
        status: decode_status(row.get(at + 9)?)?,
        detail: row.get(at + 10)?,
        run: parse_name("agents.run", row.get(at + 11)?, RunId::parse)?,
        supervisor: row.get(at + 12)?,
        created_ms: row.get(at + 13)?,
        updated_ms: row.get(at + 14)?,
    })
}

fn run_from(row: &Row<'_>) -> Tx<Run> {
    let seq: i64 = row.get(3)?;
    let pid: Option<i64> = row.get(4)?;
    let outcome: Option<String> = row.get(6)?;
    let exit_code: Option<i64> = row.get(7)?;
    let count = |i: usize, what| -> Tx<u64> {
        let v: i64 = row.get(i)?;
        u64::try_from(v).map_err(|_| corrupt(what, v.to_string()))
    };
    Ok(Run {
        id: parse_name("runs.id", row.get(0)?, RunId::parse)?,
        tenant: parse_name("runs.tenant", row.get(1)?, TenantId::new)?,
        agent: parse_name("runs.agent", row.get(2)?, AgentName::new)?,
        seq: u32::try_from(seq).map_err(|_| corrupt("runs.seq", seq.to_string()))?,
        pid: pid
            .map(|p| i32::try_from(p).map_err(|_| corrupt("runs.pid", p.to_string())))
            .transpose()?,
        cgroup: row.get(5)?,
        outcome: outcome
            .map(|o| Terminal::decode(&o).ok_or_else(|| corrupt("runs.outcome", o)))
            .transpose()?,
        exit_code: exit_code
            .map(|c| i32::try_from(c).map_err(|_| corrupt("runs.exit_code", c.to_string())))
            .transpose()?,
        result: row.get(8)?,
        tokens_in: count(9, "runs.tokens_in")?,
        tokens_out: count(10, "runs.tokens_out")?,
        cost_usd: row.get(11)?,
        started_ms: row.get(12)?,
        ended_ms: row.get(13)?,
        created_ms: row.get(14)?,
    })
}

fn event_from(row: &Row<'_>) -> Tx<Event> {
    let run: Option<String> = row.get(4)?;
    Ok(Event {
        tenant: parse_name("events.tenant", row.get(0)?, TenantId::new)?,
        seq: row.get(1)?,
        ts_ms: row.get(2)?,
        agent: parse_name("events.agent", row.get(3)?, AgentName::new)?,
        run: run
            .map(|r| parse_name("events.run", r, RunId::parse))
            .transpose()?,
        session: parse_name("events.session", row.get(5)?, SessionName::new)?,
        kind: row.get(6)?,
        payload: row.get(7)?,
    })
}

fn message_from(row: &Row<'_>) -> Tx<Message> {
    Ok(Message {
        tenant: parse_name("messages.tenant", row.get(0)?, TenantId::new)?,
        agent: parse_name("messages.agent", row.get(1)?, AgentName::new)?,
        session: parse_name("messages.session", row.get(2)?, SessionName::new)?,
        seq: row.get(3)?,
        run: parse_name("messages.run", row.get(4)?, RunId::parse)?,
        role: row.get(5)?,
        content: row.get(6)?,
        ts_ms: row.get(7)?,
    })
}

/// `channels.artifacts`: a JSON array of `{"name","sha256","size"}`.
fn encode_artifacts(a: &[Artifact]) -> String {
    serde_json::Value::Array(
        a.iter()
            .map(|a| serde_json::json!({"name": a.name, "sha256": a.sha256, "size": a.size}))
            .collect(),
    )
    .to_string()
}

fn decode_artifacts(text: &str) -> Tx<Vec<Artifact>> {
    let bad = || corrupt("channels.artifacts", text);
    let v: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
    let items = v.as_array().ok_or_else(bad)?;
    items
        .iter()
        .map(|a| {
            Ok(Artifact {
                name: a["name"].as_str().ok_or_else(bad)?.to_owned(),
                sha256: a["sha256"].as_str().ok_or_else(bad)?.to_owned(),
                size: a["size"].as_u64().ok_or_else(bad)?,
            })
        })
        .collect()
}

fn channel_from(row: &Row<'_>) -> Tx<Channel> {
    Ok(Channel {
        tenant: parse_name("channels.tenant", row.get(0)?, TenantId::new)?,
        parent: parse_name("channels.parent", row.get(1)?, AgentName::new)?,
        parent_session: parse_name("channels.parent_session", row.get(2)?, SessionName::new)?,
        child: parse_name("channels.child", row.get(3)?, AgentName::new)?,
        child_session: parse_name("channels.child_session", row.get(4)?, SessionName::new)?,
        handoff: row.get(5)?,
        result: row.get(6)?,
        status: decode_status(row.get(7)?)?,
        refs: row.get(8)?,
        artifacts: match row.get::<_, Option<String>>(9)? {
            None => Vec::new(),
            Some(text) => decode_artifacts(&text)?,
        },
    })
}

/// Runs a cached query and decodes every row with `decode`.
fn collect<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    decode: impl Fn(&Row<'_>) -> Tx<T>,
) -> Tx<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(decode(row)?);
    }
    Ok(out)
}

// ---- shared steps of the transactions -------------------------------------------

fn load_agent(conn: &Connection, tenant: &TenantId, name: &AgentName) -> Tx<Option<Agent>> {
    let mut stmt = conn.prepare_cached(Q_AGENT)?;
    let mut rows = stmt.query((tenant.as_str(), name.as_str()))?;
    match rows.next()? {
        Some(row) => Ok(Some(agent_at(row, 0)?)),
        None => Ok(None),
    }
}

fn must_agent(conn: &Connection, tenant: &TenantId, name: &AgentName) -> Tx<Agent> {
    load_agent(conn, tenant, name)?.ok_or_else(|| not_found(tenant, name))
}

fn agent_exists(conn: &Connection, tenant: &TenantId, name: &AgentName) -> Tx<bool> {
    Ok(conn
        .prepare_cached(Q_AGENT_EXISTS)?
        .query_row((tenant.as_str(), name.as_str()), |r| r.get(0))?)
}

/// Checks a move with the one transition function, naming the agent on refusal.
fn check_move(agent: &Agent, to: Status) -> Tx<Status> {
    agent.status.transition(to).map_err(|source| {
        Fail::Store(StoreError::Transition {
            name: agent.name.to_string(),
            source,
        })
    })
}

/// Refuses a call that names a run other than the agent's newest one: that run is
/// over, and acting on it would overwrite the newer run's record.
fn check_current_run(agent: &Agent, run: &RunId) -> Tx<()> {
    if agent.run == *run {
        Ok(())
    } else {
        Err(refused(
            Code::Conflict,
            format!(
                "run {run} is not the current run of agent {} (the current one is {})",
                agent.name, agent.run
            ),
        ))
    }
}

/// Text stored as JSON must be one JSON object; an event payload is also a line of
/// `events.jsonl`, so it must not contain a newline either.
fn check_json_object(what: impl FnOnce() -> String, text: &str, one_line: bool) -> Tx<()> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.is_object() && !(one_line && text.contains('\n')) => Ok(()),
        Ok(_) if one_line => Err(refused(
            Code::BadRequest,
            format!("{} must be a one-line JSON object", what()),
        )),
        Ok(_) => Err(refused(
            Code::BadRequest,
            format!("{} must be a JSON object", what()),
        )),
        Err(e) => Err(refused(
            Code::BadRequest,
            format!("{} is not JSON: {e}", what()),
        )),
    }
}

fn check_events(events: &[NewEvent]) -> Tx<()> {
    for e in events {
        check_json_object(
            || format!("payload of event {} of agent {}", e.kind, e.agent),
            &e.payload,
            true,
        )?;
    }
    Ok(())
}

/// Appends `events` to the tenant's log with the next sequence numbers. Runs inside
/// the caller's transaction, so the numbers and the change they describe commit
/// together, and `BEGIN IMMEDIATE` keeps two writers from taking the same numbers.
fn append_events_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    events: &[NewEvent],
    now_ms: i64,
) -> Tx<Vec<Event>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    check_events(events)?;
    for e in events {
        // The foreign key would refuse it too, with a message that names nothing.
        if !agent_exists(tx, tenant, &e.agent)? {
            return Err(not_found(tenant, &e.agent));
        }
    }
    let next: i64 = tx
        .prepare_cached(Q_NEXT_SEQ)?
        .query_row([tenant.as_str()], |r| r.get(0))?;
    let mut insert = tx.prepare_cached(I_EVENT)?;
    let mut out = Vec::with_capacity(events.len());
    for (seq, e) in (next..).zip(events) {
        insert.execute((
            tenant.as_str(),
            seq,
            now_ms,
            e.agent.as_str(),
            e.run.as_ref().map(RunId::as_str),
            e.session.as_str(),
            e.kind.as_str(),
            e.payload.as_str(),
        ))?;
        out.push(Event {
            tenant: tenant.clone(),
            seq,
            ts_ms: now_ms,
            agent: e.agent.clone(),
            run: e.run.clone(),
            session: e.session.clone(),
            kind: e.kind.clone(),
            payload: e.payload.clone(),
        });
    }
    let after = next + i64::try_from(events.len()).unwrap_or(i64::MAX);
    tx.prepare_cached(U_NEXT_SEQ)?
        .execute((tenant.as_str(), after))?;
    Ok(out)
}

/// Ends the agent's current run with `outcome`: the agent's status and detail, and
/// the run's outcome, exit code, result and end time. The caller has checked the
/// move.
fn write_end(
    tx: &Transaction<'_>,
    agent: &Agent,
    outcome: Terminal,
    exit_code: Option<i32>,
    result: Option<&str>,
    detail: Option<&str>,
    now_ms: i64,
) -> Tx<()> {
    let t = agent.tenant.as_str();
    tx.prepare_cached(U_STATUS_DETAIL)?.execute((
        t,
        agent.name.as_str(),
        Status::Ended(outcome).encode(),
        detail,
        now_ms,
    ))?;
    tx.prepare_cached(U_RUN_ENDED)?.execute((
        t,
        agent.run.as_str(),
        outcome.encode(),
        exit_code,
        result,
        now_ms,
    ))?;
    Ok(())
}

/// The `agent.stop` event line of SPEC 6 step 5, with the reason when there is one.
fn stop_event(agent: &Agent, outcome: Terminal) -> NewEvent {
    let mut payload = serde_json::Map::new();
    payload.insert("type".into(), "agent.stop".into());
    payload.insert("agent".into(), agent.name.as_str().into());
    payload.insert("status".into(), outcome.word().into());
    if let Some(reason) = outcome.reason() {
        payload.insert("reason".into(), reason.into());
    }
    NewEvent {
        agent: agent.name.clone(),
        run: Some(agent.run.clone()),
        session: agent.session.clone(),
        kind: "agent.stop".to_owned(),
        payload: serde_json::Value::Object(payload).to_string(),
    }
}

fn to_sql_count(n: u64) -> i64 {
    // No run reaches 2^63 tokens; saturating keeps the call infallible.
    i64::try_from(n).unwrap_or(i64::MAX)
}

// ---- the transactions -----------------------------------------------------------

/// Admission, with the quota checks when `quotas` is given (`admit_with_quotas`)
/// and without them (`admit`): one body, so the two can never disagree on
/// anything but the quotas.
fn admit_tx(
    tx: &Transaction<'_>,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Tx<Agent> {
    let t = &new.tenant;
    check_json_object(|| format!("spec of agent {}", new.name), &new.spec, false)?;
    // The refusals in a fixed order, so a request wrong in several ways always
    // gets the same answer: the parent, then the name, then the customer.
    let parent = match &new.parent {
        None => None,
        Some(p) => {
            let Some(pa) = load_agent(tx, t, p)? else {
                return Err(refused(
                    Code::ParentMismatch,
                    format!("parent {p} does not exist in tenant {t}"),
                ));
            };
            // A stopping parent is live but dying: a child admitted now would be
            // missed by the cascade already planned (SPEC 6 step 1).
            if !pa.status.is_live() || matches!(pa.status, Status::Stopping(_)) {
                return Err(refused(
                    Code::ParentMismatch,
                    format!(
                        "parent {p} is {}: children are admitted only under a running or blocked parent",
                        pa.status.encode()
                    ),
                ));
            }
            Some(pa)
        }
    };
    if agent_exists(tx, t, &new.name)? {
        return Err(refused(
            Code::NameTaken,
            format!("agent name {} is taken in tenant {t}", new.name),
        ));
    }
    if let Some(c) = &new.customer
        && !agent_exists(tx, t, c)?
    {
        return Err(refused(
            Code::ParentMismatch,
            format!("customer {c} does not exist in tenant {t}"),
        ));
    }
    if let Some(q) = quotas {
        check_quotas(tx, new, parent.as_ref(), q)?;
    }

    tx.prepare_cached(I_TENANT)?
        .execute((t.as_str(), new.now_ms))?;
    let (root, depth) = match &parent {
        Some(p) => (p.root.clone(), i64::from(p.depth) + 1),
        None => (new.name.clone(), 0),
    };
    tx.prepare_cached(I_AGENT)?.execute(rusqlite::params![
        t.as_str(),
        new.name.as_str(),
        new.parent.as_ref().map(AgentName::as_str),
        new.customer.as_ref().map(AgentName::as_str),
        root.as_str(),
        depth,
        new.session.as_str(),
        new.protocol.as_str(),
        new.spec,
        Status::Queued.encode(),
        new.run.as_str(),
        new.supervisor,
        new.now_ms,
    ])?;
    tx.prepare_cached(I_RUN)?.execute((
        new.run.as_str(),
        t.as_str(),
        new.name.as_str(),
        1,
        new.now_ms,
    ))?;
    if let Some(p) = &parent {
        tx.prepare_cached(I_EDGE)?.execute((
            t.as_str(),
            p.name.as_str(),
            new.name.as_str(),
            new.now_ms,
        ))?;
        tx.prepare_cached(I_CHANNEL)?.execute((
            t.as_str(),
            p.name.as_str(),
            p.session.as_str(),
            new.name.as_str(),
            new.session.as_str(),
            new.handoff.as_str(),
        ))?;
    }
    append_events_tx(tx, t, events, new.now_ms)?;
    // The row just inserted, built from the values it was inserted with: reading
    // it back cost a query and a decode of every column on each admission.
    Ok(Agent {
        tenant: t.clone(),
        name: new.name.clone(),
        parent: new.parent.clone(),
        customer: new.customer.clone(),
        root,
        depth: u32::try_from(depth).map_err(|_| corrupt("agents.depth", depth.to_string()))?,
        session: new.session.clone(),
        protocol: new.protocol,
        spec: new.spec.clone(),
        status: Status::Queued,
        detail: None,
        run: new.run.clone(),
        supervisor: new.supervisor.clone(),
        created_ms: new.now_ms,
        updated_ms: new.now_ms,
    })
}

/// The quota checks of SPEC 9, in the order documented on
/// `Store::admit_with_quotas`: depth, fanout, tree size. Reads only; the caller's
/// `BEGIN IMMEDIATE` holds the write lock, so no other admission can change a
/// count between this check and the insert that follows it.
fn check_quotas(
    tx: &Transaction<'_>,
    new: &NewAgent,
    parent: Option<&Agent>,
    q: &Quotas,
) -> Tx<()> {
    let t = &new.tenant;
    let name = &new.name;
    let Some(p) = parent else {
        // A root starts its own tree: depth 0 and no siblings, so only the tree
        // size applies, and its tree would hold just the root.
        if q.max_tree_size == 0 {
            return Err(refused(
                Code::QuotaTreeSize,
                format!(
                    "tree size quota: root {name} would start a tree of 1 agent \
                     in tenant {t}, and max_tree_size is 0"
                ),
            ));
        }
        return Ok(());
    };
    let depth = u64::from(p.depth) + 1;
    if depth > u64::from(q.max_depth) {
        return Err(refused(
            Code::QuotaDepth,
            format!(
                "depth quota: {name} would be at depth {depth} under {} (depth {}) \
                 in tenant {t}, and max_depth is {}",
                p.name, p.depth, q.max_depth
            ),
        ));
    }
    let fanout: i64 = tx
        .prepare_cached(Q_FANOUT)?
        .query_row((t.as_str(), p.name.as_str()), |r| r.get(0))?;
    if fanout >= i64::from(q.max_fanout) {
        return Err(refused(
            Code::QuotaFanout,
            format!(
                "fanout quota: parent {} in tenant {t} already has {fanout} unfinished \
                 children, and max_fanout is {}",
                p.name, q.max_fanout
            ),
        ));
    }
    let size: i64 = tx
        .prepare_cached(Q_TREE_SIZE)?
        .query_row((t.as_str(), p.root.as_str()), |r| r.get(0))?;
    if size >= i64::from(q.max_tree_size) {
        return Err(refused(
            Code::QuotaTreeSize,
            format!(
                "tree size quota: the tree of root {} in tenant {t} already holds {size} \
                 agents (every one ever created under it, finished or not, the root \
                 included), and max_tree_size is {}",
                p.root, q.max_tree_size
            ),
        ));
    }
    check_create_limit(tx, new, p)?;
    check_budget(tx, new, p)
}

/// The `policy.create_limit` recorded in a spec, if any.
fn create_limit_of(spec: &str) -> Option<u64> {
    if !spec.contains("\"create_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("create_limit")?
        .as_u64()
}

/// SPEC 5's `create_limit`, inside the admission transaction: the children the
/// parent's current run has created so far (read through `agents_by_parent`,
/// from the run's creation on) must be fewer than its limit. The supervisor
/// checks the same from memory first; this makes it exact when supervisors
/// sharing the store admit children of one parent at once.
fn check_create_limit(tx: &Transaction<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let Some(limit) = create_limit_of(&p.spec) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let since: i64 = tx
        .prepare_cached(Q_RUN_CREATED)?
        .query_row([p.run.as_str()], |r| r.get(0))?;
    let used: i64 = tx
        .prepare_cached(Q_CREATED_SINCE)?
        .query_row((t, p.name.as_str(), since), |r| r.get(0))?;
    if used as u64 >= limit {
        return Err(refused(
            Code::CreateLimit,
            format!(
                "create_limit: the parent {} has already created {used} of its {limit} children \
                 in this run (counted in the store, across every supervisor)",
                p.name
            ),
        ));
    }
    Ok(())
}

/// The `policy.cost_limit` recorded in a spec, if any.
fn cost_limit_of(spec: &str) -> Option<f64> {
    // Most specs name no limit: skip the parse then.
    if !spec.contains("\"cost_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("cost_limit")?
        .as_f64()
}

/// The budget of SPEC 9, inside the admission transaction: a child naming a
/// `cost_limit` reserves it from what its parent has left — the parent's limit,
/// less its subtree's spend, less what its unfinished children with limits have
/// reserved and not spent. The supervisor checks the same from memory first;
/// this makes it exact when supervisors sharing the store admit children of one
/// parent at once.
fn check_budget(tx: &Transaction<'_>, new: &NewAgent, p: &Agent) -> Tx<()> {
    let (Some(want), Some(limit)) = (cost_limit_of(&new.spec), cost_limit_of(&p.spec)) else {
        return Ok(());
    };
    let t = new.tenant.as_str();
    let subtree_cost = |name: &str| -> Tx<f64> {
        Ok(tx
            .prepare_cached(Q_SUBTREE_USAGE)?
            .query_row((t, name, MAX_WALK_DEPTH), |r| r.get::<_, f64>(2))?)
    };
    let spent = subtree_cost(p.name.as_str())?;
    let kids = collect(tx, Q_UNFINISHED_CHILDREN_SPECS, (t, p.name.as_str()), |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut held = 0.0;
    for (kid, spec) in kids {
        if let Some(cl) = cost_limit_of(&spec) {
            held += (cl - subtree_cost(&kid)?).max(0.0);
        }
    }
    let left = (limit - spent - held).max(0.0);
    if want > left + 1e-9 {
        return Err(refused(
            Code::BudgetExceeded,
            format!(
                "cost_limit: {want} is more than the parent's remaining budget {left} \
                 ({} has {limit}, its subtree spent {spent}, its live children hold {held})",
                p.name
            ),
        ));
    }
    Ok(())
}

fn mark_stopping_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    names: &[AgentName],
    outcome: Terminal,
    now_ms: i64,
) -> Tx<Vec<Agent>> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let agent = must_agent(tx, tenant, name)?;
        match agent.status {
            Status::Running | Status::Blocked => {
                let to = check_move(&agent, Status::Stopping(outcome))?;
                tx.prepare_cached(U_STATUS)?.execute((
                    tenant.as_str(),
                    name.as_str(),
                    to.encode(),
                    now_ms,
                ))?;
            }
            // No process yet, so nothing to stop: the run ends here.
            Status::Queued => {
                check_move(&agent, Status::Ended(outcome))?;
                write_end(
                    tx,
                    &agent,
                    outcome,
                    None,
                    None,
                    agent.detail.as_deref(),
                    now_ms,
                )?;
            }
            // Already stopping keeps the intent recorded first; finished stays.
            Status::Stopping(_) | Status::Ended(_) | Status::Closed(_) => {}
        }
        out.push(must_agent(tx, tenant, name)?);
    }
    Ok(out)
}

fn end_run_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    end: &RunEnd,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(tx, tenant, name)?;
    // The outcome recorded with the stop intent stands, whatever the process did.
    let outcome = match agent.status {
        Status::Stopping(t) => t,
        _ => end.outcome,
    };
    check_move(&agent, Status::Ended(outcome))?;
    check_current_run(&agent, run)?;
    write_end(
        tx,
        &agent,
        outcome,
        end.exit_code,
        end.result.as_deref(),
        end.detail.as_deref(),
        end.now_ms,
    )?;
    if let Some(parent) = &agent.parent {
        let out = end.output.as_ref();
        tx.prepare_cached(U_CHANNEL_RESULT)?.execute((
            tenant.as_str(),
            parent.as_str(),
            name.as_str(),
            end.result.as_deref(),
            out.map(|o| o.refs.as_str()),
            out.map(|o| encode_artifacts(&o.artifacts)),
        ))?;
    }
    append_events_tx(tx, tenant, events, end.now_ms)?;
    must_agent(tx, tenant, name)
}

fn resume_tx(
    tx: &Transaction<'_>,
    tenant: &TenantId,
    name: &AgentName,
    run: &RunId,
    supervisor: &str,
    now_ms: i64,
    events: &[NewEvent],
) -> Tx<Agent> {
    let agent = must_agent(tx, tenant, name)?;
    if !agent.status.is_finished() {
        return Err(refused(
            Code::Conflict,
            format!(
                "agent {name} is {}: only a finished (ended or closed) agent can be resumed",
                agent.status.encode()
            ),
        ));
    }
    // An owned child never outlives its parent: a child resumed under a parent
    // that is stopping or over would be missed by every cascade. A queued parent is
    // fine (a restart resumes parents and children together); its own end will
    // plan this child in.
    if let Some(p) = &agent.parent {
        let parent_status = load_agent(tx, tenant, p)?.map(|pa| pa.status);
        if !matches!(
            parent_status,
            Some(Status::Queued | Status::Running | Status::Blocked)
        ) {
            let shown = parent_status.map_or_else(|| "missing".to_owned(), Status::encode);
            return Err(refused(
                Code::ParentMismatch,
                format!("agent {name} cannot be resumed: its parent {p} is {shown}"),
            ));
        }
    }
    let to = check_move(&agent, Status::Queued)?;
    let last: i64 = tx
        .prepare_cached(Q_LAST_RUN_SEQ)?
        .query_row((tenant.as_str(), name.as_str()), |r| r.get(0))?;
    tx.prepare_cached(I_RUN)?.execute((
        run.as_str(),
        tenant.as_str(),
        name.as_str(),
        last + 1,
        now_ms,
    ))?;
    tx.prepare_cached(U_RESUMED)?.execute((
        tenant.as_str(),
        name.as_str(),
        to.encode(),
        run.as_str(),
        supervisor,
        now_ms,
    ))?;
    // The channel shows the current run: no result until this run ends (SPEC 4,
    // `result.md` only with a terminal status). The old result stays on its run.
    if let Some(p) = &agent.parent {
        tx.prepare_cached(U_CHANNEL_RESULT)?.execute((
            tenant.as_str(),
            p.as_str(),
            name.as_str(),
            None::<&str>,
            None::<&str>,
            None::<&str>,
        ))?;
    }
    append_events_tx(tx, tenant, events, now_ms)?;
    must_agent(tx, tenant, name)
}

fn recover_tx(tx: &Transaction<'_>, dead: &[String], now_ms: i64) -> Tx<Vec<Agent>> {
    let mut out = Vec::new();
    for supervisor in dead {
        let agents = collect(tx, Q_UNFINISHED_OF, [supervisor.as_str()], |r| {
            agent_at(r, 0)
        })?;
        for agent in agents {
            let (outcome, detail) = match agent.status {
                // The intent recorded before the crash is carried out.
                Status::Stopping(t) => (t, agent.detail.clone()),
                _ => (
                    Terminal::Cancelled(CancelReason::RuntimeRestart),
                    Some(format!("supervisor {supervisor} is gone (runtime restart)")),
                ),
            };
            check_move(&agent, Status::Ended(outcome))?;
            write_end(tx, &agent, outcome, None, None, detail.as_deref(), now_ms)?;
            append_events_tx(tx, &agent.tenant, &[stop_event(&agent, outcome)], now_ms)?;
            out.push(must_agent(tx, &agent.tenant, &agent.name)?);
        }
    }
    Ok(out)
}

// ---- budgets, leases and sweepers (SPEC 9) --------------------------------------

// An agent's own spend: every run of it (the (tenant, agent, seq) index).
const Q_OWN_USAGE: &str = "SELECT COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0), \
     COALESCE(SUM(cost_usd), 0.0) FROM runs WHERE tenant = ?1 AND agent = ?2";
// Its subtree's: the walk of `Q_DESCENDANTS` (edges' primary key, level guard),
// then every run of each agent met, plus its own.
const Q_SUBTREE_USAGE: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT ?2, 0",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name) AS (SELECT DISTINCT name FROM walk)",
    " SELECT COALESCE(SUM(runs.tokens_in), 0), COALESCE(SUM(runs.tokens_out), 0),",
    "  COALESCE(SUM(runs.cost_usd), 0.0)",
    " FROM plan CROSS JOIN runs WHERE runs.tenant = ?1 AND runs.agent = plan.name"
);
// A parent's unfinished children with their specs (the budget check), through
// the partial index of unfinished agents.
const Q_RUN_CREATED: &str = "SELECT created_ms FROM runs WHERE id = ?1";
const Q_CREATED_SINCE: &str = "SELECT COUNT(*) FROM agents INDEXED BY agents_by_parent \
     WHERE tenant = ?1 AND parent = ?2 AND created_ms >= ?3";
const Q_UNFINISHED_CHILDREN_SPECS: &str = concat!(
    "SELECT name, spec FROM agents INDEXED BY agents_unfinished_by_parent",
    " WHERE tenant = ?1 AND parent = ?2 AND ",
    unfinished!()
);
const Q_LEASE: &str = "SELECT name, holder, epoch FROM leases WHERE name = ?1";
const U_LEASE: &str = "INSERT INTO leases (name, holder, epoch, acquired_ms) VALUES (?1, ?2, 1, ?3) \
     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leases.epoch + 1, \
     acquired_ms = excluded.acquired_ms";
// Overdue runs, through the partial index of 0003_sweepers.sql; the agent must
// still be on that run and neither finished nor already stopping.
const Q_OVERDUE: &str = concat!(
    "SELECT ",
    agent_cols!("agents."),
    " FROM runs INDEXED BY runs_due CROSS JOIN agents",
    " WHERE runs.deadline_ms IS NOT NULL AND runs.ended_ms IS NULL AND runs.deadline_ms <= ?1",
    "  AND agents.tenant = runs.tenant AND agents.name = runs.agent AND agents.run = runs.id",
    "  AND (agents.status = 'queued' OR agents.status = 'running' OR agents.status = 'blocked')",
    " ORDER BY runs.deadline_ms LIMIT ?2"
);
// Orphans: the unfinished children (the partial index of 0002_quotas.sql holds
// exactly those, so this reads the live set, not history) whose parent is missing
// or finished. Stopping ones are left out: their intent is already recorded.
const Q_ORPHANS: &str = concat!(
    "SELECT ",
    agent_cols!("c."),
    " FROM agents AS c INDEXED BY agents_unfinished_by_parent",
    " LEFT JOIN agents AS p ON p.tenant = c.tenant AND p.name = c.parent",
    " WHERE c.parent IS NOT NULL",
    "  AND ",
    unfinished!("c."),
    "  AND c.status NOT LIKE 'stopping/%'",
    "  AND (p.name IS NULL OR NOT ",
    unfinished!("p."),
    ")",
    " LIMIT ?1"
);

/// Inside a sweeper's transaction: refuse unless `fence` still names the lease's
/// holder and epoch.
fn check_fence(tx: &Transaction<'_>, fence: &Fence) -> Tx<()> {
    let now = tx
        .prepare_cached(Q_LEASE)?
        .query_row([fence.lease.as_str()], |r| {
            Ok((r.get::<_, String>(1)?, r.get::<_, i64>(2)?))
        })
        .optional()?;
    match now {
        Some((holder, epoch)) if holder == fence.holder && epoch as u64 == fence.epoch => Ok(()),
        Some((holder, epoch)) => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: epoch {} of {} is fenced off (the lease is now epoch {epoch}, held by {holder})",
                fence.lease, fence.epoch, fence.holder
            ),
        )),
        None => Err(refused(
            Code::Conflict,
            format!(
                "lease {}: nobody holds it (fence of {} epoch {})",
                fence.lease, fence.holder, fence.epoch
            ),
        )),
    }
}

fn usage_row(r: &Row<'_>) -> rusqlite::Result<Usage> {
    Ok(Usage {
        tokens_in: r.get::<_, i64>(0)?.max(0) as u64,
        tokens_out: r.get::<_, i64>(1)?.max(0) as u64,
        cost_usd: r.get(2)?,
    })
}

impl Admission for SqliteStore {
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent> {
        self.admit_grouped(new, None, events)
    }

    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.admit_grouped(new, Some(quotas), events)
    }

    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas> {
        self.read(|conn| {
            let rows = collect(conn, Q_TENANT_QUOTAS, [tenant.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            let mut out = TenantQuotas::default();
            for (key, value) in rows {
                let shown = || format!("tenant {tenant}: {key} = {value}");
                let v =
                    u32::try_from(value).map_err(|_| corrupt("tenant_quotas.value", shown()))?;
                out.set(&key, v)
                    .map_err(|_| corrupt("tenant_quotas.key", shown()))?;
            }
            Ok(out)
        })
    }

    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        // The key is checked before the transaction, with the one list of keys
        // (brood-core's), so the refusal names it instead of quoting SQLite's CHECK.
        if let Err(e) = TenantQuotas::default().set(key, value) {
            return Err(StoreError::Refused {
                code: Code::BadRequest,
                message: format!("cannot set a quota of tenant {tenant}: {e}"),
            });
        }
        self.write(|tx| {
            tx.prepare_cached(I_TENANT_QUOTA)?
                .execute((tenant.as_str(), key, i64::from(value)))?;
            Ok(())
        })
    }

    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool> {
        self.read(|conn| {
            let (met, found, level): (i64, bool, i64) =
                conn.prepare_cached(Q_ANCESTOR_OR_SELF)?.query_row(
                    (
                        tenant.as_str(),
                        candidate.as_str(),
                        agent.as_str(),
                        MAX_WALK_DEPTH,
                    ),
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?;
            if met == 0 {
                return Err(not_found(tenant, agent));
            }
            if found {
                return Ok(true);
            }
            // A real chain of parents ends at a root long before the guard; only
            // a loop climbs that far. Answering `false` would let a cycle through.
            if level >= MAX_WALK_DEPTH {
                return Err(corrupt(
                    "agents.parent",
                    format!(
                        "the parents above {tenant}/{agent} loop \
                         (the walk up reached level {level})"
                    ),
                ));
            }
            Ok(false)
        })
    }
}

impl Runs for SqliteStore {
    fn start_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        pid: i32,
        cgroup: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| {
            let agent = must_agent(tx, tenant, name)?;
            let to = check_move(&agent, Status::Running)?;
            check_current_run(&agent, run)?;
            tx.prepare_cached(U_STATUS)?.execute((
                tenant.as_str(),
                name.as_str(),
                to.encode(),
                now_ms,
            ))?;
            tx.prepare_cached(U_RUN_STARTED)?.execute((
                tenant.as_str(),
                run.as_str(),
                pid,
                cgroup,
                now_ms,
            ))?;
            append_events_tx(tx, tenant, events, now_ms)?;
            must_agent(tx, tenant, name)
        })
    }

    fn set_status(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        to: Status,
        detail: Option<&str>,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| {
            let agent = must_agent(tx, tenant, name)?;
            let to = check_move(&agent, to)?;
            // Legal moves that need more than a status write have their own
            // methods; doing them here would leave the run record behind.
            let other = match (agent.status, to) {
                (_, Status::Ended(_)) => Some("end_run (the run's record must end too)"),
                (_, Status::Queued) => Some("resume (a new run is needed)"),
                (Status::Queued, Status::Running) => {
                    Some("start_run (the run's pid and cgroup are needed)")
                }
                _ => None,
            };
            if let Some(method) = other {
                return Err(refused(
                    Code::BadRequest,
                    format!(
                        "agent {name}: {} -> {} goes through {method}, not set_status",
                        agent.status.encode(),
                        to.encode()
                    ),
                ));
            }
            tx.prepare_cached(U_STATUS_DETAIL)?.execute((
                tenant.as_str(),
                name.as_str(),
                to.encode(),
                detail,
                now_ms,
            ))?;
            append_events_tx(tx, tenant, events, now_ms)?;
            must_agent(tx, tenant, name)
        })
    }

    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        self.write(|tx| mark_stopping_tx(tx, tenant, names, outcome, now_ms))
    }

    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| end_run_tx(tx, tenant, name, run, end, events))
    }

    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        self.write(|tx| {
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                match &it.end {
                    Some(end) => {
                        out.push(end_run_tx(tx, tenant, &it.name, &it.run, end, &it.events)?)
                    }
                    None => {
                        append_events_tx(tx, tenant, &it.events, it.now_ms)?;
                        out.push(must_agent(tx, tenant, &it.name)?);
                    }
                }
            }
            Ok(out)
        })
    }

    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        self.write(|tx| {
            let changed = tx.prepare_cached(U_RUN_USAGE)?.execute((
                tenant.as_str(),
                run.as_str(),
                to_sql_count(tokens_in),
                to_sql_count(tokens_out),
                cost_usd,
            ))?;
            if changed == 0 {
                return Err(refused(
                    Code::NotFound,
                    format!("run {run} does not exist in tenant {tenant}"),
                ));
            }
            Ok(())
        })
    }

    fn resume(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| resume_tx(tx, tenant, name, run, supervisor, now_ms, events))
    }
}

impl Transcripts for SqliteStore {
    fn append_message(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
        run: &RunId,
        role: &str,
        content: &str,
        now_ms: i64,
    ) -> Result<Message> {
        self.write(|tx| {
            if !agent_exists(tx, tenant, agent)? {
                return Err(not_found(tenant, agent));
            }
            let ours: bool = tx
                .prepare_cached(Q_RUN_OF_AGENT)?
                .query_row((tenant.as_str(), agent.as_str(), run.as_str()), |r| {
                    r.get(0)
                })?;
            if !ours {
                return Err(refused(
                    Code::Conflict,
                    format!("run {run} is not a run of agent {agent} in tenant {tenant}"),
                ));
            }
            let seq = 1 + tx
                .prepare_cached(Q_LAST_MESSAGE_SEQ)?
                .query_row((tenant.as_str(), agent.as_str(), session.as_str()), |r| {
                    r.get::<_, i64>(0)
                })?;
            tx.prepare_cached(I_MESSAGE)?.execute((
                tenant.as_str(),
                agent.as_str(),
                session.as_str(),
                seq,
                run.as_str(),
                role,
                content,
                now_ms,
            ))?;
            Ok(Message {
                tenant: tenant.clone(),
                agent: agent.clone(),
                session: session.clone(),
                seq,
                run: run.clone(),
                role: role.to_owned(),
                content: content.to_owned(),
                ts_ms: now_ms,
            })
        })
    }

    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>> {
        self.write(|tx| append_events_tx(tx, tenant, events, now_ms))
    }

    fn messages(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
    ) -> Result<Vec<Message>> {
        self.read(|conn| {
            collect(
                conn,
                Q_MESSAGES,
                (tenant.as_str(), agent.as_str(), session.as_str()),
                message_from,
            )
        })
    }

    fn events(
        &self,
        tenant: &TenantId,
        after: i64,
        agent: Option<&AgentName>,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.read(|conn| match agent {
            None => collect(
                conn,
                Q_EVENTS,
                (tenant.as_str(), after, i64::from(limit)),
                event_from,
            ),
            Some(a) => collect(
                conn,
                Q_EVENTS_OF_AGENT,
                (tenant.as_str(), after, i64::from(limit), a.as_str()),
                event_from,
            ),
        })
    }
}

impl Records for SqliteStore {
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>> {
        self.read(|conn| load_agent(conn, tenant, name))
    }

    fn run(&self, tenant: &TenantId, run: &RunId) -> Result<Option<Run>> {
        self.read(|conn| {
            Ok(
                collect(conn, Q_RUN, (tenant.as_str(), run.as_str()), run_from)?
                    .into_iter()
                    .next(),
            )
        })
    }

    fn runs(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Run>> {
        self.read(|conn| collect(conn, Q_RUNS, (tenant.as_str(), name.as_str()), run_from))
    }

    fn agents(&self, tenant: &TenantId, all: bool) -> Result<Vec<Agent>> {
        let sql = if all {
            Q_AGENTS_ALL
        } else {
            Q_AGENTS_UNFINISHED
        };
        self.read(|conn| collect(conn, sql, [tenant.as_str()], |r| agent_at(r, 0)))
    }

    fn children(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.read(|conn| {
            // An unknown agent is an error, not an empty family: a plan built on a
            // misspelt name must not look like "no children".
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            collect(conn, Q_CHILDREN, (tenant.as_str(), name.as_str()), |r| {
                agent_at(r, 0)
            })
        })
    }

    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.read(|conn| {
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            let mut stmt = conn.prepare_cached(Q_DESCENDANTS)?;
            let mut rows = stmt.query((tenant.as_str(), name.as_str(), MAX_WALK_DEPTH))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let found: String = row.get(0)?;
                let level: i64 = row.get(1)?;
                // A planning error changes nothing (SPEC 6 step 2): refuse the plan
                // rather than hand out an order that cannot be right.
                if level >= MAX_WALK_DEPTH || found == name.as_str() {
                    return Err(corrupt(
                        "edges",
                        format!(
                            "the edges under {tenant}/{name} have a cycle \
                             ({found} is reached again at level {level})"
                        ),
                    ));
                }
                if row.get::<_, Option<String>>(2)?.is_none() {
                    return Err(corrupt(
                        "edges",
                        format!("edge to {tenant}/{found}, which has no agent row"),
                    ));
                }
                out.push(agent_at(row, 2)?);
            }
            Ok(out)
        })
    }

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Result<Option<Channel>> {
        self.read(|conn| {
            Ok(collect(
                conn,
                Q_CHANNEL,
                (tenant.as_str(), parent.as_str(), child.as_str()),
                channel_from,
            )?
            .into_iter()
            .next())
        })
    }

    fn spend(&self, tenant: &TenantId, name: &AgentName) -> Result<Spend> {
        self.read(|conn| {
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            let own = conn
                .prepare_cached(Q_OWN_USAGE)?
                .query_row((tenant.as_str(), name.as_str()), usage_row)?;
            let subtree = conn
                .prepare_cached(Q_SUBTREE_USAGE)?
                .query_row((tenant.as_str(), name.as_str(), MAX_WALK_DEPTH), usage_row)?;
            Ok(Spend { own, subtree })
        })
    }
}

impl Recovery for SqliteStore {
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>> {
        self.read(|conn| {
            let mut out = Vec::new();
            for (i, s) in supervisors.iter().enumerate() {
                // A supervisor named twice is listed once.
                if supervisors[..i].contains(s) {
                    continue;
                }
                out.extend(collect(conn, Q_UNFINISHED_OF, [s.as_str()], |r| {
                    agent_at(r, 0)
                })?);
            }
            Ok(out)
        })
    }

    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_STOPPING_OF, [supervisor], |r| agent_at(r, 0)))
    }

    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.write(|tx| recover_tx(tx, dead, now_ms))
    }

    fn supervisors_with_unfinished(&self) -> Result<Vec<String>> {
        self.read(|conn| {
            collect(conn, Q_SUPERVISORS_WITH_UNFINISHED, [], |r| {
                Ok(r.get::<_, String>(0)?)
            })
        })
    }

    fn tenants(&self) -> Result<Vec<TenantId>> {
        self.read(|conn| {
            collect(conn, Q_TENANTS, [], |r| {
                parse_name("tenants.id", r.get(0)?, TenantId::new)
            })
        })
    }
}

impl Sweeps for SqliteStore {
    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        self.write(|tx| {
            tx.prepare_cached(U_LEASE)?
                .execute((name, holder, now_ms))?;
            let epoch: i64 = tx
                .prepare_cached(Q_LEASE)?
                .query_row([name], |r| r.get(2))?;
            Ok(Fence {
                lease: name.to_owned(),
                holder: holder.to_owned(),
                epoch: epoch as u64,
            })
        })
    }

    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(Q_LEASE)?
                .query_row([name], |r| {
                    Ok(Fence {
                        lease: r.get(0)?,
                        holder: r.get(1)?,
                        epoch: r.get::<_, i64>(2)? as u64,
                    })
                })
                .optional()?)
        })
    }

    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_OVERDUE, (now_ms, limit), |r| agent_at(r, 0)))
    }

    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_ORPHANS, [limit], |r| agent_at(r, 0)))
    }

    fn sweep_stop(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Vec<Agent>> {
        self.write(|tx| {
            check_fence(tx, fence)?;
            let out = mark_stopping_tx(tx, tenant, names, outcome, now_ms)?;
            append_events_tx(tx, tenant, events, now_ms)?;
            Ok(out)
        })
    }

    fn sweep_end(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        name: &AgentName,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| {
            check_fence(tx, fence)?;
            let agent = must_agent(tx, tenant, name)?;
            end_run_tx(tx, tenant, name, &agent.run, end, events)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("brood.db")).unwrap();
        (dir, s)
    }

    /// A statement with `col = ?` beside an ORDER BY is compiled once, not again
    /// after every rebind (the QPSG setting of `configure`).
    #[test]
    fn cached_reads_are_not_prepared_again_when_rebound() {
        let (_dir, s) = store();
        let t = TenantId::new("t").unwrap();
        for i in 0..5 {
            let a = AgentName::new(&format!("a{i}")).unwrap();
            s.runs(&t, &a).unwrap();
            s.messages(&t, &a, &SessionName::default_session()).unwrap();
        }
        let conn = s.lock();
        for sql in [Q_RUNS, Q_MESSAGES] {
            let stmt = conn.prepare_cached(sql).unwrap();
            assert_eq!(
                stmt.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "{sql}"
            );
        }
    }

    /// No write of an agent row builds a temporary b-tree: the partial indexes'
    /// WHERE (checked on every insert and status change) has no IN list.
    #[test]
    fn agent_writes_build_no_temporary_btree() {
        let (_dir, s) = store();
        let conn = s.lock();
        for sql in [
            U_STATUS,
            U_STATUS_DETAIL,
            I_AGENT,
            Q_UNFINISHED_OF,
            Q_OVERDUE,
        ] {
            // Run unbound (every parameter NULL): EXPLAIN only lists the program.
            let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let mut rows = stmt.raw_query();
            let mut ops: Vec<String> = Vec::new();
            while let Some(r) = rows.next().unwrap() {
                ops.push(r.get(1).unwrap());
            }
            assert!(ops.iter().any(|o| o == "Halt"), "{sql}: {ops:?}");
            assert!(
                !ops.iter().any(|o| o == "OpenEphemeral"),
                "{sql} builds a temporary b-tree: {ops:?}"
            );
        }
    }
}
