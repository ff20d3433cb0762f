//! The listeners: the control socket and the loopback TCP port, each
//! connection served by hyper in a task of its own (a slow or stalled client
//! holds only its own task; the dispatcher never waits on a connection),
//! with a deadline on the request head.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use brood_core::Code;
use brood_runtime::{ApiError, Caller};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tower::ServiceExt;

use crate::auth::Conn;
use crate::state::Api;

/// How long a client has to send a request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// The default socket of a root.
pub fn socket_of(root: &Path) -> PathBuf {
    root.join("brood.sock")
}

/// Binds the control socket (replacing a stale file nobody answers on) with
/// mode 0600: only the operator (and root) may connect; agents reach it
/// through the path the runtime gives them.
pub async fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!(
                    "{}: another brood supervisor is serving this root",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Binds the TCP listener. Only loopback addresses are accepted: the API
/// can start processes, and a bearer token over plain HTTP is no protection
/// on a network.
pub async fn bind_tcp(addr: &str) -> std::io::Result<TcpListener> {
    let parsed: SocketAddr = addr.parse().map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--listen {addr:?}: not an address and port like 127.0.0.1:8420 ({e})"),
        )
    })?;
    if !parsed.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "--listen {addr}: only a loopback address (127.0.0.1, ::1) is served; brood's API starts processes and its token travels in clear"
            ),
        ));
    }
    TcpListener::bind(parsed).await
}

/// Serves the control socket until the listener fails.
pub async fn serve_unix(api: Api, listener: UnixListener) {
    let router = api.router();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let api = api.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    let caller = match stream.peer_cred().map(|c| (c.pid(), c.uid())) {
                        Ok(cred) => identify(&api, cred).await,
                        Err(e) => Err(ApiError::new(
                            Code::Forbidden,
                            format!("reading the caller's credentials failed: {e}"),
                        )),
                    };
                    connection(router, stream, Conn::Unix(caller)).await;
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "accept on the control socket failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Who calls on the control socket, from the peer's pid and uid.
pub(crate) async fn identify(api: &Api, cred: (Option<i32>, u32)) -> Result<Caller, ApiError> {
    match cred {
        (Some(pid), uid) => api.sup().identify(pid, uid).await,
        (None, _) => Err(ApiError::new(
            Code::Forbidden,
            "the kernel gave no pid for the caller, so it cannot be identified",
        )),
    }
}

/// A TCP connection's peer, for the token check; `None` (logged) when the
/// socket has no local address.
pub(crate) fn tcp_conn(stream: &tokio::net::TcpStream, peer: SocketAddr) -> Option<Conn> {
    let _ = stream.set_nodelay(true);
    match stream.local_addr() {
        Ok(local) => Some(Conn::Tcp(std::sync::Arc::new(crate::auth::TcpPeer::new(
            peer, local,
        )))),
        Err(e) => {
            tracing::warn!(error = %e, "a TCP connection without a local address");
            None
        }
    }
}

/// Serves the TCP listener until it fails.
pub async fn serve_tcp(api: Api, listener: TcpListener) {
    let router = api.router();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Some(conn) = tcp_conn(&stream, peer) else {
                    continue;
                };
                tokio::spawn(connection(router.clone(), stream, conn));
            }
            Err(e) => {
                tracing::error!(error = %e, "accept on the TCP listener failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub(crate) async fn connection<S>(router: Router, stream: S, conn: Conn)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(conn.clone());
        router.clone().oneshot(req.map(axum::body::Body::new))
    });
    http1(stream, service).await;
}

/// Serves one connection with `service` (HTTP/1.1, with the deadline on
/// each request's head) until it ends.
pub(crate) async fn http1<S, Svc>(stream: S, service: Svc)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Svc: hyper::service::Service<
            Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        >,
{
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "API connection ended");
    }
}
