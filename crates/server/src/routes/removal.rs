//! Removing what has finished (issue 25): a tree (`DELETE
//! /api/agents/{name}`), every finished tree past an age (`POST
//! /api/prune`), a job (`DELETE /api/jobs/{id}`). Each goes through the
//! supervisor (`Supervisor::remove_tree`, `prune`, `remove_job`), which
//! authorises the caller: the operator removes any tree, an agent only
//! within its own subtree (so never a whole tree) and only its own jobs.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brood_api::{ErrorBody, PRUNE_MAX_AGE_S, PruneBody, PruneReply, RemovedJob, RemovedTree};
use brood_runtime::Caller;

use super::path_name;
use crate::body::Body;
use crate::error::{HttpError, answer, bad};
use crate::idempotency;
use crate::state::Api;

#[utoipa::path(
    delete, path = "/api/agents/{name}", tag = "agents",
    params(("name" = String, Path, description = "The root of the tree to remove."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key: a repeat gets the first answer.")),
    responses(
        (status = 200, description = "Removed: the tree's every record (agents, runs, events, messages, channels, the jobs its agents owned) and its ctx files; its names are free again.", body = RemovedTree),
        (status = 400, description = "Not a root (a tree is removed whole, from its root), or a malformed Idempotency-Key.", body = ErrorBody),
        (status = 401, description = "TCP without the bearer token.", body = ErrorBody),
        (status = 403, description = "An agent: a whole tree is never within its own subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
        (status = 409, description = "An agent of the tree has not ended (it is named with its status), or a job one of them owns is pending or running.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn remove(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let route = format!("DELETE /api/agents/{name}");
    idempotency::once(&api, &caller, &headers, &route, b"", || async {
        let name = match path_name(&name) {
            Ok(n) => n,
            Err(e) => return e.into_response(),
        };
        answer(
            StatusCode::OK,
            api.sup().remove_tree(caller.clone(), name).await,
        )
    })
    .await
}

#[utoipa::path(
    post, path = "/api/prune", tag = "agents",
    request_body = PruneBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "The trees removed (with `dry_run`, that would be), oldest first: every tree whose agents have all ended, that owns no pending or running job, and whose last end is at least `older_than_s` old; those that changed meanwhile are in `skipped` with the reason.", body = PruneReply),
        (status = 400, description = "Malformed: not JSON, an unknown field, `older_than_s` missing or out of its range; or a malformed Idempotency-Key.", body = ErrorBody),
        (status = 401, description = "TCP without the bearer token.", body = ErrorBody),
        (status = 403, description = "An agent: pruning removes whole trees, which is the operator's.", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn prune(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Body<PruneBody>, HttpError>,
) -> Response {
    let Body { value, bytes } = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    idempotency::once(
        &api,
        &caller,
        &headers,
        "POST /api/prune",
        &bytes,
        || async {
            if value.older_than_s > PRUNE_MAX_AGE_S {
                return bad(format!(
                    "older_than_s: at most {PRUNE_MAX_AGE_S} seconds (100 years), not {}",
                    value.older_than_s
                ))
                .into_response();
            }
            let older_than_ms = (value.older_than_s * 1000) as i64;
            answer(
                StatusCode::OK,
                api.sup()
                    .prune(caller.clone(), older_than_ms, value.dry_run)
                    .await,
            )
        },
    )
    .await
}

#[utoipa::path(
    delete, path = "/api/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Removed: the job, its items and attempts, and its own workers' trees (`<job>-w<n>`, each ended); the id is free again.", body = RemovedJob),
        (status = 400, description = "A malformed Idempotency-Key.", body = ErrorBody),
        (status = 401, description = "TCP without the bearer token.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job is running (cancel it first), or one of its workers has not ended.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_remove(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let route = format!("DELETE /api/jobs/{id}");
    idempotency::once(&api, &caller, &headers, &route, b"", || async {
        answer(
            StatusCode::OK,
            api.sup().remove_job(caller.clone(), id.clone()).await,
        )
    })
    .await
}
