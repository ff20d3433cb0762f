//! The model gateway (issue 31, docs/models.md): one HTTP endpoint per run
//! whose policy grants models, on a loopback port of its own, answering only
//! the run's token (what its clients send as their key). It speaks OpenAI's
//! chat completions and responses and Anthropic's messages, streaming
//! included, and forwards each call to the operator's provider with the
//! operator's key (`gateway::forward`); brood meters what the provider
//! answers and the dispatcher counts it (`brood_runtime`'s
//! `supervisor::models`). The runtime's `GatewayHost` is [`host`].
//!
//! Closing the run's [`Listener`] stops the accepting and cuts every open
//! connection at once: a run that ended or was stopped gets nothing more.

mod forward;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use brood_core::{AgentName, RunId};
use brood_runtime::agent_socket::Listener;
use brood_runtime::models::Providers;
use brood_runtime::{Endpoint, GatewayHost, Supervisor};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::sync::{oneshot, watch};

/// A request's head must arrive within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// What every connection of one run's endpoint shares.
struct Run {
    sup: Supervisor,
    agent: AgentName,
    run: RunId,
    providers: Arc<Providers>,
    /// The SHA-256 of the run's token.
    token: [u8; 32],
    /// The client calls go out through (its connections pooled).
    client: ureq::Agent,
    /// Turns true when the run's endpoint is closed.
    closed: watch::Receiver<bool>,
}

/// The runtime's gateway host: opens one run's endpoint.
pub fn host() -> GatewayHost {
    let client: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        // A redirect would carry the key wherever the provider points.
        .max_redirects(0)
        .build()
        .into();
    Arc::new(move |sup, agent, run, providers, bound| {
        open(sup, agent, run, providers, client.clone(), bound)
    })
}

/// `bound`: a listener already bound where the agent can reach it (inside
/// its network namespace); none: one on the host's loopback.
fn open(
    sup: Supervisor,
    agent: AgentName,
    run: RunId,
    providers: Arc<Providers>,
    client: ureq::Agent,
    bound: Option<std::net::TcpListener>,
) -> Result<Endpoint, String> {
    let std_listener = match bound {
        Some(l) => l,
        None => std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("binding the model gateway's loopback port: {e}"))?,
    };
    let port = std_listener
        .local_addr()
        .map_err(|e| format!("reading the model gateway's port: {e}"))?
        .port();
    std_listener
        .set_nonblocking(true)
        .map_err(|e| format!("the model gateway's listener: {e}"))?;
    let listener = tokio::net::TcpListener::from_std(std_listener)
        .map_err(|e| format!("the model gateway's listener: {e}"))?;
    let token = format!(
        "brood-{}",
        crate::secret::new_secret().map_err(|e| format!("making the run's token: {e}"))?
    );
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    let (closed_tx, closed) = watch::channel(false);
    let shared = Arc::new(Run {
        sup,
        agent,
        run,
        providers,
        token: crate::secret::digest(&token),
        client,
        closed,
    });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stop_rx => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(shared.clone(), stream));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept on a model gateway failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        // Every connection of the run is cut.
        let _ = closed_tx.send(true);
    });
    Ok(Endpoint {
        origin: format!("http://127.0.0.1:{port}"),
        port,
        token,
        listener: Listener::new(stop_tx),
    })
}

async fn connection(run: Arc<Run>, stream: tokio::net::TcpStream) {
    let mut closed = run.closed.clone();
    let r = run.clone();
    let service = hyper::service::service_fn(move |req| {
        let r = r.clone();
        async move { Ok::<_, Infallible>(handle(r, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    // Dropping the connection closes its socket: the run's end cuts it
    // mid-answer.
    tokio::select! {
        r = served => if let Err(e) = r {
            tracing::debug!(error = %e, "model gateway connection ended");
        },
        _ = closed.wait_for(|c| *c) => {}
    }
}

/// An answer in the shape both SDKs read: OpenAI's `error.message` and
/// Anthropic's `type: error` with `error.type`.
pub(crate) fn error(status: u16, code: &str, message: &str) -> Response<Body> {
    let body = json!({"type": "error", "error": {"type": code, "code": code, "message": message}});
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    *r.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// A call refused at a rate limit (issue 31, docs/models.md "Rate
/// limits"): 429 with `Retry-After` in whole seconds, when the window
/// closes, and the body naming the limit (whose, what, where it is set,
/// its value, what the window counted) besides the message both SDKs read.
pub(crate) fn rate_limited(
    code: &str,
    message: &str,
    over: &brood_core::rate::Over,
) -> Response<Body> {
    let body = json!({"type": "error", "error": {
        "type": code,
        "code": code,
        "message": message,
        "limit": {
            "scope": over.scope.as_str(),
            "measure": over.measure.key(),
            "field": over.field(),
            "value": over.limit,
            "used": over.used,
        },
        "retry_after_s": over.retry_after_s,
    }});
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::TOO_MANY_REQUESTS;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    h.insert(hyper::header::RETRY_AFTER, over.retry_after_s.into());
    r
}

pub(crate) fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed_unsync()
}

/// The token the request carries: `Authorization: Bearer` (OpenAI's
/// clients) or `x-api-key` (Anthropic's).
fn presented<B>(req: &Request<B>) -> Option<&str> {
    let h = req.headers();
    if let Some(v) = h.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    h.get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

async fn handle(run: Arc<Run>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let ok =
        presented(&req).is_some_and(|t| bool::from(crate::secret::digest(t).ct_eq(&run.token)));
    if !ok {
        return error(
            401,
            "authentication_error",
            "this model gateway answers only the agent it was opened for: send its token \
             (the OPENAI_API_KEY or ANTHROPIC_API_KEY brood set) as the key",
        );
    }
    let path = req.uri().path().to_owned();
    if req.method() == hyper::Method::GET && path == "/v1/models" {
        return models_list(&run);
    }
    let Some(endpoint) = brood_runtime::models::meter::Endpoint::of_path(&path) else {
        return error(
            404,
            "not_found",
            &format!(
                "{path}: the model gateway serves POST /v1/chat/completions, /v1/responses \
                 and /v1/messages (and GET /v1/models)"
            ),
        );
    };
    if req.method() != hyper::Method::POST {
        return error(405, "invalid_request_error", &format!("{path} takes POST"));
    }
    forward::call(run, endpoint, req).await
}

/// `GET /v1/models`: the models the operator priced (what may be called
/// at all; the agent's policy may grant fewer).
fn models_list(run: &Run) -> Response<Body> {
    let data: Vec<_> = run
        .providers
        .prices
        .keys()
        .map(|m| json!({"id": m, "object": "model", "type": "model", "owned_by": "brood"}))
        .collect();
    let body = json!({"object": "list", "data": data});
    let mut r = Response::new(full(Bytes::from(body.to_string())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}
