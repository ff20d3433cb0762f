//! What a launch does on the spawner's thread, right before the spawn,
//! with everything it needs owned ([`Prep`], worked out on the loop by
//! `plan`): the cgroup and its limits, the policy file, the channel's
//! `artifact/` and handoff, the sandbox, the namespaces and the veil; and
//! what it made that the loop keeps ([`Made`]).

use std::path::PathBuf;
use std::sync::Arc;

use brood_core::policy::Policy;
use brood_launch::LaunchSpec;
use brood_launch::cgroup::{Cgroups, Group, GroupPath};
use serde_json::{Value, json};

/// Where an agent's group goes: made off the dispatcher with its limits.
pub(super) struct GroupPlan {
    pub(super) cgroups: Arc<Cgroups>,
    pub(super) rel: GroupPath,
    /// The tenant's directory, made first for a root (shared by its roots).
    pub(super) tenant: Option<GroupPath>,
}

/// The private namespace of `iso = ns`, prepared off the dispatcher.
pub(super) struct NsPlan {
    pub(super) spec: brood_launch::ns::NsSpec,
    pub(super) netns: Option<std::os::fd::OwnedFd>,
    /// `$BROOD_ROOT/ns`, the scratch root's mount point, made when needed.
    pub(super) scratch_dir: Option<PathBuf>,
}

/// What a launch does off the dispatcher, with everything it needs owned.
pub(super) struct Prep {
    /// The model gateway's port, which its sandbox lets it reach (issue 31).
    pub(super) gateway_port: Option<u16>,
    pub(super) argv: Vec<String>,
    pub(super) cwd: Option<PathBuf>,
    pub(super) env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub(super) stdin_prelude: Vec<u8>,
    pub(super) group: Option<GroupPlan>,
    pub(super) limits: brood_launch::cgroup::Limits,
    pub(super) limited: bool,
    pub(super) policy: Policy,
    pub(super) policy_file: PathBuf,
    pub(super) artifacts: Option<PathBuf>,
    pub(super) handoff: Option<(PathBuf, String)>,
    /// `PATH` to find the program in.
    pub(super) program_path: String,
    pub(super) brood_exe: Option<PathBuf>,
    pub(super) root: bool,
    pub(super) allow_weaker: bool,
    pub(super) objects: PathBuf,
    pub(super) own_object: PathBuf,
    pub(super) view: Option<ViewPlan>,
    pub(super) ns: Option<NsPlan>,
    pub(super) veil: Option<(crate::veil::Veil, crate::veil::VeilCache)>,
    pub(super) containment: Value,
    pub(super) limits_missing: bool,
    pub(super) door: Option<std::os::fd::OwnedFd>,
    pub(super) file_size_max: u64,
}

/// What a launch made that the dispatcher keeps: its group (to stop and
/// remove), its sandbox (to collect its result as it), what was enforced.
#[derive(Default)]
pub(crate) struct Made {
    pub(super) group: Option<Group>,
    pub(super) sandbox: Option<crate::supervisor::collect::KeptSandbox>,
    pub(super) launch_meta: Value,
}

impl Prep {
    /// The group and its limits, the files, the sandbox and the namespace;
    /// the spawn's spec, or why not (what was made is returned either way,
    /// so the dispatcher removes a group that was made for nothing).
    pub(super) fn run(self) -> (Result<LaunchSpec, String>, Box<Made>) {
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
        made.sandbox = Some(crate::supervisor::collect::KeptSandbox::new(sandbox_spec));
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
pub(super) fn door_pair() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(Into::into)
}

/// Where an agent's own view of the ctx tree comes from (`brood_launch::veil::view`).
pub(super) struct ViewPlan {
    pub(super) ctx: PathBuf,
    /// `ctx/home/<uid>/agent/<name>`: its sessions and the channels to its
    /// children, made now if the projection has not yet (what the
    /// projection writes in it later is seen through the bind).
    pub(super) own_home: PathBuf,
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
