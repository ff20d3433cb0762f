//! What other nodes post for this one, routed to `routed`: each entry
//! point lends it what it reads and writes ([`Env`]), then applies what it
//! left for other flows, in order: inputs delivered, children's ends told
//! to their parents here, waits answered.

use brood_core::AgentName;
use brood_store::Agent;

use crate::api::ApiError;
use crate::supervisor::routed::{EndedElsewhere, Env, RoutedFollow};
use crate::supervisor::{Dispatcher, Reply};

impl Dispatcher {
    /// An input for an agent another node runs, posted for its host.
    pub(in crate::supervisor) fn route_input(
        &mut self,
        a: &Agent,
        from: &str,
        text: &str,
    ) -> Result<brood_api::InputReply, ApiError> {
        self.with_routed(|r| r.route_input(a, from, text))
    }

    /// A `--ready` spawn admitted here for another node, answered later.
    pub(in crate::supervisor) fn wait_ready_elsewhere(
        &mut self,
        name: AgentName,
        reply: Reply<brood_api::Agent>,
    ) {
        self.with_routed(|r| r.wait_ready_elsewhere(name, reply));
    }

    /// The `--ready` spawns waiting for `ready`, or whose agent ended, answered.
    pub(in crate::supervisor) fn answer_ready_waits(&mut self, ready: Option<&AgentName>) {
        self.with_routed(|r| r.answer_ready_waits(ready));
    }

    /// Tells the node holding a `--ready` spawn of `name` open that it is ready.
    pub(in crate::supervisor) fn tell_ready(&mut self, name: &AgentName, node: Option<String>) {
        self.with_routed(|r| r.tell_ready(name, node));
    }

    /// Inputs other nodes posted for agents running here, delivered.
    pub(in crate::supervisor) fn deliver_routed_inputs(&mut self) {
        self.with_routed(|r| r.deliver_routed_inputs());
    }

    /// Waits for agents hosted elsewhere answered from the store.
    pub(in crate::supervisor) fn answer_remote_waits(&mut self) {
        self.with_routed(|r| r.answer_remote_waits());
    }

    /// After a recorded end: a parent or customer another node runs told.
    pub(in crate::supervisor) fn tell_other_nodes_of_end(&mut self, agent: &Agent) {
        self.with_routed(|r| r.tell_other_nodes_of_end(agent));
    }

    /// What a failed store call kept from being told (ends, closes),
    /// told again.
    pub(in crate::supervisor) fn tell_again(&mut self) {
        self.with_routed(|r| r.tell_again());
    }

    /// `Cmd::EndedElsewhere`: a child's artifacts are in its parent's channel here.
    pub(in crate::supervisor) fn on_ended_elsewhere(&mut self, e: EndedElsewhere) {
        self.with_routed(|r| r.on_ended_elsewhere(e));
    }

    /// After a close through this node: the agent's host told.
    pub(in crate::supervisor) fn tell_host_of_close(&mut self, a: &Agent) {
        self.with_routed(|r| r.tell_host_of_close(a));
    }

    /// The routing, lent what it reads and writes; what it left for other
    /// flows applied after it, in order.
    fn with_routed<R>(&mut self, f: impl FnOnce(&mut Env<'_>) -> R) -> R {
        let mut env = Env {
            records: &self.records,
            host: &self.host,
            agents: &mut self.agents,
            waiters: &self.waiters,
            follows: Vec::new(),
        };
        let r = f(&mut env);
        let follows = env.follows;
        for follow in follows {
            match follow {
                RoutedFollow::DeliverInput {
                    agent,
                    sender,
                    text,
                } => {
                    if let Err(e) = self.deliver_input(&agent, &sender, &text) {
                        tracing::warn!(agent = %agent, error = %e.message, "an input posted by another node was not delivered");
                    }
                }
                RoutedFollow::TellOfEnd {
                    told,
                    agent,
                    result,
                    harvest,
                } => self.tell_of_end(&told, &agent, result.as_deref(), Some(&harvest)),
                RoutedFollow::AnswerWaiters(done) => self.answer_waiters(done),
            }
        }
        r
    }
}
