//! The child of a spawn between `clone(CLONE_VM | CLONE_VFORK)` and exec:
//! what it works from (raw pointers and descriptors the parent prepared),
//! its stack, the clone itself and the steps it takes. It shares the
//! supervisor's memory, so only raw syscalls run here: no allocation, no
//! lock, no glibc wrapper that touches other threads.

use super::{DOOR_FD, MAX_EXTRA_PROCS, kill_and_reap};
use crate::sandbox::ChildPlan;
use std::io;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicI32;
use std::sync::atomic::Ordering;

/// What the child of [`clone_child`] works from: raw pointers and descriptors,
/// all prepared and kept alive by the parent, which is suspended until the child
/// has exec'd or exited (`CLONE_VFORK`).
pub(super) struct Child {
    pub(super) path: *const libc::c_char,
    pub(super) argv: *const *const libc::c_char,
    pub(super) envp: *const *const libc::c_char,
    /// NULL: stay where the supervisor is.
    pub(super) cwd: *const libc::c_char,
    /// The child's ends of its stdin, stdout and stderr pipes (all >= 3).
    pub(super) stdio: [RawFd; 3],
    pub(super) procs_fd: RawFd,
    pub(super) extra: [RawFd; MAX_EXTRA_PROCS],
    pub(super) in_ns: bool,
    pub(super) supervisor_pid: i32,
    pub(super) ns: Option<crate::ns::ChildNs>,
    /// NULL: no veil. Points into the `Arc` the spec holds until the spawn returns.
    pub(super) veil: *const crate::veil::VeilNamespace,
    pub(super) plan: Option<ChildPlan>,
    /// The door, to be placed at `DOOR_FD`; -1 for none.
    pub(super) door: RawFd,
    /// `RLIMIT_FSIZE` to set with `prlimit64(2)`; `None`: inherited.
    pub(super) file_size: Option<KernelRlimit>,
    /// `RLIMIT_NOFILE` as the supervisor was started with, when it raised
    /// its own ([`super::raise_open_files`]): the agent gets it back.
    pub(super) open_files: Option<KernelRlimit>,
    /// NULL: no view of its own. Points into the spec, alive until exec.
    pub(super) view: *const crate::veil::PreparedView,
    /// Set by the child when it fails before exec; shared memory (`CLONE_VM`).
    pub(super) errno: AtomicI32,
    /// Set by the child just before execve: a child that ends before that
    /// without an errno was killed by a signal on the way.
    pub(super) at_exec: std::sync::atomic::AtomicBool,
}

/// The stack the child of [`clone_child`] runs on until exec: mapped once per
/// spawner thread, with a guard page below it so an overflow faults instead of
/// writing into the supervisor's memory.
pub(super) struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

/// The child's stack size: its work is a few dozen raw syscalls.
pub(super) const CHILD_STACK: usize = 256 * 1024;

impl ChildStack {
    pub(super) fn new() -> io::Result<ChildStack> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = CHILD_STACK + page;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the lowest page of our own mapping.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The highest address: x86-64 and aarch64 stacks grow down. Page-aligned,
    /// so 16-byte aligned as both ABIs want.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our mapping, which is how clone(2) wants it.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Starts `child_main(c)` as a new process sharing our memory, as posix_spawn(3)
/// does (`CLONE_VM | CLONE_VFORK`), and returns once it has exec'd or exited.
/// A plain fork would copy the supervisor's page tables for a process that only
/// runs a few syscalls and execs, then tear them down again at exec: about half a
/// millisecond per agent, measured. The pidfd comes from the same clone
/// (`CLONE_PIDFD`), before the child could be reaped.
pub(super) fn clone_child(c: &Child, stack: &ChildStack) -> io::Result<(i32, OwnedFd)> {
    // SAFETY (whole body): sigfillset/pthread_sigmask on stack sets; clone(2)
    // runs child_main on its own stack with `c`, which outlives the call (the
    // parent is suspended until the child execs or exits).
    unsafe {
        // No signal handler of the supervisor may run in the child, which
        // shares its memory: everything is blocked across the clone, and the
        // child resets every disposition before unblocking (child_main).
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut pidfd: libc::c_int = -1;
        let pid = libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (c as *const Child).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        if pidfd < 0 {
            // Not possible with CLONE_PIDFD on Linux >= 5.2; never leave a child.
            kill_and_reap(pid);
            return Err(io::Error::other("clone(CLONE_PIDFD) returned no pidfd"));
        }
        Ok((pid, OwnedFd::from_raw_fd(pidfd)))
    }
}

/// The child of [`clone_child`]: stdio, signals, cwd, [`child_setup`], exec. On
/// any failure the errno goes to `Child::errno` and the child exits 127.
///
/// It shares the supervisor's memory, so like a vfork child it makes raw syscalls
/// only, touches nothing but `Child` (and its own stack), and never returns.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: arg is the &Child clone_child passed, alive until we exec or exit.
    let c = unsafe { &*arg.cast::<Child>() };
    let die = |e: io::Error| -> ! {
        c.errno
            .store(e.raw_os_error().unwrap_or(libc::EINVAL), Ordering::Release);
        // SAFETY: _exit(2) never returns and runs no atexit handler of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY (whole block): raw syscalls on stack values and on `c`.
    unsafe {
        // A clean slate of signal dispositions: handlers point into the
        // supervisor, and SIG_IGN would be inherited through exec (as SIGPIPE's
        // is). The raw syscall, because glibc's sigaction refuses its two
        // internal signals (32, 33), which a supervisor started by posix_spawn
        // inherits ignored.
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut act = KernelSigaction::default();
            let size = std::mem::size_of::<u64>();
            if libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KernelSigaction>(),
                &mut act,
                size,
            ) == 0
                && act.handler != libc::SIG_DFL
            {
                let dfl = KernelSigaction::default();
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl,
                    std::ptr::null_mut::<KernelSigaction>(),
                    size,
                );
            }
        }
        for (fd, target) in c.stdio.into_iter().zip(0..) {
            // dup2 clears close-on-exec on the copy; the pipes are >= 3, so no
            // copy overwrites another pipe's end.
            if libc::dup2(fd, target) < 0 {
                die(io::Error::last_os_error());
            }
        }
        if let Err(e) = child_setup(c) {
            die(e);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        c.at_exec.store(true, Ordering::Release);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(c.path, c.argv, c.envp);
        die(io::Error::last_os_error())
    }
}

/// The kernel's `struct rlimit64` for prlimit64(2): two 64-bit limits,
/// whatever glibc's `rlim_t` is.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct KernelRlimit {
    pub(super) cur: u64,
    pub(super) max: u64,
}

/// The kernel's `struct sigaction` for rt_sigaction(2) (not glibc's, whose
/// layout differs): `SIG_DFL` with no flags is all zeroes.
#[repr(C)]
#[derive(Default)]
pub(super) struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Runs in the child between clone and exec.
pub(super) fn child_setup(c: &Child) -> io::Result<()> {
    // SAFETY: raw syscalls only (async-signal-safe), on descriptors that stay open
    // in the parent until spawn returns.
    unsafe {
        // Its own process group, so a terminal's signals and killpg address it alone.
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if c.procs_fd >= 0 {
            // cgroup v2 "cgroup.procs": writing 0 moves the writing process.
            let zero = b"0";
            if libc::write(c.procs_fd, zero.as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        // The v1 groups that hold the limits (hybrid hosts), before any code of
        // the agent runs, so no allocation escapes them.
        for fd in c.extra {
            if fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Close the race with a supervisor that died before the prctl: across the
        // namespace border getppid() is 0 while our parent lives; after its death we
        // would have been re-parented to the keeper (1) or to a host reaper.
        let ppid = libc::getppid();
        let parent_alive = if c.in_ns {
            ppid == 0
        } else {
            ppid == c.supervisor_pid
        };
        if !parent_alive {
            libc::_exit(137);
        }
        // The veil and the private mount/network namespace need CAP_SYS_ADMIN,
        // so they come before the sandbox drops capabilities (crate::veil and
        // crate::ns document their order). The veil first: `iso = ns` then
        // builds its root from a tree where brood's machinery is already covered.
        if !c.veil.is_null() {
            crate::veil::join_in_child(&*c.veil)?;
        }
        // Its own view of the ctx tree, in a copy of the veil's namespace.
        if !c.view.is_null() {
            crate::veil::apply_view_in_child(&*c.view)?;
        }
        // The working directory after the veil: one taken before would keep a
        // covered directory reachable as `.`.
        if !c.cwd.is_null() && libc::chdir(c.cwd) != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(ns) = c.ns {
            ns.apply()?;
        }
        // The largest file the agent may write (its policy's `disk_max`),
        // after the steps above, which make mount points but write no file,
        // and before any of its code runs. The raw syscall on a value the
        // parent prepared: glibc's setrlimit is a wrapper like the others.
        // With a disk bound, the agent's first process is also the reaper of
        // its orphans (kept across exec), so that what they write folds into
        // a process of the agent when they exit, not into the namespace's
        // init (`crate::written`); the sandbox refuses to clear it.
        if c.file_size.is_some()
            && libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if let Some(limit) = &c.file_size
            && libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::RLIMIT_FSIZE,
                limit as *const KernelRlimit,
                std::ptr::null_mut::<KernelRlimit>(),
            ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The descriptor limit the supervisor was started with, not the one
        // it raised for itself: a program that uses select(2) must not meet
        // a descriptor above 1024 because its supervisor holds many.
        if let Some(limit) = &c.open_files
            && libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::RLIMIT_NOFILE,
                limit as *const KernelRlimit,
                std::ptr::null_mut::<KernelRlimit>(),
            ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // Last, so the steps above still run with the supervisor's rights; none of
        // the sandbox's credential changes clears PR_SET_PDEATHSIG (see
        // ChildPlan::apply).
        if let Some(plan) = &c.plan {
            plan.apply()?;
        }
        // The door last: the sandbox marked every descriptor from 3 up
        // close-on-exec, and dup2 gives the copy a clear flag (dup2(2)); a door
        // already at DOOR_FD only needs its flag cleared.
        if c.door >= 0 {
            let placed = if c.door == DOOR_FD {
                libc::fcntl(DOOR_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(c.door, DOOR_FD)
            };
            if placed < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}
