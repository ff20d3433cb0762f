//! Namespaces for `iso = ns` (SPEC 5 "Enforcement is by the kernel"): a private
//! mount namespace built from the agent's mount table, then its `root` and `cwd`,
//! and for `network: none` an empty network namespace.
//!
//! Split the way the launcher needs it (LINUX-NOTES "Spawning from Rust"):
//! [`prepare`] runs in the supervisor and does everything that allocates, reads
//! the filesystem or can fail with a useful message: it checks the table, turns
//! every path into a `CString`, works out the mount flags and creates the mount
//! points inside the new root. [`apply_in_child`] runs between clone and exec and
//! makes raw syscalls only (signal-safety(7)), in this order:
//!
//! 1. `unshare(CLONE_NEWNS [| CLONE_NEWNET])` (unshare(2)): a private copy of the
//!    mount table, and an empty network stack with only `lo`; or, when a
//!    [`NetnsPool`] had one ready, `setns(2)` into that fresh namespace instead of
//!    making one here. It works here because the child is a process of its own with one thread (it shares
//!    only memory with the supervisor, `crate::spawn`).
//! 2. `mount(NULL, "/", NULL, MS_REC | MS_PRIVATE)` before anything else
//!    (mount_namespaces(7) "Shared subtrees"): otherwise the binds below could
//!    propagate back into the host's table.
//! 3. With a root: bind the root onto itself (pivot_root(2) needs `new_root` to
//!    be a mount point) and make that mount read-only, `nosuid`, `nodev`: the agent
//!    writes only where the table says `rw`. Non-recursive, so nothing mounted
//!    below the root on the host comes along.
//! 4. Each table entry, parents before children: `MS_BIND [| MS_REC]` of the
//!    source onto root+target, then the asked-for restrictions. A `bind` is
//!    restricted with `MS_REMOUNT | MS_BIND | flags` (mount(2) "Changing the
//!    mount flags of a bind mount"), keeping the flags the source already has so
//!    a remount never loosens it. An `rbind` is restricted with
//!    `mount_setattr(2)` and `AT_RECURSIVE`: a remount would change only the top
//!    mount and leave every submount writable.
//! 5. With `proc`: a fresh `proc` (`nosuid,nodev,noexec`) at root+`/proc`. It
//!    shows the mounting process's PID namespace (proc(5)), which is the agent's
//!    when the spawner's keeper namespace is in use.
//! 6. With `empty_network`: `lo` brought up (netdevice(7) `SIOCSIFFLAGS`), so an
//!    agent can still talk to itself over loopback; nothing else is reachable.
//! 7. With a root: `chdir(root); pivot_root(".", "."); umount2(".", MNT_DETACH)`
//!    (the pivot_root(2) idiom that needs no `put_old` directory): the host's
//!    tree is detached, not merely hidden as by chroot(2).
//! 8. `chdir(cwd)` (or `/` with a root).
//!
//! **Mount points.** The root is a scratch directory brood owns, so [`prepare`]
//! creates missing mount points inside it (directories, or an empty file for a
//! file source) and refuses any symlink on the way, which would make a mount land
//! elsewhere. A target below another entry's target lies inside that entry's
//! source, which is the user's data: there, and everywhere without a root, the
//! mount point must already exist; nothing is created.
//!
//! **The network namespace pool.** Making a network namespace is the dearest
//! step by far (about 0.6 ms here: the kernel registers every protocol's sysctls
//! for it), and it sat on every `network: none` start. A [`NetnsPool`] thread
//! makes a few ahead of need, each with `lo` up, and the child joins one with
//! `setns(2)`. Each is handed out once, to one agent, and dies with it, so the
//! isolation is the same as a namespace made in the child.
//!
//! A failing step in the child is recorded in a shared page, so the parent can
//! say which step and which path failed ([`PreparedNs::child_failure`]); the
//! spawn error itself only carries the errno.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

mod netns;

use netns::*;
pub use netns::{NetnsPool, bind_loopback_in, fresh_netns};

/// One mount table entry (SPEC 3 `source<TAB>target<TAB>ro|rw<TAB>options`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// A host path, absolute.
    pub source: PathBuf,
    /// Where it appears, absolute, inside the new root (or in the host's tree,
    /// privately, without a root).
    pub target: PathBuf,
    pub rw: bool,
    /// Recursive: submounts of `source` come along (and are restricted too).
    pub rbind: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// What `iso = ns` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsSpec {
    pub mounts: Vec<MountSpec>,
    /// A directory that becomes `/` (pivot_root). Brood's scratch directory: mount
    /// points are created in it.
    pub root: Option<PathBuf>,
    /// The root is a scratch tmpfs, mounted on `root` (an existing directory of
    /// the host) inside the new mount namespace only; the mount points are made
    /// in it there. Nothing of it is on the host's disk or outlives the agent.
    pub scratch: bool,
    /// The working directory, inside the new root.
    pub cwd: Option<PathBuf>,
    /// A new network namespace with only `lo` (brought up).
    pub empty_network: bool,
    /// A fresh `/proc` in the new root (meaningful in the agent's own PID
    /// namespace).
    pub proc: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NsError {
    #[error("mount namespace: {what}: {}", path.display())]
    BadPath { what: &'static str, path: PathBuf },
    #[error("mount namespace: {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mount namespace layer, in the child: {step} {}: {source}", path.display())]
    Child {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> NsError {
    NsError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn bad(what: &'static str, path: &Path) -> NsError {
    NsError::BadPath {
        what,
        path: path.to_path_buf(),
    }
}

/// mount_setattr(2) attributes (linux/mount.h).
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// `struct mount_attr` (linux/mount.h, `MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// How the child restricts one bind mount after making it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restrict {
    None,
    /// `mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | flags)`.
    Remount(libc::c_ulong),
    /// `mount_setattr(AT_FDCWD, target, AT_RECURSIVE, {attr_set})`.
    Recursive(u64),
}

/// A mount point the child makes in a scratch root.
#[derive(Debug)]
struct MountPoint {
    path: CString,
    /// An empty file (for a file source), else a directory.
    file: bool,
    /// Inside the root, for messages only.
    shown: PathBuf,
}

#[derive(Debug)]
struct PreparedMount {
    source: CString,
    /// root + target, as the child sees it before pivoting.
    target: CString,
    bind_flags: libc::c_ulong,
    restrict: Restrict,
    /// For messages only.
    target_shown: PathBuf,
}

/// The steps of [`apply_in_child`], numbered for the failure page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Unshare = 1,
    MakePrivate = 2,
    BindRoot = 3,
    RestrictRoot = 4,
    Bind = 5,
    Restrict = 6,
    Proc = 7,
    Loopback = 8,
    PivotRoot = 9,
    DetachOldRoot = 10,
    Chdir = 11,
    JoinNetwork = 12,
    Scratch = 13,
    MountPoint = 14,
}

impl Step {
    const ALL: [Step; 14] = [
        Step::Unshare,
        Step::MakePrivate,
        Step::BindRoot,
        Step::RestrictRoot,
        Step::Bind,
        Step::Restrict,
        Step::Proc,
        Step::Loopback,
        Step::PivotRoot,
        Step::DetachOldRoot,
        Step::Chdir,
        Step::JoinNetwork,
        Step::Scratch,
        Step::MountPoint,
    ];

    fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "unshare(CLONE_NEWNS | CLONE_NEWNET?) of",
            Step::MakePrivate => "mount(MS_REC | MS_PRIVATE) of",
            Step::BindRoot => "mount(MS_BIND) of the new root onto itself:",
            Step::RestrictRoot => "mount(MS_REMOUNT | MS_BIND | MS_RDONLY) of the new root",
            Step::Bind => "bind mount (MS_BIND) onto",
            Step::Restrict => "restricting (ro/nosuid/nodev/noexec) the mount at",
            Step::Proc => "mount -t proc at",
            Step::Loopback => "bringing up lo (SIOCSIFFLAGS) in the new network namespace for",
            Step::PivotRoot => "pivot_root into",
            Step::DetachOldRoot => "umount2(MNT_DETACH) of the old root, from",
            Step::Chdir => "chdir to",
            Step::JoinNetwork => "setns(CLONE_NEWNET) into a pooled network namespace for",
            Step::Scratch => "mount -t tmpfs (the scratch root) on",
            Step::MountPoint => "making the mount point in the scratch root",
        }
    }
}

/// One shared anonymous page (mmap(2) `MAP_SHARED | MAP_ANONYMOUS`) that a
/// forked child and its parent both see: the child stores the failing step there,
/// the parent reads it after the spawn failed. Atomics only: no locks in the child.
#[derive(Debug)]
struct FailurePage {
    word: NonNull<AtomicU64>,
}

// SAFETY: the page is only ever accessed through the AtomicU64, which is Sync; the
// mapping lives until Drop.
unsafe impl Send for FailurePage {}
// SAFETY: as above.
unsafe impl Sync for FailurePage {}

impl FailurePage {
    fn new() -> io::Result<FailurePage> {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                std::mem::size_of::<AtomicU64>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // The kernel zero-fills the page and aligns it, so it is a valid AtomicU64.
        NonNull::new(p.cast::<AtomicU64>())
            .map(|word| FailurePage { word })
            .ok_or_else(|| io::Error::other("mmap returned NULL"))
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping is live and aligned for as long as self (see new).
        unsafe { self.word.as_ref() }
    }
}

impl Drop for FailurePage {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once; no reference outlives self.
        unsafe { libc::munmap(self.word.as_ptr().cast(), std::mem::size_of::<AtomicU64>()) };
    }
}

/// Everything the child needs, ready in the parent. Reusable for many spawns
/// (one at a time: the failure page holds the last child's outcome).
#[derive(Debug)]
pub struct PreparedNs {
    unshare_flags: libc::c_int,
    root: Option<CString>,
    /// Flags the root's own filesystem has (statvfs(3)), kept when the root is
    /// remounted read-only.
    root_flags: libc::c_ulong,
    /// A scratch root: what the child makes in it, parents first.
    scratch: bool,
    points: Vec<MountPoint>,
    mounts: Vec<PreparedMount>,
    proc_target: Option<CString>,
    cwd: Option<CString>,
    loopback_up: bool,
    /// A fresh empty network namespace from the pool, to join instead of
    /// unsharing one (`setns`); kept open until the spawn is over.
    netns: Option<OwnedFd>,
    failure: FailurePage,
    /// For messages only.
    root_shown: PathBuf,
    cwd_shown: PathBuf,
}

/// A copyable handle to a [`PreparedNs`] for the child (or a `pre_exec` closure, which must be
/// `Send + Sync + 'static`). Valid while the `PreparedNs` lives: keep it alive
/// until the spawn returns.
#[derive(Debug, Clone, Copy)]
pub struct ChildNs(*const PreparedNs);

// SAFETY: the pointer is only dereferenced in the child (which shares the
// parent's memory), under the precondition of `ChildNs::apply`.
unsafe impl Send for ChildNs {}
// SAFETY: as above.
unsafe impl Sync for ChildNs {}

impl ChildNs {
    /// [`apply_in_child`] on the `PreparedNs` this handle came from.
    ///
    /// # Safety
    /// As for [`apply_in_child`], and that `PreparedNs` must still be alive in the
    /// parent when the child was forked (it is, while the spawn call runs).
    pub unsafe fn apply(self) -> io::Result<()> {
        // SAFETY: the caller guarantees the PreparedNs is alive.
        unsafe { apply_in_child(&*self.0) }
    }
}

impl PreparedNs {
    pub fn for_child(&self) -> ChildNs {
        ChildNs(self)
    }

    /// After a spawn failed: which step of [`apply_in_child`] failed, on which
    /// path, with the errno; `None` if the namespace steps all succeeded (the
    /// failure was elsewhere).
    pub fn child_failure(&self) -> Option<NsError> {
        let w = self.failure.word().load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        let step_no = (w >> 48) as u8;
        let index = ((w >> 32) & 0xffff) as usize;
        let errno = (w & 0xffff_ffff) as i32;
        let step = Step::ALL.into_iter().find(|s| *s as u8 == step_no)?;
        let path = match step {
            Step::Bind | Step::Restrict => self
                .mounts
                .get(index)
                .map(|m| m.target_shown.clone())
                .unwrap_or_default(),
            Step::MountPoint => self
                .points
                .get(index)
                .map(|m| m.shown.clone())
                .unwrap_or_default(),
            Step::Proc => PathBuf::from("/proc"),
            Step::Chdir => self.cwd_shown.clone(),
            _ => self.root_shown.clone(),
        };
        Some(NsError::Child {
            step: step.describe(),
            path,
            source: io::Error::from_raw_os_error(errno),
        })
    }
}

/// Absolute, no `.` or `..` component, no control character (SPEC 3), as bytes:
/// `Path::components` would silently drop a `.`.
fn check_abs(p: &Path, what: &'static str) -> Result<CString, NsError> {
    let b = p.as_os_str().as_bytes();
    let ok = b.first() == Some(&b'/')
        && !b.iter().any(|c| c.is_ascii_control())
        && !b.split(|c| *c == b'/').any(|s| s == b"." || s == b"..");
    if !ok {
        return Err(bad(what, p));
    }
    CString::new(b).map_err(|_| bad(what, p))
}

fn cstring(p: &Path) -> Result<CString, NsError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| bad("a path with a NUL byte", p))
}

/// The `MS_*` flags of the filesystem at `p` that a remount must keep
/// (statvfs(3) `f_flag`).
fn fs_flags(p: &Path) -> Result<libc::c_ulong, NsError> {
    let c = cstring(p)?;
    // SAFETY: statvfs(3) fills the zeroed struct; c is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io_err("statvfs", p, io::Error::last_os_error()));
    }
    let mut f = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
    ] {
        if st.f_flag & st_flag != 0 {
            f |= ms_flag;
        }
    }
    Ok(f)
}

/// Host-side path of `target` (absolute) inside `root`.
fn under(root: &Path, target: &Path) -> PathBuf {
    root.join(target.strip_prefix("/").unwrap_or(target))
}

/// Makes sure the mount point `root`+`target` exists, creating directories (and
/// the final empty file for a file source) below `root`, and refusing symlinks:
/// a mount follows them, and one could point out of the root.
fn make_mount_point(root: &Path, target: &Path, file: bool) -> Result<(), NsError> {
    let rel = target.strip_prefix("/").unwrap_or(target);
    let n = rel.components().count();
    let mut here = root.to_path_buf();
    for (i, comp) in rel.components().enumerate() {
        here.push(comp);
        let last = i + 1 == n;
        match fs::symlink_metadata(&here) {
            Ok(md) if md.file_type().is_symlink() => {
                return Err(bad(
                    "a symlink on the way to a mount point in the root",
                    &here,
                ));
            }
            Ok(md) if !last && !md.is_dir() => {
                return Err(bad("not a directory on the way to a mount point", &here));
            }
            Ok(md) if last && md.is_dir() == file => {
                return Err(bad(
                    "the mount point and its source are not both directories or both files",
                    &here,
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if last && file {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&here)
                        .map_err(|e| io_err("create mount point", &here, e))?;
                } else {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&here)
                        .map_err(|e| io_err("mkdir mount point", &here, e))?;
                }
            }
            Err(e) => return Err(io_err("stat", &here, e)),
        }
    }
    Ok(())
}

/// Checks that an existing mount point `p` has the right type and no symlink in
/// the part of its path below `from` (nothing is created there).
fn check_mount_point(from: &Path, p: &Path, file: bool) -> Result<(), NsError> {
    let mut here = from.to_path_buf();
    let rel = p.strip_prefix(from).unwrap_or(p);
    for comp in rel.components() {
        here.push(comp);
        let md = fs::symlink_metadata(&here).map_err(|e| io_err("stat mount point", &here, e))?;
        if md.file_type().is_symlink() {
            return Err(bad("a symlink on the way to a mount point", &here));
        }
    }
    let md = fs::metadata(p).map_err(|e| io_err("stat mount point", p, e))?;
    if md.is_dir() == file {
        return Err(bad(
            "the mount point and its source are not both directories or both files",
            p,
        ));
    }
    Ok(())
}

/// Checks the spec and builds everything [`apply_in_child`] needs (see the
/// module docs); creates missing mount points inside `root`.
pub fn prepare(spec: &NsSpec) -> Result<PreparedNs, NsError> {
    prepare_with(spec, None)
}

/// [`prepare`], joining `netns` (a fresh empty network namespace from a
/// [`NetnsPool`], `lo` already up) instead of making one in the child when the
/// spec asks for an empty network. Without an empty network, `netns` is dropped.
pub fn prepare_with(spec: &NsSpec, netns: Option<OwnedFd>) -> Result<PreparedNs, NsError> {
    let netns = netns.filter(|_| spec.empty_network);
    let root = match &spec.root {
        Some(r) => {
            let c = check_abs(r, "the root must be an absolute path without . or ..")?;
            if r == Path::new("/") {
                return Err(bad("the root must not be / (leave it unset instead)", r));
            }
            let md = fs::symlink_metadata(r).map_err(|e| io_err("stat root", r, e))?;
            if !md.is_dir() {
                return Err(bad("the root must be a directory (not a symlink)", r));
            }
            Some((r.clone(), c))
        }
        None => None,
    };

    // Parents before children, so a child's mount lands inside its parent's;
    // the sort is stable, so entries at one depth keep the table's order.
    let mut entries: Vec<&MountSpec> = spec.mounts.iter().collect();
    entries.sort_by_key(|m| m.target.components().count());

    let mut mounts: Vec<PreparedMount> = Vec::with_capacity(entries.len());
    let mut placed: Vec<(&Path, &Path)> = Vec::new(); // (target, source)
    let mut points: Vec<MountPoint> = Vec::new();
    // In a scratch root the child makes every mount point (the tmpfs is empty,
    // so no symlink can be on the way); in a named root this process does,
    // refusing symlinks.
    let mut make_point = |r: &Path, target: &Path, file: bool| -> Result<(), NsError> {
        if !spec.scratch {
            return make_mount_point(r, target, file);
        }
        let rel = target.strip_prefix("/").unwrap_or(target);
        let n = rel.components().count();
        let mut shown = PathBuf::from("/");
        for (i, comp) in rel.components().enumerate() {
            shown.push(comp);
            if points.iter().any(|p| p.shown == shown) {
                continue;
            }
            points.push(MountPoint {
                path: cstring(&under(r, &shown))?,
                file: file && i + 1 == n,
                shown: shown.clone(),
            });
        }
        Ok(())
    };
    for m in entries {
        let source = check_abs(&m.source, "a mount source must be absolute without . or ..")?;
        check_abs(&m.target, "a mount target must be absolute without . or ..")?;
        if m.target == Path::new("/") {
            return Err(bad("a mount target must not be / (use root)", &m.target));
        }
        let md = fs::metadata(&m.source).map_err(|e| io_err("stat mount source", &m.source, e))?;
        let file = !md.is_dir();
        let host_target = match &root {
            Some((r, _)) => under(r, &m.target),
            None => m.target.clone(),
        };
        // Below an earlier entry's target, the mount point is inside that entry's
        // source (the deepest such entry wins, as the mounts will stack).
        let parent = placed
            .iter()
            .filter(|(t, _)| m.target.starts_with(t) && m.target != *t)
            .max_by_key(|(t, _)| t.components().count());
        match (parent, &root) {
            (Some((t, s)), _) => {
                let inside = s.join(m.target.strip_prefix(t).unwrap_or(&m.target));
                check_mount_point(s, &inside, file)?;
            }
            (None, Some((r, _))) => make_point(r, &m.target, file)?,
            (None, None) => check_mount_point(Path::new("/"), &m.target, file)?,
        }
        let bind_flags = libc::MS_BIND | if m.rbind { libc::MS_REC } else { 0 };
        let wanted = [
            (!m.rw, libc::MS_RDONLY, MOUNT_ATTR_RDONLY),
            (m.nosuid, libc::MS_NOSUID, MOUNT_ATTR_NOSUID),
            (m.nodev, libc::MS_NODEV, MOUNT_ATTR_NODEV),
            (m.noexec, libc::MS_NOEXEC, MOUNT_ATTR_NOEXEC),
        ];
        let ms: libc::c_ulong = wanted.iter().filter(|w| w.0).map(|w| w.1).sum();
        let attr: u64 = wanted.iter().filter(|w| w.0).map(|w| w.2).sum();
        let restrict = if attr == 0 {
            Restrict::None
        } else if m.rbind {
            Restrict::Recursive(attr)
        } else {
            Restrict::Remount(libc::MS_REMOUNT | libc::MS_BIND | ms | fs_flags(&m.source)?)
        };
        mounts.push(PreparedMount {
            source,
            target: cstring(&host_target)?,
            bind_flags,
            restrict,
            target_shown: m.target.clone(),
        });
        placed.push((&m.target, &m.source));
    }

    let proc_target = if spec.proc {
        let at = match &root {
            Some((r, _)) => {
                make_point(r, Path::new("/proc"), false)?;
                under(r, Path::new("/proc"))
            }
            None => PathBuf::from("/proc"),
        };
        Some(cstring(&at)?)
    } else {
        None
    };
    let cwd = spec
        .cwd
        .as_deref()
        .map(|c| check_abs(c, "cwd must be absolute without . or .."))
        .transpose()?;
    let root_flags = match &root {
        // The tmpfs's own flags (see apply_in_child).
        Some(_) if spec.scratch => libc::MS_NOEXEC,
        Some((r, _)) => fs_flags(r)?,
        None => 0,
    };
    let failure = FailurePage::new().map_err(|e| io_err("mmap", Path::new("(failure page)"), e))?;
    let scratch = spec.scratch && root.is_some();
    Ok(PreparedNs {
        unshare_flags: libc::CLONE_NEWNS
            | if spec.empty_network && netns.is_none() {
                libc::CLONE_NEWNET
            } else {
                0
            },
        root_shown: root
            .as_ref()
            .map(|(r, _)| r.clone())
            .unwrap_or_else(|| PathBuf::from("/")),
        root: root.map(|(_, c)| c),
        root_flags,
        scratch,
        points,
        mounts,
        proc_target,
        cwd_shown: spec.cwd.clone().unwrap_or_default(),
        cwd,
        loopback_up: spec.empty_network && netns.is_none(),
        netns,
        failure,
    })
}

/// Applies `p` to the calling process: the steps of the module docs, in order.
/// On failure the step is recorded for [`PreparedNs::child_failure`] and the
/// errno returned.
///
/// Call it after the child joined its cgroups (so the namespaces' kernel memory
/// is charged to the agent) and before capabilities are dropped and landlock is
/// entered: both forbid mount(2) and pivot_root(2).
///
/// # Safety
/// Only in a freshly cloned, single-threaded child before exec: it changes the
/// process's root, working directory and namespaces. It makes raw syscalls only
/// (async-signal-safe, no allocation) on memory `p` prepared in the parent.
pub unsafe fn apply_in_child(p: &PreparedNs) -> io::Result<()> {
    let word = p.failure.word();
    word.store(0, Ordering::Release);
    let fail = |step: Step, index: usize| -> io::Error {
        let e = io::Error::last_os_error();
        let errno = e.raw_os_error().unwrap_or(0) as u32 as u64;
        let w = ((step as u64) << 48) | (((index as u64) & 0xffff) << 32) | errno;
        word.store(w, Ordering::Release);
        e
    };
    let null = ptr::null::<libc::c_char>();
    // SAFETY (whole block): raw syscalls with pointers to C strings and stack
    // values that live through each call; see the function's contract.
    unsafe {
        // unshare(2).
        if libc::unshare(p.unshare_flags) != 0 {
            return Err(fail(Step::Unshare, 0));
        }
        if let Some(fd) = &p.netns
            && libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0
        {
            return Err(fail(Step::JoinNetwork, 0));
        }
        // mount_namespaces(7): stop propagation both ways before any mount.
        if libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            ptr::null(),
        ) != 0
        {
            return Err(fail(Step::MakePrivate, 0));
        }
        if let Some(root) = &p.root {
            if p.scratch {
                // tmpfs(5), private to this namespace; a mount point, as
                // pivot_root(2) wants the new root to be.
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    root.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=755,size=64k,nr_inodes=4096".as_ptr().cast(),
                ) != 0
                {
                    return Err(fail(Step::Scratch, 0));
                }
                for (i, pt) in p.points.iter().enumerate() {
                    let made = if pt.file {
                        let fd = libc::open(
                            pt.path.as_ptr(),
                            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                            0o644 as libc::c_uint,
                        );
                        if fd >= 0 {
                            libc::close(fd);
                        }
                        fd >= 0
                    } else {
                        libc::mkdir(pt.path.as_ptr(), 0o755) == 0
                    };
                    if !made {
                        return Err(fail(Step::MountPoint, i));
                    }
                }
            } else if libc::mount(
                // pivot_root(2): new_root must be a mount point.
                root.as_ptr(),
                root.as_ptr(),
                null,
                libc::MS_BIND,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::BindRoot, 0));
            }
            // mount(2) "Changing the mount flags of a bind mount".
            let flags = libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | p.root_flags;
            if libc::mount(null, root.as_ptr(), null, flags, ptr::null()) != 0 {
                return Err(fail(Step::RestrictRoot, 0));
            }
        }
        for (i, m) in p.mounts.iter().enumerate() {
            // mount(2) "Creating a bind mount".
            if libc::mount(
                m.source.as_ptr(),
                m.target.as_ptr(),
                null,
                m.bind_flags,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::Bind, i));
            }
            let restricted = match m.restrict {
                Restrict::None => 0,
                Restrict::Remount(flags) => {
                    libc::mount(null, m.target.as_ptr(), null, flags, ptr::null())
                }
                Restrict::Recursive(attr_set) => {
                    // mount_setattr(2), Linux 5.12: every mount of the tree.
                    let attr = MountAttr {
                        attr_set,
                        attr_clr: 0,
                        propagation: 0,
                        userns_fd: 0,
                    };
                    libc::syscall(
                        libc::SYS_mount_setattr,
                        libc::AT_FDCWD,
                        m.target.as_ptr(),
                        libc::AT_RECURSIVE as libc::c_uint,
                        &attr as *const MountAttr,
                        std::mem::size_of::<MountAttr>(),
                    ) as libc::c_int
                }
            };
            if restricted != 0 {
                return Err(fail(Step::Restrict, i));
            }
        }
        if let Some(at) = &p.proc_target {
            // proc(5): a new instance for the caller's PID namespace.
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            if libc::mount(
                c"proc".as_ptr(),
                at.as_ptr(),
                c"proc".as_ptr(),
                flags,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::Proc, 0));
            }
        }
        if p.loopback_up && loopback_up() != 0 {
            return Err(fail(Step::Loopback, 0));
        }
        if let Some(root) = &p.root {
            // pivot_root(2) NOTES: pivot_root(".", ".") stacks the old root on
            // the new one; detaching "." then drops the old root.
            if libc::chdir(root.as_ptr()) != 0 {
                return Err(fail(Step::PivotRoot, 0));
            }
            if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0 {
                return Err(fail(Step::PivotRoot, 0));
            }
            if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
                return Err(fail(Step::DetachOldRoot, 0));
            }
            if libc::chdir(c"/".as_ptr()) != 0 {
                return Err(fail(Step::Chdir, 0));
            }
        }
        if let Some(cwd) = &p.cwd
            && libc::chdir(cwd.as_ptr()) != 0
        {
            return Err(fail(Step::Chdir, 0));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
