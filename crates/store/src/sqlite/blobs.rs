//! Artifacts' bytes shared between nodes (`Blobs`, issue 15) on SQLite:
//! the shared chunking and steps (`crate::blobs`), each chunk a write
//! transaction of its own, so other writers get the lock between them.

use std::io::{Read, Write};

use super::SqliteStore;
use crate::blobs::{self, get, put};
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
            || self.read(|c| blobs::head(c, t, sha256)),
            |seq, bytes| self.write(|tx| blobs::write_chunk(tx, t, sha256, seq, bytes)),
            |size, chunks| self.write(|tx| blobs::write_head(tx, t, sha256, size, chunks)),
        )
    }

    fn get_blob(&self, tenant: &TenantId, sha256: &str, dst: &mut dyn Write) -> Result<bool> {
        let t = tenant.as_str();
        get(
            sha256,
            dst,
            || self.read(|c| blobs::head(c, t, sha256)),
            |seq| self.read(|c| blobs::read_chunk(c, t, sha256, seq)),
        )
    }
}
