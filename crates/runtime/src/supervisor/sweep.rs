//! The sweepers (SPEC 9): idempotent batch passes, at most [`BATCH`] rows a tick,
//! run by the one supervisor holding the sweeper lease.
//!
//! - timeouts, every tick (1 s): runs past `timeout_s` fail `timed_out`, their
//!   subtrees are cancelled;
//! - orphans, every 5 ticks: an unfinished agent whose parent is finished or
//!   missing is cancelled (`parent_dead`); an agent the store calls alive whose
//!   process is gone (its host supervisor is dead, or it is ours and we hold no
//!   process for it) fails `lost` and its subtree is cancelled; a node of the
//!   cluster whose process is gone is declared lost (`moved`: what can move
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

use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use brood_core::{AgentEvent, AgentName, CancelReason, FailReason, Status, TenantId, Terminal};
use brood_store::{Agent, Fence, RunEnd, StoreError};
use tokio::sync::mpsc;

use super::{Cmd, Dispatcher, ev, host_alive, now_ms, registered_nodes};
use crate::metrics::Sweeper;

/// At most this many rows per sweeper per tick (SPEC 9).
const BATCH: u32 = 500;
/// The lease's name in the store.
pub(super) const LEASE: &str = "sweeper";
const ORPHANS_EVERY: u64 = 5;
const RECONCILE_EVERY: u64 = 30;

/// Held while this supervisor holds the sweepers' lease.
pub(super) enum LeaseGuard {
    /// An exclusive `flock` on the lock file next to a SQLite store.
    File(#[allow(dead_code)] std::fs::File),
    /// The store's own lock (PostgreSQL: a session advisory lock).
    Shared(Box<dyn brood_store::HeldLock>),
}

#[derive(Default)]
pub(super) struct SweepState {
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

impl SweepState {
    /// Whether this supervisor holds the sweepers' lease now.
    pub(super) fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }
}

impl Dispatcher {
    pub(super) fn on_tick(&mut self) {
        self.sweep.ticks += 1;
        self.launcher.give_spare(&self.records.tenant);
        self.record_unrecorded_ends();
        self.node_tick();
        if self.sweep.ticks.is_multiple_of(ORPHANS_EVERY) {
            self.end_records_without_agents();
        }
        self.orphans.reap(&self.launcher.spawner, &self.agents);
        self.orphans.watch_keeper(&self.launcher.spawner);
        // Every supervisor for the agents it hosts, lease or not: only it
        // can stop their processes.
        self.disk.start(
            &self.agents,
            &self.host.paths,
            self.host.cfg.resource_defaults.disk_max,
            self.launcher.cgroups.clone(),
            &self.host.tx,
        );
        let ticks = self.sweep.ticks;
        if let Some(fence) = self.hold_lease() {
            let r = (|| -> Result<(), StoreError> {
                self.sweep_timeouts(&fence)?;
                if ticks.is_multiple_of(ORPHANS_EVERY) {
                    self.sweep_orphans(&fence)?;
                }
                if ticks.is_multiple_of(RECONCILE_EVERY) {
                    self.reconcile();
                }
                Ok(())
            })();
            if let Err(e) = r {
                if matches!(&e, StoreError::Refused { code, .. } if *code == brood_core::Code::Conflict)
                {
                    // Fenced off: someone else holds the lease now. Let go of the
                    // lock (closing the file releases it) and try again later.
                    tracing::warn!(error = %e, "sweeper lease lost");
                    self.sweep.lease = None;
                } else {
                    tracing::error!(error = %e, "a sweeper pass failed; the next tick retries");
                }
            }
        }
        self.carry_out_recorded_stops();
        self.answer_remote_waits();
        if ticks.is_multiple_of(RECONCILE_EVERY) {
            let holder = self.sweep.lease.is_some();
            self.reconcile_slots(holder);
        }
    }

    /// The slot counter recomputed from the truth (SPEC 9 reconcile): the
    /// embedded counter from this supervisor's own started agents, every
    /// supervisor for itself; a shared (Redis) counter from the store's count of
    /// the tenant's started, unfinished agents, by the lease holder only.
    fn reconcile_slots(&mut self, holder: bool) {
        // This supervisor's share: what its own started agents hold. Exact,
        // since its acquires and releases are made on this loop too (its
        // spare slots are given first).
        self.launcher.give_spare(&self.records.tenant);
        let actual = self.agents.slots_used();
        match self
            .launcher
            .slots
            .repair(&self.records.tenant, actual as u64)
        {
            Ok(0) => {}
            Ok(drift) => {
                tracing::warn!(drift, actual, counter = %self.launcher.slots.describe(), "slot counter drifted; repaired");
                self.host.metrics.sweeper_action(Sweeper::Reconcile);
            }
            Err(e) => tracing::warn!(error = %e, "repairing the slot counter failed"),
        }
        // The shares of supervisors that are gone (their agents died with
        // them), given back by the lease holder of a shared counter (Redis,
        // or the store's shares of nodes).
        if holder && (self.host.cfg.slots.is_some() || self.host.cfg.node.is_some()) {
            let nodes = match registered_nodes(self.records.store.as_ref()) {
                Ok(n) => n,
                Err(e) => {
                    // Who is gone is not known: nothing is given back this round.
                    tracing::warn!(error = %e, "reading the registered nodes failed; no slot given back this round");
                    return;
                }
            };
            let alive = |id: &str| host_alive(id, &nodes);
            match self
                .launcher
                .slots
                .forget_holders(&self.records.tenant, &alive)
            {
                Ok(0) => {}
                Ok(freed) => {
                    tracing::warn!(freed, counter = %self.launcher.slots.describe(), "slots held by supervisors that are gone; given back");
                    self.host.metrics.sweeper_action(Sweeper::Reconcile);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "giving back the slots of supervisors that are gone failed")
                }
            }
        }
    }

    /// The lease, taking it if it is free: an exclusive, non-blocking `flock`
    /// on the lock file, then a new epoch from the store.
    fn hold_lease(&mut self) -> Option<Fence> {
        match &self.sweep.lease {
            Some((LeaseGuard::Shared(h), _)) if !h.is_held() => {
                // The store's lock went with its connection (broken by a node
                // that declared this one lost, or the server restarted): the
                // old epoch is fenced; take the lock again for a new one.
                tracing::warn!("the sweeper lease's lock was lost");
                self.sweep.lease = None;
            }
            Some((_, f)) => return Some(f.clone()),
            None => {}
        }
        if self.sweep.ticks < self.sweep.next_lease_try {
            return None;
        }
        let guard = match self.records.store.lease_lock(LEASE) {
            Ok(brood_store::LeaseLock::Held(h)) => LeaseGuard::Shared(h),
            Ok(brood_store::LeaseLock::Taken) => {
                self.sweep.next_lease_try = self.sweep.ticks + ORPHANS_EVERY;
                return None;
            }
            Ok(brood_store::LeaseLock::NotShared) => match self.lock_file() {
                Some(f) => LeaseGuard::File(f),
                None => return None,
            },
            Err(e) => {
                tracing::error!(error = %e, "taking the sweeper lease's lock failed");
                return None;
            }
        };
        match self
            .records
            .store
            .acquire_lease(LEASE, &self.host.me, now_ms())
        {
            Ok(fence) => {
                tracing::info!(epoch = fence.epoch, "this supervisor now runs the sweepers");
                self.host.metrics.lease_epoch(fence.epoch);
                self.sweep.lease = Some((guard, fence.clone()));
                Some(fence)
            }
            Err(e) => {
                tracing::error!(error = %e, "recording the sweeper lease failed");
                None
            }
        }
    }

    /// The lease's lock on a SQLite store: an exclusive, non-blocking `flock`
    /// on the lock file next to it.
    fn lock_file(&mut self) -> Option<std::fs::File> {
        let path = self.host.paths.sweeper_lock();
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
    fn note_read(&self, a: &Agent) {
        if a.tenant != self.records.tenant {
            self.host.metrics.cross_tenant_read();
        }
    }

    fn sweep_timeouts(&mut self, fence: &Fence) -> Result<(), StoreError> {
        let overdue = self.records.store.overdue(now_ms(), BATCH)?;
        // A child's deadline is at most its parent's, so a parent past its
        // deadline comes with its children, often at the very same
        // millisecond (an inherited deadline). The parent's sweep cancels its
        // subtree (`parent_dead`); a child swept first would instead fail
        // `timed_out` on its own, an answer that depends on row order. So a
        // row whose parent is in the same batch is left to that parent's
        // sweep; a grandchild's parent is then in the batch too.
        let batch: HashSet<(TenantId, AgentName)> = overdue
            .iter()
            .map(|a| (a.tenant.clone(), a.name.clone()))
            .collect();
        for a in overdue {
            if let Some(p) = &a.parent
                && batch.contains(&(a.tenant.clone(), p.clone()))
            {
                continue;
            }
            self.note_read(&a);
            let note = "its run passed the policy's timeout_s";
            self.sweep_subtree(
                fence,
                &a,
                Terminal::Failed(FailReason::TimedOut),
                Sweeper::Timeouts,
                note,
            )?;
        }
        Ok(())
    }

    fn sweep_orphans(&mut self, fence: &Fence) -> Result<(), StoreError> {
        for a in self.records.store.orphans(BATCH)? {
            self.note_read(&a);
            let note = "its parent is finished or missing";
            self.sweep_subtree(
                fence,
                &a,
                Terminal::Cancelled(CancelReason::ParentDead),
                Sweeper::Orphans,
                note,
            )?;
        }
        // Alive in the store, but no process: a host that is gone, or our own
        // record that no process of ours answers to.
        let mut lost = Vec::new();
        // A failed read ends this sweep: no agent is recorded lost for it.
        let nodes = registered_nodes(self.records.store.as_ref())?;
        let mut lost_nodes: Vec<String> = Vec::new();
        for host in self.records.store.supervisors_with_unfinished()? {
            let ours = host == self.host.me;
            if !ours && host_alive(&host, &nodes) {
                continue;
            }
            // A node of the cluster whose process is gone (this machine's
            // process table says so before its heartbeat expires): declared
            // lost now, so that what can move moves (`moved`), rather than
            // its agents ended one by one here.
            let node = brood_store::placed_for(&host).unwrap_or(&host);
            if !ours && node != self.host.me && nodes.iter().any(|n| n.id == node) {
                if !lost_nodes.iter().any(|l| l == node) {
                    lost_nodes.push(node.to_owned());
                }
                continue;
            }
            for a in self
                .records
                .store
                .unfinished_of(std::slice::from_ref(&host))?
            {
                // Ours and live, or ours with its admission's answer on the
                // way to the loop (`admitting`): not lost.
                if ours
                    && a.tenant == self.records.tenant
                    && (self.agents.live.contains_key(&a.name) || self.admitting.in_flight(&a.name))
                {
                    continue;
                }
                self.note_read(&a);
                lost.push((a, host.clone()));
                if lost.len() >= BATCH as usize {
                    break;
                }
            }
        }
        for id in lost_nodes {
            self.declare_lost(&id);
        }
        for (a, host) in lost {
            let outcome = match a.status {
                // Its stop was recorded: carry the recorded outcome out.
                Status::Stopping(t) => t,
                _ => Terminal::Failed(FailReason::Lost),
            };
            let detail = if host == self.host.me {
                format!("its process is gone: supervisor {host} holds none for it")
            } else {
                format!("its process is gone with its supervisor {host}")
            };
            let events = [ev(
                &a.name,
                Some(&a.run),
                &a.session,
                AgentEvent::Stop {
                    agent: a.name.clone(),
                    outcome,
                    swept: Some((Sweeper::Orphans.as_str(), detail.clone())),
                },
            )];
            let end = RunEnd::without_process(outcome, detail, now_ms());
            let ended = self
                .records
                .store
                .sweep_end(fence, &a.tenant, &a.name, &end, &events)?;
            self.host.metrics.sweeper_action(Sweeper::Orphans);
            if a.tenant == self.records.tenant {
                self.records.project_events(&events);
                self.after_end(&ended, None, None);
            }
            self.stop_descendants_recorded(fence, &a)?;
        }
        Ok(())
    }

    /// Records the stop of `a` with `outcome` and of its unfinished descendants
    /// with `parent_dead`, the top first (SPEC 6: the intent before anything).
    fn sweep_subtree(
        &mut self,
        fence: &Fence,
        a: &Agent,
        outcome: Terminal,
        sweeper: Sweeper,
        why: &str,
    ) -> Result<(), StoreError> {
        let events = [ev(
            &a.name,
            Some(&a.run),
            &a.session,
            AgentEvent::Sweep {
                agent: a.name.clone(),
                sweeper: sweeper.as_str(),
                outcome,
                detail: why.to_owned(),
            },
        )];
        let after = self.records.store.sweep_stop(
            fence,
            &a.tenant,
            std::slice::from_ref(&a.name),
            outcome,
            now_ms(),
            &events,
        )?;
        self.host.metrics.sweeper_action(sweeper);
        if a.tenant == self.records.tenant {
            self.records.project_events(&events);
            for b in &after {
                // A queued agent ends at once: nothing to carry out.
                if b.status.is_finished() {
                    self.drop_unstarted(b);
                }
            }
        }
        self.stop_descendants_recorded(fence, a)
    }

    fn stop_descendants_recorded(&mut self, fence: &Fence, a: &Agent) -> Result<(), StoreError> {
        let desc: Vec<AgentName> = self
            .records
            .store
            .descendants_post_order(&a.tenant, &a.name)?
            .into_iter()
            .filter(|d| !d.status.is_finished())
            .map(|d| d.name)
            .collect();
        if desc.is_empty() {
            return Ok(());
        }
        let after = self.records.store.sweep_stop(
            fence,
            &a.tenant,
            &desc,
            Terminal::Cancelled(CancelReason::ParentDead),
            now_ms(),
            &[],
        )?;
        if a.tenant == self.records.tenant {
            for b in &after {
                if b.status.is_finished() {
                    self.drop_unstarted(b);
                }
            }
        }
        Ok(())
    }

    /// An agent still waiting for a slot whose record a sweeper just ended:
    /// it will never start; tell whoever waits for it.
    fn drop_unstarted(&mut self, a: &Agent) {
        let unstarted = self
            .agents
            .live
            .get(&a.name)
            .is_some_and(|l| l.pending.is_some() && !l.launching);
        if unstarted {
            self.after_end(a, None, None);
            self.forget(&a.name);
            self.launcher.waiting.remove(&a.name);
        }
    }

    /// Every supervisor, every tick: stops whose intent is recorded for agents
    /// it hosts but that it is not carrying out yet (recorded by a sweeper, or
    /// by another supervisor's cascade), carried out like its own: the whole
    /// picked subtree signalled at once, the records written in post-order.
    pub(super) fn carry_out_recorded_stops(&mut self) {
        let mine = match self.records.store.stopping_of(&self.host.me) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "reading our stopping agents failed");
                return;
            }
        };
        let picked: HashMap<AgentName, Terminal> = mine
            .into_iter()
            .filter(|a| a.tenant == self.records.tenant)
            .filter_map(|a| match a.status {
                Status::Stopping(t) => Some((a.name, t)),
                _ => None,
            })
            .filter(|(n, _)| {
                self.agents
                    .live
                    .get(n)
                    .is_some_and(|l| l.stopping.is_none())
                    && !self.ends_writer.in_flight(n)
            })
            .collect();
        if picked.is_empty() {
            return;
        }
        let tops: Vec<AgentName> = picked
            .keys()
            .filter(|n| {
                self.agents
                    .live
                    .get(*n)
                    .and_then(|l| l.parent.as_ref())
                    .is_none_or(|p| !picked.contains_key(p))
            })
            .cloned()
            .collect();
        for top in tops {
            let Some(&outcome) = picked.get(&top) else {
                continue;
            };
            let mut targets: Vec<(AgentName, Terminal)> = self
                .records
                .store
                .descendants_post_order(&self.records.tenant, &top)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|d| picked.get(&d.name).map(|t| (d.name, *t)))
                .collect();
            targets.push((top.clone(), outcome));
            let group = self.agents.live.get(&top).and_then(|l| l.group.clone());
            tracing::info!(agent = %top, outcome = %outcome.encode(), targets = targets.len(), "carrying out a recorded stop");
            self.begin_stop(targets, group);
        }
    }

    /// Budgets recomputed from the store (SPEC 9 reconcile): the running totals
    /// kept from `usage` messages are a fast path; the runs' records are the
    /// truth. A drift is logged and repaired, and a budget it shows exceeded is
    /// enforced.
    fn reconcile(&mut self) {
        let limited: Vec<AgentName> = self
            .agents
            .live
            .iter()
            .filter(|(_, l)| l.policy.cost_limit.is_some() && l.stopping.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        let mut over = Vec::new();
        for n in limited {
            let Ok(spend) = self.records.store.spend(&self.records.tenant, &n) else {
                continue;
            };
            let Some(l) = self.agents.live.get_mut(&n) else {
                continue;
            };
            let truth = spend.subtree.cost_usd;
            if (l.subtree_usd - truth).abs() > 1e-9 {
                tracing::warn!(agent = %n, kept = l.subtree_usd, truth, "budget total drifted; repaired");
                l.subtree_usd = truth;
                self.host.metrics.sweeper_action(Sweeper::Reconcile);
            }
            if l.policy.cost_limit.is_some_and(|c| l.subtree_usd >= c) {
                over.push(n);
            }
        }
        for n in over {
            // An ancestor's stop may already cover it.
            if self
                .agents
                .live
                .get(&n)
                .is_some_and(|l| l.stopping.is_none())
            {
                self.stop_for_budget(&n);
            }
        }
    }
}
