//! How the supervisor learns that an agent's process exited, with no
//! descriptor per agent (issue 28 item 4): one io_uring on which an
//! asynchronous `waitid(2)` (`IORING_OP_WAITID`, Linux 6.7) is queued for
//! every live agent, served by one thread of the process. A pidfd an agent
//! cost the daemon a descriptor each.
//!
//! The wait is `WNOWAIT`: the process is left a zombie, so its pid names it
//! until whoever was told reaps it (the agent's IO task, as with a pidfd),
//! and nothing can be signalled by a recycled pid meanwhile.
//!
//! Where the kernel has no such ring (older than 6.7, io_uring switched off
//! by `kernel.io_uring_disabled`, or refused by a container's seccomp
//! profile), [`available`] says so and the caller keeps the agent's pidfd.
//! Two descriptors serve every agent: the ring and an eventfd that wakes
//! its thread when a new agent is to be watched.
//!
//! Why not the cheaper-looking ways: agents cloned without an exit signal
//! would be "clone" children that one `__WCLONE` wait sees alone, but
//! exec(2) resets the exit signal to `SIGCHLD`; and a wait for any child
//! would take the statuses other parts of the process wait for.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use io_uring::{IoUring, Probe, opcode, squeue, types};

type Callback = Box<dyn FnOnce() + Send>;

/// One agent being watched: where the kernel writes what it saw (it must
/// not move while the wait is queued) and whom to tell.
struct Watch {
    pid: i32,
    info: Box<libc::siginfo_t>,
    done: Callback,
}

struct Shared {
    /// Registrations the ring's thread has not queued yet.
    pending: Mutex<Vec<(i32, Callback)>>,
    /// Written to wake the ring's thread.
    wake: OwnedFd,
}

static EXITS: OnceLock<Option<Shared>> = OnceLock::new();

/// The ring's own completion for the eventfd (agents' tokens start at 1).
const WAKE: u64 = 0;

/// The environment variable that keeps the pidfds (`BROOD_EXIT_WATCH=pidfd`):
/// for a host whose io_uring misbehaves, and for the tests of that way.
pub const ENV: &str = "BROOD_EXIT_WATCH";

/// Starts the ring's thread if the kernel offers an asynchronous waitid
/// (and [`ENV`] does not say `pidfd`); whether it does. Call it from a
/// thread that may start threads (not the spawner thread once it made a
/// PID namespace).
pub fn start() -> bool {
    EXITS
        .get_or_init(|| match ring() {
            _ if std::env::var_os(ENV).is_some_and(|v| v == "pidfd") => None,
            Ok((ring, wake, wake_thread)) => {
                let started = std::thread::Builder::new()
                    .name("brood-exits".into())
                    .spawn(move || serve(ring, wake_thread));
                started.ok().map(|_| Shared {
                    pending: Mutex::new(Vec::new()),
                    wake,
                })
            }
            Err(_) => None,
        })
        .is_some()
}

/// Whether exits are watched on the ring ([`start`] found it).
pub fn available() -> bool {
    matches!(EXITS.get(), Some(Some(_)))
}

/// Calls `done` once the child `pid` has exited (a zombie, not reaped: the
/// caller reaps it), on the ring's thread: keep it short. An error (no
/// ring: [`available`]) hands `done` back for the caller's own way.
pub fn watch(pid: i32, done: impl FnOnce() + Send + 'static) -> Result<(), Callback> {
    let done: Callback = Box::new(done);
    let Some(Some(s)) = EXITS.get() else {
        return Err(done);
    };
    s.pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((pid, done));
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a live u64 to our eventfd. A full
    // counter (EAGAIN) already wakes the thread.
    unsafe { libc::write(s.wake.as_raw_fd(), (&raw const one).cast(), 8) };
    Ok(())
}

/// The ring, with `WaitId` supported, and the eventfd (twice: the
/// registrants' handle and the thread's).
fn ring() -> io::Result<(IoUring, OwnedFd, OwnedFd)> {
    let ring = IoUring::new(256)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    if !probe.is_supported(opcode::WaitId::CODE) {
        return Err(io::Error::other("io_uring without IORING_OP_WAITID"));
    }
    // SAFETY: eventfd(2) with flags only; the descriptor is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let wake = unsafe { OwnedFd::from_raw_fd(fd) };
    let thread_side = wake.try_clone()?;
    Ok((ring, wake, thread_side))
}

fn serve(mut ring: IoUring, wake: OwnedFd) {
    let Some(Some(shared)) = wait_for_shared() else {
        return;
    };
    let poll = || {
        opcode::PollAdd::new(types::Fd(wake.as_raw_fd()), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(WAKE)
    };
    let mut watches: HashMap<u64, Watch> = HashMap::new();
    let mut next: u64 = 1;
    let mut queue: Vec<squeue::Entry> = vec![poll()];
    loop {
        let mut later = Vec::new();
        for e in queue.drain(..) {
            // SAFETY (both pushes): every pointer an entry holds (a watch's
            // siginfo) lives in `watches` until its completion is taken below.
            if unsafe { ring.submission().push(&e) }.is_err() {
                // The submission queue is full: hand it to the kernel, and
                // if it cannot take more now (its completions must be taken
                // first), push the rest after them.
                let _ = ring.submit();
                if unsafe { ring.submission().push(&e) }.is_err() {
                    later.push(e);
                }
            }
        }
        queue = later;
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            // EBUSY: completions to take first; anything else, the same.
            Err(_) => {}
        }
        let done: Vec<(u64, i32, bool)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result(), io_uring::cqueue::more(c.flags())))
            .collect();
        for (token, res, more) in done {
            if token == WAKE {
                let mut n: u64 = 0;
                // SAFETY: an 8-byte read into a live u64 from our eventfd.
                unsafe { libc::read(wake.as_raw_fd(), (&raw mut n).cast(), 8) };
                if !more {
                    queue.push(poll());
                }
                continue;
            }
            let Some(mut w) = watches.remove(&token) else {
                continue;
            };
            // SAFETY: the kernel filled the siginfo (or left it zeroed).
            let seen = unsafe { w.info.si_pid() };
            if res == 0 && seen != w.pid {
                // Ended without naming the child (the kernel's waitid wakes
                // on every child's change and looks again; should it answer
                // for another, or for none): wait again.
                let e = wait_entry(w.pid, &raw mut *w.info, token);
                watches.insert(token, w);
                queue.push(e);
                continue;
            }
            // The child exited, or the wait failed: either way its owner
            // looks for itself now.
            (w.done)();
            // Room for a burst's watches is given back once most ended
            // (the siginfo each points into is boxed, so moving it is safe;
            // `brood_runtime::room` says why and how).
            if watches.capacity() > 64 && watches.len() < watches.capacity() / 4 {
                watches.shrink_to((watches.len() * 2).max(64));
            }
        }
        let new: Vec<(i32, Callback)> =
            std::mem::take(&mut *shared.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for (pid, done) in new {
            let token = next;
            next += 1;
            // SAFETY: a zeroed siginfo_t is a valid value for the kernel to fill.
            let mut info: Box<libc::siginfo_t> = Box::new(unsafe { std::mem::zeroed() });
            let e = wait_entry(pid, &raw mut *info, token);
            watches.insert(token, Watch { pid, info, done });
            queue.push(e);
        }
    }
}

/// The asynchronous `waitid` for `pid`'s exit, writing into `info` (a
/// watch's own, which stays put until its completion is taken).
fn wait_entry(pid: i32, info: *mut libc::siginfo_t, token: u64) -> squeue::Entry {
    opcode::WaitId::new(
        libc::P_PID,
        pid as libc::id_t,
        libc::WEXITED | libc::WNOWAIT,
    )
    .infop(info.cast_const())
    .build()
    .user_data(token)
}

/// The thread starts inside `get_or_init`: its shared half is there once
/// that returns.
fn wait_for_shared() -> Option<&'static Option<Shared>> {
    loop {
        if let Some(s) = EXITS.get() {
            return Some(s);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
