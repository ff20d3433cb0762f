//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on
//! PostgreSQL, with the SQLite store's SQL: each chunk a transaction of its
//! own, none taking a tenant's lock (a blob is named by its content, so two
//! writers of one blob write the same bytes), none announced (the news that
//! names the blob, a child's end, is).

use std::io::{Read, Write};

use brood_core::TenantId;

use super::PgStore;
use crate::blobs::{I_BLOB, Q_BLOB, Q_CHUNK, U_CHUNK, check_name, get_chunks, put_chunks};
use crate::contract::Blobs;
use crate::types::{Result, StoreError};

impl Blobs for PgStore {
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
            self.write_quiet(|db| db.exec(U_CHUNK, &[&t, &sha256, &seq, &bytes]))
                .map(|_| ())
        })?;
        let size = i64::try_from(size).map_err(|_| StoreError::Corrupt {
            what: "blobs.size",
            value: size.to_string(),
        })?;
        let now = crate::now_ms();
        self.write_quiet(|db| db.exec(I_BLOB, &[&t, &sha256, &size, &chunks, &now]))?;
        Ok(())
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
                self.read(|db| {
                    db.query_opt(Q_CHUNK, &[&t, &sha256, &seq])?
                        .map(|r| r.try_get::<_, Vec<u8>>(0))
                        .transpose()
                        .map_err(Into::into)
                })
            },
            dst,
        )?;
        Ok(true)
    }
}

impl PgStore {
    /// A whole blob's size and number of chunks.
    fn blob_head(&self, tenant: &TenantId, sha256: &str) -> Result<Option<(i64, i64)>> {
        let t = tenant.as_str();
        self.read(|db| {
            db.query_opt(Q_BLOB, &[&t, &sha256])?
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .transpose()
        })
    }
}
