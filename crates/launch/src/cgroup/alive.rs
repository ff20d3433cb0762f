//! Liveness marks (issue 28 item 2): whether a supervisor incarnation is
//! alive, told the same way from any PID namespace.
//!
//! An incarnation's name, `s<pid>-<starttime>`, says whether it is alive
//! only to a process that sees the same pids. So every incarnation also holds
//! a mark: the file `<marks>/<instance>/s<pid>-<starttime>.lock`, locked with
//! `flock(LOCK_EX)` for the rest of the process's life. A flock belongs to
//! the open file description and goes when the last descriptor of it closes,
//! which the kernel does when the process dies, however it dies; and it is
//! seen by whoever opens the same file, whatever its PID or mount namespace.
//! A looker tries `flock(LOCK_EX|LOCK_NB)`: refused, the incarnation is
//! alive; granted, it is dead (and the looker keeps the lock while it
//! removes what the dead one left, so two lookers never work on one); no
//! file, it has no mark (an incarnation from before marks, or one that could
//! not make its mark) and the caller decides ([`Mark::None`]).
//!
//! `<marks>` is [`Detected::marks`]: `/run/brood/incarnations` for root (a
//! directory every process of the host sees: a node started under `unshare
//! --pid --mount-proc` has a copy of the mount table, so the same file);
//! for another user `/run/user/<uid>/brood/incarnations` when that user's
//! runtime directory exists (made by the login manager, the user's own),
//! else none: such a supervisor runs without a mark. A looker judges by the
//! marks of its own user: another user's incarnations are unmarked to it
//! (and their groups are not its to remove anyway).
//!
//! The mark's descriptor is close-on-exec, so no agent keeps it; the keeper
//! and the veil's helper, forked without exec, first close every descriptor
//! they inherit but stdio and their pipe (`close_range`), so the supervisor
//! alone holds the lock.
//! One process holds each mark once ([`HELD`]): a second open of the same
//! incarnation in the same process (a test's clean-up, a benchmark's
//! in-process supervisors) shares it rather than locking against itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::Duration;

use super::{CgroupError, io_err, parse_incarnation};

/// The marks this process holds, by path; each descriptor holds its lock
/// until it is released here or the process ends.
static HELD: Mutex<BTreeMap<PathBuf, File>> = Mutex::new(BTreeMap::new());

/// How many times [`hold`] tries again when a looker took the fresh file for
/// a dead incarnation's (it removes it at once).
const HOLD_TRIES: u32 = 20;

/// The suffix of a mark's file name.
const SUFFIX: &str = ".lock";

/// Where marks live for a process of user `uid`, under `fs_root` (see the
/// module doc); `None` when there is no such place.
pub(super) fn marks_dir(fs_root: &Path, uid: u32) -> Option<PathBuf> {
    if uid == 0 {
        return Some(fs_root.join("run/brood/incarnations"));
    }
    let runtime = fs_root.join(format!("run/user/{uid}"));
    // Only a directory the user owns: anything else there could be made to
    // hold marks for another user's processes.
    let md = fs::symlink_metadata(&runtime).ok()?;
    (md.is_dir() && md.uid() == uid).then(|| runtime.join("brood/incarnations"))
}

/// The file of incarnation `name`'s mark under `instance`.
pub(super) fn mark_path(marks: &Path, instance: &str, name: &str) -> PathBuf {
    marks.join(instance).join(format!("{name}{SUFFIX}"))
}

/// Makes and locks the mark of incarnation `name` of `instance`, unless this
/// process holds it already. Its path, and whether this call made it.
pub(super) fn hold(
    marks: &Path,
    instance: &str,
    name: &str,
) -> Result<(PathBuf, bool), CgroupError> {
    let path = mark_path(marks, instance, name);
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = held.get(&path) {
        if same_file(f, &path) {
            return Ok((path, false));
        }
        // Removed behind our back: made again below.
        held.remove(&path);
    }
    let dir = marks.join(instance);
    for _ in 0..HOLD_TRIES {
        // Only brood's own user may reach the marks: whoever can open one
        // can hold it, and a held mark keeps a dead incarnation's groups.
        match DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            Ok(()) => {}
            // A looker removed the empty directory between two steps.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("mkdir -p", &dir, e)),
        }
        let file = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("open", &path, e)),
        };
        match try_lock(&file) {
            Ok(true) => {}
            // A looker holds it, taking the new file for a dead one's; it
            // removes it and lets go in a moment.
            Ok(false) => {
                sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(io_err("flock", &path, e)),
        }
        // Between our open and our lock a looker may have locked, judged
        // and unlinked the file: a lock on it would mark nothing.
        if same_file(&file, &path) {
            held.insert(path.clone(), file);
            return Ok((path, true));
        }
    }
    Err(io_err(
        "flock",
        &path,
        io::Error::new(
            io::ErrorKind::WouldBlock,
            "another process kept taking the new mark",
        ),
    ))
}

/// Removes a mark this process holds (its incarnation's groups are gone)
/// and lets go of its lock.
pub(super) fn release(path: &Path) {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = held.remove(path) {
        // Unlinked while still locked, so no looker takes the name meanwhile.
        if same_file(&f, path) {
            let _ = fs::remove_file(path);
        }
    }
}

/// What a looker found of an incarnation's mark.
#[derive(Debug)]
pub(super) enum Mark {
    /// Locked by someone: the incarnation is alive (or a looker is removing
    /// it right now); either way, not ours to touch. Also when the mark
    /// cannot be opened or locked at all: it may be held.
    Held,
    /// Free: the incarnation is dead. The looker now holds the lock.
    Free(Taken),
    /// No mark: the caller judges as it can.
    None,
}

/// The lock of a dead incarnation's mark, held by the looker.
#[derive(Debug)]
pub(super) struct Taken {
    path: PathBuf,
    file: File,
}

impl Taken {
    /// Removes the mark (what it marked is gone), then lets go of it.
    pub(super) fn remove(self) {
        if same_file(&self.file, &self.path) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Looks at the mark of incarnation `name` of `instance`.
pub(super) fn look(marks: Option<&Path>, instance: &str, name: &str) -> Mark {
    let Some(marks) = marks else {
        return Mark::None;
    };
    let path = mark_path(marks, instance, name);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Mark::None,
        Err(_) => return Mark::Held,
    };
    match try_lock(&file) {
        Ok(true) => Mark::Free(Taken { path, file }),
        Ok(false) | Err(_) => Mark::Held,
    }
}

/// The instances with a directory of marks.
pub(super) fn instances(marks: Option<&Path>) -> Result<BTreeSet<String>, CgroupError> {
    let Some(marks) = marks else {
        return Ok(BTreeSet::new());
    };
    Ok(entries(marks)?.into_iter().collect())
}

/// The incarnations of `instance` that have a mark.
pub(super) fn marked(marks: Option<&Path>, instance: &str) -> Result<Vec<String>, CgroupError> {
    let Some(marks) = marks else {
        return Ok(Vec::new());
    };
    Ok(entries(&marks.join(instance))?
        .into_iter()
        .filter_map(|n| n.strip_suffix(SUFFIX).map(str::to_owned))
        .filter(|n| parse_incarnation(n).is_some())
        .collect())
}

/// Removes `instance`'s directory of marks when it holds none (`rmdir`
/// refuses it otherwise). Whether it is gone.
pub(super) fn remove_instance_if_empty(marks: Option<&Path>, instance: &str) -> bool {
    let Some(marks) = marks else {
        return true;
    };
    match fs::remove_dir(marks.join(instance)) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// The names in a directory; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<String>, CgroupError> {
    let list = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read dir", dir, e)),
    };
    let mut out = Vec::new();
    for entry in list {
        let entry = entry.map_err(|e| io_err("read dir", dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// `flock(LOCK_EX | LOCK_NB)`: whether we got it (`false`: someone holds it).
fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: flock(2) on a descriptor this File owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether `path` still names the file `f` is open on.
fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
