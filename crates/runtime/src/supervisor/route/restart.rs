//! What a restart resumed, routed to its part (`restart`): taken up before
//! the loop's first command, released to the queue as parents start, the
//! children it ended told to their parents; and a resumed run's request
//! for a child it already made answered with that child.

use crate::api::{Caller, SpawnRequest};
use crate::supervisor::Dispatcher;
use crate::supervisor::restart::{self, Env};

impl Dispatcher {
    /// The agents the start resumed, taken up (`Restart::take_up_resumed`).
    pub(in crate::supervisor) fn take_up_resumed(&mut self) {
        let operator = self.operator_policy();
        let mut env = Env {
            records: &self.records,
            paths: &self.host.paths,
            bin_dir: self.host.cfg.bin_dir.as_deref(),
            operator: &operator,
            agents: &mut self.agents,
            waiting: &mut self.launcher.waiting,
        };
        self.restart.take_up_resumed(&mut env);
    }

    /// After each command: resumed children released to the queue, the
    /// children the restart ended told to their parents that now run.
    pub(in crate::supervisor) fn release_resumed(&mut self) {
        let tell = self
            .restart
            .release_resumed(&mut self.agents, &mut self.launcher.waiting);
        for (parent, child) in tell {
            self.tell_of_end(&parent, &child, None, None);
        }
    }

    /// The child a resumed run asks for again (`restart::created_before`).
    pub(in crate::supervisor) fn created_before(
        &self,
        caller: &Caller,
        req: &SpawnRequest,
    ) -> Option<brood_api::Agent> {
        restart::created_before(&self.records, &self.agents, caller, req)
    }
}
