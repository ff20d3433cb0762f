//! Which sockets an agent may create: a seccomp-bpf filter on socket(2),
//! socketpair(2) and io_uring (seccomp(2), issue 24 "default-deny IPC").
//!
//! landlock (ABI 7 here) controls TCP `connect`/`bind` by port and abstract
//! UNIX sockets, but not UDP, raw or netlink sockets, nor connecting to a
//! UNIX socket by path (that needs ABI 9). An agent under `network: none`
//! could therefore reach PostgreSQL's socket, another daemon's socket,
//! D-Bus, or a DNS server over UDP. Listing the sockets to hide would leave
//! the next one open, so the filter grants by family instead, and refuses
//! the rest with `EACCES`:
//!
//! * [`Sockets::Any`] (`network: all`): no filter at all.
//! * [`Sockets::Tcp`] (`network: {connect: [...]}`): `socket(AF_INET or
//!   AF_INET6, SOCK_STREAM, 0 or IPPROTO_TCP)` only, whose ports landlock
//!   then restricts. No UNIX, UDP, raw, netlink, vsock or MPTCP socket
//!   (landlock's TCP rules do not cover MPTCP).
//! * [`Sockets::None`] (`network: none`): no `socket(2)` at all.
//!
//! In both restricted modes `socketpair(AF_UNIX)` stays open: a pair reaches
//! nothing outside the process tree that made it, and runtimes use it for
//! their own plumbing (and brood's door client for its connections, see
//! docs/security.md). The `io_uring` calls are refused too, because an
//! io_uring can create and connect sockets without a `socket(2)` call.
//!
//! The filter checks the architecture first and kills a process that
//! enters the kernel through another ABI (an i386 `int 0x80`, whose
//! `socketcall(2)` would slip past the syscall numbers below). On x86-64 the
//! x32 numbers of the filtered calls are refused outright.
//!
//! [`compile`] builds the program in the supervisor with the `seccompiler`
//! crate; the child installs it last, after landlock, with one raw
//! seccomp(2) call on the prepared instructions (`no_new_privs` is set by
//! then, so no privilege is needed).

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use std::sync::{Arc, OnceLock};

use super::SandboxError;

/// Which sockets an agent may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sockets {
    /// Any family and type: no filter (`network: all`).
    #[default]
    Any,
    /// TCP over IPv4 and IPv6 only (`network: {connect: [...]}`).
    Tcp,
    /// No socket(2) at all (`network: none`).
    None,
}

impl Sockets {
    /// For `brood show` and `meta.json`.
    pub fn describe(self) -> &'static str {
        match self {
            Sockets::Any => "any socket",
            Sockets::Tcp => "TCP over IPv4/IPv6 only (no UNIX, UDP, raw or netlink socket)",
            Sockets::None => "no socket (socketpair(AF_UNIX) only)",
        }
    }
}

/// The x32 ABI's syscall numbers carry this bit (asm/unistd.h `__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
pub(super) const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// The seccomp-bpf program for `sockets`, or `None` when nothing is
/// filtered; built once per mode for the life of the process (there are
/// two programs, and every launch of an agent with a port list or no
/// network needs one).
pub(crate) fn program(sockets: Sockets) -> Result<Option<Arc<BpfProgram>>, SandboxError> {
    static TCP: OnceLock<Arc<BpfProgram>> = OnceLock::new();
    static NONE: OnceLock<Arc<BpfProgram>> = OnceLock::new();
    let cell = match sockets {
        Sockets::Any => return Ok(None),
        Sockets::Tcp => &TCP,
        Sockets::None => &NONE,
    };
    if let Some(p) = cell.get() {
        return Ok(Some(p.clone()));
    }
    let built = Arc::new(compile(sockets)?.ok_or_else(|| SandboxError::Layer {
        layer: "seccomp",
        reason: "no socket filter was built".into(),
    })?);
    Ok(Some(cell.get_or_init(|| built).clone()))
}

/// The seccomp-bpf program for `sockets`, or `None` when nothing is filtered.
fn compile(sockets: Sockets) -> Result<Option<BpfProgram>, SandboxError> {
    let bad = |e: seccompiler::BackendError| SandboxError::Layer {
        layer: "seccomp",
        reason: format!("building the socket filter: {e}"),
    };
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(bad)
    };
    let rule = |c: Vec<SeccompCondition>| SeccompRule::new(c).map_err(bad);
    // Each rule below describes what is *refused* (seccompiler returns the
    // match action when a rule matches): the complement of what is granted,
    // over a closed domain (a family number, the 4-bit socket type).
    let socket_rules: Vec<SeccompRule> = match sockets {
        Sockets::Any => return Ok(None),
        // An empty list matches every call.
        Sockets::None => Vec::new(),
        Sockets::Tcp => {
            let mut r = vec![
                // Not IPv4 and not IPv6.
                rule(vec![
                    cond(0, SeccompCmpOp::Ne, libc::AF_INET as u64)?,
                    cond(0, SeccompCmpOp::Ne, libc::AF_INET6 as u64)?,
                ])?,
                // A protocol other than the default or TCP (MPTCP, SCTP).
                rule(vec![
                    cond(2, SeccompCmpOp::Ne, 0)?,
                    cond(2, SeccompCmpOp::Ne, libc::IPPROTO_TCP as u64)?,
                ])?,
            ];
            // Any type but SOCK_STREAM: the low four bits of `type` (the rest
            // are SOCK_NONBLOCK and SOCK_CLOEXEC).
            for t in 0..16u64 {
                if t != libc::SOCK_STREAM as u64 {
                    r.push(rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), t)?])?);
                }
            }
            r
        }
    };
    let not_unix = vec![rule(vec![cond(
        0,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )?])?];
    let mut rules: Vec<(i64, Vec<SeccompRule>)> = vec![
        (libc::SYS_socket, socket_rules),
        (libc::SYS_socketpair, not_unix),
        (libc::SYS_io_uring_setup, Vec::new()),
        (libc::SYS_io_uring_enter, Vec::new()),
        (libc::SYS_io_uring_register, Vec::new()),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(nr, _)| (nr | X32_SYSCALL_BIT, Vec::new()))
            .collect();
        rules.extend(x32);
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SandboxError::Layer {
        layer: "seccomp",
        reason: format!("no socket filter for this architecture: {e}"),
    })?;
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )
    .map_err(bad)?;
    let program: BpfProgram = filter.try_into().map_err(bad)?;
    Ok(Some(program))
}
