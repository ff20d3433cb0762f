//! The supervisor: one dispatcher loop over a closed [`Cmd`] enum, plus one IO task
//! per agent process.
//!
//! The dispatcher owns all mutable state (the live agents, the waiters, the
//! cascades in flight) and is the only writer to the store, so every state change
//! is ordered and written before it is acknowledged: a reply, a protocol message or
//! a projection file is produced only after the store call that records the change
//! has returned. Slow work — launching (on the spawner thread), waiting out a grace
//! period, emptying a cgroup, writing the ctx projection — happens elsewhere and
//! comes back as a `Cmd`, so the loop never blocks on it (it does block briefly
//! on SQLite and on the small file work of a launch; ARCHITECTURE.md).
//!
//! This file holds the types, the dispatcher and its loop. The dispatcher's
//! state is a set of owned parts (`host`, `records`, `launcher`, `agents`,
//! `waiters`, `stops`, `sweep`, `sockets`, `jobs`, `cluster`, `ends`,
//! `protocol`, `models`, `restart`, `orphans`, `disk`, `admitting`); the
//! concerns without state of their own (`admission`, `launch`, `verbs`,
//! `routed`, `remove`) are lent an `Env` of the parts they read and write.
//! No part holds the dispatcher: each takes only what it reads and returns
//! what it needs done elsewhere, as follow-ups, which the loop carries out
//! in `route` under the entry points' names. What stays on the loop itself:
//! `handle` (the public handle and start-up), `batch` (starts and ends taken
//! together), `held`, `identify`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brood_core::policy::Policy;
use brood_core::{AgentEvent, AgentName, Code, FailReason, RunId, SessionName, TenantId, Terminal};
use brood_launch::cgroup::Group;
use brood_launch::{LaunchError, Launched};
use brood_proto::{FromAgent, LineError};
use brood_store::{Agent, NewEvent, Store, StoreError};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::api::{ApiError, Caller, SpawnRequest, internal};
use crate::paths::Paths;
use crate::projection::Projection;

mod admission;
mod admitting;
mod agents;
mod batch;
mod cluster;
mod disk;
mod ends;
mod ends_writer;
mod handle;
mod held;
pub use held::Held;
mod host;
use crate::hosts::node_labels;
pub use crate::hosts::supervisor_id;
mod identify;
mod in_flight;
mod io;
mod jobs;
mod launch;
mod launcher;
mod live;
use live::{Live, Pending, UnrecordedEnd};
mod models;
pub use models::{Endpoint, Gateway, GatewayHost, ModelRefusal};
mod ops;
pub use ops::handle;
mod orphans;
mod outcome;
mod outsider;
use outcome::{exit_code, outcome_of};
mod protocol;
mod queue;
mod records;
mod remove;
mod restart;
mod route;
mod routed;
mod secrets;
mod sockets;
mod starts_writer;
mod stops;
mod sweep;
mod verbs;
mod waiters;

pub use crate::metrics::Sweeper;
pub(crate) use crate::shown::to_json;
// The collector's types by their old path: `launch` keeps a run's sandbox
// for it (`collect::KeptSandbox`).
use ends::collect;
use ends::{Collect, Harvested};
use waiters::Waiters;

/// Test and benchmark hooks. Production code leaves them empty.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Called on the spawner thread right before an agent's process is forked,
    /// after its admission was recorded: lets a test cancel in that window.
    #[allow(clippy::type_complexity)]
    pub before_launch: Option<Arc<dyn Fn(&AgentName) + Send + Sync>>,
    /// Called on the start writer's thread for each start it recorded,
    /// before its answer goes to the loop (`starts_writer`): lets a test
    /// act while the record says running and the loop knows no process.
    #[allow(clippy::type_complexity)]
    pub start_recorded: Option<Arc<dyn Fn(&AgentName) + Send + Sync>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_launch", &self.before_launch.is_some())
            .field("start_recorded", &self.start_recorded.is_some())
            .finish()
    }
}

/// Binds and serves one agent's socket: called by the dispatcher (so it must
/// not block) with the supervisor, the agent, its run, the socket's path and
/// who may connect; serving stops when the returned [`Listener`] is closed.
pub type SocketHost = Arc<
    dyn Fn(
            Supervisor,
            AgentName,
            RunId,
            PathBuf,
            crate::agent_socket::Access,
        ) -> crate::agent_socket::Listener
        + Send
        + Sync,
>;

/// Serves one run's door (docs/security.md "The door"): called by the
/// dispatcher (so it must not block) with the supervisor's end of the socket
/// pair whose other end the agent holds; serving stops when the returned
/// [`Listener`] is closed or every process holding the other end is gone.
pub type DoorHost = Arc<
    dyn Fn(Supervisor, AgentName, RunId, std::os::fd::OwnedFd) -> crate::agent_socket::Listener
        + Send
        + Sync,
>;

/// How a supervisor is set up.
#[derive(Clone)]
pub struct Config {
    /// `$BROOD_ROOT`.
    pub root: PathBuf,
    /// SIGTERM to SIGKILL (SPEC 6; default 3 s).
    pub grace: Duration,
    /// Put agents in a PID namespace whose init dies with the supervisor.
    pub pid_namespace: bool,
    /// Contain agents in cgroups. Off only to exercise the fallback (process groups
    /// plus a subreaper), which is also what a host without usable cgroups gets.
    pub cgroups: bool,
    /// Start agents even when a sandbox layer their policy needs is missing on this
    /// host (`--allow-weaker-sandbox`); what was not enforced goes in `meta.json`.
    pub allow_weaker_sandbox: bool,
    /// Quota defaults and ceilings (SPEC 9), from `config.toml`.
    pub quotas: brood_core::quota::QuotaConfig,
    /// The work one request or caller may cause (issue 24), from `config.toml`'s `[limits]`.
    pub limits: crate::limits::Limits,
    /// The resource limits an agent gets when neither its policy nor an
    /// ancestor's sets them (issue 24: `disk_max`), from `config.toml`'s
    /// `[resources]`.
    pub resource_defaults: crate::config::ResourceDefaults,
    /// The control socket agents are told about (`BROOD_SOCKET`).
    pub socket: PathBuf,
    /// A directory put first on agents' `PATH` (where the `brood` binary is).
    pub bin_dir: Option<PathBuf>,
    /// The store's file when it is not `$BROOD_ROOT/brood.db` (`--store`).
    pub store: Option<PathBuf>,
    /// The concurrency-slot counter (SPEC 9): `None` for the embedded one,
    /// `redis://host[:port][/db]` for one shared by supervisors (`--slots`).
    pub slots: Option<String>,
    /// The sweepers' tick (SPEC 9: 1 s; orphans every 5 ticks, reconcile every 30).
    /// `None` runs no sweeper at all (benchmarks that time one path alone).
    pub sweep_every: Option<Duration>,
    pub hooks: Hooks,
    /// What binds and serves the per-agent sockets (SPEC 8; brood-server's
    /// `agent_sockets`). `None`: agents get no socket.
    pub agent_sockets: Option<SocketHost>,
    /// What serves the agents' doors (their one way to this supervisor that
    /// needs no socket(2); brood-server's `Entrances`). `None`: agents get
    /// no door.
    pub doors: Option<DoorHost>,
    /// The model gateway (issue 31): what opens each run's endpoint and the
    /// providers behind it. `None`: no agent gets one.
    pub gateway: Option<Gateway>,
    /// This supervisor as a node of the cluster sharing its store (issue 15):
    /// registered at start, heartbeating on the sweepers' tick, gone when it
    /// shuts down. `None` (`brood run`, tests): not a node.
    pub node: Option<NodeConfig>,
    /// Where spans go (issue 30, docs/tracing.md): `None`, tracing off.
    pub traces: Option<Arc<brood_otel::Exporter>>,
}

/// What a node says of itself when it registers (`brood serve`).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where its API answers (its `--listen` address, else its socket).
    pub address: String,
    /// `--label KEY=VALUE` for placement.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `--capacity N`: agents it takes at once.
    pub capacity: Option<u32>,
    /// A node whose heartbeat is older than this is declared lost by the
    /// others (`--node-expiry`, default 10 s).
    pub expiry: Duration,
}

impl Config {
    pub fn new(root: PathBuf) -> Config {
        let socket = root.join("brood.sock");
        Config {
            root,
            grace: Duration::from_secs(3),
            pid_namespace: true,
            cgroups: true,
            allow_weaker_sandbox: false,
            quotas: brood_core::quota::QuotaConfig::default(),
            limits: crate::limits::Limits::default(),
            resource_defaults: crate::config::ResourceDefaults::default(),
            socket,
            bin_dir: None,
            store: None,
            slots: None,
            sweep_every: Some(Duration::from_secs(1)),
            hooks: Hooks::default(),
            agent_sockets: None,
            doors: None,
            gateway: None,
            node: None,
            traces: None,
        }
    }
}

/// Errors that stop the supervisor from starting (critical, unlike the per-agent
/// failures, which are recorded and reported).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("creating {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("starting the projection thread: {0}")]
    Projection(#[source] std::io::Error),
    #[error("starting the dispatcher's thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Slots(#[from] crate::slots::SlotError),
}

/// What the host gives this supervisor, for `brood doctor` and `meta.json`.
#[derive(Debug, Clone)]
pub struct HostInfo {
    pub cgroup: String,
    pub kill: String,
    pub containment: String,
    pub supervisor_id: String,
}

pub(crate) enum Cmd {
    Spawn(Caller, Box<SpawnRequest>, Reply<brood_api::Agent>),
    /// The store's writer recorded admissions handed over (`admitting`).
    Admitted(Box<admitting::Admitted>),
    /// The store's end writer recorded ends handed over (`ends_writer`).
    EndsRecorded(Box<ends_writer::EndsRecorded>),
    /// The store's start writer recorded starts handed over (`starts_writer`).
    StartsRecorded(Box<starts_writer::StartsRecorded>),
    /// A run that ended with a result, its refs checked and artifacts taken.
    Harvested(Box<Harvested>),
    Send(Caller, AgentName, String, Reply<brood_api::InputReply>),
    Wait(
        Caller,
        Vec<AgentName>,
        Option<Duration>,
        Reply<brood_api::WaitReply>,
    ),
    Cancel(Caller, AgentName, Reply<brood_api::Agent>),
    Close(Caller, AgentName, Reply<brood_api::Agent>),
    /// A resume, with a root's secret values given again (issue 25).
    Resume(
        Caller,
        AgentName,
        Option<String>,
        Box<brood_api::Secrets>,
        Reply<brood_api::Agent>,
    ),
    Identify(i32, u32, oneshot::Sender<Result<Caller, String>>),
    /// A creation refused before it reached the dispatcher (a malformed request).
    Refused(Option<AgentName>, Option<String>, ApiError),
    Shutdown(oneshot::Sender<()>),
    Launched(
        AgentName,
        RunId,
        Result<Launched, LaunchError>,
        Box<launch::Made>,
    ),
    Agent(AgentName, RunId, AgentEv),
    /// A stop's group is empty (or could not be confirmed so: the error).
    StopDone(u64, Result<(), String>),
    /// The groups of `n` ended runs are empty: the slots they kept are free.
    Emptied(usize),
    WaitTimeout(u64),
    /// The answer to an agent's protocol `request`, computed off the loop:
    /// JSON, as the protocol's `reply` carries it.
    AgentReply(AgentName, u64, Result<Value, ApiError>),
    /// The sweepers' clock (SPEC 9).
    Tick,
    /// The model gateway asks or tells about one run's call (issue 31).
    Model(AgentName, RunId, models::ModelOp),
    /// Another node changed the shared store (issue 15): stops recorded for
    /// agents here, waits answered by ends there, events to stream.
    News,
    /// A request on an agent's socket (SPEC 8), from its connection's task.
    AgentSocket(AgentName, crate::agent_socket::Request),
    /// Jobs (SPEC 10): start, cancel, a worker's report, assign, retry.
    Job(Caller, jobs::JobOp),
    /// A finished tree or a job removed (issue 25).
    Remove(Caller, remove::RemoveOp),
    /// The running agents' `artifact/` measured against their `disk_max`:
    /// those over it (issue 24).
    DiskChecked(Vec<disk::DiskOver>),
    /// A child another node ran ended and its artifacts were fetched into
    /// its parent's channel here (issue 15): the parent hears of it now.
    EndedElsewhere(Box<routed::EndedElsewhere>),
    /// What the dispatcher holds for agents, counted (`held`).
    Held(Reply<Held>),
}

/// What an agent's IO task reports.
pub(crate) enum AgentEv {
    Msg(FromAgent),
    Unknown(String),
    Bad(LineError),
    ExecOut(Vec<u8>),
    Stderr(String),
    Exited { status: i32 },
}

/// Where a verb's answer goes: the caller awaiting it, typed as the verb's
/// `brood_api` answer. (An agent's protocol `request` is answered by a task
/// that awaits the verb and hands the JSON back as [`Cmd::AgentReply`].)
pub(crate) type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// Answers a verb's caller; one that stopped waiting is not an error.
pub(crate) fn answer<T>(reply: Reply<T>, r: Result<T, ApiError>) {
    let _ = reply.send(r);
}

/// A handle to a running supervisor. Cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    tx: mpsc::UnboundedSender<Cmd>,
    store: Arc<dyn Store>,
    tenant: TenantId,
    paths: Paths,
    info: HostInfo,
    projection: Projection,
    metrics: Arc<crate::metrics::Metrics>,
    /// The spans of admissions and runs (off unless configured).
    tracer: crate::trace::Tracer,
    /// What a creation is checked against before the dispatcher sees it:
    /// the callers' rates, the paths it names (issue 24).
    intake: Arc<crate::intake::Intake>,
    me: String,
    /// The operator proven off the loop (`outsider`).
    outsiders: Arc<outsider::Outsiders>,
    /// Whether the store answers, probed off the loop.
    store_health: Arc<crate::store_health::StoreHealth>,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn new_run_id() -> RunId {
    let u = uuid::Uuid::now_v7();
    // The uuid crate renders lowercase hyphenated; parse to keep the type's proof.
    RunId::parse(&u.hyphenated().to_string()).unwrap_or_else(|_| {
        let b = u.as_u128();
        RunId::v7(now_ms() as u64, (b >> 64) as u16, b as u64)
    })
}

/// The dispatcher: the loop's state, as owned parts (ARCHITECTURE.md
/// "The supervisor's parts"). Each part holds its own state; the loop routes
/// every [`Cmd`] to the method that handles it, and a method borrows only the
/// parts it needs.
struct Dispatcher {
    /// Who this supervisor is and what it hands out: read-only after start.
    host: host::Host,
    /// The store and what follows a write of it: the ctx projection, the
    /// change counter, the news flag. Every record goes through it.
    records: records::Records,
    /// Starting processes: the spawner, cgroups, slots, the veil and the
    /// queue of admitted agents waiting for a slot; the queue served and
    /// each launch worked out and taken up (`launch`, `route::launch`).
    launcher: launcher::Launcher,
    /// The agents this supervisor runs, and what it tracks of children and
    /// waits across nodes.
    agents: agents::Agents,
    waiters: Waiters,
    /// The ids of waits (`Cmd::WaitTimeout` names one).
    next_id: u64,
    /// The stops in flight: their subtrees being emptied, then recorded.
    stops: stops::Stops,
    /// The sweepers (SPEC 9): the lease when this supervisor holds it, the
    /// ticks, and the passes, which write the store only and return what
    /// follows on this node (`route::tick`).
    sweep: sweep::Sweeps,
    /// The per-agent sockets (SPEC 8) of agents that can take input.
    sockets: sockets::Sockets,
    /// The jobs this supervisor runs and their workers (SPEC 10).
    jobs: jobs::Runner,
    /// The zombies it adopted and the keeper's deaths, watched each tick.
    orphans: orphans::Orphans,
    /// The running agents' disk, measured each tick.
    disk: disk::DiskWatch,
    /// While a batch of ends is handled: the ends waiting to be recorded
    /// together (`batch`).
    ends_together: Option<Vec<ends::Ending>>,
    /// A run's end and what follows it: the collection of its result, the
    /// projection, the parent and the waiters told (`ends`).
    ends: ends::Ends,
    /// What the agents' processes say and do: messages, usage and budgets,
    /// exits (`protocol`).
    relay: protocol::Relay,
    /// What the start resumed of a dead incarnation's agents (issue 29).
    restart: restart::Restart,
    /// This supervisor as a node of its store's cluster: its heartbeats,
    /// placement, the nodes lost and what moves off them (issue 15).
    cluster: cluster::Cluster,
    /// Admissions handed to the store's writer and not yet answered, and
    /// the creations waiting for them (issue 27).
    admitting: admitting::Admitting,
    /// Ends handed to the store's end writer and not yet answered.
    ends_writer: ends_writer::EndsWriter,
    /// Starts handed to the store's start writer and not yet answered.
    starts_writer: starts_writer::StartsWriter,
    /// The model gateway's part: the tenant's model calls in the current
    /// minute (issue 31); each call checked and metered (`route::models`).
    models: models::Models,
    /// When the shutdown began, and whether what it waits for was said.
    shutting: Option<(std::time::Instant, bool)>,
}

/// An event of `agent`'s log, in its recorded form (`brood_proto::event`).
fn ev(agent: &AgentName, run: Option<&RunId>, session: &SessionName, e: AgentEvent) -> NewEvent {
    ev_value(agent, run, session, brood_proto::event::payload(&e))
}

/// [`ev`] from a payload already rendered (one with fields added to a typed
/// event's, as `agent.start` has).
fn ev_value(
    agent: &AgentName,
    run: Option<&RunId>,
    session: &SessionName,
    payload: Value,
) -> NewEvent {
    let kind = payload
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("event")
        .to_owned();
    NewEvent {
        agent: agent.clone(),
        run: run.cloned(),
        session: session.clone(),
        kind,
        payload: payload.to_string(),
    }
}

impl Dispatcher {
    /// The loop: one command at a time, then what follows any command.
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        // Commands read ahead of the one at hand (`batch::gather`), taken first.
        let mut ahead: std::collections::VecDeque<Cmd> = std::collections::VecDeque::new();
        // What the start resumed goes first, before any command.
        self.take_up_resumed();
        self.after_command(&mut shutdown);
        loop {
            let cmd = match ahead.pop_front() {
                Some(c) => c,
                None => match rx.recv().await {
                    Some(c) => c,
                    None => return,
                },
            };
            // Back from a pause past its expiry, a node learns whether it
            // was declared lost before it acts for any agent
            // (`cluster::moved`).
            self.fence_if_stale();
            // Creations, starts and ends queued together are recorded
            // together (`batch`); the starts and ends of lone agents (a root
            // with no child here) also from further back in the queue.
            let parents = std::cell::OnceCell::new();
            let live = &self.agents.live;
            let lone = |n: &AgentName| {
                let parents: &HashSet<&AgentName> = parents
                    .get_or_init(|| live.values().filter_map(|l| l.parent.as_ref()).collect());
                live.get(n).is_some_and(|l| l.parent.is_none()) && !parents.contains(n)
            };
            let work = batch::gather(cmd, &mut ahead, &mut rx, shutdown.is_some(), &lone);
            match work {
                batch::Work::Spawns(s) => self.on_spawns(s),
                batch::Work::Starts(s) => self.on_launches(s),
                batch::Work::Exits(e) => self.on_exits(e),
                batch::Work::One(cmd) => self.dispatch(cmd, &mut shutdown),
            }
            self.after_command(&mut shutdown);
        }
    }

    /// One command to the method that handles it.
    fn dispatch(&mut self, cmd: Cmd, shutdown: &mut Option<oneshot::Sender<()>>) {
        if self.waits_for_its_end(&cmd) {
            self.ends_writer.flight.hold(cmd);
            return;
        }
        if self.waits_for_its_start(&cmd) {
            self.starts_writer.flight.hold(cmd);
            return;
        }
        match cmd {
            Cmd::Spawn(caller, req, reply) => self.on_spawn(caller, *req, reply),
            Cmd::Admitted(a) => self.on_admitted(*a, shutdown.is_some()),
            Cmd::EndsRecorded(r) => {
                self.on_ends_recorded(*r);
                for held in self.ends_writer.flight.take_held() {
                    self.dispatch(held, shutdown);
                }
            }
            Cmd::StartsRecorded(r) => {
                self.on_starts_recorded(*r);
                for held in self.starts_writer.flight.take_held() {
                    self.dispatch(held, shutdown);
                }
            }
            Cmd::Harvested(h) => self.on_harvested(*h),
            // A verb naming an agent whose creation is in flight is asked
            // again later (`admitting`); one whose end is in flight was held
            // above; a wait for one is answered when the end is recorded.
            Cmd::Send(caller, name, text, reply) => answer(
                reply,
                self.settled(&name)
                    .and_then(|()| self.on_send(&caller, &name, &text)),
            ),
            Cmd::Wait(caller, names, timeout, reply) => {
                match names
                    .iter()
                    .try_for_each(|n| self.admitting.check_settled(n))
                {
                    Ok(()) => self.on_wait(&caller, names, timeout, reply),
                    Err(e) => answer(reply, Err(e)),
                }
            }
            Cmd::Cancel(caller, name, reply) => answer(
                reply,
                self.settled(&name)
                    .and_then(|()| self.on_cancel(&caller, &name)),
            ),
            Cmd::Close(caller, name, reply) => answer(
                reply,
                self.settled(&name)
                    .and_then(|()| self.on_close(&caller, &name)),
            ),
            Cmd::Resume(caller, name, text, secrets, reply) => match self.settled(&name) {
                Ok(()) => self.on_resume(&caller, &name, text, *secrets, reply),
                Err(e) => answer(reply, Err(e)),
            },
            Cmd::Refused(parent, requested, e) => {
                self.note_refusal(parent.as_ref(), requested.as_deref(), None, &e)
            }
            Cmd::Identify(pid, uid, reply) => {
                let _ = reply.send(self.host.identify(&self.launcher, &self.agents, pid, uid));
            }
            Cmd::Launched(name, run, r, made) => self.on_launched(name, run, r, *made),
            Cmd::Agent(name, run, e) => self.on_agent(name, run, e),
            Cmd::StopDone(id, emptied) => self.on_stop_done(id, emptied),
            Cmd::Emptied(n) => self.launcher.emptied(n),
            Cmd::AgentReply(agent, re, r) => self.agents.reply_to_agent(&agent, re, r),
            Cmd::AgentSocket(name, r) => self.on_agent_socket(name, r),
            Cmd::Model(name, run, op) => self.on_model(name, run, op),
            Cmd::Tick => {
                self.sweep
                    .tick_queued
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                if shutdown.is_none() {
                    self.on_tick();
                    self.job_tick();
                }
            }
            Cmd::News => {
                let changed = self.records.heard.take();
                if shutdown.is_none() {
                    self.on_news(changed);
                }
            }
            Cmd::Job(caller, op) => self.on_job(&caller, op),
            Cmd::Remove(caller, op) => remove::Env {
                records: &self.records,
                agents: &mut self.agents,
                jobs: &self.jobs,
                paths: &self.host.paths,
                cgroups: self.launcher.cgroups.as_ref(),
            }
            .on_remove(&caller, op),
            Cmd::EndedElsewhere(e) => self.on_ended_elsewhere(*e),
            Cmd::DiskChecked(over) => {
                for name in self.disk.checked(over, &mut self.agents) {
                    self.stop_subtree(&name, Terminal::Failed(FailReason::BudgetExceeded));
                }
            }
            Cmd::WaitTimeout(id) => {
                if let Some(w) = self.waiters.take(id) {
                    answer(w.reply, self.wait_result(&w.names, true));
                }
            }
            Cmd::Held(reply) => answer(reply, Ok(self.held())),
            Cmd::Shutdown(reply) => {
                self.shutting = Some((std::time::Instant::now(), false));
                self.begin_shutdown();
                *shutdown = Some(reply);
            }
        }
    }

    /// After every command: a freed slot goes to the next in line, and a
    /// shutdown whose trees are all gone removes the cgroups and answers.
    fn after_command(&mut self, shutdown: &mut Option<oneshot::Sender<()>>) {
        if shutdown.is_none() {
            self.drive_jobs();
        }
        // A slot freed by whatever this command did goes to the next in line
        // (not while shutting down: nothing new starts then).
        if shutdown.is_none() {
            self.release_resumed();
            self.pump_queue();
            // Without a tick to give them back, spare slots go at once.
            if self.host.cfg.sweep_every.is_none() {
                self.launcher.give_spare(&self.records.tenant);
            }
        } else {
            self.launcher.give_spare(&self.records.tenant);
            self.launcher.waiting.clear();
        }
        if shutdown.is_some() && (self.nothing_left() || self.out_of_patience()) {
            if let Some(c) = &self.launcher.cgroups {
                if let Err(e) = c.destroy() {
                    tracing::error!(error = %e, "removing the supervisor's cgroups failed");
                }
                // The instance directory is shared with later incarnations of this
                // root; remove it when no other one is using it (rmdir refuses then).
                c.remove_instance_dirs();
            }
            if let Some(s) = shutdown.take() {
                let _ = s.send(());
            }
        }
    }

    /// A verb may act on `name`: its creation is not in flight
    /// (`admitting`); otherwise `Conflict`, to ask again.
    fn settled(&self, name: &AgentName) -> Result<(), ApiError> {
        self.admitting.check_settled(name)
    }

    /// The agent a verb acts on, when its end is in flight (`ends_writer`):
    /// the verb is held until the end is recorded, then handled as it would
    /// have been right after (a cancel finds it ended, a close closes it).
    fn waits_for_its_end(&self, cmd: &Cmd) -> bool {
        verb_names(cmd).is_some_and(|n| self.ends_writer.flight.contains(n))
    }

    /// The agent a command acts on or comes from, when its start is in
    /// flight (`starts_writer`): the command is held until the start is
    /// recorded, then handled as it would have been right after (its record
    /// says `running` then: a child is admitted only under a running
    /// parent).
    fn waits_for_its_start(&self, cmd: &Cmd) -> bool {
        let name = match cmd {
            Cmd::Spawn(caller, req, _) => match caller {
                Caller::Agent(me) => Some(me),
                Caller::User { .. } => req.parent.as_ref(),
            },
            Cmd::AgentSocket(n, _) | Cmd::Model(n, ..) => Some(n),
            Cmd::Job(Caller::Agent(me), _) => Some(me),
            _ => verb_names(cmd),
        };
        name.is_some_and(|n| self.starts_writer.flight.contains(n))
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Removes a live agent, giving back its slot if it held one: the one place
    /// an agent leaves the live set, so a slot is never held by a process that
    /// is gone (SPEC 9).
    fn forget(&mut self, name: &AgentName) -> Option<Live> {
        let l = self.forget_holding_slot(name)?;
        if l.launching {
            self.launcher.give_slots(1);
        }
        Some(l)
    }

    /// [`Self::forget`] for a run whose end is recorded while its group may
    /// still hold what it left running: its slot, if it held one, is kept
    /// until that group is empty (`Cmd::Emptied`). Returns whether it was.
    /// Without cgroups, or without a group, there is nothing to wait for.
    fn forget_until_emptied(&mut self, name: &AgentName, group: Option<&Group>) -> bool {
        let Some(l) = self.forget_holding_slot(name) else {
            return false;
        };
        if !l.launching {
            return false;
        }
        if group.is_some() && self.launcher.cgroups.is_some() {
            self.launcher.hold_until_emptied();
            true
        } else {
            self.launcher.give_slots(1);
            false
        }
    }

    /// Removes a live agent and what follows it (its socket, its job
    /// worker's note); the slot it may hold is the caller's to give back.
    fn forget_holding_slot(&mut self, name: &AgentName) -> Option<Live> {
        self.sock_end(name);
        self.jobs.note_gone(name);
        let l = self.agents.live.remove(name)?;
        crate::room::give_back(&mut self.agents.live);
        Some(*l)
    }

    fn handle(&self) -> Supervisor {
        handle_of(&self.host, &self.records)
    }
}

/// The handle of the supervisor whose host and records these are: what a
/// part that holds no dispatcher hands a door or a gateway it opens.
fn handle_of(host: &host::Host, records: &records::Records) -> Supervisor {
    Supervisor {
        tx: host.tx.clone(),
        store: records.store.clone(),
        tenant: records.tenant.clone(),
        paths: host.paths.clone(),
        info: host.info.clone(),
        projection: records.projection.clone(),
        metrics: host.metrics.clone(),
        tracer: host.tracer.clone(),
        intake: host.intake.clone(),
        me: host.me.clone(),
        outsiders: host.outsiders.clone(),
        store_health: host.store_health.clone(),
    }
}

/// The effective policy recorded in an agent's spec at admission.
fn stored_policy(spec: &Value, operator: &Policy) -> Result<Policy, ApiError> {
    crate::objects::policy_of(spec, operator).map_err(|e| {
        tracing::error!(error = %e, "a stored policy does not read back");
        ApiError::new(Code::Internal, "the agent's stored policy is unreadable")
    })
}

fn now_unix_s() -> u64 {
    (now_ms().max(0) / 1000) as u64
}

/// A run's deadline in whole seconds, for its children's attenuation: the
/// second its `timeout_s` ends in, rounded *up*. A child that inherits the
/// rest of its parent's time (`deadline - now`, whole seconds) then gets at
/// least what is really left, never a second less, and the store caps every
/// run's deadline at its parent's to the millisecond (`U_RUN_STARTED`): such
/// a child ends exactly with its parent, as one subtree, swept together.
fn deadline_unix_s(started_ms: i64, timeout_s: u64) -> u64 {
    (started_ms.max(0) as u64)
        .saturating_add(timeout_s.saturating_mul(1000))
        .div_ceil(1000)
}

/// The task an agent was created with (kept in its launch spec, so roots have one too).
fn task_of(a: &Agent) -> String {
    serde_json::from_str::<Value>(&a.spec)
        .ok()
        .and_then(|v| v.get("task").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

fn rand_u32() -> u32 {
    let u = uuid::Uuid::now_v7().as_u128();
    (u as u32) ^ ((u >> 32) as u32)
}

/// The agent a verb (send, cancel, close, resume) acts on.
fn verb_names(cmd: &Cmd) -> Option<&AgentName> {
    match cmd {
        Cmd::Send(_, n, ..)
        | Cmd::Cancel(_, n, _)
        | Cmd::Close(_, n, _)
        | Cmd::Resume(_, n, ..) => Some(n),
        _ => None,
    }
}
