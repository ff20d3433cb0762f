//! From an agent's effective policy to what the kernel enforces (SPEC 5):
//! the landlock sandbox (files, exec, TCP), `no_new_privs` and the capability
//! drop, and the cgroup limits. The launcher applies the result between fork and
//! exec; this module only decides.

use std::path::{Path, PathBuf};

use brood_core::policy::{Mode, Network, Policy};
use brood_launch::cgroup::Limits;
use brood_launch::ns::{MountSpec, NsSpec};
use brood_launch::sandbox::{FsAccess, SandboxSpec, Sockets};

use crate::lower::{self, Access};

/// Tools that let an agent run programs other than its own (SPEC 5: "without
/// `shell` or `code_exec` the agent may execute only its own program").
const EXEC_TOOLS: [&str; 2] = ["shell", "code_exec"];

/// What the sandbox of one agent needs beyond its policy.
pub struct Context<'a> {
    /// The agent's program, resolved to a path.
    pub program: &'a Path,
    /// The `brood` binary, so programs inside a tree can call `brood spawn`.
    pub brood: Option<&'a Path>,
    /// The agent's own policy file (`BROOD_POLICY`), readable by it.
    pub policy_file: &'a Path,
    /// Started by root: drop every capability.
    pub root: bool,
    /// The operator allowed running with layers the host lacks.
    pub allow_weaker: bool,
    /// `ctx/agent/`: the agent objects, which no agent may write (SPEC 3).
    pub objects: Option<&'a Path>,
    /// `ctx/agent/<name>.d/`: its own object, which it may always read.
    pub own_object: Option<&'a Path>,
    /// The `artifact/` directory of its parent's channel to it: writable
    /// whatever the policy says of the parent's tree (SPEC 4).
    pub artifacts: Option<&'a Path>,
    /// The port of its model gateway (issue 31), which it may connect to
    /// whatever its `network` says.
    pub gateway_port: Option<u16>,
}

pub fn sandbox(policy: &Policy, cx: &Context<'_>) -> SandboxSpec {
    let access = |m: Mode| match m {
        Mode::Hidden => Access::Hidden,
        Mode::Ro => Access::Ro,
        Mode::Rw => Access::Rw,
    };
    let mut rules: Vec<(PathBuf, Access)> = policy
        .files
        .iter()
        .map(|r| (PathBuf::from(r.path.as_str()), access(r.mode)))
        .collect();
    // SPEC 3: a program inside a sandbox sees its own object read-only and can
    // write no control file. Rules the policy gives at or inside the agent
    // objects are capped at `ro`, and its own object is readable whatever the
    // policy says. A `rw` inherited from an ancestor (the operator's `/ rw`) is
    // not carved out here: landlock only adds grants, so carving would deny
    // creating files anywhere along the path (`/tmp` included) and cost a grant
    // per sibling on every spawn (measured +1 ms). That case is a known gap
    // (docs/decisions/ctx.md "Agents write nothing in the ctx tree").
    if let Some(objects) = cx.objects {
        for (p, a) in rules.iter_mut() {
            if p.starts_with(objects) && *a == Access::Rw {
                *a = Access::Ro;
            }
        }
    }
    if let Some(own) = cx.own_object
        && let Some(at) = own
            .to_str()
            .and_then(|s| brood_core::policy::AbsPath::new("ctx", s).ok())
            .map(|p| policy.mode_at(&p))
        && at == Mode::Hidden
    {
        rules.push((own.to_path_buf(), Access::Ro));
    }
    if let Some(dir) = cx.artifacts {
        rules.push((dir.to_path_buf(), Access::Rw));
    }
    let mut fs: Vec<(PathBuf, FsAccess)> = lower::grants(&rules)
        .into_iter()
        .filter_map(|(p, a)| match a {
            Access::Hidden => None,
            Access::Ro => Some((p, FsAccess::Ro)),
            Access::Rw => Some((p, FsAccess::Rw)),
        })
        .collect();
    fs.push((cx.policy_file.to_path_buf(), FsAccess::Ro));
    let may_exec_anything = match &policy.tools {
        None => true,
        Some(t) => EXEC_TOOLS.iter().any(|x| t.contains(*x)),
    };
    let mut exec: Vec<PathBuf> = if may_exec_anything {
        // Whatever it may read, it may run.
        fs.iter().map(|(p, _)| p.clone()).collect()
    } else {
        Vec::new()
    };
    exec.push(cx.program.to_path_buf());
    if let Some(b) = cx.brood {
        exec.push(b.to_path_buf());
    }
    // Sockets are granted by family, not hidden one by one (issue 24): only
    // `network: all` may make a UNIX, UDP, raw or netlink socket; a port list
    // grants TCP, whose ports landlock then checks.
    // The model gateway's port is added to what it may connect to. A
    // `network: none` agent is given one only in an empty network namespace
    // of its own (`supervisor::models`), where its TCP sockets reach
    // nothing but that loopback, and landlock that port alone.
    let (net_connect, net_bind, sockets) = match (&policy.network, cx.gateway_port) {
        (Network::All, _) => (None, None, Sockets::Any),
        (Network::None, None) => (Some(Vec::new()), Some(Vec::new()), Sockets::None),
        (Network::None, Some(port)) => (Some(vec![port]), Some(Vec::new()), Sockets::Tcp),
        (Network::Connect(ports), port) => (
            Some(ports.iter().copied().chain(port).collect()),
            Some(Vec::new()),
            Sockets::Tcp,
        ),
    };
    SandboxSpec {
        fs,
        exec,
        base_ro: true,
        net_connect,
        net_bind,
        scoped: true,
        no_new_privs: true,
        drop_caps: cx.root,
        allow_weaker: cx.allow_weaker,
        sockets,
        proc_root: None,
    }
}

/// The private mount namespace of `iso = ns` (SPEC 5): the policy's mount table
/// under `root` (a scratch tmpfs mounted there when `scratch`), an empty network namespace when the policy allows no network,
/// a fresh `/proc`, and the cwd applied inside.
/// A child's channel `artifact/` is mounted at its own path, last, so the
/// `BROOD_ARTIFACTS` it is told of exists inside too (SPEC 4).
pub fn namespace(
    policy: &Policy,
    root: PathBuf,
    scratch: bool,
    cwd: Option<&str>,
    artifacts: Option<&Path>,
) -> NsSpec {
    let mut mounts: Vec<MountSpec> = policy
        .mounts
        .iter()
        .map(|m| MountSpec {
            source: PathBuf::from(m.source.as_str()),
            target: PathBuf::from(m.target.as_str()),
            rw: m.rw,
            rbind: m.opts.rbind,
            nosuid: m.opts.nosuid,
            nodev: m.opts.nodev,
            noexec: m.opts.noexec,
        })
        .collect();
    if let Some(dir) = artifacts {
        mounts.push(MountSpec {
            source: dir.to_path_buf(),
            target: dir.to_path_buf(),
            rw: true,
            rbind: false,
            nosuid: true,
            nodev: true,
            noexec: true,
        });
    }
    NsSpec {
        mounts,
        root: Some(root),
        scratch,
        cwd: Some(PathBuf::from(cwd.unwrap_or("/"))),
        empty_network: matches!(policy.network, Network::None),
        proc: true,
    }
}

pub fn limits(policy: &Policy) -> Limits {
    Limits {
        memory_max: policy.resources.memory_max,
        pids_max: policy.resources.pids_max,
        cpu_weight: policy.resources.cpu_weight,
    }
}

/// The largest file the agent may write (`RLIMIT_FSIZE`): its policy's
/// `disk_max`, or `default` (the platform's) for a policy recorded before
/// admission filled one in. The kernel enforces it on every write of the
/// agent and of everything it starts, whatever the file; what it does not
/// bound (the total over many files) is docs/security.md's "Disk".
pub fn file_size_max(policy: &Policy, default: u64) -> u64 {
    policy.resources.disk_max.unwrap_or(default)
}

/// Finds a program in `path` as execvp would (the agent's own `PATH`).
pub fn resolve(program: &str, path: &str) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let cand = Path::new(dir).join(program);
        if cand.is_file() {
            return cand;
        }
    }
    PathBuf::from(program)
}
