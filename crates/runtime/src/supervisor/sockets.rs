//! The dispatcher's side of the per-agent sockets (SPEC 8; the IO side is
//! [`crate::agent_socket`], the reference docs/agent-socket.md).
//!
//! A part of the supervisor that owns its state: for each live protocol
//! `brood` agent that reported `ready`, a [`Sock`]: the listener (closed when
//! a stop of the agent begins), the client ids its `send`s delivered in this
//! run (id → seq of the recorded input message, which makes a retry
//! idempotent), whether the current turn is over, and the requests following
//! the stream. The hooks below are called where the agent's chunks, messages,
//! status and end already flow through the dispatcher; each only pushes frames
//! into unbounded channels, so nothing here ever waits on a client.
//!
//! The part never acts on another: what a request needs done elsewhere (an
//! input delivered, a cancel) it returns as a [`SockFollow`], which the loop
//! carries out (`route/sockets.rs`) and reports back (`delivered`,
//! `cancelling`, `refused`).
//!
//! Everything is run-scoped on purpose: the socket exists only while the run
//! lives, so a client id needs remembering only as long as the run does.

use std::collections::{HashMap, VecDeque};

use brood_core::{AgentName, Code, RunId, SessionName, Status};
use brood_store::{Message, Protocol};
use serde_json::{Value, json};

use super::records::Records;
use super::{Cmd, Live, Supervisor};
use crate::agent_socket::{self, Access, Listener, Out, Request};
use crate::api::{ApiError, Caller};

/// Client ids remembered per run, oldest forgotten first beyond this: a bound
/// on memory for an agent fed by a program that never stops sending.
const MAX_IDS: usize = 10_000;

#[derive(Default)]
pub(super) struct Sockets {
    /// Boxed, as the live set's entries are (`Agents::live`): the map's
    /// spare room then holds pointers, not whole entries.
    by_agent: HashMap<AgentName, Box<Sock>>,
}

struct Sock {
    run: RunId,
    session: SessionName,
    /// The agent's `model` control-file value, for `start` frames.
    model: Option<String>,
    listener: Option<Listener>,
    ids: HashMap<String, i64>,
    order: VecDeque<String>,
    /// The agent said `blocked` (waiting for input) since its last input.
    turn_over: bool,
    /// An input was delivered and its turn is not over yet.
    awaiting: bool,
    /// The agent showed activity (a chunk, a message, `running`) since the
    /// last input was delivered. A `blocked` while an input awaits and before
    /// any activity was sent before the agent read that input: it ends the
    /// previous turn, not this one, and is not taken as this turn's end.
    active: bool,
    subs: Vec<Sub>,
}

/// A request following the agent's stream.
struct Sub {
    /// The client id of its `send` (or `cancel`), echoed in its frames.
    id: Option<String>,
    out: Out,
    /// Follows the turn (deltas, messages, `done` at `blocked`); otherwise only
    /// the run's end (a `cancel`).
    turn: bool,
}

fn start(id: Option<&str>, run: &RunId, model: &Option<String>) -> Value {
    json!({"type": "start", "id": id, "run": run.as_str(), "model": model})
}

fn message(id: Option<&str>, m: &Message) -> Value {
    json!({"type": "message", "id": id, "run": m.run.as_str(), "seq": m.seq, "role": m.role, "content": m.content})
}

fn done(id: Option<&str>, run: &RunId, status: &str) -> Value {
    let mut v = json!({"type": "done", "run": run.as_str(), "status": status});
    if let Some(id) = id {
        v["id"] = id.into();
    }
    v
}

/// What a request needs the rest of the supervisor to do, carried out by
/// the loop and reported back to the part.
pub(super) enum SockFollow {
    /// A new input for the agent (SPEC 8 `send`): recorded and delivered as
    /// `on_send` does, then [`Sockets::delivered`] with its seq, or
    /// [`Sockets::refused`].
    Deliver {
        caller: Caller,
        run: RunId,
        id: String,
        input: String,
        out: Out,
    },
    /// A `cancel` of the agent's run: `on_cancel`, then
    /// [`Sockets::cancelling`] or [`Sockets::refused`].
    Cancel {
        caller: Caller,
        run: RunId,
        id: Option<String>,
        out: Out,
    },
}

/// An API refusal in the socket's words (SPEC 8 error codes).
fn errno(e: &ApiError) -> &'static str {
    match e.code {
        Code::Forbidden | Code::ParentMismatch => "EACCES",
        Code::NotFound => "ENOENT",
        Code::Conflict => "EHOSTDOWN",
        Code::BadRequest | Code::InvalidName => "EINVAL",
        _ => "EIO",
    }
}

impl Supervisor {
    /// Hands a connection's request to the dispatcher; `false` when it stopped.
    pub fn agent_socket(&self, name: AgentName, r: Request) -> bool {
        self.tx.send(Cmd::AgentSocket(name, r)).is_ok()
    }
}

impl Sockets {
    pub(super) fn len(&self) -> usize {
        self.by_agent.len()
    }

    pub(super) fn room(&self) -> usize {
        self.by_agent.capacity()
    }

    /// The agent reported `ready`: a protocol `brood` agent can take input
    /// from now on, so its socket is bound (SPEC 8) by `bind`, given the run
    /// and who may connect (`None`: a supervisor without a transport has no
    /// socket, and a client finds none, as for an agent that is not live).
    pub(super) fn ready(
        &mut self,
        name: &AgentName,
        live: &Live,
        operator_uid: u32,
        bind: impl FnOnce(&RunId, Access) -> Option<Listener>,
    ) {
        if live.protocol != Protocol::Brood || live.stopping.is_some() {
            return;
        }
        let model = match &live.policy.models {
            Some(m) if m.len() == 1 => m.iter().next().cloned(),
            _ => None,
        };
        let access = Access {
            operator_uid,
            parent: live.parent.clone(),
        };
        let listener = bind(&live.run, access);
        self.by_agent.insert(
            name.clone(),
            Box::new(Sock {
                run: live.run.clone(),
                session: live.session.clone(),
                model,
                listener,
                ids: HashMap::new(),
                order: VecDeque::new(),
                turn_over: false,
                awaiting: false,
                active: false,
                subs: Vec::new(),
            }),
        );
    }

    /// A protocol `chunk`: a `delta` to everyone following the turn.
    pub(super) fn chunk(&mut self, name: &AgentName, run: &RunId, text: &str) {
        let Some(s) = self.by_agent.get_mut(name) else {
            return;
        };
        s.active = true;
        s.subs.retain(|sub| {
            !sub.turn
                || sub
                    .out
                    .send(json!({"type": "delta", "id": sub.id, "run": run.as_str(), "text": text}))
                    .is_ok()
        });
    }

    /// A message the agent sent, as recorded (with its seq).
    pub(super) fn message(&mut self, name: &AgentName, m: &Message) {
        let Some(s) = self.by_agent.get_mut(name) else {
            return;
        };
        if crate::objects::is_agent_message(&m.role) {
            s.active = true;
        }
        s.subs
            .retain(|sub| !sub.turn || sub.out.send(message(sub.id.as_deref(), m)).is_ok());
    }

    /// The agent's `status`: `blocked` ends the turn (`done{status:"blocked"}`
    /// to its followers), `running` starts one. A stopping agent's followers
    /// wait for the end of its run instead.
    pub(super) fn status(&mut self, name: &AgentName, run: &RunId, to: Status, stopping: bool) {
        if stopping {
            return;
        }
        let Some(s) = self.by_agent.get_mut(name) else {
            return;
        };
        match to {
            Status::Blocked => {
                if s.awaiting && !s.active {
                    return;
                }
                s.awaiting = false;
                s.turn_over = true;
                s.subs.retain(|sub| {
                    if !sub.turn {
                        return true;
                    }
                    let _ = sub.out.send(done(sub.id.as_deref(), run, "blocked"));
                    false
                });
            }
            Status::Running => {
                s.active = true;
                s.turn_over = false;
            }
            _ => {}
        }
    }

    /// A stop of the agent begins (SPEC 6 step 3, "close its sockets"): no new
    /// connection; the requests in flight hear the end of the run.
    pub(super) fn close(&mut self, name: &AgentName) {
        if let Some(s) = self.by_agent.get_mut(name)
            && let Some(mut l) = s.listener.take()
        {
            l.close();
        }
    }

    /// The agent leaves the live set (its run's end is recorded): every
    /// follower gets `done` with the run's status, and the socket goes.
    pub(super) fn end(&mut self, name: &AgentName, records: &Records) {
        let Some(s) = self.by_agent.remove(name) else {
            return;
        };
        crate::room::give_back(&mut self.by_agent);
        let status = records
            .store
            .agent(&records.tenant, name)
            .ok()
            .flatten()
            .filter(|a| a.run == s.run)
            .map(|a| a.status.api_word())
            .unwrap_or("failed");
        for sub in s.subs {
            let _ = sub.out.send(done(sub.id.as_deref(), &s.run, status));
        }
        // Dropping the listener closes it and removes the file.
    }

    /// A request from `name`'s socket: answered here when the part can
    /// (a retried `send`, a `resume`, a refusal), or what the loop must do
    /// for it. `stopping`: whether a stop of the agent has begun.
    pub(super) fn request(
        &mut self,
        name: &AgentName,
        r: Request,
        records: &Records,
        stopping: bool,
    ) -> Option<SockFollow> {
        let (out, answered) = match r {
            Request::Send {
                caller,
                run,
                id,
                session,
                input,
                out,
            } => match self.send(name, &run, &id, session, records, stopping, &out) {
                Ok(true) => return None,
                Ok(false) => {
                    return Some(SockFollow::Deliver {
                        caller,
                        run,
                        id,
                        input,
                        out,
                    });
                }
                Err(f) => (out, f),
            },
            Request::Resume {
                run,
                session,
                after,
                out,
            } => match self.resume(name, &run, session, after, records, &out) {
                Ok(()) => return None,
                Err(f) => (out, f),
            },
            Request::Cancel {
                caller,
                run,
                id,
                out,
            } => match self.sock_of(name, &run, id.as_deref()) {
                Ok(_) => {
                    return Some(SockFollow::Cancel {
                        caller,
                        run,
                        id,
                        out,
                    });
                }
                Err(f) => (out, f),
            },
        };
        let _ = out.send(answered);
        None
    }

    /// The socket of `name`'s run `run`, while that run can take requests.
    fn sock_of(&self, name: &AgentName, run: &RunId, id: Option<&str>) -> Result<&Sock, Value> {
        self.by_agent
            .get(name)
            .map(|s| &**s)
            .filter(|s| &s.run == run)
            .ok_or_else(|| {
                let m = format!("agent {name}'s run {run} is over; it takes no more requests");
                agent_socket::error_frame(id, run, "EHOSTDOWN", &m)
            })
    }

    fn check_session(
        s: &Sock,
        name: &AgentName,
        run: &RunId,
        id: Option<&str>,
        session: Option<String>,
    ) -> Result<(), Value> {
        match session {
            Some(x) if x != s.session.as_str() => {
                let m = format!(
                    "agent {name} has no session {x:?} here (its session is {})",
                    s.session
                );
                Err(agent_socket::error_frame(id, run, "ENOENT", &m))
            }
            _ => Ok(()),
        }
    }

    /// A `send`: `Ok(true)` when answered here (a retry of an input already
    /// delivered), `Ok(false)` when the input is new and must be delivered.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        name: &AgentName,
        run: &RunId,
        id: &str,
        session: Option<String>,
        records: &Records,
        stopping: bool,
        out: &Out,
    ) -> Result<bool, Value> {
        let s = self.sock_of(name, run, Some(id))?;
        Self::check_session(s, name, run, Some(id), session)?;
        let err = |code: &str, m: String| agent_socket::error_frame(Some(id), run, code, &m);
        let Some(&seq) = s.ids.get(id) else {
            if stopping {
                return Err(err(
                    "EHOSTDOWN",
                    format!("agent {name} is stopping; it takes no input"),
                ));
            }
            return Ok(false);
        };
        // A retry: the input is not delivered again. Replay what the agent
        // said after it (up to the next input), then follow if still going.
        let msgs = records
            .store
            .messages(&records.tenant, name, &s.session)
            .map_err(|e| err("EIO", format!("reading the session's messages: {e}")))?;
        let _ = out.send(start(Some(id), run, &s.model));
        let mut later_input = false;
        for m in msgs.iter().filter(|m| m.seq > seq) {
            if m.role == "user" {
                later_input = true;
                break;
            }
            let _ = out.send(message(Some(id), m));
        }
        if later_input || s.turn_over {
            let _ = out.send(done(Some(id), run, "blocked"));
            return Ok(true);
        }
        let sub = Sub {
            id: Some(id.to_owned()),
            out: out.clone(),
            turn: true,
        };
        if let Some(s) = self.by_agent.get_mut(name) {
            s.subs.push(sub);
        }
        Ok(true)
    }

    /// A new input was recorded and delivered as message `seq`: its client id
    /// is remembered (a retry is not delivered again) and its client follows
    /// the turn.
    pub(super) fn delivered(
        &mut self,
        name: &AgentName,
        run: &RunId,
        id: &str,
        seq: i64,
        out: &Out,
    ) {
        let Some(s) = self.by_agent.get_mut(name) else {
            return;
        };
        s.ids.insert(id.to_owned(), seq);
        s.order.push_back(id.to_owned());
        if s.order.len() > MAX_IDS
            && let Some(old) = s.order.pop_front()
        {
            s.ids.remove(&old);
        }
        s.turn_over = false;
        s.awaiting = true;
        s.active = false;
        let _ = out.send(start(Some(id), run, &s.model));
        s.subs.push(Sub {
            id: Some(id.to_owned()),
            out: out.clone(),
            turn: true,
        });
    }

    /// A cancel was begun: its client hears the run's end, sent by
    /// [`Sockets::end`] once the stop's processes are gone.
    pub(super) fn cancelling(&mut self, name: &AgentName, id: Option<&str>, out: &Out) {
        if let Some(s) = self.by_agent.get_mut(name) {
            s.subs.push(Sub {
                id: id.map(str::to_owned),
                out: out.clone(),
                turn: false,
            });
        }
    }

    /// What the loop was asked to do for a request was refused: the client
    /// hears why, in the socket's words.
    pub(super) fn refused(out: &Out, id: Option<&str>, run: &RunId, e: &ApiError) {
        let _ = out.send(agent_socket::error_frame(id, run, errno(e), &e.message));
    }

    fn resume(
        &mut self,
        name: &AgentName,
        run: &RunId,
        session: Option<String>,
        after: i64,
        records: &Records,
        out: &Out,
    ) -> Result<(), Value> {
        let s = self.sock_of(name, run, None)?;
        Self::check_session(s, name, run, None, session)?;
        let msgs = records
            .store
            .messages(&records.tenant, name, &s.session)
            .map_err(|e| {
                let m = format!("reading the session's messages: {e}");
                agent_socket::error_frame(None, run, "EIO", &m)
            })?;
        let _ = out.send(start(None, run, &s.model));
        for m in msgs.iter().filter(|m| m.seq > after) {
            let _ = out.send(message(None, m));
        }
        if s.turn_over {
            let _ = out.send(done(None, run, "blocked"));
            return Ok(());
        }
        if let Some(s) = self.by_agent.get_mut(name) {
            s.subs.push(Sub {
                id: None,
                out: out.clone(),
                turn: true,
            });
        }
        Ok(())
    }
}
