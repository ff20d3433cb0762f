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
//! still succeeds or fails alone (`commit_group`). A thread of the store's own
//! copies the WAL back into the database, off the requesters' path
//! (`Checkpointer`).
//!
//! Schema. The SQL files under `schema/` are embedded, numbered and applied once
//! each, in order, every one in its own transaction, and recorded in
//! `schema_migrations`; opening an up-to-date file changes nothing.
//!
//! The code: this file opens the store, runs the writer (group commit, the
//! checkpointer) and migrates; `sql` holds every statement (the dialect's
//! `crate::db::Statements` among them), `db` is the shared logic's
//! `crate::db::Db` on a connection, `steps` the event log's numbering,
//! `admit` admission's writes, and `store` this store as a
//! `crate::sql_store::SqlStore`: the whole contract is written once for
//! both stores there.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::group::{Group, Groups, Ticket};
use brood_core::{AgentName, TenantId};
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::types::{Agent, Result, StoreError};

#[macro_use]
pub(crate) mod sql;
// After `sql`, whose macros they use.
mod admit;
mod db;
mod pcache;
mod steps;
mod store;
#[cfg(test)]
mod tests;

use admit::admit_tx;
use sql::*;
use steps::*;

/// The embedded migrations, in the order they apply. A version is never reused or
/// edited once released: a change is a new file.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../schema/0001_init.sql")),
    (2, include_str!("../schema/0002_quotas.sql")),
    (3, include_str!("../schema/0003_sweepers.sql")),
    (4, include_str!("../schema/0004_channel_output.sql")),
    (5, include_str!("../schema/0005_unfinished_without_in.sql")),
    (6, include_str!("../schema/0006_idempotency.sql")),
    (7, include_str!("../schema/0007_jobs.sql")),
    (8, include_str!("../schema/0008_nodes.sql")),
    (9, include_str!("../schema/0009_inbox.sql")),
    (10, include_str!("../schema/0010_blobs.sql")),
    (11, include_str!("../schema/0011_slot_shares.sql")),
    (12, include_str!("../schema/0012_idempotency_callers.sql")),
];

/// How many migrations this build embeds (and so the schema version of a store
/// it has opened).
pub const MIGRATION_COUNT: usize = MIGRATIONS.len();

/// How long a writer waits for another writer's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Read-only connections for reads, so they run beside each other and
    /// beside a write (WAL readers do not block): a read sees every
    /// transaction committed before it began. Empty for a read-only store,
    /// whose one connection reads.
    readers: Vec<Mutex<Connection>>,
    /// Which reader a read waits for when none is free.
    next_reader: std::sync::atomic::AtomicUsize,
    /// For error messages: every error names the file it happened in.
    path: String,
    /// Admissions waiting for their group commit, in arrival order.
    admissions: Groups,
    /// Copies the WAL back into the database on its own thread; `None` when read
    /// only.
    checkpointer: Option<Checkpointer>,
    /// Rung once events appended here have committed (`crate::bell`).
    pub(crate) bell: crate::bell::Bell,
}

/// After how many commits the checkpointer is woken. A lone admission writes
/// about 15 WAL frames, so this is about SQLite's default autocheckpoint of 1,000
/// frames.
const CHECKPOINT_EVERY: u32 = 64;

/// Read-only connections beside the writer's (`SqliteStore::read`): the
/// machine's two cores reading at once.
const READERS: usize = 2;

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

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A failure inside a transaction, before it is given the file's path. It lets the
/// transaction bodies use `?` on rusqlite calls and on the store's own refusals
/// alike; [`Fail::at`] turns it into a [`StoreError`] at the method's edge.
pub(crate) enum Fail {
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

pub(crate) type Tx<T> = std::result::Result<T, Fail>;

fn not_found(tenant: &TenantId, name: &AgentName) -> Fail {
    Fail::Store(StoreError::NotFound {
        tenant: tenant.to_string(),
        name: name.to_string(),
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
        pcache::configure();
        let shown = path.display().to_string();
        let sql = |source| StoreError::Sqlite {
            path: shown.clone(),
            source,
        };
        private_files(path).map_err(|e| StoreError::Io {
            path: shown.clone(),
            source: e,
        })?;
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
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let r = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(sql)?;
            configure(&r).map_err(sql)?;
            r.pragma_update(None, "query_only", true).map_err(sql)?;
            readers.push(Mutex::new(r));
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            readers,
            next_reader: Default::default(),
            path: shown,
            admissions: Groups::new(GROUP_MAX, false),
            checkpointer: Some(checkpointer),
            bell: Default::default(),
        })
    }

    /// The schema version the file holds and the one this build writes, as
    /// `brood doctor` reports it; `None` when there is no file yet (the
    /// first supervisor makes it). Opens it read-only: migrates nothing.
    pub fn schema_version(path: &Path) -> Result<Option<crate::SchemaVersion>> {
        pcache::configure();
        if !path.exists() {
            return Ok(None);
        }
        let sql = |source| StoreError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql)?;
        let applied = applied_version(&conn).map_err(sql)?;
        Ok(Some(crate::SchemaVersion {
            applied,
            latest: latest_version(),
        }))
    }

    /// Opens an existing store file for reading only, for CLI commands that only
    /// look. Fails, naming the path, when the file does not exist, and when its
    /// schema is older than this build (a read-only open cannot migrate it).
    /// Every mutating method of the result fails with SQLite's "readonly database".
    pub fn open_read_only(path: &Path) -> Result<SqliteStore> {
        pcache::configure();
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
            readers: Vec::new(),
            next_reader: Default::default(),
            path: shown,
            admissions: Groups::new(GROUP_MAX, false),
            checkpointer: None,
            bell: Default::default(),
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
    /// rolls everything back (the transaction is dropped uncommitted). `body`
    /// is given the connection: the transaction is on it, and the shared
    /// logic's `Db` is the connection's.
    fn write<T>(&self, body: impl FnOnce(&Connection) -> Tx<T>) -> Result<T> {
        let mut conn = self.lock();
        let run = |conn: &mut Connection| -> Tx<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = body(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        let out = run(&mut conn);
        self.bell.after_transaction(out.is_ok());
        let out = out.map_err(|f| f.at(&self.path))?;
        self.committed(1);
        Ok(out)
    }

    /// Tells the checkpointer about `n` more commits.
    fn committed(&self, n: u32) {
        if let Some(c) = &self.checkpointer {
            c.committed(n);
        }
    }

    /// Runs `body` on a free reader, else waits for one (in turn), so reads
    /// neither queue behind writes nor behind one another.
    fn read<T>(&self, body: impl FnOnce(&Connection) -> Tx<T>) -> Result<T> {
        if self.readers.is_empty() {
            let conn = self.lock();
            return body(&conn).map_err(|f| f.at(&self.path));
        }
        let free = self.readers.iter().find_map(|r| r.try_lock().ok());
        let conn = match free {
            Some(c) => c,
            None => {
                let i = self
                    .next_reader
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    % self.readers.len();
                self.readers[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            }
        };
        body(&conn).map_err(|f| f.at(&self.path))
    }

    /// A group of admissions committed (`SqlStore::commit_group`). Each
    /// admission stays all-or-nothing on its own: it runs in its own
    /// savepoint, inside the group's `BEGIN IMMEDIATE` transaction, after the
    /// admissions queued before it, whose writes it sees (so the quota counts
    /// stay exact), and it is answered only once the group has committed.
    fn commit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>> {
        let answers = self.admit_group(group.tickets());
        self.bell
            .after_transaction(answers.iter().any(std::result::Result::is_ok));
        // Counted per admission, not per commit: the frames a commit
        // writes grow with its group.
        let admitted = answers.iter().filter(|a| a.is_ok()).count();
        self.committed(u32::try_from(admitted).unwrap_or(u32::MAX));
        answers
    }

    /// The error of an admission whose group was lost.
    fn admission_lost(&self, message: String) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source: sqlite_message(message),
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

/// Creates the store file with mode 0600 when it does not exist, and takes
/// group and other bits off it and its WAL and shared memory when it does
/// (issue 24: environment values are in it). SQLite gives the WAL and the
/// shared-memory file the database's own mode when it creates them.
fn private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        let p = std::path::PathBuf::from(name);
        match std::fs::metadata(&p) {
            Ok(md) if md.is_file() && md.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
