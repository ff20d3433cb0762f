//! The supervisor: one dispatcher loop over a closed [`Cmd`] enum, plus one IO task
//! per agent process.
//!
//! The dispatcher owns all mutable state (the live agents, the waiters, the
//! cascades in flight) and is the only writer to the store, so every state change
//! is ordered and written before it is acknowledged: a reply, a protocol message or
//! a projection file is produced only after the store call that records the change
//! has returned. Slow work — launching (on the spawner thread), waiting out a grace
//! period, emptying a cgroup, writing the ctx projection — happens elsewhere and
//! comes back as a `Cmd`, so the loop never blocks on it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use brood_core::policy::{Policy, PolicyRequest};
use brood_core::{
    AgentEvent, AgentName, CancelReason, Code, FailReason, Iso, Life, ParentView, RunId,
    SessionName, Status, TenantId, Terminal,
};
use brood_launch::cgroup::{Cgroups, Group, GroupPath};
use brood_launch::env::{Base, Identity};
use brood_launch::{LaunchError, LaunchSpec, Launched, Spawner};
use brood_proto::{DoneResult, FromAgent, HistoryMessage, InitConfig, LineError, ToAgent};
use brood_store::{Agent, EndItem, NewAgent, NewEvent, Protocol, RunEnd, Store, StoreError};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::api::{ApiError, ApiResult, Caller, SpawnRequest};
use crate::io;
use crate::paths::Paths;
use crate::projection::Projection;

mod collect;
mod identify;
mod orphans;
mod queue;
mod sockets;
mod stops;
mod sweep;
mod waiters;

use collect::{Collect, Harvested};
use stops::Stop;
pub use sweep::Sweeper;
use waiters::Waiters;

/// Test and benchmark hooks. Production code leaves them empty.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Called on the spawner thread right before an agent's process is forked,
    /// after its admission was recorded: lets a test cancel in that window.
    #[allow(clippy::type_complexity)]
    pub before_launch: Option<Arc<dyn Fn(&AgentName) + Send + Sync>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("before_launch", &self.before_launch.is_some())
            .finish()
    }
}

/// How a supervisor is set up.
#[derive(Debug, Clone)]
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
            socket,
            bin_dir: None,
            store: None,
            slots: None,
            sweep_every: Some(Duration::from_secs(1)),
            hooks: Hooks::default(),
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
    Spawn(Caller, Box<SpawnRequest>, Reply),
    /// A run that ended with a result, its refs checked and artifacts taken.
    Harvested(Box<Harvested>),
    Send(Caller, AgentName, String, Reply),
    Wait(Caller, Vec<AgentName>, Option<Duration>, Reply),
    Cancel(Caller, AgentName, Reply),
    Close(Caller, AgentName, Reply),
    Resume(Caller, AgentName, Option<String>, Reply),
    Identify(i32, oneshot::Sender<Option<Caller>>),
    /// A creation refused before it reached the dispatcher (a malformed request).
    Refused(Option<AgentName>, Option<String>, ApiError),
    Shutdown(oneshot::Sender<()>),
    Launched(AgentName, RunId, Result<Launched, LaunchError>),
    Agent(AgentName, RunId, AgentEv),
    /// A stop's group is empty (or could not be confirmed so: the error).
    StopDone(u64, Result<(), String>),
    WaitTimeout(u64),
    /// The answer to an agent's protocol `request`, computed off the loop.
    AgentReply(AgentName, u64, ApiResult),
    /// The sweepers' clock (SPEC 9).
    Tick,
    /// A request on an agent's socket (SPEC 8), from its connection's task.
    AgentSocket(AgentName, crate::agent_socket::Request),
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

/// Where an answer goes: a caller awaiting a oneshot, or an agent's stdin as a
/// protocol `reply`.
pub(crate) enum Reply {
    Api(oneshot::Sender<ApiResult>),
    Agent { agent: AgentName, re: u64 },
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
    me: String,
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

/// Our identity as a supervisor: `s<pid>-<starttime>`, unique for the life of the
/// host, so a later incarnation can tell whether its predecessor still runs.
pub fn supervisor_id(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime) counted after the ")" that ends the command name.
    let rest = stat.rsplit_once(')')?.1;
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("s{pid}-{start}"))
}

fn supervisor_alive(id: &str) -> bool {
    let Some(pid) = id
        .strip_prefix('s')
        .and_then(|r| r.split_once('-'))
        .and_then(|(p, _)| p.parse::<i32>().ok())
    else {
        return false;
    };
    supervisor_id(pid).as_deref() == Some(id)
}

impl Supervisor {
    /// Opens the store, cleans up after a dead predecessor, and starts the
    /// dispatcher on the current tokio runtime.
    pub fn start(cfg: Config) -> Result<Supervisor, StartError> {
        let uid = unsafe_geteuid();
        let paths = Paths::new(cfg.root.clone(), uid).with_db(cfg.store.clone());
        for d in [paths.root.clone(), paths.ctx(), paths.root.join("ns")] {
            std::fs::create_dir_all(&d).map_err(|source| StartError::Dir { path: d, source })?;
        }
        // `ctx/` itself belongs to the tree's owner like everything in it, so
        // an agent (uid 0 without capabilities) can neither add an entry
        // beside `agent/` and `home/` nor rename them.
        if let Some(owner) = crate::projection::ctx_owner() {
            let ctx = paths.ctx();
            std::os::unix::fs::lchown(&ctx, Some(owner), Some(owner))
                .map_err(|source| StartError::Dir { path: ctx, source })?;
        }
        let store: Arc<dyn Store> = Arc::new(brood_store::SqliteStore::open(&paths.db())?);
        let tenant = TenantId::for_uid(uid);
        let me = supervisor_id(std::process::id() as i32)
            .unwrap_or_else(|| format!("s{}-0", std::process::id()));
        let projection = Projection::start().map_err(StartError::Projection)?;
        let slots = crate::slots::open(cfg.slots.as_deref())?;

        // Cgroups: detect, reap what an earlier incarnation left, open ours.
        let instance = crate::paths::instance_key(&paths.root);
        let (cgroups, cgroup_desc, kill_desc) =
            match brood_launch::cgroup::detect(std::path::Path::new("/")).and_then(|det| {
                if !cfg.cgroups {
                    return Err(brood_launch::cgroup::CgroupError::NoCgroupFs(
                        "disabled by configuration".into(),
                    ));
                }
                match Cgroups::reap_leftovers(&det, &instance) {
                    Ok(l) => tracing::info!(?l, "reaped leftover cgroups"),
                    Err(e) => tracing::warn!(error = %e, "reaping leftover cgroups failed"),
                }
                Cgroups::open(&det, &instance)
            }) {
                Ok(c) => {
                    let d = format!("{:?} at {}", c.layout(), c.base().display());
                    let k = c.kill_mechanism().to_owned();
                    (Some(Arc::new(c)), d, k)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no cgroups: falling back to process groups");
                    (
                        None,
                        format!("unavailable ({e}); process groups plus a subreaper"),
                        "killpg (a setsid'd process can escape)".to_owned(),
                    )
                }
            };

        // Agents of supervisors that are gone: their processes died with them (or
        // were just reaped with their cgroups); record that truthfully.
        let dead: Vec<String> = store
            .supervisors_with_unfinished()?
            .into_iter()
            .filter(|s| !supervisor_alive(s))
            .collect();
        if !dead.is_empty() {
            let recovered = store.recover(&dead, now_ms())?;
            for a in &recovered {
                project_agent(&projection, &paths, a, None);
            }
            tracing::info!(
                count = recovered.len(),
                "recovered agents of dead supervisors"
            );
        }

        // The ctx tree is a projection of the store: rebuild it whole, so whatever
        // happened to the files while no supervisor ran (a crash mid-write, a
        // deleted tree, the records recovery just wrote) is made true again.
        let operator = Policy::operator(uid, unsafe_getegid(), supplementary_groups());
        match crate::rebuild::rebuild(
            store.as_ref(),
            &tenant,
            &paths,
            &operator,
            cfg.bin_dir.as_deref(),
        ) {
            Ok(r) => tracing::info!(agents = r.agents, files = r.files, "ctx tree rebuilt"),
            Err(e) => tracing::error!(error = %e, "rebuilding the ctx tree failed"),
        }
        let spawner = Spawner::start(cfg.pid_namespace)?;
        // Brood's machinery out of every agent's reach (issue 11): a root
        // supervisor covers it in the mount namespace every agent joins. One that is
        // not root cannot mount; `brood doctor` says so.
        let veil = if uid == 0 {
            // The lock exists before any agent could make it first.
            let lock = paths.sweeper_lock();
            if let Err(e) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&lock)
            {
                tracing::warn!(path = %lock.display(), error = %e, "creating the sweeper lock");
            }
            match crate::veil::Veil::new(&paths) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::error!(error = %e, "no veil: brood's machinery is not hidden from agents");
                    None
                }
            }
        } else {
            None
        };
        let info = HostInfo {
            cgroup: cgroup_desc,
            kill: kill_desc,
            containment: spawner.containment().describe(),
            supervisor_id: me.clone(),
        };
        // What every agent's meta.json says about its containment (SPEC 6: a
        // weaker containment is marked on each agent).
        let weaker = cgroups.is_none()
            || !matches!(
                spawner.containment(),
                brood_launch::Containment::PidNamespace { .. }
            );
        let meta = json!({
            "containment": {
                "cgroup": info.cgroup,
                "kill": info.kill,
                "supervisor_death": info.containment,
                "weaker": weaker,
            },
            "supervisor": me,
        });
        let cfg_quotas = cfg.quotas;
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let disp_me = me.clone();
        let base = Base::from_supervisor(cfg.bin_dir.as_ref().and_then(|p| p.to_str()));
        let disp = Dispatcher {
            cfg,
            tx: tx.clone(),
            store: store.clone(),
            tenant: tenant.clone(),
            paths: paths.clone(),
            projection: projection.clone(),
            cgroups,
            spawner,
            base,
            me,
            meta,
            info: info.clone(),
            uid,
            brood_exe: std::env::current_exe().ok(),
            gid: unsafe_getegid(),
            groups: supplementary_groups(),
            live: HashMap::new(),
            waiting: queue::Queue::default(),
            max_concurrent: cfg_quotas
                .effective(store.tenant_quotas(&tenant).ok().as_ref())
                .max_concurrent,
            waiters: Waiters::default(),
            stops: HashMap::new(),
            next_id: 1,
            sweep: sweep::SweepState::default(),
            sockets: sockets::Sockets::default(),
            metrics: metrics.clone(),
            slots,
            netns_pool: None,
            veil,
            veil_ns: None,
        };
        if let Some(every) = disp.cfg.sweep_every {
            sweep::start_clock(tx.clone(), every);
        }
        tokio::spawn(disp.run(rx));
        Ok(Supervisor {
            tx,
            store,
            tenant,
            paths,
            info,
            projection,
            metrics,
            me: disp_me,
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    pub fn paths(&self) -> &Paths {
        &self.paths
    }
    pub fn host_info(&self) -> &HostInfo {
        &self.info
    }

    /// Resolves once every ctx file written so far is visible.
    pub async fn flush(&self) {
        self.projection.flush().await;
    }

    async fn call(&self, mk: impl FnOnce(Reply) -> Cmd) -> ApiResult {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(mk(Reply::Api(tx)))
            .map_err(|_| ApiError::new(Code::Internal, "the supervisor has stopped"))?;
        rx.await
            .map_err(|_| ApiError::new(Code::Internal, "the supervisor has stopped"))?
    }

    pub async fn spawn(&self, caller: Caller, req: SpawnRequest) -> ApiResult {
        self.call(|r| Cmd::Spawn(caller, Box::new(req), r)).await
    }
    pub async fn send(&self, caller: Caller, name: AgentName, text: String) -> ApiResult {
        self.call(|r| Cmd::Send(caller, name, text, r)).await
    }
    /// Resolves when every named agent's run is over (records final), or at the
    /// timeout. The ctx files catch up asynchronously: call [`Supervisor::flush`]
    /// before reading them (the wire verbs do).
    pub async fn wait(
        &self,
        caller: Caller,
        names: Vec<AgentName>,
        timeout: Option<Duration>,
    ) -> ApiResult {
        self.call(|r| Cmd::Wait(caller, names, timeout, r)).await
    }
    pub async fn cancel(&self, caller: Caller, name: AgentName) -> ApiResult {
        self.call(|r| Cmd::Cancel(caller, name, r)).await
    }
    pub async fn close(&self, caller: Caller, name: AgentName) -> ApiResult {
        self.call(|r| Cmd::Close(caller, name, r)).await
    }
    pub async fn resume(&self, caller: Caller, name: AgentName, text: Option<String>) -> ApiResult {
        self.call(|r| Cmd::Resume(caller, name, text, r)).await
    }

    /// Notes a creation refused while its request was read (see `note_refusal`).
    pub(crate) fn refused(
        &self,
        parent: Option<AgentName>,
        requested: Option<String>,
        e: ApiError,
    ) {
        let _ = self.tx.send(Cmd::Refused(parent, requested, e));
    }

    /// Who is calling, from a peer's pid (peer credentials): the agent whose
    /// cgroup (or, failing that, ancestry) holds that process, or a user
    /// provably outside every tree; refused for a process inside a tree that
    /// no live agent accounts for (`supervisor::identify`).
    pub async fn identify(&self, pid: i32, uid: u32) -> Result<Caller, ApiError> {
        let (tx, rx) = oneshot::channel();
        let nobody = || {
            ApiError::new(
                Code::Forbidden,
                format!(
                    "the caller (pid {pid}) is inside an agent tree but belongs to no live agent"
                ),
            )
        };
        if self.tx.send(Cmd::Identify(pid, tx)).is_err() {
            return Err(ApiError::new(
                Code::Internal,
                "the supervisor is shutting down",
            ));
        }
        match rx.await {
            Ok(Some(Caller::User { .. })) => Ok(Caller::User { uid }),
            Ok(Some(a)) => Ok(a),
            Ok(None) => Err(nobody()),
            Err(_) => Err(ApiError::new(
                Code::Internal,
                "the supervisor is shutting down",
            )),
        }
    }

    /// Stops every live agent (cancelled, reason `user`) and waits until their
    /// processes are gone and their groups removed.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
        self.flush().await;
    }

    /// The metrics as Prometheus text (`GET /metrics` on the control socket),
    /// with the gauges counted from the store now.
    pub fn metrics_text(&self) -> String {
        let mut g = crate::metrics::Gauges::default();
        if let Ok(mine) = self.store.unfinished_of(std::slice::from_ref(&self.me)) {
            for a in mine {
                match a.status {
                    Status::Queued => g.queued += 1,
                    Status::Blocked => {
                        g.blocked += 1;
                        g.live += 1;
                    }
                    _ => g.live += 1,
                }
            }
        }
        self.metrics.render(g)
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// Read-only views of the store (the same ones the CLI uses without a daemon).
    pub fn view(&self) -> crate::view::View {
        crate::view::View::new(self.store.clone(), self.tenant.clone())
    }
}

pub(crate) fn agent_json(store: &Arc<dyn Store>, a: &Agent) -> Value {
    let run = store.run(&a.tenant, &a.run).ok().flatten();
    json!({
        "name": a.name.as_str(),
        "parent": a.parent.as_ref().map(|p| p.as_str()),
        "customer": a.customer.as_ref().map(|p| p.as_str()),
        "status": a.status.api_word(),
        "state": a.status.encode(),
        "reason": a.status.reason(),
        "detail": a.detail,
        "depth": a.depth,
        "session": a.session.as_str(),
        "protocol": a.protocol.as_str(),
        "run": a.run.as_str(),
        "pid": run.as_ref().and_then(|r| if a.status.is_live() { r.pid } else { None }),
        "cgroup": run.as_ref().and_then(|r| r.cgroup.clone()),
        "result": run.as_ref().and_then(|r| r.result.clone()),
        "exit_code": run.as_ref().and_then(|r| r.exit_code),
        "created_ms": a.created_ms,
        "updated_ms": a.updated_ms,
        "started_ms": run.as_ref().and_then(|r| r.started_ms),
        "ended_ms": run.as_ref().and_then(|r| r.ended_ms),
        "tokens_in": run.as_ref().map(|r| r.tokens_in),
        "tokens_out": run.as_ref().map(|r| r.tokens_out),
        "cost_usd": run.as_ref().map(|r| r.cost_usd),
    })
}

pub(crate) fn run_json(r: &brood_store::Run) -> Value {
    json!({
        "id": r.id.as_str(), "seq": r.seq, "pid": r.pid, "cgroup": r.cgroup,
        "outcome": r.outcome.map(|t| t.encode()), "exit_code": r.exit_code,
        "started_ms": r.started_ms, "ended_ms": r.ended_ms,
        "tokens_in": r.tokens_in, "tokens_out": r.tokens_out, "cost_usd": r.cost_usd,
    })
}

pub(crate) fn internal(e: StoreError) -> ApiError {
    tracing::error!(error = %e, "store error");
    match e {
        StoreError::Refused { code, message } => ApiError::new(code, message),
        StoreError::NotFound { name, .. } => {
            ApiError::new(Code::NotFound, format!("no agent named {name:?}"))
        }
        StoreError::Transition { name, source } => {
            ApiError::new(Code::Conflict, format!("agent {name}: {source}"))
        }
        _ => ApiError::new(Code::Internal, "store error (see the supervisor's log)"),
    }
}

pub(crate) fn not_found(name: &AgentName) -> ApiError {
    ApiError::new(Code::NotFound, format!("no agent named {name:?}"))
}

fn unsafe_getegid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The supervisor's supplementary groups (getgroups(2)).
fn supplementary_groups() -> std::collections::BTreeSet<u32> {
    let mut buf = vec![0 as libc::gid_t; 256];
    // SAFETY: the buffer holds 256 entries and we pass its length.
    let n = unsafe { libc::getgroups(buf.len() as libc::c_int, buf.as_mut_ptr()) };
    buf.truncate(n.max(0) as usize);
    buf.into_iter().collect()
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Writes an agent's status into its control files, session `state` and its
/// parent's channel `status`: the one place the ABI mapping reaches the disk.
pub(crate) fn project_agent(proj: &Projection, paths: &Paths, a: &Agent, pid: Option<i32>) {
    // A finished temp agent's object is gone (or going): only its session.
    for (path, text) in status_files(paths, a, pid, !crate::objects::object_removed(a)) {
        proj.write(path, text);
    }
}

/// The files that follow an agent's status: `status` and `pid` in its object
/// (when `object`), `state` and `updated_at` in its session.
pub(crate) fn status_files(
    paths: &Paths,
    a: &Agent,
    pid: Option<i32>,
    object: bool,
) -> Vec<(PathBuf, String)> {
    let abi = a.status.abi();
    let mut v = Vec::with_capacity(4);
    if object {
        let dir = paths.agent_dir(&a.name);
        v.push((dir.join("status"), format!("{}\n", abi.process.as_str())));
        v.push((
            dir.join("pid"),
            match pid {
                Some(p) if a.status.is_live() => format!("{p}\n"),
                _ => "\n".to_owned(),
            },
        ));
    }
    let sdir = paths.session_dir(&a.name, &a.session);
    v.push((sdir.join("state"), format!("{}\n", abi.session.as_str())));
    v.push((sdir.join("updated_at"), format!("{}\n", a.updated_ms)));
    v
}

struct Live {
    run: RunId,
    session: SessionName,
    parent: Option<AgentName>,
    parent_session: Option<SessionName>,
    protocol: Protocol,
    group: Option<Group>,
    pid: Option<i32>,
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    ready: bool,
    done: Option<DoneResult>,
    error: Option<String>,
    protocol_error: Option<String>,
    exec_out: Vec<u8>,
    stderr_tail: String,
    exit: Option<i32>,
    /// Set when a stop (cancel or parent death) covers this agent.
    stopping: Option<u64>,
    /// Cancelled while its launch was in flight: kill whatever starts.
    cancelled_before_start: bool,
    spawn_reply: Option<(Reply, bool)>,
    /// What a resumed run is told to do (its new input); the original task otherwise.
    instruction: Option<String>,
    /// The init frame of the run being launched (protocol agents), until
    /// `on_launched` has sent what the launch could not pre-write.
    init: Option<Vec<u8>>,
    /// The agent's effective policy (SPEC 5), checked at admission.
    policy: Policy,
    /// Children created by this run so far: what the attenuation check of its
    /// next child needs (SPEC 5 create_limit).
    creates_used: u32,
    /// Dollars this run has reported (SPEC 7 `usage`, cumulative).
    run_usd: f64,
    /// Dollars spent by the agent (every run) and its whole subtree, finished
    /// descendants included: what its `cost_limit` is held to (SPEC 9). Kept up to
    /// date as usage arrives, so a budget is checked without a store read.
    subtree_usd: f64,
    /// Why its budget stopped it, for the record's detail.
    budget_note: Option<String>,
    /// When this run was admitted (the invocation duration metric).
    admitted: std::time::Instant,
    /// What its launch enforced (containment, sandbox), for `agent.start`.
    launch_meta: Value,
    /// Its prepared sandbox: what the result collector is confined with, so
    /// that it opens the child's files with the child's rights.
    sandbox: Option<brood_launch::sandbox::Prepared>,
    /// When this run must end (its start plus `timeout_s`), in Unix seconds.
    deadline_unix_s: Option<u64>,
    /// `iso = ns`: the agent runs in a private mount namespace.
    iso_ns: bool,
    /// With `iso = ns`: the directory that becomes its `/`, if the request named one.
    ns_root: Option<PathBuf>,
    /// It or an ancestor has resource limits: its processes join the limit groups.
    limited: bool,
    /// What to start once a concurrency slot is free (SPEC 9: `queued`).
    pending: Option<Pending>,
    /// Its launch was handed to the spawner (it holds a concurrency slot).
    launching: bool,
}

/// An admitted agent's launch, waiting for a concurrency slot.
struct Pending {
    argv: Vec<String>,
    cwd: Option<String>,
    group_parent: Option<Group>,
}

impl Live {
    /// Its parent's channel to it (`None` for a root), from what the live
    /// entry knows, without a store read.
    fn channel_dir(&self, paths: &Paths, name: &AgentName) -> Option<PathBuf> {
        let (p, ps) = self.parent.as_ref().zip(self.parent_session.as_ref())?;
        Some(paths.channel_dir(p, ps, name))
    }

    fn new(
        run: RunId,
        session: SessionName,
        parent: Option<(AgentName, SessionName)>,
        protocol: Protocol,
        policy: Policy,
        instruction: Option<String>,
    ) -> Live {
        let (parent, parent_session) = match parent {
            Some((p, s)) => (Some(p), Some(s)),
            None => (None, None),
        };
        Live {
            run,
            session,
            parent,
            parent_session,
            protocol,
            group: None,
            pid: None,
            stdin: None,
            ready: false,
            done: None,
            error: None,
            protocol_error: None,
            exec_out: Vec::new(),
            stderr_tail: String::new(),
            exit: None,
            stopping: None,
            cancelled_before_start: false,
            spawn_reply: None,
            instruction,
            init: None,
            policy,
            creates_used: 0,
            run_usd: 0.0,
            subtree_usd: 0.0,
            budget_note: None,
            admitted: std::time::Instant::now(),
            launch_meta: Value::Null,
            sandbox: None,
            deadline_unix_s: None,
            iso_ns: false,
            ns_root: None,
            limited: false,
            pending: None,
            launching: false,
        }
    }
}

const EXEC_OUT_MAX: usize = 16 << 20;
const STDERR_TAIL: usize = 4096;

/// How many empty network namespaces the pool keeps ready: enough for a burst
/// of two starts, few enough that an idle supervisor holds little.
const NETNS_POOL_DEPTH: usize = 2;

struct Dispatcher {
    cfg: Config,
    tx: mpsc::UnboundedSender<Cmd>,
    store: Arc<dyn Store>,
    tenant: TenantId,
    paths: Paths,
    projection: Projection,
    cgroups: Option<Arc<Cgroups>>,
    spawner: Spawner,
    base: Base,
    me: String,
    /// The containment part of every agent's `meta.json`.
    meta: Value,
    /// What the host gives this supervisor (handed to the handles it makes).
    info: HostInfo,
    /// The operator's identity: what a root agent holds.
    uid: u32,
    /// This binary, executable by every agent (so it can call `brood spawn`).
    brood_exe: Option<PathBuf>,
    gid: u32,
    groups: std::collections::BTreeSet<u32>,
    live: HashMap<AgentName, Live>,
    /// Admitted agents waiting for a concurrency slot, first in first out.
    waiting: queue::Queue,
    /// The tenant's `max_concurrent` (SPEC 9), refreshed at each admission.
    max_concurrent: u32,
    waiters: Waiters,
    stops: HashMap<u64, Stop>,
    next_id: u64,
    /// The sweepers' state: the lease when this supervisor holds it, the ticks.
    sweep: sweep::SweepState,
    /// The per-agent sockets (SPEC 8) of agents that can take input.
    sockets: sockets::Sockets,
    metrics: Arc<crate::metrics::Metrics>,
    /// Concurrency slots held by started agents (SPEC 9), embedded or Redis.
    slots: Arc<dyn crate::slots::Slots>,
    /// Empty network namespaces made ahead of need, started with the first
    /// `network: none` agent under `iso = ns` (`brood_launch::ns` module docs).
    netns_pool: Option<brood_launch::ns::NetnsPool>,
    /// What agents must not reach, covered in each one's mount namespace;
    /// `None` when brood is not root (it cannot mount).
    veil: Option<crate::veil::Veil>,
    /// The veiled mount namespace agents join, once made.
    veil_ns: Option<Arc<brood_launch::veil::VeilNamespace>>,
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
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Cmd::Spawn(caller, req, reply) => self.on_spawn(caller, *req, reply),
                Cmd::Harvested(h) => self.on_harvested(*h),
                Cmd::Send(caller, name, text, reply) => {
                    let r = self.on_send(&caller, &name, &text);
                    self.respond(reply, r);
                }
                Cmd::Wait(caller, names, timeout, reply) => {
                    self.on_wait(&caller, names, timeout, reply)
                }
                Cmd::Cancel(caller, name, reply) => {
                    let r = self.on_cancel(&caller, &name);
                    self.respond(reply, r);
                }
                Cmd::Close(caller, name, reply) => {
                    let r = self.on_close(&caller, &name);
                    self.respond(reply, r);
                }
                Cmd::Resume(caller, name, text, reply) => {
                    self.on_resume(&caller, &name, text, reply)
                }
                Cmd::Refused(parent, requested, e) => {
                    self.note_refusal(parent.as_ref(), requested.as_deref(), &e)
                }
                Cmd::Identify(pid, reply) => {
                    let _ = reply.send(self.identify(pid));
                }
                Cmd::Launched(name, run, r) => self.on_launched(name, run, r),
                Cmd::Agent(name, run, e) => self.on_agent(name, run, e),
                Cmd::StopDone(id, emptied) => self.on_stop_done(id, emptied),
                Cmd::AgentReply(agent, re, r) => self.respond(Reply::Agent { agent, re }, r),
                Cmd::AgentSocket(name, r) => self.on_agent_socket(name, r),
                Cmd::Tick => {
                    if shutdown.is_none() {
                        self.on_tick();
                    }
                }
                Cmd::WaitTimeout(id) => {
                    if let Some(w) = self.waiters.take(id) {
                        let r = self.wait_result(&w.names, true);
                        self.respond(w.reply, r);
                    }
                }
                Cmd::Shutdown(reply) => {
                    let roots: Vec<AgentName> = self
                        .live
                        .iter()
                        .filter(|(_, l)| l.stopping.is_none())
                        .filter(|(_, l)| {
                            l.parent.as_ref().is_none_or(|p| !self.live.contains_key(p))
                        })
                        .map(|(n, _)| n.clone())
                        .collect();
                    for r in roots {
                        self.stop_subtree(&r, Terminal::Cancelled(CancelReason::User));
                    }
                    shutdown = Some(reply);
                }
            }
            // A slot freed by whatever this command did goes to the next in line
            // (not while shutting down: nothing new starts then).
            if shutdown.is_none() {
                self.pump_queue();
            } else {
                self.waiting.clear();
            }
            if shutdown.is_some() && self.live.is_empty() && self.stops.is_empty() {
                if let Some(c) = &self.cgroups {
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
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn respond(&self, reply: Reply, r: ApiResult) {
        match reply {
            Reply::Api(tx) => {
                let _ = tx.send(r);
            }
            Reply::Agent { agent, re } => {
                let msg = match r {
                    Ok(v) => brood_proto::Reply::ok(re, v),
                    Err(e) => brood_proto::Reply::err(
                        re,
                        brood_proto::ErrorBody {
                            code: e.code.as_str().to_owned(),
                            reason: e.code.as_str().to_owned(),
                            message: e.message,
                        },
                    ),
                };
                self.to_agent(&agent, &ToAgent::Reply(msg));
            }
        }
    }

    fn to_agent(&self, name: &AgentName, msg: &ToAgent) {
        if let Some(l) = self.live.get(name)
            && l.protocol == Protocol::Brood
            && let Some(tx) = &l.stdin
        {
            let _ = tx.send(brood_proto::encode(msg));
        }
    }

    fn agent(&self, name: &AgentName) -> Result<Agent, ApiError> {
        self.store
            .agent(&self.tenant, name)
            .map_err(internal)?
            .ok_or_else(|| not_found(name))
    }

    /// An agent may act on its own descendants only; a user on anything.
    fn authorize(&self, caller: &Caller, target: &Agent) -> Result<(), ApiError> {
        let Caller::Agent(me) = caller else {
            return Ok(());
        };
        let mut cur = target.parent.clone();
        let mut hops = 0;
        while let Some(p) = cur {
            if &p == me {
                return Ok(());
            }
            hops += 1;
            if hops > 10_000 {
                break;
            }
            cur = self
                .store
                .agent(&self.tenant, &p)
                .map_err(internal)?
                .and_then(|a| a.parent);
        }
        Err(ApiError::new(
            Code::Forbidden,
            format!(
                "agent {me} may act only on its own descendants, not on {}",
                target.name
            ),
        ))
    }

    /// The runtime refuses its own tools (`create send wait close resume job`) to an
    /// agent whose policy does not grant them (SPEC 5).
    fn tool_granted(&self, caller: &Caller, tool: &str) -> Result<(), ApiError> {
        let Caller::Agent(me) = caller else {
            return Ok(());
        };
        match self.live.get(me).and_then(|l| l.policy.tools.as_ref()) {
            Some(tools) if !tools.contains(tool) => Err(ApiError::new(
                Code::Forbidden,
                format!("agent {me} was not granted the tool {tool:?}"),
            )),
            _ => Ok(()),
        }
    }

    /// The quotas that apply to this supervisor's tenant now.
    fn tenant_quotas(&self) -> Result<brood_core::quota::Quotas, ApiError> {
        let own = self.store.tenant_quotas(&self.tenant).map_err(internal)?;
        Ok(self.cfg.quotas.effective(Some(&own)))
    }

    /// A parent live on another supervisor sharing the store (SPEC 15: an agent
    /// runs on one supervisor, its children may run on another): it must be
    /// running or blocked, and its host alive. Anything else is the same
    /// `ParentMismatch` a parent with no live process here gets.
    fn remote_parent(&self, p: &AgentName) -> Result<Agent, ApiError> {
        let a = self.store.agent(&self.tenant, p).map_err(internal)?;
        match a {
            Some(a)
                if matches!(a.status, Status::Running | Status::Blocked)
                    && a.supervisor != self.me
                    && supervisor_alive(&a.supervisor) =>
            {
                Ok(a)
            }
            _ => Err(ApiError::new(
                Code::ParentMismatch,
                format!("parent {p} has no live process here or on another live supervisor"),
            )),
        }
    }

    /// A remote parent's effective policy, budget left, creates used and
    /// deadline, read from the store (what its host keeps in memory).
    fn remote_parent_view(
        &self,
        pa: &Agent,
    ) -> Result<(Policy, Option<f64>, u32, Option<u64>), ApiError> {
        let spec: Value = serde_json::from_str(&pa.spec).unwrap_or(Value::Null);
        let policy = stored_policy(&spec, &self.operator_policy())?;
        let children = self
            .store
            .children(&self.tenant, &pa.name)
            .map_err(internal)?;
        let run = self.store.run(&self.tenant, &pa.run).map_err(internal)?;
        let creates_used = children
            .iter()
            .filter(|c| run.as_ref().is_some_and(|r| c.created_ms >= r.created_ms))
            .count() as u32;
        let budget = match policy.cost_limit {
            None => None,
            Some(limit) => {
                let spent = self.store.spend(&self.tenant, &pa.name).map_err(internal)?;
                let mut held = 0.0;
                for c in children.iter().filter(|c| !c.status.is_finished()) {
                    let cspec: Value = serde_json::from_str(&c.spec).unwrap_or(Value::Null);
                    if let Some(cl) = cspec["policy"]["cost_limit"].as_f64() {
                        let cs = self.store.spend(&self.tenant, &c.name).map_err(internal)?;
                        held += (cl - cs.subtree.cost_usd).max(0.0);
                    }
                }
                Some((limit - spent.subtree.cost_usd - held).max(0.0))
            }
        };
        let deadline = match (policy.timeout_s, run.and_then(|r| r.started_ms)) {
            (Some(t), Some(started)) => Some((started.max(0) / 1000) as u64 + t),
            _ => None,
        };
        Ok((policy, budget, creates_used, deadline))
    }

    /// What is left of a live agent's budget for a new child (SPEC 9): its limit,
    /// less what its subtree has spent, less what its live children with limits
    /// of their own have reserved and not yet spent. A child's unspent reservation
    /// returns when it ends, simply because it is no longer live here; what it did
    /// spend stays in `subtree_usd`. `None` when the agent has no limit.
    fn budget_remaining(&self, name: &AgentName, l: &Live) -> Option<f64> {
        let limit = l.policy.cost_limit?;
        let held: f64 = self
            .live
            .values()
            .filter(|c| c.parent.as_ref() == Some(name))
            .filter_map(|c| c.policy.cost_limit.map(|cl| (cl - c.subtree_usd).max(0.0)))
            .sum();
        Some((limit - l.subtree_usd - held).max(0.0))
    }

    /// New spend of `delta` dollars by `name`: it rolls up through every live
    /// ancestor, and the highest agent whose subtree reached its `cost_limit`
    /// is stopped with `budget_exceeded`, its subtree with it (SPEC 9). Returns
    /// whom it stopped.
    fn add_spend(&mut self, name: &AgentName, delta: f64) -> Option<AgentName> {
        if delta <= 0.0 || !delta.is_finite() {
            return None;
        }
        let mut over: Option<AgentName> = None;
        let mut cur = Some(name.clone());
        let mut hops = 0;
        while let Some(n) = cur {
            let Some(l) = self.live.get_mut(&n) else {
                break;
            };
            l.subtree_usd += delta;
            if let Some(limit) = l.policy.cost_limit
                && l.subtree_usd >= limit
                && l.stopping.is_none()
            {
                over = Some(n.clone());
            }
            cur = l.parent.clone();
            hops += 1;
            if hops > 10_000 {
                break;
            }
        }
        let top = over?;
        self.stop_for_budget(&top);
        Some(top)
    }

    /// Stops `top` with `budget_exceeded` and its subtree with it.
    fn stop_for_budget(&mut self, top: &AgentName) {
        let top = top.clone();
        let spent = self
            .live
            .get(&top)
            .map(|l| l.subtree_usd)
            .unwrap_or_default();
        let limit = self
            .live
            .get(&top)
            .and_then(|l| l.policy.cost_limit)
            .unwrap_or_default();
        tracing::info!(agent = %top, spent, limit, "budget exceeded; stopping the subtree");
        if let Some(l) = self.live.get_mut(&top) {
            l.budget_note = Some(format!(
                "budget exceeded: the subtree spent ${spent:.4} of its cost_limit ${limit:.4}"
            ));
        }
        self.stop_subtree(&top, Terminal::Failed(FailReason::BudgetExceeded));
    }

    /// What a root holds (SPEC 5 defaults): everything the operator holds.
    fn operator_policy(&self) -> Policy {
        Policy::operator(self.uid, self.gid, self.groups.clone())
    }

    /// The effective policy of a new agent, or the refusal naming the first check
    /// it fails (SPEC 5's order). A root is checked against the operator, a child
    /// against its parent's effective policy and live state.
    fn child_policy(
        &self,
        parent: Option<&AgentName>,
        remote: Option<&Agent>,
        req: &SpawnRequest,
    ) -> Result<Policy, ApiError> {
        let mut preq = match &req.policy {
            Some(v) => brood_proto::policy::from_value(v)
                .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?,
            None => PolicyRequest::default(),
        };
        // The spawn request's `env` is the policy's `env` given inline.
        if !req.env.is_empty() {
            let mut env = preq.env.take().unwrap_or_default();
            env.extend(req.env.iter().cloned());
            preq.env = Some(env);
        }
        let now = now_unix_s();
        if let Some(pa) = remote {
            // A parent hosted by another supervisor: its effective policy and live
            // state come from the store, where that supervisor recorded them.
            let (policy, budget_remaining, creates_used, deadline) = self.remote_parent_view(pa)?;
            let view = ParentView {
                policy: &policy,
                budget_remaining,
                creates_used,
                deadline_unix_s: deadline,
                now_unix_s: now,
            };
            let child = brood_core::attenuation::derive(&view, &preq);
            brood_core::attenuation::check(&view, &child)
                .map_err(|r| ApiError::new(r.code, r.message))?;
            return Ok(child);
        }
        match parent.and_then(|p| self.live.get(p).map(|l| (p, l))) {
            Some((p, l)) => {
                let view = ParentView {
                    policy: &l.policy,
                    budget_remaining: self.budget_remaining(p, l),
                    creates_used: l.creates_used,
                    deadline_unix_s: l.deadline_unix_s,
                    now_unix_s: now,
                };
                let child = brood_core::attenuation::derive(&view, &preq);
                brood_core::attenuation::check(&view, &child)
                    .map_err(|r| ApiError::new(r.code, r.message))?;
                Ok(child)
            }
            None => {
                // The operator is the source of a root's environment, mount table,
                // tool tiers and rules: whatever it gives a root, it holds.
                let mut op = self.operator_policy();
                if let Some(env) = &preq.env {
                    op.env = env.clone();
                }
                if let Some(m) = &preq.mounts {
                    op.mounts = m.clone();
                }
                if let Some(p) = &preq.path {
                    op.path = p.clone();
                }
                if let Some(r) = &preq.rules {
                    op.rules = r.clone();
                }
                let view = ParentView {
                    policy: &op,
                    budget_remaining: None,
                    creates_used: 0,
                    deadline_unix_s: None,
                    now_unix_s: now,
                };
                let root = brood_core::policy::effective(&op, &preq);
                brood_core::attenuation::check(&view, &root)
                    .map_err(|r| ApiError::new(r.code, r.message))?;
                Ok(root)
            }
        }
    }

    fn on_spawn(&mut self, caller: Caller, req: SpawnRequest, reply: Reply) {
        let parent = match &caller {
            Caller::Agent(me) => Some(me.clone()),
            Caller::User { .. } => req.parent.clone(),
        };
        let requested = req.name.as_ref().map(|n| n.to_string());
        let admitted = self
            .tool_granted(&caller, "create")
            .and_then(|()| self.admit(&caller, req));
        match admitted {
            Ok(Some((name, await_ready))) => match self.live.get_mut(&name) {
                // Waiting for a slot: say so now rather than hold the caller.
                Some(l) if l.pending.is_some() => {
                    let r = self.agent(&name).map(|a| agent_json(&self.store, &a));
                    self.respond(reply, r);
                }
                Some(l) => l.spawn_reply = Some((reply, await_ready)),
                None => {}
            },
            Ok(None) => {}
            Err(e) => {
                self.note_refusal(parent.as_ref(), requested.as_deref(), &e);
                self.respond(reply, Err(e));
            }
        }
    }

    /// A refused creation leaves nothing behind but this: an event in the would-be
    /// parent's `events.jsonl` (SPEC 5), when that parent exists.
    fn note_refusal(&self, parent: Option<&AgentName>, requested: Option<&str>, e: &ApiError) {
        let quota = match e.code {
            Code::QuotaDepth => Some("max_depth"),
            Code::QuotaFanout => Some("max_fanout"),
            Code::QuotaTreeSize => Some("max_tree_size"),
            Code::CreateLimit => Some("create_limit"),
            Code::BudgetExceeded => Some("budget"),
            _ => None,
        };
        if let Some(q) = quota {
            self.metrics.quota_denial(q);
        }
        self.metrics.refusal(e.code);
        let Some(p) = parent else {
            tracing::info!(code = %e.code, message = %e.message, "root creation refused");
            return;
        };
        let Ok(Some(pa)) = self.store.agent(&self.tenant, p) else {
            return;
        };
        self.append_events(&[ev(
            p,
            Some(&pa.run),
            &pa.session,
            AgentEvent::ChildRefused {
                parent: p.clone(),
                child: requested.map(str::to_owned),
                code: e.code,
                message: e.message.clone(),
            },
        )]);
    }

    /// Admission (SPEC 5/9 order, the parts this version has): name, parent, then
    /// the store's transaction; then the group and the launch.
    fn admit(
        &mut self,
        caller: &Caller,
        req: SpawnRequest,
    ) -> Result<Option<(AgentName, bool)>, ApiError> {
        let parent = match (caller, &req.parent) {
            (Caller::Agent(me), None) => Some(me.clone()),
            (Caller::Agent(me), Some(p)) if p == me => Some(me.clone()),
            (Caller::Agent(me), Some(p)) => {
                return Err(ApiError::new(
                    Code::ParentMismatch,
                    format!(
                        "agent {me} asked to create a child of {p}; an agent creates only its own children"
                    ),
                ));
            }
            (Caller::User { .. }, p) => p.clone(),
        };
        let name = match req.name.clone() {
            Some(n) => n,
            None => AgentName::generate("agent", rand_u32()),
        };
        let mut remote: Option<Agent> = None;
        let parent_live = match &parent {
            Some(p) if !self.live.contains_key(p) => {
                let a = self.remote_parent(p)?;
                let session = a.session.clone();
                remote = Some(a);
                Some((None, session))
            }
            Some(p) => {
                let l = self.live.get(p).ok_or_else(|| {
                    ApiError::new(
                        Code::ParentMismatch,
                        format!("parent {p} has no live process here"),
                    )
                })?;
                if l.stopping.is_some() {
                    return Err(ApiError::new(
                        Code::ParentMismatch,
                        format!("parent {p} is stopping; it can admit no new child"),
                    ));
                }
                Some((l.group.clone(), l.session.clone()))
            }
            None => None,
        };
        // SPEC 5's order: name, parent (above), lifecycle, then the policy checks.
        if req.life == Life::Detached {
            return Err(ApiError::new(
                Code::UnsupportedLifecycle,
                "life \"detached\" needs a tenant grant; none grants it here",
            ));
        }
        let policy = self.child_policy(parent.as_ref(), remote.as_ref(), &req)?;
        // Brood's own machinery is never granted, whoever asks (issue 11).
        if let Some(v) = &self.veil {
            v.check(&policy)
                .map_err(|m| ApiError::new(Code::ReservedPath, m))?;
        }
        if let Some(r) = &req.root {
            if req.iso != Iso::Ns {
                return Err(ApiError::new(Code::BadRequest, "root is only for iso = ns"));
            }
            // The new `/` must be something the agent may read at all.
            let p = brood_core::policy::AbsPath::new("root", r)
                .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?;
            if policy.mode_at(&p) == brood_core::policy::Mode::Hidden {
                return Err(ApiError::new(
                    Code::FileExpansion,
                    format!("root {r} is hidden by the agent's policy"),
                ));
            }
        }
        if let Some(c) = &req.customer {
            self.check_customer(&name, c)?;
        }
        let run = new_run_id();
        // The parent's session and run at creation, and who asked: recorded so
        // the `parent` and `owner` files can always be rebuilt from the store.
        let (parent_session, parent_run) = match (&parent, &remote) {
            (Some(_), Some(pa)) => (Some(pa.session.to_string()), Some(pa.run.to_string())),
            (Some(p), None) => (
                self.live.get(p).map(|l| l.session.to_string()),
                self.live.get(p).map(|l| l.run.to_string()),
            ),
            (None, _) => (None, None),
        };
        let owner = match caller {
            Caller::Agent(me) => format!("agent:{me}"),
            Caller::User { uid } => format!("user:{uid}"),
        };
        let spec = json!({
            "argv": req.argv,
            "task": req.task,
            "cwd": req.cwd,
            "owner": owner,
            "label": req.label,
            "parent_session": parent_session,
            "parent_run": parent_run,
            "life": req.life.as_str(),
            "iso": req.iso.as_str(),
            "root": req.root,
            // Recorded with the agent, so `brood show` tells a weaker sandbox.
            "allow_weaker_sandbox": self.cfg.allow_weaker_sandbox,
            "policy": brood_proto::policy::to_json(&policy),
        });
        let now = now_ms();
        let mut events = vec![ev(
            &name,
            Some(&run),
            &req.session,
            AgentEvent::Spawn {
                agent: name.clone(),
                parent: parent.clone(),
                run: run.clone(),
            },
        )];
        if let (Some(p), Some((_, psess))) = (&parent, &parent_live) {
            events.push(ev(
                p,
                None,
                psess,
                AgentEvent::ChildSpawn {
                    parent: p.clone(),
                    child: name.clone(),
                },
            ));
        }
        // Quotas are checked inside the store's admission transaction, so they hold
        // under any concurrency (SPEC 9); the tenant's overrides are read each time.
        let quotas = self.tenant_quotas()?;
        self.max_concurrent = quotas.max_concurrent;
        let agent = self
            .store
            .admit_with_quotas(
                &NewAgent {
                    tenant: self.tenant.clone(),
                    name: name.clone(),
                    parent: parent.clone(),
                    customer: req.customer.clone(),
                    session: req.session.clone(),
                    protocol: req.protocol,
                    spec: spec.to_string(),
                    handoff: req.task.clone(),
                    supervisor: self.me.clone(),
                    run: run.clone(),
                    now_ms: now,
                },
                &quotas,
                &events,
            )
            .map_err(internal)?;
        self.project_events(&events);
        // The session and the parent's channel exist from admission on.
        let sdir = self.paths.session_dir(&name, &req.session);
        self.projection.mkdirs(sdir.join("context"));
        self.projection
            .write(sdir.join("created_at"), format!("{now}\n"));
        self.projection
            .append(sdir.join("messages.jsonl"), Vec::new());
        self.projection
            .append(sdir.join("events.jsonl"), Vec::new());
        // Empty until the agent sends a message of its own.
        self.projection.append(sdir.join("latest.md"), Vec::new());
        self.projection.write(
            sdir.join("cwd"),
            format!("{}\n", req.cwd.as_deref().unwrap_or("")),
        );
        self.projection
            .write(sdir.join("meta.json"), crate::objects::session_meta(&agent));
        let adir = self.paths.agent_dir(&name);
        for (file, text) in crate::objects::control_files(&agent, &policy, &spec) {
            self.projection.write(adir.join(file), text);
        }
        self.project_shim(&name);
        self.projection.append(adir.join("log"), Vec::new());
        self.projection.write(
            adir.join("meta.json"),
            crate::objects::agent_meta(&agent, None),
        );
        if let (Some(p), Some((_, psess))) = (&parent, &parent_live) {
            let cdir = self.paths.channel_dir(p, psess, &name);
            self.projection
                .write(cdir.join("agent"), format!("{name}\n"));
            self.projection
                .write(cdir.join("session"), format!("{}\n", req.session));
            self.projection
                .write(cdir.join("handoff.md"), req.task.clone());
            self.projection
                .artifact_dir(cdir.join("artifact"), policy.uid);
        }
        project_agent(&self.projection, &self.paths, &agent, None);
        self.project_channel(&agent, None);

        let group_parent = parent_live.as_ref().and_then(|(g, _)| g.clone());
        if let Some(pl) = parent.as_ref().and_then(|p| self.live.get_mut(p)) {
            pl.creates_used += 1;
        }
        let parent_pair = parent.clone().zip(parent_live.map(|(_, s)| s));
        let mut live = Live::new(
            run.clone(),
            req.session.clone(),
            parent_pair,
            req.protocol,
            policy,
            None,
        );
        live.iso_ns = req.iso == Iso::Ns;
        live.ns_root = req.root.as_ref().map(PathBuf::from);
        live.pending = Some(Pending {
            argv: req.argv.clone(),
            cwd: req.cwd.clone(),
            group_parent,
        });
        self.live.insert(name.clone(), live);
        self.waiting.push(name.clone());
        self.pump_queue();
        Ok(Some((name, req.await_ready)))
    }

    /// SPEC 9 cycles, for a customer: the new agent `name` naming `customer` must
    /// not close a loop of "who receives whose result". Walks the customer chain
    /// from `customer` (each agent's customer, or its parent when it has none);
    /// meeting `name` again, or any agent twice, is a `Cycle`. A customer that
    /// does not exist is left to the store's admission, which refuses it.
    fn check_customer(&self, name: &AgentName, customer: &AgentName) -> Result<(), ApiError> {
        let mut chain = vec![customer.clone()];
        let mut cur = Some(customer.clone());
        while let Some(c) = cur {
            if &c == name {
                let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
                return Err(ApiError::new(
                    Code::Cycle,
                    format!(
                        "agent {name} cannot receive its own result: customer chain {name} -> {}",
                        path.join(" -> ")
                    ),
                ));
            }
            let Some(a) = self.store.agent(&self.tenant, &c).map_err(internal)? else {
                return Ok(());
            };
            cur = a.customer.or(a.parent);
            if let Some(n) = &cur {
                if chain.contains(n) {
                    let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
                    return Err(ApiError::new(
                        Code::Cycle,
                        format!("customer chain loops: {} -> {n}", path.join(" -> ")),
                    ));
                }
                chain.push(n.clone());
            }
            if chain.len() > 10_000 {
                return Err(ApiError::new(
                    Code::Cycle,
                    "customer chain longer than 10000",
                ));
            }
        }
        Ok(())
    }

    /// Agents holding a concurrency slot: those whose process was started.
    fn slots_used(&self) -> usize {
        self.live.values().filter(|l| l.launching).count()
    }

    /// One slot from the counter, or `false` when the tenant's `max_concurrent`
    /// are all held. A counter that fails (Redis gone) must not stop every
    /// start, nor let the limit go: this supervisor's own count decides then.
    fn take_slot(&self) -> bool {
        match self.slots.acquire(&self.tenant, self.max_concurrent) {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "slot counter failed; using this supervisor's own count");
                self.slots_used() < self.max_concurrent as usize
            }
        }
    }

    fn give_slot(&self) {
        if let Err(e) = self.slots.release(&self.tenant) {
            tracing::warn!(error = %e, "releasing a slot failed; the reconciler repairs the count");
        }
    }

    /// Removes a live agent, giving back its slot if it held one: the one place
    /// an agent leaves the live set, so a slot is never held by a process that
    /// is gone (SPEC 9).
    fn forget(&mut self, name: &AgentName) -> Option<Live> {
        self.sock_end(name);
        let l = self.live.remove(name)?;
        if l.launching {
            self.give_slot();
        }
        Some(l)
    }

    /// Starts queued agents, first in first out, while concurrency slots are free
    /// (SPEC 9: a full tenant queues instead of failing). Called after every
    /// command, so a slot freed anywhere is used at once.
    fn pump_queue(&mut self) {
        // This runs after every command; asking for a slot is only worth it when
        // someone is waiting for one.
        while let Some(name) = self.waiting.front().cloned() {
            let ready = self
                .live
                .get(&name)
                .is_some_and(|l| l.pending.is_some() && !l.launching);
            if !ready {
                self.waiting.pop();
                continue;
            }
            if !self.take_slot() {
                return;
            }
            self.waiting.pop();
            let Some(l) = self.live.get_mut(&name) else {
                self.give_slot();
                continue;
            };
            let Some(p) = l.pending.take() else {
                self.give_slot();
                continue;
            };
            l.launching = true;
            let run = l.run.clone();
            self.launch(&name, &run, &p.argv, p.cwd.as_deref(), p.group_parent);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        name: &AgentName,
        run: &RunId,
        argv: &[String],
        cwd: Option<&str>,
        group_parent: Option<Group>,
    ) {
        // One group per run (`r<seq>.<name>`): a finished run's group may still be
        // being emptied and removed in the background when a resume starts the
        // next one, and the two must never share a directory. The `r<seq>.` prefix
        // also keeps agent names like `memory.x` clear of the kernel's file names.
        let seq = self
            .store
            .runs(&self.tenant, name)
            .map(|r| r.len().max(1))
            .unwrap_or(1);
        let component = format!("r{seq}.{name}");
        let (group, procs) = match &self.cgroups {
            Some(cg) => {
                let rel = match &group_parent {
                    Some(g) => g.rel.child(&component),
                    None => GroupPath::new(&[self.tenant.as_str(), &component]),
                };
                let made = rel.map_err(|e| e.to_string()).and_then(|rel| {
                    if group_parent.is_none() {
                        // The tenant's directory is shared by its roots; make it once.
                        if let Ok(t) = GroupPath::new(&[self.tenant.as_str()]) {
                            let _ = cg.create(&t);
                        }
                    }
                    let g = cg.create(&rel).map_err(|e| e.to_string())?;
                    let f = cg.procs_file(&g).map_err(|e| e.to_string())?;
                    Ok((g, f))
                });
                match made {
                    Ok((g, f)) => (Some(g), Some(f)),
                    Err(e) => {
                        let _ = self.tx.send(Cmd::Launched(
                            name.clone(),
                            run.clone(),
                            Err(LaunchError::Spawn {
                                program: argv.first().cloned().unwrap_or_default().into(),
                                source: std::io::Error::other(format!("creating its cgroup: {e}")),
                            }),
                        ));
                        return;
                    }
                }
            }
            None => (None, None),
        };
        let fail = |tx: &mpsc::UnboundedSender<Cmd>, what: String| {
            let _ = tx.send(Cmd::Launched(
                name.clone(),
                run.clone(),
                Err(LaunchError::Spawn {
                    program: argv.first().cloned().unwrap_or_default().into(),
                    source: std::io::Error::other(what),
                }),
            ));
        };
        let parent_limited = self
            .live
            .get(name)
            .and_then(|l| l.parent.as_ref())
            .and_then(|p| self.live.get(p))
            .is_some_and(|p| p.limited);
        let a = self.store.agent(&self.tenant, name).ok().flatten();
        // A protocol agent's init goes into its stdin pipe before it starts, so
        // it reads it at once instead of waiting for the start to be recorded.
        let init = match (self.live.get(name), &a) {
            (Some(l), Some(a)) if l.protocol == Protocol::Brood => {
                Some(self.init_frame(run, a, l.instruction.clone()))
            }
            _ => None,
        };
        let l = self.live.get_mut(name);
        let Some(l) = l else { return };
        l.group = group.clone();
        // Kernel enforcement of the policy (SPEC 5): limits on the group, and the
        // sandbox the child applies before exec. A layer the policy needs but the
        // host lacks stops the start, naming the layer (unless the operator allowed
        // a weaker sandbox).
        // Limits live in groups of their own on a hybrid host (the v1 mirrors); an
        // agent joins them when it or an ancestor has a limit, so a parent's limit
        // binds its whole subtree, and an unlimited tree pays nothing for them.
        let limits = crate::enforce::limits(&l.policy);
        l.limited = limits.memory_max.is_some()
            || limits.pids_max.is_some()
            || limits.cpu_weight.is_some()
            || parent_limited;
        // Without cgroups there is no layer to hold a limit (SPEC 5: a layer
        // the policy needs but the host lacks stops the start, naming it).
        let own_limits =
            limits.memory_max.is_some() || limits.pids_max.is_some() || limits.cpu_weight.is_some();
        let limits_missing = own_limits && self.cgroups.is_none();
        if limits_missing && !self.cfg.allow_weaker_sandbox {
            return fail(
                &self.tx,
                "resources: the policy sets memory_max, pids_max or cpu_weight, but this host \
                 has no usable cgroups (the limits layer is missing); \
                 --allow-weaker-sandbox starts it without them"
                    .to_owned(),
            );
        }
        let extra_procs = match (&self.cgroups, &group, l.limited) {
            (Some(cg), Some(g), true) => match cg.set_limits(g, &limits) {
                Ok(h) => h.procs_files,
                Err(e) => return fail(&self.tx, format!("resources: {e}")),
            },
            _ => Vec::new(),
        };
        let policy_file = self.paths.policy_file(name);
        let policy_text = format!("{:#}\n", brood_proto::policy::to_json(&l.policy));
        if let Err(e) = crate::projection::write_atomic(
            &policy_file,
            policy_text.as_bytes(),
            0,
            crate::projection::ctx_owner(),
        ) {
            return fail(&self.tx, format!("writing its policy file: {e}"));
        }
        let program = crate::enforce::resolve(
            argv.first().map(String::as_str).unwrap_or(""),
            &self.base.path,
        );
        // The channel's artifact/ must exist before its landlock rule is made.
        let artifacts = l.channel_dir(&self.paths, name).map(|d| d.join("artifact"));
        if let Some(dir) = &artifacts
            && let Err(e) = crate::projection::make_dir(dir, l.policy.uid)
        {
            return fail(&self.tx, format!("creating {}: {e}", dir.display()));
        }
        // The handoff is there before the child runs (SPEC 4: written when the
        // channel is created; the projection thread may not have got to it
        // yet). The same bytes as the projection's, so whichever lands last
        // changes nothing; a resumed run finds it and leaves it.
        if let (Some(dir), Some(a)) = (&artifacts, &a) {
            let handoff = dir.with_file_name("handoff.md");
            if std::fs::symlink_metadata(&handoff).is_err()
                && let Err(e) = crate::projection::write_atomic(
                    &handoff,
                    task_of(a).as_bytes(),
                    1,
                    crate::projection::ctx_owner(),
                )
            {
                return fail(&self.tx, format!("writing {}: {e}", handoff.display()));
            }
        }
        let sandbox_spec = crate::enforce::sandbox(
            &l.policy,
            &crate::enforce::Context {
                program: &program,
                brood: self.brood_exe.as_deref(),
                policy_file: &policy_file,
                root: self.uid == 0,
                allow_weaker: self.cfg.allow_weaker_sandbox,
                objects: Some(&self.paths.ctx().join("agent")),
                own_object: Some(&self.paths.agent_dir(name)),
                artifacts: artifacts.as_deref(),
            },
        );
        let sandbox = match brood_launch::sandbox::prepare(&sandbox_spec) {
            Ok(p) => p,
            Err(e) => return fail(&self.tx, format!("sandbox: {e}")),
        };
        l.sandbox = Some(sandbox.clone());
        // iso = ns: a private mount namespace from the policy's mount table, in a
        // root directory brood owns; the cwd is applied inside it.
        let ns = if l.iso_ns {
            // A named root must exist. Without one, the root is a scratch tmpfs
            // the child mounts on `$BROOD_ROOT/ns` inside its own namespace
            // (one directory for every agent: each sees only its own tmpfs).
            let (ns_root, scratch) = match &l.ns_root {
                Some(r) => (r.clone(), false),
                None => {
                    let r = self.paths.root.join("ns");
                    if let Err(e) = std::fs::create_dir_all(&r) {
                        return fail(&self.tx, format!("iso=ns: creating {}: {e}", r.display()));
                    }
                    (r, true)
                }
            };
            let spec =
                crate::enforce::namespace(&l.policy, ns_root, scratch, cwd, artifacts.as_deref());
            // A pooled namespace when one is ready; the child makes its own
            // otherwise (and says why if it cannot).
            let netns = if spec.empty_network {
                if self.netns_pool.is_none() {
                    match brood_launch::ns::NetnsPool::start(NETNS_POOL_DEPTH) {
                        Ok(p) => self.netns_pool = Some(p),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not start the network namespace pool")
                        }
                    }
                }
                self.netns_pool.as_ref().and_then(|p| p.take())
            } else {
                None
            };
            match brood_launch::ns::prepare_with(&spec, netns) {
                Ok(p) => Some(p),
                Err(e) => return fail(&self.tx, format!("iso=ns: {e}")),
            }
        } else {
            None
        };
        // The veiled namespace every agent joins, made again only when what
        // it hides changed (brood_launch::veil).
        let veil = match &self.veil {
            Some(v) => match v.prepare() {
                Ok(p) => match &self.veil_ns {
                    Some(made) if made.signature() == p.signature() => Some(made.clone()),
                    _ => match brood_launch::veil::make_namespace(&p) {
                        Ok(made) => {
                            let made = Arc::new(made);
                            self.veil_ns = Some(made.clone());
                            Some(made)
                        }
                        Err(e) => return fail(&self.tx, format!("{e}")),
                    },
                },
                Err(e) => return fail(&self.tx, format!("{e}")),
            },
            None => None,
        };
        let enforced = sandbox.enforced();
        // Recorded with the run's `agent.start` event (meta.json is written from
        // it once the start is recorded, so a rebuild writes the same file).
        l.launch_meta = json!({
            "containment": self.meta["containment"].clone(),
            "sandbox": {
            "landlock_abi": enforced.landlock_abi,
            "files": enforced.fs,
            "network": enforced.net,
            "scoped": enforced.scoped,
            "capabilities_dropped": enforced.caps_dropped,
            "no_new_privs": enforced.no_new_privs,
            "weaker": enforced.weaker,
            "allow_weaker_sandbox": self.cfg.allow_weaker_sandbox,
            "veil": veil.as_ref().map(|v| v.describe()),
            "limits_not_enforced": limits_missing,
            },
        });
        // The run's clock starts now; its children must end before its deadline.
        l.deadline_unix_s = l.policy.timeout_s.map(|t| now_unix_s() + t);
        let policy_env: Vec<(String, String)> = l
            .policy
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let id = Identity {
            agent: name.to_string(),
            run: run.to_string(),
            parent: l.parent.as_ref().map(|p| p.to_string()),
            customer: a
                .as_ref()
                .and_then(|a| a.customer.as_ref().map(|c| c.to_string())),
            session: l.session.to_string(),
            tenant: self.tenant.to_string(),
            socket: self.cfg.socket.to_string_lossy().into_owned(),
            policy: self.paths.policy_file(name).to_string_lossy().into_owned(),
            ctx_root: self.paths.ctx().to_string_lossy().into_owned(),
            ctx_home: self.paths.home().to_string_lossy().into_owned(),
            artifacts: artifacts.as_ref().map(|d| d.to_string_lossy().into_owned()),
        };
        let spec = LaunchSpec {
            argv: argv.iter().map(Into::into).collect(),
            env: brood_launch::env::build(&id, &self.base, &policy_env),
            // Inside a private mount namespace the cwd is applied there instead.
            cwd: if ns.is_some() {
                None
            } else {
                cwd.map(PathBuf::from)
            },
            cgroup_procs: procs,
            sandbox: Some(sandbox),
            extra_procs,
            ns,
            veil,
            stdin_prelude: init.clone().unwrap_or_default(),
        };
        l.init = init;
        let tx = self.tx.clone();
        let (n2, r2) = (name.clone(), run.clone());
        if let Some(hook) = self.cfg.hooks.before_launch.clone() {
            let n3 = name.clone();
            let spawner = self.spawner.clone();
            // Run the hook on its own thread so the dispatcher stays free meanwhile.
            std::thread::spawn(move || {
                hook(&n3);
                spawner.launch(spec, move |r| {
                    let _ = tx.send(Cmd::Launched(n2, r2, r));
                });
            });
        } else {
            self.spawner.launch(spec, move |r| {
                let _ = tx.send(Cmd::Launched(n2, r2, r));
            });
        }
    }

    fn on_launched(&mut self, name: AgentName, run: RunId, r: Result<Launched, LaunchError>) {
        let Some(l) = self.live.get_mut(&name) else {
            // Nobody wants it any more: make sure nothing survives.
            if let Ok(p) = r {
                reap_orphan_launch(p, None, self.cgroups.clone());
            }
            return;
        };
        if l.run != run {
            return;
        }
        let launched = match r {
            Ok(p) => p,
            Err(e) => {
                let detail = e.to_string();
                let group = l.group.take();
                let cancelled = l.cancelled_before_start;
                self.remove_group(group);
                if cancelled {
                    // Its record already says cancelled; nothing started.
                    if let Some((reply, _)) =
                        self.forget(&name).and_then(|mut l| l.spawn_reply.take())
                    {
                        let r = self.agent(&name).map(|a| agent_json(&self.store, &a));
                        self.respond(reply, r);
                    }
                    return;
                }
                self.finish(
                    &name,
                    Terminal::Failed(FailReason::ExitCode),
                    None,
                    None,
                    Some(detail),
                    None,
                );
                return;
            }
        };
        let cgroup_path = l
            .group
            .as_ref()
            .map(|g| g.dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        let session = l.session.clone();
        let mut start_payload = brood_proto::event::payload(&AgentEvent::Start {
            agent: name.clone(),
            run: run.clone(),
            pid: launched.pid,
        });
        for k in ["containment", "sandbox"] {
            if let Some(v) = l.launch_meta.get(k) {
                start_payload[k] = v.clone();
            }
        }
        let start_events = [ev_value(&name, Some(&run), &session, start_payload.clone())];
        let start = self.store.start_run(
            &self.tenant,
            &name,
            &run,
            launched.pid,
            &cgroup_path,
            now_ms(),
            &start_events,
        );
        let agent = match start {
            Ok(a) => a,
            Err(e) => {
                // Cancelled between admission and start: the record already says so;
                // kill what just started, leaving no orphan and no group.
                tracing::info!(agent = %name, error = %e, "start refused; killing the new process");
                let (group, reply) = match self.forget(&name) {
                    Some(mut l) => (l.group.take(), l.spawn_reply.take()),
                    None => (None, None),
                };
                reap_orphan_launch(launched, group, self.cgroups.clone());
                if let Some((reply, _)) = reply {
                    let r = self.agent(&name).map(|a| agent_json(&self.store, &a));
                    self.respond(reply, r);
                }
                return;
            }
        };
        let pid = launched.pid;
        let written = launched.stdin_written;
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let (protocol, instruction) = match self.live.get_mut(&name) {
            Some(l) => {
                l.pid = Some(pid);
                l.stdin = Some(stdin_tx.clone());
                (l.protocol, l.instruction.clone())
            }
            None => return,
        };
        io::start(
            name.clone(),
            run.clone(),
            protocol,
            launched,
            stdin_rx,
            self.tx.clone(),
        );
        self.project_events(&start_events);
        self.projection.write(
            self.paths.agent_dir(&name).join("meta.json"),
            crate::objects::agent_meta(&agent, Some(&start_payload)),
        );
        project_agent(&self.projection, &self.paths, &agent, Some(pid));
        self.project_channel(&agent, None);
        // First words to the agent: what of its init the launch could not put in
        // the pipe before it started (protocol), or the handoff on stdin (exec).
        match protocol {
            Protocol::Brood => {
                let rest = self
                    .live
                    .get_mut(&name)
                    .and_then(|l| l.init.take())
                    .map(|init| init.get(written..).unwrap_or_default().to_vec())
                    .unwrap_or_default();
                if !rest.is_empty() {
                    let _ = stdin_tx.send(rest);
                }
            }
            Protocol::Exec => {
                let handoff = instruction.unwrap_or_else(|| task_of(&agent));
                let _ = stdin_tx.send(handoff.into_bytes());
                if let Some(l) = self.live.get_mut(&name) {
                    // Dropping the only sender closes the agent's stdin after the handoff.
                    l.stdin = None;
                }
            }
        }
        if let Some(l) = self.live.get_mut(&name)
            && let Some((reply, await_ready)) = l.spawn_reply.take()
        {
            if await_ready && protocol == Protocol::Brood {
                l.spawn_reply = Some((reply, true));
            } else {
                self.respond(reply, Ok(agent_json(&self.store, &agent)));
            }
        }
    }

    /// The `init` frame that starts run `run` of protocol agent `agent`: its
    /// instruction (the resume's, else its task), history and channel.
    fn init_frame(&self, run: &RunId, agent: &Agent, instruction: Option<String>) -> Vec<u8> {
        let history = self
            .store
            .messages(&self.tenant, &agent.name, &agent.session)
            .unwrap_or_default()
            .into_iter()
            .map(|m| HistoryMessage {
                role: m.role,
                content: m.content,
            })
            .collect();
        let init = ToAgent::Init {
            config: InitConfig {
                id: run.to_string(),
                name: agent.name.to_string(),
                run: run.to_string(),
                parent_session_id: agent.parent.as_ref().map(|p| p.to_string()),
                session_id: agent.session.to_string(),
                instruction: instruction.unwrap_or_else(|| task_of(agent)),
                customer: agent
                    .customer
                    .as_ref()
                    .or(agent.parent.as_ref())
                    .map(|c| c.to_string()),
                handoff: brood_proto::Handoff {
                    dir: self
                        .channel_dir_of(agent)
                        .map(|d| d.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    refs: Vec::new(),
                    output: None,
                },
                history,
                ..InitConfig::default()
            },
            agent_config: Value::Object(Default::default()),
        };
        brood_proto::encode(&init)
    }

    fn channel_dir_of(&self, a: &Agent) -> Option<PathBuf> {
        let p = a.parent.as_ref()?;
        // The parent's session is known while either side is live; the store is
        // asked only otherwise (this runs for every agent of a large stop).
        let known = self
            .live
            .get(&a.name)
            .and_then(|l| l.parent_session.clone())
            .or_else(|| self.live.get(p).map(|pl| pl.session.clone()));
        let psess = match known {
            Some(s) => s,
            None => self
                .store
                .agent(&self.tenant, p)
                .ok()
                .flatten()
                .map(|pa| pa.session)?,
        };
        Some(self.paths.channel_dir(p, &psess, &a.name))
    }

    /// Channel `status` (and `result.md` once terminal) in the parent's session.
    fn project_channel(&self, a: &Agent, result: Option<&str>) {
        let Some(dir) = self.channel_dir_of(a) else {
            return;
        };
        self.projection.write(
            dir.join("status"),
            format!("{}\n", a.status.abi().channel.as_str()),
        );
        if a.status.is_finished()
            && let Some(r) = result
        {
            // SPEC 4: result.md never holds a NUL byte.
            self.projection
                .write(dir.join("result.md"), crate::objects::result_text(r));
        }
    }

    fn project_events(&self, events: &[NewEvent]) {
        for e in events {
            let dir = self.paths.session_dir(&e.agent, &e.session);
            let mut line = e.payload.clone().into_bytes();
            line.push(b'\n');
            self.projection.append(dir.join("events.jsonl"), line);
        }
    }

    fn on_agent(&mut self, name: AgentName, run: RunId, e: AgentEv) {
        let Some(l) = self.live.get_mut(&name) else {
            return;
        };
        if l.run != run {
            return;
        }
        match e {
            AgentEv::Msg(m) => self.on_msg(&name, &run, m),
            AgentEv::Unknown(t) => {
                tracing::info!(agent = %name, r#type = %t, "unknown protocol message type ignored");
                let session = l.session.clone();
                self.append_events(&[ev(
                    &name,
                    Some(&run),
                    &session,
                    AgentEvent::ProtocolUnknown {
                        agent: name.clone(),
                        message_type: t,
                    },
                )]);
            }
            AgentEv::Bad(err) => {
                if l.protocol_error.is_some() || l.stopping.is_some() {
                    return;
                }
                l.protocol_error = Some(err.to_string());
                let session = l.session.clone();
                tracing::warn!(agent = %name, error = %err, "protocol error");
                self.append_events(&[ev(
                    &name,
                    Some(&run),
                    &session,
                    AgentEvent::ProtocolError {
                        agent: name.clone(),
                        line: Some(err.line),
                        error: err.to_string(),
                    },
                )]);
                self.stop_subtree(&name, Terminal::Failed(FailReason::ProtocolError));
            }
            AgentEv::ExecOut(b) => {
                let room = EXEC_OUT_MAX.saturating_sub(l.exec_out.len());
                l.exec_out.extend_from_slice(&b[..b.len().min(room)]);
            }
            AgentEv::Stderr(s) => {
                l.stderr_tail.push_str(&s);
                if l.stderr_tail.len() > STDERR_TAIL {
                    let mut cut = l.stderr_tail.len() - STDERR_TAIL;
                    while !l.stderr_tail.is_char_boundary(cut) {
                        cut += 1;
                    }
                    l.stderr_tail.drain(..cut);
                }
                let line =
                    json!({"ts": now_ms(), "run": run.as_str(), "stream": "stderr", "text": s});
                self.projection
                    .append(self.paths.agent_dir(&name).join("log"), format!("{line}\n"));
            }
            AgentEv::Exited { status } => {
                l.exit = Some(status);
                l.stdin = None;
                if l.stopping.is_some() {
                    // The stop in flight records the outcome, in post-order.
                    return;
                }
                let (outcome, result, mut detail) = outcome_of(l, status);
                // A kill by the kernel for a limit of the policy says which limit
                // (read before the group is removed).
                if libc::WIFSIGNALED(status)
                    && let (Some(cg), Some(g)) = (&self.cgroups, &l.group)
                {
                    let why = if cg.oom_killed(g) {
                        Some(format!(
                            "killed by the OOM killer: the policy's memory_max ({} bytes) was reached",
                            l.policy.resources.memory_max.unwrap_or_default()
                        ))
                    } else {
                        None
                    };
                    if let Some(w) = why {
                        detail = Some(match detail {
                            Some(d) => format!("{w}; {d}"),
                            None => w,
                        });
                    }
                }
                let code = exit_code(status);
                if result.is_some() {
                    // What it handed back is checked and kept off the dispatcher
                    // (hashes, copies); the end is recorded when that comes back.
                    self.harvest(&name, &run, outcome, code, result, detail);
                } else {
                    self.finish(&name, outcome, code, result, detail, None);
                }
            }
        }
    }

    fn on_msg(&mut self, name: &AgentName, run: &RunId, m: FromAgent) {
        let Some(l) = self.live.get_mut(name) else {
            return;
        };
        let session = l.session.clone();
        match m {
            FromAgent::Ready => {
                l.ready = true;
                let reply = l.spawn_reply.take();
                self.sock_ready(name);
                if let Some((reply, true)) = reply {
                    let r = self.agent(name).map(|a| agent_json(&self.store, &a));
                    self.respond(reply, r);
                }
            }
            FromAgent::Chunk { delta } => self.sock_chunk(name, run, &delta),
            FromAgent::Pong | FromAgent::Unknown => {}
            FromAgent::Message { role, content } => {
                match self.store.append_message(
                    &self.tenant,
                    name,
                    &session,
                    run,
                    &role,
                    &content,
                    now_ms(),
                ) {
                    Ok(m) => {
                        let dir = self.paths.session_dir(name, &session);
                        self.projection
                            .append(dir.join("messages.jsonl"), crate::objects::message_line(&m));
                        if crate::objects::is_agent_message(&role) {
                            self.projection.write(dir.join("latest.md"), content);
                        }
                        self.sock_message(name, &m);
                    }
                    Err(e) => {
                        tracing::error!(agent = %name, error = %e, "recording a message failed")
                    }
                }
            }
            FromAgent::Usage {
                tokens_in,
                tokens_out,
                cost_usd,
            } => self.on_usage(name, run, tokens_in, tokens_out, cost_usd),
            FromAgent::Status { status, reason } => {
                let to = match status.as_str() {
                    "blocked" => Status::Blocked,
                    "running" => Status::Running,
                    _ => return,
                };
                let event = ev(
                    name,
                    Some(run),
                    &session,
                    AgentEvent::Status {
                        agent: name.clone(),
                        status: status.clone(),
                        reason: reason.clone(),
                    },
                );
                match self.store.set_status(
                    &self.tenant,
                    name,
                    to,
                    reason.as_deref(),
                    now_ms(),
                    &[event],
                ) {
                    Ok(a) => project_agent(
                        &self.projection,
                        &self.paths,
                        &a,
                        self.live.get(name).and_then(|l| l.pid),
                    ),
                    Err(e) => tracing::info!(agent = %name, error = %e, "status change ignored"),
                }
                // A turn ends on the agent's word even when the record did not
                // change (`blocked` twice in a row is no transition).
                self.sock_status(name, run, to);
            }
            FromAgent::Request { id, op, args } => {
                let sup = self.handle();
                let agent = name.clone();
                tokio::spawn(async move {
                    let caller = Caller::Agent(agent.clone());
                    let r = crate::api::handle(&sup, &caller, &op, &args).await;
                    let _ = sup.tx.send(Cmd::AgentReply(agent, id, r));
                });
            }
            FromAgent::Done { result } => {
                if l.done.is_none() && l.error.is_none() {
                    // The final figures count like a last `usage` (SPEC 7).
                    let (ti, to, c) = (result.tokens_in, result.tokens_out, result.cost_usd);
                    l.done = Some(result);
                    if ti > 0 || to > 0 || c > 0.0 {
                        self.on_usage(name, run, ti, to, c);
                    }
                }
            }
            FromAgent::Error { error } => {
                if l.done.is_none() && l.error.is_none() {
                    l.error = Some(error);
                }
            }
        }
    }

    /// A run's cumulative usage (SPEC 7): recorded, then rolled up the tree and
    /// checked against every budget above it. Spend only grows: a report lower
    /// than an earlier one keeps the earlier dollars.
    fn on_usage(
        &mut self,
        name: &AgentName,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) {
        let Some(l) = self.live.get_mut(name) else {
            return;
        };
        let cost = if cost_usd.is_finite() {
            cost_usd.max(l.run_usd)
        } else {
            l.run_usd
        };
        let delta = cost - l.run_usd;
        l.run_usd = cost;
        if let Err(e) = self
            .store
            .record_usage(&self.tenant, run, tokens_in, tokens_out, cost)
        {
            tracing::error!(agent = %name, error = %e, "recording usage failed");
        }
        self.add_spend(name, delta);
    }

    fn handle(&self) -> Supervisor {
        Supervisor {
            tx: self.tx.clone(),
            store: self.store.clone(),
            tenant: self.tenant.clone(),
            paths: self.paths.clone(),
            info: self.info.clone(),
            projection: self.projection.clone(),
            metrics: self.metrics.clone(),
            me: self.me.clone(),
        }
    }

    fn append_events(&self, events: &[NewEvent]) {
        match self.store.append_events(&self.tenant, events, now_ms()) {
            Ok(_) => self.project_events(events),
            Err(e) => tracing::error!(error = %e, "appending events failed"),
        }
    }

    /// A run is over and no stop covers it: record the outcome, tell the parent and
    /// the waiters, then clean up its group (and stop its descendants, if any).
    fn finish(
        &mut self,
        name: &AgentName,
        outcome: Terminal,
        exit_code: Option<i32>,
        result: Option<String>,
        detail: Option<String>,
        harvest: Option<crate::channel::Harvest>,
    ) {
        let Some(l) = self.live.get(name) else { return };
        let run = l.run.clone();
        let session = l.session.clone();
        let mut events = vec![ev(
            name,
            Some(&run),
            &session,
            AgentEvent::Stop {
                agent: name.clone(),
                outcome,
                swept: None,
            },
        )];
        if let (Some(p), Some(ps)) = (&l.parent, &l.parent_session) {
            events.push(ev(
                p,
                None,
                ps,
                AgentEvent::ChildStop {
                    parent: p.clone(),
                    child: name.clone(),
                    outcome,
                },
            ));
        }
        let end = RunEnd {
            outcome,
            exit_code,
            result: result.clone(),
            detail,
            now_ms: now_ms(),
            output: harvest.as_ref().map(|h| h.output.clone()),
        };
        let agent = match self.store.end_run(&self.tenant, name, &run, &end, &events) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(agent = %name, error = %e, "recording the end of a run failed");
                return;
            }
        };
        self.project_events(&events);
        self.after_end(&agent, result.as_deref(), harvest.as_ref());
        let group = self.live.get_mut(name).and_then(|l| l.group.take());
        self.forget(name);
        // Owned children die with their parent (SPEC 6), or at least its leftovers do.
        let unfinished = self
            .store
            .descendants_post_order(&self.tenant, name)
            .map(|d| d.into_iter().any(|a| !a.status.is_finished()))
            .unwrap_or(false);
        if unfinished {
            self.stop_descendants(name, group);
        } else {
            self.remove_group(group);
        }
    }

    /// Projection, parent notification, waiters: what follows any recorded end.
    fn after_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        self.project_end(agent, result, h);
        self.notify_end(agent, result, h);
    }

    fn project_end(
        &self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        project_agent(&self.projection, &self.paths, agent, None);
        self.project_channel(agent, result);
        if let (Some(h), Some(dir)) = (h, self.channel_dir_of(agent)) {
            self.projection
                .write(dir.join("refs.jsonl"), h.output.refs.clone());
        }
        if crate::objects::object_removed(agent) {
            self.projection
                .remove_dir(self.paths.agent_dir(&agent.name));
            self.projection.remove_dir(self.paths.shim(&agent.name));
        }
    }

    /// Tells the parent, a pending spawn reply and the waiters. Called only after
    /// the projection writes of the change are queued, so whoever is told and then
    /// flushes sees the files.
    fn notify_end(
        &mut self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
    ) {
        if let Status::Ended(t) = agent.status {
            let took = self.live.get(&agent.name).map(|l| l.admitted.elapsed());
            self.metrics.invocation(t.word(), took);
        }
        // The parent hears of its child's end, and so does the customer when it
        // is someone else (SPEC 7 `child`; SPEC 9: the customer takes the result).
        let told = agent.parent.iter().chain(
            agent
                .customer
                .iter()
                .filter(|c| Some(*c) != agent.parent.as_ref()),
        );
        for p in told {
            // The context pack (SPEC 4): the result, the refs' summaries and the
            // artifacts they name; never the child's transcript.
            let pack = crate::channel::pack(result, h);
            let event = json!({"status": agent.status.api_word(), "reason": agent.status.reason(), "result": result, "refs": pack["refs"], "artifacts": pack["artifacts"]});
            self.to_agent(
                p,
                &ToAgent::Child {
                    child: agent.name.to_string(),
                    event,
                },
            );
        }
        if let Some(l) = self.live.get_mut(&agent.name)
            && let Some((reply, _)) = l.spawn_reply.take()
        {
            self.respond(reply, Ok(agent_json(&self.store, agent)));
        }
        let done = self
            .waiters
            .done_with(&agent.name, |n| self.finished_in_store(n));
        self.answer_waiters(done);
    }

    fn finished_in_store(&self, n: &AgentName) -> bool {
        self.store
            .agent(&self.tenant, n)
            .ok()
            .flatten()
            .is_some_and(|a| a.status.is_finished())
    }

    /// Answers the waiters `ids` with the agents as they are now.
    fn answer_waiters(&mut self, ids: Vec<u64>) {
        for id in ids {
            if let Some(w) = self.waiters.take(id) {
                let r = self.wait_result(&w.names, false);
                self.respond(w.reply, r);
            }
        }
    }

    fn on_send(&mut self, caller: &Caller, name: &AgentName, text: &str) -> ApiResult {
        self.tool_granted(caller, "send")?;
        let a = self.agent(name)?;
        self.authorize(caller, &a)?;
        let Some(l) = self.live.get(name) else {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} is {}; it takes no input (resume it instead)",
                    a.status.api_word()
                ),
            ));
        };
        if l.protocol != Protocol::Brood || l.stopping.is_some() || l.stdin.is_none() {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} cannot take input now ({}, protocol {})",
                    a.status.api_word(),
                    l.protocol.as_str()
                ),
            ));
        }
        let from = match caller {
            Caller::Agent(me) => me.to_string(),
            Caller::User { uid } => format!("user:{uid}"),
        };
        let run = l.run.clone();
        let session = l.session.clone();
        let m = self
            .store
            .append_message(&self.tenant, name, &session, &run, "user", text, now_ms())
            .map_err(internal)?;
        let id = format!("in-{}", m.seq);
        let dir = self.paths.session_dir(name, &session);
        self.projection
            .append(dir.join("messages.jsonl"), crate::objects::message_line(&m));
        self.append_events(&[ev(
            name,
            Some(&run),
            &session,
            AgentEvent::Input {
                agent: name.clone(),
                id: id.clone(),
                from: from.clone(),
            },
        )]);
        self.to_agent(
            name,
            &ToAgent::Input {
                id: id.clone(),
                from,
                text: text.to_owned(),
            },
        );
        Ok(json!({"id": id}))
    }

    fn on_wait(
        &mut self,
        caller: &Caller,
        names: Vec<AgentName>,
        timeout: Option<Duration>,
        reply: Reply,
    ) {
        if let Err(e) = self.tool_granted(caller, "wait") {
            return self.respond(reply, Err(e));
        }
        for n in &names {
            match self.agent(n).and_then(|a| self.authorize(caller, &a)) {
                Ok(()) => {}
                Err(e) => return self.respond(reply, Err(e)),
            }
        }
        let all_done = names.iter().all(|n| {
            self.store
                .agent(&self.tenant, n)
                .ok()
                .flatten()
                .is_some_and(|a| a.status.is_finished())
                && !self.live.contains_key(n)
        });
        if all_done {
            let r = self.wait_result(&names, false);
            return self.respond(reply, r);
        }
        let id = self.id();
        self.waiters.add(id, names, reply);
        if let Some(t) = timeout {
            let tx = self.tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                let _ = tx.send(Cmd::WaitTimeout(id));
            });
        }
    }

    fn wait_result(&self, names: &[AgentName], timed_out: bool) -> ApiResult {
        let mut rows = Vec::new();
        for n in names {
            let a = self.agent(n)?;
            rows.push(agent_json(&self.store, &a));
        }
        Ok(json!({"agents": rows, "timed_out": timed_out}))
    }

    fn on_cancel(&mut self, caller: &Caller, name: &AgentName) -> ApiResult {
        let a = self.agent(name)?;
        self.authorize(caller, &a)?;
        if a.status.is_finished() {
            return Ok(agent_json(&self.store, &a));
        }
        if self.live.get(name).is_some_and(|l| l.stopping.is_some()) {
            return Ok(agent_json(&self.store, &a));
        }
        self.stop_subtree(name, Terminal::Cancelled(CancelReason::User));
        let a = self.agent(name)?;
        Ok(agent_json(&self.store, &a))
    }

    fn on_close(&mut self, caller: &Caller, name: &AgentName) -> ApiResult {
        self.tool_granted(caller, "close")?;
        let a = self.agent(name)?;
        self.authorize(caller, &a)?;
        let Status::Ended(t) = a.status else {
            if matches!(a.status, Status::Closed(_)) {
                return Ok(agent_json(&self.store, &a));
            }
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} is {}; only a finished agent can be closed (cancel it first)",
                    a.status.api_word()
                ),
            ));
        };
        let ev1 = ev(
            name,
            Some(&a.run),
            &a.session,
            AgentEvent::Close {
                agent: name.clone(),
            },
        );
        let a = self
            .store
            .set_status(
                &self.tenant,
                name,
                Status::Closed(t),
                None,
                now_ms(),
                std::slice::from_ref(&ev1),
            )
            .map_err(internal)?;
        self.project_events(&[ev1]);
        project_agent(&self.projection, &self.paths, &a, None);
        Ok(agent_json(&self.store, &a))
    }

    fn on_resume(&mut self, caller: &Caller, name: &AgentName, text: Option<String>, reply: Reply) {
        if let Err(e) = self.tool_granted(caller, "resume") {
            return self.respond(reply, Err(e));
        }
        let r = (|| -> Result<(), ApiError> {
            let a = self.agent(name)?;
            // SPEC 9: a resume that would make the requester its own ancestor.
            if let Caller::Agent(me) = caller
                && self
                    .store
                    .is_ancestor_or_self(&self.tenant, name, me)
                    .map_err(internal)?
            {
                return Err(ApiError::new(
                    Code::Cycle,
                    format!("agent {me} cannot resume {name}: it is {me} or one of its ancestors"),
                ));
            }
            self.authorize(caller, &a)?;
            if !a.status.is_finished() {
                return Err(ApiError::new(
                    Code::Conflict,
                    format!(
                        "agent {name} is {}; only a finished agent can be resumed",
                        a.status.api_word()
                    ),
                ));
            }
            let parent_live = match &a.parent {
                Some(p) => {
                    let l = self.live.get(p).filter(|l| l.stopping.is_none()).ok_or_else(|| {
                        ApiError::new(Code::ParentMismatch, format!("parent {p} of {name} is not running; an owned child cannot outlive its parent"))
                    })?;
                    Some((l.group.clone(), l.session.clone()))
                }
                None => None,
            };
            let run = new_run_id();
            let events = [ev(
                name,
                Some(&run),
                &a.session,
                AgentEvent::Resume {
                    agent: name.clone(),
                    run: run.clone(),
                },
            )];
            let a = self
                .store
                .resume(&self.tenant, name, &run, &self.me, now_ms(), &events)
                .map_err(internal)?;
            self.project_events(&events);
            if let Some(t) = &text {
                let m = self
                    .store
                    .append_message(&self.tenant, name, &a.session, &run, "user", t, now_ms())
                    .map_err(internal)?;
                self.projection.append(
                    self.paths
                        .session_dir(name, &a.session)
                        .join("messages.jsonl"),
                    crate::objects::message_line(&m),
                );
            }
            project_agent(&self.projection, &self.paths, &a, None);
            let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
            let argv: Vec<String> = spec["argv"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let cwd = spec["cwd"].as_str().map(str::to_owned);
            let policy = stored_policy(&spec, &self.operator_policy())?;
            // A `temp` agent's object was removed when its last run ended.
            let adir = self.paths.agent_dir(name);
            for (file, text) in crate::objects::control_files(&a, &policy, &spec) {
                self.projection.write(adir.join(file), text);
            }
            self.project_shim(name);
            let parent_pair = a
                .parent
                .clone()
                .zip(parent_live.as_ref().map(|(_, s)| s.clone()));
            let mut live = Live::new(
                run.clone(),
                a.session.clone(),
                parent_pair,
                a.protocol,
                policy,
                text.clone(),
            );
            live.iso_ns = spec["iso"] == "ns";
            live.ns_root = spec["root"].as_str().map(PathBuf::from);
            // Its budget covers what it and its subtree spent in earlier runs too.
            live.subtree_usd = self
                .store
                .spend(&self.tenant, name)
                .map(|s| s.subtree.cost_usd)
                .map_err(internal)?;
            let group_parent = parent_live.and_then(|(g, _)| g);
            live.pending = Some(Pending {
                argv,
                cwd,
                group_parent,
            });
            self.live.insert(name.clone(), live);
            self.waiting.push(name.clone());
            self.pump_queue();
            Ok(())
        })();
        match r {
            Ok(()) => {
                if let Some(l) = self.live.get_mut(name) {
                    l.spawn_reply = Some((reply, false));
                }
            }
            Err(e) => self.respond(reply, Err(e)),
        }
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

fn exit_code(status: i32) -> Option<i32> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    }
}

/// SPEC 7's rules for how a run ended, from what the agent said and how it exited.
fn outcome_of(l: &Live, status: i32) -> (Terminal, Option<String>, Option<String>) {
    let signalled = libc::WIFSIGNALED(status);
    let sig_detail = || format!("killed by signal {}", libc::WTERMSIG(status));
    match l.protocol {
        Protocol::Exec => {
            let out = String::from_utf8_lossy(&l.exec_out).into_owned();
            if signalled {
                (
                    Terminal::Failed(FailReason::Crashed),
                    Some(out),
                    Some(sig_detail()),
                )
            } else if exit_code(status) == Some(0) {
                (Terminal::Completed, Some(out), None)
            } else {
                (
                    Terminal::Failed(FailReason::ExitCode),
                    Some(out),
                    Some(format!("exit code {}", exit_code(status).unwrap_or(-1))),
                )
            }
        }
        Protocol::Brood => {
            if let Some(e) = &l.protocol_error {
                return (
                    Terminal::Failed(FailReason::ProtocolError),
                    None,
                    Some(e.clone()),
                );
            }
            if let Some(d) = &l.done {
                return if d.success {
                    (Terminal::Completed, Some(d.response.clone()), None)
                } else {
                    (
                        Terminal::Failed(FailReason::ExitCode),
                        Some(d.response.clone()),
                        Some("the agent reported success: false".into()),
                    )
                };
            }
            if let Some(e) = &l.error {
                return (
                    Terminal::Failed(FailReason::ExitCode),
                    Some(e.clone()),
                    Some(format!("the agent reported an error: {e}")),
                );
            }
            if signalled {
                return (
                    Terminal::Failed(FailReason::Crashed),
                    None,
                    Some(format!(
                        "{}; stderr tail: {}",
                        sig_detail(),
                        l.stderr_tail.trim_end()
                    )),
                );
            }
            (
                Terminal::Failed(FailReason::ExitedWithoutResult),
                None,
                Some(format!(
                    "exited with code {} without done or error; stderr tail: {}",
                    exit_code(status).unwrap_or(-1),
                    l.stderr_tail.trim_end()
                )),
            )
        }
    }
}

/// Kills what a refused launch started and removes its group.
fn reap_orphan_launch(p: Launched, group: Option<Group>, cg: Option<Arc<Cgroups>>) {
    std::thread::spawn(move || {
        if let (Some(g), Some(cg)) = (&group, &cg) {
            if let Err(e) = cg.kill_and_remove(g, Duration::from_secs(5)) {
                tracing::error!(group = %g.dir.display(), error = %e, "removing a refused agent's cgroup failed");
            }
        } else {
            // SAFETY: the process group we created for it.
            unsafe { libc::killpg(p.pid, libc::SIGKILL) };
        }
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(p.pid, std::ptr::null_mut(), 0) };
        drop::<(OwnedFd, OwnedFd, OwnedFd, OwnedFd)>((p.pidfd, p.stdin, p.stdout, p.stderr));
    });
}
