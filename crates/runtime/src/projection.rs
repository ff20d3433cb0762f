//! The ctx tree on disk, written off the hot path.
//!
//! The store is the truth; these files are its projection for programs and people
//! (SPEC 3). Writes go to one dedicated thread in the order they were issued, so a
//! spawn or a state change never waits for the filesystem, while a reader still
//! never sees half a file: every whole-file write is a temp file in the same
//! directory, then `rename(2)`. Nothing is opened through a symlink (`O_NOFOLLOW`
//! on the final component, and a symlinked directory on the way is refused).
//! No fsync: the tree can always be rebuilt from the store.

use std::collections::{HashMap, HashSet};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

enum Op {
    /// A whole file and its mode (0644, or 0755 for a shim).
    Write(PathBuf, Vec<u8>, u32),
    Append(PathBuf, Vec<u8>),
    Mkdirs(PathBuf),
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
        thread::Builder::new()
            .name("brood-projection".into())
            .spawn(move || {
                let mut w = Writer::default();
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
        let _ = self.tx.send(Op::Write(path, bytes.into(), 0o644));
    }

    /// Replaces a whole file with an executable one, mode 0755 (an agent's shim).
    pub fn write_exec(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let _ = self.tx.send(Op::Write(path, bytes.into(), 0o755));
    }

    /// Appends to a file (creating it and its directory).
    pub fn append(&self, path: PathBuf, bytes: impl Into<Vec<u8>>) {
        let _ = self.tx.send(Op::Append(path, bytes.into()));
    }

    pub fn mkdirs(&self, path: PathBuf) {
        let _ = self.tx.send(Op::Mkdirs(path));
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

/// The projection thread's state: directories known to exist (so the hot case
/// skips `mkdir -p` and the symlink check) and a nonce for temp file names.
#[derive(Default)]
struct Writer {
    dirs: HashSet<PathBuf>,
    nonce: u64,
}

impl Writer {
    fn apply(&mut self, batch: Vec<Op>) {
        let mut writes: Vec<(PathBuf, Vec<u8>, u32)> = Vec::new();
        let mut write_at: HashMap<PathBuf, usize> = HashMap::new();
        let mut appends: Vec<(PathBuf, Vec<u8>)> = Vec::new();
        let mut append_at: HashMap<PathBuf, usize> = HashMap::new();
        let mut flushes = Vec::new();
        let mut removals = Vec::new();
        for op in batch {
            match op {
                Op::Mkdirs(p) => {
                    if let Err(e) = self.mkdirs(&p) {
                        tracing::warn!(error = %e, "ctx projection mkdir failed");
                    }
                }
                Op::Write(p, b, mode) => match write_at.get(&p) {
                    Some(&i) => {
                        writes[i].1 = b;
                        writes[i].2 = mode;
                    }
                    None => {
                        write_at.insert(p.clone(), writes.len());
                        writes.push((p, b, mode));
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
        for (p, b, mode) in writes {
            self.nonce += 1;
            let n = self.nonce;
            if let Err(e) = self.with_dir(&p, |p| write_atomic_in(p, &b, n, mode)) {
                tracing::warn!(error = %e, "ctx projection write failed");
            }
        }
        for (p, b) in appends {
            if let Err(e) = self.with_dir(&p, |p| append_in(p, &b)) {
                tracing::warn!(error = %e, "ctx projection append failed");
            }
        }
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
        fs::create_dir_all(dir)?;
        if fs::symlink_metadata(dir)?.file_type().is_symlink() {
            return Err(io::Error::other(format!(
                "{} is a symlink; refusing to write through it",
                dir.display()
            )));
        }
        self.dirs.insert(dir.to_path_buf());
        Ok(())
    }

    /// Runs `f` with the file's directory in place; if the directory vanished
    /// since it was cached (someone removed the tree), makes it again and retries.
    fn with_dir(&mut self, path: &Path, f: impl Fn(&Path) -> io::Result<()>) -> io::Result<()> {
        let Some(dir) = path.parent() else {
            return f(path);
        };
        self.mkdirs(dir)?;
        match f(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.dirs.remove(dir);
                self.mkdirs(dir)?;
                f(path)
            }
            r => r,
        }
    }
}

fn ensure_parent(path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
        if fs::symlink_metadata(dir)?.file_type().is_symlink() {
            return Err(io::Error::other(format!(
                "{} is a symlink; refusing to write through it",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Temp file in the same directory, then rename: readers see the old file or the
/// new one, never a part. `rename` replaces a symlink itself, never its target.
pub fn write_atomic(path: &Path, bytes: &[u8], nonce: u64) -> io::Result<()> {
    ensure_parent(path)?;
    write_atomic_in(path, bytes, nonce, 0o644)
}

/// [`write_atomic`] of an executable file, mode 0755 (an agent's shim).
pub fn write_atomic_exec(path: &Path, bytes: &[u8], nonce: u64) -> io::Result<()> {
    ensure_parent(path)?;
    write_atomic_in(path, bytes, nonce, 0o755)
}

/// [`write_atomic`] for a path whose directory is known to exist, with `mode`.
fn write_atomic_in(path: &Path, bytes: &[u8], nonce: u64, mode: u32) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}.{nonce}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", tmp.display())))?;
    // The umask may have narrowed the mode; a shim must be executable by
    // everyone whatever the supervisor's umask, so set it exactly.
    let exact = if mode == 0o644 {
        Ok(())
    } else {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(fs::Permissions::from_mode(mode))
    };
    let r = exact
        .and_then(|_| f.write_all(bytes))
        .and_then(|_| fs::rename(&tmp, path));
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
fn append(path: &Path, bytes: &[u8]) -> io::Result<()> {
    ensure_parent(path)?;
    append_in(path, bytes)
}

fn append_in(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_never_follows_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("secret");
        fs::write(&target, "keep").unwrap();
        let link = d.path().join("status");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, b"dead\n", 1).unwrap();
        // The symlink itself was replaced; its target is untouched.
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        assert!(
            !fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&link).unwrap(), "dead\n");
        // Appending through a symlink is refused.
        let log = d.path().join("log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(append(&log, b"x").is_err());
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
    }
}
