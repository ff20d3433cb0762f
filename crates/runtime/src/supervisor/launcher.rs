//! What starts processes: the spawner thread, the cgroups, the concurrency
//! slots, the empty network namespaces kept ready, the veil, and the queue of
//! admitted agents waiting for a slot (SPEC 9 `queued`).

use std::sync::Arc;

use brood_core::TenantId;
use brood_launch::Spawner;
use brood_launch::cgroup::Cgroups;

use super::queue;

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
}

impl Launcher {
    /// One slot from the counter, or `false` when the tenant's `max_concurrent`
    /// are all held. This supervisor's own count (`used`) bounds it first,
    /// whatever a shared counter says: one that lost its counts (a Redis
    /// restarted empty, until the reconciler repairs it) would otherwise
    /// let it start `max_concurrent` more (issue 28's fault campaign saw 8
    /// of 6 on one node). A counter that fails (Redis gone) must not stop
    /// every start, nor let the limit go: the own count alone decides.
    pub(super) fn take_slot(&self, tenant: &TenantId, used: impl FnOnce() -> usize) -> bool {
        if used() >= self.max_concurrent as usize {
            return false;
        }
        match self.slots.acquire(tenant, self.max_concurrent) {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "slot counter failed; using this supervisor's own count");
                true
            }
        }
    }

    pub(super) fn give_slot(&self, tenant: &TenantId) {
        if let Err(e) = self.slots.release(tenant) {
            tracing::warn!(error = %e, "releasing a slot failed; the reconciler repairs the count");
        }
    }
}
