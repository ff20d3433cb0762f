//! A launch worked out on the loop: what needs the loop's state (the
//! group's path, the init frame, the limits, the files' paths and bytes, the
//! environment, the veil's namespace, a pooled network namespace, the door
//! and the model gateway's endpoint), then handed to the spawner's thread
//! with the file work (`prep`).

use std::path::PathBuf;
use std::sync::Arc;

use brood_core::{AgentName, RunId};
use brood_launch::LaunchError;
use brood_launch::cgroup::{Group, GroupPath};
use brood_launch::env::Identity;
use tokio::sync::mpsc;

use super::Env;
use super::prep::{GroupPlan, Made, NsPlan, Prep, ViewPlan, door_pair};
use super::pump::LaunchReads;
use crate::supervisor::launcher::Launcher;
use crate::supervisor::models::{self, grants_models, strip_keys};
use crate::supervisor::{Cmd, deadline_unix_s, handle_of, now_ms, task_of};

/// How many empty network namespaces the pool keeps ready: enough for a burst
/// of two starts, few enough that an idle supervisor holds little.
const NETNS_POOL_DEPTH: usize = 2;

impl Launcher {
    /// Starts an agent that holds a slot. What needs the loop's state is
    /// worked out here (the group's path, the init frame, the limits, the
    /// files' paths and bytes, the environment, the veil's namespace, a pooled
    /// network namespace); the file work (the cgroup and its limits, the
    /// policy file, the channel's `artifact/` and handoff, the sandbox and
    /// namespace preparation) runs on a blocking thread with the spawn, and
    /// everything comes back as one `Cmd::Launched`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch(
        &mut self,
        name: &AgentName,
        run: &RunId,
        argv: &[String],
        cwd: Option<&str>,
        group_parent: Option<Group>,
        read: LaunchReads,
        env: &mut Env<'_>,
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
            env.records
                .store
                .runs(&env.records.tenant, name)
                .map(|r| r.len().max(1))
                .unwrap_or(1)
        };
        let component = format!("r{seq}.{name}");
        let group = match &self.cgroups {
            Some(cg) => {
                let rel = match &group_parent {
                    Some(g) => g.rel.child(&component),
                    None => GroupPath::new(&[env.records.tenant.as_str(), &component]),
                };
                match rel {
                    Ok(rel) => Some(GroupPlan {
                        cgroups: cg.clone(),
                        rel,
                        // The tenant's directory is shared by its roots.
                        tenant: group_parent
                            .is_none()
                            .then(|| GroupPath::new(&[env.records.tenant.as_str()]).ok())
                            .flatten(),
                    }),
                    Err(e) => return fail(&env.host.tx, format!("creating its cgroup: {e}")),
                }
            }
            None => None,
        };
        let parent_limited = env
            .agents
            .live
            .get(name)
            .and_then(|l| l.parent.as_ref())
            .and_then(|p| env.agents.live.get(p))
            .is_some_and(|p| p.limited);
        let LaunchReads { agent: a, init, .. } = read;
        // The veiled namespace every agent joins, got (and made again when
        // what it hides changed) on the spawner's thread (crate::veil).
        let veil = self
            .veil
            .as_ref()
            .map(|v| (v.clone(), self.veil_ns.clone()));
        let iso_ns = env.agents.live.get(name).is_some_and(|l| l.iso_ns);
        let channel = env
            .agents
            .live
            .get(name)
            .and_then(|l| l.channel_dir(&env.host.paths, name));
        let artifacts = channel.as_ref().map(|d| d.join("artifact"));
        // iso = ns: a private mount namespace from the policy's mount table, in a
        // root directory brood owns; the cwd is applied inside it. A named
        // root must exist. Without one, the root is a scratch tmpfs the child
        // mounts on `$BROOD_ROOT/ns` inside its own namespace (one directory
        // for every agent: each sees only its own tmpfs).
        let ns = match env.agents.live.get(name) {
            Some(l) if iso_ns => {
                let (ns_root, scratch) = match &l.ns_root {
                    Some(r) => (r.clone(), false),
                    None => (env.host.paths.root.join("ns"), true),
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
                    if self.netns_pool.is_none() {
                        match brood_launch::ns::NetnsPool::start(NETNS_POOL_DEPTH) {
                            Ok(p) => self.netns_pool = Some(p),
                            Err(e) => {
                                tracing::warn!(error = %e, "could not start the network namespace pool")
                            }
                        }
                    }
                    // The model gateway is bound inside it before the
                    // child starts (issue 31): one is made now when the
                    // pool has none ready.
                    let gateway = env.host.cfg.gateway.is_some() && grants_models(&l.policy);
                    self.netns_pool.as_ref().and_then(|p| p.take()).or_else(|| {
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
        let door = match &env.host.cfg.doors {
            Some(host) => match door_pair() {
                Ok((ours, theirs)) => {
                    door_listener = Some(host(
                        handle_of(env.host, env.records),
                        name.clone(),
                        run.clone(),
                        ours,
                    ));
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
        let gateway = open_gateway(env, name, run, netns);
        let providers = env.host.cfg.gateway.as_ref().map(|g| g.providers.clone());
        let Some(l) = env.agents.live.get_mut(name) else {
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
        let limits_missing = own_limits && self.cgroups.is_none();
        if limits_missing && !env.host.cfg.allow_weaker_sandbox {
            return fail(
                &env.host.tx,
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
                &env.host.tx,
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
            strip_keys(p, name, &mut policy_env);
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
            tenant: env.records.tenant.to_string(),
            socket: env.host.cfg.socket.to_string_lossy().into_owned(),
            policy: env
                .host
                .paths
                .policy_file(name)
                .to_string_lossy()
                .into_owned(),
            ctx_root: env.host.paths.ctx().to_string_lossy().into_owned(),
            ctx_home: env.host.paths.home().to_string_lossy().into_owned(),
            artifacts: artifacts.as_ref().map(|d| d.to_string_lossy().into_owned()),
            door: door.as_ref().map(|_| brood_launch::spawn::DOOR_FD),
        };
        let prep = Prep {
            argv: argv.to_vec(),
            cwd: cwd.map(PathBuf::from),
            env: brood_launch::env::build(&id, &env.host.base, &policy_env),
            stdin_prelude: init.clone().unwrap_or_default(),
            group,
            limits,
            limited: l.limited,
            policy: l.policy.clone(),
            policy_file: env.host.paths.policy_file(name),
            artifacts,
            handoff,
            // The PATH the launcher looks the program up in (the agent's
            // own), so the sandbox grants exec on the file that runs.
            program_path: l
                .policy
                .env
                .get("PATH")
                .cloned()
                .unwrap_or_else(|| env.host.base.path.clone()),
            brood_exe: env.host.brood_exe.clone(),
            root: env.host.uid == 0,
            allow_weaker: env.host.cfg.allow_weaker_sandbox,
            objects: env.host.paths.ctx().join("agent"),
            own_object: env.host.paths.agent_dir(name),
            // Its own view of the ctx tree, when its grants would reach
            // other agents' parts of it (decided once the sandbox is
            // lowered); agents of `iso = ns` build their whole tree anew.
            view: (self.veil.is_some() && !iso_ns).then(|| ViewPlan {
                ctx: env.host.paths.ctx(),
                own_home: env.host.paths.home().join("agent").join(name.as_str()),
            }),
            ns,
            veil,
            containment: env.host.meta["containment"].clone(),
            limits_missing,
            door,
            file_size_max: crate::enforce::file_size_max(
                &l.policy,
                env.host.cfg.resource_defaults.disk_max,
            ),
            gateway_port,
        };
        l.init = init;
        let tx = env.host.tx.clone();
        let spawner = self.spawner.clone();
        let hook = env.host.cfg.hooks.before_launch.clone();
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
}

/// Opens the run's endpoint when its policy grants models and the operator
/// configured a provider (`models::open_gateway`).
fn open_gateway(
    env: &mut Env<'_>,
    name: &AgentName,
    run: &RunId,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Option<(Vec<(String, String)>, u16)> {
    let gw = env.host.cfg.gateway.clone()?;
    // The handle is made only for a run that may call (most do not).
    if !grants_models(&env.agents.live.get(name)?.policy) {
        return None;
    }
    let sup = handle_of(env.host, env.records);
    let l = env.agents.live.get_mut(name)?;
    models::open_gateway(&gw, sup, l, name, run, netns)
}
