//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on
//! PostgreSQL, with the SQLite store's SQL: each chunk a transaction of its
//! own, none taking a tenant's lock (a blob is named by its content, so two
//! writers of one blob write the same bytes), none announced (the news that
//! names the blob, a child's end, is).

use std::io::{Read, Write};

use brood_core::TenantId;

use super::PgStore;
use crate::blobs::{Head, I_BLOB, Q_BLOB, Q_CHUNK, U_CHUNK, get, put};
use crate::contract::Blobs;
use crate::types::Result;

impl Blobs for PgStore {
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
                self.write_quiet(|db| db.exec(U_CHUNK, &[&t, &sha256, &seq, &bytes]))
                    .map(drop)
            },
            |size, chunks| {
                let now = crate::now_ms();
                self.write_quiet(|db| db.exec(I_BLOB, &[&t, &sha256, &size, &chunks, &now]))
                    .map(drop)
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
                self.read(|db| {
                    db.query_opt(Q_CHUNK, &[&t, &sha256, &seq])?
                        .map(|r| r.try_get::<_, Vec<u8>>(0))
                        .transpose()
                        .map_err(Into::into)
                })
            },
        )
    }
}

impl PgStore {
    fn blob_head(&self, tenant: &str, sha256: &str) -> Result<Head> {
        self.read(|db| {
            db.query_opt(Q_BLOB, &[&tenant, &sha256])?
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .transpose()
        })
    }
}
