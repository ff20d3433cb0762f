//! The network namespace pool (see the parent module): empty network
//! namespaces, each with `lo` up, made ahead of need on a thread of their
//! own, each handed out once.

use std::io;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::Condvar;
use std::sync::Mutex;

/// Empty network namespaces made ahead of need (see the module docs): a thread
/// keeps `depth` of them ready, each with `lo` up, and [`NetnsPool::take`] hands
/// one out without waiting. Dropping the pool stops the thread and closes the
/// namespaces nobody took.
pub struct NetnsPool {
    shared: Arc<PoolShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct PoolShared {
    state: Mutex<PoolState>,
    wake: Condvar,
}

#[derive(Default)]
struct PoolState {
    ready: Vec<OwnedFd>,
    stop: bool,
    /// Why the thread gave up making namespaces, if it did.
    broken: Option<String>,
}

impl NetnsPool {
    /// Starts the pool's thread, which fills it at once.
    pub fn start(depth: usize) -> io::Result<NetnsPool> {
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState::default()),
            wake: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("brood-netns".into())
            .spawn(move || pool_thread(&theirs, depth.max(1)))?;
        Ok(NetnsPool {
            shared,
            thread: Some(thread),
        })
    }

    /// A fresh namespace if one is ready (the thread then makes the next);
    /// `None` when the pool is empty or broken: the child makes its own then.
    pub fn take(&self) -> Option<OwnedFd> {
        let mut st = self
            .shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fd = st.ready.pop();
        self.shared.wake.notify_one();
        fd
    }

    /// Why the pool makes no namespaces, if it stopped making them.
    pub fn broken(&self) -> Option<String> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .broken
            .clone()
    }
}

impl Drop for NetnsPool {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            // A panic of the thread leaves nothing to clean up: ignore it.
            let _ = t.join();
        }
    }
}

/// The pool's thread: `unshare(CLONE_NEWNET)` moves this thread alone into a new
/// namespace (unshare(2)); it brings `lo` up there, keeps a descriptor of it
/// (`/proc/thread-self/ns/net`), and the next unshare leaves it for the next one.
/// The thread never opens a socket of its own in any of them but the transient
/// one of `loopback_up`.
fn pool_thread(shared: &PoolShared, depth: usize) {
    loop {
        {
            let mut st = shared
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while !st.stop && st.ready.len() >= depth {
                st = shared
                    .wake
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if st.stop {
                return;
            }
        }
        let made = make_netns();
        let mut st = shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match made {
            Ok(fd) => st.ready.push(fd),
            Err(e) => {
                st.broken = Some(e.to_string());
                return;
            }
        }
    }
}

/// One empty network namespace with `lo` up, as a descriptor.
pub(super) fn make_netns() -> io::Result<OwnedFd> {
    // SAFETY: unshare(2) with one flag; it changes only this thread's namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::other(format!(
            "unshare(CLONE_NEWNET): {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: raw syscalls on a stack ifreq (see loopback_up).
    if unsafe { loopback_up() } != 0 {
        return Err(io::Error::other(format!(
            "bringing up lo: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: open(2) of a constant path; the fd is ours.
    let fd = unsafe {
        libc::open(
            c"/proc/thread-self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::other(format!(
            "opening /proc/thread-self/ns/net: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ip link set lo up` (netdevice(7) `SIOCGIFFLAGS`/`SIOCSIFFLAGS` on a datagram
/// socket); 0 or -1 with errno set.
///
/// # Safety
/// Raw syscalls only; for the child.
pub(super) unsafe fn loopback_up() -> libc::c_int {
    // SAFETY (whole body): socket(2), ioctl(2), close(2) on a zeroed stack ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return -1;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr);
        if r == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr);
        }
        if r != 0 {
            // Keep the ioctl's errno, not close's.
            let e = *libc::__errno_location();
            libc::close(fd);
            *libc::__errno_location() = e;
            return -1;
        }
        libc::close(fd);
        0
    }
}

/// One empty network namespace with `lo` up, made now on a thread of its
/// own (which ends): for a launch that needs its namespace before the
/// child exists when the pool has none ready.
pub fn fresh_netns() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("brood-netns-now".into())
        .spawn(make_netns)?
        .join()
        .map_err(|_| io::Error::other("the thread making a network namespace panicked"))?
}

/// A TCP listener on `127.0.0.1` (a port the kernel picks) inside the
/// network namespace `netns`: bound by a thread of its own that joins the
/// namespace and ends, so no other thread of the process moves; the socket
/// stays in that namespace, served from wherever its descriptor is (the
/// model gateway of an agent with no other network, issue 31).
pub fn bind_loopback_in(
    netns: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<std::net::TcpListener> {
    use std::os::fd::AsRawFd;
    let fd = netns.try_clone_to_owned()?;
    std::thread::Builder::new()
        .name("brood-netns-bind".into())
        .spawn(move || -> std::io::Result<std::net::TcpListener> {
            // SAFETY: setns(2) on a descriptor this thread owns; it moves
            // only this thread, which ends right after.
            if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            std::net::TcpListener::bind("127.0.0.1:0")
        })?
        .join()
        .map_err(|_| std::io::Error::other("the thread binding in a network namespace panicked"))?
}
