//! The per-agent sockets (SPEC 8), the contract between the runtime and the
//! transport that serves them: `ctx/agent/<name>.sock`, docs/agent-socket.md.
//!
//! A protocol `brood` agent gets a socket when it reports `ready`; it goes away
//! when a stop of the agent begins or its run ends. The runtime decides that
//! (`supervisor::sockets`) and carries out what clients ask; the listener and
//! its connections belong to a [`SocketHost`](crate::supervisor::SocketHost) (brood-server's
//! `agent_sockets`), set in `Config::agent_sockets` by the composition root.
//! A connection hands `send`, `resume` and `cancel` to the dispatcher as a
//! [`Request`] with an [`Out`] channel, into which the dispatcher pushes reply
//! frames as the agent's chunks, messages, status and end flow by.
//!
//! Who may connect: the operator (a caller outside every tree with the
//! supervisor's uid), the agent's parent, and its owner (SPEC 8). The file's
//! mode is 0666 because the decision is made from the peer's credentials, never
//! from the file's permissions.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use brood_core::{AgentName, RunId};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::api::Caller;

/// The longest client `id` accepted, in characters.
pub const MAX_CLIENT_ID: usize = 128;

/// Where the dispatcher sends a request's reply frames.
pub type Out = mpsc::UnboundedSender<Value>;

/// A request a connection hands to the dispatcher. `run` is the run the socket
/// was bound for: a request that outlived it is refused, never applied to a
/// later run.
pub enum Request {
    Send {
        caller: Caller,
        run: RunId,
        id: String,
        session: Option<String>,
        input: String,
        out: Out,
    },
    /// Authorised when the connection was: it only reads and follows.
    Resume {
        run: RunId,
        session: Option<String>,
        after: i64,
        out: Out,
    },
    Cancel {
        caller: Caller,
        run: RunId,
        id: Option<String>,
        out: Out,
    },
}

/// Who may connect (SPEC 8), known when the socket is bound; the owner is
/// read from the store by the first connection that needs it, so binding
/// costs the dispatcher no store read.
#[derive(Debug, Clone)]
pub struct Access {
    /// The supervisor's uid: a caller outside every tree with it is the operator.
    pub operator_uid: u32,
    pub parent: Option<AgentName>,
}

impl Access {
    /// Reads `owner` as the spec records it (`agent:<name>` or `user:<uid>`).
    pub fn owner_of(owner: &str) -> Option<Caller> {
        if let Some(a) = owner.strip_prefix("agent:") {
            return AgentName::new(a).ok().map(Caller::Agent);
        }
        owner
            .strip_prefix("user:")
            .and_then(|u| u.parse().ok())
            .map(|uid| Caller::User { uid })
    }

    /// The operator or the parent: decided without the store.
    pub fn operator_or_parent(&self, c: &Caller) -> bool {
        match c {
            Caller::User { uid } => *uid == self.operator_uid,
            Caller::Agent(a) => self.parent.as_ref() == Some(a),
        }
    }
}

/// A bound socket: dropping it (or [`Listener::close`]) stops accepting and
/// removes the file. Connections already open carry on until their requests end.
pub struct Listener {
    stop: Option<oneshot::Sender<()>>,
}

impl Listener {
    /// A listener its host stops when `stop` fires (or is dropped).
    pub fn new(stop: oneshot::Sender<()>) -> Listener {
        Listener { stop: Some(stop) }
    }

    pub fn close(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

/// Removes the `*.sock` files under `dir` that nobody answers on (left by a
/// supervisor that died); a socket a live supervisor serves is left alone.
pub fn remove_stale(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let is_sock = e.file_type().is_ok_and(|t| t.is_socket());
        if is_sock
            && p.extension().is_some_and(|x| x == "sock")
            && std::os::unix::net::UnixStream::connect(&p).is_err()
            && let Err(err) = std::fs::remove_file(&p)
        {
            tracing::warn!(path = %p.display(), error = %err, "removing a stale agent socket failed");
        }
    }
}

/// A reply frame `error{id?, run, code, message}`.
pub fn error_frame(id: Option<&str>, run: &RunId, code: &str, message: &str) -> Value {
    let mut v = json!({"type": "error", "run": run.as_str(), "code": code, "message": message});
    if let Some(id) = id {
        v["id"] = id.into();
    }
    v
}

/// A fresh client id for a `send` (UUIDv7, so ids sort by time).
pub fn client_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_read_back_as_callers() {
        assert_eq!(
            Access::owner_of("agent:p"),
            Some(Caller::Agent(AgentName::new("p").unwrap()))
        );
        assert_eq!(
            Access::owner_of("user:1000"),
            Some(Caller::User { uid: 1000 })
        );
        for bad in ["", "agent:", "user:x", "group:1", "agent:../x"] {
            assert_eq!(Access::owner_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_operator_and_the_parent_need_no_store() {
        let a = Access {
            operator_uid: 1000,
            parent: Some(AgentName::new("p").unwrap()),
        };
        assert!(a.operator_or_parent(&Caller::User { uid: 1000 }));
        assert!(!a.operator_or_parent(&Caller::User { uid: 1001 }));
        assert!(a.operator_or_parent(&Caller::Agent(AgentName::new("p").unwrap())));
        assert!(!a.operator_or_parent(&Caller::Agent(AgentName::new("q").unwrap())));
    }
}
