//! Who is calling. On the Unix socket the kernel says: the peer's pid, and
//! its cgroup the agent it belongs to, whatever the request claims (an agent
//! acts only on its own subtree; anyone else is the operator). On TCP the
//! caller is the operator if it presents the bearer token of
//! `$BROOD_ROOT/token`, compared in constant time, or the web UI's session
//! cookie that stands for it (`ui::session`), and nobody otherwise. Either
//! may then be narrowed to a stdio MCP session's root (`narrow`).

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use brood_core::Code;
use brood_runtime::{ApiError, Caller};

use crate::error::HttpError;
use crate::state::Api;
use crate::ui::session::ByCookie;

/// How a request arrived, set on each request by the listener.
#[derive(Clone)]
pub(crate) enum Conn {
    /// The Unix socket, with the caller the peer's credentials identified
    /// (or why it could not be).
    Unix(Result<Caller, ApiError>),
    /// The loopback TCP listener: the token decides, if the process that
    /// presents it is outside every agent ([`TcpPeer`]).
    Tcp(std::sync::Arc<TcpPeer>),
    /// A request the server makes itself on behalf of a caller it already
    /// authenticated (the MCP tools at `/mcp` call the API's routes).
    Inner(Caller),
}

/// The middleware in front of every route: turns the connection into a
/// [`Caller`] (a request extension) or refuses with 401 (TCP without the
/// token) or 403 (a process the runtime cannot place).
pub(crate) async fn authenticate(State(api): State<Api>, mut req: Request, next: Next) -> Response {
    let conn = req.extensions().get::<Conn>().cloned();
    let caller = match conn {
        Some(Conn::Unix(Ok(c))) => c,
        Some(Conn::Unix(Err(e))) => return HttpError(e).into_response(),
        Some(Conn::Inner(c)) => c,
        Some(Conn::Tcp(peer)) => {
            // Liveness probes need no token.
            if req.uri().path() == "/healthz" {
                return next.run(req).await;
            }
            // The web UI's first visit, `/ui?token=…`: a cookie and a redirect.
            if let Some(r) = crate::ui::session::login(&api, &req) {
                return r;
            }
            let presented = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            let operator = match (&api.0.token, presented) {
                (Some(t), Some(p)) if t.matches(p.trim()) => Caller::User {
                    // SAFETY: geteuid cannot fail.
                    uid: unsafe { libc::geteuid() },
                },
                // No bearer token: the web UI's cookie may stand for it
                // (docs/decisions/ui-and-mcp.md "The web UI").
                (_, None) => match crate::ui::session::by_cookie(&api, &req) {
                    ByCookie::Operator => Caller::User {
                        // SAFETY: geteuid cannot fail.
                        uid: unsafe { libc::geteuid() },
                    },
                    ByCookie::Refused(r) => return r,
                    ByCookie::Absent => {
                        return crate::ui::session::unauthorized(
                            &req,
                            "this listener needs `Authorization: Bearer <token>` (the token is in $BROOD_ROOT/token); a browser opens /ui?token=<token> once",
                        );
                    }
                },
                _ => {
                    return HttpError(ApiError::new(
                        Code::Unauthorized,
                        "wrong bearer token (the token is in $BROOD_ROOT/token)",
                    ))
                    .into_response();
                }
            };
            // The token (or the cookie that stands for it) is the operator's
            // only in the operator's hands.
            if let Err(why) = peer.verify(&api).await {
                return HttpError(ApiError::new(Code::Forbidden, why)).into_response();
            }
            operator
        }
        None => {
            return HttpError(ApiError::new(
                Code::Forbidden,
                "the request came through no listener brood knows",
            ))
            .into_response();
        }
    };
    // A stdio MCP session's requests act as its root (`narrow`): only ever narrower.
    let caller = match crate::narrow::narrow(&api, req.headers(), caller) {
        Ok(c) => c,
        Err(e) => return HttpError(e).into_response(),
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The caller as the idempotency scope names it.
pub(crate) fn caller_label(c: &Caller) -> String {
    match c {
        Caller::User { uid } => format!("user:{uid}"),
        Caller::Agent(a) => format!("agent:{a}"),
    }
}

/// The client of one TCP connection, and whether it was found to be outside
/// every agent (worked out once, by the first request that presents the
/// token).
pub(crate) struct TcpPeer {
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
    verdict: tokio::sync::OnceCell<Result<(), String>>,
}

impl TcpPeer {
    pub(crate) fn new(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> TcpPeer {
        TcpPeer {
            peer,
            local,
            verdict: tokio::sync::OnceCell::new(),
        }
    }

    /// `Ok` when every process holding the client's socket is identified
    /// as the operator (crate::peer); the reason otherwise.
    async fn verify(&self, api: &Api) -> Result<(), String> {
        self.verdict
            .get_or_init(|| async {
                let (peer, local) = (self.peer, self.local);
                let found = tokio::task::spawn_blocking(move || crate::peer::holders(peer, local))
                    .await
                    .map_err(|e| format!("looking for the client's process failed: {e}"))?;
                let (pids, uid) = found.map_err(|e| {
                    format!("the token is taken only from a process outside every agent, and {e}")
                })?;
                for pid in pids {
                    match api.sup().identify(pid, uid).await {
                        Ok(Caller::User { .. }) => {}
                        Ok(Caller::Agent(a)) => {
                            return Err(format!(
                                "the bearer token is the operator's; agent {a} (pid {pid}) may not use it"
                            ));
                        }
                        Err(e) => return Err(format!("the bearer token is refused: {}", e.message)),
                    }
                }
                Ok(())
            })
            .await
            .clone()
    }
}
