//! A run's end and what follows it, as a part of the supervisor: the end
//! worked out from the live entry and recorded (when no stop covers it),
//! then the projection, the parent's context pack (SPEC 4), a pending spawn
//! reply, the waiters, and the stop of descendants left behind; and a run
//! that ended with a result collected first, once its group is empty
//! (`collect`).
//!
//! [`Ends`] owns what only this concern uses: the loop's inbox a
//! collection's answer comes back to (`Cmd::Harvested`), whether this
//! supervisor shares a child's artifacts with the cluster's store, and the
//! operator's identity a child of another one is collected against. It
//! holds no dispatcher. Each call is lent what it reads and writes of the
//! other parts ([`Env`]: the records, the live set, the waits, who this
//! supervisor is); what belongs to another flow (an end recorded with the
//! others of its batch, the live entry forgotten, a parent on another node
//! told, the waits answered, descendants stopped, a group removed, a stop
//! before a collection) it returns as [`EndFollow`]s or as what the loop
//! does next, which `supervisor::route::ends` applies in the order the
//! dispatcher did it all itself: every projection of an end before anyone
//! is told of it.
//!
//! - `mod.rs`: the part, what it is lent, its follow-ups, an [`Ending`];
//! - `finish.rs`: an end worked out, recorded (or kept to retry), and what
//!   it leaves behind;
//! - `notify.rs`: an end projected and told (parents, a spawn, waits);
//! - `collect.rs`: a run's result collected once its group is empty, on a
//!   confined thread, within a time limit.

pub(in crate::supervisor) mod collect;
mod finish;
mod notify;

use brood_core::{AgentName, RunId, TenantId, Terminal};
use brood_launch::cgroup::Group;
use brood_store::{Agent, EndItem, NewEvent, RunEnd, Store, StoreError};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::paths::Paths;
use crate::supervisor::Cmd;
use crate::supervisor::agents::Agents;
use crate::supervisor::disk::ToClear;
use crate::supervisor::records::Records;
use crate::supervisor::waiters::Waiters;
use crate::trace::Tracer;

pub(in crate::supervisor) use collect::{Collect, Harvested, RunEnding};
pub(in crate::supervisor) use finish::Ended;
pub(in crate::supervisor) use notify::tell_parent;

/// The part that owns what only a run's end uses.
pub(in crate::supervisor) struct Ends {
    /// The loop's inbox: where a collection's answer comes back
    /// (`Cmd::Harvested`).
    tx: mpsc::UnboundedSender<Cmd>,
    /// A node of a cluster (issue 15): every child's artifacts go into the
    /// shared store before its end is recorded.
    share: bool,
    /// The operator's identity: a child that runs as another is collected
    /// with its own ids.
    uid: u32,
    gid: u32,
}

/// What an end reads and writes of the rest of the supervisor, lent for one
/// call. Nothing in it lets the part stop, forget or answer beyond the end
/// at hand: that it returns.
pub(in crate::supervisor) struct Env<'a> {
    /// The store and tenant where ends are recorded, and the ctx projection
    /// where they show.
    pub(in crate::supervisor) records: &'a Records,
    /// The live set: the ended run's entry (its parent, group, spawn reply),
    /// and the parents told.
    pub(in crate::supervisor) agents: &'a mut Agents,
    /// The waits an end may complete.
    pub(in crate::supervisor) waiters: &'a Waiters,
    pub(in crate::supervisor) paths: &'a Paths,
    pub(in crate::supervisor) metrics: &'a Metrics,
    /// Where an ended run's span goes (issue 30).
    pub(in crate::supervisor) tracer: &'a Tracer,
}

/// What an end needs another flow of the supervisor to do.
pub(in crate::supervisor) enum EndFollow {
    /// The end of `ending`'s run, its harvest taken (or not), recorded as
    /// any end is (`finish`: alone, or with the others of its batch).
    Finish(Box<Finish>),
    /// The run's descendants stopped before what it handed back is read:
    /// `targets` in post-order, then `collect` once `group` is empty.
    StopThenCollect {
        targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
        collect: Box<Collect>,
    },
    /// Owned children die with their parent (SPEC 6): the descendants of a
    /// run whose end is recorded, stopped; `clear`, its own channel's
    /// `artifact/` set aside, emptied with them.
    /// `slot`: the run's slot, given back once the group is empty.
    StopDescendants {
        parent: AgentName,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
    },
    /// Nothing left to stop: the run's group removed, then `clear` emptied
    /// and `slot` given back.
    RemoveGroup {
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
    },
}

/// An end to record: how the run ended and what it handed back.
pub(in crate::supervisor) struct Finish {
    pub(in crate::supervisor) ending: RunEnding,
    pub(in crate::supervisor) harvest: Option<crate::channel::Harvest>,
}

impl Ends {
    pub(in crate::supervisor) fn new(
        tx: mpsc::UnboundedSender<Cmd>,
        share: bool,
        uid: u32,
        gid: u32,
    ) -> Ends {
        Ends {
            tx,
            share,
            uid,
            gid,
        }
    }
}

/// A run's end, worked out and waiting to be recorded (`finish`).
pub(in crate::supervisor) struct Ending {
    pub(in crate::supervisor) name: AgentName,
    pub(in crate::supervisor) run: RunId,
    pub(in crate::supervisor) end: RunEnd,
    pub(in crate::supervisor) events: Vec<NewEvent>,
    harvest: Option<crate::channel::Harvest>,
}

impl Ending {
    /// The end as one item of `Store::end_runs`.
    pub(in crate::supervisor) fn item(&self) -> EndItem {
        EndItem {
            name: self.name.clone(),
            run: self.run.clone(),
            end: Some(self.end.clone()),
            events: self.events.clone(),
            now_ms: self.end.now_ms,
        }
    }

    /// The end's record, alone (`Store::end_run`); with others, it is one
    /// item of `Store::end_runs` (`batch`).
    pub(in crate::supervisor) fn record(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
    ) -> Result<Agent, StoreError> {
        store.end_run(tenant, &self.name, &self.run, &self.end, &self.events)
    }
}
