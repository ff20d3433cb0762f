//! The store and what follows each write of it: the ctx projection that
//! mirrors the records as files, the counter that wakes event streams, and
//! the flag that folds another node's news into one look. Every record the
//! dispatcher makes goes through this part (SPEC 4: committed before anyone
//! can observe it).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use brood_core::{AgentName, Code, TenantId};
use brood_store::{Agent, Store};
use tokio::sync::watch;

use crate::api::{ApiError, Caller, internal, not_found};
use crate::projection::Projection;

pub(super) struct Records {
    pub(super) store: Arc<dyn Store>,
    pub(super) tenant: TenantId,
    pub(super) projection: Projection,
    /// Bumped after each command (see `Supervisor::changed`).
    pub(super) changed: watch::Sender<u64>,
    /// Set while a `Cmd::News` is queued, so news arriving faster than the
    /// loop looks costs one look, not a queue of them.
    pub(super) news_queued: Arc<AtomicBool>,
}

impl Records {
    /// The agent's record, or 404 naming it.
    pub(super) fn agent(&self, name: &AgentName) -> Result<Agent, ApiError> {
        self.store
            .agent(&self.tenant, name)
            .map_err(internal)?
            .ok_or_else(|| not_found(name))
    }

    /// An agent may act on its own descendants only; a user on anything.
    pub(super) fn authorize(&self, caller: &Caller, target: &Agent) -> Result<(), ApiError> {
        let Caller::Agent(me) = caller else {
            return Ok(());
        };
        let mut cur = target.parent.clone();
        let mut hops = 0;
        while let Some(p) = cur {
            if &p == me {
                return Ok(());
            }
            hops += 1;
            if hops > 10_000 {
                break;
            }
            cur = self
                .store
                .agent(&self.tenant, &p)
                .map_err(internal)?
                .and_then(|a| a.parent);
        }
        Err(ApiError::new(
            Code::Forbidden,
            format!(
                "agent {me} may act only on its own descendants, not on {}",
                target.name
            ),
        ))
    }
}
