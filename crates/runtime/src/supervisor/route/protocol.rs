//! Routing for the protocol's part ([`crate::supervisor::protocol`]): what
//! an agent's process says or does (`Cmd::Agent`), and the spend the model
//! gateway adds, each lending the part what it reads and applying what it
//! returns: a subtree stopped, a run's end (collected first when it handed
//! something back), the agent's readiness told, a request answered off the
//! loop, its spend settled, its socket told of a status.

use brood_core::{AgentName, FailReason, RunId, Terminal};

use crate::api::Caller;
use crate::shown::agent_view;
use crate::supervisor::protocol::{Env, Exit, Relay, RelayFollow};
use crate::supervisor::{AgentEv, Cmd, Dispatcher, answer, handle};

impl Dispatcher {
    /// `Cmd::Agent`: an event of `name`'s process in its run `run`.
    pub(in crate::supervisor) fn on_agent(&mut self, name: AgentName, run: RunId, e: AgentEv) {
        if let AgentEv::Exited { status } = e {
            match self.with_relay(|relay, env| relay.exited(name, run, status, env)) {
                Some(Exit::Harvest(ending)) => self.harvest(ending),
                Some(Exit::Finish(e)) => {
                    self.finish(&e.name, e.outcome, e.exit_code, e.result, e.detail, None)
                }
                None => {}
            }
            return;
        }
        if let Some(f) = self.with_relay(|relay, env| relay.on_agent(&name, &run, e, env)) {
            self.apply_relay(&name, &run, f);
        }
    }

    /// New spend of `delta` dollars by `name`: it rolls up through every live
    /// ancestor, and the highest agent whose subtree reached its `cost_limit`
    /// is stopped with `budget_exceeded`, its subtree with it (SPEC 9). Returns
    /// whom it stopped.
    pub(in crate::supervisor) fn add_spend(
        &mut self,
        name: &AgentName,
        delta: f64,
    ) -> Option<AgentName> {
        let top = self.with_relay(|relay, env| relay.add_spend(name, delta, env))?;
        self.stop_for_budget(&top);
        Some(top)
    }

    /// Stops `top` with `budget_exceeded` and its subtree with it.
    pub(in crate::supervisor) fn stop_for_budget(&mut self, top: &AgentName) {
        self.with_relay(|relay, env| relay.over_budget(top, env));
        self.stop_subtree(top, Terminal::Failed(FailReason::BudgetExceeded));
    }

    /// A follow-up of what `name` said in its run `run`.
    fn apply_relay(&mut self, name: &AgentName, run: &RunId, f: RelayFollow) {
        match f {
            RelayFollow::Stop(outcome) => self.stop_subtree(name, outcome),
            RelayFollow::Ready { news, reply } => {
                self.tell_ready(name, news);
                self.sock_ready(name);
                if let Some((reply, true)) = reply {
                    let r = self
                        .records
                        .agent(name)
                        .map(|a| agent_view(&self.records.store, &a));
                    answer(reply, r);
                }
            }
            RelayFollow::Request { id, op, args } => {
                let sup = self.handle();
                let agent = name.clone();
                tokio::spawn(async move {
                    let caller = Caller::Agent(agent.clone());
                    let r = handle(&sup, &caller, &op, &args).await;
                    let _ = sup.tx.send(Cmd::AgentReply(agent, id, r));
                });
            }
            RelayFollow::SettleUsage => self.settle_usage(name, run),
            RelayFollow::SockStatus(to) => self.sock_status(name, run, to),
        }
    }

    /// The part, lent what it reads and writes of the other parts.
    fn with_relay<R>(&mut self, f: impl FnOnce(&mut Relay, &mut Env<'_>) -> R) -> R {
        let mut env = Env {
            records: &self.records,
            agents: &mut self.agents,
            sockets: &mut self.sockets,
            paths: &self.host.paths,
        };
        f(&mut self.relay, &mut env)
    }
}
