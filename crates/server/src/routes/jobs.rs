//! `/api/jobs`: creating a job and reading jobs and their items (SPEC 10).
//! Running them (start, cancel, assign, retry, report, export, replay)
//! answers 501 until it exists (`routes::meta`).

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brood_api::{ErrorBody, ItemList, JobBody, JobList, JobView};
use brood_core::{Code, ItemStatus};
use brood_runtime::{ApiError, Caller};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::body::{Body, RawBody};
use crate::error::{HttpError, answer, bad, json, now_ms};
use crate::idempotency;
use crate::state::Api;

#[utoipa::path(
    post, path = "/api/jobs", tag = "jobs",
    request_body = JobBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 201, description = "Created, pending, with every item.", body = JobView),
        (status = 400, description = "Malformed: the input (empty, a missing id column, a duplicate id, a bad line, a NUL byte, a file path), an instruction naming an unknown column, an invalid schema or one referring outside itself, a limit out of its range, a worker program that does not resolve.", body = ErrorBody),
        (status = 403, description = "An agent creating a job for another agent.", body = ErrorBody),
        (status = 404, description = "No such owner.", body = ErrorBody),
        (status = 409, description = "The id is taken.", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB, or more items than items_per_job.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
        (status = 429, description = "The tenant's unfinished jobs or their items are at jobs_per_tenant or items_per_tenant.", body = ErrorBody),
    )
)]
pub(crate) async fn job_create(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<RawBody, HttpError>,
) -> Response {
    let raw = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let bytes = raw.bytes.clone();
    idempotency::once(
        &api,
        &caller,
        &headers,
        "POST /api/jobs",
        &bytes,
        || async {
            // The body parsed, the input read and every item written on a
            // blocking thread: a large input holds no async thread, so
            // `/healthz` and every other request keep answering (issue 24).
            let sup = api.sup().clone();
            let caller = caller.clone();
            let made = tokio::task::spawn_blocking(move || {
                let value: JobBody = raw.parse()?;
                let store = sup.store().as_ref();
                brood_runtime::jobs::create_at(
                    store,
                    sup.tenant(),
                    &caller,
                    value,
                    now_ms(),
                    sup.intake(),
                )
                .and_then(|j| brood_runtime::jobs::view(store, &j))
                .map_err(HttpError)
            })
            .await;
            match made {
                Ok(Ok(v)) => json(StatusCode::CREATED, &v),
                Ok(Err(e)) => e.into_response(),
                Err(e) => {
                    tracing::error!(error = %e, "creating a job did not finish");
                    HttpError(ApiError::new(
                        Code::Internal,
                        "creating the job failed (see the supervisor's log)",
                    ))
                    .into_response()
                }
            }
        },
    )
    .await
}

#[utoipa::path(
    get, path = "/api/jobs", tag = "jobs",
    responses((status = 200, description = "The jobs, oldest first (an agent: its subtree's).", body = JobList))
)]
pub(crate) async fn job_list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = (|| {
        let mut jobs = Vec::new();
        for j in store.jobs(sup.tenant())? {
            // A failed read is an error, not "outside the subtree": the
            // list is refused rather than answered short.
            if let Caller::Agent(me) = &caller
                && !store.is_ancestor_or_self(sup.tenant(), me, &j.owner)?
            {
                continue;
            }
            jobs.push(brood_runtime::jobs::view(store, &j)?);
        }
        Ok(JobList { jobs })
    })();
    answer(StatusCode::OK, r)
}

#[utoipa::path(
    get, path = "/api/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The job and its counts by status.", body = JobView),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
    )
)]
pub(crate) async fn job_get(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = brood_runtime::jobs::get(store, sup.tenant(), &caller, &id)
        .and_then(|j| brood_runtime::jobs::view(store, &j));
    answer(StatusCode::OK, r)
}

/// `GET /api/jobs/{id}/items`'s filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ItemsQuery {
    /// Only items in this status (`pending running completed failed reported`).
    #[param(pattern = "^(pending|running|completed|failed|reported)$")]
    pub status: Option<String>,
}

#[utoipa::path(
    get, path = "/api/jobs/{id}/items", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."), ItemsQuery),
    responses(
        (status = 200, description = "The items in input order.", body = ItemList),
        (status = 400, description = "An unknown status.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
    )
)]
pub(crate) async fn job_items(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<ItemsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = (|| {
        let Query(q) = query.map_err(|e| bad(format!("query: {}", e.body_text())))?;
        let status = match q.status.as_deref() {
            None => None,
            Some(s) => Some(ItemStatus::parse(s).ok_or_else(|| {
                bad(format!(
                    "status: {s:?} is not pending, running, completed, failed or reported"
                ))
            })?),
        };
        let job = brood_runtime::jobs::get(store, sup.tenant(), &caller, &id)?;
        let items = store
            .job_items(sup.tenant(), &job.id, status)
            .map_err(|e| HttpError(ApiError::from(e)))?;
        Ok::<_, HttpError>(ItemList {
            items: items.iter().map(brood_runtime::jobs::item_view).collect(),
        })
    })();
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn act(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    id: &str,
    verb: &str,
    bytes: &[u8],
) -> Response {
    let route = format!("POST /api/jobs/{id}/{verb}");
    idempotency::once(api, caller, headers, &route, bytes, || async {
        let sup = api.sup();
        let r = if verb == "start" {
            sup.job_start(caller.clone(), id.to_owned()).await
        } else {
            sup.job_cancel(caller.clone(), id.to_owned()).await
        };
        answer(StatusCode::OK, r)
    })
    .await
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/start", tag = "jobs",
    request_body(content = Option<brood_api::EmptyBody>, description = "None, or `{}`."),
    params(("id" = String, Path, description = "The job's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Running: workers are being created as its owner's children.", body = JobView),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "Not pending, or its owner is not running on this supervisor.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_start(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Body<brood_api::EmptyBody>, HttpError>,
) -> Response {
    match body {
        Ok(b) => act(&api, &caller, &headers, &id, "start", &b.bytes).await,
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/cancel", tag = "jobs",
    request_body(content = Option<brood_api::EmptyBody>, description = "None, or `{}`."),
    params(("id" = String, Path, description = "The job's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Cancelled: no more assignment, its workers cancelled, completed items kept.", body = JobView),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "Already finished.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_cancel(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Body<brood_api::EmptyBody>, HttpError>,
) -> Response {
    match body {
        Ok(b) => act(&api, &caller, &headers, &id, "cancel", &b.bytes).await,
        Err(e) => e.into_response(),
    }
}
