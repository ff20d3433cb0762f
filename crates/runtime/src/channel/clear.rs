//! Emptying a channel's `artifact/` of what a child left there (issue 24
//! item 6): everything when its result was refused or never recorded, all
//! but the recorded artifacts otherwise, so that neither the live tree nor
//! a rebuilt one keeps bytes no record accounts for.
//!
//! It runs only once the child's whole group is dead (as collection does),
//! so nothing swaps an entry while it is removed; what the child left is
//! still hostile:
//!
//! * **No link is followed.** The walk goes by directory descriptors opened
//!   with `openat2(2)` `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, each entry is
//!   looked at with `AT_SYMLINK_NOFOLLOW`, and `unlinkat(2)` removes a link
//!   itself, never what it points at.
//! * **Its modes do not stop it.** A directory the child made unreadable or
//!   unwritable (mode 000) is given back `0700` before it is entered or
//!   emptied: a supervisor run by a user owns what its agents made, a root
//!   one may change any mode.
//! * **A later run is never touched.** A run that ends without a result
//!   while processes of its group may still live has its `artifact/` set
//!   aside at once ([`set_aside`]: exchanged, atomically, with a new empty
//!   directory, so it becomes `.artifact.<run>`), and only the set-aside is
//!   emptied and removed once the group is dead ([`remove_set_aside`]): a
//!   resume that starts meanwhile writes into the new one.
//! * **Its depth does not exhaust descriptors.** At most [`HELD`] directories
//!   are open at once; a directory deeper than that is moved up to
//!   `artifact/` under a fresh name and emptied from there, so a chain of a
//!   million nested directories costs a million renames, not a million
//!   descriptors.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;

/// Directories held open at once while emptying one tree; deeper ones are
/// moved up. More than [`super::MAX_DEPTH`], so a directory that holds a
/// recorded artifact is never moved.
const HELD: usize = 64;

/// What [`clear`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cleared {
    pub entries: u64,
}

/// Removes everything below `channel/artifact` except the regular files
/// whose names (relative to `artifact/`, as the channel records them) are in
/// `keep`, and the directories that hold them. A missing `artifact/` is
/// nothing to do.
pub fn clear(channel: &Path, keep: &BTreeSet<String>) -> io::Result<Cleared> {
    empty_named(channel, c"artifact", keep, false)
}

/// Where [`set_aside`] moves a run's `artifact/`: a name no artifact has
/// (the child writes only below `artifact/`).
const SET_ASIDE: &str = ".artifact.";

/// Moves `channel/artifact` aside as `.artifact.<tag>` and puts an empty
/// `artifact/`, with the owner the old one had, in its place, in one atomic
/// `renameat2(RENAME_EXCHANGE)` (no moment without an `artifact/`): what a
/// run that ended left is out of the way of the next run at once, and
/// [`remove_set_aside`] removes it once its group is dead. `None` when there
/// is no `artifact/`.
pub fn set_aside(channel: &Path, tag: &str) -> io::Result<Option<String>> {
    let ch = open_channel(channel)?;
    let old = match rustix::fs::statat(&ch, c"artifact", AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(named(&channel.join("artifact"), e)),
    };
    let name = format!("{SET_ASIDE}{tag}");
    let shown = channel.join(&name);
    rustix::fs::mkdirat(&ch, name.as_str(), Mode::from_raw_mode(0o755))
        .map_err(|e| named(&shown, e))?;
    let swapped = rustix::fs::chownat(
        &ch,
        name.as_str(),
        Some(rustix::fs::Uid::from_raw(old.st_uid)),
        Some(rustix::fs::Gid::from_raw(old.st_gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .and_then(|()| {
        rustix::fs::renameat_with(&ch, c"artifact", &ch, name.as_str(), RenameFlags::EXCHANGE)
    });
    if let Err(e) = swapped {
        let _ = rustix::fs::unlinkat(&ch, name.as_str(), AtFlags::REMOVEDIR);
        return Err(named(&shown, e));
    }
    Ok(Some(name))
}

/// Empties and removes what [`set_aside`] moved aside (the run's group
/// being dead).
pub fn remove_set_aside(channel: &Path, name: &str) -> io::Result<Cleared> {
    let c = CString::new(name).map_err(|_| io::Error::other("a NUL in a set-aside name"))?;
    empty_named(channel, &c, &BTreeSet::new(), true)
}

/// The directories [`set_aside`] left in `channel` (a supervisor that died
/// before removing them), for `brood fsck`.
pub fn set_aside_in(channel: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(channel) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(SET_ASIDE))
        .collect()
}

fn open_channel(channel: &Path) -> io::Result<OwnedFd> {
    rustix::fs::open(
        channel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| named(channel, e))
}

/// Empties `channel/<dir>` of all but `keep`, and removes it when `remove`.
fn empty_named(
    channel: &Path,
    dir: &std::ffi::CStr,
    keep: &BTreeSet<String>,
    remove: bool,
) -> io::Result<Cleared> {
    let ch = open_channel(channel)?;
    let shown = channel.join(dir.to_string_lossy().as_ref());
    let root = match open_dir(ch.as_fd(), dir) {
        Ok(d) => d,
        Err(Errno::NOENT) => return Ok(Cleared::default()),
        // The child may have shut its own `artifact/`: given back `0700`.
        Err(Errno::ACCESS) => {
            rustix::fs::chmodat(&ch, dir, Mode::from_raw_mode(0o700), AtFlags::empty())
                .map_err(|e| named(&shown, e))?;
            open_dir(ch.as_fd(), dir).map_err(|e| named(&shown, e))?
        }
        Err(e) => return Err(named(&shown, e)),
    };
    let mut holds: BTreeSet<String> = BTreeSet::new();
    for k in keep {
        let mut at = Path::new(k.as_str()).parent();
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
            holds.insert(p.to_string_lossy().into_owned());
            at = p.parent();
        }
    }
    let mut c = Clearing {
        root: &root,
        keep,
        holds: &holds,
        moved: Vec::new(),
        spill: 0,
        done: Cleared::default(),
    };
    c.empty(&root, Some(""), 0).map_err(|e| named(&shown, e))?;
    while let Some(name) = c.moved.pop() {
        let sub = open_dir(root.as_fd(), &name).map_err(|e| named(&shown, e))?;
        c.empty(&sub, None, 1).map_err(|e| named(&shown, e))?;
        drop(sub);
        c.remove(root.as_fd(), &name, true)
            .map_err(|e| named(&shown, e))?;
    }
    let mut done = c.done;
    drop(root);
    if remove {
        match rustix::fs::unlinkat(&ch, dir, AtFlags::REMOVEDIR) {
            Ok(()) => done.entries += 1,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(named(&shown, e)),
        }
    }
    Ok(done)
}

struct Clearing<'a> {
    root: &'a OwnedFd,
    keep: &'a BTreeSet<String>,
    /// The directories that hold a kept file (every ancestor of one).
    holds: &'a BTreeSet<String>,
    /// Directories moved up to `artifact/`, to be emptied and removed.
    moved: Vec<CString>,
    spill: u64,
    done: Cleared,
}

impl Clearing<'_> {
    /// Empties `dir` (`depth` levels down) of all it should not keep: `rel`
    /// is its name under `artifact/` when it holds kept files, `None` when
    /// nothing below it is kept.
    fn empty(&mut self, dir: &OwnedFd, rel: Option<&str>, depth: usize) -> Result<(), Errno> {
        let mut names: Vec<CString> = Vec::new();
        let listing = match Dir::read_from(dir) {
            Ok(l) => l,
            Err(Errno::ACCESS) => {
                rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700))?;
                Dir::read_from(dir)?
            }
            Err(e) => return Err(e),
        };
        for e in listing {
            let e = e?;
            let n = e.file_name();
            if n != c"." && n != c".." {
                names.push(n.to_owned());
            }
        }
        for name in names {
            let st = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e),
            };
            let kind = FileType::from_raw_mode(st.st_mode);
            // A name that is not UTF-8 is in no record: it goes.
            let path = rel.zip(name.to_str().ok()).map(|(rel, n)| {
                if rel.is_empty() {
                    n.to_owned()
                } else {
                    format!("{rel}/{n}")
                }
            });
            let kept = |set: &BTreeSet<String>| path.as_ref().is_some_and(|p| set.contains(p));
            match kind {
                FileType::Directory if kept(self.holds) => {
                    let sub = self.enter(dir, &name)?;
                    self.empty(&sub, path.as_deref(), depth + 1)?;
                }
                FileType::Directory if depth + 1 >= HELD => {
                    // Too deep to hold open: moved up and emptied later.
                    let to = self.move_up(dir, &name)?;
                    self.moved.push(to);
                }
                FileType::Directory => {
                    let sub = self.enter(dir, &name)?;
                    self.empty(&sub, None, depth + 1)?;
                    drop(sub);
                    self.remove(dir.as_fd(), &name, true)?;
                }
                FileType::RegularFile if kept(self.keep) => {}
                _ => self.remove(dir.as_fd(), &name, false)?,
            }
        }
        Ok(())
    }

    /// Opens a subdirectory, giving it `0700` first when its mode shuts the
    /// supervisor out.
    fn enter(&self, dir: &OwnedFd, name: &CString) -> Result<OwnedFd, Errno> {
        match open_dir(dir.as_fd(), name) {
            Err(Errno::ACCESS) => {
                // The child is dead and the entry was just seen to be a
                // directory, so the name still is one.
                rustix::fs::chmodat(
                    dir,
                    name.as_c_str(),
                    Mode::from_raw_mode(0o700),
                    AtFlags::empty(),
                )?;
                open_dir(dir.as_fd(), name)
            }
            r => r,
        }
    }

    /// Removes one entry (a directory, once empty); on `EACCES` the
    /// directory it is in is given `0700` and the removal tried again.
    fn remove(&mut self, dir: BorrowedFd<'_>, name: &CString, is_dir: bool) -> Result<(), Errno> {
        let flags = if is_dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let r = match rustix::fs::unlinkat(dir, name.as_c_str(), flags) {
            Err(Errno::ACCESS | Errno::PERM) => {
                rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700))?;
                rustix::fs::unlinkat(dir, name.as_c_str(), flags)
            }
            r => r,
        };
        match r {
            Ok(()) => {
                self.done.entries += 1;
                Ok(())
            }
            Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Moves a directory up to `artifact/` under a name nothing has.
    fn move_up(&mut self, dir: &OwnedFd, name: &CString) -> Result<CString, Errno> {
        loop {
            self.spill += 1;
            let to =
                CString::new(format!(".brood-deep-{}", self.spill)).map_err(|_| Errno::INVAL)?;
            let moved = rustix::fs::renameat_with(
                dir,
                name.as_c_str(),
                self.root,
                to.as_c_str(),
                RenameFlags::NOREPLACE,
            );
            match moved {
                Ok(()) => return Ok(to),
                Err(Errno::EXIST) => continue,
                Err(Errno::ACCESS) => {
                    // Renaming a directory writes its `..`: it needs `0700` too.
                    rustix::fs::chmodat(
                        dir,
                        name.as_c_str(),
                        Mode::from_raw_mode(0o700),
                        AtFlags::empty(),
                    )?;
                    rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700))?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn open_dir(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH,
    )
}

fn named(path: &Path, e: Errno) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn tree(d: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in walk(&d.join("artifact")) {
            out.push(
                e.strip_prefix(d.join("artifact"))
                    .unwrap()
                    .display()
                    .to_string(),
            );
        }
        out.sort();
        out
    }

    fn walk(p: &Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    /// What a hostile child leaves: files, a link out of the channel, a
    /// FIFO, a directory of mode 000 holding a file, one it may not write,
    /// and a chain of directories deeper than the walk holds open. All of
    /// it goes; what the link points at stays.
    #[test]
    fn everything_goes_and_nothing_outside_is_touched() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("artifact");
        fs::create_dir_all(a.join("sub")).unwrap();
        fs::write(a.join("x"), "x").unwrap();
        fs::write(a.join("sub/y"), "y").unwrap();
        fs::create_dir(d.path().join("outside")).unwrap();
        fs::write(d.path().join("outside/keep-me"), "mine").unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), a.join("link")).unwrap();
        let fifo = CString::new(a.join("fifo").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        fs::create_dir(a.join("shut")).unwrap();
        fs::write(a.join("shut/z"), "z").unwrap();
        fs::set_permissions(a.join("shut"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::create_dir(a.join("ro")).unwrap();
        fs::write(a.join("ro/w"), "w").unwrap();
        fs::set_permissions(a.join("ro"), fs::Permissions::from_mode(0o500)).unwrap();
        // Made by descriptors: the path is too long for one mkdir.
        let mut at = rustix::fs::open(&a, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for n in std::iter::once("deep").chain(std::iter::repeat_n("d", HELD * 3)) {
            rustix::fs::mkdirat(&at, n, Mode::from_raw_mode(0o755)).unwrap();
            at = rustix::fs::openat(&at, n, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                .unwrap();
        }
        rustix::fs::openat(
            &at,
            "bottom",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();

        let done = clear(d.path(), &BTreeSet::new()).unwrap();
        assert!(done.entries > (HELD * 3) as u64, "{done:?}");
        assert!(tree(d.path()).is_empty(), "{:?}", tree(d.path()));
        assert!(a.is_dir(), "artifact/ itself stays, for the next run");
        assert_eq!(
            fs::read_to_string(d.path().join("outside/keep-me")).unwrap(),
            "mine"
        );
        // Again: nothing to do, no error.
        assert_eq!(
            clear(d.path(), &BTreeSet::new()).unwrap(),
            Cleared::default()
        );
        // No artifact/ at all: nothing to do.
        let e = tempfile::tempdir().unwrap();
        assert_eq!(
            clear(e.path(), &BTreeSet::new()).unwrap(),
            Cleared::default()
        );
    }

    /// With a record, what it names stays (as a regular file, in its
    /// directories) and the rest goes: a recorded name that is now a link
    /// or a directory goes too, for the rebuild to write from its blob.
    #[test]
    fn the_recorded_artifacts_stay() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("artifact");
        fs::create_dir_all(a.join("sub/inner")).unwrap();
        fs::write(a.join("kept.txt"), "k").unwrap();
        fs::write(a.join("sub/inner/kept.txt"), "k").unwrap();
        fs::write(a.join("sub/stray"), "s").unwrap();
        // Below a directory that goes, a name that is kept at the top.
        fs::create_dir(a.join("junk")).unwrap();
        fs::write(a.join("junk/kept.txt"), "j").unwrap();
        fs::write(a.join("stray"), "s").unwrap();
        fs::create_dir(a.join("was-a-file")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", a.join("link.txt")).unwrap();
        let keep: BTreeSet<String> = ["kept.txt", "sub/inner/kept.txt", "was-a-file", "link.txt"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        clear(d.path(), &keep).unwrap();
        assert_eq!(
            tree(d.path()),
            ["kept.txt", "sub", "sub/inner", "sub/inner/kept.txt"]
        );
    }

    /// Set aside, the old `artifact/` is out of the next run's way at once
    /// (a new, empty one has its owner), and removing it later touches
    /// nothing the next run wrote.
    #[test]
    fn a_set_aside_artifact_goes_and_the_next_runs_stays() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("artifact");
        fs::create_dir_all(a.join("sub")).unwrap();
        fs::write(a.join("sub/old"), "old").unwrap();
        std::os::unix::fs::chown(&a, Some(4321), Some(4321)).unwrap();
        let name = set_aside(d.path(), "run-1").unwrap().unwrap();
        assert_eq!(name, ".artifact.run-1");
        assert!(tree(d.path()).is_empty());
        let st = fs::metadata(&a).unwrap();
        assert_eq!(
            (
                std::os::unix::fs::MetadataExt::uid(&st),
                std::os::unix::fs::MetadataExt::gid(&st)
            ),
            (4321, 4321)
        );
        fs::write(a.join("new"), "the next run's").unwrap();
        assert_eq!(set_aside_in(d.path()), std::slice::from_ref(&name));
        let done = remove_set_aside(d.path(), &name).unwrap();
        assert_eq!(done.entries, 3, "sub/old, sub and the directory itself");
        assert_eq!(tree(d.path()), ["new"]);
        assert!(set_aside_in(d.path()).is_empty());
        // Nothing to set aside: nothing done.
        let e = tempfile::tempdir().unwrap();
        assert_eq!(set_aside(e.path(), "x").unwrap(), None);
    }
}
