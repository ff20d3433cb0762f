//! The verbs on live agents routed (`verbs`): what a verb does here is the
//! part's, lent `verbs::Env`; around it the router does what belongs to
//! other flows: an input routed to another node, a cancel's stop, another
//! node told of a close, the queue served after a resume, the creator's
//! answer held until its run is ready.

use std::time::Duration;

use brood_core::{AgentName, CancelReason, Terminal};

use crate::api::{ApiError, Caller};
use crate::shown::agent_view;
use crate::supervisor::verbs::{Closed, Env};
use crate::supervisor::{Dispatcher, Reply, answer};

impl Dispatcher {
    /// `Cmd::Send`: an input for an agent, delivered here or posted for
    /// the node that runs it.
    pub(in crate::supervisor) fn on_send(
        &mut self,
        caller: &Caller,
        name: &AgentName,
        text: &str,
    ) -> Result<brood_api::InputReply, ApiError> {
        self.agents.tool_granted(caller, "send")?;
        let a = self.records.agent(name)?;
        self.records.authorize(caller, &a)?;
        let from = match caller {
            Caller::Agent(me) => me.to_string(),
            Caller::User { uid } => format!("user:{uid}"),
        };
        if !self.agents.live.contains_key(name) && a.supervisor != self.host.me {
            return self.route_input(&a, &from, text);
        }
        self.deliver_input(name, &from, text)
    }

    /// An input for a live agent of this supervisor, recorded and written
    /// to its stdin.
    pub(in crate::supervisor) fn deliver_input(
        &mut self,
        name: &AgentName,
        from: &str,
        text: &str,
    ) -> Result<brood_api::InputReply, ApiError> {
        self.verbs().deliver_input(name, from, text)
    }

    /// `Cmd::Wait`.
    pub(in crate::supervisor) fn on_wait(
        &mut self,
        caller: &Caller,
        names: Vec<AgentName>,
        timeout: Option<Duration>,
        reply: Reply<brood_api::WaitReply>,
    ) {
        let id = self.id();
        self.verbs().on_wait(caller, names, timeout, reply, id);
    }

    /// The agents `names` as they are now, for a wait's answer.
    pub(in crate::supervisor) fn wait_result(
        &mut self,
        names: &[AgentName],
        timed_out: bool,
    ) -> Result<brood_api::WaitReply, ApiError> {
        self.verbs().wait_result(names, timed_out)
    }

    /// `Cmd::Cancel`: the agent's subtree stopped (a finished or stopping
    /// one as it is).
    pub(in crate::supervisor) fn on_cancel(
        &mut self,
        caller: &Caller,
        name: &AgentName,
    ) -> Result<brood_api::Agent, ApiError> {
        let a = self.records.agent(name)?;
        self.records.authorize(caller, &a)?;
        if a.status.is_finished() {
            return Ok(agent_view(&self.records.store, &a));
        }
        if self
            .agents
            .live
            .get(name)
            .is_some_and(|l| l.stopping.is_some())
        {
            return Ok(agent_view(&self.records.store, &a));
        }
        self.stop_subtree(name, Terminal::Cancelled(CancelReason::User));
        let a = self.records.agent(name)?;
        Ok(agent_view(&self.records.store, &a))
    }

    /// `Cmd::Close`: closed here, then its host told when another node
    /// runs it.
    pub(in crate::supervisor) fn on_close(
        &mut self,
        caller: &Caller,
        name: &AgentName,
    ) -> Result<brood_api::Agent, ApiError> {
        match self.verbs().on_close(caller, name)? {
            Closed::Already(view) => Ok(*view),
            Closed::Now(a) => {
                self.tell_host_of_close(&a);
                Ok(agent_view(&self.records.store, &a))
            }
        }
    }

    /// `Cmd::Resume`: the new run recorded, then the queue served, the
    /// caller answered once it is ready (or, resumed on another node, as
    /// recorded there).
    pub(in crate::supervisor) fn on_resume(
        &mut self,
        caller: &Caller,
        name: &AgentName,
        text: Option<String>,
        given: brood_api::Secrets,
        reply: Reply<brood_api::Agent>,
    ) {
        match self.verbs().resume(caller, name, text, given) {
            Ok(here) => {
                if here {
                    self.pump_queue();
                }
                match self.agents.live.get_mut(name) {
                    Some(l) => l.spawn_reply = Some((reply, false)),
                    // Resumed on another node: as recorded (queued there).
                    None => {
                        let r = self
                            .records
                            .agent(name)
                            .map(|a| agent_view(&self.records.store, &a));
                        answer(reply, r);
                    }
                }
            }
            Err(e) => answer(reply, Err(e)),
        }
    }

    /// The verbs' part, lent what it reads and writes.
    fn verbs(&mut self) -> Env<'_> {
        Env {
            records: &self.records,
            host: &self.host,
            agents: &mut self.agents,
            waiters: &mut self.waiters,
            waiting: &mut self.launcher.waiting,
        }
    }
}
