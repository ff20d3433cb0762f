//! Opening what a child handed back, as the child (issue 11): the files its
//! refs name for a hash check, and every file of its `artifact/` directory.
//!
//! By the time anything here runs the child's whole group is dead and empty
//! (the supervisor kills it first), so nothing it started can swap a file
//! while it is read. What the child left behind is still hostile:
//!
//! * **No link is followed anywhere in a path.** Every open is `openat2(2)`
//!   with `RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (and
//!   `RESOLVE_BENEATH` inside the channel), not just `O_NOFOLLOW`, which
//!   guards only the last component: a symlinked directory in the middle of a
//!   ref's path is refused, even a system one such as `/lib -> usr/lib`.
//! * **Only regular files.** Opened `O_NONBLOCK` (a FIFO cannot block the
//!   open), then `fstat(2)` on the open file decides: a FIFO, a device such as
//!   `/dev/zero`, a socket or a directory is refused, naming what it is.
//! * **Bounded.** A ref's file is hashed up to [`MAX_REF_BYTES`]; the
//!   artifacts, at most [`super::MAX_ARTIFACTS`] files of
//!   [`super::MAX_ARTIFACT_BYTES`] (or the child's `disk_max`, when lower:
//!   [`super::ArtifactCap`]) in all, nested at most [`MAX_DEPTH`] deep.
//!   Sizes are checked from `fstat` before a byte is read (a 10 GiB sparse file
//!   costs nothing) and again while reading.
//! * **The child's rights.** The opening runs on a thread confined as the
//!   child was ([`brood_launch::confine`]: its uid, gid and groups, no
//!   capabilities, its landlock ruleset), so the supervisor opens nothing the
//!   child could not have opened itself. The open files go back to the
//!   unconfined collector one at a time (a bounded queue), which hashes and
//!   copies them into the blob store the child cannot reach.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use brood_launch::confine::{Confinement, spawn_confined};
use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{ArtifactCap, MAX_ARTIFACTS};

/// A ref's file is hashed only up to this size: past it the result is refused.
pub const MAX_REF_BYTES: u64 = 1 << 30;

/// `artifact/` is walked at most this many directories deep.
pub const MAX_DEPTH: usize = 32;

/// A file the child handed back, open for reading, with its size at open.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub size: u64,
}

/// A ref whose hash is to be checked: its line in `refs.jsonl` and where it is.
#[derive(Debug, Clone)]
pub struct RefTarget {
    pub line: usize,
    /// Absolute, or relative to the channel directory (plain components).
    pub path: PathBuf,
}

/// What the confined opener hands back, in this order: one `Ref` per target
/// asked for, then (when the artifacts are taken) each `Artifact`, then `End`
/// or a `Failed` that ends it.
#[derive(Debug)]
pub enum Got {
    Ref(usize, Result<Opened, String>),
    Artifact(String, Opened),
    End,
    Failed(String),
}

/// The channel directory, opened by the supervisor for the confined opener
/// to work beneath (`O_PATH`: a handle, not a read).
pub fn channel_dir(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Starts the opener on a thread confined by `c`: the refs' files, then the
/// channel's artifacts when `channel` is given, at most `cap` bytes of them.
/// Stops early when the receiver is dropped (the collector refused the
/// result).
pub fn spawn_opener(
    c: Confinement,
    channel: Option<OwnedFd>,
    refs: Vec<RefTarget>,
    cap: ArtifactCap,
) -> std::io::Result<Receiver<Got>> {
    // Two in flight: the opener stays one file ahead of the collector, and a
    // walk of a thousand artifacts never holds a thousand descriptors.
    let (tx, rx) = sync_channel(2);
    let failed = tx.clone();
    let handle = spawn_confined(c, move || open_all(&tx, channel.as_ref(), &refs, &cap))?;
    // The confinement itself may fail (then nothing was opened): say so on the
    // queue, from a watcher, so the collector never waits on a dead opener.
    std::thread::Builder::new()
        .name("brood-opener-watch".into())
        .spawn(move || {
            let why = match handle.join() {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the opener panicked".to_owned(),
            };
            let _ = failed.send(Got::Failed(why));
        })?;
    Ok(rx)
}

fn open_all(
    tx: &SyncSender<Got>,
    channel: Option<&OwnedFd>,
    refs: &[RefTarget],
    cap: &ArtifactCap,
) {
    for r in refs {
        let dir = if r.path.is_absolute() {
            None
        } else {
            channel.map(|c| c.as_fd())
        };
        let got = open_regular(dir, &r.path, MAX_REF_BYTES, "a ref's hash is checked");
        if tx.send(Got::Ref(r.line, got)).is_err() {
            return;
        }
    }
    let Some(channel) = channel else {
        let _ = tx.send(Got::End);
        return;
    };
    let dir = match openat2_dir(channel.as_fd(), Path::new("artifact")) {
        Ok(d) => d,
        Err(Errno::NOENT) => {
            let _ = tx.send(Got::End);
            return;
        }
        Err(e) => {
            let _ = tx.send(Got::Failed(format!("artifact/: {}", describe(e))));
            return;
        }
    };
    let mut walk = Walk {
        tx,
        files: 0,
        bytes: 0,
        cap,
    };
    let last = match walk.dir(dir, Path::new(""), 0) {
        Ok(true) => Got::End,
        Ok(false) => return,
        Err(why) => Got::Failed(why),
    };
    let _ = tx.send(last);
}

struct Walk<'a> {
    tx: &'a SyncSender<Got>,
    files: usize,
    bytes: u64,
    cap: &'a ArtifactCap,
}

impl Walk<'_> {
    /// Sends every regular file beneath `dir` (named relative to `artifact/`);
    /// `Ok(false)` when the collector has gone. Symlinks, FIFOs, sockets and
    /// devices are not artifacts and are left where they are.
    fn dir(&mut self, dir: OwnedFd, rel: &Path, depth: usize) -> Result<bool, String> {
        let shown = |rel: &Path| format!("artifact/{}", rel.display());
        let mut entries: Vec<(std::ffi::CString, FileType)> = Vec::new();
        let listing =
            Dir::read_from(&dir).map_err(|e| format!("{}: {}", shown(rel), describe(e)))?;
        for e in listing {
            let e = e.map_err(|e| format!("{}: {}", shown(rel), describe(e)))?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            entries.push((name.to_owned(), e.file_type()));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut kind) in entries {
            // A name that is not UTF-8 cannot be named in a ref; it stays.
            let Ok(text) = name.to_str() else { continue };
            let path = rel.join(text);
            if kind == FileType::Unknown {
                kind = match rustix::fs::statat(&dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(e) => return Err(format!("{}: {}", shown(&path), describe(e))),
                };
            }
            match kind {
                FileType::Directory => {
                    if depth + 1 >= MAX_DEPTH {
                        return Err(format!(
                            "{} is nested deeper than {MAX_DEPTH} directories",
                            shown(&path)
                        ));
                    }
                    let sub = openat2_dir(dir.as_fd(), Path::new(text))
                        .map_err(|e| format!("{}: {}", shown(&path), describe(e)))?;
                    if !self.dir(sub, &path, depth + 1)? {
                        return Ok(false);
                    }
                }
                FileType::RegularFile => {
                    self.files += 1;
                    if self.files > MAX_ARTIFACTS {
                        return Err(format!(
                            "artifact/ holds more than {MAX_ARTIFACTS} files; at most {MAX_ARTIFACTS} are taken"
                        ));
                    }
                    let left = self.cap.bytes.saturating_sub(self.bytes);
                    let o = open_regular(
                        Some(dir.as_fd()),
                        Path::new(text),
                        left,
                        "the artifacts are taken",
                    )
                    .map_err(|e| {
                        if e.contains("bytes; at most") {
                            format!(
                                "the artifacts exceed {} (at {})",
                                self.cap.named,
                                shown(&path)
                            )
                        } else {
                            format!("{}: {e}", shown(&path))
                        }
                    })?;
                    self.bytes += o.size;
                    if self.tx.send(Got::Artifact(text_of(&path), o)).is_err() {
                        return Ok(false);
                    }
                }
                _ => {}
            }
        }
        Ok(true)
    }
}

fn text_of(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

const NO_LINKS: ResolveFlags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);

fn openat2_dir(dir: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        NO_LINKS | ResolveFlags::BENEATH,
    )
}

/// Opens `path` (beneath `dir`, or absolute) without following any link, and
/// keeps it only if it is a regular file of at most `cap` bytes.
fn open_regular(
    dir: Option<BorrowedFd<'_>>,
    path: &Path,
    cap: u64,
    what: &str,
) -> Result<Opened, String> {
    let (at, resolve) = match dir {
        Some(d) => (d, NO_LINKS | ResolveFlags::BENEATH),
        None => (CWD, NO_LINKS),
    };
    let fd = rustix::fs::openat2(
        at,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )
    .map_err(describe)?;
    let st = rustix::fs::fstat(&fd).map_err(describe)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(format!("it is {}, not a regular file", kind_name(kind)));
    }
    let size = st.st_size as u64;
    if size > cap {
        return Err(format!(
            "it is {size} bytes; at most {cap} are read where {what}"
        ));
    }
    Ok(Opened {
        file: File::from(fd),
        size,
    })
}

fn kind_name(k: FileType) -> &'static str {
    match k {
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::Symlink => "a symbolic link",
        _ => "not a file",
    }
}

/// Why an open failed, in the terms of this module's rules.
fn describe(e: Errno) -> String {
    match e {
        Errno::LOOP => {
            "a symbolic link in its path (no link is followed anywhere in a path the child names)"
                .into()
        }
        Errno::XDEV => "it leaves the channel directory".into(),
        Errno::ACCESS | Errno::PERM => "the agent may not read it".into(),
        Errno::NOENT => "no such file".into(),
        e => std::io::Error::from(e).to_string(),
    }
}

/// Reads `f` to its end, at most `cap` bytes (more is an error naming the
/// cap), hashing it and, when given, copying it to `out`: the SHA-256 in
/// lowercase hex and the size.
pub fn hash_copy(
    f: &mut File,
    cap: u64,
    mut out: Option<&mut File>,
) -> std::io::Result<(String, u64)> {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Write};
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((super::hex(&h.finalize()), size));
        }
        size += n as u64;
        if size > cap {
            return Err(std::io::Error::other(format!(
                "it grew past {cap} bytes while being read"
            )));
        }
        h.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n])?;
        }
    }
}
