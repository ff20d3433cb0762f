//! What both stores do alike for [`Blobs`](crate::Blobs) (issue 15): the
//! blob's name checked, its bytes cut into chunks on the way in and put
//! back together, counted, on the way out. The SQL is shared too; each
//! store runs it its own way.

use std::io::{Read, Write};

use crate::contract::BLOB_CHUNK;
use crate::db::{Db, Row};
use brood_core::Code;

use crate::types::{Result, StoreError};

const Q_BLOB: &str = "SELECT size, chunks FROM blobs WHERE tenant = ?1 AND sha256 = ?2";
/// A chunk written again (by a put that finishes one a dead writer left)
/// replaces what was there.
const U_CHUNK: &str = "INSERT INTO blob_chunks (tenant, sha256, seq, bytes) \
     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (tenant, sha256, seq) DO UPDATE SET bytes = excluded.bytes";
const I_BLOB: &str = "INSERT INTO blobs (tenant, sha256, size, chunks, created_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, sha256) DO NOTHING";
const Q_CHUNK: &str =
    "SELECT bytes FROM blob_chunks WHERE tenant = ?1 AND sha256 = ?2 AND seq = ?3";

/// A blob's name is its SHA-256 in lowercase hex, as the blob stores on
/// disk name their files.
fn check_name(sha256: &str) -> Result<()> {
    let ok = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Refused {
            code: Code::BadRequest,
            message: format!("blob {sha256:?}: a blob is named by its SHA-256 in lowercase hex"),
        })
    }
}

fn io(sha256: &str, source: std::io::Error) -> StoreError {
    StoreError::BlobIo {
        sha256: sha256.to_owned(),
        source,
    }
}

/// A blob's size and number of chunks, from its head row (none until whole).
pub(crate) type Head = Option<(i64, i64)>;

/// The blob's head: its size and number of chunks, once whole.
pub(crate) fn head<D: Db>(db: &D, tenant: &str, sha256: &str) -> std::result::Result<Head, D::Err> {
    db.query_opt(Q_BLOB, &[tenant.into(), sha256.into()], |r| {
        Ok((r.int(0)?, r.int(1)?))
    })
}

/// Writes chunk `seq` (again, if a dead writer left it).
pub(crate) fn write_chunk<D: Db>(
    db: &D,
    tenant: &str,
    sha256: &str,
    seq: i64,
    bytes: &[u8],
) -> std::result::Result<(), D::Err> {
    let params = [tenant.into(), sha256.into(), seq.into(), bytes.into()];
    db.exec(U_CHUNK, &params).map(drop)
}

/// Writes the head of a blob whose chunks are all written: it is whole.
pub(crate) fn write_head<D: Db>(
    db: &D,
    tenant: &str,
    sha256: &str,
    size: i64,
    chunks: i64,
) -> std::result::Result<(), D::Err> {
    let now = crate::now_ms();
    let params = [
        tenant.into(),
        sha256.into(),
        size.into(),
        chunks.into(),
        now.into(),
    ];
    db.exec(I_BLOB, &params).map(drop)
}

/// Chunk `seq`'s bytes, if it is there.
pub(crate) fn read_chunk<D: Db>(
    db: &D,
    tenant: &str,
    sha256: &str,
    seq: i64,
) -> std::result::Result<Option<Vec<u8>>, D::Err> {
    db.query_opt(Q_CHUNK, &[tenant.into(), sha256.into(), seq.into()], |r| {
        r.bytes(0)
    })
}

/// `Blobs::put_blob` with a store's three steps: `head` (is it whole
/// already?), `chunk` (write one, in its own transaction) and `finish`
/// (write the head: size and number of chunks).
pub(crate) fn put(
    sha256: &str,
    size: u64,
    src: &mut dyn Read,
    head: impl FnOnce() -> Result<Head>,
    chunk: impl FnMut(i64, &[u8]) -> Result<()>,
    finish: impl FnOnce(i64, i64) -> Result<()>,
) -> Result<()> {
    check_name(sha256)?;
    if head()?.is_some() {
        return Ok(());
    }
    let chunks = put_chunks(sha256, size, src, chunk)?;
    let size = i64::try_from(size).map_err(|_| StoreError::Corrupt {
        what: "blobs.size",
        value: size.to_string(),
    })?;
    finish(size, chunks)
}

/// `Blobs::get_blob` with a store's two steps: `head` and `chunk` (read one).
pub(crate) fn get(
    sha256: &str,
    dst: &mut dyn Write,
    head: impl FnOnce() -> Result<Head>,
    chunk: impl FnMut(i64) -> Result<Option<Vec<u8>>>,
) -> Result<bool> {
    check_name(sha256)?;
    let Some(head) = head()? else {
        return Ok(false);
    };
    get_chunks(sha256, head, chunk, dst)?;
    Ok(true)
}

/// Reads `size` bytes from `src` a chunk at a time, handing each to
/// `write` with its number; the number of chunks.
fn put_chunks(
    sha256: &str,
    size: u64,
    src: &mut dyn Read,
    mut write: impl FnMut(i64, &[u8]) -> Result<()>,
) -> Result<i64> {
    let mut buf = vec![0u8; BLOB_CHUNK.min(usize::try_from(size).unwrap_or(BLOB_CHUNK))];
    let (mut done, mut seq) = (0u64, 0i64);
    while done < size {
        let want = usize::try_from(size - done).map_or(buf.len(), |left| left.min(buf.len()));
        let mut got = 0;
        while got < want {
            match src.read(&mut buf[got..want]) {
                Ok(0) => {
                    return Err(io(
                        sha256,
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!(
                                "its source ended after {} of {size} bytes",
                                done + got as u64
                            ),
                        ),
                    ));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(sha256, e)),
            }
        }
        write(seq, &buf[..want])?;
        done += want as u64;
        seq += 1;
    }
    Ok(seq)
}

/// Writes the `chunks` chunks `read` gives to `dst`, in order, checking
/// that none is missing and that they add up to `size`.
fn get_chunks(
    sha256: &str,
    (size, chunks): (i64, i64),
    mut read: impl FnMut(i64) -> Result<Option<Vec<u8>>>,
    dst: &mut dyn Write,
) -> Result<()> {
    let corrupt = |what: String| StoreError::Corrupt {
        what: "blob_chunks",
        value: format!("blob {sha256}: {what}"),
    };
    let mut total = 0i64;
    for seq in 0..chunks {
        let bytes =
            read(seq)?.ok_or_else(|| corrupt(format!("chunk {seq} of {chunks} is missing")))?;
        total += bytes.len() as i64;
        dst.write_all(&bytes).map_err(|e| io(sha256, e))?;
    }
    if total != size {
        return Err(corrupt(format!(
            "its chunks hold {total} bytes, not {size}"
        )));
    }
    dst.flush().map_err(|e| io(sha256, e))
}
