//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on
//! PostgreSQL: the shared chunking and steps (`crate::blobs`), each chunk a
//! transaction of its own, none taking a tenant's lock (a blob is named by
//! its content, so two writers of one blob write the same bytes), none
//! announced (the news that names the blob, a child's end, is).

use std::io::{Read, Write};

use brood_core::TenantId;

use super::PgStore;
use crate::blobs::{self, get, put};
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
            || self.read(|db| blobs::head(db, t, sha256)),
            |seq, bytes| self.write_quiet(|db| blobs::write_chunk(db, t, sha256, seq, bytes)),
            |size, chunks| self.write_quiet(|db| blobs::write_head(db, t, sha256, size, chunks)),
        )
    }

    fn get_blob(&self, tenant: &TenantId, sha256: &str, dst: &mut dyn Write) -> Result<bool> {
        let t = tenant.as_str();
        get(
            sha256,
            dst,
            || self.read(|db| blobs::head(db, t, sha256)),
            |seq| self.read(|db| blobs::read_chunk(db, t, sha256, seq)),
        )
    }
}
