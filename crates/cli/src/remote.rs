//! The CLI as a client of the HTTP API (docs/api.md): over the control
//! socket by default (inside an agent, the one it was given), or over TCP
//! with `--url` and `BROOD_TOKEN`. Error answers become the documented exit
//! codes; read-only commands fall back to the store when no daemon answers.

use std::path::PathBuf;

use anyhow::Result;
use brood_core::Code;
use brood_server::client::{self, Answer, ClientError, Endpoint};
use serde::Deserialize;
use serde_json::Value;

use crate::Exit;

/// Where the API is, from `--root`, `--url`, `BROOD_TOKEN` and `BROOD_SOCKET`.
pub(crate) struct Remote {
    ep: Endpoint,
}

impl Remote {
    pub(crate) fn new(
        root: &Option<PathBuf>,
        url: &Option<String>,
        token: &Option<String>,
    ) -> Result<Remote> {
        let ep = match url {
            Some(u) => Endpoint::from_url(u, token.clone()).map_err(|e| Exit(2, e))?,
            None => endpoint_for(root),
        };
        Ok(Remote { ep })
    }

    /// The control socket at `sock`.
    pub(crate) fn at(sock: &std::path::Path) -> Remote {
        Remote {
            ep: Endpoint::Unix(sock.to_path_buf()),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Whether a supervisor serves the root: always for `--url` and inside
    /// an agent (their calls must go through it), otherwise when something
    /// answers on the control socket. A verb that may work on the store
    /// itself (`rm`, `prune`) does so only when none does.
    pub(crate) fn served(&self) -> bool {
        match &self.ep {
            Endpoint::Unix(sock) => std::os::unix::net::UnixStream::connect(sock).is_ok(),
            _ => true,
        }
    }

    fn unreachable(&self, e: &ClientError) -> Exit {
        Exit(
            1,
            format!(
                "no brood supervisor answers ({e}); start one with `brood serve` or use `brood run`"
            ),
        )
    }

    /// One call; an error answer becomes an [`Exit`] with its code's exit status.
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let a = client::call(&self.ep, method, path, body.as_ref(), None)
            .await
            .map_err(|e| self.unreachable(&e))?;
        ok(a)
    }

    /// A read: `None` when no daemon answers (the caller reads the store instead).
    pub(crate) async fn read(&self, path: &str) -> Result<Option<Value>> {
        match client::call(&self.ep, "GET", path, None, None).await {
            Ok(a) => ok(a).map(Some),
            Err(_) if matches!(self.ep, Endpoint::Unix(_) | Endpoint::Door(_)) => Ok(None),
            Err(e) => Err(self.unreachable(&e).into()),
        }
    }
}

/// The body of a 2xx answer, or the error it carries as an [`Exit`].
pub(crate) fn ok(a: Answer) -> Result<Value> {
    if (200..300).contains(&a.status) {
        return Ok(a.body);
    }
    let (code, message) = match brood_api::ErrorBody::deserialize(&a.body) {
        Ok(e) => (
            Code::parse(&e.error.code).unwrap_or(Code::Internal),
            e.error.message,
        ),
        Err(_) => (Code::Internal, format!("HTTP {}: {}", a.status, a.body)),
    };
    Err(crate::refusal(code, message).into())
}

/// An answer read as the `brood_api` type it is documented to be; one that
/// is not says so rather than printing half of it.
pub(crate) fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T> {
    T::deserialize(v).map_err(|e| {
        Exit(
            1,
            format!("the supervisor's answer is not what this brood understands ({e}): {v}"),
        )
        .into()
    })
}

/// Where the API is without `--url`: inside an agent (no `--root` given),
/// through the door it was given, else its control socket.
pub(crate) fn endpoint_for(root: &Option<PathBuf>) -> Endpoint {
    if root.is_none()
        && let Some(door) = brood_server::door::inherited()
    {
        use std::os::fd::AsRawFd;
        return Endpoint::Door(door.as_raw_fd());
    }
    Endpoint::Unix(socket_for(root))
}

/// The control socket to talk to: inside an agent, the one it was given.
pub(crate) fn socket_for(root: &Option<PathBuf>) -> PathBuf {
    if root.is_none()
        && let Ok(s) = std::env::var("BROOD_SOCKET")
        && !s.is_empty()
    {
        return PathBuf::from(s);
    }
    brood_server::socket_of(&crate::root_of(root))
}
