//! `Idempotency-Key` (SPEC 11): a mutation sent with a key keeps its first
//! answer in the store for [`TTL_MS`]; a repeat with the same key, caller, route
//! and body gets that answer (marked `Idempotent-Replayed: true`) without the
//! mutation being done again, even after the daemon restarted; the same key
//! with another request is refused with 422. Two repeats in flight at once
//! are taken one after the other, so the second sees the first's answer.
//! A key is its caller's own (issue 24): the same key from another caller is
//! another key, so no caller can squat a key another will use, and a 422
//! only ever names the caller's own earlier request.
//! Answers with a 5xx or 429 status are not kept: the mutation did not
//! happen, and a retry should try it again.
//! The request's hash is kept too; a body carrying secret values (issue 25:
//! `secrets` of a creation or a resume) is hashed with their names in place
//! of the values ([`fingerprint`]), so the store never holds even a hash of
//! a value that could be checked against a guess.

use std::future::Future;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::{ApiError, Caller};
use brood_store::IdempotentReply;
use sha2::{Digest, Sha256};

use crate::auth::caller_label;
use crate::error::{HttpError, bad, now_ms, raw_json};
use crate::state::Api;

/// How long an answer is kept.
const TTL_MS: i64 = 24 * 3600 * 1000;

/// The header that carries the key.
pub(crate) const HEADER: &str = "idempotency-key";

/// Runs the mutation `f` of `route` (`POST /api/agents`) once per key.
pub(crate) async fn once<F, Fut>(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    route: &str,
    body: &[u8],
    f: F,
) -> Response
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Response>,
{
    let Some(key) = headers.get(HEADER) else {
        return f().await;
    };
    let key = match key.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()) => {
            k.to_owned()
        }
        _ => {
            return bad("Idempotency-Key must be 1 to 255 visible ASCII characters")
                .into_response();
        }
    };
    let who = caller_label(caller);
    let scope = format!("{who} {route}");
    let hash: String = Sha256::digest(fingerprint(body))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let sup = api.sup();
    // In flight, too, a key is its caller's: another caller's never waits on it.
    let flight = format!("{who}\n{key}");
    let lock = api.0.in_flight.lock_for(&flight);
    let answer = {
        let _held = lock.lock().await;
        match sup
            .store()
            .idempotent_reply(sup.tenant(), &who, &key, now_ms())
        {
            Err(e) => HttpError(ApiError::from(e)).into_response(),
            Ok(Some(kept)) => replay(&kept, &scope, &hash),
            Ok(None) => {
                let resp = f().await;
                keep(api, &who, &key, &scope, &hash, resp).await
            }
        }
    };
    drop(lock);
    api.0.in_flight.release(&flight);
    answer
}

/// What a request's hash is taken over: its bytes, or, when it is a JSON
/// object with `secrets`, the object with each secret's value left out
/// (its names, sorted, in its place). Two requests that differ only in a
/// secret's value are then the same request, which is what a repeat is.
fn fingerprint(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Ok(serde_json::Value::Object(mut o)) = serde_json::from_slice(body) else {
        return body.into();
    };
    let Some(secrets) = o.get_mut("secrets") else {
        return body.into();
    };
    if let Some(m) = secrets.as_object() {
        *secrets = m.keys().cloned().map(serde_json::Value::String).collect();
    } else {
        // Not a map of values (and refused as such): nothing of it is kept.
        *secrets = serde_json::Value::Null;
    }
    serde_json::Value::Object(o).to_string().into_bytes().into()
}

fn replay(kept: &IdempotentReply, scope: &str, hash: &str) -> Response {
    if kept.scope != scope || kept.request_hash != hash {
        return HttpError(ApiError::new(
            Code::IdempotencyMismatch,
            format!(
                "Idempotency-Key {:?} was used for another request ({}); use a new key for a new request",
                kept.key, kept.scope
            ),
        ))
        .into_response();
    }
    let status = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::OK);
    let mut r = raw_json(status, kept.body.clone().into_bytes());
    r.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    r
}

async fn keep(
    api: &Api,
    caller: &str,
    key: &str,
    scope: &str,
    hash: &str,
    resp: Response,
) -> Response {
    let status = resp.status();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "reading a reply to keep it failed");
            return HttpError(ApiError::new(Code::Internal, "the reply could not be kept"))
                .into_response();
        }
    };
    let now = now_ms();
    let reply = IdempotentReply {
        tenant: api.sup().tenant().clone(),
        caller: caller.to_owned(),
        key: key.to_owned(),
        scope: scope.to_owned(),
        request_hash: hash.to_owned(),
        status: status.as_u16(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
        created_ms: now,
        expires_ms: now + TTL_MS,
    };
    if let Err(e) = api.sup().store().keep_idempotent_reply(&reply, now) {
        // The mutation happened; say so, and log that a repeat would redo it.
        tracing::error!(error = %e, key, "keeping an idempotent answer failed");
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::fingerprint;

    #[test]
    fn a_secrets_value_is_not_in_what_is_hashed() {
        let a = br#"{"argv": ["x"], "secrets": {"KEY": "sk-one", "B": "2"}}"#;
        let b = br#"{"argv": ["x"], "secrets": {"KEY": "sk-two", "B": "3"}}"#;
        let fa = fingerprint(a);
        assert!(!String::from_utf8_lossy(&fa).contains("sk-one"));
        assert_eq!(fa, fingerprint(b));
        let plain = br#"{"argv": ["x"], "task": "secrets"}"#;
        assert_eq!(&*fingerprint(plain), &plain[..], "other bodies as they are");
        let odd = br#"{"argv": ["x"], "secrets": "sk-one"}"#;
        assert!(!String::from_utf8_lossy(&fingerprint(odd)).contains("sk-one"));
    }
}
