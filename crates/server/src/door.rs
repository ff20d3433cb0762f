//! The agents' doors (issue 24, docs/security.md "The door"): how a process
//! inside an agent reaches its own supervisor without `socket(2)`.
//!
//! An agent whose policy is not `network: all` may create no socket but a
//! `socketpair(AF_UNIX)` (the launcher's socket filter), so it cannot connect
//! to the control socket or to another agent's socket by path. Instead every
//! run gets a door: one end of a `SOCK_SEQPACKET` socket pair, at descriptor 3
//! of its process (`BROOD_DOOR`), inherited by everything the agent starts.
//! To open a connection a client makes a stream socket pair, sends one end
//! through the door with a short tag naming where it wants to go, and talks
//! over the other ([`open`]):
//!
//! * `api`: the HTTP API, as this agent;
//! * `sock:<name>`: agent `<name>`'s socket (SPEC 8), as this agent (its
//!   owner, parent and the operator may use it; the socket decides).
//!
//! Who calls is not worked out from credentials at all: a connection that
//! came through an agent's door *is* that agent, because only its processes
//! hold the door. Nothing is sent back through the door, so several
//! processes of one agent can use it at once.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use brood_core::{AgentName, RunId};
use brood_runtime::agent_socket::Listener;
use brood_runtime::{Caller, Config, Supervisor};
use brood_runtime::{DoorHost, SocketHost};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::agent_socket::Handoff;
use crate::auth::Conn;
use crate::state::Api;

/// The longest tag a client may send (`sock:` and a 64-character name fit).
const MAX_TAG: usize = 80;

/// The host the runtime calls when an agent's socket should exist
/// (`Config::agent_sockets`): binds and serves it on a task of its own (the
/// bind, the accepts and the final unlink all happen there, off the
/// dispatcher) until the returned `Listener` is closed or dropped. For a
/// supervisor whose agents also have doors, [`crate::Entrances`] sets both.
pub fn agent_sockets() -> SocketHost {
    Entrances::new().sockets()
}

/// The ways agents come in, for one supervisor: the per-agent sockets
/// (SPEC 8) and the doors. Made by the composition root before the
/// supervisor starts ([`Entrances::install`]) and told of the API once it
/// exists ([`Entrances::serve`]).
#[derive(Clone, Default)]
pub struct Entrances {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The API that doors' `api` connections are served by.
    api: OnceLock<Api>,
    /// The agent sockets being served, each with the channel its task takes
    /// door connections from.
    sockets: Mutex<HashMap<AgentName, (RunId, mpsc::UnboundedSender<Handoff>)>>,
}

impl Entrances {
    pub fn new() -> Entrances {
        Entrances::default()
    }

    /// Sets `cfg`'s hosts of the per-agent sockets and of the doors.
    pub fn install(&self, cfg: &mut Config) {
        cfg.agent_sockets = Some(self.sockets());
        cfg.doors = Some(self.doors());
    }

    /// From now on the doors' `api` connections are served by `api`; until
    /// then they are closed at once.
    pub fn serve(&self, api: &Api) {
        let _ = self.inner.api.set(api.clone());
    }

    pub(crate) fn sockets(&self) -> SocketHost {
        let me = self.clone();
        Arc::new(move |sup, name, run, path, access| {
            let (stop_tx, stop_rx) = oneshot::channel();
            let (tx, rx) = mpsc::unbounded_channel();
            me.lock_sockets().insert(name.clone(), (run.clone(), tx));
            let me = me.clone();
            tokio::spawn(async move {
                crate::agent_socket::serve(
                    sup,
                    name.clone(),
                    run.clone(),
                    path,
                    Arc::new(access),
                    stop_rx,
                    rx,
                )
                .await;
                let mut m = me.lock_sockets();
                if m.get(&name).is_some_and(|(r, _)| *r == run) {
                    m.remove(&name);
                    brood_runtime::room::give_back(&mut m);
                }
            });
            Listener::new(stop_tx)
        })
    }

    fn doors(&self) -> DoorHost {
        let me = self.clone();
        Arc::new(move |sup, name, run, door| {
            let (stop_tx, stop_rx) = oneshot::channel();
            tokio::spawn(me.clone().serve_door(sup, name, run, door, stop_rx));
            Listener::new(stop_tx)
        })
    }

    fn lock_sockets(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<AgentName, (RunId, mpsc::UnboundedSender<Handoff>)>>
    {
        self.inner
            .sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes connections from one agent's door until its run ends (the
    /// listener is closed) or every process holding the other end is gone.
    async fn serve_door(
        self,
        _sup: Supervisor,
        name: AgentName,
        run: RunId,
        door: OwnedFd,
        mut stop: oneshot::Receiver<()>,
    ) {
        // SAFETY: the OwnedFd is moved into the AsyncFd, which owns it (and
        // so keeps it open and the same) until it is dropped.
        let door = match unsafe { AsyncFd::register_with_interest(door, Interest::READABLE) } {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "serving the agent's door failed");
                return;
            }
        };
        loop {
            let got = tokio::select! {
                _ = &mut stop => return,
                r = door.readable() => match r {
                    Ok(mut guard) => match guard.try_io(|fd| receive(fd.get_ref().as_fd())) {
                        Ok(r) => r,
                        Err(_would_block) => continue,
                    },
                    Err(e) => Err(e),
                },
            };
            match got {
                Ok(Some((tag, fds))) => {
                    for fd in fds {
                        self.enter(&name, &run, &tag, fd);
                    }
                }
                // Every process of the agent closed its end.
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "reading the agent's door failed");
                    return;
                }
            }
        }
    }

    /// One connection through `name`'s door, to where its tag says.
    fn enter(&self, name: &AgentName, run: &RunId, tag: &[u8], fd: OwnedFd) {
        let stream = match stream_of(fd) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(agent = %name, error = %e, "a door connection that is no stream socket");
                return;
            }
        };
        let caller = Caller::Agent(name.clone());
        if tag == b"api" {
            match self.inner.api.get() {
                Some(api) => {
                    tokio::spawn(crate::listen::connection(
                        api.router(),
                        stream,
                        Conn::Unix(Ok(caller)),
                    ));
                }
                None => tracing::debug!(agent = %name, "a door connection before the API is up"),
            }
            return;
        }
        let target = tag
            .strip_prefix(b"sock:")
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| AgentName::new(n).ok());
        match target {
            Some(t) => {
                let sent = self
                    .lock_sockets()
                    .get(&t)
                    .map(|(_, tx)| tx.send(Box::new((stream, caller))).is_ok());
                if sent != Some(true) {
                    // Dropping the stream tells the client: nobody answers there.
                    tracing::debug!(agent = %name, target = %t, "a door connection to an agent without a socket");
                }
            }
            None => tracing::debug!(agent = %name, %run, "a door connection with an unknown tag"),
        }
    }
}

/// A received descriptor as a tokio stream, if it is a UNIX stream socket.
fn stream_of(fd: OwnedFd) -> std::io::Result<UnixStream> {
    let ty = rustix::net::sockopt::socket_type(&fd)?;
    if ty != SocketType::STREAM {
        return Err(std::io::Error::other(format!(
            "a socket of type {ty:?}, not a stream"
        )));
    }
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    UnixStream::from_std(std)
}

/// One message from a door: its tag and the descriptors it carried, or
/// `None` at end of file.
fn receive(door: BorrowedFd<'_>) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut tag = [0u8; MAX_TAG];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut tag)];
    let got = rustix::net::recvmsg(
        door,
        &mut iov,
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((tag[..got.bytes.min(MAX_TAG)].to_vec(), fds)))
}

/// Opens a connection through the door at `door` (the client's side): a
/// stream socket pair, one end sent through the door under `tag`, the other
/// returned.
pub fn open(door: BorrowedFd<'_>, tag: &str) -> std::io::Result<std::os::unix::net::UnixStream> {
    if tag.len() > MAX_TAG {
        return Err(std::io::Error::other(format!(
            "door tag {tag:?} is longer than {MAX_TAG} bytes"
        )));
    }
    let (mine, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let rights = [theirs.as_fd()];
    control.push(SendAncillaryMessage::ScmRights(&rights));
    rustix::net::sendmsg(
        door,
        &[IoSlice::new(tag.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(std::os::unix::net::UnixStream::from(mine))
}

/// The door this process was given (`BROOD_DOOR`), if any.
pub fn inherited() -> Option<BorrowedFd<'static>> {
    let n: i32 = std::env::var("BROOD_DOOR").ok()?.parse().ok()?;
    if n < 3 {
        return None;
    }
    // SAFETY: fcntl(2) F_GETFD only asks whether the descriptor is open.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open (checked above) and stays open for the
    // life of the process: nothing in brood's client closes it.
    Some(unsafe { BorrowedFd::borrow_raw(n) })
}
