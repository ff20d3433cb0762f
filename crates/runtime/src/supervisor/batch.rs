//! Creations that arrive together are admitted together (issue 27). The
//! loop takes, with a creation, the creations queued right behind it, decides
//! each (reads only), then has the store record them all at once: one thread
//! a creation, so their transactions meet in the store's group commit (one
//! commit for the lot on SQLite; on PostgreSQL their round trips overlap and
//! share a WAL flush) instead of following each other round trip after round
//! trip. What follows each (the projection, the live entry, the queue for a
//! slot, the answer) is done in arrival order, as for one creation.
//!
//! A batch holds only creations that cannot see each other: decisions read
//! the loop's state and the store before anything of the batch is written,
//! so two creations under one parent (its `create_limit`, its budget), a
//! creation under another of the batch, two asking for one name, or one
//! naming a customer, each start a batch of their own. The store's
//! transaction checks the quotas either way.

use brood_core::{AgentName, Code};
use brood_store::{Agent, StoreError};

use super::{Dispatcher, Reply, answer};
use crate::api::{ApiError, Caller, SpawnRequest, internal};

/// The most creations admitted together: enough for a burst of clients, few
/// enough that the first does not wait long for the last.
pub(super) const MAX_BATCH: usize = 64;

/// One creation of a batch, as it came to the loop.
pub(super) struct Spawn {
    pub(super) caller: Caller,
    pub(super) req: SpawnRequest,
    pub(super) reply: Reply<brood_api::Agent>,
}

impl Spawn {
    /// Who the new agent's parent is asked to be.
    fn parent(&self) -> Option<&AgentName> {
        match &self.caller {
            Caller::Agent(me) => Some(me),
            Caller::User { .. } => self.req.parent.as_ref(),
        }
    }
}

/// Whether `next` may be admitted together with `batch` (module docs).
pub(super) fn joins(batch: &[Spawn], next: &Spawn) -> bool {
    if batch.len() >= MAX_BATCH || next.req.customer.is_some() {
        return false;
    }
    let parent = next.parent();
    let name = next.req.name.as_ref();
    batch.iter().all(|s| {
        let (p, n) = (s.parent(), s.req.name.as_ref());
        let same_parent = parent.is_some() && p == parent;
        let under_it = parent.is_some() && n == parent;
        let over_it = name.is_some() && p == name;
        let same_name = name.is_some() && n == name;
        !(same_parent || under_it || over_it || same_name)
    })
}

impl Dispatcher {
    /// Admits a batch (see [`joins`]): decided one by one, recorded by the
    /// store together, followed up in arrival order.
    pub(super) fn on_spawns(&mut self, batch: Vec<Spawn>) {
        if batch.len() == 1 {
            for s in batch {
                self.on_spawn(s.caller, s.req, s.reply);
            }
            return;
        }
        let mut decided = Vec::with_capacity(batch.len());
        for s in batch {
            let d = self
                .agents
                .tool_granted(&s.caller, "create")
                .and_then(|()| self.decide(&s.caller, &s.req));
            match d {
                Ok(d) => decided.push((s, d)),
                Err(e) => self.refuse_spawn(s, e),
            }
        }
        if decided.is_empty() {
            return;
        }
        // The tenant's overrides, read once for the batch.
        let quotas = match self.tenant_quotas() {
            Ok(q) => q,
            Err(e) => {
                for (s, _) in decided {
                    self.refuse_spawn(s, e.clone());
                }
                return;
            }
        };
        self.launcher.max_concurrent = quotas.max_concurrent;
        tracing::debug!(n = decided.len(), "admitting creations together");
        let store = &self.records.store;
        let recorded: Vec<Result<Agent, ApiError>> = std::thread::scope(|scope| {
            let running: Vec<_> = decided
                .iter()
                .map(|(_, d)| {
                    let admit = || store.admit_with_quotas(&d.new, &quotas, &d.events);
                    // A thread that cannot be made admits on the loop's own.
                    std::thread::Builder::new()
                        .name("brood-admit".into())
                        .spawn_scoped(scope, admit)
                        .map_err(|_| Box::new(admit()))
                })
                .collect();
            running
                .into_iter()
                .map(|r| match r {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(StoreError::Refused {
                            code: Code::Internal,
                            message: "the thread recording an admission panicked".into(),
                        })
                    }),
                    Err(done) => *done,
                })
                .map(|r| r.map_err(internal))
                .collect()
        });
        for ((s, d), r) in decided.into_iter().zip(recorded) {
            let parent = s.parent().cloned();
            let requested = s.req.name.as_ref().map(|n| n.to_string());
            match r.and_then(|agent| self.record_admission(d, s.req, agent)) {
                Ok(admitted) => self.answer_spawn(admitted, s.reply),
                Err(e) => {
                    self.note_refusal(parent.as_ref(), requested.as_deref(), &e);
                    answer(s.reply, Err(e));
                }
            }
        }
    }

    /// A creation refused before anything was written.
    fn refuse_spawn(&mut self, s: Spawn, e: ApiError) {
        let requested = s.req.name.as_ref().map(|n| n.to_string());
        self.note_refusal(s.parent(), requested.as_deref(), &e);
        answer(s.reply, Err(e));
    }
}
