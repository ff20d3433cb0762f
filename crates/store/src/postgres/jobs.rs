//! [`Jobs`] on PostgreSQL: the shared logic (`crate::jobs`), every mutation
//! in one transaction that first takes the tenant's advisory lock (as
//! SQLite's `BEGIN IMMEDIATE` takes the write lock), so its checks (the
//! status machines, the fencing token) still hold when it writes the change
//! and its events.

use brood_core::{AgentName, ItemStatus, JobStatus, TenantId};

use super::PgStore;
use crate::contract::Jobs;
use crate::jobs;
use crate::types::{Attempt, Job, JobItem, NewEvent, NewItem, NewJob, Result};

impl Jobs for PgStore {
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job> {
        jobs::check_new_job(job, items)?;
        self.write(job.tenant.as_str(), |db| {
            jobs::create_job(db, job, items, events)
        })
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        self.read(|db| jobs::load_job(db, tenant, id))
    }

    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        self.read(|db| jobs::jobs(db, tenant))
    }

    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job> {
        self.write(tenant.as_str(), |db| {
            jobs::set_job_status(db, tenant, id, to, now_ms, events)
        })
    }

    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        self.read(|db| jobs::job_items(db, tenant, job, status))
    }

    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        self.read(|db| jobs::next_pending_item(db, tenant, job, now_ms))
    }

    fn item_counts(&self, tenant: &TenantId, job: &str) -> Result<Vec<(ItemStatus, u32)>> {
        self.read(|db| jobs::item_counts(db, tenant, job))
    }

    fn start_attempt(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        worker: &AgentName,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Attempt> {
        self.write(tenant.as_str(), |db| {
            jobs::start_attempt(db, tenant, job, item, worker, now_ms, events)
        })
    }

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
        self.write(tenant.as_str(), |db| {
            jobs::report_result(
                db, tenant, job, item, attempt, worker, result, now_ms, events,
            )
        })
    }

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
        self.write(tenant.as_str(), |db| {
            let max = max_attempts;
            jobs::fail_attempt(db, tenant, job, item, attempt, error, max, now_ms, events)
        })
    }

    fn retry_item(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem> {
        self.write(tenant.as_str(), |db| {
            jobs::retry_item(db, tenant, job, item, now_ms, events)
        })
    }

    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        self.read(|db| jobs::attempts(db, tenant, job, item))
    }
}
