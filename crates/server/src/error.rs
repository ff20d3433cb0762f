//! Errors as the API answers them: `{"error":{"code","reason","message"}}`
//! with the status of `brood_api::http_status`. Internal details went to the
//! log where they happened; the message here never carries them.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::ApiError;
use serde::Serialize;

/// An [`ApiError`] on its way to an HTTP client.
#[derive(Debug)]
pub(crate) struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> HttpError {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(brood_api::http_status(self.0.code))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = json(
            status,
            &brood_api::ErrorBody::new(self.0.code, self.0.message),
        );
        if let Some(secs) = self.0.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

/// A JSON reply.
pub(crate) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => raw_json(status, bytes),
        Err(e) => {
            tracing::error!(error = %e, "serialising a reply failed");
            let body = brood_api::ErrorBody::new(Code::Internal, "the reply could not be written");
            raw_json(
                StatusCode::INTERNAL_SERVER_ERROR,
                serde_json::to_vec(&body).unwrap_or_default(),
            )
        }
    }
}

/// A reply whose JSON is already written (a kept idempotent answer).
pub(crate) fn raw_json(status: StatusCode, bytes: Vec<u8>) -> Response {
    let mut r = (status, bytes).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn bad(message: impl Into<String>) -> HttpError {
    HttpError(ApiError::new(Code::BadRequest, message))
}

/// A verb's answer: `status` with its JSON body, or its error's.
pub(crate) fn answer<T: Serialize>(status: StatusCode, r: Result<T, ApiError>) -> Response {
    match r {
        Ok(v) => json(status, &v),
        Err(e) => HttpError(e).into_response(),
    }
}

/// Milliseconds since the epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
