//! The API's idempotency keys: the first answer wins and is kept until it
//! expires, per tenant and per caller.

use brood_store::IdempotentReply;

use crate::*;

fn reply(t: &TenantId, caller: &str, key: &str, body: &str, now: i64, ttl: i64) -> IdempotentReply {
    IdempotentReply {
        tenant: t.clone(),
        caller: caller.to_owned(),
        key: key.to_owned(),
        scope: format!("{caller} POST /api/agents"),
        request_hash: format!("hash-of-{body}"),
        status: 201,
        body: body.to_owned(),
        created_ms: now,
        expires_ms: now + ttl,
    }
}

const OP: &str = "user:0";

pub fn idempotent_replies_keep_the_first_answer_until_they_expire(store: &dyn Store) {
    let t = tenant("conf-idempotency");
    let at = now();
    assert_eq!(store.idempotent_reply(&t, OP, "k1", at).unwrap(), None);
    let first = reply(&t, OP, "k1", "first", at, 60_000);
    assert_eq!(store.keep_idempotent_reply(&first, at).unwrap(), first);
    assert_eq!(
        store.idempotent_reply(&t, OP, "k1", at).unwrap(),
        Some(first.clone())
    );
    // A second answer under the same key does not replace the first.
    let second = reply(&t, OP, "k1", "second", at + 1, 60_000);
    assert_eq!(store.keep_idempotent_reply(&second, at + 1).unwrap(), first);
    // Keys are the tenant's own.
    let other = tenant("conf-idempotency-other");
    assert_eq!(store.idempotent_reply(&other, OP, "k1", at).unwrap(), None);
    // Once expired, the key is forgotten and may be used afresh.
    let later = at + 60_001;
    assert_eq!(store.idempotent_reply(&t, OP, "k1", later).unwrap(), None);
    let fresh = reply(&t, OP, "k1", "fresh", later, 60_000);
    assert_eq!(store.keep_idempotent_reply(&fresh, later).unwrap(), fresh);
    assert_eq!(
        store.idempotent_reply(&t, OP, "k1", later).unwrap(),
        Some(fresh)
    );
}

/// Issue 24: the same key from two callers is two keys. An agent that sent
/// a key first does not take it from the operator, and neither sees the
/// other's answer.
pub fn idempotency_keys_are_the_callers_own(store: &dyn Store) {
    let t = tenant("conf-idempotency-callers");
    let at = now();
    let squat = reply(&t, "agent:squatter", "shared", "the agent's", at, 60_000);
    assert_eq!(store.keep_idempotent_reply(&squat, at).unwrap(), squat);
    // The operator's key of the same text is still free, and then its own.
    assert_eq!(store.idempotent_reply(&t, OP, "shared", at).unwrap(), None);
    let mine = reply(&t, OP, "shared", "the operator's", at + 1, 60_000);
    assert_eq!(store.keep_idempotent_reply(&mine, at + 1).unwrap(), mine);
    assert_eq!(
        store.idempotent_reply(&t, OP, "shared", at + 2).unwrap(),
        Some(mine)
    );
    assert_eq!(
        store
            .idempotent_reply(&t, "agent:squatter", "shared", at + 2)
            .unwrap(),
        Some(squat)
    );
    // A third caller has neither.
    assert_eq!(
        store
            .idempotent_reply(&t, "agent:other", "shared", at + 2)
            .unwrap(),
        None
    );
}
