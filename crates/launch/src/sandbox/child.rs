//! What the child applies between clone and exec: the steps in order, each
//! reported by number when it fails, on plain integers the parent prepared.

use std::io;
use std::os::fd::RawFd;

use super::caps::{CapData, CapHeader, LINUX_CAPABILITY_VERSION_3};

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
    Seccomp = 7,
    DiskCalls = 8,
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
            7 => ChildStep::Seccomp,
            8 => ChildStep::DiskCalls,
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
            ChildStep::Seccomp => "the socket filter (seccomp SECCOMP_SET_MODE_FILTER)",
            ChildStep::DiskCalls => "the disk-call filter (seccomp SECCOMP_SET_MODE_FILTER)",
        }
    }
}

/// Plain integers the child acts on (no pointers into the parent's heap, no
/// allocation). Valid while the [`Prepared`] it came from lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildPlan {
    pub(super) ruleset_fd: RawFd,
    pub(super) drop_caps: bool,
    pub(super) drop_bset: bool,
    pub(super) last_cap: libc::c_int,
    pub(super) no_new_privs: bool,
    /// The socket filter's instructions (`struct sock_filter`) and their
    /// count, or a null pointer for none; owned by the `Prepared`.
    pub(super) filter: (*const libc::sock_filter, usize),
    /// The disk-call filter's, the same way.
    pub(super) writes_filter: (*const libc::sock_filter, usize),
    /// Write end of a close-on-exec pipe where a failing step writes its number.
    pub(super) report_fd: RawFd,
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
            // seccomp(2): the socket filter, last, so that nothing above is
            // filtered; no_new_privs is set, so no privilege is needed. The
            // program lives in the parent's memory, which the child shares
            // until exec (CLONE_VM), and the kernel copies it.
            for (step, (filter, len)) in [
                (ChildStep::Seccomp, self.filter),
                (ChildStep::DiskCalls, self.writes_filter),
            ] {
                if filter.is_null() {
                    continue;
                }
                let prog = libc::sock_fprog {
                    len: len as libc::c_ushort,
                    filter: filter.cast_mut(),
                };
                if libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    &prog as *const libc::sock_fprog,
                ) != 0
                {
                    return Err(fail(step));
                }
            }
        }
        Ok(())
    }
}
