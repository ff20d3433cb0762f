//! Starting an admitted agent that holds a slot (the queue and the slots are
//! `pump`'s): its cgroup and limits, its policy file, channel and handoff, its
//! sandbox, namespaces and the veil, then the spawner; and what the launch's
//! answer records (`agent.start`).

use super::pump::LaunchReads;
use super::{
    Cmd, Dispatcher, NETNS_POOL_DEPTH, answer, deadline_unix_s, ev_value, io, now_ms,
    reap_orphan_launch, task_of,
};
use crate::objects::project_agent;
use crate::shown::{agent_view, agent_view_of};
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::FailReason;
use brood_core::RunId;
use brood_core::TenantId;
use brood_core::Terminal;
use brood_core::policy::Policy;
use brood_launch::LaunchError;
use brood_launch::LaunchSpec;
use brood_launch::Launched;
use brood_launch::cgroup::Cgroups;
use brood_launch::cgroup::Group;
use brood_launch::cgroup::GroupPath;
use brood_launch::env::Identity;
use brood_store::Agent;
use brood_store::NewEvent;
use brood_store::Protocol;
use brood_store::StartItem;
use brood_store::Store;
use brood_store::StoreError;
use serde_json::Value;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

impl Dispatcher {
    /// Starts an agent that holds a slot. What needs the dispatcher's state is
    /// worked out here (the group's path, the init frame, the limits, the
    /// files' paths and bytes, the environment, the veil's namespace, a pooled
    /// network namespace); the file work (the cgroup and its limits, the
    /// policy file, the channel's `artifact/` and handoff, the sandbox and
    /// namespace preparation) runs on a blocking thread with the spawn, and
    /// everything comes back as one `Cmd::Launched`.
    pub(super) fn launch(
        &mut self,
        name: &AgentName,
        run: &RunId,
        argv: &[String],
        cwd: Option<&str>,
        group_parent: Option<Group>,
        read: LaunchReads,
    ) {
        let fail = |tx: &mpsc::UnboundedSender<Cmd>, what: String| {
            let _ = tx.send(Cmd::Launched(
                name.clone(),
                run.clone(),
                Err(LaunchError::Spawn {
                    program: argv.first().cloned().unwrap_or_default().into(),
                    source: std::io::Error::other(what),
                }),
                Box::default(),
            ));
        };
        // One group per run (`r<seq>.<name>`): a finished run's group may still be
        // being emptied and removed in the background when a resume starts the
        // next one, and the two must never share a directory. The `r<seq>.` prefix
        // also keeps agent names like `memory.x` clear of the kernel's file names.
        let seq = if read.first_run {
            1
        } else {
            self.records
                .store
                .runs(&self.records.tenant, name)
                .map(|r| r.len().max(1))
                .unwrap_or(1)
        };
        let component = format!("r{seq}.{name}");
        let group = match &self.launcher.cgroups {
            Some(cg) => {
                let rel = match &group_parent {
                    Some(g) => g.rel.child(&component),
                    None => GroupPath::new(&[self.records.tenant.as_str(), &component]),
                };
                match rel {
                    Ok(rel) => Some(GroupPlan {
                        cgroups: cg.clone(),
                        rel,
                        // The tenant's directory is shared by its roots.
                        tenant: group_parent
                            .is_none()
                            .then(|| GroupPath::new(&[self.records.tenant.as_str()]).ok())
                            .flatten(),
                    }),
                    Err(e) => return fail(&self.host.tx, format!("creating its cgroup: {e}")),
                }
            }
            None => None,
        };
        let parent_limited = self
            .agents
            .live
            .get(name)
            .and_then(|l| l.parent.as_ref())
            .and_then(|p| self.agents.live.get(p))
            .is_some_and(|p| p.limited);
        let LaunchReads { agent: a, init, .. } = read;
        // The veiled namespace every agent joins, got (and made again when
        // what it hides changed) on the spawner's thread (crate::veil).
        let veil = self
            .launcher
            .veil
            .as_ref()
            .map(|v| (v.clone(), self.launcher.veil_ns.clone()));
        let iso_ns = self.agents.live.get(name).is_some_and(|l| l.iso_ns);
        let channel = self
            .agents
            .live
            .get(name)
            .and_then(|l| l.channel_dir(&self.host.paths, name));
        let artifacts = channel.as_ref().map(|d| d.join("artifact"));
        // iso = ns: a private mount namespace from the policy's mount table, in a
        // root directory brood owns; the cwd is applied inside it. A named
        // root must exist. Without one, the root is a scratch tmpfs the child
        // mounts on `$BROOD_ROOT/ns` inside its own namespace (one directory
        // for every agent: each sees only its own tmpfs).
        let ns = match self.agents.live.get(name) {
            Some(l) if iso_ns => {
                let (ns_root, scratch) = match &l.ns_root {
                    Some(r) => (r.clone(), false),
                    None => (self.host.paths.root.join("ns"), true),
                };
                let spec = crate::enforce::namespace(
                    &l.policy,
                    ns_root.clone(),
                    scratch,
                    cwd,
                    artifacts.as_deref(),
                );
                // A pooled namespace when one is ready; the child makes its own
                // otherwise (and says why if it cannot).
                let netns = if spec.empty_network {
                    if self.launcher.netns_pool.is_none() {
                        match brood_launch::ns::NetnsPool::start(NETNS_POOL_DEPTH) {
                            Ok(p) => self.launcher.netns_pool = Some(p),
                            Err(e) => {
                                tracing::warn!(error = %e, "could not start the network namespace pool")
                            }
                        }
                    }
                    // The model gateway is bound inside it before the
                    // child starts (issue 31): one is made now when the
                    // pool has none ready.
                    let gateway =
                        self.host.cfg.gateway.is_some() && super::models::grants_models(&l.policy);
                    self.launcher
                        .netns_pool
                        .as_ref()
                        .and_then(|p| p.take())
                        .or_else(|| {
                            gateway
                                .then(brood_launch::ns::fresh_netns)
                                .and_then(Result::ok)
                        })
                } else {
                    None
                };
                Some(NsPlan {
                    spec,
                    netns,
                    scratch_dir: scratch.then_some(ns_root),
                })
            }
            _ => None,
        };
        let mut door_listener = None;
        // The run's door to this supervisor (docs/security.md "The door"):
        // the agent's end goes to its process, this end to the door's host.
        // A pair that cannot be made leaves the agent without one: it can
        // still speak its protocol, and says so when it tries the door.
        let door = match &self.host.cfg.doors {
            Some(host) => match door_pair() {
                Ok((ours, theirs)) => {
                    door_listener = Some(host(self.handle(), name.clone(), run.clone(), ours));
                    Some(theirs)
                }
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "making the agent's door failed");
                    None
                }
            },
            None => None,
        };
        // The model gateway's endpoint for this run (issue 31), when its
        // policy grants models: its variables go after everything else the
        // environment holds, so no policy or secret can point it elsewhere.
        let netns = ns
            .as_ref()
            .and_then(|p| p.netns.as_ref())
            .map(std::os::fd::AsFd::as_fd);
        let gateway = self.open_gateway(name, run, netns);
        let providers = self.host.cfg.gateway.as_ref().map(|g| g.providers.clone());
        let Some(l) = self.agents.live.get_mut(name) else {
            return;
        };
        // Kernel enforcement of the policy (SPEC 5): limits on the group, and the
        // sandbox the child applies before exec. A layer the policy needs but the
        // host lacks stops the start, naming the layer (unless the operator allowed
        // a weaker sandbox).
        // Limits live in groups of their own on a hybrid host (the v1 mirrors); an
        // agent joins them when it or an ancestor has a limit, so a parent's limit
        // binds its whole subtree, and an unlimited tree pays nothing for them.
        let limits = crate::enforce::limits(&l.policy);
        let own_limits =
            limits.memory_max.is_some() || limits.pids_max.is_some() || limits.cpu_weight.is_some();
        l.limited = own_limits || parent_limited;
        // Without cgroups there is no layer to hold a limit (SPEC 5: a layer
        // the policy needs but the host lacks stops the start, naming it).
        let limits_missing = own_limits && self.launcher.cgroups.is_none();
        if limits_missing && !self.host.cfg.allow_weaker_sandbox {
            return fail(
                &self.host.tx,
                "resources: the policy sets memory_max, pids_max or cpu_weight, but this host \
                 has no usable cgroups (the limits layer is missing); \
                 --allow-weaker-sandbox starts it without them"
                    .to_owned(),
            );
        }
        // The handoff is there before the child runs (SPEC 4: written when the
        // channel is created; the projection thread may not have got to it
        // yet). The same bytes as the projection's, so whichever lands last
        // changes nothing; a resumed run finds it and leaves it.
        let handoff = match (&artifacts, &a) {
            (Some(dir), Some(a)) => Some((dir.with_file_name("handoff.md"), task_of(a))),
            _ => None,
        };
        // The run's clock starts now; its children must end before its deadline.
        l.deadline_unix_s = l.policy.timeout_s.map(|t| deadline_unix_s(now_ms(), t));
        l.door = door_listener;
        // Every secret its policy names has a value here, or it does not
        // start (issue 25): a run hosted where no value was given (another
        // node's child whose parent is not here) says which one it lacks.
        if let Some(k) = l.secrets.missing(&l.policy.secrets) {
            return fail(
                &self.host.tx,
                format!(
                    "secrets.{k}: no value of secret {k} here (values are held in memory by \
                     the supervisor that was given them, and only for the run they were given for)"
                ),
            );
        }
        // The secrets' values after the policy's `env` (the two share no
        // name): the one place a value leaves the supervisor's memory.
        let mut policy_env: Vec<(String, String)> = l
            .policy
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(
                l.secrets
                    .only(&l.policy.secrets)
                    .pairs()
                    .map(|(k, v)| (k.to_owned(), v.to_owned())),
            )
            .collect();
        if let Some(p) = &providers {
            super::models::strip_keys(p, name, &mut policy_env);
        }
        let gateway_port = gateway.as_ref().map(|(_, port)| *port);
        policy_env.extend(gateway.into_iter().flat_map(|(env, _)| env));
        // Its run's trace context (issue 30): its tree's trace, its run's span.
        if l.trace.is_none() {
            l.trace = a.as_ref().and_then(crate::trace::Placed::of_agent);
        }
        let traceparent = l
            .trace
            .and_then(|t| t.traceparent(run))
            .map(|c| c.to_string());
        let id = Identity {
            traceparent,
            agent: name.to_string(),
            run: run.to_string(),
            parent: l.parent.as_ref().map(|p| p.to_string()),
            customer: a
                .as_ref()
                .and_then(|a| a.customer.as_ref().map(|c| c.to_string())),
            session: l.session.to_string(),
            tenant: self.records.tenant.to_string(),
            socket: self.host.cfg.socket.to_string_lossy().into_owned(),
            policy: self
                .host
                .paths
                .policy_file(name)
                .to_string_lossy()
                .into_owned(),
            ctx_root: self.host.paths.ctx().to_string_lossy().into_owned(),
            ctx_home: self.host.paths.home().to_string_lossy().into_owned(),
            artifacts: artifacts.as_ref().map(|d| d.to_string_lossy().into_owned()),
            door: door.as_ref().map(|_| brood_launch::spawn::DOOR_FD),
        };
        let prep = Prep {
            argv: argv.to_vec(),
            cwd: cwd.map(PathBuf::from),
            env: brood_launch::env::build(&id, &self.host.base, &policy_env),
            stdin_prelude: init.clone().unwrap_or_default(),
            group,
            limits,
            limited: l.limited,
            policy: l.policy.clone(),
            policy_file: self.host.paths.policy_file(name),
            artifacts,
            handoff,
            // The PATH the launcher looks the program up in (the agent's
            // own), so the sandbox grants exec on the file that runs.
            program_path: l
                .policy
                .env
                .get("PATH")
                .cloned()
                .unwrap_or_else(|| self.host.base.path.clone()),
            brood_exe: self.host.brood_exe.clone(),
            root: self.host.uid == 0,
            allow_weaker: self.host.cfg.allow_weaker_sandbox,
            objects: self.host.paths.ctx().join("agent"),
            own_object: self.host.paths.agent_dir(name),
            // Its own view of the ctx tree, when its grants would reach
            // other agents' parts of it (decided once the sandbox is
            // lowered); agents of `iso = ns` build their whole tree anew.
            view: (self.launcher.veil.is_some() && !iso_ns).then(|| ViewPlan {
                ctx: self.host.paths.ctx(),
                own_home: self.host.paths.home().join("agent").join(name.as_str()),
            }),
            ns,
            veil,
            containment: self.host.meta["containment"].clone(),
            limits_missing,
            door,
            file_size_max: crate::enforce::file_size_max(
                &l.policy,
                self.host.cfg.resource_defaults.disk_max,
            ),
            gateway_port,
        };
        l.init = init;
        let tx = self.host.tx.clone();
        let spawner = self.launcher.spawner.clone();
        let hook = self.host.cfg.hooks.before_launch.clone();
        let (n2, r2) = (name.clone(), run.clone());
        let program = argv.first().cloned().unwrap_or_default();
        // Off the dispatcher: the file work runs on the spawner's thread right
        // before the spawn (no extra hop), and one `Cmd::Launched` answers.
        let made = Arc::new(std::sync::Mutex::new(Made::default()));
        let into = made.clone();
        let prep = move || {
            let (spec, m) = prep.run();
            *into
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = *m;
            spec.map_err(|what| LaunchError::Spawn {
                program: program.into(),
                source: std::io::Error::other(what),
            })
        };
        let done = move |r| {
            let m = std::mem::take(
                &mut *made
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            let _ = tx.send(Cmd::Launched(n2, r2, r, Box::new(m)));
        };
        match hook {
            // A test's hook may hold the launch: on a thread of its own, so
            // neither the dispatcher nor the spawner waits for it.
            Some(hook) => {
                let name = name.clone();
                std::thread::spawn(move || {
                    hook(&name);
                    spawner.launch_prepared(prep, done);
                });
            }
            None => spawner.launch_prepared(prep, done),
        }
    }

    pub(super) fn on_launched(
        &mut self,
        name: AgentName,
        run: RunId,
        r: Result<Launched, LaunchError>,
        made: Made,
    ) {
        if let Some(s) = self.launch_begins(name, run, r, made) {
            let start = s.record(
                self.records.store.as_ref(),
                &self.records.tenant,
                &self.host.me,
            );
            self.launch_started(s, start);
        }
    }

    /// What the spawner's answer needs before its start is recorded: the
    /// process taken up by its live entry, or (nobody wants it any more, or
    /// it did not start) everything of it ended here. `Some`: the start to
    /// record ([`Starting::record`]), then [`Self::launch_started`].
    pub(super) fn launch_begins(
        &mut self,
        name: AgentName,
        run: RunId,
        r: Result<Launched, LaunchError>,
        made: Made,
    ) -> Option<Starting> {
        let Made {
            group,
            sandbox,
            launch_meta,
        } = made;
        let live = self.agents.live.get_mut(&name).filter(|l| l.run == run);
        let Some(l) = live else {
            // Nobody wants it any more: make sure nothing survives, group included.
            match r {
                Ok(p) => reap_orphan_launch(p, group, self.launcher.cgroups.clone()),
                Err(_) => self.remove_group(group),
            }
            return None;
        };
        l.group = group;
        l.sandbox = sandbox;
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
                        let r = self
                            .records
                            .agent(&name)
                            .map(|a| agent_view(&self.records.store, &a));
                        answer(reply, r);
                    }
                    return None;
                }
                self.finish(
                    &name,
                    Terminal::Failed(FailReason::ExitCode),
                    None,
                    None,
                    Some(detail),
                    None,
                );
                return None;
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
            if let Some(v) = launch_meta.get(k) {
                start_payload[k] = v.clone();
            }
        }
        let start_events = vec![ev_value(&name, Some(&run), &session, start_payload.clone())];
        Some(Starting {
            name,
            run,
            launched,
            cgroup_path,
            start_payload,
            start_events,
        })
    }

    /// What follows a start the store recorded (or refused: cancelled
    /// between admission and start): the IO task, the projection, the first
    /// words to the agent, the creator's answer.
    pub(super) fn launch_started(&mut self, s: Starting, start: Result<Agent, StoreError>) {
        let Starting {
            name,
            run,
            launched,
            cgroup_path,
            start_payload,
            start_events,
        } = s;
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
                reap_orphan_launch(launched, group, self.launcher.cgroups.clone());
                if let Some((reply, _)) = reply {
                    let r = self
                        .records
                        .agent(&name)
                        .map(|a| agent_view(&self.records.store, &a));
                    answer(reply, r);
                }
                return;
            }
        };
        let pid = launched.pid;
        let written = launched.stdin_written;
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let (protocol, instruction) = match self.agents.live.get_mut(&name) {
            Some(l) => {
                l.pid = Some(pid);
                l.stdin = Some(stdin_tx.clone());
                crate::trace::log_span(&name, &run, l.trace).in_scope(|| {
                    tracing::info!(pid, node = %agent.supervisor, "run started");
                });
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
            self.host.tx.clone(),
        );
        self.records.project_events(&start_events);
        self.records.projection.write(
            self.host.paths.agent_dir(&name).join("meta.json"),
            crate::objects::agent_meta(&agent, Some(&start_payload)),
        );
        project_agent(
            &self.records.projection,
            &self.host.paths,
            &agent,
            Some(pid),
        );
        self.records.project_channel(&self.agents, &agent, None);
        // First words to the agent: what of its init the launch could not put in
        // the pipe before it started (protocol), or the handoff on stdin (exec).
        match protocol {
            Protocol::Brood => {
                let rest = self
                    .agents
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
                if let Some(l) = self.agents.live.get_mut(&name) {
                    // Dropping the only sender closes the agent's stdin after the handoff.
                    l.stdin = None;
                }
            }
        }
        // A plain program is ready once started.
        if protocol != Protocol::Brood
            && let Some(news) = self
                .agents
                .live
                .get_mut(&name)
                .and_then(|l| l.ready_news.take())
        {
            self.tell_ready(&name, Some(news));
        }
        if let Some(l) = self.agents.live.get_mut(&name)
            && let Some((reply, await_ready)) = l.spawn_reply.take()
        {
            if await_ready && protocol == Protocol::Brood {
                l.spawn_reply = Some((reply, true));
            } else {
                // The run as its start just wrote it: nothing read back
                // (the view shows neither its number nor its creation).
                let started = brood_store::Run {
                    id: run.clone(),
                    tenant: agent.tenant.clone(),
                    agent: name.clone(),
                    seq: 0,
                    pid: Some(pid),
                    cgroup: Some(cgroup_path),
                    outcome: None,
                    exit_code: None,
                    result: None,
                    tokens_in: 0,
                    tokens_out: 0,
                    cost_usd: 0.0,
                    started_ms: Some(agent.updated_ms),
                    ended_ms: None,
                    created_ms: agent.updated_ms,
                };
                answer(reply, Ok(agent_view_of(&agent, Some(started))));
            }
        }
    }
}

/// Where an agent's group goes: made off the dispatcher with its limits.
struct GroupPlan {
    cgroups: Arc<Cgroups>,
    rel: GroupPath,
    /// The tenant's directory, made first for a root (shared by its roots).
    tenant: Option<GroupPath>,
}

/// The private namespace of `iso = ns`, prepared off the dispatcher.
struct NsPlan {
    spec: brood_launch::ns::NsSpec,
    netns: Option<std::os::fd::OwnedFd>,
    /// `$BROOD_ROOT/ns`, the scratch root's mount point, made when needed.
    scratch_dir: Option<PathBuf>,
}

/// What a launch does off the dispatcher, with everything it needs owned.
struct Prep {
    /// The model gateway's port, which its sandbox lets it reach (issue 31).
    gateway_port: Option<u16>,
    argv: Vec<String>,
    cwd: Option<PathBuf>,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    stdin_prelude: Vec<u8>,
    group: Option<GroupPlan>,
    limits: brood_launch::cgroup::Limits,
    limited: bool,
    policy: Policy,
    policy_file: PathBuf,
    artifacts: Option<PathBuf>,
    handoff: Option<(PathBuf, String)>,
    /// `PATH` to find the program in.
    program_path: String,
    brood_exe: Option<PathBuf>,
    root: bool,
    allow_weaker: bool,
    objects: PathBuf,
    own_object: PathBuf,
    view: Option<ViewPlan>,
    ns: Option<NsPlan>,
    veil: Option<(crate::veil::Veil, crate::veil::VeilCache)>,
    containment: Value,
    limits_missing: bool,
    door: Option<std::os::fd::OwnedFd>,
    file_size_max: u64,
}

/// What a launch made that the dispatcher keeps: its group (to stop and
/// remove), its sandbox (to collect its result as it), what was enforced.
#[derive(Default)]
pub(crate) struct Made {
    group: Option<Group>,
    sandbox: Option<super::collect::KeptSandbox>,
    launch_meta: Value,
}

impl Prep {
    /// The group and its limits, the files, the sandbox and the namespace;
    /// the spawn's spec, or why not (what was made is returned either way,
    /// so the dispatcher removes a group that was made for nothing).
    fn run(self) -> (Result<LaunchSpec, String>, Box<Made>) {
        let mut made = Box::<Made>::default();
        let spec = self.prepare(&mut made);
        (spec, made)
    }

    fn prepare(self, made: &mut Made) -> Result<LaunchSpec, String> {
        let veil = match &self.veil {
            Some((v, cache)) => Some(cache.get(v)?),
            None => None,
        };
        let (procs, extra_procs) = match &self.group {
            Some(plan) => {
                let cg = &plan.cgroups;
                if let Some(t) = &plan.tenant {
                    let _ = cg.create(t);
                }
                let g = cg
                    .create(&plan.rel)
                    .map_err(|e| format!("creating its cgroup: {e}"))?;
                made.group = Some(g.clone());
                let f = cg
                    .procs_file(&g)
                    .map_err(|e| format!("creating its cgroup: {e}"))?;
                let extra = if self.limited {
                    cg.set_limits(&g, &self.limits)
                        .map_err(|e| format!("resources: {e}"))?
                        .procs_files
                } else {
                    Vec::new()
                };
                (Some(f), extra)
            }
            None => (None, Vec::new()),
        };
        let policy_text = crate::objects::policy_text(&self.policy);
        crate::projection::write_atomic(
            &self.policy_file,
            policy_text.as_bytes(),
            0,
            crate::projection::ctx_owner(),
        )
        .map_err(|e| format!("writing its policy file: {e}"))?;
        let program = crate::enforce::resolve(
            self.argv.first().map(String::as_str).unwrap_or(""),
            &self.program_path,
        );
        // The channel's artifact/ must exist before its landlock rule is made.
        if let Some(dir) = &self.artifacts {
            crate::projection::make_dir(dir, self.policy.uid)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        if let Some((handoff, text)) = &self.handoff
            && std::fs::symlink_metadata(handoff).is_err()
        {
            crate::projection::write_atomic(
                handoff,
                text.as_bytes(),
                1,
                crate::projection::ctx_owner(),
            )
            .map_err(|e| format!("writing {}: {e}", handoff.display()))?;
        }
        let sandbox_spec = crate::enforce::sandbox(
            &self.policy,
            &crate::enforce::Context {
                program: &program,
                brood: self.brood_exe.as_deref(),
                policy_file: &self.policy_file,
                root: self.root,
                allow_weaker: self.allow_weaker,
                objects: Some(&self.objects),
                own_object: Some(&self.own_object),
                artifacts: self.artifacts.as_deref(),
                gateway_port: self.gateway_port,
            },
        );
        let mut sandbox_spec = sandbox_spec;
        // The veil's own /proc is what the agent sees (brood_launch::veil).
        sandbox_spec.proc_root = veil
            .as_ref()
            .and_then(|v| v.proc_root())
            .map(brood_launch::sandbox::ProcRoot);
        let view = match &self.view {
            Some(plan) if plan.reached_by(&sandbox_spec) => Some(self.view_of(plan)?),
            _ => None,
        };
        let sandbox =
            brood_launch::sandbox::prepare(&sandbox_spec).map_err(|e| format!("sandbox: {e}"))?;
        made.sandbox = Some(super::collect::KeptSandbox::new(sandbox_spec));
        let ns = match self.ns {
            Some(plan) => {
                if let Some(dir) = &plan.scratch_dir {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("iso=ns: creating {}: {e}", dir.display()))?;
                }
                Some(
                    brood_launch::ns::prepare_with(&plan.spec, plan.netns)
                        .map_err(|e| format!("iso=ns: {e}"))?,
                )
            }
            None => None,
        };
        let enforced = sandbox.enforced();
        // Recorded with the run's `agent.start` event (meta.json is written from
        // it once the start is recorded, so a rebuild writes the same file).
        made.launch_meta = json!({
            "containment": self.containment,
            "sandbox": {
            "landlock_abi": enforced.landlock_abi,
            "files": enforced.fs,
            "network": enforced.net,
            "scoped": enforced.scoped,
            "capabilities_dropped": enforced.caps_dropped,
            "no_new_privs": enforced.no_new_privs,
            "sockets": enforced.sockets.describe(),
            "weaker": enforced.weaker,
            "allow_weaker_sandbox": self.allow_weaker,
            "veil": veil.as_ref().map(|v| v.describe()),
            "ctx_view": view.is_some(),
            "limits_not_enforced": self.limits_missing,
            },
        });
        Ok(LaunchSpec {
            argv: self.argv.iter().map(Into::into).collect(),
            env: self.env,
            // Inside a private mount namespace the cwd is applied there instead.
            cwd: if ns.is_some() { None } else { self.cwd },
            cgroup_procs: procs,
            sandbox: Some(sandbox),
            extra_procs,
            ns,
            veil,
            view,
            stdin_prelude: self.stdin_prelude,
            door: self.door,
            file_size_max: Some(self.file_size_max),
        })
    }
}

/// A door's two ends: a `SOCK_SEQPACKET` pair, so that each client's message
/// (a tag and a descriptor) arrives whole even when several processes of the
/// agent use the door at once.
fn door_pair() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(Into::into)
}

/// Where an agent's own view of the ctx tree comes from (`brood_launch::veil::view`).
struct ViewPlan {
    ctx: PathBuf,
    /// `ctx/home/<uid>/agent/<name>`: its sessions and the channels to its
    /// children, made now if the projection has not yet (what the
    /// projection writes in it later is seen through the bind).
    own_home: PathBuf,
}

impl ViewPlan {
    /// Whether a grant of the sandbox reaches the ctx tree beyond what the
    /// agent may see there anyway: a rule at or above `ctx`, or one inside it
    /// on another agent's part.
    fn reached_by(&self, spec: &brood_launch::sandbox::SandboxSpec) -> bool {
        spec.fs.iter().map(|(p, _)| p).chain(&spec.exec).any(|p| {
            self.ctx.starts_with(p)
                || (p.starts_with(&self.ctx)
                    && !p.starts_with(&self.own_home)
                    && !p.starts_with(self.ctx.join("agent")))
        })
    }
}

impl Prep {
    /// The view of `plan`: its object and sessions read-only, its parent's
    /// channel to it read-only with the channel's `artifact/` writable.
    fn view_of(&self, plan: &ViewPlan) -> Result<brood_launch::veil::PreparedView, String> {
        // One directory, not its session's whole path: on a busy ext4 each
        // directory made costs a search for a free inode, on the launch's
        // critical path (measured: `bench spawn` with its root in /tmp).
        crate::projection::make_dirs(&plan.own_home, crate::projection::ctx_owner())
            .map_err(|e| format!("creating its directory in the ctx tree: {e}"))?;
        let mut keep = vec![
            (self.own_object.clone(), false),
            (plan.own_home.clone(), false),
        ];
        if let Some(dir) = &self.artifacts {
            if let Some(channel) = dir.parent() {
                keep.push((channel.to_path_buf(), false));
            }
            keep.push((dir.clone(), true));
        }
        brood_launch::veil::prepare_view(&brood_launch::veil::ViewSpec {
            ctx: plan.ctx.clone(),
            keep,
        })
        .map_err(|e| format!("its view of the ctx tree: {e}"))
    }
}

/// A launched process whose start is to be recorded (`launch_begins`).
pub(super) struct Starting {
    name: AgentName,
    run: RunId,
    launched: Launched,
    cgroup_path: String,
    start_payload: Value,
    start_events: Vec<NewEvent>,
}

impl Starting {
    /// The start's record as one item of the store's `start_runs`: starts
    /// that arrive together are recorded together (`batch`).
    /// `me`: this supervisor, which the record must still name (a node
    /// declared lost may hold a queued agent placed again elsewhere).
    pub(super) fn item(&self, me: &str) -> StartItem {
        StartItem {
            name: self.name.clone(),
            run: self.run.clone(),
            pid: self.launched.pid,
            cgroup: self.cgroup_path.clone(),
            now_ms: now_ms(),
            events: self.start_events.clone(),
            supervisor: Some(me.to_owned()),
        }
    }

    /// The start's record: the run, its pid and group, `agent.start`.
    pub(super) fn record(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        me: &str,
    ) -> Result<Agent, StoreError> {
        store.start_one(tenant, &self.item(me))
    }
}
