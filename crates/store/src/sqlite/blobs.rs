//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on SQLite:
//! each chunk a write transaction of its own, so other writers get the
//! lock between them.

use std::io::{Read, Write};

use rusqlite::OptionalExtension;

use super::*;
use crate::blobs::{I_BLOB, Q_BLOB, Q_CHUNK, U_CHUNK, check_name, get_chunks, put_chunks};
use crate::contract::Blobs;

impl Blobs for SqliteStore {
    fn put_blob(
        &self,
        tenant: &TenantId,
        sha256: &str,
        size: u64,
        src: &mut dyn Read,
    ) -> Result<()> {
        check_name(sha256)?;
        if self.blob_head(tenant, sha256)?.is_some() {
            return Ok(());
        }
        let t = tenant.as_str();
        let chunks = put_chunks(sha256, size, src, |seq, bytes| {
            self.write(|tx| {
                tx.prepare_cached(U_CHUNK)?
                    .execute(rusqlite::params![t, sha256, seq, bytes])?;
                Ok(())
            })
        })?;
        let size = i64::try_from(size).map_err(|_| StoreError::Corrupt {
            what: "blobs.size",
            value: size.to_string(),
        })?;
        self.write(|tx| {
            tx.prepare_cached(I_BLOB)?.execute(rusqlite::params![
                t,
                sha256,
                size,
                chunks,
                crate::now_ms()
            ])?;
            Ok(())
        })
    }

    fn get_blob(&self, tenant: &TenantId, sha256: &str, dst: &mut dyn Write) -> Result<bool> {
        check_name(sha256)?;
        let Some(head) = self.blob_head(tenant, sha256)? else {
            return Ok(false);
        };
        let t = tenant.as_str();
        get_chunks(
            sha256,
            head,
            |seq| {
                self.read(|c| {
                    Ok(c.prepare_cached(Q_CHUNK)?
                        .query_row(rusqlite::params![t, sha256, seq], |r| r.get(0))
                        .optional()?)
                })
            },
            dst,
        )?;
        Ok(true)
    }
}

impl SqliteStore {
    /// A whole blob's size and number of chunks.
    fn blob_head(&self, tenant: &TenantId, sha256: &str) -> Result<Option<(i64, i64)>> {
        self.read(|c| {
            Ok(c.prepare_cached(Q_BLOB)?
                .query_row((tenant.as_str(), sha256), |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?)
        })
    }
}
