//! MCP on the daemon (docs/mcp.md): brood-mcp's tools over streamable HTTP
//! at `/mcp`, behind the same authentication as every route (the bearer
//! token on TCP, peer credentials on the socket), each tool call made as
//! API calls of the caller that sent it; and `POST /api/mcp/session`, the
//! session root a stdio `brood mcp` holds.
//!
//! A stdio session's root lives exactly as long as the connection that
//! asked for it: the daemon cancels it (and so its whole subtree) when that
//! connection closes, whatever ended the client (exit, EOF on stdin,
//! SIGKILL: the kernel closes its socket either way). The client's good
//! will is not needed (docs/decisions/ui-and-mcp.md "An MCP session over
//! stdio is a real root agent, and the daemon, not the client, ends it").
//! Its tools act as that root, not as the operator who made it: the first
//! event carries a capability that `narrow` turns into `Caller::Agent(root)`
//! for as long as the stream is held (docs/decisions/ui-and-mcp.md "MCP
//! sessions are confined").

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use brood_api::SessionStart;
use brood_core::{AgentName, Code};
use brood_mcp::{Answer, Backend, Owner, ToolError, Tools};
use brood_runtime::{ApiError, Caller, SpawnRequest};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;
use utoipa::ToSchema;

use crate::auth::Conn;
use crate::body::Body;
use crate::error::{HttpError, json as json_reply};
use crate::state::Api;

/// How often a held session's stream says it is alive; a closed connection
/// is noticed at the latest when this write fails.
const HOLD_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The tools' way to the API: the daemon's own router, called as the
/// authenticated caller of the MCP request.
pub(crate) struct InProcess {
    api: Api,
}

fn caller_of(ctx: &RequestContext<RoleServer>) -> Option<Caller> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .cloned()
}

impl Backend for InProcess {
    async fn call(
        &self,
        ctx: &RequestContext<RoleServer>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, String> {
        let caller = caller_of(ctx)
            .ok_or_else(|| "the MCP request came without an authenticated caller".to_owned())?;
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(bytes))
            .map_err(|e| format!("{method} {path}: {e}"))?;
        // The MCP client's trace context (issue 30): its `_meta.traceparent`
        // on this request, else its HTTP request's header, carried to the API
        // as a header of its own, so a spawn joins the client's trace.
        let traceparent = ctx
            .meta
            .get("traceparent")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                ctx.extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.headers.get("traceparent"))
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            });
        if let Some(tp) = traceparent
            && let Ok(v) = axum::http::HeaderValue::from_str(&tp)
        {
            req.headers_mut().insert("traceparent", v);
        }
        req.extensions_mut().insert(Conn::Inner(caller));
        let resp = match self.api.router().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer to {method} {path}: {e}"))?
            .to_bytes();
        Ok(Answer {
            status,
            body: crate::client::body_value(&bytes),
        })
    }

    async fn owner(&self, ctx: &RequestContext<RoleServer>) -> Result<Option<Owner>, ToolError> {
        // An agent works in its own subtree (the API makes its creations its
        // children); the operator's calls act as the API's do: no implicit parent.
        Ok(match caller_of(ctx) {
            Some(Caller::Agent(me)) => Some(Owner {
                name: me.to_string(),
                as_parent: false,
            }),
            _ => None,
        })
    }
}

/// `/mcp`: streamable HTTP, the older session-based handshake and the newest
/// stateless one alike (rmcp negotiates).
pub(crate) fn service(api: Api) -> StreamableHttpService<Tools<InProcess>, LocalSessionManager> {
    let home = Some(api.sup().paths().home());
    let backend = Arc::new(InProcess { api });
    let brood = brood_exe();
    let config = StreamableHttpServerConfig::default()
        // The socket's requests name the host `brood`; TCP is loopback only.
        .with_allowed_hosts(["localhost", "127.0.0.1", "::1", "brood"])
        // MCP clients are programs, not pages: any `Origin` is refused.
        .enforce_origin_validation();
    StreamableHttpService::new(
        move || Ok(Tools::new(backend.clone(), brood.clone(), home.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// The `brood` binary the daemon runs as (for `brood agent` children and
/// the session roots' `brood mcp-root`).
fn brood_exe() -> String {
    std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "brood".to_owned())
}

/// `POST /api/mcp/session`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionBody {
    /// The MCP client's name (`clientInfo.name`), for the root's name.
    #[serde(default)]
    client: Option<String>,
    /// The session's policy (SPEC 5 fields), the operator's for MCP sessions.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    policy: Option<Value>,
    /// The session root's secret values (`brood mcp --secret`), which its
    /// children inherit; never stored, shown or logged (issue 25).
    #[serde(default)]
    #[schema(value_type = Option<std::collections::BTreeMap<String, String>>)]
    secrets: Option<brood_api::Secrets>,
}

/// `POST /api/mcp/session`: as an event stream, one event with the agent the
/// session works for, then keep-alives for as long as the client holds the
/// connection. From the operator it is a new root agent (`brood mcp-root`,
/// which does nothing but live), cancelled with its subtree when the
/// connection closes; from an agent it is that agent itself, and nothing is
/// held.
#[utoipa::path(
    post, path = "/api/mcp/session", tag = "mcp", operation_id = "mcp_session",
    request_body(content = Option<SessionBody>, description = "Optional: the client's name, the session's policy and secret values."),
    responses(
        (status = 200, description = "`text/event-stream`: one event whose `data` is a `SessionStart`, then keep-alive comments for as long as the client holds the connection; closing it cancels the session's root and its subtree.", content_type = "text/event-stream", body = SessionStart),
        (status = 400, description = "Malformed: the body, the policy, a client name that makes no agent name, or secrets from an agent.", body = brood_api::ErrorBody),
        (status = 403, description = "The policy asks for more than the operator's.", body = brood_api::ErrorBody),
        (status = 429, description = "A quota is spent.", body = brood_api::ErrorBody),
        (status = 503, description = "The supervisor stopped.", body = brood_api::ErrorBody),
    )
)]
pub(crate) async fn session(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    body: Result<Body<SessionBody>, HttpError>,
) -> Response {
    let body = match body {
        Ok(b) => b.value,
        Err(e) => return e.into_response(),
    };
    if let Caller::Agent(me) = &caller {
        if let Some(k) = body.secrets.as_ref().and_then(|s| s.names().next()) {
            return HttpError(ApiError::new(
                Code::BadRequest,
                format!(
                    "secrets.{k}: an agent's MCP session works as the agent itself, \
                     whose secrets are its own; it is given none"
                ),
            ))
            .into_response();
        }
        let first = SessionStart {
            owner: me.to_string(),
            root: false,
            agent: None,
            capability: None,
        };
        let first = serde_json::to_string(&first).unwrap_or_default();
        let stream = futures_util::stream::once(async move {
            Ok::<_, Infallible>(SseEvent::default().data(first))
        });
        return Sse::new(stream).into_response();
    }
    let client = body.client.as_deref().unwrap_or("mcp");
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    let name = format!(
        "{}-{}",
        brood_mcp::sanitise(client),
        &suffix[suffix.len() - 8..]
    );
    let Ok(agent) = AgentName::new(&name) else {
        return HttpError(ApiError::new(
            Code::InvalidName,
            format!("{name:?} is not an agent name"),
        ))
        .into_response();
    };
    let spawn = json!({
        "name": name,
        "argv": [brood_exe(), "mcp-root"],
        "protocol": "brood",
        "task": format!("the MCP session of {client}: its children are this session's"),
        "label": "mcp session",
        "await_ready": true,
        "policy": body.policy,
        "secrets": body.secrets,
    });
    let req = match serde_json::from_value::<brood_api::SpawnBody>(spawn)
        .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))
        .and_then(SpawnRequest::from_body)
        .and_then(|mut r| {
            // The session's root joins the client's trace (issue 30).
            r.traceparent = crate::trace::traceparent(&headers)?;
            Ok(r)
        }) {
        Ok(r) => r,
        Err(e) => return HttpError(e).into_response(),
    };
    // The spawn and the cancel run in a task of their own, so a connection
    // that closes even while the root is being admitted still cancels it.
    let (held, released) = tokio::sync::oneshot::channel::<()>();
    let (answer, spawned) = tokio::sync::oneshot::channel();
    let sup = api.sup().clone();
    let root = agent.clone();
    tokio::spawn(async move {
        let r = sup.spawn(caller.clone(), req).await;
        let made = r.is_ok();
        let _ = answer.send(r);
        if made {
            // Resolves when the stream (and so `held`) is dropped.
            let _ = released.await;
            tracing::info!(agent = %agent, "MCP session ended: cancelling its root");
            if let Err(e) = sup.cancel(caller, agent.clone()).await {
                tracing::debug!(agent = %agent, error = %e.message, "cancelling an MCP session root");
            }
        }
    });
    let v = match spawned.await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return HttpError(e).into_response(),
        Err(_) => {
            return json_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                &brood_api::ErrorBody::new(Code::Unavailable, "the supervisor stopped"),
            );
        }
    };
    // The session's tools act as its root, never as the operator who made
    // it (`narrow`): the capability they carry is good while this stream is.
    let capability = match api.0.mcp_sessions.issue(&root) {
        Ok(c) => Revoked {
            api: api.clone(),
            cap: c,
        },
        Err(e) => {
            tracing::error!(error = %e, "making an MCP session's capability");
            // Dropping `held` cancels the root just made.
            return HttpError(ApiError::new(
                Code::Internal,
                "the session's capability could not be made (see the supervisor's log)",
            ))
            .into_response();
        }
    };
    let first = SessionStart {
        owner: name,
        root: true,
        agent: Some(v),
        capability: Some(capability.cap.clone()),
    };
    let first = serde_json::to_string(&first).unwrap_or_default();
    // One event, then nothing but the keep-alives, for as long as the
    // client holds on; the stream owns `held` and the capability, so
    // dropping it ends the session and refuses the capability.
    let stream =
        futures_util::stream::once(
            async move { Ok::<_, Infallible>(SseEvent::default().data(first)) },
        )
        .chain(futures_util::stream::pending())
        .map(move |e| {
            let _session = (&held, &capability);
            e
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(HOLD_KEEP_ALIVE))
        .into_response()
}

/// A session's capability, refused from the moment its stream is dropped.
struct Revoked {
    api: Api,
    cap: String,
}

impl Drop for Revoked {
    fn drop(&mut self) {
        self.api.0.mcp_sessions.revoke(&self.cap);
    }
}
