//! The veil: brood's own machinery out of every agent's reach, whatever its
//! policy grants (issue 11; docs/decisions.md "Brood's machinery is out of
//! reach").
//!
//! Agents started by a root supervisor run as uid 0 without capabilities. File
//! modes do not hold such a process back from root-owned files (it is their
//! owner), and a policy may inherit the operator's `/ rw`, which landlock can
//! only narrow by carving, at the cost of every write along the way (`/tmp`
//! included). So every agent runs in a mount namespace of brood's in which:
//!
//! * every cgroup hierarchy (v2 and each v1 controller) is covered by an empty
//!   read-only tmpfs: no `cgroup.procs` to move into, no limit to raise, no
//!   sibling's `cgroup.kill`;
//! * `$BROOD_ROOT` is covered by a read-only tmpfs into which only what agents
//!   use is bound back (`ctx`, the control socket, the `iso = ns` mount point):
//!   the store, its WAL and shared memory, the sweeper lock, the blobs and the
//!   configuration are gone from view;
//! * a store kept outside the root (and its WAL, shared memory and sweeper
//!   lock) is covered file by file with an empty read-only file.
//!
//! A covered path cannot be uncovered from inside: the agent holds no
//! `CAP_SYS_ADMIN` for `umount2(2)`, and a user namespace it makes gets copies
//! of these mounts *locked* together (mount_namespaces(7) "Restrictions on
//! mount namespaces"), so they cannot be taken apart there either. The
//! supervisor's own processes and every other agent keep their own views.
//!
//! # One namespace, joined by every agent
//!
//! The namespace is made once ([`make_namespace`]: a forked child applies the
//! veil to a fresh namespace, the supervisor keeps a descriptor of it and the
//! child exits) and every agent joins it between clone and exec
//! ([`join_in_child`], `setns(2)`). A namespace per agent would cost its
//! teardown at every exit: freeing a mount namespace waits for an RCU grace
//! period per mount, which made a cascade of 1,000 agents a tenth slower. An
//! agent may share the namespace because it cannot change it: it has no
//! `CAP_SYS_ADMIN` once its sandbox applies, and `iso = ns` makes its own copy
//! (`crate::ns` unshares after the join). [`PreparedVeil::signature`] says
//! when the namespace must be made again: what is covered and kept, and the
//! identity (device, inode) of each kept entry and covered file found, so a
//! control socket bound later, or a store's WAL that appeared, makes a new
//! one; agents already running keep theirs.
//!
//! Split like `crate::ns`: [`prepare`] runs in the supervisor (reads the mount
//! table, checks paths, builds C strings); [`apply_in_child`] runs in the
//! forked child with raw syscalls only, in this order:
//!
//! 1. `unshare(CLONE_NEWNS)` (unshare(2)), after the child joined its cgroups.
//! 2. `mount(MS_PRIVATE)` of each mount that gets something mounted on it, so
//!    nothing propagates back into the host's table (mount_namespaces(7)
//!    "Shared subtrees"). Only those few mounts, not `MS_REC` on `/`: the same
//!    effect for a fraction of the work.
//! 3. tmpfs(5) `ro,nosuid,nodev,noexec` on each cgroup cover.
//! 4. `open_tree(OPEN_TREE_CLONE)` (open_tree(2)) of each kept entry of
//!    `$BROOD_ROOT`: a detached copy of its mount, taken while the path still
//!    names the original (once the root is covered, it names the cover).
//! 5. tmpfs on `$BROOD_ROOT`; in it the mount points of what is kept (made with
//!    `mkdir`/`mknod`) and one empty file; `move_mount(2)` of each copy onto its
//!    mount point, and a bind (`MS_BIND`) of the empty file over each outside
//!    store file; then the tmpfs is remounted read-only, which makes the empty
//!    file read-only wherever it is bound.
//!
//! The child's working directory is set after this (a cwd taken before would
//! keep the covered directory reachable as `.`).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// What to hide, as the supervisor knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VeilSpec {
    /// Directories covered with an empty read-only tmpfs: the cgroup
    /// hierarchies ([`cgroup_covers`]).
    pub covers: Vec<PathBuf>,
    /// brood's root directory, covered with a read-only tmpfs.
    pub root: PathBuf,
    /// Entries directly under `root` bound back into that tmpfs (a missing
    /// one is skipped: nothing to reach).
    pub keep: Vec<OsString>,
    /// Files outside `root` covered by an empty read-only file; missing ones
    /// are skipped.
    pub files: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum VeilError {
    #[error("veil: {what}: {}", path.display())]
    BadPath { what: &'static str, path: PathBuf },
    #[error("veil: {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("veil layer, in the child: {step} {}: {source}", path.display())]
    Child {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// At most this many entries of the root are bound back (the child keeps
/// their detached copies in a fixed array: it may not allocate).
pub const MAX_KEEP: usize = 8;

// open_tree(2) and move_mount(2) flags (linux/mount.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// The name of the empty file the veil binds over outside store files. It is
/// in the covered root's tmpfs, so an agent sees it there, empty and read-only.
const EMPTY: &str = ".veil";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Unshare = 1,
    MakePrivate = 2,
    Cover = 3,
    Root = 4,
    MountPoint = 5,
    Keep = 6,
    File = 7,
    Seal = 8,
}

impl Step {
    const ALL: [Step; 8] = [
        Step::Unshare,
        Step::MakePrivate,
        Step::Cover,
        Step::Root,
        Step::MountPoint,
        Step::Keep,
        Step::File,
        Step::Seal,
    ];

    fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "unshare(CLONE_NEWNS) for",
            Step::MakePrivate => "mount(MS_PRIVATE) of",
            Step::Cover => "mount -t tmpfs (ro) over",
            Step::Root => "mount -t tmpfs over brood's root",
            Step::MountPoint => "making a mount point in the tmpfs over",
            Step::Keep => "bind mount (MS_BIND) back into the tmpfs:",
            Step::File => "bind mount of an empty file over",
            Step::Seal => "remounting read-only the tmpfs over",
        }
    }
}

#[derive(Debug)]
struct Kept {
    /// Host path of the original entry.
    source: CString,
    /// Its mount point in the tmpfs (the same path, covered).
    target: CString,
    dir: bool,
    shown: PathBuf,
}

/// Everything the child needs, ready in the parent.
#[derive(Debug)]
pub struct PreparedVeil {
    /// See [`PreparedVeil::signature`].
    signature: u64,
    private: Vec<(CString, PathBuf)>,
    covers: Vec<(CString, PathBuf)>,
    root: CString,
    root_shown: PathBuf,
    tmpfs_opts: CString,
    kept: Vec<Kept>,
    empty: CString,
    files: Vec<(CString, PathBuf)>,
    /// The failing step, index and errno, written by the child (it shares the
    /// supervisor's memory, `crate::spawn`).
    failure: AtomicU64,
}

fn bad(what: &'static str, p: &Path) -> VeilError {
    VeilError::BadPath {
        what,
        path: p.to_path_buf(),
    }
}

fn cstring(p: &Path) -> Result<CString, VeilError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| bad("a path with a NUL byte", p))
}

/// One line of /proc/self/mountinfo (proc(5)): mount point and filesystem type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountLine {
    pub point: PathBuf,
    pub fstype: String,
}

/// Parses /proc/self/mountinfo's text: the fifth field (octal escapes undone)
/// and the filesystem type after the ` - ` separator, in table order.
pub fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut halves = line.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else {
            continue;
        };
        let (Some(point), Some(fstype)) = (left.split(' ').nth(4), right.split(' ').next()) else {
            continue;
        };
        out.push(MountLine {
            point: PathBuf::from(OsString::from_vec_unescaped(point)),
            fstype: fstype.to_owned(),
        });
    }
    out
}

trait Unescape {
    fn from_vec_unescaped(s: &str) -> OsString;
}

impl Unescape for OsString {
    /// mountinfo writes space, tab, newline and backslash as `\ooo`.
    fn from_vec_unescaped(s: &str) -> OsString {
        use std::os::unix::ffi::OsStringExt;
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\'
                && i + 3 < b.len()
                && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
            {
                let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
                out.push(v);
                i += 4;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        OsString::from_vec(out)
    }
}

fn is_cgroup(fstype: &str) -> bool {
    fstype == "cgroup" || fstype == "cgroup2"
}

/// The directories to cover so that no cgroup hierarchy is reachable: the
/// mount point of every `cgroup`/`cgroup2` mount, collapsed into their common
/// parent mount when that parent holds nothing but cgroup mounts (the
/// `/sys/fs/cgroup` tmpfs of a v1 or hybrid host). One cover then hides every
/// hierarchy, and the symlinks between them (`cpu -> cpu,cpuacct`) with them.
pub fn cgroup_covers(mounts: &[MountLine]) -> Vec<PathBuf> {
    let points: Vec<&PathBuf> = mounts
        .iter()
        .filter(|m| is_cgroup(&m.fstype))
        .map(|m| &m.point)
        .collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in points {
        let cover = p
            .parent()
            .filter(|parent| {
                // A mount point of its own (not `/`), under which every mount is
                // a cgroup hierarchy.
                parent.parent().is_some()
                    && mounts.iter().any(|m| m.point == *parent)
                    && mounts
                        .iter()
                        .filter(|m| m.point != *parent && m.point.starts_with(parent))
                        .all(|m| is_cgroup(&m.fstype))
            })
            .map(Path::to_path_buf)
            .unwrap_or_else(|| p.clone());
        if !out.iter().any(|o| cover.starts_with(o)) {
            out.retain(|o| !o.starts_with(&cover));
            out.push(cover);
        }
    }
    out
}

/// The mount that a path lies on: the last mount in table order whose mount
/// point is the longest prefix of `p` (later mounts cover earlier ones).
fn containing_mount<'a>(mounts: &'a [MountLine], p: &Path) -> Option<&'a Path> {
    let mut best: Option<&Path> = None;
    for m in mounts {
        if p.starts_with(&m.point)
            && best.is_none_or(|b| m.point.as_os_str().len() >= b.as_os_str().len())
        {
            best = Some(&m.point);
        }
    }
    best
}

fn absolute_plain(p: &Path, what: &'static str) -> Result<(), VeilError> {
    let b = p.as_os_str().as_bytes();
    let ok = b.first() == Some(&b'/') && !b.split(|c| *c == b'/').any(|s| s == b"." || s == b"..");
    if ok { Ok(()) } else { Err(bad(what, p)) }
}

/// Checks the spec against the host's mount table and builds what
/// [`apply_in_child`] needs. Paths must be canonical (no symlink on the way),
/// since a mount follows symlinks.
pub fn prepare(spec: &VeilSpec) -> Result<PreparedVeil, VeilError> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| VeilError::Io {
        op: "reading",
        path: PathBuf::from("/proc/self/mountinfo"),
        source: e,
    })?;
    prepare_with(spec, &parse_mountinfo(&table))
}

/// [`prepare`] with the mount table given (tests, and callers that cache it).
pub fn prepare_with(spec: &VeilSpec, mounts: &[MountLine]) -> Result<PreparedVeil, VeilError> {
    absolute_plain(
        &spec.root,
        "brood's root must be an absolute path without . or ..",
    )?;
    let md = std::fs::symlink_metadata(&spec.root).map_err(|e| VeilError::Io {
        op: "stat",
        path: spec.root.clone(),
        source: e,
    })?;
    if !md.is_dir() {
        return Err(bad(
            "brood's root must be a directory, not a symlink",
            &spec.root,
        ));
    }
    let mut private: Vec<(CString, PathBuf)> = Vec::new();
    let mut want_private = |p: &Path| -> Result<(), VeilError> {
        let m = containing_mount(mounts, p)
            .ok_or_else(|| bad("no mount in /proc/self/mountinfo holds", p))?;
        if !private.iter().any(|(_, s)| s == m) {
            private.push((cstring(m)?, m.to_path_buf()));
        }
        Ok(())
    };
    let mut covers = Vec::new();
    for c in &spec.covers {
        absolute_plain(c, "a cover must be an absolute path without . or ..")?;
        want_private(c)?;
        covers.push((cstring(c)?, c.clone()));
    }
    want_private(&spec.root)?;
    if spec.keep.len() > MAX_KEEP {
        return Err(bad("more kept entries than MAX_KEEP under", &spec.root));
    }
    let mut kept = Vec::new();
    for name in &spec.keep {
        let b = name.as_bytes();
        if b.is_empty() || b.contains(&b'/') || b == b"." || b == b".." || name == OsStr::new(EMPTY)
        {
            return Err(bad("a kept entry must be one plain name", Path::new(name)));
        }
        let p = spec.root.join(name);
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                return Err(bad("a kept entry of brood's root is a symlink", &p));
            }
            Ok(md) => {
                let c = cstring(&p)?;
                kept.push(Kept {
                    source: c.clone(),
                    target: c,
                    dir: md.is_dir(),
                    shown: p,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(VeilError::Io {
                    op: "stat",
                    path: p,
                    source: e,
                });
            }
        }
    }
    let mut files = Vec::new();
    for f in &spec.files {
        absolute_plain(f, "a covered file must be an absolute path without . or ..")?;
        if f.starts_with(&spec.root) {
            // Already out of sight under the root's cover.
            continue;
        }
        match std::fs::symlink_metadata(f) {
            Ok(md) if md.is_dir() => {
                return Err(bad("a covered file is a directory", f));
            }
            Ok(md) if md.file_type().is_symlink() => {
                return Err(bad("a covered file is a symlink", f));
            }
            Ok(_) => {
                want_private(f)?;
                files.push((cstring(f)?, f.clone()));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(VeilError::Io {
                    op: "stat",
                    path: f.clone(),
                    source: e,
                });
            }
        }
    }
    let signature = {
        use std::hash::{Hash, Hasher};
        use std::os::unix::fs::MetadataExt;
        let mut h = std::hash::DefaultHasher::new();
        spec.covers.hash(&mut h);
        spec.root.hash(&mut h);
        for p in kept
            .iter()
            .map(|k| k.shown.as_path())
            .chain(files.iter().map(|f| f.1.as_path()))
        {
            p.hash(&mut h);
            if let Ok(md) = std::fs::symlink_metadata(p) {
                (md.dev(), md.ino()).hash(&mut h);
            }
        }
        for (_, m) in &private {
            m.hash(&mut h);
        }
        h.finish()
    };
    let inodes = kept.len() + 4;
    let tmpfs_opts = CString::new(format!("mode=755,size=16k,nr_inodes={inodes}"))
        .map_err(|_| bad("tmpfs options", &spec.root))?;
    Ok(PreparedVeil {
        signature,
        private,
        covers,
        root: cstring(&spec.root)?,
        root_shown: spec.root.clone(),
        tmpfs_opts,
        kept,
        empty: cstring(&spec.root.join(EMPTY))?,
        files,
        failure: AtomicU64::new(0),
    })
}

impl PreparedVeil {
    /// Equal for two preparations that make the same namespace: the same
    /// covers, root, kept entries and covered files, each kept entry and file
    /// the same one (device and inode) and the same ones missing.
    pub fn signature(&self) -> u64 {
        self.signature
    }

    /// After a spawn failed: which step of [`apply_in_child`] failed, on which
    /// path, with the errno; `None` if every veil step succeeded.
    pub fn child_failure(&self) -> Option<VeilError> {
        let w = self.failure.load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        let step = Step::ALL.into_iter().find(|s| *s as u64 == w >> 48)?;
        let index = ((w >> 32) & 0xffff) as usize;
        let errno = (w & 0xffff_ffff) as i32;
        let path = match step {
            Step::MakePrivate => self.private.get(index).map(|p| p.1.clone()),
            Step::Cover => self.covers.get(index).map(|p| p.1.clone()),
            Step::MountPoint | Step::Keep => self
                .kept
                .get(index)
                .map(|k| k.shown.clone())
                .or_else(|| Some(self.root_shown.join(EMPTY))),
            Step::File => self.files.get(index).map(|p| p.1.clone()),
            Step::Unshare | Step::Root | Step::Seal => Some(self.root_shown.clone()),
        };
        Some(VeilError::Child {
            step: step.describe(),
            path: path.unwrap_or_default(),
            source: io::Error::from_raw_os_error(errno),
        })
    }

    /// What is hidden, for `meta.json` and `brood doctor`.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .covers
            .iter()
            .map(|(_, p)| p.display().to_string())
            .collect();
        out.push(self.root_shown.display().to_string());
        out.extend(self.files.iter().map(|(_, p)| p.display().to_string()));
        out
    }
}

/// Applies the veil in the child (see the module docs for the steps).
///
/// # Safety
/// Only between clone and exec in a child made by `crate::spawn` that has its
/// own `fs_struct` (no `CLONE_FS`) and still holds `CAP_SYS_ADMIN`; raw
/// syscalls on memory `p` owns, nothing else.
pub unsafe fn apply_in_child(p: &PreparedVeil) -> io::Result<()> {
    p.failure.store(0, Ordering::Release);
    let fail = |step: Step, index: usize| -> io::Error {
        let e = io::Error::last_os_error();
        let errno = e.raw_os_error().unwrap_or(0) as u32 as u64;
        let w = ((step as u64) << 48) | (((index as u64) & 0xffff) << 32) | errno;
        p.failure.store(w, Ordering::Release);
        e
    };
    let null = ptr::null::<libc::c_char>();
    // SAFETY (whole block): raw syscalls with pointers to C strings owned by
    // `p`, which outlives the child's use of them (the spawner waits for exec).
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(fail(Step::Unshare, 0));
        }
        for (i, (m, _)) in p.private.iter().enumerate() {
            if libc::mount(null, m.as_ptr(), null, libc::MS_PRIVATE, ptr::null()) != 0 {
                return Err(fail(Step::MakePrivate, i));
            }
        }
        // Detached copies of what is kept, while the paths still name it.
        let mut copies = [-1 as libc::c_int; MAX_KEEP];
        let close_copies = |copies: &[libc::c_int; MAX_KEEP]| {
            for fd in copies.iter().filter(|fd| **fd >= 0) {
                libc::close(*fd);
            }
        };
        for (i, k) in p.kept.iter().enumerate() {
            let fd = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                k.source.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            );
            if fd < 0 {
                let e = fail(Step::Keep, i);
                close_copies(&copies);
                return Err(e);
            }
            copies[i] = fd as libc::c_int;
        }
        let result = cover_and_seal(p, &copies, &fail);
        close_copies(&copies);
        result
    }
}

/// Steps 3 and 5 of [`apply_in_child`], with the copies of step 4 in hand.
///
/// # Safety
/// As for [`apply_in_child`]; `copies` holds a detached mount per kept entry.
unsafe fn cover_and_seal(
    p: &PreparedVeil,
    copies: &[libc::c_int; MAX_KEEP],
    fail: &dyn Fn(Step, usize) -> io::Error,
) -> io::Result<()> {
    let null = ptr::null::<libc::c_char>();
    let hide = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY (whole block): as in apply_in_child.
    unsafe {
        for (i, (c, _)) in p.covers.iter().enumerate() {
            if libc::mount(
                c"tmpfs".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                hide | libc::MS_RDONLY,
                c"mode=555,size=4k,nr_inodes=1".as_ptr().cast(),
            ) != 0
            {
                return Err(fail(Step::Cover, i));
            }
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            p.root.as_ptr(),
            c"tmpfs".as_ptr(),
            hide,
            p.tmpfs_opts.as_ptr().cast(),
        ) != 0
        {
            return Err(fail(Step::Root, 0));
        }
        for (i, k) in p.kept.iter().enumerate() {
            let made = if k.dir {
                libc::mkdir(k.target.as_ptr(), 0o755)
            } else {
                libc::mknod(k.target.as_ptr(), libc::S_IFREG | 0o644, 0)
            };
            if made != 0 {
                return Err(fail(Step::MountPoint, i));
            }
        }
        if !p.files.is_empty() && libc::mknod(p.empty.as_ptr(), libc::S_IFREG | 0o444, 0) != 0 {
            return Err(fail(Step::MountPoint, usize::MAX & 0xffff));
        }
        for (i, k) in p.kept.iter().enumerate() {
            // The original entry itself: ownership and landlock still decide
            // what the agent may do inside it.
            if libc::syscall(
                libc::SYS_move_mount,
                copies[i],
                c"".as_ptr(),
                libc::AT_FDCWD,
                k.target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ) != 0
            {
                return Err(fail(Step::Keep, i));
            }
        }
        for (i, (f, _)) in p.files.iter().enumerate() {
            if libc::mount(
                p.empty.as_ptr(),
                f.as_ptr(),
                null,
                libc::MS_BIND,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::File, i));
            }
        }
        // Read-only for good: the superblock, so the empty file is read-only
        // wherever it is bound, and nothing can be made next to the kept entries.
        if libc::mount(
            null,
            p.root.as_ptr(),
            null,
            libc::MS_REMOUNT | libc::MS_RDONLY | hide,
            ptr::null(),
        ) != 0
        {
            return Err(fail(Step::Seal, 0));
        }
    }
    Ok(())
}

/// The veiled mount namespace every agent joins (see the module docs).
#[derive(Debug)]
pub struct VeilNamespace {
    fd: std::os::fd::OwnedFd,
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
                Err(_) => p.failure.load(Ordering::Acquire).max(1),
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
        p.failure.store(word, Ordering::Release);
        return Err(p.child_failure().unwrap_or_else(|| {
            io_err("making the veil's namespace of", io::Error::other("failed"))
        }));
    }
    let path = format!("/proc/{pid}/ns/mnt");
    let fd = std::fs::File::open(&path).map(std::os::fd::OwnedFd::from);
    finish(pid);
    let fd = fd.map_err(|e| VeilError::Io {
        op: "opening",
        path: PathBuf::from(path),
        source: e,
    })?;
    Ok(VeilNamespace {
        fd,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(point: &str, fstype: &str) -> MountLine {
        MountLine {
            point: PathBuf::from(point),
            fstype: fstype.into(),
        }
    }

    #[test]
    fn mountinfo_lines_are_parsed_with_escapes() {
        let text = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n\
                    30 22 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
                    31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    40 1 0:40 / /mnt/a\\040b rw - ext4 /dev/x rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1], line("/sys/fs/cgroup", "tmpfs"));
        assert_eq!(m[2], line("/sys/fs/cgroup/unified", "cgroup2"));
        assert_eq!(m[3].point, PathBuf::from("/mnt/a b"));
    }

    #[test]
    fn a_hybrid_host_is_covered_by_its_cgroup_tmpfs() {
        let m = vec![
            line("/", "ext4"),
            line("/sys", "sysfs"),
            line("/sys/fs/cgroup", "tmpfs"),
            line("/sys/fs/cgroup/unified", "cgroup2"),
            line("/sys/fs/cgroup/memory", "cgroup"),
            line("/sys/fs/cgroup/pids", "cgroup"),
        ];
        assert_eq!(cgroup_covers(&m), vec![PathBuf::from("/sys/fs/cgroup")]);
    }

    #[test]
    fn a_pure_v2_host_is_covered_at_its_one_mount() {
        let m = vec![
            line("/", "ext4"),
            line("/sys", "sysfs"),
            line("/sys/fs/cgroup", "cgroup2"),
        ];
        assert_eq!(cgroup_covers(&m), vec![PathBuf::from("/sys/fs/cgroup")]);
    }

    #[test]
    fn a_cgroup_mount_beside_other_mounts_is_covered_alone() {
        // Its parent holds a non-cgroup mount too: covering the parent would
        // hide what agents may use, so each hierarchy is covered where it is.
        let m = vec![
            line("/", "ext4"),
            line("/run", "tmpfs"),
            line("/run/cg", "cgroup2"),
            line("/run/user", "tmpfs"),
            line("/mnt/v1", "cgroup"),
        ];
        assert_eq!(
            cgroup_covers(&m),
            vec![PathBuf::from("/run/cg"), PathBuf::from("/mnt/v1")]
        );
    }

    #[test]
    fn the_containing_mount_is_the_longest_and_latest() {
        let m = vec![
            line("/", "ext4"),
            line("/tmp", "tmpfs"),
            line("/tmp", "tmpfs"),
            line("/tmp/x", "ext4"),
        ];
        assert_eq!(
            containing_mount(&m, Path::new("/tmp/y/z")),
            Some(Path::new("/tmp"))
        );
        assert_eq!(
            containing_mount(&m, Path::new("/tmp/x")),
            Some(Path::new("/tmp/x"))
        );
        assert_eq!(
            containing_mount(&m, Path::new("/var")),
            Some(Path::new("/"))
        );
    }

    #[test]
    fn kept_entries_are_plain_names_and_missing_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ctx")).unwrap();
        let m = vec![line("/", "ext4")];
        let mut spec = VeilSpec {
            covers: vec![],
            root: dir.path().to_path_buf(),
            keep: vec!["ctx".into(), "brood.sock".into()],
            files: vec![
                dir.path().join("brood.db"),
                PathBuf::from("/nonexistent/x.db"),
            ],
        };
        let p = prepare_with(&spec, &m).unwrap();
        assert_eq!(p.kept.len(), 1, "only ctx exists");
        assert!(p.kept[0].dir);
        assert!(
            p.files.is_empty(),
            "the db is under the root; the other is missing"
        );
        spec.keep = vec!["../etc".into()];
        assert!(matches!(
            prepare_with(&spec, &m),
            Err(VeilError::BadPath { .. })
        ));
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
        spec.keep = vec!["link".into()];
        let e = prepare_with(&spec, &m).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
    }
}
