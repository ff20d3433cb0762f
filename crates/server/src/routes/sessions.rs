//! `/api/sessions`: the seed harness's view of the tree. Every agent is one
//! session of sub-agent work; its id is the agent's name and its parent
//! session its parent's.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use brood_api::{ErrorBody, ParentReply, Session, SessionList, SessionTrees};
use brood_runtime::{ApiError, Caller};

use crate::error::{HttpError, json};
use crate::state::{Api, may_see};

fn read<T: serde::Serialize>(
    api: &Api,
    caller: &Caller,
    id: &str,
    f: impl FnOnce() -> Result<T, ApiError>,
) -> Response {
    let r = (|| {
        // Unknown first (404), then someone else's (403).
        api.view().session(id)?;
        if let Ok(n) = brood_core::AgentName::new(id) {
            may_see(api, caller, &n)?;
        }
        Ok::<_, HttpError>(f()?)
    })();
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(
    get, path = "/api/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session's id (its agent's name).")),
    responses(
        (status = 200, description = "The session.", body = Session),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such session.", body = ErrorBody),
    )
)]
pub(crate) async fn session(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    read(&api, &caller, &id, || api.view().session(&id))
}

#[utoipa::path(
    get, path = "/api/sessions/{id}/children", tag = "sessions",
    params(("id" = String, Path, description = "The session's id (its agent's name).")),
    responses(
        (status = 200, description = "Its sub-agent sessions in start order.", body = SessionList),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such session.", body = ErrorBody),
    )
)]
pub(crate) async fn session_children(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    read(&api, &caller, &id, || api.view().session_children(&id))
}

#[utoipa::path(
    get, path = "/api/sessions/{id}/parent", tag = "sessions",
    params(("id" = String, Path, description = "The session's id (its agent's name).")),
    responses(
        (status = 200, description = "Its parent session, `null` for a root's.", body = ParentReply),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such session.", body = ErrorBody),
    )
)]
pub(crate) async fn session_parent(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    read(&api, &caller, &id, || api.view().session_parent(&id))
}

#[utoipa::path(
    get, path = "/api/sessions/tree", tag = "sessions",
    responses(
        (status = 200, description = "Every root's session tree (an agent caller: its own).", body = SessionTrees),
    )
)]
pub(crate) async fn session_tree(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let r = match &caller {
        Caller::User { .. } => api.view().session_tree(None),
        Caller::Agent(me) => api.view().session_tree(Some(me)),
    };
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => HttpError(e).into_response(),
    }
}
