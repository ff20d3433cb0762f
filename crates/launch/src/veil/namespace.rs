//! The one veiled mount namespace every agent joins: made by a forked child
//! that applies the veil and waits until the supervisor holds a descriptor
//! of its namespace, and joined by each agent between clone and exec.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::{PreparedVeil, VeilError, apply_in_child};

/// The veiled mount namespace every agent joins (see the module docs).
#[derive(Debug)]
pub struct VeilNamespace {
    fd: std::os::fd::OwnedFd,
    /// The root of the namespace's own `/proc`, when the veil covers it:
    /// what the sandbox anchors its `/proc` rule on.
    proc: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    signature: u64,
    hidden: Vec<String>,
    /// The errno of a failed `setns`, written by a spawned child (it shares
    /// the supervisor's memory, `crate::spawn`).
    failed: std::sync::atomic::AtomicI32,
}

impl VeilNamespace {
    /// The signature of the preparation it was made from.
    pub fn signature(&self) -> u64 {
        self.signature
    }

    /// The namespace's own `/proc` (an `O_PATH` descriptor of its root),
    /// when the veil covers the host's.
    pub fn proc_root(&self) -> Option<std::sync::Arc<std::os::fd::OwnedFd>> {
        self.proc.clone()
    }

    /// What is hidden, for `meta.json` and `brood doctor`.
    pub fn describe(&self) -> Vec<String> {
        self.hidden.clone()
    }

    /// After a spawn failed: the `setns` that failed, if it was that.
    pub fn child_failure(&self) -> Option<VeilError> {
        let errno = self.failed.load(Ordering::Acquire);
        (errno != 0).then(|| VeilError::Child {
            step: "joining brood's veiled mount namespace (setns) for",
            path: PathBuf::from(&self.hidden.join(", ")),
            source: io::Error::from_raw_os_error(errno),
        })
    }
}

/// Makes the veiled namespace: a forked child unshares its mount namespace
/// and applies `p` ([`apply_in_child`]), reports through a pipe, and waits;
/// the supervisor opens `/proc/<pid>/ns/mnt`, which keeps the namespace alive
/// after it kills the child. Needs `CAP_SYS_ADMIN` (the supervisor is root).
/// The child closes every descriptor but its end of the pipe first: a copy
/// of another thread's pipe (another supervisor's fork, in tests) would keep
/// that one waiting.
pub fn make_namespace(p: &PreparedVeil) -> Result<VeilNamespace, VeilError> {
    let io_err = |op: &'static str, source: io::Error| VeilError::Io {
        op,
        path: p.root_shown.clone(),
        source,
    };
    let pipe = || -> io::Result<[libc::c_int; 2]> {
        let mut fds = [-1; 2];
        // SAFETY: pipe2(2) into a two-element array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fds)
    };
    let report = pipe().map_err(|e| io_err("pipe for the veil's namespace of", e))?;
    // SAFETY: fork(2). The child makes raw syscalls on memory prepared before
    // the fork (async-signal-safe, signal-safety(7)) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; the child is single-threaded and owns its copies.
        unsafe {
            // Only the report's write end stays open (close_range(2)).
            let w = report[1] as libc::c_uint;
            if w > 3 {
                libc::syscall(libc::SYS_close_range, 3u32, w - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, w + 1, u32::MAX, 0u32);
            // Killed with the supervisor if it dies before killing this.
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            let word = match apply_in_child(p) {
                Ok(()) => 0u64,
                Err(_) => p.failure.word().max(1),
            };
            let b = word.to_ne_bytes();
            libc::write(report[1], b.as_ptr().cast(), b.len());
            // Until the supervisor holds the namespace and kills this.
            loop {
                libc::pause();
            }
        }
    }
    // SAFETY: closing the child's end, which this process no longer needs.
    unsafe { libc::close(report[1]) };
    let finish = |pid: libc::pid_t| {
        // SAFETY: SIGKILL to the child this function forked, then waitpid(2)
        // reaps it (ECHILD if a subreaper's loop got it first: as good).
        unsafe {
            libc::close(report[0]);
            if pid > 0 {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    };
    if pid < 0 {
        let e = io::Error::last_os_error();
        finish(pid);
        return Err(io_err("fork for the veil's namespace of", e));
    }
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: read(2) into the rest of a stack buffer.
        let n = unsafe { libc::read(report[0], b[got..].as_mut_ptr().cast(), b.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    if got < b.len() {
        finish(pid);
        return Err(io_err(
            "making the veil's namespace (the child died) for",
            io::Error::other("no report"),
        ));
    }
    let word = u64::from_ne_bytes(b);
    if word != 0 {
        finish(pid);
        p.failure.store(word);
        return Err(p.child_failure().unwrap_or_else(|| {
            io_err("making the veil's namespace of", io::Error::other("failed"))
        }));
    }
    let path = format!("/proc/{pid}/ns/mnt");
    let fd = std::fs::File::open(&path).map(std::os::fd::OwnedFd::from);
    // Its /proc, reached through the child's root (proc(5) /proc/PID/root),
    // while the child still lives in the namespace.
    let proc = match &p.proc {
        Some((_, at)) => {
            let inside =
                PathBuf::from(format!("/proc/{pid}/root")).join(at.strip_prefix("/").unwrap_or(at));
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(&inside);
            match opened {
                Ok(f) => Some(std::sync::Arc::new(std::os::fd::OwnedFd::from(f))),
                Err(e) => {
                    finish(pid);
                    return Err(VeilError::Io {
                        op: "opening the veil's /proc at",
                        path: inside,
                        source: e,
                    });
                }
            }
        }
        None => None,
    };
    finish(pid);
    let fd = fd.map_err(|e| VeilError::Io {
        op: "opening",
        path: PathBuf::from(path),
        source: e,
    })?;
    Ok(VeilNamespace {
        fd,
        proc,
        signature: p.signature,
        hidden: p.describe(),
        failed: std::sync::atomic::AtomicI32::new(0),
    })
}

/// Joins the veiled namespace, between clone and exec: `setns(2)`, which
/// also sets the root and working directory to the namespace's `/` (the
/// child's cwd is applied after this).
///
/// # Safety
/// Only between clone and exec in a single-threaded child made by
/// `crate::spawn` that has its own `fs_struct` (no `CLONE_FS`) and still holds
/// `CAP_SYS_ADMIN`; `ns` outlives the child's use of it.
pub unsafe fn join_in_child(ns: &VeilNamespace) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // Launches are one at a time (the spawner's thread): clear an earlier
    // child's failure.
    ns.failed.store(0, Ordering::Release);
    // SAFETY: setns(2) on a descriptor `ns` owns.
    if unsafe { libc::setns(ns.fd.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        let e = io::Error::last_os_error();
        ns.failed
            .store(e.raw_os_error().unwrap_or(libc::EINVAL), Ordering::Release);
        return Err(e);
    }
    Ok(())
}
