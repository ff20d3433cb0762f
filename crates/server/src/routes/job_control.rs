//! `/api/jobs/{id}/…`: a hand on a job's items (assign, retry, a worker's
//! report), its export and evidence, and its replay (SPEC 10 "Control").

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brood_api::{
    AssignBody, AssignReply, EmptyBody, ErrorBody, EvidenceBundle, JobView, ReplayBody, ReportBody,
    ReportReply, RetryReply,
};
use brood_core::AgentName;
use brood_runtime::Caller;
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use crate::body::Body;
use crate::error::{HttpError, answer, bad, now_ms};
use crate::idempotency;
use crate::state::Api;

/// A job operation on the supervisor (`op`, a verb's call), once per
/// `Idempotency-Key`.
async fn control<T, Fut>(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    route: String,
    bytes: &[u8],
    op: Fut,
) -> Response
where
    T: serde::Serialize,
    Fut: std::future::Future<Output = Result<T, brood_runtime::ApiError>>,
{
    idempotency::once(api, caller, headers, &route, bytes, || async {
        answer(StatusCode::OK, op.await)
    })
    .await
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/items/{item}/assign", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."),
           ("item" = String, Path, description = "The item's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    request_body(content = Option<AssignBody>, description = "None, or a JSON object."),
    responses(
        (status = 200, description = "The item's next attempt started now, held by the named agent (give it the instruction) or a new worker.", body = AssignReply),
        (status = 400, description = "Malformed body or worker name.", body = ErrorBody),
        (status = 403, description = "The job or the worker is outside the caller's reach, or the worker is not under the job's owner.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job is not running, the item is not pending, or the worker is not running or already holds an item.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_assign(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path((id, item)): Path<(String, String)>,
    body: Result<Body<AssignBody>, HttpError>,
) -> Response {
    let Body { value, bytes } = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let worker = match value.worker.as_deref().map(AgentName::new).transpose() {
        Ok(w) => w,
        Err(e) => return bad(format!("worker: {e}")).into_response(),
    };
    let route = format!("POST /api/jobs/{id}/items/{item}/assign");
    let op = api.sup().job_assign(caller.clone(), id, item, worker);
    control(&api, &caller, &headers, route, &bytes, op).await
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/items/{item}/retry", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."),
           ("item" = String, Path, description = "The item's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    request_body(content = Option<EmptyBody>, description = "None, or a JSON object."),
    responses(
        (status = 200, description = "The failed item is pending again (one more attempt; a failed job reopens).", body = RetryReply),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job or item.", body = ErrorBody),
        (status = 409, description = "The item is not failed, the job is neither running nor failed, or its owner is not running.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_retry(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path((id, item)): Path<(String, String)>,
    body: Result<Body<EmptyBody>, HttpError>,
) -> Response {
    let bytes = match body {
        Ok(b) => b.bytes,
        Err(e) => return e.into_response(),
    };
    let route = format!("POST /api/jobs/{id}/items/{item}/retry");
    let op = api.sup().job_retry(caller.clone(), id, Some(item));
    control(&api, &caller, &headers, route, &bytes, op).await
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/retry", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    request_body(content = Option<EmptyBody>, description = "None, or a JSON object."),
    responses(
        (status = 200, description = "Every failed item is pending again (a failed job reopens); none failed: nothing changes.", body = RetryReply),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The job is neither running nor failed, or its owner is not running.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_retry_failed(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Body<EmptyBody>, HttpError>,
) -> Response {
    let bytes = match body {
        Ok(b) => b.bytes,
        Err(e) => return e.into_response(),
    };
    let route = format!("POST /api/jobs/{id}/retry");
    let op = api.sup().job_retry(caller.clone(), id, None);
    control(&api, &caller, &headers, route, &bytes, op).await
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/items/{item}/report", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."),
           ("item" = String, Path, description = "The item's id."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    request_body = ReportBody,
    responses(
        (status = 200, description = "Accepted: the item's one result; the worker's next item unless it asked to stop.", body = ReportReply),
        (status = 400, description = "Malformed, or the result does not satisfy output_schema (the attempt fails with the reason).", body = ErrorBody),
        (status = 403, description = "The caller is not a worker holding an item (the operator never reports).", body = ErrorBody),
        (status = 409, description = "The caller holds another item, or its attempt ended (a stale report).", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn job_report(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path((id, item)): Path<(String, String)>,
    body: Result<Body<ReportBody>, HttpError>,
) -> Response {
    let Body { value, bytes } = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let route = format!("POST /api/jobs/{id}/items/{item}/report");
    let args = json!({"job": id, "item": item, "result": value.result, "stop": value.stop});
    let op = api.sup().job_report(caller.clone(), args);
    control(&api, &caller, &headers, route, &bytes, op).await
}

/// `GET /api/jobs/{id}/export`'s format.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExportQuery {
    /// `csv` or `jsonl` (default `jsonl`).
    #[param(pattern = "^(csv|jsonl)$")]
    pub format: Option<String>,
}

#[utoipa::path(
    get, path = "/api/jobs/{id}/export", tag = "jobs",
    params(("id" = String, Path, description = "The job's id."), ExportQuery),
    responses(
        (status = 200, description = "CSV (the input columns, then job_id item_id row_index status attempt_count last_error result_json completed_at) or JSON lines, one item each in input order.", content((String = "text/csv"), (String = "application/x-ndjson"))),
        (status = 400, description = "An unknown format.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
    )
)]
pub(crate) async fn job_export(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<ExportQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return bad(format!("query: {}", e.body_text())).into_response(),
    };
    let format = q.format.unwrap_or_else(|| "jsonl".into());
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = brood_runtime::jobs::get(store, sup.tenant(), &caller, &id)
        .and_then(|job| brood_runtime::jobs::export_text(store, &job, &format));
    match r {
        Ok(text) => {
            let kind = if format == "csv" {
                "text/csv; charset=utf-8"
            } else {
                "application/x-ndjson"
            };
            let mut r = (StatusCode::OK, text).into_response();
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
            r
        }
        Err(e) => HttpError(e).into_response(),
    }
}

#[utoipa::path(
    get, path = "/api/jobs/{id}/evidence", tag = "jobs",
    params(("id" = String, Path, description = "The job's id.")),
    responses(
        (status = 200, description = "The evidence bundle: the spec, input hashes, every attempt, the job's events, its workers' session references, and a manifest of sha256 hashes (`brood job verify` checks it).", body = EvidenceBundle),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
    )
)]
pub(crate) async fn job_evidence(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = brood_runtime::jobs::get(store, sup.tenant(), &caller, &id)
        .and_then(|job| brood_runtime::jobs::evidence_bundle(store, &job));
    answer(StatusCode::OK, r)
}

#[utoipa::path(
    post, path = "/api/jobs/{id}/replay", tag = "jobs",
    params(("id" = String, Path, description = "The job to replay."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    request_body(content = Option<ReplayBody>, description = "None, or a JSON object."),
    responses(
        (status = 201, description = "The new job, linked to its source (pending, or running when `start`).", body = JobView),
        (status = 400, description = "Malformed, or a bad id.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job.", body = ErrorBody),
        (status = 409, description = "The new id is taken, the job has no (failed) item to replay, or (with `start`) its owner is not running.", body = ErrorBody),
        (status = 413, description = "More items than items_per_job.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
        (status = 429, description = "The tenant's unfinished jobs or their items are at jobs_per_tenant or items_per_tenant.", body = ErrorBody),
    )
)]
pub(crate) async fn job_replay(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Body<ReplayBody>, HttpError>,
) -> Response {
    let Body { value, bytes } = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let route = format!("POST /api/jobs/{id}/replay");
    idempotency::once(&api, &caller, &headers, &route, &bytes, || async {
        let sup = api.sup();
        let store = sup.store().clone();
        // Every item copied in one write: on a blocking thread, like a creation.
        let made = {
            let (sup, caller, id, value) = (sup.clone(), caller.clone(), id.clone(), value.clone());
            tokio::task::spawn_blocking(move || {
                brood_runtime::jobs::replay_at(
                    sup.store().as_ref(),
                    sup.tenant(),
                    &caller,
                    &id,
                    &value,
                    now_ms(),
                    sup.intake(),
                )
            })
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "replaying a job did not finish");
                Err(brood_runtime::ApiError::new(
                    brood_core::Code::Internal,
                    "replaying the job failed (see the supervisor's log)",
                ))
            })
        };
        let r = match made {
            Ok(job) if value.start == Some(true) => sup.job_start(caller.clone(), job.id).await,
            Ok(job) => brood_runtime::jobs::view(store.as_ref(), &job),
            Err(e) => Err(e),
        };
        answer(StatusCode::CREATED, r)
    })
    .await
}
