//! The listeners from the moment they are bound, before the supervisor has
//! started. A node's start recovers the agents of supervisors that are gone
//! and rebuilds the ctx tree from the store, which takes seconds on a large
//! tree behind a slow store (issue 28's campaign: 48 s). Until then
//! `/healthz` answers at once that the node is starting (503, code
//! `Unavailable`, `Retry-After: 1`), and every other request waits for the
//! start, as it would have waited in the listen backlog, and is then served
//! as usual. A start that fails answers the waiting requests 503 and the
//! process exits with the start's error.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::{ApiError, Caller};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OnceCell, watch};
use tower::ServiceExt;

use crate::auth::Conn;
use crate::error::HttpError;
use crate::listen::{http1, identify, tcp_conn};
use crate::state::Api;

/// What the listeners serve once the supervisor has started.
#[derive(Clone)]
struct Ready {
    api: Api,
    router: Router,
}

/// Where the start ends up: `None` while starting, `Some(None)` when it
/// failed, `Some(Some(_))` once started.
type Outcome = Option<Option<Ready>>;

/// The listeners' side of a start: cloned into each of them.
#[derive(Clone)]
pub struct Starting(watch::Receiver<Outcome>);

/// The starter's side: [`Started::set`] once the API is there; dropped
/// without it, the start failed.
pub struct Started(watch::Sender<Outcome>);

/// A start's two sides.
pub fn starting() -> (Started, Starting) {
    let (tx, rx) = watch::channel(None);
    (Started(tx), Starting(rx))
}

impl Started {
    /// The supervisor has started: the listeners serve `api` from now on.
    pub fn set(self, api: Api) {
        let router = api.router();
        let _ = self.0.send(Some(Some(Ready { api, router })));
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        // Without `set`, the start failed: whoever waits hears it.
        self.0.send_if_modified(|o| {
            if o.is_none() {
                *o = Some(None);
                true
            } else {
                false
            }
        });
    }
}

impl Starting {
    /// The API once the start has ended; `None` when it failed.
    async fn ready(&mut self) -> Option<Ready> {
        match self.0.wait_for(Option::is_some).await {
            Ok(o) => o.clone().flatten(),
            Err(_) => None,
        }
    }

    /// The API if the start has ended well by now.
    fn now(&self) -> Option<Ready> {
        self.0.borrow().clone().flatten()
    }
}

/// Serves the control socket from the moment it is bound: connections made
/// while the node starts are served by [`early`], the rest as
/// [`crate::serve_unix`] does.
pub async fn serve_unix_from_start(mut starting: Starting, listener: UnixListener) {
    loop {
        tokio::select! {
            r = starting.ready() => match r {
                Some(ready) => return crate::serve_unix(ready.api, listener).await,
                // The process is on its way out with the start's error.
                None => return serve_failed_unix(listener).await,
            },
            a = listener.accept() => match a {
                Ok((stream, _)) => {
                    let cred = stream.peer_cred().map(|c| (c.pid(), c.uid()));
                    let s = starting.clone();
                    tokio::spawn(early(stream, s, Early::from(cred)));
                }
                Err(e) => {
                    tracing::error!(error = %e, "accept on the control socket failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// [`serve_unix_from_start`] for the loopback TCP port.
pub async fn serve_tcp_from_start(mut starting: Starting, listener: TcpListener) {
    loop {
        tokio::select! {
            r = starting.ready() => match r {
                Some(ready) => return crate::serve_tcp(ready.api, listener).await,
                None => return,
            },
            a = listener.accept() => match a {
                Ok((stream, peer)) => {
                    let Some(conn) = tcp_conn(&stream, peer) else {
                        continue;
                    };
                    let s = starting.clone();
                    tokio::spawn(early(stream, s, Early::Tcp(conn)));
                }
                Err(e) => {
                    tracing::error!(error = %e, "accept on the TCP listener failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Refuses what comes while a process whose start failed exits.
async fn serve_failed_unix(listener: UnixListener) {
    while let Ok((stream, _)) = listener.accept().await {
        drop(stream);
    }
}

/// Who calls on a connection made while the node starts.
#[derive(Clone)]
enum Early {
    /// The control socket: the caller's pid and uid, identified by the
    /// supervisor once it has started.
    Unix(Result<(Option<i32>, u32), Arc<std::io::Error>>),
    /// The TCP port: the token decides, per request, in the router.
    Tcp(Conn),
}

impl From<std::io::Result<(Option<i32>, u32)>> for Early {
    fn from(r: std::io::Result<(Option<i32>, u32)>) -> Early {
        Early::Unix(r.map_err(Arc::new))
    }
}

/// A connection made while the node starts: `/healthz` answered at once
/// while it does, every other request served once it has.
async fn early<S>(stream: S, starting: Starting, who: impl Into<Early>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let who: Early = who.into();
    // The caller of a Unix connection is identified once, at its first
    // request after the start.
    let caller: Arc<OnceCell<Result<Caller, ApiError>>> = Arc::new(OnceCell::new());
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let mut starting = starting.clone();
        let who = who.clone();
        let caller = caller.clone();
        async move {
            let ready = match starting.now() {
                Some(r) => r,
                None if req.uri().path() == "/healthz" => {
                    return Ok::<Response, std::convert::Infallible>(
                        HttpError(
                            ApiError::new(
                                Code::Unavailable,
                                "the node is starting: recovering its agents and rebuilding its ctx tree from the store",
                            )
                            .retry_after(1),
                        )
                        .into_response(),
                    );
                }
                None => match starting.ready().await {
                    Some(r) => r,
                    None => {
                        return Ok(HttpError(ApiError::new(
                            Code::Unavailable,
                            "the node failed to start (its log says why)",
                        ))
                        .into_response());
                    }
                },
            };
            let conn = match &who {
                Early::Tcp(c) => c.clone(),
                Early::Unix(cred) => {
                    let c = caller
                        .get_or_init(|| async {
                            match cred {
                                Ok(cred) => identify(&ready.api, *cred).await,
                                Err(e) => identify_failed(e),
                            }
                        })
                        .await;
                    Conn::Unix(c.clone())
                }
            };
            req.extensions_mut().insert(conn);
            ready.router.oneshot(req.map(axum::body::Body::new)).await
        }
    });
    http1(stream, service).await;
}

fn identify_failed(e: &std::io::Error) -> Result<Caller, ApiError> {
    Err(ApiError::new(
        Code::Forbidden,
        format!("reading the caller's credentials failed: {e}"),
    ))
}
