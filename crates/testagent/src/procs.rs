//! The process tricks tests ask of the test agent: ignoring SIGTERM, forking
//! grandchildren that idle forever, a double-forked `setsid` daemon, and
//! reporting their pids. These are the behaviours that containment (cgroups,
//! cascades, supervisor death) must defeat.
//!
//! The agent is multi-threaded (its stdin reader) when it forks, so a forked
//! child may only make async-signal-safe calls (signal-safety(7)): no
//! allocation, no locks, no Rust std IO. Every child here only calls `pause`,
//! `setsid`, `fork`, `write` and `_exit`, with everything they need prepared
//! before the fork. The children keep the agent's stdin, stdout and stderr open,
//! as a careless daemon would: the supervisor must not rely on end of file to
//! know that a run ended.

use std::io::{self, Write};
use std::path::Path;

/// Ignores SIGTERM from now on, for this process and every process it forks
/// (signal(2); the disposition survives fork).
pub fn ignore_sigterm() -> io::Result<()> {
    // SAFETY: installing SIG_IGN runs no code in this process; it only changes
    // the kernel's disposition for SIGTERM.
    let prev = unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    if prev == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a forked idler does, for ever: sleep until a signal, which either
/// kills it or is ignored (pause(2)). Async-signal-safe.
fn idle_forever() -> ! {
    loop {
        // SAFETY: pause takes no arguments and touches no memory.
        unsafe {
            libc::pause();
        }
    }
}

/// Forks a child that idles for ever (fork(2)); returns its pid.
pub fn fork_idler() -> io::Result<libc::pid_t> {
    // SAFETY: the child only runs `idle_forever`, which is async-signal-safe,
    // so the locks other threads may hold at the fork do not matter.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => idle_forever(),
        pid => Ok(pid),
    }
}

/// Double-forks a daemon: a first child calls setsid(2), forks the daemon,
/// sends its pid back through a pipe and `_exit`s; the daemon idles for ever
/// in its own session and process group, parented to whoever reaps orphans.
/// Reaps the first child and returns the daemon's pid.
pub fn fork_setsid_daemon() -> io::Result<libc::pid_t> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2(2) writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = fds;
    // SAFETY: the child makes only async-signal-safe calls (setsid, fork,
    // write of a stack buffer, _exit) and never returns into Rust code.
    let first = unsafe { libc::fork() };
    if first == 0 {
        // SAFETY: as above; `bytes` lives on this stack and `write_end` is open.
        unsafe {
            libc::setsid();
            let daemon = libc::fork();
            if daemon == 0 {
                idle_forever();
            }
            let bytes = daemon.to_ne_bytes();
            libc::write(write_end, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(if daemon > 0 { 0 } else { 1 });
        }
    }
    let fork_err = (first == -1).then(io::Error::last_os_error);
    // SAFETY: closing our copy of the write end, which nothing else uses, so
    // that the read below sees end of file if the first child dies early.
    unsafe { libc::close(write_end) };
    let result = match fork_err {
        Some(e) => Err(e),
        None => {
            reap(first)?;
            read_pid(read_end)
        }
    };
    // SAFETY: the read end is ours and no longer used.
    unsafe { libc::close(read_end) };
    result
}

/// Waits for one specific child (waitpid(2)), never for "any child", so as not
/// to steal statuses from anyone else.
fn reap(pid: libc::pid_t) -> io::Result<()> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid place for waitpid to write to.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn read_pid(fd: libc::c_int) -> io::Result<libc::pid_t> {
    let mut bytes = [0u8; size_of::<libc::pid_t>()];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: reading into the unfilled tail of `bytes`.
        let n = unsafe { libc::read(fd, bytes[got..].as_mut_ptr().cast(), bytes.len() - got) };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    let pid = libc::pid_t::from_ne_bytes(bytes);
    if got < bytes.len() || pid <= 0 {
        return Err(io::Error::other(
            "the setsid'd first child exited without forking the daemon",
        ));
    }
    Ok(pid)
}

/// Appends one line per pid to `file` in a single write, so that agents
/// reporting to the same file concurrently do not interleave their lines.
pub fn report_pids(file: &Path, pids: &[libc::pid_t]) -> io::Result<()> {
    let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?
        .write_all(text.as_bytes())
}
