//! Routing for the agent sockets' part ([`super::super::sockets`]).

use brood_core::{AgentName, RunId, Status};

use crate::agent_socket::Request;
use crate::supervisor::Dispatcher;
use crate::supervisor::sockets::{SockFollow, Sockets};

impl Dispatcher {
    /// Whether `name` takes no more input: not live here, or being stopped.
    fn stopping(&self, name: &AgentName) -> bool {
        self.agents
            .live
            .get(name)
            .is_none_or(|l| l.stopping.is_some())
    }

    /// The agent reported `ready`: its socket is bound by the host's
    /// transport, if it has one.
    pub(in crate::supervisor) fn sock_ready(&mut self, name: &AgentName) {
        let Some(live) = self.agents.live.get(name) else {
            return;
        };
        let sup = self.handle();
        let host = &self.host;
        self.sockets.ready(name, live, host.uid, |run, access| {
            let bind = host.cfg.agent_sockets.as_ref()?;
            Some(bind(
                sup,
                name.clone(),
                run.clone(),
                host.paths.agent_socket(name),
                access,
            ))
        });
    }

    pub(in crate::supervisor) fn sock_status(&mut self, name: &AgentName, run: &RunId, to: Status) {
        let stopping = self.stopping(name);
        self.sockets.status(name, run, to, stopping);
    }

    pub(in crate::supervisor) fn sock_end(&mut self, name: &AgentName) {
        self.sockets.end(name, &self.records);
    }

    /// `Cmd::AgentSocket`: the part answers what it can; an input to deliver
    /// or a cancel goes through the verbs every caller uses.
    pub(in crate::supervisor) fn on_agent_socket(&mut self, name: AgentName, r: Request) {
        let stopping = self.stopping(&name);
        match self.sockets.request(&name, r, &self.records, stopping) {
            None => {}
            Some(SockFollow::Deliver {
                caller,
                run,
                id,
                input,
                out,
            }) => match self.on_send(&caller, &name, &input) {
                Ok(r) => {
                    // `on_send` names the input after the seq of its recorded message.
                    let seq =
                        r.id.strip_prefix("in-")
                            .and_then(|n| n.parse::<i64>().ok())
                            .unwrap_or(0);
                    self.sockets.delivered(&name, &run, &id, seq, &out);
                }
                Err(e) => Sockets::refused(&out, Some(&id), &run, &e),
            },
            Some(SockFollow::Cancel {
                caller,
                run,
                id,
                out,
            }) => match self.on_cancel(&caller, &name) {
                // The end is recorded when the stop's processes are gone;
                // the part answers then.
                Ok(_) => self.sockets.cancelling(&name, id.as_deref(), &out),
                Err(e) => Sockets::refused(&out, id.as_deref(), &run, &e),
            },
        }
    }
}
