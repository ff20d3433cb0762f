//! Kernel enforcement for one agent process (SPEC 5, "Enforcement is by the
//! kernel"): landlock for files, TCP ports and scopes, `no_new_privs`, and every
//! capability dropped, so that a misbehaving or prompt-injected agent cannot step
//! outside what its policy grants, whatever code it runs.
//!
//! The work is split by the rule that governs the child between clone and exec
//! (raw syscalls only, as in a `pre_exec` closure; signal-safety(7)):
//!
//! * [`prepare`] runs in the supervisor. It asks the kernel for its landlock ABI,
//!   decides which layers can be enforced (failing closed, see below), opens every
//!   path, builds the whole landlock ruleset with the `landlock` crate and keeps
//!   the ruleset's file descriptor (the crate hands it over through
//!   `From<RulesetCreated> for Option<OwnedFd>`), reads
//!   `/proc/sys/kernel/cap_last_cap` and checks what this process may drop. The
//!   result, [`Prepared`], is immutable and cheap to clone: one prepared sandbox
//!   may serve many launches of the same policy.
//! * The child, between clone and exec ([`crate::spawn`]), only makes raw syscalls
//!   on those prepared integers, in this order: `close_range(3, ~0,
//!   CLOSE_RANGE_CLOEXEC)`, so that no descriptor the supervisor inherited without
//!   close-on-exec (a shell's, a service manager's) reaches the agent (an open file
//!   is not checked again by landlock); `prctl(PR_CAPBSET_DROP)` for every
//!   capability up to `cap_last_cap`, `prctl(PR_CAP_AMBIENT_CLEAR_ALL)`,
//!   `capset(2)` with empty sets, `prctl(PR_SET_NO_NEW_PRIVS)`, then
//!   `landlock_restrict_self(2)` on the inherited ruleset fd. Emptying the bounding
//!   set needs `CAP_SETPCAP`, so it comes before `capset`; `landlock_restrict_self`
//!   needs `no_new_privs` once `CAP_SYS_ADMIN` is gone, so it comes last. The
//!   ruleset fd is close-on-exec (the kernel creates it so), so the agent never
//!   sees it.
//!
//! # What the modes mean
//!
//! * [`FsAccess::Ro`]: read files and list directories (`READ_FILE | READ_DIR`).
//! * [`FsAccess::Rw`]: every filesystem right of the kernel's ABI (write, create,
//!   remove, rename/link (`REFER`), truncate, device ioctls, and from ABI 9
//!   connecting to UNIX sockets by path).
//! * [`SandboxSpec::exec`]: `EXECUTE | READ_FILE` on those files (or beneath those
//!   directories): execve(2) opens the program for reading *and* execution, and
//!   landlock checks both.
//! * A path under no rule is hidden: every handled access is denied, which is
//!   every filesystem right of the ABI. `stat(2)` and following symlinks are not
//!   filesystem rights in landlock, so a hidden path's existence stays visible;
//!   its content does not, also through a symlink planted in an `rw` directory
//!   (landlock checks the file reached, not the name used).
//! * Connecting to a UNIX socket by path needs `RESOLVE_UNIX` from ABI 9 on, which
//!   only `Rw` grants: give the supervisor socket itself `Rw`. Below ABI 9 such
//!   connects are not controlled (LINUX-NOTES): the supervisor decides who calls
//!   from peer credentials and the caller's cgroup.
//!
//! # The base set ([`SandboxSpec::base_ro`])
//!
//! Fixed, so that a dynamically linked program can start and behave:
//!
//! * read ([`BASE_READ`]): the system libraries `/lib /lib64 /usr/lib /usr/lib64`
//!   (with the locale archive and gconv modules under `/usr/lib`), the loader's
//!   configuration `/etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d
//!   /etc/ld.so.preload`, `/dev/zero /dev/urandom /dev/random`, and all of `/proc`;
//! * read and write ([`BASE_READ_WRITE`]): `/dev/null`;
//! * read and execute ([`BASE_LOADERS`]): the dynamic loaders (ELF interpreters)
//!   of the usual architectures.
//!
//! Entries that do not exist on the host are left out. Libraries get no
//! `EXECUTE`: landlock checks it only at execve(2), for the program and its ELF
//! interpreter, never for `mmap(PROT_EXEC)` of a library, so read is enough, and
//! execute on `/usr/lib` would let an agent run any program kept there.
//!
//! `/proc` is read-only as a whole rather than `/proc/self`, a choice forced by
//! the kernel: landlock rules attach to inodes, `/proc/self` resolved in the
//! supervisor is the *supervisor's* directory, and a rule on the agent's own
//! `/proc/<pid>` added in the child stops working once the kernel evicts that
//! dentry (procfs makes a new inode at the next lookup; measured on this machine
//! with `vm.drop_caches`), and would not cover the agent's own children anyway.
//! Whole-`/proc` read shows what any unprivileged user sees there (the process
//! list, command lines); the sensitive files of other processes (`environ`, `mem`,
//! `fd/`) are guarded by ptrace access checks, which landlock narrows to the
//! agent's own domain.
//!
//! Not in the base set, so the runtime adds them when a policy needs them:
//! `/etc/passwd`, `/etc/nsswitch.conf`, `/etc/resolv.conf`, `/etc/hosts`, TLS
//! certificates, `/usr/share/zoneinfo`, `/usr/local/lib`, `/tmp`, `/dev/shm`, ttys.
//!
//! # Failing closed
//!
//! [`prepare`] uses the kernel's full ABI (every filesystem right the kernel and the
//! crate both know is handled) with the crate's `HardRequirement` compatibility
//! level, so no right is ever silently dropped. When a layer the spec needs is
//! missing (landlock itself, TCP rules before ABI 4, scopes before ABI 6, a
//! bounding set that cannot be emptied), it returns [`SandboxError::Layer`]
//! naming the layer, unless [`SandboxSpec::allow_weaker`] is set: then the start
//! goes on and [`Enforced::weaker`] says what is not enforced (for `meta.json` and
//! `brood show`).
//!
//! # Known limits
//!
//! * landlock TCP rules cover `connect(2)` and `bind(2)` of TCP sockets (v4 and
//!   v6) only; UDP and raw sockets are not controlled (an empty network namespace,
//!   `iso = ns`, is the layer for `network: none`). A `bind` to port 0 (an
//!   ephemeral port) needs port 0 in [`SandboxSpec::net_bind`].
//! * "Execute only its own program" holds for execve(2). Code in a file the agent
//!   can *read* can still be run through the dynamic loader
//!   (`ld-linux-x86-64.so.2 FILE`), which maps it without an execve; `noexec`
//!   mounts (`iso = ns`) close that for the writable directories.
//! * Rights that a kernel newer than the `landlock` crate adds are not handled
//!   (the crate knows ABI 1 to 9); [`Enforced::landlock_abi`] shows the kernel's.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

mod caps;
mod child;
mod rules;
mod sockets;
#[cfg(test)]
mod tests;
mod writes;

pub use crate::host::seccomp_available;
pub(crate) use caps::capset_empty_this_thread;
use caps::{CapPlan, plan_caps};
pub(crate) use child::{ChildPlan, ChildStep};
use rules::{build_ruleset, plan_layers};
use seccompiler::BpfProgram;
pub use sockets::Sockets;

/// Read files and list directories (`Ro`), or every filesystem right (`Rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsAccess {
    Ro,
    Rw,
}

/// What the kernel must enforce for one agent. Launcher-level on purpose: the
/// runtime lowers a brood-core policy into this.
///
/// [`Default`] is the strictest useful spec: nothing visible but the base set,
/// nothing executable, TCP unrestricted, scopes on, `no_new_privs`, capabilities
/// dropped, no weaker sandbox allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// landlock path-beneath rules; a path under no rule is hidden. Every path must
    /// be absolute and exist.
    pub fs: Vec<(PathBuf, FsAccess)>,
    /// Files (or directories, for everything beneath) that may be executed: the
    /// agent's own program, the `brood` binary, and what `shell`/`code_exec`
    /// widen it to. Each also becomes readable (execve needs both).
    pub exec: Vec<PathBuf>,
    /// Add the documented base set (see the module docs).
    pub base_ro: bool,
    /// `None`: TCP connect unrestricted; `Some(ports)`: connect only to these
    /// ports (empty: to none).
    pub net_connect: Option<Vec<u16>>,
    /// The same for bind.
    pub net_bind: Option<Vec<u16>>,
    /// landlock scopes (ABI 6): the agent may not signal processes outside its
    /// own domain (the supervisor, other agents) nor connect to abstract UNIX
    /// sockets created outside it. Its own children are inside it.
    pub scoped: bool,
    /// `prctl(PR_SET_NO_NEW_PRIVS)`: setuid bits and file capabilities grant
    /// nothing from here on. Required with `drop_caps` and landlock.
    pub no_new_privs: bool,
    /// Drop every capability: the bounding set, the ambient set, then effective,
    /// permitted and inheritable.
    pub drop_caps: bool,
    /// Start even when a layer the spec needs is missing on this host, recording
    /// it in [`Enforced::weaker`] (`--allow-weaker-sandbox`).
    pub allow_weaker: bool,
    /// Which sockets the agent may create (`sockets`, a seccomp filter).
    pub sockets: Sockets,
    /// The `/proc` the agent will see, when it is not the host's (the
    /// veil's, `crate::veil`): the base set's `/proc` rule is anchored there.
    pub proc_root: Option<ProcRoot>,
}

/// A directory descriptor of the `/proc` an agent sees (an `O_PATH` one).
#[derive(Debug, Clone)]
pub struct ProcRoot(pub Arc<OwnedFd>);

impl PartialEq for ProcRoot {
    fn eq(&self, other: &ProcRoot) -> bool {
        self.0.as_raw_fd() == other.0.as_raw_fd()
    }
}

impl Eq for ProcRoot {}

impl Default for SandboxSpec {
    fn default() -> Self {
        SandboxSpec {
            fs: Vec::new(),
            exec: Vec::new(),
            base_ro: true,
            net_connect: None,
            net_bind: None,
            scoped: true,
            no_new_privs: true,
            drop_caps: true,
            allow_weaker: false,
            sockets: Sockets::Any,
            proc_root: None,
        }
    }
}

/// What [`prepare`] could enforce, for `brood show` and `meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Enforced {
    /// The kernel's landlock ABI (0 when landlock is missing).
    pub landlock_abi: i32,
    /// Filesystem rules are enforced.
    pub fs: bool,
    /// TCP port rules are enforced (false also when the spec leaves TCP open).
    pub net: bool,
    /// Signal and abstract-socket scopes are enforced.
    pub scoped: bool,
    /// Capabilities are dropped (bounding set included).
    pub caps_dropped: bool,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// One line per layer the spec asked for that this host cannot enforce,
    /// naming the layer; non-empty only with [`SandboxSpec::allow_weaker`].
    pub weaker: Vec<String>,
    /// Which sockets the agent may create ([`Sockets::Any`] also when the
    /// filter is a missing layer the operator allowed).
    pub sockets: Sockets,
    /// The calls that take disk unseen (`fallocate`, clearing the child
    /// subreaper) are refused (`writes`, a seccomp filter).
    pub disk_calls_refused: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A layer the spec needs is missing on this host.
    #[error("sandbox layer {layer} cannot be enforced: {reason}")]
    Layer { layer: &'static str, reason: String },
    /// A path of the spec (or a host file the sandbox needs) could not be used.
    #[error("sandbox path {}: {source}", .path.display())]
    Path {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// landlock refused the rule for a path.
    #[error("landlock refused the rule for {}: {reason}", .path.display())]
    Rule { path: PathBuf, reason: String },
    /// landlock refused the rule for a TCP port.
    #[error("landlock refused the TCP rule for port {port}: {reason}")]
    Port { port: u16, reason: String },
    /// The spec contradicts itself.
    #[error("sandbox spec: {0}")]
    Invalid(String),
}

/// Read (files and listing), when `base_ro` is set; missing entries are skipped.
pub const BASE_READ: &[&str] = &[
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.preload",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
    "/proc",
];

/// Read and write (of the file's content only), when `base_ro` is set.
pub const BASE_READ_WRITE: &[&str] = &["/dev/null"];

/// Read and execute, when `base_ro` is set: the ELF interpreters of glibc on
/// x86-64, aarch64, armhf, i386, s390x, ppc64le, riscv64 and x32, and of musl on
/// x86-64 and aarch64. Missing entries are skipped.
pub const BASE_LOADERS: &[&str] = &[
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-armhf.so.3",
    "/lib/ld-linux.so.2",
    "/lib/ld64.so.1",
    "/lib64/ld64.so.2",
    "/lib/ld-linux-riscv64-lp64d.so.1",
    "/libx32/ld-linux-x32.so.2",
    "/lib/ld-musl-x86_64.so.1",
    "/lib/ld-musl-aarch64.so.1",
];

/// A sandbox ready to be applied to any number of launches: the landlock ruleset
/// (owned fd), the capability plan and what is enforced. Cloning shares them.
#[derive(Debug, Clone)]
pub struct Prepared {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The landlock ruleset; `None` only when landlock is missing and allowed to be.
    ruleset: Option<OwnedFd>,
    caps: Option<CapPlan>,
    no_new_privs: bool,
    /// The socket filter's instructions, read by the child (`ChildPlan`).
    sockets: Option<Arc<BpfProgram>>,
    /// The disk-call filter's (`writes`), likewise.
    writes: Option<Arc<BpfProgram>>,
    enforced: Enforced,
}

impl Prepared {
    /// What the kernel will enforce for launches with this sandbox.
    pub fn enforced(&self) -> &Enforced {
        &self.inner.enforced
    }

    /// The ruleset's fd (while `self` lives) and whether capabilities are
    /// dropped: what [`crate::confine`] applies to one thread.
    pub(crate) fn thread_parts(&self) -> (Option<RawFd>, bool) {
        (
            self.inner.ruleset.as_ref().map(|f| f.as_raw_fd()),
            self.inner.caps.is_some(),
        )
    }

    /// The plain values the child needs; valid while `self` lives.
    pub(crate) fn child_plan(&self, report_fd: RawFd) -> ChildPlan {
        let caps = self.inner.caps;
        ChildPlan {
            ruleset_fd: self.inner.ruleset.as_ref().map_or(-1, |f| f.as_raw_fd()),
            drop_caps: caps.is_some(),
            drop_bset: caps.is_some_and(|c| c.drop_bset),
            last_cap: caps.map_or(0, |c| c.last_cap as libc::c_int),
            no_new_privs: self.inner.no_new_privs,
            filter: instructions(self.inner.sockets.as_deref()),
            writes_filter: instructions(self.inner.writes.as_deref()),
            report_fd,
        }
    }
}

/// Builds everything the child needs to sandbox itself; see the module docs.
/// Fails closed (naming the layer, path or port) unless `spec.allow_weaker`.
pub fn prepare(spec: &SandboxSpec) -> Result<Prepared, SandboxError> {
    for path in spec.fs.iter().map(|(p, _)| p).chain(spec.exec.iter()) {
        if !path.is_absolute() {
            return Err(SandboxError::Path {
                path: path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"),
            });
        }
    }
    let kernel = crate::host::landlock_abi().map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    let layers = plan_layers(kernel, spec)?;
    if layers.fs && spec.drop_caps && !spec.no_new_privs {
        // landlock_restrict_self(2): without no_new_privs the caller needs
        // CAP_SYS_ADMIN, which drop_caps has just removed.
        return Err(SandboxError::Invalid(
            "landlock with drop_caps needs no_new_privs".into(),
        ));
    }
    let mut weaker = layers.weaker.clone();
    let ruleset = if layers.fs {
        Some(build_ruleset(spec, &layers)?)
    } else {
        None
    };
    let caps = if spec.drop_caps {
        plan_caps(spec, &mut weaker)?
    } else {
        None
    };
    let (sockets, socket_filter) = plan_sockets(spec, &mut weaker)?;
    let writes_filter = plan_writes(spec, &mut weaker)?;
    let caps_weaker = weaker.iter().any(|w| w.starts_with("capabilities"));
    let enforced = Enforced {
        landlock_abi: layers.abi,
        fs: layers.fs,
        net: !layers.net.is_empty(),
        scoped: layers.scoped,
        caps_dropped: caps.is_some() && !caps_weaker,
        no_new_privs: spec.no_new_privs,
        weaker,
        sockets,
        disk_calls_refused: writes_filter.is_some(),
    };
    Ok(Prepared {
        inner: Arc::new(Inner {
            ruleset,
            caps,
            no_new_privs: spec.no_new_privs,
            sockets: socket_filter,
            writes: writes_filter,
            enforced,
        }),
    })
}

/// The socket filter of `spec`: what is enforced and the program, failing
/// closed when the kernel has no seccomp filters (unless allowed weaker).
fn plan_sockets(
    spec: &SandboxSpec,
    weaker: &mut Vec<String>,
) -> Result<(Sockets, Option<Arc<BpfProgram>>), SandboxError> {
    if spec.sockets == Sockets::Any {
        return Ok((Sockets::Any, None));
    }
    if !spec.no_new_privs {
        // seccomp(2): without no_new_privs installing a filter needs
        // CAP_SYS_ADMIN, which an agent no longer has.
        return Err(SandboxError::Invalid(
            "a socket filter needs no_new_privs".into(),
        ));
    }
    if let Err(reason) = seccomp_available() {
        if spec.allow_weaker {
            weaker.push(format!("seccomp: {reason}"));
            return Ok((Sockets::Any, None));
        }
        return Err(SandboxError::Layer {
            layer: "seccomp",
            reason,
        });
    }
    Ok((spec.sockets, sockets::program(spec.sockets)?))
}

/// The disk-call filter (`writes`), for every agent that sets
/// `no_new_privs` (without it, installing a filter needs a privilege the
/// agent no longer has), failing closed like the socket filter.
fn plan_writes(
    spec: &SandboxSpec,
    weaker: &mut Vec<String>,
) -> Result<Option<Arc<BpfProgram>>, SandboxError> {
    if !spec.no_new_privs {
        return Ok(None);
    }
    if let Err(reason) = seccomp_available() {
        if spec.allow_weaker {
            weaker.push(format!("seccomp (disk calls): {reason}"));
            return Ok(None);
        }
        return Err(SandboxError::Layer {
            layer: "seccomp",
            reason,
        });
    }
    Ok(Some(writes::program()?))
}

/// A program's instructions and their count for the child, or a null
/// pointer for none.
fn instructions(p: Option<&BpfProgram>) -> (*const libc::sock_filter, usize) {
    p.map_or((std::ptr::null(), 0), |p| (p.as_ptr().cast(), p.len()))
}
