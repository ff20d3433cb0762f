//! The dispatcher's side of the per-agent sockets (SPEC 8; the IO side is
//! [`crate::agent_socket`], the reference docs/agent-socket.md).
//!
//! For each live protocol `brood` agent that reported `ready`, the dispatcher
//! keeps a [`Sock`]: the listener (closed when a stop of the agent begins), the
//! client ids its `send`s delivered in this run (id → seq of the recorded input
//! message, which makes a retry idempotent), whether the current turn is over,
//! and the requests following the stream. The hooks below are called where the
//! agent's chunks, messages, status and end already flow through the
//! dispatcher; each only pushes frames into unbounded channels, so nothing here
//! ever waits on a client.
//!
//! Everything is run-scoped on purpose: the socket exists only while the run
//! lives, so a client id needs remembering only as long as the run does.

use std::collections::{HashMap, VecDeque};

use brood_core::{AgentName, Code, RunId, SessionName, Status};
use brood_store::{Message, Protocol};
use serde_json::{Value, json};

use super::{Cmd, Dispatcher, Supervisor};
use crate::agent_socket::{self, Access, Listener, Out, Request};
use crate::api::{ApiError, Caller};

/// Client ids remembered per run, oldest forgotten first beyond this: a bound
/// on memory for an agent fed by a program that never stops sending.
const MAX_IDS: usize = 10_000;

#[derive(Default)]
pub(super) struct Sockets {
    by_agent: HashMap<AgentName, Sock>,
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

impl Dispatcher {
    /// The agent reported `ready`: a protocol `brood` agent can take input from
    /// now on, so its socket is bound (SPEC 8).
    pub(super) fn sock_ready(&mut self, name: &AgentName) {
        let Some(l) = self.agents.live.get(name) else {
            return;
        };
        if l.protocol != Protocol::Brood || l.stopping.is_some() {
            return;
        }
        let (run, session, parent) = (l.run.clone(), l.session.clone(), l.parent.clone());
        let model = match &l.policy.models {
            Some(m) if m.len() == 1 => m.iter().next().cloned(),
            _ => None,
        };
        let access = Access {
            operator_uid: self.host.uid,
            parent,
        };
        // No host (a supervisor without a transport): no socket, and a
        // client finds none, as for an agent that is not live.
        let listener = self.host.cfg.agent_sockets.as_ref().map(|host| {
            host(
                self.handle(),
                name.clone(),
                run.clone(),
                self.host.paths.agent_socket(name),
                access,
            )
        });
        self.sockets.by_agent.insert(
            name.clone(),
            Sock {
                run,
                session,
                model,
                listener,
                ids: HashMap::new(),
                order: VecDeque::new(),
                turn_over: false,
                awaiting: false,
                active: false,
                subs: Vec::new(),
            },
        );
    }

    /// Writes the agent's shim (SPEC 3 `agent/<name>`), with the renderer the
    /// rebuild uses.
    pub(super) fn project_shim(&self, name: &AgentName) {
        let program = crate::objects::shim_program(self.host.cfg.bin_dir.as_deref());
        self.records.projection.write_exec(
            self.host.paths.shim(name),
            crate::objects::shim(&self.host.paths.root, &program, name),
        );
    }

    /// A protocol `chunk`: a `delta` to everyone following the turn.
    pub(super) fn sock_chunk(&mut self, name: &AgentName, run: &RunId, text: &str) {
        let Some(s) = self.sockets.by_agent.get_mut(name) else {
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
    pub(super) fn sock_message(&mut self, name: &AgentName, m: &Message) {
        let Some(s) = self.sockets.by_agent.get_mut(name) else {
            return;
        };
        if crate::objects::is_agent_message(&m.role) {
            s.active = true;
        }
        s.subs
            .retain(|sub| !sub.turn || sub.out.send(message(sub.id.as_deref(), m)).is_ok());
    }

    /// The agent's `status`: `blocked` ends the turn (`done{status:"blocked"}`
    /// to its followers), `running` starts one.
    pub(super) fn sock_status(&mut self, name: &AgentName, run: &RunId, to: Status) {
        // A stopping agent's followers wait for the end of its run.
        if self
            .agents
            .live
            .get(name)
            .is_none_or(|l| l.stopping.is_some())
        {
            return;
        }
        let Some(s) = self.sockets.by_agent.get_mut(name) else {
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
    pub(super) fn sock_close(&mut self, name: &AgentName) {
        if let Some(s) = self.sockets.by_agent.get_mut(name)
            && let Some(mut l) = s.listener.take()
        {
            l.close();
        }
    }

    /// The agent leaves the live set (its run's end is recorded): every
    /// follower gets `done` with the run's status, and the socket goes.
    pub(super) fn sock_end(&mut self, name: &AgentName) {
        let Some(s) = self.sockets.by_agent.remove(name) else {
            return;
        };
        let status = self
            .records
            .store
            .agent(&self.records.tenant, name)
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

    pub(super) fn on_agent_socket(&mut self, name: AgentName, r: Request) {
        match r {
            Request::Send {
                caller,
                run,
                id,
                session,
                input,
                out,
            } => {
                if let Err(f) = self.sock_send(&name, &caller, &run, &id, session, &input, &out) {
                    let _ = out.send(f);
                }
            }
            Request::Resume {
                run,
                session,
                after,
                out,
            } => {
                if let Err(f) = self.sock_resume(&name, &run, session, after, &out) {
                    let _ = out.send(f);
                }
            }
            Request::Cancel {
                caller,
                run,
                id,
                out,
            } => {
                if let Err(f) = self.sock_cancel(&name, &caller, &run, id.as_deref(), &out) {
                    let _ = out.send(f);
                }
            }
        }
    }

    /// The socket of `name`'s run `run`, while that run can take requests.
    fn sock_of(&self, name: &AgentName, run: &RunId, id: Option<&str>) -> Result<&Sock, Value> {
        self.sockets
            .by_agent
            .get(name)
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

    #[allow(clippy::too_many_arguments)]
    fn sock_send(
        &mut self,
        name: &AgentName,
        caller: &Caller,
        run: &RunId,
        id: &str,
        session: Option<String>,
        input: &str,
        out: &Out,
    ) -> Result<(), Value> {
        let s = self.sock_of(name, run, Some(id))?;
        Self::check_session(s, name, run, Some(id), session)?;
        let err = |code: &str, m: String| agent_socket::error_frame(Some(id), run, code, &m);
        if let Some(&seq) = s.ids.get(id) {
            // A retry: the input is not delivered again. Replay what the agent
            // said after it (up to the next input), then follow if still going.
            let msgs = self
                .records
                .store
                .messages(&self.records.tenant, name, &s.session)
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
                return Ok(());
            }
            let sub = Sub {
                id: Some(id.to_owned()),
                out: out.clone(),
                turn: true,
            };
            if let Some(s) = self.sockets.by_agent.get_mut(name) {
                s.subs.push(sub);
            }
            return Ok(());
        }
        if self
            .agents
            .live
            .get(name)
            .is_none_or(|l| l.stopping.is_some())
        {
            return Err(err(
                "EHOSTDOWN",
                format!("agent {name} is stopping; it takes no input"),
            ));
        }
        let r = self
            .on_send(caller, name, input)
            .map_err(|e| err(errno(&e), e.message.clone()))?;
        // `on_send` names the input after the seq of its recorded message.
        let seq =
            r.id.strip_prefix("in-")
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0);
        let Some(s) = self.sockets.by_agent.get_mut(name) else {
            return Ok(());
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
        Ok(())
    }

    fn sock_resume(
        &mut self,
        name: &AgentName,
        run: &RunId,
        session: Option<String>,
        after: i64,
        out: &Out,
    ) -> Result<(), Value> {
        let s = self.sock_of(name, run, None)?;
        Self::check_session(s, name, run, None, session)?;
        let msgs = self
            .records
            .store
            .messages(&self.records.tenant, name, &s.session)
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
        if let Some(s) = self.sockets.by_agent.get_mut(name) {
            s.subs.push(Sub {
                id: None,
                out: out.clone(),
                turn: true,
            });
        }
        Ok(())
    }

    fn sock_cancel(
        &mut self,
        name: &AgentName,
        caller: &Caller,
        run: &RunId,
        id: Option<&str>,
        out: &Out,
    ) -> Result<(), Value> {
        self.sock_of(name, run, id)?;
        self.on_cancel(caller, name)
            .map_err(|e| agent_socket::error_frame(id, run, errno(&e), &e.message))?;
        // The end is recorded when the stop's processes are gone; `sock_end`
        // answers then.
        if let Some(s) = self.sockets.by_agent.get_mut(name) {
            s.subs.push(Sub {
                id: id.map(str::to_owned),
                out: out.clone(),
                turn: false,
            });
        }
        Ok(())
    }
}
