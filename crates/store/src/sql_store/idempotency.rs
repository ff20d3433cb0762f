//! [`Idempotency`] once for every [`SqlStore`]: the shared reads and
//! writes (`crate::idempotency`), a key kept in its tenant's transaction.

use brood_core::TenantId;

use super::SqlStore;
use crate::contract::Idempotency;
use crate::idempotency;
use crate::types::{IdempotentReply, Result};

impl<S: SqlStore> Idempotency for S {
    fn idempotent_reply(
        &self,
        tenant: &TenantId,
        caller: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<IdempotentReply>> {
        self.reading(|db| idempotency::reply(db, tenant, caller, key, now_ms))
    }

    fn keep_idempotent_reply(
        &self,
        reply: &IdempotentReply,
        now_ms: i64,
    ) -> Result<IdempotentReply> {
        self.writing(&reply.tenant, |db| idempotency::keep(db, reply, now_ms))
    }
}
