//! What starts processes: the spawner thread, the cgroups, the concurrency
//! slots, the empty network namespaces kept ready, the veil, and the queue of
//! admitted agents waiting for a slot (SPEC 9 `queued`). This is the part's
//! state and its slots; its launches (the queue served, each launch worked
//! out and taken up) are `supervisor::launch`'s.

use std::sync::Arc;

use brood_core::{Status, TenantId};
use brood_launch::Spawner;
use brood_launch::cgroup::Cgroups;
use brood_store::Store;

use super::queue;
use crate::slots::SlotError;

pub(super) struct Launcher {
    pub(super) spawner: Spawner,
    pub(super) cgroups: Option<Arc<Cgroups>>,
    /// Concurrency slots held by started agents (SPEC 9), embedded or Redis.
    pub(super) slots: Arc<dyn crate::slots::Slots>,
    /// Empty network namespaces made ahead of need, started with the first
    /// `network: none` agent under `iso = ns` (`brood_launch::ns` module docs).
    pub(super) netns_pool: Option<brood_launch::ns::NetnsPool>,
    /// What agents must not reach, covered in each one's mount namespace;
    /// `None` when brood is not root (it cannot mount).
    pub(super) veil: Option<crate::veil::Veil>,
    /// The veiled mount namespace agents join, once made.
    pub(super) veil_ns: crate::veil::VeilCache,
    /// Admitted agents waiting for a concurrency slot, first in first out.
    pub(super) waiting: queue::Queue,
    /// The tenant's `max_concurrent` (SPEC 9), refreshed at each admission.
    pub(super) max_concurrent: u32,
    /// Slots this supervisor holds of the counter with no agent in them
    /// ([`Self::give_slots`]).
    pub(super) spare: usize,
    /// Slots of runs whose end is recorded but whose group is still being
    /// emptied ([`Self::hold_until_emptied`]): what the run left in it may
    /// live until then, so the slot is not free yet (issue 28's campaign
    /// saw 7 of 6 by the kernel's count when it was given back at the end).
    pub(super) emptying: usize,
    /// The counter failed or lost its counts since it last granted a slot:
    /// this node may have started past the limit on its own count, and its
    /// spare slots may be ones the counter no longer counts. Until the
    /// counter grants again, a start asks it rather than take a spare one
    /// (the spare go back at the next tick), so what was started past the
    /// limit drains as it ends instead of being replaced (issue 28's
    /// campaign: 7 of 6 after Redis restarted, a node reusing slots it had
    /// taken while Redis was away).
    pub(super) unsure: bool,
}

impl Launcher {
    /// Up to `want` slots, as many as the tenant's `max_concurrent` leaves;
    /// 0 when all are held. The spare ones first ([`Self::give_slots`]),
    /// then the rest from the counter in one call. This supervisor's own
    /// count (`used`) bounds it first, whatever a shared counter says: one
    /// that lost its counts (a Redis restarted empty, until the reconciler
    /// repairs it) would otherwise let it start `max_concurrent` more
    /// (issue 28's fault campaign saw 8 of 6 on one node). A counter that
    /// fails (Redis gone) must not stop every start, nor let the limit go:
    /// the own count alone decides.
    ///
    /// A counter that lost its counts (Redis restarted empty) is seeded
    /// again first ([`Self::reseed`]), so that the slots other nodes' agents
    /// hold count before this node takes more: otherwise a node that cannot
    /// write its own share (stopped by SIGSTOP, say) would have its slots
    /// taken by the others (issue 28's campaign saw 7 of 6 across nodes).
    pub(super) fn take_slots(
        &mut self,
        tenant: &TenantId,
        want: usize,
        used: usize,
        store: &dyn Store,
        me: &str,
    ) -> usize {
        let room = (self.max_concurrent as usize).saturating_sub(used);
        let want = want.min(room);
        let from_spare = if self.unsure { 0 } else { want.min(self.spare) };
        self.spare -= from_spare;
        let need = u32::try_from(want - from_spare).unwrap_or(u32::MAX);
        if need == 0 {
            return from_spare;
        }
        let mut asked = self.slots.acquire_up_to(tenant, self.max_concurrent, need);
        if let Err(SlotError::Lost { .. }) = &asked {
            self.unsure = true;
            // This node's share: its started agents and the spare slots
            // (the ones just handed out count among the spare still).
            let mine = (used + self.spare + from_spare) as u64;
            if let Err(e) = self.reseed(tenant, store, me, mine) {
                // What the other nodes hold is not known: an error is not
                // "none" (the 300 s campaign saw 7 of 6 when PostgreSQL
                // restarted with Redis). Nothing more starts here until
                // the seed succeeds, at a later command or tick; a store
                // that is away would refuse the start's records anyway.
                tracing::warn!(error = %e, "the slot counter lost its counts and seeding it failed; starts wait");
                return from_spare;
            }
            asked = self.slots.acquire_up_to(tenant, self.max_concurrent, need);
        }
        match asked {
            Ok(got) => {
                // A grant: the counter counts again, and the tenant is
                // within its limit.
                if got > 0 {
                    self.unsure = false;
                }
                from_spare + got as usize
            }
            Err(e) => {
                tracing::warn!(error = %e, "slot counter failed; using this supervisor's own count");
                self.unsure = true;
                from_spare + need as usize
            }
        }
    }

    /// Seeds a counter that lost its counts: this node's share `mine`, the
    /// others' from the store's records of the tenant's agents that hold a
    /// slot (a process started and not yet ended), by the node they run on.
    /// One read of the store, on the loop, once a Redis restart.
    fn reseed(
        &self,
        tenant: &TenantId,
        store: &dyn Store,
        me: &str,
        mine: u64,
    ) -> Result<(), SlotError> {
        let agents = store.agents(tenant, false).map_err(|e| SlotError::Store {
            command: "reading the agents that hold slots",
            detail: e.to_string(),
        })?;
        let mut others: std::collections::BTreeMap<String, u64> = Default::default();
        for a in agents {
            let holds = matches!(
                a.status,
                Status::Running | Status::Blocked | Status::Stopping(_)
            );
            if holds && a.supervisor != me {
                *others.entry(a.supervisor).or_default() += 1;
            }
        }
        let others: Vec<(String, u64)> = others.into_iter().collect();
        tracing::warn!(
            counter = %self.slots.describe(),
            mine,
            others = ?others,
            "the slot counter held no counts for the tenant (a new Redis, or one restarted empty); seeded from this node's agents and the store's records"
        );
        self.slots.reseed(tenant, mine, &others)
    }

    /// Slots given back by agents that ended (or left over from a start):
    /// kept as spare for this supervisor's next starts, and given to the
    /// counter at the next tick ([`Self::give_spare`]). Under a steady
    /// load an end's slot goes straight to the next start, and the counter
    /// (a commit each with the store's shares) is asked about once a tick
    /// instead of twice an agent. The counter over-counts by the spare for
    /// at most a tick: another node may wait that long, none runs more.
    pub(super) fn give_slots(&mut self, n: usize) {
        self.spare += n;
    }

    /// The slot of a run that ended, kept until its group is empty
    /// ([`Self::emptied`]).
    pub(super) fn hold_until_emptied(&mut self) {
        self.emptying += 1;
    }

    /// `n` groups of ended runs are empty: their slots are given back.
    pub(super) fn emptied(&mut self, n: usize) {
        let n = n.min(self.emptying);
        self.emptying -= n;
        self.give_slots(n);
    }

    /// The slots this supervisor holds for agents: those started and not
    /// forgotten (`started`), and those of ended runs whose group is being
    /// emptied.
    pub(super) fn held(&self, started: usize) -> usize {
        started + self.emptying
    }

    /// Gives the counter the spare slots, all in one call: at each tick,
    /// before the reconciler sets the share, and while shutting down.
    pub(super) fn give_spare(&mut self, tenant: &TenantId) {
        let n = std::mem::take(&mut self.spare);
        if n == 0 {
            return;
        }
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if let Err(e) = self.slots.release_n(tenant, n) {
            tracing::warn!(error = %e, n, "releasing slots failed; the reconciler repairs the count");
            self.unsure = true;
        }
    }
}
