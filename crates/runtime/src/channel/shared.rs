//! A child's artifacts for a parent on another node (issue 15). The bytes
//! are taken into the blob store of the node that ran the child; a parent
//! another node runs reads its channel's `artifact/` on that node's disk. So
//! the child's node puts the blobs into the shared store ([`share`]) before
//! it records the end, and the parent's node, hearing of the end, fetches
//! them into its own blob store, checked against their names
//! ([`fetch_blob`]), and writes the files into the channel ([`place`]).
//!
//! All of it reads and writes files of up to 1 GiB and waits on the store:
//! the supervisor runs it off its dispatcher, on a blocking thread.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use brood_core::TenantId;
use brood_store::{Artifact, Store};
use sha2::{Digest, Sha256};

use super::{blob_path, blob_temp, hex, new_blob_file, relative};

/// Puts the blobs of `artifacts` (in this node's blob store) into the shared
/// store; a blob the store holds already is not sent again. The first
/// failure is returned, naming the artifact.
pub fn share(
    store: &dyn Store,
    tenant: &TenantId,
    blobs: &Path,
    artifacts: &[Artifact],
) -> Result<(), String> {
    for a in artifacts {
        let path = blob_path(blobs, &a.sha256);
        let mut f = fs::File::open(&path)
            .map_err(|e| format!("artifact/{}: {}: {e}", a.name, path.display()))?;
        store
            .put_blob(tenant, &a.sha256, a.size, &mut f)
            .map_err(|e| format!("artifact/{}: {e}", a.name))?;
    }
    Ok(())
}

/// Makes sure blob `sha256` is in this node's blob store, fetching it from
/// the shared store when it is not: into a temp file, hashed on the way,
/// renamed into place only when the hash is its name. False when neither
/// holds it (its node never shared it).
pub fn fetch_blob(
    store: &dyn Store,
    tenant: &TenantId,
    blobs: &Path,
    sha256: &str,
) -> io::Result<bool> {
    let dst = blob_path(blobs, sha256);
    if dst.exists() {
        return Ok(true);
    }
    let (_, tmp) = blob_temp(blobs)?;
    let r = (|| {
        let mut out = Hashing {
            file: new_blob_file(&tmp)?,
            hash: Sha256::new(),
        };
        if !store
            .get_blob(tenant, sha256, &mut out)
            .map_err(io::Error::other)?
        {
            return Ok(false);
        }
        let got = hex(&out.hash.finalize());
        if got != sha256 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("blob {sha256}: the store's bytes hash to {got}"),
            ));
        }
        fs::rename(&tmp, &dst)?;
        Ok(true)
    })();
    if !matches!(r, Ok(true)) {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// A file that hashes what is written to it.
struct Hashing {
    file: fs::File,
    hash: Sha256,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// What [`place`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Files written into the channel's `artifact/`.
    pub files: usize,
    /// Artifacts left out, each with why (not shared by the child's node,
    /// a bad name, an IO failure).
    pub missing: Vec<String>,
}

/// Writes each artifact into `channel/artifact/<name>` from this node's
/// blob store, fetching what it lacks from the shared store. `artifact/`
/// is made, if missing, for `uid` (the child's, as on the child's node);
/// the files are the tree's owner's. Nothing is written through a symlink:
/// every directory from the channel down is checked before it is entered.
pub fn place(
    store: &dyn Store,
    tenant: &TenantId,
    blobs: &Path,
    artifacts: &[Artifact],
    channel: &Path,
    uid: u32,
) -> Placed {
    let mut out = Placed::default();
    let adir = channel.join("artifact");
    if let Err(e) = crate::projection::make_dir(&adir, uid) {
        out.missing = artifacts
            .iter()
            .map(|a| format!("artifact/{}: {e}", a.name))
            .collect();
        return out;
    }
    for (i, a) in artifacts.iter().enumerate() {
        match place_one(store, tenant, blobs, a, &adir, i as u64) {
            Ok(()) => out.files += 1,
            Err(e) => out.missing.push(format!("artifact/{}: {e}", a.name)),
        }
    }
    out
}

fn place_one(
    store: &dyn Store,
    tenant: &TenantId,
    blobs: &Path,
    a: &Artifact,
    adir: &Path,
    nonce: u64,
) -> io::Result<()> {
    let rel = relative(&a.name)
        .ok_or_else(|| io::Error::other("not a relative path inside artifact/"))?;
    let path = checked_dirs(adir, &rel)?;
    if !fetch_blob(store, tenant, blobs, &a.sha256)? {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "its bytes are on the node that ran the child, which did not share them",
        ));
    }
    let mut src = fs::File::open(blob_path(blobs, &a.sha256))?;
    crate::projection::copy_atomic(&path, &mut src, nonce, crate::projection::ctx_owner())
}

/// `adir/rel`, with every directory between made (for the tree's owner) or
/// checked to be a directory and no symlink, from `adir` down.
fn checked_dirs(adir: &Path, rel: &Path) -> io::Result<PathBuf> {
    let mut at = adir.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(c) = parts.next() {
        at.push(c);
        if parts.peek().is_none() {
            break;
        }
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} is not a directory (a symlink is never followed)",
                    at.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                crate::projection::make_dirs(&at, crate::projection::ctx_owner())?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood_store::SqliteStore;
    use brood_store::prelude::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    fn setup() -> (tempfile::TempDir, SqliteStore, TenantId, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&d.path().join("brood.db")).unwrap();
        let blobs = d.path().join("blobs");
        (d, store, TenantId::new("t").unwrap(), blobs)
    }

    fn artifact(name: &str, bytes: &[u8]) -> Artifact {
        Artifact {
            name: name.into(),
            sha256: sha256_hex(bytes),
            size: bytes.len() as u64,
        }
    }

    /// Nothing but blobs in the blob store: no temp file left behind.
    fn blob_files(blobs: &Path) -> Vec<String> {
        fs::read_dir(blobs.join("sha256"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn shared_bytes_reach_another_blob_store_and_the_channel() {
        let (d, store, t, here) = setup();
        let there = d.path().join("there");
        let a = artifact("sub/out.bin", b"the child's bytes");
        fs::create_dir_all(here.join("sha256")).unwrap();
        fs::write(blob_path(&here, &a.sha256), b"the child's bytes").unwrap();
        share(&store, &t, &here, std::slice::from_ref(&a)).unwrap();

        let channel = d.path().join("channel");
        let placed = place(&store, &t, &there, std::slice::from_ref(&a), &channel, 0);
        assert_eq!(
            placed,
            Placed {
                files: 1,
                missing: vec![]
            }
        );
        assert_eq!(
            fs::read(channel.join("artifact/sub/out.bin")).unwrap(),
            b"the child's bytes"
        );
        assert_eq!(blob_files(&there), vec![a.sha256.clone()]);
    }

    #[test]
    fn bytes_that_do_not_hash_to_their_name_are_refused_and_leave_nothing() {
        let (d, store, t, blobs) = setup();
        // The store holds other bytes under this name (a node that lied, a
        // row changed by hand): the fetch refuses them, naming the hash.
        let a = artifact("out.txt", b"what the child wrote");
        let lie = b"something else entirely";
        store
            .put_blob(&t, &a.sha256, lie.len() as u64, &mut &lie[..])
            .unwrap();
        let e = fetch_blob(&store, &t, &blobs, &a.sha256).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains(&a.sha256), "{e}");
        assert!(blob_files(&blobs).is_empty(), "{:?}", blob_files(&blobs));

        let channel = d.path().join("channel");
        let placed = place(&store, &t, &blobs, std::slice::from_ref(&a), &channel, 0);
        assert_eq!(placed.files, 0);
        assert!(
            placed.missing[0].starts_with("artifact/out.txt:"),
            "{placed:?}"
        );
        assert!(!channel.join("artifact/out.txt").exists());
    }

    #[test]
    fn nothing_is_written_through_a_symlink_or_outside_the_channel() {
        let (d, store, t, blobs) = setup();
        let outside = d.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        let channel = d.path().join("channel");
        fs::create_dir_all(channel.join("artifact")).unwrap();
        std::os::unix::fs::symlink(&outside, channel.join("artifact/sub")).unwrap();
        let bytes = b"payload";
        let arts = [
            artifact("sub/x.txt", bytes),
            artifact("../escape.txt", bytes),
            artifact("never-shared.txt", b"kept on the other node"),
        ];
        store
            .put_blob(&t, &arts[0].sha256, bytes.len() as u64, &mut &bytes[..])
            .unwrap();
        let placed = place(&store, &t, &blobs, &arts, &channel, 0);
        assert_eq!(placed.files, 0, "{placed:?}");
        let why = placed.missing.join("\n");
        assert!(
            why.contains("artifact/sub/x.txt:") && why.contains("symlink"),
            "{why}"
        );
        assert!(
            why.contains("artifact/../escape.txt: not a relative path"),
            "{why}"
        );
        assert!(
            why.contains("artifact/never-shared.txt:") && why.contains("did not share"),
            "{why}"
        );
        assert_eq!(
            fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing outside"
        );
        assert!(!d.path().join("escape.txt").exists());
    }
}
