//! What the supervisor holds for agents, counted (issue 28): the entries of
//! every map of the dispatcher keyed by an agent, a run, a stop or a wait,
//! and the room the largest of them keep. Once every agent has ended and
//! nothing is asked, every count is 0 and the room is back to a few
//! entries: a daemon's memory must not grow with the agents it ever ran,
//! or a caller creating and cancelling agents in a loop could make it grow
//! without bound. `crates/cli/tests/lifecycle.rs` holds it to that.

use super::{Cmd, Dispatcher, Supervisor};
use crate::api::ApiError;

/// The dispatcher's per-agent state at one moment ([`Supervisor::held`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// The live set: agents admitted and not yet ended here.
    pub live: usize,
    /// The room the live set keeps (entries it holds without growing).
    pub live_room: usize,
    /// Per-agent sockets served (SPEC 8), and their map's room.
    pub sockets: usize,
    pub sockets_room: usize,
    /// Stops in flight (a subtree being emptied), and their map's room.
    pub stops: usize,
    pub stops_room: usize,
    /// Waits not yet answered.
    pub waiters: usize,
    /// Agents waiting for a concurrency slot.
    pub queued: usize,
    /// Admissions and ends handed to the store's writers, not yet answered
    /// (entries of their maps, the names they hold, the verbs held).
    pub admitting: usize,
    pub ending: usize,
    /// Starts handed to the store's start writer, not yet answered.
    pub starting: usize,
    /// Children run by other nodes: being fetched, their ends told,
    /// `--ready` spawns waiting.
    pub fetching: usize,
    pub ends_told: usize,
    pub ready_waits: usize,
    /// Jobs run here and their live workers.
    pub jobs: usize,
    pub job_workers: usize,
    /// What the start resumed and has not handed on.
    pub resumed: usize,
}

impl Held {
    /// Every entry of every map: 0 when nothing is held for any agent.
    pub fn entries(&self) -> usize {
        self.live
            + self.sockets
            + self.stops
            + self.waiters
            + self.queued
            + self.admitting
            + self.ending
            + self.starting
            + self.fetching
            + self.ends_told
            + self.ready_waits
            + self.jobs
            + self.job_workers
            + self.resumed
    }
}

impl Dispatcher {
    pub(super) fn held(&self) -> Held {
        Held {
            live: self.agents.live.len(),
            live_room: self.agents.live.capacity(),
            sockets: self.sockets.len(),
            sockets_room: self.sockets.room(),
            stops: self.stops.len(),
            stops_room: self.stops.room(),
            waiters: self.waiters.len(),
            queued: self.launcher.waiting.len(),
            admitting: self.admitting.held(),
            ending: self.ends_writer.flight.count(),
            starting: self.starts_writer.flight.count(),
            fetching: self.agents.fetching.len(),
            ends_told: self.agents.ends_told.len(),
            ready_waits: self.agents.ready_waits.len(),
            jobs: self.jobs.held().0,
            job_workers: self.jobs.held().1,
            resumed: self.restart.held(),
        }
    }
}

impl Supervisor {
    /// What the dispatcher holds for agents now ([`Held`]): for the tests
    /// and the benchmarks that check that nothing outlives an agent.
    pub async fn held(&self) -> Result<Held, ApiError> {
        self.call(Cmd::Held).await
    }
}
