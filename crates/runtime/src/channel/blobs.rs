//! The content-addressed blob store, `$BROOD_ROOT/blobs/sha256/<hex>`, as a
//! collection writes it: every artifact of a result is first copied into a
//! temp file beside the blobs ([`Staged`]), and only once the whole result
//! is accepted are they renamed to their hashes ([`Staged::commit`]). A
//! result refused halfway (the fifth artifact over `disk_max`, the ninth a
//! file the child may not read) or abandoned (past the collection's time
//! limit) drops its `Staged`, which removes every temp file: nothing of it
//! stays in the store, whole or half-written (issue 24 item 6). A temp file
//! left by a supervisor that died mid-collection is removed by `brood fsck`
//! ([`remove_stale_temps`]).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Temp files of blobs being written start with this, then the writer's pid.
const TEMP_PREFIX: &str = ".in.";

/// `blobs/sha256/<hex>`.
pub fn blob_path(blobs: &Path, sha256: &str) -> PathBuf {
    blobs.join("sha256").join(sha256)
}

/// The blob store's directory (made if missing) and a fresh temp file name
/// in it, for a blob being written: renamed to its hash once whole.
pub(super) fn blob_temp(blobs: &Path) -> io::Result<(PathBuf, PathBuf)> {
    let dir = blobs.join("sha256");
    fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(
        "{TEMP_PREFIX}{}.{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    Ok((dir, tmp))
}

/// Creates the temp file of a blob being written (read-only once renamed).
pub(super) fn new_blob_file(tmp: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_CLOEXEC)
        .open(tmp)
}

/// The blobs of one result, copied but not yet in the store: each a whole
/// temp file and the hash it will be renamed to. Dropped without
/// [`Staged::commit`], it removes them all.
pub(super) struct Staged {
    dir: PathBuf,
    blobs: PathBuf,
    files: Vec<(PathBuf, String)>,
}

impl Staged {
    pub(super) fn new(blobs: &Path) -> Staged {
        Staged {
            dir: blobs.join("sha256"),
            blobs: blobs.to_path_buf(),
            files: Vec::new(),
        }
    }

    /// Copies an open file into a temp file of the store, reading at most
    /// `cap` bytes (more is an error naming the cap): its hash and size.
    pub(super) fn stage(&mut self, src: &mut File, cap: u64) -> io::Result<(String, u64)> {
        let (_, tmp) = blob_temp(&self.blobs)?;
        let copied = new_blob_file(&tmp)
            .and_then(|mut out| super::open::hash_copy(src, cap, Some(&mut out)));
        match copied {
            Ok((hex, size)) => {
                self.files.push((tmp, hex.clone()));
                Ok((hex, size))
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Puts every staged blob into the store under its hash (a blob that is
    /// there already is kept: same hash, same bytes). On a failure the rest
    /// are removed with the `Staged`; those renamed before it are whole.
    pub(super) fn commit(mut self) -> io::Result<()> {
        for (tmp, hex) in std::mem::take(&mut self.files) {
            let dst = self.dir.join(&hex);
            let r = if dst.exists() {
                fs::remove_file(&tmp)
            } else {
                fs::rename(&tmp, &dst)
            };
            if let Err(e) = r {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (tmp, _) in &self.files {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// Removes the temp files of blobs that a process no longer alive was
/// writing (a supervisor that died mid-collection): `.in.<pid>.<id>` whose
/// pid is not a live process. A live pid's are kept, even if the pid was
/// reused: removing a blob another supervisor is writing would be worse than
/// keeping a dead one's until the next pass. How many were removed.
pub fn remove_stale_temps(blobs: &Path) -> io::Result<usize> {
    let dir = blobs.join("sha256");
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TEMP_PREFIX))
            .and_then(|rest| rest.split('.').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks that the pid exists.
        let alive = pid > 0
            && (unsafe { libc::kill(pid, 0) } == 0
                || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
        if !alive {
            match fs::remove_file(e.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}
