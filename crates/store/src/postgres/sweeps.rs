//! PostgreSQL: Sweeps (being ported from the SQLite store).

#![allow(unused_variables)]

use super::PgStore;
use crate::contract::*;
use crate::types::*;
use brood_core::{AgentName, Quotas, RunId, SessionName, Status, TenantId, TenantQuotas, Terminal};

fn pending(what: &str) -> StoreError {
    StoreError::PostgresSetup {
        target: String::new(),
        message: format!("{what}: not ported yet"),
    }
}

impl Sweeps for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence> {
        Err(pending("acquire_lease"))
    }
    #[allow(clippy::too_many_arguments)]
    fn lease(&self, name: &str) -> Result<Option<Fence>> {
        Err(pending("lease"))
    }
    #[allow(clippy::too_many_arguments)]
    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>> {
        Err(pending("overdue"))
    }
    #[allow(clippy::too_many_arguments)]
    fn orphans(&self, limit: u32) -> Result<Vec<Agent>> {
        Err(pending("orphans"))
    }
    #[allow(clippy::too_many_arguments)]
    fn sweep_stop(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Vec<Agent>> {
        Err(pending("sweep_stop"))
    }
    #[allow(clippy::too_many_arguments)]
    fn sweep_end(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        name: &AgentName,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("sweep_end"))
    }
}
