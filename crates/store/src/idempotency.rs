//! The API's idempotency keys (SPEC 11, [`crate::Idempotency`]), written
//! once for both stores over [`Db`]: a caller's unexpired answer read, and
//! an answer kept unless one is already, in the store's transaction.

use brood_core::TenantId;

use crate::db::{Db, Row, narrow};
use crate::types::IdempotentReply;

const Q_REPLY: &str = "SELECT caller, key, scope, request_hash, status, body, created_ms, expires_ms \
     FROM idempotency WHERE tenant = ?1 AND caller = ?2 AND key = ?3 AND expires_ms > ?4";
const D_EXPIRED: &str = "DELETE FROM idempotency WHERE tenant = ?1 AND expires_ms <= ?2";
// A key already kept wins: this insert does nothing then (SQLite's
// `INSERT OR IGNORE` on the key, said the way both read). On PostgreSQL a
// key another transaction is inserting makes this one wait for it and then
// do nothing, so the read after it sees the first answer (the tenant's lock
// already queues them; this holds without it).
const I_REPLY: &str = "INSERT INTO idempotency \
     (tenant, caller, key, scope, request_hash, status, body, created_ms, expires_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (tenant, caller, key) DO NOTHING";

fn reply_from<R: Row>(tenant: &TenantId, r: &R) -> Result<IdempotentReply, R::Err> {
    Ok(IdempotentReply {
        tenant: tenant.clone(),
        caller: r.text(0)?,
        key: r.text(1)?,
        scope: r.text(2)?,
        request_hash: r.text(3)?,
        status: narrow(r.int(4)?, "idempotency.status")?,
        body: r.text(5)?,
        created_ms: r.int(6)?,
        expires_ms: r.int(7)?,
    })
}

/// [`crate::Idempotency::idempotent_reply`].
pub(crate) fn reply<D: Db>(
    db: &D,
    tenant: &TenantId,
    caller: &str,
    key: &str,
    now_ms: i64,
) -> Result<Option<IdempotentReply>, D::Err> {
    let params = [
        tenant.as_str().into(),
        caller.into(),
        key.into(),
        now_ms.into(),
    ];
    db.query_opt(Q_REPLY, &params, |r| reply_from(tenant, r))
}

/// [`crate::Idempotency::keep_idempotent_reply`], inside the tenant's
/// write: the tenant's expired keys forgotten, `reply` kept unless an
/// answer is already, and whichever is kept read back.
pub(crate) fn keep<D: Db>(
    db: &D,
    reply: &IdempotentReply,
    now_ms: i64,
) -> Result<IdempotentReply, D::Err> {
    let tenant = &reply.tenant;
    let t = tenant.as_str();
    db.exec(D_EXPIRED, &[t.into(), now_ms.into()])?;
    db.exec(
        I_REPLY,
        &[
            t.into(),
            (&reply.caller).into(),
            (&reply.key).into(),
            (&reply.scope).into(),
            (&reply.request_hash).into(),
            i64::from(reply.status).into(),
            (&reply.body).into(),
            reply.created_ms.into(),
            reply.expires_ms.into(),
        ],
    )?;
    let params = [
        t.into(),
        (&reply.caller).into(),
        (&reply.key).into(),
        now_ms.into(),
    ];
    db.query_one(Q_REPLY, &params, |r| reply_from(tenant, r))
}
