//! The model gateway's questions routed to its part (`models`): a call
//! checked against the run, its grant, its budget and the rate windows; a
//! call metered, its event recorded and its run's spend settled and rolled
//! up (a run's endpoint is opened at its launch by the launch's part).

use brood_core::{AgentName, RunId};

use crate::supervisor::Dispatcher;
use crate::supervisor::models::{self, ModelOp};

impl Dispatcher {
    /// `Cmd::Model`.
    pub(in crate::supervisor) fn on_model(&mut self, name: AgentName, run: RunId, op: ModelOp) {
        match op {
            ModelOp::Check {
                model,
                estimate_usd,
                reply,
            } => {
                let r = self.models.check(
                    &mut self.agents,
                    &self.host.cfg.quotas.models,
                    &name,
                    &run,
                    &model,
                    estimate_usd,
                );
                let _ = reply.send(r);
            }
            ModelOp::Used(call) => {
                let Some(m) = self.models.used(&mut self.agents, &self.host.tracer, *call) else {
                    return;
                };
                self.records.append_events(std::slice::from_ref(&m.event));
                if let Some((name, run)) = m.settle {
                    self.settle_usage(&name, &run);
                }
            }
        }
    }

    /// The run's spend: the more of what it reported and what brood
    /// metered; recorded, and any growth rolled up the tree (SPEC 9).
    pub(in crate::supervisor) fn settle_usage(&mut self, name: &AgentName, run: &RunId) {
        let Some(l) = self.agents.live.get_mut(name) else {
            return;
        };
        let u = models::usage(l);
        if let Err(e) = self.records.store.record_usage(
            &self.records.tenant,
            run,
            u.tokens_in,
            u.tokens_out,
            u.cost,
        ) {
            tracing::error!(agent = %name, error = %e, "recording usage failed");
        }
        self.add_spend(name, u.delta);
    }
}
