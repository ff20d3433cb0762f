//! [`Blobs`] once for every [`SqlStore`]: the shared chunking and steps
//! (`crate::blobs`), each chunk a transaction of its own, so other writers
//! get the store between them; none takes a tenant's lock (a blob is named
//! by its content, so two writers of one blob write the same bytes) and
//! none is announced (the news that names the blob, a child's end, is).

use std::io::{Read, Write};

use brood_core::TenantId;

use super::SqlStore;
use crate::blobs::{self, get, put};
use crate::contract::Blobs;
use crate::types::Result;

impl<S: SqlStore> Blobs for S {
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
            || self.reading(|db| blobs::head(db, t, sha256)),
            |seq, bytes| self.writing_quiet(|db| blobs::write_chunk(db, t, sha256, seq, bytes)),
            |size, chunks| self.writing_quiet(|db| blobs::write_head(db, t, sha256, size, chunks)),
        )
    }

    fn get_blob(&self, tenant: &TenantId, sha256: &str, dst: &mut dyn Write) -> Result<bool> {
        let t = tenant.as_str();
        get(
            sha256,
            dst,
            || self.reading(|db| blobs::head(db, t, sha256)),
            |seq| self.reading(|db| blobs::read_chunk(db, t, sha256, seq)),
        )
    }
}
