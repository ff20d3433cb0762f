//! Records, the inputs of the store's methods and its errors (the methods are
//! `contract`'s).

use brood_core::{
    AgentName, Code, IllegalTransition, RunId, SessionName, Status, TenantId, Terminal,
};

/// Errors of the store. `Refused` carries a SPEC 5 code and is meant for the
/// requester; the others are the runtime's problem.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{code}: {message}")]
    Refused { code: Code, message: String },
    #[error("agent {tenant}/{name} not found")]
    NotFound { tenant: String, name: String },
    #[error("agent {name}: {source}")]
    Transition {
        name: String,
        #[source]
        source: IllegalTransition,
    },
    #[error("store {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    /// Making the store's files private to their owner.
    #[error("store {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store {path}: migration {version} failed: {source}")]
    Migration {
        path: String,
        version: i64,
        #[source]
        source: rusqlite::Error,
    },
    /// Reading or writing a blob's bytes on the caller's side (`Blobs`).
    #[error("blob {sha256}: {source}")]
    BlobIo {
        sha256: String,
        #[source]
        source: std::io::Error,
    },
    #[error("store: corrupt value in {what}: {value:?}")]
    Corrupt { what: &'static str, value: String },
    /// A PostgreSQL store's error; `target` is the server it talks to
    /// (host, port and database; never the password).
    #[error("store postgres {target}: {}", said(source))]
    Postgres {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A PostgreSQL store's error that is not the server's (a migration file,
    /// a connection string, a pool that could not be filled).
    #[error("store postgres {target}: {message}")]
    PostgresSetup { target: String, message: String },
    /// A round trip to PostgreSQL that did not come back within the store's
    /// deadline (the server or the network is away): the connection is
    /// given up, and whether a write in flight was committed is not known.
    #[error(
        "store postgres {target}: no answer within {after:?} (the connection was given up; \
         the server or the network between is away)"
    )]
    PostgresDeadline {
        target: String,
        after: std::time::Duration,
    },
    /// No connection to PostgreSQL could be made (refused, no route, no
    /// answer within the connect timeout, the server starting or shutting
    /// down): nothing was sent, so nothing of the call was done.
    #[error("store postgres {target}: cannot connect: {message}")]
    PostgresUnreachable { target: String, message: String },
    /// A write whose COMMIT went unanswered (the connection lost, or no
    /// answer within the deadline) and whose fate the store could not learn
    /// from the server: it may have been done. It was not run again.
    #[error("store postgres {target}: {message}")]
    PostgresInDoubt { target: String, message: String },
}

impl StoreError {
    /// Whether the store is away rather than wrong: no answer within the
    /// deadline, a connection lost, a commit whose fate is unknown, SQLite
    /// busy past its timeout. Asking again later may succeed; the request
    /// itself was not at fault.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::PostgresDeadline { .. }
            | StoreError::PostgresInDoubt { .. }
            | StoreError::PostgresUnreachable { .. } => true,
            StoreError::Postgres { source, .. } => connection_lost(source),
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A PostgreSQL error as the server said it: the driver's own text alone
/// is "db error" for everything the server answered, which names nothing;
/// with it, the SQLSTATE and the server's message.
pub(crate) fn said(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{e}: {} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The connection went, not the statement: closed, or the server ending the
/// session (`57P01` admin shutdown, `57P02` crash shutdown, `57P03` cannot
/// connect now, `08*` connection exceptions).
pub(crate) fn connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(c) => {
            let c = c.code();
            c == "57P01" || c == "57P02" || c == "57P03" || c.starts_with("08")
        }
        // An I/O error under the connection (reset, broken pipe).
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// How an agent's program speaks to the supervisor: the core's type, kept
/// here under its old path.
pub use brood_core::Protocol;

/// What a creation asks for. `spec` is the launch description as JSON text
/// (argv, env, cwd, ...), stored verbatim so resume can start the program again.
#[derive(Debug, Clone)]
pub struct NewAgent {
    pub tenant: TenantId,
    pub name: AgentName,
    pub parent: Option<AgentName>,
    /// Who receives the result; the parent when `None`.
    pub customer: Option<AgentName>,
    pub session: SessionName,
    pub protocol: Protocol,
    /// JSON object: `{"argv":[..],"env":{..},"cwd":..}` and later fields.
    pub spec: String,
    /// The task as the parent wrote it (becomes the channel's `handoff.md`).
    pub handoff: String,
    /// The supervisor instance that will host the process.
    pub supervisor: String,
    pub run: RunId,
    /// Milliseconds since the Unix epoch (the caller owns the clock).
    pub now_ms: i64,
}

/// One agent as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    pub tenant: TenantId,
    pub name: AgentName,
    pub parent: Option<AgentName>,
    pub customer: Option<AgentName>,
    pub root: AgentName,
    pub depth: u32,
    pub session: SessionName,
    pub protocol: Protocol,
    pub spec: String,
    pub status: Status,
    /// Free text next to the status: why it is blocked, why a run failed.
    pub detail: Option<String>,
    /// The newest run.
    pub run: RunId,
    pub supervisor: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

/// One run (one life of the agent's process).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: RunId,
    pub tenant: TenantId,
    pub agent: AgentName,
    /// 1 for the first run, 2 after the first resume, ...
    pub seq: u32,
    pub pid: Option<i32>,
    pub cgroup: Option<String>,
    pub outcome: Option<Terminal>,
    pub exit_code: Option<i32>,
    pub result: Option<String>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub created_ms: i64,
}

/// The parent's channel to one child (SPEC 4).
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    pub tenant: TenantId,
    pub parent: AgentName,
    pub parent_session: SessionName,
    pub child: AgentName,
    pub child_session: SessionName,
    pub handoff: String,
    pub result: Option<String>,
    /// Derived from the child's status through `Status::abi().channel`.
    pub status: Status,
    /// The channel's `refs.jsonl`, as validated and written (SPEC 4); `None`
    /// until the current run ended with a result.
    pub refs: Option<String>,
    /// The files of the channel's `artifact/`, taken into the blob store when
    /// the result was recorded.
    pub artifacts: Vec<Artifact>,
}

/// One file a child handed back in its `artifact/` directory (SPEC 4), kept in
/// the content-addressed blob store as `blobs/sha256/<sha256>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Its path relative to `artifact/` (`/`-separated, no `.` or `..`).
    pub name: String,
    /// Lowercase hex of its SHA-256.
    pub sha256: String,
    pub size: u64,
}

/// What a run hands back to its parent besides the result text (SPEC 4),
/// recorded on the channel with the end of the run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChannelOutput {
    /// `refs.jsonl`'s exact text.
    pub refs: String,
    pub artifacts: Vec<Artifact>,
}

/// One event. `seq` is monotonic per tenant, assigned by the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub tenant: TenantId,
    pub seq: i64,
    pub ts_ms: i64,
    /// The agent whose `events.jsonl` this event belongs in.
    pub agent: AgentName,
    pub run: Option<RunId>,
    pub session: SessionName,
    /// `agent.spawn`, `agent.start`, `agent.stop`, `agent.child.cancel`, ...
    pub kind: String,
    /// The JSON object written as the line of `events.jsonl`.
    pub payload: String,
}

/// An event to append, without its sequence number.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub agent: AgentName,
    pub run: Option<RunId>,
    pub session: SessionName,
    pub kind: String,
    pub payload: String,
}

/// One whole transcript message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub tenant: TenantId,
    pub agent: AgentName,
    pub session: SessionName,
    /// Position in the session, from 1.
    pub seq: i64,
    pub run: RunId,
    pub role: String,
    pub content: String,
    pub ts_ms: i64,
}

/// How a run ended, as the supervisor saw it.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub outcome: Terminal,
    pub exit_code: Option<i32>,
    pub result: Option<String>,
    pub detail: Option<String>,
    pub now_ms: i64,
    /// The refs and artifacts handed back with the result, for the parent's
    /// channel; `None` when the run ended without one.
    pub output: Option<ChannelOutput>,
}

impl RunEnd {
    /// The end of a run no process answers for (never started, or gone
    /// with its supervisor): no exit code, no result, why in `detail`.
    pub fn without_process(outcome: Terminal, detail: String, now_ms: i64) -> RunEnd {
        RunEnd {
            outcome,
            exit_code: None,
            result: None,
            detail: Some(detail),
            now_ms,
            output: None,
        }
    }
}

/// One item of [`Runs::start_runs`](crate::Runs::start_runs): what
/// [`Runs::start_run`](crate::Runs::start_run) takes for one run.
#[derive(Debug, Clone)]
pub struct StartItem {
    pub name: AgentName,
    pub run: RunId,
    pub pid: i32,
    pub cgroup: String,
    pub now_ms: i64,
    pub events: Vec<NewEvent>,
    /// The supervisor recording the start. When given, a record that names
    /// another refuses it (`Conflict`): a node declared lost whose queued
    /// agent was placed again on another node must not start it too (issue
    /// 28's campaign found both running it). `None`: not checked.
    pub supervisor: Option<String>,
}

/// An agent a restart starts again (issue 29): one item of
/// [`Recovery::recover_resuming`](crate::Recovery::recover_resuming), the
/// new run's id and the events its resume records.
#[derive(Debug, Clone)]
pub struct Resuming {
    pub tenant: TenantId,
    pub name: AgentName,
    pub run: RunId,
    pub events: Vec<NewEvent>,
}

/// What [`Recovery::recover_resuming`](crate::Recovery::recover_resuming)
/// (and [`Recovery::recover_lost_placing`](crate::Recovery::recover_lost_placing))
/// did: every agent it ended, as it is afterwards (a resumed one `queued`
/// on its new run), the names of those it resumed, parents first, and the
/// queued agents it placed again on another node (their run unchanged).
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    pub agents: Vec<Agent>,
    pub resumed: Vec<(TenantId, AgentName)>,
    pub replaced: Vec<(TenantId, AgentName)>,
}

/// An agent of a lost node placed on a live one (issue 29 item 4): one item
/// of [`Recovery::recover_lost_placing`](crate::Recovery::recover_lost_placing).
/// A queued agent is placed again as it is (same run, `to` claims it); one
/// that ran is ended lost and started again on `to` as the new run `agent.run`
/// with `agent.events` (its `agent.resume`), its history kept in its session.
#[derive(Debug, Clone)]
pub struct Placing {
    pub agent: Resuming,
    /// The live node that takes it (it is recorded `placed_on(to)` until
    /// that node claims it).
    pub to: String,
}

/// One item of [`Store::end_runs`].
#[derive(Debug, Clone)]
pub struct EndItem {
    pub name: AgentName,
    pub run: RunId,
    pub end: Option<RunEnd>,
    pub events: Vec<NewEvent>,
    /// When the events happened (milliseconds since the Unix epoch).
    pub now_ms: i64,
}

/// Spend: tokens and dollars (SPEC 7 `usage`, SPEC 9 budgets).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

impl Usage {
    pub fn add(&mut self, o: &Usage) {
        self.tokens_in = self.tokens_in.saturating_add(o.tokens_in);
        self.tokens_out = self.tokens_out.saturating_add(o.tokens_out);
        self.cost_usd += o.cost_usd;
    }
}

/// An agent's spend: its own (every run of it) and its subtree's (its own plus
/// every descendant's, finished or not), which is what its budget is held to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub own: Usage,
    pub subtree: Usage,
}

/// Proof of holding a lease: a sweeper's writes carry it, and the store refuses
/// them (`Conflict`) once the lease's row names another holder or epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub lease: String,
    pub holder: String,
    pub epoch: u64,
}

/// A mutation's first answer, kept under its `Idempotency-Key` (SPEC 11) so a
/// repeat gets the same answer without the mutation being done again.
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotentReply {
    pub tenant: TenantId,
    /// Who sent it (`user:<uid>`, `agent:<name>`): a key is its caller's
    /// own, so the same key from another caller is another key (issue 24).
    pub caller: String,
    pub key: String,
    /// Who asked and what (`<caller> <METHOD> <path>`): the same key from
    /// another caller or for another route is a different request.
    pub scope: String,
    /// sha256 of the request body, hex.
    pub request_hash: String,
    /// The HTTP status and body first answered.
    pub status: u16,
    pub body: String,
    pub created_ms: i64,
    /// After this the key is forgotten and may be used afresh.
    pub expires_ms: i64,
}

/// A job to create (SPEC 10).
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub tenant: TenantId,
    pub id: String,
    pub owner: AgentName,
    /// The job's spec as JSON (instruction, schema, worker, limits).
    pub spec: String,
    /// The job this one replays.
    pub source: Option<String>,
    pub created_ms: i64,
}

/// One input row of a job to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewItem {
    pub id: String,
    pub row_index: u32,
    /// The row as a JSON object.
    pub input: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub tenant: TenantId,
    pub id: String,
    pub owner: AgentName,
    pub status: brood_core::JobStatus,
    pub spec: String,
    pub source: Option<String>,
    pub total: u32,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub updated_ms: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobItem {
    pub tenant: TenantId,
    pub job: String,
    pub id: String,
    pub row_index: u32,
    pub input: String,
    pub status: brood_core::ItemStatus,
    /// Attempts made so far; the current one has this number.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// The one result, once completed (JSON).
    pub result: Option<String>,
    /// The worker of the current (or last) attempt.
    pub worker: Option<AgentName>,
    /// No attempt starts before this (a failed attempt's backoff).
    pub not_before_ms: i64,
    pub completed_ms: Option<i64>,
}

/// How an attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    Running,
    Completed,
    Failed,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<AttemptOutcome> {
        [
            AttemptOutcome::Running,
            AttemptOutcome::Completed,
            AttemptOutcome::Failed,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// One attempt at an item: kept for good once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub job: String,
    pub item: String,
    pub number: u32,
    pub worker: Option<AgentName>,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    pub outcome: AttemptOutcome,
    pub error: Option<String>,
}

/// An input for an agent another node runs, as its host takes it
/// (`Nodes::take_inputs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    pub agent: AgentName,
    /// Who sent it (`user:<uid>` or an agent's name), as the input's `from`.
    pub sender: String,
    pub text: String,
}

/// A node (a `brood serve` process) of the cluster sharing this store, as
/// it registers itself (issue 15).
#[derive(Debug, Clone, PartialEq)]
pub struct NewNode {
    /// Its supervisor id (the `supervisor` of the agents it runs).
    pub id: String,
    /// Where its API answers (a loopback TCP address or its socket's path).
    pub address: String,
    /// Labels for placement, `key=value` each, as a JSON object.
    pub labels: String,
    /// How many agents it takes at once, when it says.
    pub capacity: Option<u32>,
}

/// A node as the store knows it: its registration, its last heartbeat and
/// its load (the unfinished agents it runs). Its times are the store's
/// clock's, not the node's.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: String,
    pub address: String,
    pub labels: String,
    pub capacity: Option<u32>,
    pub started_ms: i64,
    pub heartbeat_ms: i64,
    /// How long ago its last heartbeat was, on the store's clock when the
    /// nodes were read: what its expiry is judged on, so that no reader's
    /// clock enters it.
    pub heartbeat_age_ms: i64,
    pub live_agents: u32,
}

/// A lock held by one process among every process sharing a store (the
/// sweepers' lease, SPEC 9), as long as this value lives: on PostgreSQL a
/// session advisory lock on a connection of its own.
pub trait HeldLock: Send {
    /// Still held (its connection alive). A lock lost must be taken again,
    /// with a new epoch.
    fn is_held(&self) -> bool;
}

/// What [`crate::Sweeps::lease_lock`] found.
pub enum LeaseLock {
    /// The store has no lock of its own (SQLite: a file lock next to the
    /// store's file does the job).
    NotShared,
    /// Held by this process now.
    Held(Box<dyn HeldLock>),
    /// Another process holds it.
    Taken,
}

/// The host recorded for an agent admitted by one node for another to run,
/// until that node claims it (`Nodes::claim_placed`): no supervisor runs it
/// yet, and none but `node` may take it.
pub fn placed_on(node: &str) -> String {
    format!("{PLACED}{node}")
}

/// The node an agent's recorded host says it waits for, when it waits to be
/// claimed.
pub fn placed_for(host: &str) -> Option<&str> {
    host.strip_prefix(PLACED)
}

const PLACED: &str = "placed:";

/// What a removal took out of the store (issue 25, [`crate::Removal`]):
/// what the caller needs to remove the rest of what the records stood for,
/// the ctx tree's files, the blob store's files and any cgroup left over.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Removed {
    /// Every agent removed, as it was: the top of the subtree first, then
    /// each agent after its parent.
    pub agents: Vec<Agent>,
    /// The channels to the tops from their parent (one a subtree removed
    /// under a parent that stays; none for a root's tree): the parent
    /// stays, so each channel's directory in its session goes alone.
    pub channels: Vec<Channel>,
    /// Jobs owned by a removed agent, removed with their items and attempts.
    pub jobs: Vec<String>,
    /// The cgroup directories the removed runs were recorded in.
    pub cgroups: Vec<String>,
    /// Blobs (SHA-256, lowercase hex) that only removed channels named: no
    /// record names them any more, and they are gone from the store's own
    /// blobs too.
    pub blobs: Vec<String>,
}

impl Removed {
    /// Adds what another removal in the same transaction took.
    pub fn extend(&mut self, other: Removed) {
        self.agents.extend(other.agents);
        self.jobs.extend(other.jobs);
        self.cgroups.extend(other.cgroups);
        for b in other.blobs {
            if !self.blobs.contains(&b) {
                self.blobs.push(b);
            }
        }
        self.channels.extend(other.channels);
    }
}

/// A tree every agent of which has finished, as `brood prune` lists them
/// ([`crate::Removal::finished_trees`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedTree {
    pub root: AgentName,
    /// How many agents it holds, the root included.
    pub agents: u32,
    /// Its last end: the latest status change of any of its agents (an
    /// end, or a later close), in milliseconds since the epoch.
    pub last_end_ms: i64,
}

/// What [`crate::Removal::remove_job`] took: the job as it was, and its
/// workers' subtrees.
#[derive(Debug, Clone, PartialEq)]
pub struct RemovedJob {
    pub job: Job,
    /// The job's own workers (children of its owner that it created,
    /// `<job>-w<n>`) with everything under them. An agent given an item
    /// with `assign` is not the job's, and stays.
    pub workers: Removed,
}
