//! The caller's W3C trace context (issue 30): the `traceparent` header of
//! `POST /api/agents` and of `/mcp`, read at the edge, a malformed one
//! refused naming what is wrong with it.

use axum::http::HeaderMap;
use brood_core::Code;
use brood_runtime::ApiError;

/// The `traceparent` header, when there is one.
pub(crate) fn traceparent(
    headers: &HeaderMap,
) -> Result<Option<brood_otel::TraceContext>, ApiError> {
    let mut values = headers.get_all("traceparent").iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::new(
            Code::BadRequest,
            "traceparent: given more than once",
        ));
    }
    let s = v
        .to_str()
        .map_err(|_| ApiError::new(Code::BadRequest, "traceparent: not visible ASCII"))?;
    brood_otel::TraceContext::parse(s)
        .map(Some)
        .map_err(|e| ApiError::new(Code::BadRequest, format!("traceparent: {e}")))
}
