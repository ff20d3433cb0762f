//! [`Jobs`] once for every [`SqlStore`]: the shared logic (`crate::jobs`),
//! every mutation in one transaction of the tenant's (SQLite's
//! `BEGIN IMMEDIATE`, PostgreSQL's tenant lock), so its checks (the status
//! machines, the fencing token) still hold when it writes the change and
//! its events.

use brood_core::{AgentName, ItemStatus, JobStatus, TenantId};

use super::SqlStore;
use crate::contract::Jobs;
use crate::jobs;
use crate::types::{Attempt, Job, JobItem, NewEvent, NewItem, NewJob, Result};

impl<S: SqlStore> Jobs for S {
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job> {
        jobs::check_new_job(job, items)?;
        self.writing(&job.tenant, |db| jobs::create_job(db, job, items, events))
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        self.reading(|db| jobs::load_job(db, tenant, id))
    }

    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        self.reading(|db| jobs::jobs(db, tenant))
    }

    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job> {
        self.writing(tenant, |db| {
            jobs::set_job_status(db, tenant, id, to, now_ms, events)
        })
    }

    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        self.reading(|db| jobs::job_items(db, tenant, job, status))
    }

    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        self.reading(|db| jobs::next_pending_item(db, tenant, job, now_ms))
    }

    fn item_counts(&self, tenant: &TenantId, job: &str) -> Result<Vec<(ItemStatus, u32)>> {
        self.reading(|db| jobs::item_counts(db, tenant, job))
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
        self.writing(tenant, |db| {
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
        self.writing(tenant, |db| {
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
        self.writing(tenant, |db| {
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
        self.writing(tenant, |db| {
            jobs::retry_item(db, tenant, job, item, now_ms, events)
        })
    }

    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        self.reading(|db| jobs::attempts(db, tenant, job, item))
    }
}
