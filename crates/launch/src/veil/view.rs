//! One agent's view of the ctx tree (issue 24: "an agent reads nothing of
//! another tree, even with `/ ro`").
//!
//! The veil binds `$BROOD_ROOT/ctx` back whole, and landlock can only add
//! grants: a policy that reads `/` reads every agent's control files,
//! transcripts and channels. So an agent whose grants reach the ctx tree
//! gets a mount namespace of its own, a copy of the veil's, in which `ctx`
//! is covered by an empty read-only tmpfs and only its own parts are bound
//! back ([`ViewSpec::keep`]: its object, its sessions with the channels to
//! its children, and its parent's channel to it, whose `artifact/` stays
//! writable). Everything else of the tree, other agents' objects included,
//! is simply not there.
//!
//! Like the veil, [`prepare_view`] does the work that allocates or can fail
//! usefully in the supervisor, and [`apply_view_in_child`] makes raw
//! syscalls only, between clone and exec, after the veil is joined and
//! before the working directory is set:
//!
//! 1. `unshare(CLONE_NEWNS)`, and `MS_PRIVATE` on `ctx`'s mount;
//! 2. `open_tree(OPEN_TREE_CLONE)` of each kept directory, while its path
//!    still names it;
//! 3. a tmpfs over `ctx`, the mount points made in it (parents first), each
//!    copy moved onto its point, read-only ones remounted `MS_RDONLY`;
//! 4. the tmpfs remounted read-only.
//!
//! A namespace per agent costs its teardown at exit (an RCU grace period
//! per mount), which is why only agents whose grants reach `ctx` get one.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

use super::{MOVE_MOUNT_F_EMPTY_PATH, OPEN_TREE_CLONE, StepFailure, VeilError, cstring};

/// At most this many directories are bound back (the child keeps their
/// detached copies in a fixed array: it may not allocate).
pub const MAX_VIEW_KEEP: usize = 8;

/// What one agent keeps of the ctx tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewSpec {
    /// `$BROOD_ROOT/ctx` (absolute, without symlinks).
    pub ctx: PathBuf,
    /// Directories under `ctx` bound back, each read-only unless `true`; a
    /// later one may lie inside an earlier one (it is mounted on top). A
    /// missing one is skipped.
    pub keep: Vec<(PathBuf, bool)>,
}

/// Everything the child needs, ready in the parent.
#[derive(Debug)]
pub struct PreparedView {
    ctx: CString,
    ctx_shown: PathBuf,
    /// (path, writable, shown)
    keep: Vec<(CString, bool, PathBuf)>,
    /// Mount points to make in the tmpfs, parents first.
    dirs: Vec<CString>,
    /// The failing step and index, and the errno, written by the child.
    failure: StepFailure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Unshare = 1,
    Private = 2,
    Copy = 3,
    Cover = 4,
    MountPoint = 5,
    Place = 6,
    ReadOnly = 7,
    Seal = 8,
}

impl Step {
    const ALL: [Step; 8] = [
        Step::Unshare,
        Step::Private,
        Step::Copy,
        Step::Cover,
        Step::MountPoint,
        Step::Place,
        Step::ReadOnly,
        Step::Seal,
    ];

    fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "unshare(CLONE_NEWNS) for the agent's view of",
            Step::Private => "mount(MS_PRIVATE) of",
            Step::Copy => "open_tree(OPEN_TREE_CLONE) of",
            Step::Cover => "mount -t tmpfs over",
            Step::MountPoint => "making a mount point in the view at",
            Step::Place => "move_mount into the view:",
            Step::ReadOnly => "remounting read-only in the view:",
            Step::Seal => "remounting read-only the tmpfs over",
        }
    }
}

/// Checks the spec against the filesystem and builds what the child needs.
pub fn prepare_view(spec: &ViewSpec) -> Result<PreparedView, VeilError> {
    let bad = |what: &'static str, p: &Path| VeilError::BadPath {
        what,
        path: p.to_path_buf(),
    };
    if !spec.ctx.is_absolute() {
        return Err(bad("the ctx tree must be an absolute path", &spec.ctx));
    }
    let mut keep = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (p, rw) in &spec.keep {
        let rel = p
            .strip_prefix(&spec.ctx)
            .map_err(|_| bad("a kept directory lies outside the ctx tree", p))?;
        if rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(bad("a kept directory must be a plain path under ctx", p));
        }
        match std::fs::symlink_metadata(p) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => return Err(bad("a kept entry of the view is not a directory", p)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(VeilError::Io {
                    op: "stat",
                    path: p.clone(),
                    source: e,
                });
            }
        }
        // Every directory from ctx down to it, unless an earlier kept one
        // already brings it (a mount point inside a bound directory exists).
        let inside_earlier = keep
            .iter()
            .any(|(_, _, shown): &(CString, bool, PathBuf)| p.starts_with(shown));
        if !inside_earlier {
            let mut d = spec.ctx.clone();
            for c in rel.components() {
                d.push(c);
                if !dirs.contains(&d) {
                    dirs.push(d.clone());
                }
            }
        }
        keep.push((cstring(p)?, *rw, p.clone()));
    }
    if keep.len() > MAX_VIEW_KEEP {
        return Err(bad(
            "more kept directories than MAX_VIEW_KEEP in",
            &spec.ctx,
        ));
    }
    Ok(PreparedView {
        ctx: cstring(&spec.ctx)?,
        ctx_shown: spec.ctx.clone(),
        keep,
        dirs: dirs.iter().map(|d| cstring(d)).collect::<Result<_, _>>()?,
        failure: StepFailure::default(),
    })
}

impl PreparedView {
    /// After a spawn failed: which step of [`apply_view_in_child`] failed, on
    /// which path, with the errno; `None` if every step succeeded.
    pub fn child_failure(&self) -> Option<VeilError> {
        let (step, index, errno) = self.failure.read()?;
        let step = Step::ALL.into_iter().find(|s| *s as u64 == step)?;
        let path = match step {
            Step::Copy | Step::Place | Step::ReadOnly => self.keep.get(index).map(|k| k.2.clone()),
            Step::MountPoint => self
                .dirs
                .get(index)
                .map(|d| PathBuf::from(std::ffi::OsStr::from_bytes(d.as_bytes()))),
            _ => None,
        };
        Some(VeilError::Child {
            step: step.describe(),
            path: path.unwrap_or_else(|| self.ctx_shown.clone()),
            source: io::Error::from_raw_os_error(errno),
        })
    }
}

/// Applies the view in the child (see the module docs for the steps).
///
/// # Safety
/// Only between clone and exec in a child made by `crate::spawn` that has
/// joined the veil, has its own `fs_struct` and still holds `CAP_SYS_ADMIN`;
/// raw syscalls on memory `p` owns, nothing else.
pub unsafe fn apply_view_in_child(p: &PreparedView) -> io::Result<()> {
    p.failure.clear();
    let fail = |step: Step, index: usize| p.failure.record(step as u8, index);
    let null = ptr::null::<libc::c_char>();
    let hide = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let mut copies = [-1 as libc::c_int; MAX_VIEW_KEEP];
    // SAFETY (whole block): raw syscalls with pointers to C strings owned by
    // `p`, which outlives the child's use of them (the spawner waits for exec).
    let result = unsafe {
        (|| -> io::Result<()> {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(fail(Step::Unshare, 0));
            }
            if libc::mount(null, p.ctx.as_ptr(), null, libc::MS_PRIVATE, ptr::null()) != 0 {
                return Err(fail(Step::Private, 0));
            }
            for (i, (k, _, _)) in p.keep.iter().enumerate() {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    k.as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                );
                if fd < 0 {
                    return Err(fail(Step::Copy, i));
                }
                copies[i] = fd as libc::c_int;
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                p.ctx.as_ptr(),
                c"tmpfs".as_ptr(),
                hide,
                c"mode=755,size=16k,nr_inodes=64".as_ptr().cast(),
            ) != 0
            {
                return Err(fail(Step::Cover, 0));
            }
            for (i, d) in p.dirs.iter().enumerate() {
                if libc::mkdir(d.as_ptr(), 0o755) != 0 {
                    return Err(fail(Step::MountPoint, i));
                }
            }
            for (i, (k, rw, _)) in p.keep.iter().enumerate() {
                if libc::syscall(
                    libc::SYS_move_mount,
                    copies[i],
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    k.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) != 0
                {
                    return Err(fail(Step::Place, i));
                }
                if !rw
                    && libc::mount(
                        null,
                        k.as_ptr(),
                        null,
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | hide,
                        ptr::null(),
                    ) != 0
                {
                    return Err(fail(Step::ReadOnly, i));
                }
            }
            if libc::mount(
                null,
                p.ctx.as_ptr(),
                null,
                libc::MS_REMOUNT | libc::MS_RDONLY | hide,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::Seal, 0));
            }
            Ok(())
        })()
    };
    for fd in copies.iter().filter(|fd| **fd >= 0) {
        // SAFETY: closing the copies this function opened.
        unsafe { libc::close(*fd) };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_made_parents_first_and_once() {
        let d = tempfile::tempdir().unwrap();
        let ctx = d.path().join("ctx");
        for sub in [
            "agent/a.d",
            "home/0/agent/a",
            "home/0/agent/p/session/default/context/child/a/artifact",
        ] {
            std::fs::create_dir_all(ctx.join(sub)).unwrap();
        }
        let chan = ctx.join("home/0/agent/p/session/default/context/child/a");
        let spec = ViewSpec {
            ctx: ctx.clone(),
            keep: vec![
                (ctx.join("agent/a.d"), false),
                (ctx.join("home/0/agent/a"), false),
                (chan.clone(), false),
                (chan.join("artifact"), true),
                (ctx.join("agent/missing.d"), false),
            ],
        };
        let p = prepare_view(&spec).unwrap();
        let dirs: Vec<String> = p
            .dirs
            .iter()
            .map(|c| {
                Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()))
                    .strip_prefix(&ctx)
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(
            dirs,
            [
                "agent",
                "agent/a.d",
                "home",
                "home/0",
                "home/0/agent",
                "home/0/agent/a",
                "home/0/agent/p",
                "home/0/agent/p/session",
                "home/0/agent/p/session/default",
                "home/0/agent/p/session/default/context",
                "home/0/agent/p/session/default/context/child",
                "home/0/agent/p/session/default/context/child/a",
            ]
        );
        // The missing one is skipped; the artifact dir is mounted inside its
        // channel, whose bind brings its mount point.
        assert_eq!(p.keep.len(), 4);
        assert!(p.keep[3].1);
    }

    #[test]
    fn paths_outside_ctx_or_with_dots_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let ctx = d.path().join("ctx");
        std::fs::create_dir_all(&ctx).unwrap();
        for bad in [d.path().to_path_buf(), ctx.join("agent/../../x")] {
            let e = prepare_view(&ViewSpec {
                ctx: ctx.clone(),
                keep: vec![(bad.clone(), false)],
            })
            .unwrap_err();
            assert!(matches!(e, VeilError::BadPath { .. }), "{bad:?}: {e}");
        }
    }
}
