//! The calls that would let an agent take disk its write budget does not see
//! (issue 24 item 6, `crate::written`), refused by a seccomp-bpf filter every
//! sandboxed agent gets, whatever its network:
//!
//! * `fallocate(2)`: reserves blocks without writing them, so no write is
//!   counted, and with `FALLOC_FL_KEEP_SIZE` past `RLIMIT_FSIZE` (ext4 checks
//!   the limit only when the size grows). Refused with `EOPNOTSUPP`, what a
//!   filesystem without it answers: `posix_fallocate(3)` then writes zeros,
//!   which the budget counts and the file-size limit stops.
//! * `prctl(PR_SET_CHILD_SUBREAPER, 0)`: the launcher makes an agent's first
//!   process the reaper of its orphans, so that what they wrote is folded
//!   into a process of the agent when they exit; clearing it would send them
//!   to the namespace's init, outside the agent, and their writes with them.
//!   Setting it (on any process of the agent) stays allowed.
//!
//! Its own filter, next to the socket filter (`super::sockets`), because the
//! two refuse with different errors; the kernel runs both.

use std::sync::{Arc, OnceLock};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::SandboxError;

/// The program, built once for the life of the process.
pub(crate) fn program() -> Result<Arc<BpfProgram>, SandboxError> {
    static PROGRAM: OnceLock<Arc<BpfProgram>> = OnceLock::new();
    if let Some(p) = PROGRAM.get() {
        return Ok(p.clone());
    }
    let built = Arc::new(compile()?);
    Ok(PROGRAM.get_or_init(|| built).clone())
}

fn compile() -> Result<BpfProgram, SandboxError> {
    let bad = |e: seccompiler::BackendError| SandboxError::Layer {
        layer: "seccomp",
        reason: format!("building the disk-call filter: {e}"),
    };
    let cond = |arg: u8, len: SeccompCmpArgLen, value: u64| {
        SeccompCondition::new(arg, len, SeccompCmpOp::Eq, value).map_err(bad)
    };
    // Rules name what is refused (the filter's match action).
    let clear_subreaper = SeccompRule::new(vec![
        cond(
            0,
            SeccompCmpArgLen::Dword,
            libc::PR_SET_CHILD_SUBREAPER as u64,
        )?,
        cond(1, SeccompCmpArgLen::Qword, 0)?,
    ])
    .map_err(bad)?;
    #[allow(unused_mut)]
    let mut rules: Vec<(i64, Vec<SeccompRule>)> = vec![
        (libc::SYS_fallocate, Vec::new()),
        (libc::SYS_prctl, vec![clear_subreaper]),
    ];
    // The x32 numbers of the same calls are refused outright (see
    // `super::sockets`: the architecture check lets x32 through).
    #[cfg(target_arch = "x86_64")]
    {
        use super::sockets::X32_SYSCALL_BIT;
        rules.push((libc::SYS_fallocate | X32_SYSCALL_BIT, Vec::new()));
        rules.push((libc::SYS_prctl | X32_SYSCALL_BIT, Vec::new()));
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SandboxError::Layer {
        layer: "seccomp",
        reason: format!("no disk-call filter for this architecture: {e}"),
    })?;
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EOPNOTSUPP as u32),
        arch,
    )
    .map_err(bad)?;
    filter.try_into().map_err(bad)
}
