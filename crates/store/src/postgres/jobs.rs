//! PostgreSQL: Jobs (being ported from the SQLite store).

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

impl Jobs for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job> {
        Err(pending("create_job"))
    }
    #[allow(clippy::too_many_arguments)]
    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        Err(pending("job"))
    }
    #[allow(clippy::too_many_arguments)]
    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        Err(pending("jobs"))
    }
    #[allow(clippy::too_many_arguments)]
    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: brood_core::JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job> {
        Err(pending("set_job_status"))
    }
    #[allow(clippy::too_many_arguments)]
    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<brood_core::ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        Err(pending("job_items"))
    }
    #[allow(clippy::too_many_arguments)]
    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        Err(pending("next_pending_item"))
    }
    #[allow(clippy::too_many_arguments)]
    fn item_counts(
        &self,
        tenant: &TenantId,
        job: &str,
    ) -> Result<Vec<(brood_core::ItemStatus, u32)>> {
        Err(pending("item_counts"))
    }
    #[allow(clippy::too_many_arguments)]
    fn start_attempt(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        worker: &AgentName,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Attempt> {
        Err(pending("start_attempt"))
    }
    #[allow(clippy::too_many_arguments)]
    fn report_result(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        attempt: u32,
        worker: &AgentName,
        result: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem> {
        Err(pending("report_result"))
    }
    #[allow(clippy::too_many_arguments)]
    fn fail_attempt(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        attempt: u32,
        error: &str,
        max_attempts: u32,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem> {
        Err(pending("fail_attempt"))
    }
    #[allow(clippy::too_many_arguments)]
    fn retry_item(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem> {
        Err(pending("retry_item"))
    }
    #[allow(clippy::too_many_arguments)]
    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        Err(pending("attempts"))
    }
}
