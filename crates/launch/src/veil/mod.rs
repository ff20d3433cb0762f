//! The veil: brood's own machinery out of every agent's reach, whatever its
//! policy grants (issue 11; docs/decisions/containment.md "Brood's machinery
//! is out of reach: the veil").
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
//!   lock) is covered file by file with an empty read-only file;
//! * `/proc` is a fresh proc(5) mounted with `hidepid=ptraceable` (issue 24):
//!   a process sees only the processes it may ptrace, and landlock lets a
//!   sandboxed process ptrace only its own domain, so an agent sees its own
//!   processes and none of the supervisor's, the host's or another agent's
//!   (their command lines and environments included). The sandbox's `/proc`
//!   rule is anchored on this mount ([`VeilNamespace::proc_root`]), not on
//!   the host's.
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
//! 2. `mount(MS_REC | MS_PRIVATE)` of `/`, so nothing propagates back into
//!    the host's table (mount_namespaces(7) "Shared subtrees"), and so the
//!    copies that agents' own views make of this namespace (`view`) join no
//!    peer group of the host's: with shared mounts every view would grow
//!    those groups and make each later mount operation walk them. Done once
//!    per namespace, not per agent.
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
use std::sync::atomic::{AtomicU64, Ordering};

/// What to hide, as the supervisor knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VeilSpec {
    /// Directories covered with an empty read-only tmpfs: the cgroup
    /// hierarchies ([`cgroup_covers`]) and the supervisors' liveness marks
    /// (`cgroup::alive`).
    pub covers: Vec<PathBuf>,
    /// brood's root directory, covered with a read-only tmpfs.
    pub root: PathBuf,
    /// Entries directly under `root` bound back into that tmpfs (a missing
    /// one is skipped: nothing to reach).
    pub keep: Vec<OsString>,
    /// Files outside `root` covered by an empty read-only file; missing ones
    /// are skipped.
    pub files: Vec<PathBuf>,
    /// Where proc(5) is mounted (`/proc`), to cover with a fresh one that
    /// hides other processes; `None` leaves the host's.
    pub proc: Option<PathBuf>,
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
    Proc = 9,
}

impl Step {
    const ALL: [Step; 9] = [
        Step::Unshare,
        Step::MakePrivate,
        Step::Cover,
        Step::Root,
        Step::MountPoint,
        Step::Keep,
        Step::File,
        Step::Seal,
        Step::Proc,
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
            Step::Proc => "mount -t proc -o hidepid=ptraceable over",
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
    covers: Vec<(CString, PathBuf)>,
    root: CString,
    root_shown: PathBuf,
    tmpfs_opts: CString,
    kept: Vec<Kept>,
    empty: CString,
    files: Vec<(CString, PathBuf)>,
    proc: Option<(CString, PathBuf)>,
    /// The failing step, index and errno, written by the child (it shares the
    /// supervisor's memory, `crate::spawn`).
    failure: StepFailure,
}

fn bad(what: &'static str, p: &Path) -> VeilError {
    VeilError::BadPath {
        what,
        path: p.to_path_buf(),
    }
}

/// Which step of a child's work failed, on which of its paths, and the
/// errno: one word in memory the child shares with the supervisor
/// (`CLONE_VM`, or written back through a pipe by a forked child).
#[derive(Debug, Default)]
pub(crate) struct StepFailure(AtomicU64);

impl StepFailure {
    /// In the child: forgets an earlier child's failure.
    pub(crate) fn clear(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// In the child: records `step` (non-zero) and `index` with the last OS
    /// error, and returns that error.
    pub(crate) fn record(&self, step: u8, index: usize) -> io::Error {
        let e = io::Error::last_os_error();
        let errno = e.raw_os_error().unwrap_or(0) as u32 as u64;
        self.store((u64::from(step) << 48) | (((index as u64) & 0xffff) << 32) | errno);
        e
    }

    pub(crate) fn word(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn store(&self, word: u64) {
        self.0.store(word, Ordering::Release);
    }

    /// The step's number, the index and the errno, if a step failed.
    pub(crate) fn read(&self) -> Option<(u64, usize, i32)> {
        let w = self.word();
        (w != 0).then_some((
            w >> 48,
            ((w >> 32) & 0xffff) as usize,
            (w & 0xffff_ffff) as i32,
        ))
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
    let proc = match &spec.proc {
        Some(p) => {
            absolute_plain(
                p,
                "proc's mount point must be an absolute path without . or ..",
            )?;
            want_private(p)?;
            Some((cstring(p)?, p.clone()))
        }
        None => None,
    };
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
        spec.proc.hash(&mut h);
        h.finish()
    };
    let inodes = kept.len() + 4;
    let tmpfs_opts = CString::new(format!("mode=755,size=16k,nr_inodes={inodes}"))
        .map_err(|_| bad("tmpfs options", &spec.root))?;
    Ok(PreparedVeil {
        signature,
        covers,
        root: cstring(&spec.root)?,
        root_shown: spec.root.clone(),
        tmpfs_opts,
        kept,
        empty: cstring(&spec.root.join(EMPTY))?,
        files,
        proc,
        failure: StepFailure::default(),
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
        let (step, index, errno) = self.failure.read()?;
        let step = Step::ALL.into_iter().find(|s| *s as u64 == step)?;
        let path = match step {
            Step::MakePrivate => Some(PathBuf::from("/")),
            Step::Cover => self.covers.get(index).map(|p| p.1.clone()),
            Step::MountPoint | Step::Keep => self
                .kept
                .get(index)
                .map(|k| k.shown.clone())
                .or_else(|| Some(self.root_shown.join(EMPTY))),
            Step::File => self.files.get(index).map(|p| p.1.clone()),
            Step::Unshare | Step::Root | Step::Seal => Some(self.root_shown.clone()),
            Step::Proc => self.proc.as_ref().map(|p| p.1.clone()),
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

mod child;
mod namespace;
#[cfg(test)]
mod tests;
mod view;

pub use child::apply_in_child;
pub use namespace::{VeilNamespace, join_in_child, make_namespace};
pub use view::{MAX_VIEW_KEEP, PreparedView, ViewSpec, apply_view_in_child, prepare_view};
