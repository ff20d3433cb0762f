//! The routes about the service itself: health, metrics, the OpenAPI
//! document; JSON errors for unknown paths and methods. What describes the
//! host or every tree (`/metrics`, `/api/nodes`) is the operator's: an
//! agent caller is answered 403 ([`operator_only`]).

use axum::Extension;
use axum::extract::{OriginalUri, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brood_api::{ErrorBody, Health};
use brood_core::Code;
use brood_runtime::{ApiError, Caller};

use crate::error::{HttpError, json};
use crate::state::Api;

#[utoipa::path(
    get, path = "/healthz", tag = "service",
    responses(
        (status = 200, description = "The supervisor answers; `status` is `degraded` while its store does not.", body = Health),
        (status = 503, description = "The node is starting (recovering its agents, rebuilding its ctx tree); `Retry-After` says when to ask again. Other requests made meanwhile wait for the start.", body = ErrorBody),
    )
)]
pub(crate) async fn healthz(State(api): State<Api>) -> Response {
    let (status, store) = match api.sup().store_health() {
        Ok(()) => ("ok", "ok".to_owned()),
        Err(why) => ("degraded", why),
    };
    json(
        StatusCode::OK,
        &Health {
            status: status.into(),
            store,
            version: env!("CARGO_PKG_VERSION").into(),
            tenant: api.sup().tenant().to_string(),
            containment: api.sup().host_info().containment.clone(),
        },
    )
}

#[utoipa::path(
    get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Prometheus text exposition.", content_type = "text/plain", body = String),
        (status = 403, description = "The caller is an agent: the metrics count every tree.", body = ErrorBody),
    )
)]
pub(crate) async fn metrics(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Response {
    if let Err(e) = operator_only(&caller, "/metrics", "counts every tree's agents") {
        return e.into_response();
    }
    let mut r = api.sup().metrics_text().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[utoipa::path(
    get, path = "/api/nodes", tag = "service",
    responses(
        (status = 200, description = "The nodes sharing this store (brood serve processes): address, labels, capacity, load and heartbeat.", body = brood_api::NodeList),
        (status = 403, description = "The caller is an agent: the nodes describe the host.", body = ErrorBody),
    )
)]
pub(crate) async fn nodes(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Response {
    if let Err(e) = operator_only(&caller, "/api/nodes", "names the host's listeners") {
        return e.into_response();
    }
    let sup = api.sup();
    crate::error::answer(
        StatusCode::OK,
        brood_runtime::nodes::list(sup.store().as_ref()),
    )
}

/// A route that describes the host or every tree answers an agent 403
/// (issue 24): an agent learns about its own subtree only.
pub(crate) fn operator_only(caller: &Caller, route: &str, why: &str) -> Result<(), HttpError> {
    match caller {
        Caller::User { .. } => Ok(()),
        Caller::Agent(me) => Err(HttpError(ApiError::new(
            Code::Forbidden,
            format!("{route} {why}: it is the operator's, not agent {me}'s"),
        ))),
    }
}

pub(crate) async fn no_route(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    HttpError(ApiError::new(
        Code::NotFound,
        format!(
            "no route {method} {}; the routes are in /api/openapi.json",
            uri.path()
        ),
    ))
    .into_response()
}

/// A route's 405. Its `Allow` header is axum's, which lists the methods
/// the route has (a header set here would be taken instead).
pub(crate) async fn no_method(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    json(
        StatusCode::METHOD_NOT_ALLOWED,
        &ErrorBody::new(
            Code::BadRequest,
            format!(
                "{} does not take {method}; the routes are in /api/openapi.json",
                uri.path()
            ),
        ),
    )
}
