//! The PostgreSQL implementation of [`Store`] (SPEC 14, issue 15): the same
//! contract as [`crate::sqlite`], checked by the same conformance suite, on
//! a server that many brood nodes share.
//!
//! The client. `tokio-postgres`, driven by a small runtime of the store's own
//! (its connections' tasks run there), called through a blocking facade: a
//! call blocks the calling thread on `futures_executor::block_on`, never on
//! a tokio runtime's `block_on`, so the store can be called from inside the
//! supervisor's runtime (where the synchronous `postgres` crate would panic)
//! as SQLite is. The trait stays synchronous (docs/decisions/store.md "The
//! trait stays synchronous").
//!
//! Connections. A fixed pool (`Options::connections`): a caller takes one,
//! uses it for one method, gives it back; one found closed (the server
//! restarted, the network dropped) is replaced by a new one before use, so a
//! restarted server costs the calls in flight, not the store. A write lost
//! with its connection is never done twice: one whose COMMIT went
//! unanswered is asked about (`commit`), not run again.
//!
//! Exactness across nodes. Every transaction that reads and then writes
//! takes `pg_advisory_xact_lock` on its tenant first: two nodes admitting
//! under the same tenant queue on that lock as two threads queue on SQLite's
//! write lock, so a count read inside the transaction is still true when it
//! commits (no read-then-write race), whatever node runs it. The lock goes
//! with the transaction (commit, rollback or a lost connection).
//!
//! Schema. `schema/postgres/*.sql`, numbered and applied once each in its own
//! transaction under a session advisory lock (nodes starting together migrate
//! once), recorded in `schema_migrations`.
//!
//! The code: this file opens the store, holds the pool and migrates;
//! `commit` runs a write's transaction on it and learns the fate of one
//! whose COMMIT went unanswered; `db` is the blocking facade (queries on a
//! connection or a transaction) and the shared logic's `crate::db::Db` on
//! it, `sql` this dialect's own statements (its `crate::db::Statements`), `steps` the event log's
//! numbering, `admission` the group commit and `admit` a group's reads and
//! writes, `analyze` the young tables' statistics kept true, `news` the writes announced and heard, `sweeps` the lease's
//! session lock, and `store` this store as a `crate::sql_store::SqlStore`:
//! the whole contract is written once for both stores there.

mod admission;
mod admit;
mod analyze;
mod commit;
mod db;
mod news;
mod sql;
mod steps;
mod store;
mod sweeps;

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use brood_core::{AgentName, TenantId};
use tokio_postgres::NoTls;

use db::Deadline;

use crate::types::{Result, StoreError};

pub(crate) use db::{Conn, Db, block};

/// The embedded migrations, in the order they apply. A version is never
/// reused or edited once released: a change is a new file.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../schema/postgres/0001_init.sql")),
    (2, include_str!("../schema/postgres/0002_nodes.sql")),
    (3, include_str!("../schema/postgres/0003_inbox.sql")),
    (
        4,
        include_str!("../schema/postgres/0004_admission_writes.sql"),
    ),
    (5, include_str!("../schema/postgres/0005_blobs.sql")),
    (6, include_str!("../schema/postgres/0006_slot_shares.sql")),
    (
        7,
        include_str!("../schema/postgres/0007_idempotency_callers.sql"),
    ),
];

/// How many migrations this build knows (the schema version it writes).
pub const MIGRATION_COUNT: usize = MIGRATIONS.len();

/// The key of the session advisory lock that serialises migrations.
const MIGRATION_LOCK: i64 = 0x6272_6f6f_645f_6d69; // "brood_mi"

/// How a PostgreSQL store is opened.
#[derive(Debug, Clone)]
pub struct Options {
    /// Connections in the pool: at most this many calls at once.
    pub connections: usize,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// How long one round trip may take before the connection is given up
    /// (a server or network that went silent would otherwise hold the
    /// caller for as long as TCP retries: many minutes).
    pub call_timeout: Duration,
    /// The server's own limits, set on every connection unless the URL's
    /// `options` names them: `statement_timeout`, `lock_timeout` and the
    /// one below
    /// (advisory locks included), so a statement stuck on the server ends
    /// there too, before the caller's deadline.
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    /// The server ends a session left idle inside a transaction this long
    /// (`idle_in_transaction_session_timeout`), so that its locks (a
    /// tenant's advisory lock) go with it: a client whose call missed its
    /// deadline, its request lost by a network that went silent and came
    /// back, keeps the connection waiting for an answer that never comes,
    /// and every write of the tenant then waited on that lock for ever
    /// (issue 28's fault campaign).
    pub idle_in_transaction_timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            connections: 8,
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(20),
            statement_timeout: Duration::from_secs(15),
            lock_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(30),
        }
    }
}

/// A store on a PostgreSQL database.
pub struct PgStore {
    pub(crate) pool: Arc<Pool>,
    /// Set once this store announces its writes to the other nodes
    /// (`Nodes::hear`).
    pub(crate) news: std::sync::OnceLock<news::News>,
    /// Admissions waiting for their group commit (`admission`).
    pub(crate) admissions: crate::group::Groups,
    /// The admissions committed through this store, for keeping the
    /// planner's statistics of young tables true (`analyze`).
    pub(crate) young: analyze::Young,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.pool.target)
            .finish_non_exhaustive()
    }
}

/// A failure inside a method, as in the SQLite store: a server error or one
/// of the store's own refusals, turned into a [`StoreError`] at the edge.
pub(crate) enum Fail {
    Pg(tokio_postgres::Error),
    Store(StoreError),
    /// No answer within the deadline (`db::Deadline`).
    Deadline(Duration),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail::Pg(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Fail {
        Fail::Store(e)
    }
}

impl Fail {
    pub(crate) fn at(self, target: &str) -> StoreError {
        match self {
            Fail::Pg(source) => StoreError::Postgres {
                target: target.to_owned(),
                source,
            },
            Fail::Store(e) => e,
            Fail::Deadline(after) => StoreError::PostgresDeadline {
                target: target.to_owned(),
                after,
            },
        }
    }
}

pub(crate) type Tx<T> = std::result::Result<T, Fail>;

pub(crate) fn not_found(tenant: &TenantId, name: &AgentName) -> Fail {
    Fail::Store(StoreError::NotFound {
        tenant: tenant.to_string(),
        name: name.to_string(),
    })
}

pub(crate) fn corrupt(what: &'static str, value: impl Into<String>) -> Fail {
    Fail::Store(StoreError::Corrupt {
        what,
        value: value.into(),
    })
}

/// The pool: a fixed number of connection slots, each holding a client
/// once connected. The runtime drives every connection's task.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    /// host:port/dbname, for errors and logs (never the password).
    pub(crate) target: String,
    connect_timeout: std::time::Duration,
    call_timeout: std::time::Duration,
    /// Always `Some` until the pool is dropped (see its `Drop`).
    runtime: Option<tokio::runtime::Runtime>,
    slots: Mutex<Vec<Option<Conn>>>,
    freed: Condvar,
    /// Rung once events appended through this pool have committed, and when
    /// another node announces a write (`crate::bell`).
    pub(crate) bell: crate::bell::Bell,
}

impl Drop for Pool {
    fn drop(&mut self) {
        // A runtime's own drop waits for its threads and panics inside an
        // async context (a store dropped by the CLI's async main); the
        // connections' tasks need no waiting for.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Pool {
    fn runtime(&self) -> Tx<&tokio::runtime::Runtime> {
        self.runtime.as_ref().ok_or_else(|| {
            Fail::Store(StoreError::PostgresSetup {
                target: self.target.clone(),
                message: "the store is shutting down".into(),
            })
        })
    }

    fn connect(&self) -> Tx<Conn> {
        let config = self.config.clone();
        let rt = self.runtime()?;
        let timeout = self.connect_timeout;
        let target = self.target.clone();
        let (client, connection) = block(async {
            // The connect future needs tokio's reactor: it runs on the pool's
            // runtime, and only the answer comes back here.
            // Bounded on the runtime's own clock, whatever the server does.
            // No answer, or none in time, is the server or the network away,
            // not a wrong request: `is_unavailable`, answered 503 (issue 28: a
            // store that cannot be reached is not an internal error). A server
            // that answered with an error (a wrong password, no such
            // database) is kept as it is.
            rt.spawn(async move {
                match tokio::time::timeout(timeout, config.connect(NoTls)).await {
                    Ok(r) => r.map_err(|e| match e.as_db_error() {
                        Some(_) => Fail::Pg(e),
                        None => Fail::Store(StoreError::PostgresUnreachable {
                            target,
                            message: e.to_string(),
                        }),
                    }),
                    Err(_) => Err(Fail::Store(StoreError::PostgresUnreachable {
                        target,
                        message: format!("no connection within {timeout:?}"),
                    })),
                }
            })
            .await
        })
        .map_err(|e| {
            Fail::Store(StoreError::PostgresSetup {
                target: self.target.clone(),
                message: format!("the connection task failed: {e}"),
            })
        })??;
        let target = self.target.clone();
        rt.spawn(async move {
            // Ends when the connection does; the client notices (`is_closed`).
            if let Err(e) = connection.await {
                let e = crate::types::said(&e);
                eprintln!("brood store: postgres connection to {target} ended: {e}");
            }
        });
        Ok(Conn::new(
            client,
            Deadline::new(self.call_timeout, rt.handle().clone()),
        ))
    }

    /// A connection outside the pool, for a session that must outlive a call
    /// (a lease's session lock).
    pub(crate) fn dedicated(&self) -> Tx<Conn> {
        self.connect()
    }

    /// Runs `f` on a connection of the pool (a live one: a closed one is
    /// replaced first), then gives the connection back. When the connection
    /// was lost under `f` (the server restarted or ended the session), `f`
    /// runs once more on a new one. For reads, and for what is the same
    /// done twice as once (a single statement that sets what it sets, a
    /// migration that looks first at what is applied); a transaction that
    /// writes goes through [`Pool::transact`], which never runs a body
    /// again that may have committed.
    pub(crate) fn with<T>(&self, mut f: impl FnMut(&Conn) -> Tx<T>) -> Result<T> {
        let mut slot = self.take();
        let mut again = true;
        let r = loop {
            match self.live(&mut slot).and_then(|c| f(c)) {
                Err(Fail::Pg(e)) if again && crate::types::connection_lost(&e) => {
                    eprintln!(
                        "brood store: postgres connection to {} lost ({}); trying once more",
                        self.target,
                        crate::types::said(&e)
                    );
                    slot = None;
                    again = false;
                }
                r => break r,
            }
        };
        self.give(slot);
        r.map_err(|e| e.at(&self.target))
    }

    /// A slot of the pool (its connection, if it has one), once one is free.
    fn take(&self) -> Option<Conn> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(c) = slots.pop() {
                return c;
            }
            slots = self
                .freed
                .wait(slots)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Gives a slot back to the pool.
    fn give(&self, slot: Option<Conn>) {
        {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            slots.push(slot);
        }
        self.freed.notify_one();
    }

    /// The slot's connection, live: none yet, or a closed one, is replaced
    /// by a new one.
    fn live<'s>(&self, slot: &'s mut Option<Conn>) -> Tx<&'s mut Conn> {
        let c = match slot.take() {
            Some(c) if !c.is_closed() => c,
            _ => self.connect()?,
        };
        Ok(slot.insert(c))
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/db`) with the default
    /// [`Options`] and brings the schema up to date.
    pub fn open(url: &str) -> Result<PgStore> {
        PgStore::open_with(url, Options::default())
    }

    pub fn open_with(url: &str, opts: Options) -> Result<PgStore> {
        let store = PgStore::connect(url, opts)?;
        store.migrate()?;
        Ok(store)
    }

    /// The schema version the server's database holds (0: none yet), as
    /// `brood doctor` reports it: connects, reads, migrates nothing.
    pub fn schema_version(url: &str) -> Result<crate::SchemaVersion> {
        let store = PgStore::connect(
            url,
            Options {
                connections: 1,
                ..Options::default()
            },
        )?;
        let applied = store.read(|db| {
            let has: bool = db
                .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])?
                .try_get(0)?;
            if !has {
                return Ok(0);
            }
            Ok(db
                .query_one(
                    "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                    &[],
                )?
                .try_get(0)?)
        })?;
        Ok(crate::SchemaVersion {
            applied,
            latest: MIGRATIONS.last().map_or(0, |(v, _)| *v),
        })
    }

    /// A pool of connections to `url`, the schema as it is.
    fn connect(url: &str, opts: Options) -> Result<PgStore> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::PostgresSetup {
                target: redact(url),
                message: format!("not a PostgreSQL connection string: {e}"),
            })?;
        config.connect_timeout(opts.connect_timeout);
        if config.get_options().is_none() {
            config.options(format!(
                "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
                opts.statement_timeout.as_millis(),
                opts.lock_timeout.as_millis(),
                opts.idle_in_transaction_timeout.as_millis()
            ));
        }
        if config.get_application_name().is_none() {
            config.application_name("brood");
        }
        let target = describe(&config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("brood-store-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::PostgresSetup {
                target: target.clone(),
                message: format!("starting the store's runtime: {e}"),
            })?;
        let n = opts.connections.max(1);
        let pool = Arc::new(Pool {
            config,
            target,
            connect_timeout: opts.connect_timeout,
            call_timeout: opts.call_timeout,
            runtime: Some(runtime),
            slots: Mutex::new((0..n).map(|_| None).collect()),
            freed: Condvar::new(),
            bell: Default::default(),
        });
        let store = PgStore {
            pool,
            news: std::sync::OnceLock::new(),
            admissions: crate::group::Groups::new(admission::GROUP_MAX, true),
            young: analyze::Young::default(),
        };
        Ok(store)
    }

    /// A setting of the server as this store's connections see it
    /// (`SHOW name`): the deadlines it sets on them, for `brood doctor` and
    /// the tests.
    pub fn server_setting(&self, name: &str) -> Result<String> {
        self.read(|db| {
            Ok(db
                .query_one("SELECT current_setting($1)", &[&name])?
                .try_get(0)?)
        })
    }

    /// Times `n` trivial round trips (`SELECT 1`) through the facade: what one
    /// statement costs before any work (for `brood bench`).
    pub fn probe_round_trips(&self, n: usize) -> Result<std::time::Duration> {
        self.read(|db| {
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                db.query_one("SELECT 1::BIGINT", &[])?;
            }
            Ok(t0.elapsed())
        })
    }

    /// The server this store talks to (host, port, database).
    pub fn target(&self) -> &str {
        &self.pool.target
    }

    fn migrate(&self) -> Result<()> {
        self.pool.with(|c| {
            c.db()
                .batch(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))?;
            let r = migrate_locked(c);
            c.db()
                .batch(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"))?;
            r
        })
    }

    /// Runs `f` on a connection of the pool (reads outside a transaction).
    pub(crate) fn read<T>(&self, f: impl Fn(&Db<'_>) -> Tx<T>) -> Result<T> {
        self.pool.with(|c| f(&c.db()))
    }

    /// Runs `f` in a transaction that first takes `tenant`'s advisory lock
    /// (every read-then-write body: exact across nodes).
    pub(crate) fn write<T>(&self, tenant: &str, f: impl Fn(&Db<'_>) -> Tx<T>) -> Result<T> {
        crate::changed::begin();
        let out = self.pool.transact(Some(tenant), &f)?;
        self.wrote(crate::changed::take());
        Ok(out)
    }

    /// Runs `f` in a transaction without a tenant's lock (bodies that span
    /// tenants, as the sweepers' and recovery's, lock what they need).
    pub(crate) fn write_any<T>(&self, f: impl Fn(&Db<'_>) -> Tx<T>) -> Result<T> {
        crate::changed::begin();
        let out = self.pool.transact(None, &f)?;
        self.wrote(crate::changed::take());
        Ok(out)
    }

    /// Runs `f` in a transaction without a tenant's lock and without
    /// announcing it: the caller announces (`wrote`) only when it changed
    /// something, so that a look that found nothing (a claim, a take) is no
    /// news to the other nodes, who would look back.
    pub(crate) fn write_quiet<T>(&self, f: impl Fn(&Db<'_>) -> Tx<T>) -> Result<T> {
        self.pool.transact(None, &f)
    }

    /// A write committed that changed `what`: the other nodes hear of it,
    /// when this store announces (see `news`).
    pub(crate) fn wrote(&self, what: crate::Changed) {
        if let Some(n) = self.news.get() {
            n.wrote(what);
        }
    }

    /// The node this store announces as, once it hears (`Nodes::hear`).
    pub(crate) fn announcing_as(&self) -> Option<&str> {
        self.news.get().map(news::News::me)
    }
}

/// The migrations not applied yet, each in its transaction; the caller holds
/// the migration lock.
fn migrate_locked(c: &Conn) -> Tx<()> {
    c.db().batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    BIGINT NOT NULL PRIMARY KEY,
            applied_ms BIGINT NOT NULL)",
    )?;
    let done: Vec<i64> = c
        .db()
        .query("SELECT version FROM schema_migrations", &[])?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<std::result::Result<_, _>>()?;
    for (version, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        let now = crate::now_ms();
        let ran = c.tx(None, |db| {
            db.batch(sql)?;
            db.exec(
                "INSERT INTO schema_migrations (version, applied_ms) VALUES ($1, $2)",
                &[version, &now],
            )?;
            Ok(())
        })?;
        // A COMMIT whose answer was lost fails the migration; the caller's
        // retry (`Pool::with`) reads what is applied again first, so a
        // migration that did commit is not applied twice.
        if let db::Commit::Unanswered { lost, .. } = ran {
            return Err(lost);
        }
    }
    Ok(())
}

/// host:port/dbname of a connection's settings, never its password.
fn describe(c: &tokio_postgres::Config) -> String {
    let host = c
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = c.get_ports().first().copied().unwrap_or(5432);
    let db = c.get_dbname().unwrap_or("");
    format!("{host}:{port}/{db}")
}

/// A connection string with its password, if any, taken out.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
