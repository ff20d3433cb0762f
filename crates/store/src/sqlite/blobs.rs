//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on SQLite:
//! each chunk a write transaction of its own, so other writers get the
//! lock between them.

use std::io::{Read, Write};

use rusqlite::OptionalExtension;

use super::SqliteStore;
use crate::blobs::{Head, I_BLOB, Q_BLOB, Q_CHUNK, U_CHUNK, get, put};
use crate::contract::Blobs;
use crate::types::Result;
use brood_core::TenantId;

impl Blobs for SqliteStore {
    fn put_blob(
        &self,
        tenant: &TenantId,
        sha256: &str,
        size: u64,
        src: &mut dyn Read,
    ) -> Result<()> {
        let t = tenant.as_str();
        put(
            sha256,
            size,
            src,
            || self.blob_head(t, sha256),
            |seq, bytes| {
                self.write(|tx| {
                    tx.prepare_cached(U_CHUNK)?
                        .execute(rusqlite::params![t, sha256, seq, bytes])?;
                    Ok(())
                })
            },
            |size, chunks| {
                self.write(|tx| {
                    let now = crate::now_ms();
                    tx.prepare_cached(I_BLOB)?
                        .execute(rusqlite::params![t, sha256, size, chunks, now])?;
                    Ok(())
                })
            },
        )
    }

    fn get_blob(&self, tenant: &TenantId, sha256: &str, dst: &mut dyn Write) -> Result<bool> {
        let t = tenant.as_str();
        get(
            sha256,
            dst,
            || self.blob_head(t, sha256),
            |seq| {
                self.read(|c| {
                    Ok(c.prepare_cached(Q_CHUNK)?
                        .query_row(rusqlite::params![t, sha256, seq], |r| r.get(0))
                        .optional()?)
                })
            },
        )
    }
}

impl SqliteStore {
    fn blob_head(&self, tenant: &str, sha256: &str) -> Result<Head> {
        self.read(|c| {
            Ok(c.prepare_cached(Q_BLOB)?
                .query_row((tenant, sha256), |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?)
        })
    }
}
