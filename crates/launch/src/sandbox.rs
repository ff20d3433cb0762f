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

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
};

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
}

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

/// Where the kernel says how many capabilities it knows (capabilities(7)).
const CAP_LAST_CAP: &str = "/proc/sys/kernel/cap_last_cap";
/// `CAP_SETPCAP`, needed to empty the bounding set (capabilities(7)).
const CAP_SETPCAP: u32 = 8;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit words (capget(2)).
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (capget(2)).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (capget(2)); version 3 uses two of them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capset(2) with empty effective, permitted and inheritable sets for the
/// calling thread only: capabilities belong to a thread in Linux, and the raw
/// syscall (unlike a libc wrapper that broadcasts) changes no other.
pub(crate) fn capset_empty_this_thread() -> io::Result<()> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset(2) with pointers to a header and two data structs on the stack.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

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
    enforced: Enforced,
}

/// How to drop capabilities in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CapPlan {
    /// The highest capability number the kernel knows.
    last_cap: u32,
    /// Whether to empty the bounding set (needs `CAP_SETPCAP`; skipped when it is
    /// already empty, or for a non-root supervisor under `no_new_privs`).
    drop_bset: bool,
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
            report_fd,
        }
    }
}

/// Which layers this host can enforce for a spec, before any fd is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layers {
    abi: i32,
    fs: bool,
    net: BitFlags<AccessNet>,
    scoped: bool,
    weaker: Vec<String>,
}

/// Decides the landlock layers from the kernel's answer (`Ok(abi)` or why there
/// is none), failing closed unless `allow_weaker`. Pure, so every branch is
/// tested without the matching kernel.
fn plan_layers(kernel: Result<i32, String>, spec: &SandboxSpec) -> Result<Layers, SandboxError> {
    let mut weaker = Vec::new();
    let mut missing = |layer: &'static str, reason: String| {
        if spec.allow_weaker {
            weaker.push(format!("{layer}: {reason}"));
            Ok(())
        } else {
            Err(SandboxError::Layer { layer, reason })
        }
    };
    let mut wanted_net = BitFlags::<AccessNet>::EMPTY;
    if spec.net_connect.is_some() {
        wanted_net |= AccessNet::ConnectTcp;
    }
    if spec.net_bind.is_some() {
        wanted_net |= AccessNet::BindTcp;
    }
    let abi = match kernel {
        Ok(abi) if abi >= 1 => abi,
        Ok(abi) => {
            missing(
                "landlock",
                format!("the kernel reports landlock ABI {abi}; files cannot be confined"),
            )?;
            0
        }
        Err(why) => {
            missing(
                "landlock",
                format!("the kernel has no landlock ({why}); files cannot be confined"),
            )?;
            0
        }
    };
    if abi == 0 {
        if !wanted_net.is_empty() {
            missing("landlock-net", "TCP port rules need landlock".into())?;
        }
        if spec.scoped {
            missing(
                "landlock-scope",
                "signal and abstract-socket scopes need landlock".into(),
            )?;
        }
        return Ok(Layers {
            abi,
            fs: false,
            net: BitFlags::EMPTY,
            scoped: false,
            weaker,
        });
    }
    let mut net = wanted_net;
    if !wanted_net.is_empty() && abi < 4 {
        missing(
            "landlock-net",
            format!("TCP port rules need landlock ABI 4 (Linux 6.7), this kernel has ABI {abi}"),
        )?;
        net = BitFlags::EMPTY;
    }
    let mut scoped = spec.scoped;
    if spec.scoped && abi < 6 {
        missing(
            "landlock-scope",
            format!(
                "signal and abstract-socket scopes need landlock ABI 6 (Linux 6.12), this kernel has ABI {abi}"
            ),
        )?;
        scoped = false;
    }
    Ok(Layers {
        abi,
        fs: true,
        net,
        scoped,
        weaker,
    })
}

/// Where a filesystem rule comes from: the spec's own paths must exist, the base
/// set's are skipped when the host lacks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Spec,
    Base,
}

/// One path-beneath rule to add, before masking for non-directories.
#[derive(Debug, Clone)]
struct Grant {
    path: PathBuf,
    access: BitFlags<AccessFs>,
    origin: Origin,
}

/// The rules of a spec, in order: base set, `fs`, `exec`.
fn grants(spec: &SandboxSpec, abi: ABI) -> Vec<Grant> {
    let ro = AccessFs::ReadFile | AccessFs::ReadDir;
    let rx = AccessFs::Execute | AccessFs::ReadFile;
    let mut out = Vec::new();
    if spec.base_ro {
        let base = |paths: &[&str], access: BitFlags<AccessFs>| {
            paths
                .iter()
                .map(move |p| Grant {
                    path: PathBuf::from(p),
                    access,
                    origin: Origin::Base,
                })
                .collect::<Vec<_>>()
        };
        out.extend(base(BASE_READ, ro));
        out.extend(base(
            BASE_READ_WRITE,
            AccessFs::ReadFile | AccessFs::WriteFile,
        ));
        out.extend(base(BASE_LOADERS, rx));
    }
    for (path, mode) in &spec.fs {
        out.push(Grant {
            path: path.clone(),
            access: match mode {
                FsAccess::Ro => ro,
                FsAccess::Rw => AccessFs::from_all(abi),
            },
            origin: Origin::Spec,
        });
    }
    for path in &spec.exec {
        out.push(Grant {
            path: path.clone(),
            access: rx,
            origin: Origin::Spec,
        });
    }
    out
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
    let caps_weaker = weaker.iter().any(|w| w.starts_with("capabilities"));
    let enforced = Enforced {
        landlock_abi: layers.abi,
        fs: layers.fs,
        net: !layers.net.is_empty(),
        scoped: layers.scoped,
        caps_dropped: caps.is_some() && !caps_weaker,
        no_new_privs: spec.no_new_privs,
        weaker,
    };
    Ok(Prepared {
        inner: Arc::new(Inner {
            ruleset,
            caps,
            no_new_privs: spec.no_new_privs,
            enforced,
        }),
    })
}

fn landlock_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Layer {
        layer: "landlock",
        reason: e.to_string(),
    }
}

/// The landlock ruleset for `spec`, as an owned fd (landlock_create_ruleset(2),
/// landlock_add_rule(2), through the crate).
fn build_ruleset(spec: &SandboxSpec, layers: &Layers) -> Result<OwnedFd, SandboxError> {
    let abi = ABI::from(layers.abi);
    let mut ruleset = Ruleset::default()
        // Never let the crate drop a right the kernel lacks: we asked for exactly
        // what this kernel has, so any mismatch is a bug to report, not to hide.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(landlock_err)?;
    if !layers.net.is_empty() {
        ruleset = ruleset.handle_access(layers.net).map_err(landlock_err)?;
    }
    if layers.scoped {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(landlock_err)?;
    }
    let mut created = ruleset.create().map_err(landlock_err)?;
    let file_rights = AccessFs::from_file(abi);
    for g in grants(spec, abi) {
        let file = match open_path(&g.path) {
            Ok(f) => f,
            Err(e) if g.origin == Origin::Base && e.kind() == io::ErrorKind::NotFound => continue,
            // A file rule on a path that does not exist (or vanished since the
            // policy was lowered) grants nothing; an exec-only path (the program)
            // must exist.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && spec.fs.iter().any(|(p, _)| *p == g.path) =>
            {
                continue;
            }
            Err(source) => {
                return Err(SandboxError::Path {
                    path: g.path,
                    source,
                });
            }
        };
        let is_dir = file
            .metadata()
            .map_err(|source| SandboxError::Path {
                path: g.path.clone(),
                source,
            })?
            .is_dir();
        // Directory-only rights on a file are refused by the kernel (EINVAL).
        let access = if is_dir {
            g.access
        } else {
            g.access & file_rights
        };
        if access.is_empty() {
            continue;
        }
        created = add_path_rule(created, file, access).map_err(|e| SandboxError::Rule {
            path: g.path.clone(),
            reason: e.to_string(),
        })?;
    }
    let ports = [
        (AccessNet::ConnectTcp, &spec.net_connect),
        (AccessNet::BindTcp, &spec.net_bind),
    ];
    for (right, list) in ports {
        if !layers.net.contains(right) {
            continue;
        }
        for &port in list.iter().flatten() {
            created =
                created
                    .add_rule(NetPort::new(port, right))
                    .map_err(|e| SandboxError::Port {
                        port,
                        reason: e.to_string(),
                    })?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| SandboxError::Layer {
        layer: "landlock",
        reason: "the landlock crate created no ruleset on a kernel with landlock".into(),
    })
}

fn add_path_rule(
    created: RulesetCreated,
    file: File,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, landlock::RulesetError> {
    created.add_rule(PathBeneath::new(file, access))
}

/// Opens `path` as a landlock rule's anchor: `O_PATH` needs no permission on the
/// file itself and follows symlinks, so the rule lands on the file they reach
/// (open(2)).
fn open_path(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
}

/// Reads what the child will need to drop every capability, and checks that this
/// process can do it (capabilities(7)).
fn plan_caps(
    spec: &SandboxSpec,
    weaker: &mut Vec<String>,
) -> Result<Option<CapPlan>, SandboxError> {
    let text = std::fs::read_to_string(CAP_LAST_CAP).map_err(|source| SandboxError::Path {
        path: PathBuf::from(CAP_LAST_CAP),
        source,
    })?;
    let last_cap: u32 = text.trim().parse().map_err(|_| SandboxError::Path {
        path: PathBuf::from(CAP_LAST_CAP),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a number, got {:?}", text.trim()),
        ),
    })?;
    // Two 32-bit words per set in capset(2) version 3.
    let last_cap = last_cap.min(63);
    let effective = own_effective_caps().map_err(|e| SandboxError::Layer {
        layer: "capabilities",
        reason: format!("capget: {e}"),
    })?;
    // prctl(2) PR_CAPBSET_READ: 1 when the capability is in the bounding set.
    // SAFETY: prctl with integer arguments only.
    let bset_nonempty = (0..=last_cap)
        .any(|c| unsafe { libc::prctl(libc::PR_CAPBSET_READ, c as libc::c_ulong, 0, 0, 0) } == 1);
    let can_drop_bset = effective & (1 << CAP_SETPCAP) != 0;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let drop_bset = if !bset_nonempty {
        false
    } else if can_drop_bset {
        true
    } else if root || !spec.no_new_privs {
        // A root agent with a full bounding set gets every capability back at its
        // next execve (capabilities(7), "Capabilities and execution of programs
        // by root"); without no_new_privs a setuid binary does the same.
        let reason = "the bounding set cannot be emptied without CAP_SETPCAP".to_owned();
        if spec.allow_weaker {
            weaker.push(format!("capabilities: {reason}"));
            false
        } else {
            return Err(SandboxError::Layer {
                layer: "capabilities",
                reason,
            });
        }
    } else {
        // Not root and no_new_privs: nothing can grant capabilities back.
        false
    };
    Ok(Some(CapPlan {
        last_cap,
        drop_bset,
    }))
}

/// This thread's effective capabilities, as a 64-bit mask (capget(2)).
fn own_effective_caps() -> io::Result<u64> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: hdr and data are valid for the kernel to read and write (two
    // structures for version 3).
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// The steps the child takes, in order; a failing step is reported to the
/// parent as its number through a pipe, so the error can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ChildStep {
    Descriptors = 1,
    BoundingSet = 2,
    Ambient = 3,
    Capset = 4,
    NoNewPrivs = 5,
    Landlock = 6,
}

impl ChildStep {
    pub(crate) fn from_u8(b: u8) -> Option<ChildStep> {
        Some(match b {
            1 => ChildStep::Descriptors,
            2 => ChildStep::BoundingSet,
            3 => ChildStep::Ambient,
            4 => ChildStep::Capset,
            5 => ChildStep::NoNewPrivs,
            6 => ChildStep::Landlock,
            _ => return None,
        })
    }

    /// The layer and the syscall, for the launch error.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            ChildStep::Descriptors => {
                "descriptors: marking inherited ones close-on-exec (close_range)"
            }
            ChildStep::BoundingSet => {
                "capabilities: emptying the bounding set (prctl PR_CAPBSET_DROP)"
            }
            ChildStep::Ambient => {
                "capabilities: clearing the ambient set (prctl PR_CAP_AMBIENT_CLEAR_ALL)"
            }
            ChildStep::Capset => "capabilities: emptying the process's sets (capset)",
            ChildStep::NoNewPrivs => "no_new_privs (prctl PR_SET_NO_NEW_PRIVS)",
            ChildStep::Landlock => "landlock (landlock_restrict_self)",
        }
    }
}

/// Plain integers the child acts on (no pointers into the parent's heap, no
/// allocation). Valid while the [`Prepared`] it came from lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildPlan {
    ruleset_fd: RawFd,
    drop_caps: bool,
    drop_bset: bool,
    last_cap: libc::c_int,
    no_new_privs: bool,
    /// Write end of a close-on-exec pipe where a failing step writes its number.
    report_fd: RawFd,
}

impl ChildPlan {
    /// Applies the sandbox to the calling process, in the order the module docs
    /// give.
    ///
    /// # Safety
    /// Only between clone and exec, in the child: raw syscalls on prepared values,
    /// async-signal-safe (signal-safety(7)); the fds must be open.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        let fail = |step: ChildStep| -> io::Error {
            let e = io::Error::last_os_error();
            let b = [step as u8];
            // SAFETY: a one-byte write of a stack buffer to a pipe we were given.
            unsafe { libc::write(self.report_fd, b.as_ptr().cast(), 1) };
            e
        };
        // SAFETY (whole block): close_range(2), prctl(2), capset(2),
        // landlock_restrict_self(2) with integer arguments or pointers to stack
        // values.
        unsafe {
            // close_range(2) with CLOSE_RANGE_CLOEXEC (Linux 5.11): every fd from 3
            // up closes at execve, but stays usable until then (the ruleset, the
            // report pipe, std's own error pipe).
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return Err(fail(ChildStep::Descriptors));
            }
            if self.drop_caps {
                if self.drop_bset {
                    // prctl(2) PR_CAPBSET_DROP: root's next execve gets the
                    // bounding set as its permitted set; empty it first, while
                    // CAP_SETPCAP is still effective.
                    for cap in 0..=self.last_cap {
                        if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                            return Err(fail(ChildStep::BoundingSet));
                        }
                    }
                }
                // prctl(2) PR_CAP_AMBIENT: ambient capabilities survive execve.
                if libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(fail(ChildStep::Ambient));
                }
                // capset(2): empty effective, permitted and inheritable sets.
                // Dropping is always allowed, and a shrinking credential keeps
                // PR_SET_PDEATHSIG (commit_creds clears it only on a uid/gid
                // change or when capabilities grow).
                let mut hdr = CapHeader {
                    version: LINUX_CAPABILITY_VERSION_3,
                    pid: 0,
                };
                let data = [CapData::default(); 2];
                if libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) != 0 {
                    return Err(fail(ChildStep::Capset));
                }
            }
            if self.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(fail(ChildStep::NoNewPrivs));
            }
            // landlock_restrict_self(2): the ruleset becomes this process's
            // domain, inherited by everything it execs and forks; the fd stays
            // open (the kernel made it close-on-exec).
            if self.ruleset_fd >= 0
                && libc::syscall(libc::SYS_landlock_restrict_self, self.ruleset_fd, 0u32) != 0
            {
                return Err(fail(ChildStep::Landlock));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec::default()
    }

    #[test]
    fn missing_landlock_fails_closed_naming_the_layer() {
        let e = plan_layers(Err("ENOSYS".into()), &spec()).unwrap_err();
        assert!(
            matches!(
                &e,
                SandboxError::Layer {
                    layer: "landlock",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("sandbox layer landlock"), "{e}");
        let e = plan_layers(Ok(0), &spec()).unwrap_err();
        assert!(matches!(
            e,
            SandboxError::Layer {
                layer: "landlock",
                ..
            }
        ));
    }

    #[test]
    fn missing_landlock_with_allow_weaker_lists_every_layer() {
        let s = SandboxSpec {
            allow_weaker: true,
            net_connect: Some(vec![443]),
            ..spec()
        };
        let l = plan_layers(Err("EOPNOTSUPP".into()), &s).unwrap();
        assert!(!l.fs && l.net.is_empty() && !l.scoped);
        let layers: Vec<&str> = l
            .weaker
            .iter()
            .map(|w| w.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(layers, ["landlock", "landlock-net", "landlock-scope"]);
    }

    #[test]
    fn tcp_rules_need_abi_4() {
        let s = SandboxSpec {
            net_bind: Some(vec![]),
            scoped: false,
            ..spec()
        };
        let e = plan_layers(Ok(3), &s).unwrap_err();
        assert!(
            matches!(&e, SandboxError::Layer { layer: "landlock-net", reason } if reason.contains("ABI 3")),
            "{e}"
        );
        let l = plan_layers(
            Ok(3),
            &SandboxSpec {
                allow_weaker: true,
                ..s.clone()
            },
        )
        .unwrap();
        assert!(l.fs && l.net.is_empty());
        assert_eq!(l.weaker.len(), 1);
        let l = plan_layers(Ok(4), &s).unwrap();
        assert_eq!(l.net, AccessNet::BindTcp);
        assert!(l.weaker.is_empty());
        // TCP left open: nothing to enforce, nothing missing, even on ABI 1.
        let l = plan_layers(
            Ok(1),
            &SandboxSpec {
                scoped: false,
                ..spec()
            },
        )
        .unwrap();
        assert!(l.fs && l.net.is_empty() && l.weaker.is_empty());
    }

    #[test]
    fn scopes_need_abi_6() {
        let e = plan_layers(Ok(5), &spec()).unwrap_err();
        assert!(matches!(
            e,
            SandboxError::Layer {
                layer: "landlock-scope",
                ..
            }
        ));
        assert!(plan_layers(Ok(6), &spec()).unwrap().scoped);
    }

    #[test]
    fn grants_follow_the_documented_modes() {
        let s = SandboxSpec {
            fs: vec![("/a".into(), FsAccess::Ro), ("/b".into(), FsAccess::Rw)],
            exec: vec!["/c".into()],
            ..spec()
        };
        let g = grants(&s, ABI::V7);
        let find = |p: &str| g.iter().find(|g| g.path == Path::new(p)).unwrap().access;
        assert_eq!(find("/a"), AccessFs::ReadFile | AccessFs::ReadDir);
        assert_eq!(find("/b"), AccessFs::from_all(ABI::V7));
        assert_eq!(find("/c"), AccessFs::Execute | AccessFs::ReadFile);
        assert_eq!(find("/dev/null"), AccessFs::ReadFile | AccessFs::WriteFile);
        assert_eq!(find("/proc"), AccessFs::ReadFile | AccessFs::ReadDir);
        assert_eq!(
            find("/lib64/ld-linux-x86-64.so.2"),
            AccessFs::Execute | AccessFs::ReadFile
        );
        // Nothing in the base set is writable but /dev/null, nothing executable
        // but the loaders.
        for b in g.iter().filter(|g| g.origin == Origin::Base) {
            let p = b.path.to_string_lossy();
            assert_eq!(
                b.access.contains(AccessFs::WriteFile),
                p == "/dev/null",
                "{p}"
            );
            assert_eq!(
                b.access.contains(AccessFs::Execute),
                BASE_LOADERS.contains(&p.as_ref()),
                "{p}"
            );
        }
        let none = grants(
            &SandboxSpec {
                base_ro: false,
                ..spec()
            },
            ABI::V7,
        );
        assert!(none.is_empty());
    }

    #[test]
    fn relative_and_missing_paths_are_named() {
        let e = prepare(&SandboxSpec {
            fs: vec![("rel/x".into(), FsAccess::Ro)],
            ..spec()
        })
        .unwrap_err();
        assert!(e.to_string().contains("rel/x"), "{e}");
        let e = prepare(&SandboxSpec {
            exec: vec!["/nonexistent/brood-sandbox-test".into()],
            ..spec()
        })
        .unwrap_err();
        assert!(
            matches!(&e, SandboxError::Path { path, source }
                if path == Path::new("/nonexistent/brood-sandbox-test")
                    && source.kind() == io::ErrorKind::NotFound),
            "{e}"
        );
    }

    #[test]
    fn contradictory_spec_is_refused() {
        let e = prepare(&SandboxSpec {
            no_new_privs: false,
            ..spec()
        })
        .unwrap_err();
        assert!(matches!(e, SandboxError::Invalid(_)), "{e}");
    }

    #[test]
    fn child_steps_round_trip_and_name_their_layer() {
        for s in [
            ChildStep::Descriptors,
            ChildStep::BoundingSet,
            ChildStep::Ambient,
            ChildStep::Capset,
            ChildStep::NoNewPrivs,
            ChildStep::Landlock,
        ] {
            assert_eq!(ChildStep::from_u8(s as u8), Some(s));
        }
        assert_eq!(ChildStep::from_u8(0), None);
        assert!(ChildStep::Landlock.describe().starts_with("landlock"));
    }

    #[test]
    fn prepare_on_this_host_enforces_everything() {
        // This machine has landlock ABI >= 6 and runs the tests as root with
        // CAP_SETPCAP; a failure here names the missing layer.
        let p = prepare(&SandboxSpec {
            net_connect: Some(vec![80]),
            net_bind: Some(vec![]),
            ..spec()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let e = p.enforced();
        assert!(e.landlock_abi >= 6, "{e:?}");
        assert!(
            e.fs && e.net && e.scoped && e.no_new_privs && e.caps_dropped,
            "{e:?}"
        );
        assert!(e.weaker.is_empty(), "{e:?}");
        let plan = p.child_plan(-1);
        assert!(plan.ruleset_fd >= 0 && plan.drop_caps && plan.no_new_privs);
        // The ruleset fd is close-on-exec, so no agent inherits it.
        // SAFETY: F_GETFD on an fd we own.
        let flags = unsafe { libc::fcntl(plan.ruleset_fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }
}
