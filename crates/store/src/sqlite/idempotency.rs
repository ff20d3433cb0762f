//! The API's idempotency keys on SQLite (`Idempotency`).

use brood_core::TenantId;
use rusqlite::OptionalExtension;

use super::SqliteStore;
use crate::contract::Idempotency;
use crate::types::IdempotentReply;
use crate::types::Result;

const Q_REPLY: &str = "SELECT caller, key, scope, request_hash, status, body, created_ms, expires_ms \
     FROM idempotency WHERE tenant = ?1 AND caller = ?2 AND key = ?3 AND expires_ms > ?4";
const D_EXPIRED: &str = "DELETE FROM idempotency WHERE tenant = ?1 AND expires_ms <= ?2";
const I_REPLY: &str = "INSERT OR IGNORE INTO idempotency \
     (tenant, caller, key, scope, request_hash, status, body, created_ms, expires_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

fn reply_row(tenant: &TenantId, r: &rusqlite::Row<'_>) -> rusqlite::Result<IdempotentReply> {
    Ok(IdempotentReply {
        tenant: tenant.clone(),
        caller: r.get(0)?,
        key: r.get(1)?,
        scope: r.get(2)?,
        request_hash: r.get(3)?,
        status: r.get(4)?,
        body: r.get(5)?,
        created_ms: r.get(6)?,
        expires_ms: r.get(7)?,
    })
}

impl Idempotency for SqliteStore {
    fn idempotent_reply(
        &self,
        tenant: &TenantId,
        caller: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<IdempotentReply>> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(Q_REPLY)?
                .query_row((tenant.as_str(), caller, key, now_ms), |r| {
                    reply_row(tenant, r)
                })
                .optional()?)
        })
    }

    fn keep_idempotent_reply(
        &self,
        reply: &IdempotentReply,
        now_ms: i64,
    ) -> Result<IdempotentReply> {
        let tenant = &reply.tenant;
        self.write(|tx| {
            tx.prepare_cached(D_EXPIRED)?
                .execute((tenant.as_str(), now_ms))?;
            tx.prepare_cached(I_REPLY)?.execute((
                tenant.as_str(),
                &reply.caller,
                &reply.key,
                &reply.scope,
                &reply.request_hash,
                reply.status,
                &reply.body,
                reply.created_ms,
                reply.expires_ms,
            ))?;
            Ok(tx
                .prepare_cached(Q_REPLY)?
                .query_row((tenant.as_str(), &reply.caller, &reply.key, now_ms), |r| {
                    reply_row(tenant, r)
                })?)
        })
    }
}
