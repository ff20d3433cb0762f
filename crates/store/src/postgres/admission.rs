//! PostgreSQL: Admission, Runs (being ported from the SQLite store).

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

impl Admission for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent> {
        Err(pending("admit"))
    }
    #[allow(clippy::too_many_arguments)]
    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("admit_with_quotas"))
    }
    #[allow(clippy::too_many_arguments)]
    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas> {
        Err(pending("tenant_quotas"))
    }
    #[allow(clippy::too_many_arguments)]
    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        Err(pending("set_tenant_quota"))
    }
    #[allow(clippy::too_many_arguments)]
    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool> {
        Err(pending("is_ancestor_or_self"))
    }
}

impl Runs for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        pid: i32,
        cgroup: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("start_run"))
    }
    #[allow(clippy::too_many_arguments)]
    fn set_status(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        to: Status,
        detail: Option<&str>,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("set_status"))
    }
    #[allow(clippy::too_many_arguments)]
    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        Err(pending("mark_stopping"))
    }
    #[allow(clippy::too_many_arguments)]
    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("end_run"))
    }
    #[allow(clippy::too_many_arguments)]
    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        Err(pending("end_runs"))
    }
    #[allow(clippy::too_many_arguments)]
    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        Err(pending("record_usage"))
    }
    #[allow(clippy::too_many_arguments)]
    fn resume(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("resume"))
    }
    #[allow(clippy::too_many_arguments)]
    fn resume_within(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        Err(pending("resume_within"))
    }
}
