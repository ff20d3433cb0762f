//! The keeper: the init of the PID namespace the spawner thread's agents
//! live in (see the parent module), and how the spawner tells it is gone.

use std::io;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;

/// Whether the keeper is dead or dying. A namespace stops taking processes as
/// soon as its init starts to exit (the kernel disables PID allocation before
/// it kills the rest), well before the init can be reaped, so an exiting
/// keeper (PF_EXITING in /proc/PID/stat) counts as gone.
pub(super) fn keeper_gone(pid: i32) -> bool {
    reaped(pid) || exiting(pid)
}

/// Whether the keeper has exited (then it is reaped here: it is the
/// supervisor's child, and nobody else waits for it).
pub(super) fn reaped(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child, without blocking.
    let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    got == pid || (got < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

/// PF_EXITING in the flags field (the 9th) of /proc/PID/stat.
pub(super) fn exiting(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    // Unreadable (no /proc here, or reaped since): `reaped` answers for it.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (2nd field) is in parentheses and may hold spaces.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    rest.split_whitespace()
        .nth(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Creates the PID namespace for this thread's future children and forks its init.
pub(super) fn start_keeper() -> io::Result<(i32, OwnedFd)> {
    // SAFETY: unshare with a flag that only affects this thread's future children.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // A pipe lets the keeper notice a spawner thread (or supervisor) that ended
    // before the keeper could arm PR_SET_PDEATHSIG (getppid() is 0 across the
    // namespace border, so it cannot tell us). The spawner thread holds the write
    // end for exactly its own life.
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: after fork the child runs only keeper_main, which makes raw syscalls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: we are the freshly forked keeper; never returns.
        unsafe { keeper_main(rd, wr) }
    }
    // SAFETY: closing our copy of the read end; `wr` is a fresh descriptor we own.
    unsafe { libc::close(rd) };
    // SAFETY: see above.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(wr) }))
}

/// PID 1 of the agents' namespace: reap every orphan, forever.
///
/// # Safety
/// Must be called only in a freshly forked child; uses only async-signal-safe calls.
pub(super) unsafe fn keeper_main(rd: RawFd, wr: RawFd) -> ! {
    // SAFETY (whole body): raw syscalls on values we own, in a single-threaded child.
    unsafe {
        libc::close(wr);
        // Hold nothing of the supervisor's: every descriptor but the pipe goes
        // (close_range(2)), so no pipe or socket stays open through the keeper.
        if rd > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (rd - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (rd + 1) as u32, u32::MAX, 0u32);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let mut pfd = libc::pollfd {
            fd: rd,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & (libc::POLLHUP | libc::POLLIN) != 0 {
            libc::_exit(0);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut status = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&set, &mut info);
        }
    }
}
