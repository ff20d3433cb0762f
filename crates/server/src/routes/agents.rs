//! `/api/agents`: create, read and act on agents. Mutations go through the
//! supervisor's verbs (authorised there against the caller: an agent acts on
//! its own descendants only); reads come from the store (an agent reads its
//! own subtree only).

use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use brood_api::{
    AgentDetail, AgentList, EmptyBody, ErrorBody, InputBody, ResumeBody, SpawnBody, WaitBody,
    WaitReply,
};
use brood_runtime::{ApiError, Caller, SpawnRequest};
use serde::Deserialize;
use utoipa::IntoParams;

use super::path_name;
use crate::body::Body;
use crate::error::{HttpError, answer, bad, json};
use crate::idempotency;
use crate::state::{Api, may_see};

/// The longest a `wait` long-polls, and its default.
const WAIT_MAX_S: f64 = 3600.0;
const WAIT_DEFAULT_S: f64 = 30.0;

#[utoipa::path(
    post, path = "/api/agents", tag = "agents",
    request_body = SpawnBody,
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key: a repeat with the same key and body gets the first answer."),
        ("traceparent" = Option<String>, Header, pattern = "^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$", description = "W3C trace context (docs/tracing.md): a root's spans join the caller's trace under its span; for a child, a span of the parent's own trace to nest under (another trace is refused)."),
    ),
    responses(
        (status = 201, description = "Admitted (and started, or queued for a slot).", body = brood_api::Agent),
        (status = 400, description = "Malformed: not JSON, a wrong type, an unknown field, a bad name.", body = ErrorBody),
        (status = 401, description = "TCP without the bearer token.", body = ErrorBody),
        (status = 403, description = "Refused: more than the parent holds, or another agent's parent.", body = ErrorBody),
        (status = 409, description = "The name is taken.", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
        (status = 429, description = "A quota or budget is spent.", body = ErrorBody),
        (status = 503, description = "No live node has the labels of its `placement` and free capacity (docs/many-nodes.md), or the store has not answered for 2 s (`Retry-After` says when to ask again).", body = ErrorBody),
    )
)]
pub(crate) async fn spawn(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Body<SpawnBody>, HttpError>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Body { value, bytes } = body;
    idempotency::once(
        &api,
        &caller,
        &headers,
        "POST /api/agents",
        &bytes,
        || async {
            let parent = value.parent.clone();
            let requested = value.name.clone();
            let made = crate::trace::traceparent(&headers).and_then(|tp| {
                SpawnRequest::from_body(value).map(|mut r| {
                    r.traceparent = tp;
                    r
                })
            });
            match made {
                Ok(req) => answer(
                    StatusCode::CREATED,
                    api.sup().spawn(caller.clone(), req).await,
                ),
                Err(e) => {
                    // A malformed creation is a refusal too (counted, and in the
                    // parent's log when it names one).
                    let parent = match &caller {
                        Caller::Agent(me) => Some(me.clone()),
                        Caller::User { .. } => {
                            parent.and_then(|p| brood_core::AgentName::new(&p).ok())
                        }
                    };
                    api.sup().refused(parent, requested, e.clone());
                    HttpError(e).into_response()
                }
            }
        },
    )
    .await
}

/// `GET /api/agents`'s filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only this agent's children (an agent caller: its own by default).
    pub parent: Option<String>,
    /// Finished agents too (default: live ones only).
    pub all: Option<bool>,
}

#[utoipa::path(
    get, path = "/api/agents", tag = "agents",
    params(ListQuery),
    responses(
        (status = 200, description = "Agents in start order.", body = AgentList),
        (status = 400, description = "A malformed filter.", body = ErrorBody),
        (status = 403, description = "An agent asked for another subtree.", body = ErrorBody),
        (status = 404, description = "No such parent.", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let r = (|| {
        let Query(q) = query.map_err(|e| bad(format!("query: {}", e.body_text())))?;
        let parent = match (q.parent.as_deref(), &caller) {
            (Some(p), _) => Some(path_name(p)?),
            (None, Caller::Agent(me)) => Some(me.clone()),
            (None, Caller::User { .. }) => None,
        };
        if let Some(p) = &parent {
            may_see(&api, &caller, p)?;
        }
        Ok::<_, HttpError>(api.view().list(parent, q.all.unwrap_or(false))?)
    })();
    match r {
        Ok(l) => json(StatusCode::OK, &l),
        Err(e) => e.into_response(),
    }
}

/// A read of one agent the caller may see: its name checked, then `f`.
pub(super) fn read<T: serde::Serialize>(
    api: &Api,
    caller: &Caller,
    name: &str,
    f: impl FnOnce(&brood_core::AgentName) -> Result<T, ApiError>,
) -> Response {
    let r = path_name(name).and_then(|n| {
        may_see(api, caller, &n)?;
        Ok(f(&n)?)
    });
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(
    get, path = "/api/agents/{name}", tag = "agents",
    params(("name" = String, Path, description = "The agent's name.")),
    responses(
        (status = 200, description = "The agent, its policy, spend and runs.", body = AgentDetail),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn show(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    read(&api, &caller, &name, |n| api.view().show(n))
}

#[utoipa::path(
    get, path = "/api/agents/{name}/children", tag = "agents",
    params(("name" = String, Path, description = "The agent's name.")),
    responses(
        (status = 200, description = "Its children, finished ones too, in start order.", body = AgentList),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn children(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    read(&api, &caller, &name, |n| {
        api.view().list(Some(n.clone()), true)
    })
}

#[utoipa::path(
    get, path = "/api/agents/{name}/descendants", tag = "agents",
    params(("name" = String, Path, description = "The agent's name.")),
    responses(
        (status = 200, description = "Every descendant, parents before children, siblings in start order.", body = AgentList),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn descendants(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    read(&api, &caller, &name, |n| api.view().descendants(n))
}

/// A verb on one agent: the body parsed, the key honoured, the verb run.
async fn act<T, A, F, Fut>(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    route: &str,
    name: &str,
    body: Result<Body<T>, HttpError>,
    f: F,
) -> Response
where
    F: FnOnce(brood_core::AgentName, T) -> Fut,
    Fut: std::future::Future<Output = Result<A, ApiError>>,
    A: serde::Serialize,
{
    let (name, Body { value, bytes }) = match path_name(name).and_then(|n| Ok((n, body?))) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let route = format!("POST /api/agents/{name}/{route}");
    idempotency::once(api, caller, headers, &route, &bytes, || async move {
        answer(StatusCode::OK, f(name, value).await)
    })
    .await
}

#[utoipa::path(
    post, path = "/api/agents/{name}/input", tag = "agents",
    request_body = InputBody,
    params(("name" = String, Path, description = "The agent's name."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Delivered; the message's id.", body = brood_api::InputReply),
        (status = 400, description = "Malformed body.", body = ErrorBody),
        (status = 403, description = "Not the caller's descendant.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
        (status = 409, description = "The agent takes no input now (finished, stopping, or an exec program).", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn input(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Body<InputBody>, HttpError>,
) -> Response {
    let sup = api.sup().clone();
    let c = caller.clone();
    act(
        &api,
        &caller,
        &headers,
        "input",
        &name,
        body,
        |n, b: InputBody| async move { sup.send(c, n, b.text).await },
    )
    .await
}

#[utoipa::path(
    post, path = "/api/agents/{name}/wait", tag = "agents",
    request_body(content = Option<WaitBody>, description = "Optional; `{}` waits 30 s."),
    params(("name" = String, Path, description = "The agent's name.")),
    responses(
        (status = 200, description = "The agent once it finished, or as it is when the time ran out (`timed_out: true`).", body = WaitReply),
        (status = 400, description = "A bad timeout.", body = ErrorBody),
        (status = 403, description = "Not the caller's descendant.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn wait(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Body<WaitBody>, HttpError>,
) -> Response {
    let r = async {
        let name = path_name(&name)?;
        let b = body?.value;
        let t = b.timeout_s.unwrap_or(WAIT_DEFAULT_S);
        if !(t.is_finite() && (0.0..=WAIT_MAX_S).contains(&t)) {
            return Err(bad(format!(
                "timeout_s: must be between 0 and {WAIT_MAX_S} seconds, not {t}"
            )));
        }
        let r = api
            .sup()
            .wait(caller.clone(), vec![name], Some(Duration::from_secs_f64(t)))
            .await;
        // Whoever waited may read result.md next: let the files catch up first.
        api.sup().flush().await;
        Ok(r?)
    }
    .await;
    match r {
        Ok(v) => json(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(
    post, path = "/api/agents/{name}/resume", tag = "agents",
    request_body(content = Option<ResumeBody>, description = "Optional: a message for the new run; a root's secret values again."),
    params(("name" = String, Path, description = "The agent's name."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "A new run started.", body = brood_api::Agent),
        (status = 400, description = "Malformed body.", body = ErrorBody),
        (status = 403, description = "Not the caller's descendant.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
        (status = 409, description = "The agent is not finished, or its parent is; or the secret values given do not match its policy's names (a root's are given again, each name and no other; a child's are its parent's).", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
        (status = 429, description = "A quota or budget is spent.", body = ErrorBody),
    )
)]
pub(crate) async fn resume(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Body<ResumeBody>, HttpError>,
) -> Response {
    let sup = api.sup().clone();
    let c = caller.clone();
    act(
        &api,
        &caller,
        &headers,
        "resume",
        &name,
        body,
        |n, b: ResumeBody| async move {
            let secrets = b.secrets.unwrap_or_default();
            brood_runtime::check_secrets(&secrets)?;
            sup.resume_with(c, n, b.text, secrets).await
        },
    )
    .await
}

#[utoipa::path(
    post, path = "/api/agents/{name}/close", tag = "agents",
    request_body(content = Option<EmptyBody>, description = "None, or `{}`."),
    params(("name" = String, Path, description = "The agent's name."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Closed (or already closed).", body = brood_api::Agent),
        (status = 403, description = "Not the caller's descendant.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
        (status = 409, description = "Not finished: cancel it first.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn close(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Body<EmptyBody>, HttpError>,
) -> Response {
    let sup = api.sup().clone();
    let c = caller.clone();
    act(
        &api,
        &caller,
        &headers,
        "close",
        &name,
        body,
        |n, _: EmptyBody| async move { sup.close(c, n).await },
    )
    .await
}

#[utoipa::path(
    post, path = "/api/agents/{name}/cancel", tag = "agents",
    request_body(content = Option<EmptyBody>, description = "None, or `{}`."),
    params(("name" = String, Path, description = "The agent's name."),
           ("Idempotency-Key" = Option<String>, Header, description = "Repeat-safe key.")),
    responses(
        (status = 200, description = "Its subtree is being stopped (or it had finished).", body = brood_api::Agent),
        (status = 403, description = "Not the caller's descendant.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
        (status = 422, description = "Idempotency-Key reused with another request.", body = ErrorBody),
    )
)]
pub(crate) async fn cancel(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Body<EmptyBody>, HttpError>,
) -> Response {
    let sup = api.sup().clone();
    let c = caller.clone();
    act(
        &api,
        &caller,
        &headers,
        "cancel",
        &name,
        body,
        |n, _: EmptyBody| async move { sup.cancel(c, n).await },
    )
    .await
}

/// `GET /api/tree`'s filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TreeQuery {
    /// Only the tree under this agent (an agent caller: its own by default).
    pub root: Option<String>,
}

#[utoipa::path(
    get, path = "/api/tree", tag = "agents",
    params(TreeQuery),
    responses(
        (status = 200, description = "Every root's tree (or one), each agent with its spend and children.", body = brood_api::Trees),
        (status = 400, description = "A malformed filter.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn tree(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<TreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let r = (|| {
        let Query(q) = query.map_err(|e| bad(format!("query: {}", e.body_text())))?;
        let root = match (q.root.as_deref(), &caller) {
            (Some(p), _) => Some(path_name(p)?),
            (None, Caller::Agent(me)) => Some(me.clone()),
            (None, Caller::User { .. }) => None,
        };
        if let Some(p) = &root {
            may_see(&api, &caller, p)?;
        }
        Ok::<_, HttpError>(api.view().tree(root.as_ref())?)
    })();
    match r {
        Ok(t) => json(StatusCode::OK, &t),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/agents/{name}/log`'s filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogQuery {
    /// Only what lies after this byte offset of the log (default: from its
    /// start); the answer's `next` is where to ask again from.
    #[param(minimum = 0, maximum = 9223372036854775807_u64)]
    pub after: Option<u64>,
    /// Only the last `tail` entries (at most 1000), whatever `after` says.
    #[param(minimum = 0, maximum = 1000)]
    pub tail: Option<usize>,
}

#[utoipa::path(
    get, path = "/api/agents/{name}/log", tag = "agents",
    params(("name" = String, Path, description = "The agent's name."), LogQuery),
    responses(
        (status = 200, description = "What the agent wrote to its stderr (its log, `ctx/agent/<name>.d/log`, every run), after `after` (at most 1 MiB of it an answer) or its last `tail` entries. The log is kept by the node that ran the agent: on another node's supervisor the answer is empty.", body = brood_api::AgentLog),
        (status = 400, description = "A malformed filter.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn log(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    query: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return bad(format!("query: {}", e.body_text())).into_response(),
    };
    // A file offset is signed (`off_t`): past it, no log is that long.
    if let Some(a) = q.after
        && a > i64::MAX as u64
    {
        return bad(format!("after: at most {} bytes, not {a}", i64::MAX)).into_response();
    }
    if let Some(t) = q.tail
        && t > brood_runtime::logs::TAIL_MAX
    {
        return bad(format!(
            "tail: at most {} entries, not {t}",
            brood_runtime::logs::TAIL_MAX
        ))
        .into_response();
    }
    read(&api, &caller, &name, |n| {
        // Unknown names are refused here, not answered with an empty log.
        api.view().agent(n)?;
        let path = api.sup().paths().agent_dir(n).join("log");
        brood_runtime::logs::read(&path, q.after.unwrap_or(0), q.tail).map_err(|e| {
            tracing::warn!(agent = %n, error = %e, "reading an agent's log");
            ApiError::new(
                brood_core::Code::Internal,
                format!("the log of {n} could not be read (see the supervisor's log)"),
            )
        })
    })
}
