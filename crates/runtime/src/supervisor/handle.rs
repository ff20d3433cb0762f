//! The handle every surface holds: starting a supervisor (the store, the
//! cgroups, the keeper, the veil, recovery of a dead incarnation, the
//! dispatcher's task) and the verbs as async calls that send a `Cmd` and await
//! its answer.

use super::{
    Cmd, Config, Dispatcher, HostInfo, Reply, StartError, Supervisor, Waiters, agents::Agents,
    host::Host, jobs, jobs::JobOp, launcher::Launcher, now_ms, queue, records::Records,
    remove::RemoveOp, sockets, sweep,
};
use crate::api::ApiError;
use crate::api::Caller;
use crate::api::SpawnRequest;
use crate::hosts::host_alive;
use crate::hosts::node_labels;
use crate::hosts::registered_nodes;
use crate::hosts::supervisor_id;
use crate::intake::supplementary_groups;
use crate::intake::unsafe_getegid;
use crate::intake::unsafe_geteuid;
use crate::objects::project_agent;
use crate::paths::Paths;
use crate::projection::Projection;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::policy::Policy;
use brood_launch::Spawner;
use brood_launch::cgroup::Cgroups;
use brood_launch::env::Base;
use brood_store::Store;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

/// How long a creation waits for a store that is not answering before it
/// is refused `unavailable` (`Supervisor::store_answers`).
const STORE_WAIT: Duration = Duration::from_secs(2);

impl Supervisor {
    /// Opens the store, cleans up after a dead predecessor, and starts the
    /// dispatcher on the current tokio runtime.
    pub fn start(cfg: Config) -> Result<Supervisor, StartError> {
        let uid = unsafe_geteuid();
        let paths = Paths::new(cfg.root.clone(), uid).with_db(cfg.store.clone());
        for d in [paths.root.clone(), paths.ctx(), paths.root.join("ns")] {
            std::fs::create_dir_all(&d).map_err(|source| StartError::Dir { path: d, source })?;
        }
        // The root is the daemon user's alone (issue 24): no other local user
        // reaches the store, the ctx tree or the blobs beneath it. Agents run
        // as that user (or root without capabilities), so they pass; what
        // they may see inside is the veil's and the sandbox's to decide.
        private_dir(&paths.root).map_err(|source| StartError::Dir {
            path: paths.root.clone(),
            source,
        })?;
        // `ctx/` itself belongs to the tree's owner like everything in it, so
        // an agent (uid 0 without capabilities) can neither add an entry
        // beside `agent/` and `home/` nor rename them.
        if let Some(owner) = crate::projection::ctx_owner() {
            let ctx = paths.ctx();
            std::os::unix::fs::lchown(&ctx, Some(owner), Some(owner))
                .map_err(|source| StartError::Dir { path: ctx, source })?;
        }
        let store: Arc<dyn Store> = brood_store::open(&paths.db().to_string_lossy())?;
        let tenant = TenantId::for_uid(uid);
        let me = supervisor_id(std::process::id() as i32)
            .unwrap_or_else(|| format!("s{}-0", std::process::id()));
        let projection = Projection::start().map_err(StartError::Projection)?;
        // Nodes that share a store but no Redis count the tenant's slots in
        // the store, so `max_concurrent` holds across all of them.
        let slots: Arc<dyn crate::slots::Slots> = match (&cfg.slots, &cfg.node) {
            (None, Some(_)) => Arc::new(crate::slots::StoreShares::new(store.clone(), &me)),
            // Waited for, not refused at once: the Redis may be restarting.
            _ => crate::slots::open_waiting(cfg.slots.as_deref(), &me, crate::slots::START_WAIT)?,
        };

        // Cgroups: detect, reap what an earlier incarnation left, open ours.
        let instance = crate::paths::instance_key(&paths.root);
        let (cgroups, cgroup_desc, kill_desc) =
            match brood_launch::cgroup::detect(std::path::Path::new("/")).and_then(|det| {
                if !cfg.cgroups {
                    return Err(brood_launch::cgroup::CgroupError::NoCgroupFs(
                        "disabled by configuration".into(),
                    ));
                }
                // This root's dead incarnations, and every other root's that
                // are dead by their liveness mark and empty (issue 28 item 2;
                // `cgroup::leftovers`).
                match Cgroups::reap_host(&det, Some(&instance), false) {
                    Ok(l) => tracing::info!(?l, "reaped leftover cgroups"),
                    Err(e) => tracing::warn!(error = %e, "reaping leftover cgroups failed"),
                }
                let c = Cgroups::open(&det, &instance)?;
                if let Err(why) = c.mark() {
                    tracing::warn!(
                        why,
                        "no liveness mark: this supervisor is judged by its pid, so other roots' starts leave its groups alone"
                    );
                }
                Ok(c)
            }) {
                Ok(c) => {
                    let d = format!("{} at {}", c.layout(), c.base().display());
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
        let nodes = registered_nodes(store.as_ref())?;
        let dead: Vec<String> = store
            .supervisors_with_unfinished()?
            .into_iter()
            .filter(|s| !host_alive(s, &nodes))
            .collect();
        let operator = Policy::operator(uid, unsafe_getegid(), supplementary_groups());
        let mut restart = super::restart::Restart::default();
        if !dead.is_empty() {
            // Those whose policy says `on_restart: resume` start again, in
            // the same transaction that ends the rest (issue 29).
            let resuming = super::restart::plan(store.as_ref(), &tenant, &dead, &operator)?;
            let recovered = store.recover_resuming(&dead, &resuming, &me, now_ms())?;
            for a in &recovered.agents {
                project_agent(&projection, &paths, a, None);
            }
            tracing::info!(
                count = recovered.agents.len(),
                resumed = recovered.resumed.len(),
                "recovered agents of dead supervisors"
            );
            restart = super::restart::Restart::new(recovered.agents, &recovered.resumed, &tenant);
        }

        // The ctx tree is a projection of the store: rebuild it whole, so whatever
        // happened to the files while no supervisor ran (a crash mid-write, a
        // deleted tree, the records recovery just wrote) is made true again.
        match crate::rebuild::rebuild(
            store.as_ref(),
            &tenant,
            &paths,
            &operator,
            cfg.bin_dir.as_deref(),
        ) {
            Ok(r) => tracing::info!(
                agents = r.agents,
                files = r.files,
                artifacts_elsewhere = r.artifacts_elsewhere,
                leftovers_removed = r.leftovers_removed,
                blob_temps_removed = r.blob_temps_removed,
                unrecorded_removed = r.unrecorded_removed,
                "ctx tree rebuilt"
            ),
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
            // The providers' key files are covered too (issue 31): no
            // agent opens them, whatever its policy grants.
            let key_files = cfg
                .gateway
                .as_ref()
                .map(|g| g.providers.key_files())
                .unwrap_or_default();
            match crate::veil::Veil::new(&paths, &key_files) {
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
        // A node registers before it takes any work, so the cluster sees it
        // with its load from its first agent on.
        if let Some(node) = &cfg.node {
            let labels = node_labels(&node.labels);
            let new = brood_store::NewNode {
                id: me.clone(),
                address: node.address.clone(),
                labels,
                capacity: node.capacity,
            };
            if let Err(e) = store.register_node(&new) {
                tracing::error!(error = %e, "registering this node in the store");
            }
        }
        let cfg_quotas = cfg.quotas;
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let tracer = match &cfg.traces {
            None => crate::trace::Tracer::default(),
            Some(x) => crate::trace::Tracer::start(
                x.clone(),
                store.clone(),
                meta["containment"].to_string(),
            )
            .map_err(|e| StartError::Thread(std::io::Error::other(e)))?,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let disp_me = me.clone();
        let disp_cfg_node = cfg.node.clone();
        let heard = Arc::new(super::records::Heard::default());
        if cfg.node.is_some() {
            // The other nodes' writes wake this loop at once (a cancel there
            // reaching processes here); without it they wait for a tick.
            let (tx, heard) = (tx.clone(), heard.clone());
            let on_news = Arc::new(move |what: brood_store::Changed| {
                if heard.heard(what) {
                    let _ = tx.send(Cmd::News);
                }
            });
            if let Err(e) = store.hear(&me, on_news) {
                tracing::error!(error = %e, "listening for the other nodes' news; their changes reach this node at its ticks");
            }
        }
        let base = Base::from_supervisor(cfg.bin_dir.as_ref().and_then(|p| p.to_str()));
        let intake = Arc::new(crate::intake::Intake::new(
            cfg.limits,
            base.path.clone(),
            operator.clone(),
            veil.clone(),
        ));
        let own_cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let outsiders = Arc::new(super::outsider::Outsiders {
            uid,
            own_cgroups: own_cgroups.clone(),
            cgroups: cgroups.clone(),
            keeper: spawner.keeper_watch(),
        });
        let store_health = crate::store_health::StoreHealth::start(
            store.clone(),
            tenant.clone(),
            Duration::from_secs(1),
        );
        let brood_exe = std::env::current_exe().ok();
        let admitting = super::admitting::Admitting::start(
            store.clone(),
            tenant.clone(),
            cfg.quotas,
            tx.clone(),
        )
        .map_err(StartError::Thread)?;
        let ends_writer =
            super::ends_writer::EndsWriter::start(store.clone(), tenant.clone(), tx.clone())
                .map_err(StartError::Thread)?;
        let starts_writer = super::starts_writer::StartsWriter::start(
            store.clone(),
            tenant.clone(),
            cfg.hooks.start_recorded.clone(),
            tx.clone(),
        )
        .map_err(StartError::Thread)?;
        let stops = super::stops::Stops::new(cgroups.clone(), cfg.grace, tx.clone());
        let ends = super::ends::Ends::new(tx.clone(), cfg.node.is_some(), uid, unsafe_getegid());
        let relay = super::protocol::Relay::new(cfg.resource_defaults.disk_max, cgroups.clone());
        let disp = Dispatcher {
            host: Host {
                cfg,
                tx: tx.clone(),
                paths: paths.clone(),
                base,
                me,
                meta,
                info: info.clone(),
                uid,
                gid: unsafe_getegid(),
                groups: supplementary_groups(),
                // What identify compares callers' groups with: read once, the
                // groups a process is in do not change under it.
                own_cgroups,
                outsiders: outsiders.clone(),
                store_health: store_health.clone(),
                brood_exe: brood_exe.clone(),
                intake: intake.clone(),
                metrics: metrics.clone(),
                tracer: tracer.clone(),
            },
            records: Records {
                store: store.clone(),
                tenant: tenant.clone(),
                paths: paths.clone(),
                projection: projection.clone(),
                heard,
                unsent: Default::default(),
            },
            launcher: Launcher {
                spawner,
                cgroups,
                slots,
                netns_pool: None,
                veil,
                veil_ns: crate::veil::VeilCache::default(),
                waiting: queue::Queue::default(),
                max_concurrent: cfg_quotas
                    .effective(store.tenant_quotas(&tenant).ok().as_ref())
                    .max_concurrent,
                spare: 0,
                emptying: 0,
                unsure: false,
            },
            agents: Agents::default(),
            waiters: Waiters::default(),
            next_id: 1,
            stops,
            sweep: sweep::Sweeps::default(),
            sockets: sockets::Sockets::default(),
            jobs: jobs::Runner::new(brood_exe),
            orphans: super::orphans::Orphans::default(),
            disk: super::disk::DiskWatch::default(),
            ends_together: None,
            ends,
            relay,
            restart,
            cluster: super::cluster::Cluster::new(disp_me.clone(), disp_cfg_node),
            admitting,
            ends_writer,
            starts_writer,
            models: super::models::Models::default(),
            shutting: None,
        };
        if let Some(every) = disp.host.cfg.sweep_every {
            sweep::start_clock(tx.clone(), every, disp.sweep.tick_queued.clone());
        }
        // The dispatcher on a thread of its own: its store calls block that
        // thread only, never one of the runtime's workers, whose queued tasks
        // (the sockets' accepts, a request's identification) would wait with
        // it while the store is away (issue 27). It still spawns onto, and
        // times with, the runtime it was started on.
        let rt = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("brood-dispatch".into())
            .spawn(move || rt.block_on(disp.run(rx)))
            .map_err(StartError::Thread)?;
        Ok(Supervisor {
            tx,
            store,
            tenant,
            paths,
            info,
            projection,
            metrics,
            tracer,
            intake,
            me: disp_me,
            outsiders,
            store_health,
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    /// Whether the store answers now, as its probe last found
    /// (`store_health`): `Err` says why not. Never waits for the store.
    pub fn store_health(&self) -> Result<(), String> {
        self.store_health.check()
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

    /// Sends the command `mk` makes and awaits its typed answer.
    pub(super) async fn call<T>(&self, mk: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(mk(tx))
            .map_err(|_| ApiError::new(Code::Internal, "the supervisor has stopped"))?;
        rx.await
            .map_err(|_| ApiError::new(Code::Internal, "the supervisor has stopped"))?
    }

    /// Creates an agent: the caller's rate taken, what the request names on
    /// the filesystem checked off the async threads (`intake`), then admission
    /// on the dispatcher. A refusal at the intake is counted and noted in the
    /// would-be parent's log like any refused creation; one for the rate only
    /// counted, so a flood writes nothing.
    pub async fn spawn(
        &self,
        caller: Caller,
        req: SpawnRequest,
    ) -> Result<brood_api::Agent, ApiError> {
        if let Err(e) = self.intake.rate(&caller) {
            self.metrics.refusal(e.code);
            return Err(e);
        }
        self.store_answers().await?;
        let (intake, store, tenant) =
            (self.intake.clone(), self.store.clone(), self.tenant.clone());
        let (c2, req) = (caller.clone(), req);
        let checked = tokio::task::spawn_blocking(move || {
            let r = intake.check_spawn(store.as_ref(), &tenant, &c2, &req);
            (r, req)
        })
        .await;
        let req = match checked {
            Ok((Ok(()), req)) => req,
            Ok((Err(e), req)) => {
                let parent = match &caller {
                    Caller::Agent(me) => Some(me.clone()),
                    Caller::User { .. } => req.parent.clone(),
                };
                self.refused(parent, req.name.as_ref().map(|n| n.to_string()), e.clone());
                return Err(e);
            }
            Err(e) => {
                tracing::error!(error = %e, "the intake's check of a creation did not finish");
                return Err(ApiError::new(
                    Code::Internal,
                    "checking the creation failed (see the supervisor's log)",
                ));
            }
        };
        self.call(|r| Cmd::Spawn(caller, Box::new(req), r)).await
    }

    /// New work waits a bounded time for a store that is not answering
    /// (issue 27 item 5), then is refused `unavailable` with a time to ask
    /// again, instead of queueing behind a dispatcher stuck in a store call.
    async fn store_answers(&self) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::now() + STORE_WAIT;
        loop {
            let why = match self.store_health.check() {
                Ok(()) => return Ok(()),
                Err(why) => why,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::new(
                    Code::Unavailable,
                    format!("{why}; nothing new is admitted until it does"),
                )
                .retry_after(1));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The intake's limits and checks, for the surfaces that create jobs.
    pub fn intake(&self) -> &Arc<crate::intake::Intake> {
        &self.intake
    }
    /// An input for a running agent: its id (`in-<n>`), or where it was
    /// posted when another node runs the agent.
    pub async fn send(
        &self,
        caller: Caller,
        name: AgentName,
        text: String,
    ) -> Result<brood_api::InputReply, ApiError> {
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
    ) -> Result<brood_api::WaitReply, ApiError> {
        self.call(|r| Cmd::Wait(caller, names, timeout, r)).await
    }
    pub async fn cancel(
        &self,
        caller: Caller,
        name: AgentName,
    ) -> Result<brood_api::Agent, ApiError> {
        self.call(|r| Cmd::Cancel(caller, name, r)).await
    }
    pub async fn close(
        &self,
        caller: Caller,
        name: AgentName,
    ) -> Result<brood_api::Agent, ApiError> {
        self.call(|r| Cmd::Close(caller, name, r)).await
    }
    pub async fn resume(
        &self,
        caller: Caller,
        name: AgentName,
        text: Option<String>,
    ) -> Result<brood_api::Agent, ApiError> {
        self.resume_with(caller, name, text, brood_api::Secrets::new())
            .await
    }

    /// [`Self::resume`] giving a root's secret values again (issue 25): no
    /// value outlives the run it was given for. A child's come from its
    /// parent, so giving any for one is refused.
    pub async fn resume_with(
        &self,
        caller: Caller,
        name: AgentName,
        text: Option<String>,
        secrets: brood_api::Secrets,
    ) -> Result<brood_api::Agent, ApiError> {
        self.call(|r| Cmd::Resume(caller, name, text, Box::new(secrets), r))
            .await
    }

    /// Starts a pending job (SPEC 10): its workers are created as its owner's children.
    pub async fn job_start(
        &self,
        caller: Caller,
        id: String,
    ) -> Result<brood_api::JobView, ApiError> {
        self.call(|r| Cmd::Job(caller, JobOp::Start(id, r))).await
    }

    /// Cancels a job: no more assignment, its workers cancelled, completed items kept.
    pub async fn job_cancel(
        &self,
        caller: Caller,
        id: String,
    ) -> Result<brood_api::JobView, ApiError> {
        self.call(|r| Cmd::Job(caller, JobOp::Cancel(id, r))).await
    }

    /// A worker's `job.report {job?, item?, result, stop?}` for the item it
    /// holds (only a worker, never the operator, reports): accepted, and
    /// its next item unless it asked to stop.
    pub async fn job_report(
        &self,
        caller: Caller,
        args: serde_json::Value,
    ) -> Result<brood_api::ReportReply, ApiError> {
        self.call(|r| Cmd::Job(caller, JobOp::Report(args, r)))
            .await
    }

    /// The pending `item` of running job `job` gets its next attempt now:
    /// on `worker` (a live agent under the job's owner holding no item), or
    /// on a new worker.
    pub async fn job_assign(
        &self,
        caller: Caller,
        job: String,
        item: String,
        worker: Option<AgentName>,
    ) -> Result<brood_api::AssignReply, ApiError> {
        self.call(|reply| {
            Cmd::Job(
                caller,
                JobOp::Assign {
                    job,
                    item,
                    worker,
                    reply,
                },
            )
        })
        .await
    }

    /// The failed `item` of job `job` (or, without one, every failed item)
    /// back to pending; a failed job reopens.
    pub async fn job_retry(
        &self,
        caller: Caller,
        job: String,
        item: Option<String>,
    ) -> Result<brood_api::RetryReply, ApiError> {
        self.call(|reply| Cmd::Job(caller, JobOp::Retry { job, item, reply }))
            .await
    }

    /// Removes the finished tree of root `name` (issue 25): every record of
    /// it, then its files; its names are free again. The operator's: an
    /// agent is refused (a whole tree is never in its own subtree).
    pub async fn remove_tree(
        &self,
        caller: Caller,
        name: AgentName,
    ) -> Result<brood_api::RemovedTree, ApiError> {
        let r = self
            .call(|r| Cmd::Remove(caller, RemoveOp::Tree(name, r)))
            .await;
        // Whoever was answered may look at the ctx tree next: its files go first.
        self.flush().await;
        r
    }

    /// Removes job `id` (not running) with its items, attempts and its own
    /// workers' trees (issue 25).
    pub async fn remove_job(
        &self,
        caller: Caller,
        id: String,
    ) -> Result<brood_api::RemovedJob, ApiError> {
        let r = self
            .call(|r| Cmd::Remove(caller, RemoveOp::Job(id, r)))
            .await;
        self.flush().await;
        r
    }

    /// Every finished tree whose last end is at least `older_than_ms` old
    /// (issue 25): listed off the loop, then each removed by a command of
    /// its own, so the loop answers others between them; only listed when
    /// `dry_run`. A tree that changed since it was listed is skipped with
    /// the reason.
    pub async fn prune(
        &self,
        caller: Caller,
        older_than_ms: i64,
        dry_run: bool,
    ) -> Result<brood_api::PruneReply, ApiError> {
        crate::remove::may_prune(&caller)?;
        let (store, tenant) = (self.store.clone(), self.tenant.clone());
        let found = tokio::task::spawn_blocking(move || {
            crate::remove::prune_candidates(store.as_ref(), &tenant, older_than_ms, now_ms())
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "listing the trees to prune did not finish");
            ApiError::new(
                Code::Internal,
                "listing the trees failed (see the supervisor's log)",
            )
        })??;
        let mut reply = brood_api::PruneReply {
            dry_run,
            removed: Vec::new(),
            skipped: Vec::new(),
        };
        for t in found {
            let shown =
                crate::remove::removed_tree(&t.root, t.agents as usize, Some(t.last_end_ms));
            if dry_run {
                reply.removed.push(shown);
                continue;
            }
            match self.remove_tree(caller.clone(), t.root.clone()).await {
                Ok(_) => reply.removed.push(shown),
                Err(e) => reply.skipped.push(brood_api::SkippedTree {
                    root: t.root.to_string(),
                    reason: e.message,
                }),
            }
        }
        Ok(reply)
    }

    /// Notes a creation refused while its request was read (see `note_refusal`).
    pub fn refused(&self, parent: Option<AgentName>, requested: Option<String>, e: ApiError) {
        let _ = self.tx.send(Cmd::Refused(parent, requested, e));
    }

    /// Who is calling, from a peer's pid (peer credentials): the agent whose
    /// cgroup (or, failing that, ancestry) holds that process, or a user
    /// provably outside every tree; refused for a process inside a tree that
    /// no live agent accounts for (`supervisor::identify`).
    pub async fn identify(&self, pid: i32, uid: u32) -> Result<Caller, ApiError> {
        // The operator needs no look at the live agents: proven here, it
        // never waits for the loop (issue 27).
        if let Some(c) = self.outsiders.operator(pid, uid) {
            return Ok(c);
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Identify(pid, uid, tx)).is_err() {
            return Err(ApiError::new(
                Code::Internal,
                "the supervisor is shutting down",
            ));
        }
        match rx.await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(why)) => Err(ApiError::new(Code::Forbidden, why)),
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
        // A node that stops cleanly leaves the cluster's list (a node that
        // dies stays, its heartbeat growing old).
        if let Err(e) = self.store.leave_node(&self.me) {
            tracing::warn!(error = %e, "leaving the cluster's list of nodes");
        }
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
        (g.spans_exported, g.spans_dropped) = self.tracer.counts();
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

/// Gives `dir` mode 0700 when this process owns it; a root that belongs to
/// someone else is theirs to protect, and is left as it is.
fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = std::fs::metadata(dir)?;
    if md.uid() == unsafe_geteuid() && md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
