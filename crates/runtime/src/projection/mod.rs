//! The ctx tree on disk, written off the hot path.
//!
//! The store is the truth; these files are its projection for programs and people
//! (SPEC 3). Writes go to one dedicated thread in the order they were issued, so a
//! spawn or a state change never waits for the filesystem, while a reader still
//! never sees half a file: every whole-file write is a temp file in the same
//! directory, then `rename(2)`. Nothing is opened through a symlink (`O_NOFOLLOW`
//! on the final component, and a symlinked directory on the way is refused).
//! No fsync: the tree can always be rebuilt from the store.
//!
//! Ownership: agents started by root run as uid 0 without capabilities, so a
//! landlock grant they inherit (the operator's `/ rw`) would let them write
//! anything root owns. The tree is therefore owned by [`CTX_OWNER`] (`nobody`)
//! when the supervisor is root: files `0644`, directories `0755`, so an agent
//! can read what its policy lets it read and write nothing, not even its own
//! object or its parent's channel (SPEC 3, 4), whatever landlock grants. The one
//! exception is a channel's `artifact/` directory, owned by the child's uid
//! ([`make_dir`]). A supervisor that is not root cannot give files away and
//! relies on landlock alone (docs/decisions/ctx.md "Agents write nothing in
//! the ctx tree").

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

mod at;

/// The owner of the ctx tree when the supervisor is root: `nobody`, a uid no
/// agent runs as (an agent's uid is its root's, the operator's).
pub const CTX_OWNER: u32 = 65534;

/// Who the ctx tree's files are given to: [`CTX_OWNER`] when this process may
/// give files away (it is root), else nobody else (`None`).
pub fn ctx_owner() -> Option<u32> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    (unsafe { libc::geteuid() } == 0).then_some(CTX_OWNER)
}

/// The mode a ctx file is written with: a session's transcript
/// (`messages.jsonl`, `latest.md`) is `0640`, readable by the tree's owner and
/// the operator but not by agents (SPEC 4: a child does not read its parent's
/// transcript; an agent gets its own history in `init`); every other file
/// `0644`. Shims are written `0755` on their own.
pub fn mode_of(path: &Path) -> u32 {
    match path.file_name().and_then(|n| n.to_str()) {
        Some("messages.jsonl" | "latest.md") => 0o640,
        // Environment values may be secrets (issue 24): their owner only.
        Some("env") => 0o600,
        _ => 0o644,
    }
}

enum Op {
    /// A whole file and its mode (0644, or 0755 for a shim), and whether
    /// it is expected to be new ([`Projection::write_new`]).
    Write(PathBuf, Vec<u8>, u32, bool),
    Append(PathBuf, Vec<u8>),
    /// With a uid: the directory itself is given to it (`artifact/`).
    Mkdirs(PathBuf, Option<u32>),
    RemoveDir(PathBuf),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Handle to the projection thread.
#[derive(Clone)]
pub struct Projection {
    tx: mpsc::Sender<Op>,
}

impl Projection {
    pub fn start() -> io::Result<Projection> {
        let (tx, rx) = mpsc::channel::<Op>();
        let owner = ctx_owner();
        thread::Builder::new()
            .name("brood-projection".into())
            .spawn(move || {
                let mut w = Writer {
                    owner,
                    ..Writer::default()
                };
                while let Ok(first) = rx.recv() {
                    // Take everything already queued and write it as one batch: a
                    // file rewritten several times in the batch is written once
                    // (its last content), which is what a reader would see anyway.
                    let mut batch = vec![first];
                    while batch.len() < 8192 {
                        match rx.try_recv() {
                            Ok(op) => batch.push(op),
                            Err(_) => break,
                        }
                    }
                    w.apply(batch);
                }
            })?;
        Ok(Projection { tx })
    }

    /// Replaces a whole file (creating its directory).
    pub fn write(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let mode = mode_of(&path);
        let _ = self.tx.send(Op::Write(path, bytes.into(), mode, false));
    }

    /// [`Self::write`] of a file expected not to be there yet (a new
    /// agent's control and session files): moved in without a look first,
    /// looked at only if its name exists after all. The same result either
    /// way; one system call fewer for a new file.
    pub fn write_new(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let mode = mode_of(&path);
        let _ = self.tx.send(Op::Write(path, bytes.into(), mode, true));
    }

    /// Replaces a whole file with an executable one, mode 0755 (an agent's shim).
    pub fn write_exec(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let _ = self.tx.send(Op::Write(path, bytes.into(), 0o755, false));
    }

    /// Appends to a file (creating it and its directory).
    pub fn append(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let _ = self.tx.send(Op::Append(path, bytes.into()));
    }

    pub fn mkdirs(&self, path: PathBuf) {
        let _ = self.tx.send(Op::Mkdirs(path, None));
    }

    /// A channel's `artifact/`, given to the child's `uid` ([`make_dir`]).
    /// Given away here too, not left to the launch alone: two writers that
    /// each made it and chowned it in turn could otherwise leave it to the
    /// tree's owner, and the child could not write its own artifacts.
    pub fn artifact_dir(&self, path: PathBuf, uid: u32) {
        let _ = self.tx.send(Op::Mkdirs(path, Some(uid)));
    }

    /// Removes a directory and everything in it, or a single file, after the
    /// writes queued before it (a `temp` agent's object and shim once its run
    /// ended). A symlink is removed itself, never followed.
    pub fn remove_dir(&self, path: PathBuf) {
        let _ = self.tx.send(Op::RemoveDir(path));
    }

    /// Resolves once every write issued before it is on disk (visible to readers).
    pub async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.tx.send(Op::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// How many directories the projection thread remembers as made. Every
/// agent ever created adds a few (its object, its sessions, its channel),
/// so without a bound the set grew with every agent the daemon ever ran
/// (issue 28: about 270 bytes an agent, measured with heaptrack over three
/// rounds of 1,000). Past the bound it starts over: a directory forgotten
/// costs one `lstat` at its next write.
const DIRS_KEPT: usize = 4096;

/// The projection thread's state: directories known to exist (so the hot case
/// skips `mkdir -p` and the symlink check, at most [`DIRS_KEPT`]) and a nonce
/// for temp file names.
#[derive(Default)]
struct Writer {
    dirs: HashSet<PathBuf>,
    nonce: u64,
    owner: Option<u32>,
    /// `<pid>.<tid>` of the projection thread, for its temp files' names
    /// (see [`temp_beside`]); asked of the kernel once.
    tag: String,
}

impl Writer {
    fn apply(&mut self, batch: Vec<Op>) {
        let mut writes: Vec<(PathBuf, Vec<u8>, u32, bool)> = Vec::new();
        let mut write_at: HashMap<PathBuf, usize> = HashMap::new();
        let mut appends: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        let mut append_at: HashMap<PathBuf, usize> = HashMap::new();
        let mut flushes = Vec::new();
        let mut removals = Vec::new();
        for op in batch {
            match op {
                Op::Mkdirs(p, uid) => {
                    let made = match uid {
                        Some(uid) => make_dir(&p, uid),
                        None => self.mkdirs(&p),
                    };
                    if let Err(e) = made {
                        tracing::warn!(error = %e, "ctx projection mkdir failed");
                    }
                }
                Op::Write(p, b, mode, fresh) => match write_at.get(&p) {
                    Some(&i) => {
                        writes[i].1 = b;
                        writes[i].2 = mode;
                        writes[i].3 &= fresh;
                    }
                    None => {
                        write_at.insert(p.clone(), writes.len());
                        writes.push((p, b, mode, fresh));
                    }
                },
                Op::Append(p, b) => match append_at.get(&p) {
                    Some(&i) => appends[i].1.extend_from_slice(&b),
                    None => {
                        append_at.insert(p.clone(), appends.len());
                        appends.push((p, b));
                    }
                },
                Op::RemoveDir(p) => removals.push(p),
                Op::Flush(done) => flushes.push(done),
            }
        }
        // Each directory written in is opened once for the batch (`at`).
        let mut open: HashMap<PathBuf, at::Dir> = HashMap::new();
        for (p, b, mode, fresh) in writes {
            self.nonce += 1;
            let tmp = self.temp_name(&p);
            let owner = self.owner;
            let r = self.in_dir(&mut open, &p, |dir, name| {
                dir.replace(&p, name, &tmp, &b, owner, mode, fresh)
            });
            if let Err(e) = r {
                tracing::warn!(error = %e, "ctx projection write failed");
            }
        }
        for (p, b) in appends {
            let owner = self.owner;
            let mode = mode_of(&p);
            if let Err(e) = self.in_dir(&mut open, &p, |dir, name| {
                dir.append(&p, name, &b, owner, mode)
            }) {
                tracing::warn!(error = %e, "ctx projection append failed");
            }
        }
        drop(open);
        for p in removals {
            self.dirs.retain(|d| !d.starts_with(&p));
            let r = match fs::symlink_metadata(&p) {
                Ok(m) if !m.is_dir() => fs::remove_file(&p),
                Ok(_) => fs::remove_dir_all(&p),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                tracing::warn!(path = %p.display(), error = %e, "ctx projection remove failed");
            }
        }
        for f in flushes {
            let _ = f.send(());
        }
    }

    fn mkdirs(&mut self, dir: &Path) -> io::Result<()> {
        if self.dirs.contains(dir) {
            return Ok(());
        }
        make_dirs(dir, self.owner)?;
        if self.dirs.len() >= DIRS_KEPT {
            self.dirs.clear();
        }
        self.dirs.insert(dir.to_path_buf());
        Ok(())
    }

    /// Runs `f` with the file's directory, opened (once a batch, kept in
    /// `open`), and the file's name; if the directory vanished since it was
    /// cached (someone removed the tree), makes it again and retries.
    fn in_dir(
        &mut self,
        open: &mut HashMap<PathBuf, at::Dir>,
        path: &Path,
        f: impl Fn(&at::Dir, &std::ffi::OsStr) -> io::Result<()>,
    ) -> io::Result<()> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::other(format!(
                "{} has no directory or file name",
                path.display()
            )));
        };
        let mut first = true;
        loop {
            let r = self.mkdirs(dir).and_then(|()| {
                if !open.contains_key(dir) {
                    let d = at::Dir::open(dir)
                        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
                    open.insert(dir.to_path_buf(), d);
                }
                match open.get(dir) {
                    Some(d) => f(d, name),
                    None => Err(io::Error::other(format!(
                        "{} was not opened",
                        dir.display()
                    ))),
                }
            });
            match r {
                Err(e) if first && e.kind() == io::ErrorKind::NotFound => {
                    first = false;
                    self.dirs.remove(dir);
                    open.remove(dir);
                }
                r => return r,
            }
        }
    }

    /// The temp file a write of `path` goes through: `.<name>.tmp.<pid>.<tid>.<nonce>`
    /// ([`temp_beside`]'s shape), the ids asked of the kernel once.
    fn temp_name(&mut self, path: &Path) -> std::ffi::OsString {
        if self.tag.is_empty() {
            // SAFETY: gettid has no preconditions and cannot fail.
            let tid = unsafe { libc::gettid() };
            self.tag = format!("{}.{tid}", std::process::id());
        }
        let mut tmp = std::ffi::OsString::from(".");
        tmp.push(path.file_name().unwrap_or_default());
        tmp.push(format!(".tmp.{}.{}", self.tag, self.nonce));
        tmp
    }
}

/// `mkdir -p` that gives every directory it creates to `owner`, and refuses a
/// symlink where a directory should be (it would redirect every write below).
pub(crate) fn make_dirs(dir: &Path, owner: Option<u32>) -> io::Result<()> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    match fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(io::Error::other(format!(
                "{} is a symlink; refusing to write through it",
                dir.display()
            )));
        }
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e)),
    }
    if let Some(up) = dir.parent() {
        make_dirs(up, owner)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => chown(dir, owner).map_err(named),
        // Made meanwhile by another writer (the launcher's artifact directory).
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(named(e)),
    }
}

fn chown(path: &Path, owner: Option<u32>) -> io::Result<()> {
    match owner {
        Some(u) => std::os::unix::fs::lchown(path, Some(u), Some(u)),
        None => Ok(()),
    }
}

/// Makes `dir` (and what is missing above it, given to the tree's owner) and
/// gives `dir` itself to `uid` when this process may give files away: a
/// channel's `artifact/`, the one directory of the tree its child may write.
pub fn make_dir(dir: &Path, uid: u32) -> io::Result<()> {
    let owner = ctx_owner();
    make_dirs(dir, owner)?;
    if owner.is_some() {
        std::os::unix::fs::lchown(dir, Some(uid), Some(uid))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    }
    Ok(())
}

fn ensure_parent(path: &Path, owner: Option<u32>) -> io::Result<()> {
    match path.parent() {
        Some(dir) => make_dirs(dir, owner),
        None => Ok(()),
    }
}

/// Temp file in the same directory, then rename: readers see the old file or the
/// new one, never a part. A symlink where the file goes is refused with an
/// error naming it (SPEC 3: nothing is written through a symlink; `rename`
/// would replace the link rather than follow it, but a planted link means
/// someone is tampering with the tree, which the operator should hear of).
/// The file (and any directory made for it) is given to `owner`.
pub fn write_atomic(path: &Path, bytes: &[u8], nonce: u64, owner: Option<u32>) -> io::Result<()> {
    ensure_parent(path, owner)?;
    write_atomic_in(path, bytes, nonce, owner, mode_of(path))
}

/// [`write_atomic`] of an executable file, mode 0755 (an agent's shim).
pub fn write_atomic_exec(
    path: &Path,
    bytes: &[u8],
    nonce: u64,
    owner: Option<u32>,
) -> io::Result<()> {
    ensure_parent(path, owner)?;
    write_atomic_in(path, bytes, nonce, owner, 0o755)
}

/// [`write_atomic`] for a path whose directory is known to exist, with `mode`.
fn write_atomic_in(
    path: &Path,
    bytes: &[u8],
    nonce: u64,
    owner: Option<u32>,
    mode: u32,
) -> io::Result<()> {
    let tmp = temp_beside(path, nonce)?;
    refuse_symlink(path)?;
    // A file that already holds these bytes (with this mode and owner) is
    // left as it is: replacing it would give it a new inode, and a landlock
    // rule made on the old one (the agent's policy file, granted to the agent
    // when its sandbox was prepared) would no longer reach it.
    if let Ok(m) = std::fs::symlink_metadata(path)
        && m.is_file()
        && m.len() == bytes.len() as u64
        && m.mode() & 0o7777 == mode
        && owner.is_none_or(|o| m.uid() == o)
        && std::fs::read(path).is_ok_and(|old| old == bytes)
    {
        return Ok(());
    }
    replace_with(path, &tmp, owner, mode, |f| f.write_all(bytes))
}

/// [`write_atomic`] of the bytes `src` gives (a blob of up to 1 GiB, never
/// held in memory whole), mode 0644.
pub fn copy_atomic(
    path: &Path,
    src: &mut fs::File,
    nonce: u64,
    owner: Option<u32>,
) -> io::Result<()> {
    ensure_parent(path, owner)?;
    refuse_symlink(path)?;
    let tmp = temp_beside(path, nonce)?;
    replace_with(path, &tmp, owner, 0o644, |f| io::copy(src, f).map(|_| ()))
}

/// The temp file a write of `path` goes through, beside it: `.<name>.tmp.<pid>.<tid>.<nonce>`.
fn temp_beside(path: &Path, nonce: u64) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    // The thread id keeps writers of one process apart (the projection thread,
    // the launch, a rebuild), whatever nonces each counts with.
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    tmp_name.push(format!(".tmp.{}.{tid}.{nonce}", std::process::id()));
    Ok(path.with_file_name(tmp_name))
}

/// Fills a new temp file `tmp` with `fill`, gives it to `owner` and renames
/// it over `path`; the temp file is gone whatever fails.
fn replace_with(
    path: &Path,
    tmp: &Path,
    owner: Option<u32>,
    mode: u32,
    fill: impl FnOnce(&mut fs::File) -> io::Result<()>,
) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(tmp)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tmp.display())))?;
    // The umask may have narrowed the mode; a shim must be executable by
    // everyone whatever the supervisor's umask, so set it exactly.
    let exact = if mode == 0o644 {
        Ok(())
    } else {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(fs::Permissions::from_mode(mode))
    };
    // The temp file is new, so ours: give it away without asking whose it is.
    let r = exact
        .and_then(|_| owner.map_or(Ok(()), |u| std::os::unix::fs::fchown(&f, Some(u), Some(u))))
        .and_then(|_| fill(&mut f))
        .and_then(|_| fs::rename(tmp, path));
    if r.is_err() {
        let _ = fs::remove_file(tmp);
    }
    r.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// An error naming `path` if a symlink stands there.
fn refuse_symlink(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is a symlink; refusing to write through it (remove it to let brood write the file)",
                path.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// Gives an open file to `owner` unless it is already theirs.
fn give(f: &fs::File, owner: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(u) = owner else { return Ok(()) };
    if f.metadata()?.uid() != u {
        std::os::unix::fs::fchown(f, Some(u), Some(u))?;
    }
    Ok(())
}

/// An append as the projection thread makes it, for the tests.
#[cfg(test)]
fn append(path: &Path, bytes: &[u8]) -> io::Result<()> {
    ensure_parent(path, None)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!(
            "{} has no directory",
            path.display()
        )));
    };
    at::Dir::open(dir)?.append(path, name, bytes, None, mode_of(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_remembered_stay_bounded_however_many_agents_came() {
        let d = tempfile::tempdir().unwrap();
        let mut w = Writer::default();
        for i in 0..(DIRS_KEPT + DIRS_KEPT / 2) {
            w.mkdirs(&d.path().join(format!("agent/a{i}.d"))).unwrap();
            assert!(w.dirs.len() <= DIRS_KEPT, "{} remembered", w.dirs.len());
        }
        // A directory forgotten is made again if it went meanwhile.
        fs::remove_dir(d.path().join("agent/a0.d")).unwrap();
        w.mkdirs(&d.path().join("agent/a0.d")).unwrap();
        assert!(d.path().join("agent/a0.d").is_dir());
    }

    #[test]
    fn a_planted_symlink_is_never_followed_and_the_write_fails_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("secret");
        fs::write(&target, "keep").unwrap();
        let link = d.path().join("status");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_atomic(&link, b"dead\n", 1, None).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("{} is a symlink", link.display())),
            "{e}"
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // No temp file is left behind.
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 2);
        // Appending through a symlink is refused too.
        let log = d.path().join("log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        let e = append(&log, b"x").unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        // A symlinked directory on the way is refused as well.
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("dir")).unwrap();
        let e = write_atomic(&d.path().join("dir/file"), b"x", 2, None).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(fs::read_dir(&real).unwrap().count(), 0);
    }

    /// The projection thread's own writes (relative to their directory,
    /// `at`) keep the same rules: never through a symlink, no temp file
    /// left, a file holding the bytes already keeps its inode, a file
    /// rewritten in one batch is written once with its last bytes, and a
    /// directory removed under it is made again.
    #[tokio::test]
    async fn the_thread_writes_relative_to_the_directory_by_the_same_rules() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let p = Projection::start().unwrap();
        let dir = d.path().join("agent/a.d");
        let target = d.path().join("secret");
        fs::write(&target, "keep").unwrap();
        fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("status")).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("log")).unwrap();
        p.write(dir.join("status"), "dead\n");
        p.append(dir.join("log"), "line\n");
        p.write(dir.join("meta.json"), "{}");
        p.write(dir.join("pid"), "1\n");
        p.write(dir.join("pid"), "2\n");
        p.append(dir.join("events"), "a\n");
        p.append(dir.join("events"), "b\n");
        // Nothing to append: the file is made (a new one), left as it is
        // (one there), and a symlink is refused as for any append.
        p.append(dir.join("messages.jsonl"), Vec::new());
        std::os::unix::fs::symlink(&target, dir.join("latest.md")).unwrap();
        p.append(dir.join("latest.md"), Vec::new());
        p.flush().await;
        p.append(dir.join("events"), Vec::new());
        p.flush().await;
        assert_eq!(fs::read_to_string(dir.join("messages.jsonl")).unwrap(), "");
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        for link in ["status", "log", "latest.md"] {
            assert!(
                fs::symlink_metadata(dir.join(link))
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
        }
        assert_eq!(fs::read_to_string(dir.join("pid")).unwrap(), "2\n");
        assert_eq!(fs::read_to_string(dir.join("events")).unwrap(), "a\nb\n");
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "events",
                "latest.md",
                "log",
                "messages.jsonl",
                "meta.json",
                "pid",
                "status"
            ],
            "no temp file left"
        );
        let ino = fs::metadata(dir.join("meta.json")).unwrap().ino();
        p.write(dir.join("meta.json"), "{}");
        p.flush().await;
        assert_eq!(
            fs::metadata(dir.join("meta.json")).unwrap().ino(),
            ino,
            "unchanged: kept"
        );
        p.write(dir.join("meta.json"), "{\"a\":1}");
        p.flush().await;
        assert_ne!(
            fs::metadata(dir.join("meta.json")).unwrap().ino(),
            ino,
            "changed: replaced"
        );
        // Written as new: the same rules when the name is there after all
        // (the same bytes keep their inode, a symlink is refused), and a
        // new file made.
        p.write_new(dir.join("meta.json"), "{\"a\":1}");
        p.write_new(dir.join("status"), "new\n");
        p.write_new(dir.join("parent"), "top\n");
        p.flush().await;
        let ino2 = fs::metadata(dir.join("meta.json")).unwrap().ino();
        p.write_new(dir.join("meta.json"), "{\"a\":1}");
        p.flush().await;
        assert_eq!(fs::metadata(dir.join("meta.json")).unwrap().ino(), ino2);
        p.write_new(dir.join("meta.json"), "{\"a\":2}");
        p.flush().await;
        assert_eq!(
            fs::read_to_string(dir.join("meta.json")).unwrap(),
            "{\"a\":2}"
        );
        assert!(
            fs::symlink_metadata(dir.join("status"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(fs::read_to_string(dir.join("parent")).unwrap(), "top\n");
        assert_eq!(
            fs::read_dir(&dir).unwrap().count(),
            8,
            "no temp file left: {:?}",
            fs::read_dir(&dir).unwrap().collect::<Vec<_>>()
        );
        // Removed under it (a rebuild, an operator): made again.
        fs::remove_dir_all(d.path().join("agent")).unwrap();
        p.write(dir.join("pid"), "3\n");
        p.flush().await;
        assert_eq!(fs::read_to_string(dir.join("pid")).unwrap(), "3\n");
    }
}
