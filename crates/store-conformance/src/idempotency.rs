//! The API's idempotency keys: the first answer wins and is kept until it
//! expires, per tenant.

use brood_store::IdempotentReply;

use crate::*;

fn reply(t: &TenantId, key: &str, body: &str, now: i64, ttl: i64) -> IdempotentReply {
    IdempotentReply {
        tenant: t.clone(),
        key: key.to_owned(),
        scope: "user:0 POST /api/agents".to_owned(),
        request_hash: format!("hash-of-{body}"),
        status: 201,
        body: body.to_owned(),
        created_ms: now,
        expires_ms: now + ttl,
    }
}

pub fn idempotent_replies_keep_the_first_answer_until_they_expire(store: &dyn Store) {
    let t = tenant("conf-idempotency");
    let at = now();
    assert_eq!(store.idempotent_reply(&t, "k1", at).unwrap(), None);
    let first = reply(&t, "k1", "first", at, 60_000);
    assert_eq!(store.keep_idempotent_reply(&first, at).unwrap(), first);
    assert_eq!(
        store.idempotent_reply(&t, "k1", at).unwrap(),
        Some(first.clone())
    );
    // A second answer under the same key does not replace the first.
    let second = reply(&t, "k1", "second", at + 1, 60_000);
    assert_eq!(store.keep_idempotent_reply(&second, at + 1).unwrap(), first);
    // Keys are the tenant's own.
    let other = tenant("conf-idempotency-other");
    assert_eq!(store.idempotent_reply(&other, "k1", at).unwrap(), None);
    // Once expired, the key is forgotten and may be used afresh.
    let later = at + 60_001;
    assert_eq!(store.idempotent_reply(&t, "k1", later).unwrap(), None);
    let fresh = reply(&t, "k1", "fresh", later, 60_000);
    assert_eq!(store.keep_idempotent_reply(&fresh, later).unwrap(), fresh);
    assert_eq!(
        store.idempotent_reply(&t, "k1", later).unwrap(),
        Some(fresh)
    );
}
