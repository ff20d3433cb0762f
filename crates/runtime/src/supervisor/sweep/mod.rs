//! The sweepers (SPEC 9) as a part of the supervisor: idempotent batch
//! passes, at most [`BATCH`] rows a tick, run by the one supervisor holding
//! the sweeper lease.
//!
//! - timeouts, every tick (1 s): runs past `timeout_s` fail `timed_out`, their
//!   subtrees are cancelled;
//! - orphans, every 5 ticks: an unfinished agent whose parent is finished or
//!   missing is cancelled (`parent_dead`); an agent the store calls alive whose
//!   process is gone (its host supervisor is dead, or it is ours and we hold no
//!   process for it) fails `lost` and its subtree is cancelled; a node of the
//!   cluster whose process is gone is declared lost (`cluster::moved`: what can move
//!   moves to live nodes);
//! - reconcile, every 30 ticks: budgets recomputed from the store.
//!
//! The lease is an exclusive `flock` on a file next to the store, taken by
//! whichever supervisor gets it first and held for its life; the store numbers
//! each taking (the epoch), and every sweeper write checks the epoch in its own
//! transaction, so a holder that lost the lease cannot write.
//!
//! A sweeper only *records* a stop (the intent, SPEC 6). Carrying it out — the
//! signals, the grace, the records of the end — is the job of the supervisor
//! hosting the processes: every supervisor, lease or not, looks each tick for
//! its own agents that the store says are stopping and stops them. That is also
//! how a stop recorded by another supervisor (a cascade across supervisors)
//! reaches processes it cannot signal itself.
//!
//! The part ([`Sweeps`]) owns the lease and the clock's count; its passes
//! read what they need of the other parts through [`Env`] and write only the
//! store. What follows from their records on this node (an end told, a queued
//! agent dropped, a stop carried out, a node declared lost) they return as
//! [`SweepFollow`]s, which the loop applies (`route::tick`).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use brood_core::{AgentName, TenantId, Terminal};
use brood_launch::cgroup::Group;
use brood_store::{Agent, Fence, NewEvent, Store};
use tokio::sync::mpsc;

use super::admitting::Admitting;
use super::agents::Agents;
use super::ends_writer::EndsWriter;
use super::{Cmd, now_ms};
use crate::metrics::Metrics;
use crate::paths::Paths;

mod passes;
mod reconcile;
pub(super) use passes::recorded_stops;
pub(super) use reconcile::{over_budget, reconcile_slots};

/// At most this many rows per sweeper per tick (SPEC 9).
const BATCH: u32 = 500;
/// The lease's name in the store.
pub(super) const LEASE: &str = "sweeper";
const ORPHANS_EVERY: u64 = 5;
const RECONCILE_EVERY: u64 = 30;

/// Held while this supervisor holds the sweepers' lease.
enum LeaseGuard {
    /// An exclusive `flock` on the lock file next to a SQLite store.
    File(#[allow(dead_code)] std::fs::File),
    /// The store's own lock (PostgreSQL: a session advisory lock).
    Shared(Box<dyn brood_store::HeldLock>),
}

/// What a pass reads of the rest of the supervisor.
pub(super) struct Env<'a> {
    pub(super) store: &'a dyn Store,
    /// This supervisor's tenant: the rows of others are counted as
    /// cross-tenant reads and nothing of theirs is projected here.
    pub(super) tenant: &'a TenantId,
    /// This supervisor's id (`supervisor_id`).
    pub(super) me: &'a str,
    pub(super) metrics: &'a Metrics,
    pub(super) paths: &'a Paths,
    /// Writes a record's events into the ctx tree.
    pub(super) project: &'a dyn Fn(&[NewEvent]),
    pub(super) agents: &'a Agents,
    pub(super) admitting: &'a Admitting,
    pub(super) ends_writer: &'a EndsWriter,
}

/// What a pass needs done on this node after its records.
pub(super) enum SweepFollow {
    /// A sweeper ended this record of this tenant (a process gone): what
    /// follows an end (the projection, the waiters, the parent).
    Ended(Agent),
    /// A sweeper ended this record of this tenant while it was queued: if
    /// it waits here for a slot, it never starts.
    EndedQueued(Agent),
    /// A stop recorded for agents here, to carry out: the targets in
    /// post-order and the group of the top.
    Stop(Vec<(AgentName, Terminal)>, Option<Group>),
}

#[derive(Default)]
pub(super) struct Sweeps {
    /// What makes the lease exclusive (a lock file's `flock`, or the store's
    /// own lock shared by every node) and the store's fence for it.
    lease: Option<(LeaseGuard, Fence)>,
    ticks: u64,
    /// The tick before which a lease held elsewhere is not asked for again
    /// (asking the store's lock costs a connection).
    next_lease_try: u64,
    /// Set while a `Cmd::Tick` is queued ([`start_clock`]).
    pub(super) tick_queued: Arc<AtomicBool>,
}

/// The clock: a `Tick` every `every`, for as long as the dispatcher listens.
/// A tick is sent only when none is queued (`queued`, cleared by the loop
/// as it takes one): a loop slower than the clock (a slow store) takes the
/// next tick when it is ready, instead of a queue of them that grows for
/// as long as the store is slow, with every command behind it.
pub(super) fn start_clock(
    tx: mpsc::UnboundedSender<Cmd>,
    every: std::time::Duration,
    queued: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(every);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        iv.tick().await;
        loop {
            iv.tick().await;
            if queued.swap(true, Ordering::SeqCst) {
                continue;
            }
            if tx.send(Cmd::Tick).is_err() {
                return;
            }
        }
    });
}

/// Which passes a tick runs.
#[derive(Clone, Copy)]
pub(super) struct Due {
    pub(super) orphans: bool,
    pub(super) reconcile: bool,
}

impl Sweeps {
    /// Whether this supervisor holds the sweepers' lease now.
    pub(super) fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// A tick of the clock: the passes it is due for.
    pub(super) fn tick(&mut self) -> Due {
        self.ticks += 1;
        Due {
            orphans: self.ticks.is_multiple_of(ORPHANS_EVERY),
            reconcile: self.ticks.is_multiple_of(RECONCILE_EVERY),
        }
    }

    /// A sweeper's write was refused for its epoch: someone else holds the
    /// lease now. Lets go of the lock (closing the file releases it); the
    /// next ticks try again.
    pub(super) fn fenced_off(&mut self) {
        self.lease = None;
    }

    /// The lease, taking it if it is free: an exclusive, non-blocking `flock`
    /// on the lock file, then a new epoch from the store.
    pub(super) fn hold_lease(&mut self, env: &Env<'_>) -> Option<Fence> {
        match &self.lease {
            Some((LeaseGuard::Shared(h), _)) if !h.is_held() => {
                // The store's lock went with its connection (broken by a node
                // that declared this one lost, or the server restarted): the
                // old epoch is fenced; take the lock again for a new one.
                tracing::warn!("the sweeper lease's lock was lost");
                self.lease = None;
            }
            Some((_, f)) => return Some(f.clone()),
            None => {}
        }
        if self.ticks < self.next_lease_try {
            return None;
        }
        let guard = match env.store.lease_lock(LEASE) {
            Ok(brood_store::LeaseLock::Held(h)) => LeaseGuard::Shared(h),
            Ok(brood_store::LeaseLock::Taken) => {
                self.next_lease_try = self.ticks + ORPHANS_EVERY;
                return None;
            }
            Ok(brood_store::LeaseLock::NotShared) => match lock_file(env.paths) {
                Some(f) => LeaseGuard::File(f),
                None => return None,
            },
            Err(e) => {
                tracing::error!(error = %e, "taking the sweeper lease's lock failed");
                return None;
            }
        };
        match env.store.acquire_lease(LEASE, env.me, now_ms()) {
            Ok(fence) => {
                tracing::info!(epoch = fence.epoch, "this supervisor now runs the sweepers");
                env.metrics.lease_epoch(fence.epoch);
                self.lease = Some((guard, fence.clone()));
                Some(fence)
            }
            Err(e) => {
                tracing::error!(error = %e, "recording the sweeper lease failed");
                None
            }
        }
    }
}

/// The lease's lock on a SQLite store: an exclusive, non-blocking `flock`
/// on the lock file next to it.
fn lock_file(paths: &Paths) -> Option<std::fs::File> {
    let path = paths.sweeper_lock();
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "opening the sweeper lock failed");
            return None;
        }
    };
    // SAFETY: flock on a descriptor we own; LOCK_NB never blocks the loop.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return None;
    }
    Some(file)
}

/// Counts a row a sweeper read that belongs to another tenant (SPEC 9
/// metric: the sweepers' reads are the only ones that cross tenants).
fn note_read(env: &Env<'_>, a: &Agent) {
    if a.tenant != *env.tenant {
        env.metrics.cross_tenant_read();
    }
}
