//! Routing for the launch's part ([`crate::supervisor::launch`]): the entry
//! points the rest of the supervisor calls (the queue served after each
//! command and each batch of creations, the spawner's answer, and the two
//! halves of a start that `batch` records with others), each lending the
//! part what it reads and applying what it returns in order: a group made
//! for nothing removed, a failed launch ended, a launch nobody wants
//! forgotten and handed back.

use brood_core::{AgentName, FailReason, RunId, Terminal};
use brood_launch::{LaunchError, Launched};
use brood_store::{Agent, StoreError};

use crate::supervisor::Dispatcher;
use crate::supervisor::launch::{Env, LaunchFollow, Made, Starting};
use crate::supervisor::launcher::Launcher;

impl Dispatcher {
    /// Starts queued agents, first in first out, while concurrency slots are free
    /// (SPEC 9: a full tenant queues instead of failing). Called after every
    /// command, so a slot freed anywhere is used at once.
    pub(in crate::supervisor) fn pump_queue(&mut self) {
        self.with_launch(|launcher, env| launcher.pump(env));
    }

    /// `Cmd::Launched`: the spawner's answer taken up, its start handed to
    /// the start writer (`starts_writer`), what follows it when recorded.
    pub(in crate::supervisor) fn on_launched(
        &mut self,
        name: AgentName,
        run: RunId,
        r: Result<Launched, LaunchError>,
        made: Made,
    ) {
        if let Some(s) = self.launch_begins(name, run, r, made) {
            self.record_starts(vec![s]);
        }
    }

    /// What the spawner's answer needs before its start is recorded
    /// ([`Launcher::begins`]): `Some`, the start to record, then
    /// [`Self::launch_started`].
    pub(in crate::supervisor) fn launch_begins(
        &mut self,
        name: AgentName,
        run: RunId,
        r: Result<Launched, LaunchError>,
        made: Made,
    ) -> Option<Starting> {
        let (starting, follows) =
            self.with_launch(|launcher, env| launcher.begins(name, run, r, made, env));
        self.apply_launch(follows);
        starting
    }

    /// What follows a start the store recorded, or refused
    /// ([`Launcher::started`]).
    pub(in crate::supervisor) fn launch_started(
        &mut self,
        s: Starting,
        start: Result<Agent, StoreError>,
    ) {
        let name = s.name().clone();
        let follows = self.with_launch(|launcher, env| launcher.started(s, start, env));
        self.apply_launch(follows);
        // A stop that covered it while its start was being recorded, made
        // now that its process is known (a start refused was killed above).
        let after = self
            .agents
            .live
            .get_mut(&name)
            .filter(|l| l.pid.is_some())
            .and_then(|l| l.stop_after_start.take());
        if let Some(outcome) = after {
            self.stop_subtree(&name, outcome);
        }
    }

    /// The part, lent what it reads and writes of the other parts.
    fn with_launch<R>(&mut self, f: impl FnOnce(&mut Launcher, &mut Env<'_>) -> R) -> R {
        let mut env = Env {
            host: &self.host,
            records: &self.records,
            agents: &mut self.agents,
        };
        f(&mut self.launcher, &mut env)
    }

    /// The part's follow-ups, one at a time in order.
    fn apply_launch(&mut self, follows: Vec<LaunchFollow>) {
        for f in follows {
            match f {
                LaunchFollow::RemoveGroup(group) => self.remove_group(group),
                LaunchFollow::Fail { name, detail } => self.finish(
                    &name,
                    Terminal::Failed(FailReason::ExitCode),
                    None,
                    None,
                    Some(detail),
                    None,
                ),
                LaunchFollow::Refused { name, launched } => {
                    let live = self.forget(&name);
                    self.with_launch(|launcher, env| launcher.refused(&name, launched, live, env));
                }
            }
        }
    }
}
