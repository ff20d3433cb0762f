//! Request bodies: JSON of a `brood_api` type, at most [`LIMIT`] bytes (413
//! beyond), read within [`READ_TIMEOUT`] (a client that trickles its body is
//! dropped, not waited for), parsed with the failing field named (400).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_LENGTH;
use brood_core::Code;
use brood_runtime::ApiError;
use serde::de::DeserializeOwned;

use crate::error::{HttpError, bad};

/// The largest request body (the child protocol's line limit, 1 MiB).
pub(crate) const LIMIT: usize = 1 << 20;

/// How long a client has to send its whole body.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed body and its bytes (what an idempotency key's hash covers). An
/// empty body reads as `{}`, so verbs whose fields are all optional need none.
pub(crate) struct Body<T> {
    pub value: T,
    pub bytes: Bytes,
}

fn too_large() -> HttpError {
    HttpError(ApiError::new(
        Code::TooLarge,
        format!("request body over the limit of {LIMIT} bytes"),
    ))
}

/// A body read within the limits but not parsed yet: for a route that
/// parses it off the async threads (a job's input may be a 1 MiB CSV).
pub(crate) struct RawBody {
    pub bytes: Bytes,
}

impl RawBody {
    /// The body as `T`, `{}` when empty, the failing field named.
    pub(crate) fn parse<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        let Some(&first) = self.bytes.iter().find(|b| !b.is_ascii_whitespace()) else {
            return brood_api::parse(b"{}").map_err(bad);
        };
        // serde reads a struct from a JSON array too (`[null, null]` as a
        // resume's fields in order): every body is an object, or nothing.
        if first != b'{' {
            return Err(bad(format!(
                "body: must be a JSON object (or nothing where every field is optional), not {}",
                json_kind(first)
            )));
        }
        brood_api::parse(&self.bytes).map_err(bad)
    }
}

/// What a JSON document starting with `first` is, to name it in a refusal
/// (without quoting it: a body may carry secrets).
fn json_kind(first: u8) -> &'static str {
    match first {
        b'[' => "an array",
        b'"' => "a string",
        b'-' | b'0'..=b'9' => "a number",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "something that is not JSON",
    }
}

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = HttpError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(RawBody {
            bytes: read(req).await?,
        })
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let raw = RawBody {
            bytes: read(req).await?,
        };
        let value = raw.parse()?;
        Ok(Body {
            value,
            bytes: raw.bytes,
        })
    }
}

/// The body's bytes, within [`LIMIT`] and [`READ_TIMEOUT`].
async fn read(req: Request) -> Result<Bytes, HttpError> {
    {
        if let Some(len) = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > LIMIT as u64
        {
            return Err(too_large());
        }
        let read = axum::body::to_bytes(req.into_body(), LIMIT);
        let bytes = match tokio::time::timeout(READ_TIMEOUT, read).await {
            Err(_) => {
                return Err(bad(format!(
                    "request body not received within {} s",
                    READ_TIMEOUT.as_secs()
                )));
            }
            Ok(Err(e)) => {
                let over = std::error::Error::source(&e)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
                    || e.to_string().contains("length limit");
                return Err(if over {
                    too_large()
                } else {
                    bad(format!("reading the request body: {e}"))
                });
            }
            Ok(Ok(b)) => b,
        };
        Ok(bytes)
    }
}
