//! [`Jobs`] on SQLite: the shared logic (`crate::jobs`), every mutation in
//! one `BEGIN IMMEDIATE` transaction, so its checks (the status machines,
//! the fencing token) still hold when it writes the change and its events.

use brood_core::{AgentName, ItemStatus, JobStatus, TenantId};

use super::SqliteStore;
use crate::contract::Jobs;
use crate::jobs;
use crate::types::{Attempt, Job, JobItem, NewEvent, NewItem, NewJob, Result};

impl Jobs for SqliteStore {
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job> {
        jobs::check_new_job(job, items)?;
        self.write(|tx| jobs::create_job(tx, job, items, events))
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        self.read(|conn| jobs::load_job(conn, tenant, id))
    }

    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        self.read(|conn| jobs::jobs(conn, tenant))
    }

    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job> {
        self.write(|tx| jobs::set_job_status(tx, tenant, id, to, now_ms, events))
    }

    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        self.read(|conn| jobs::job_items(conn, tenant, job, status))
    }

    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        self.read(|conn| jobs::next_pending_item(conn, tenant, job, now_ms))
    }

    fn item_counts(&self, tenant: &TenantId, job: &str) -> Result<Vec<(ItemStatus, u32)>> {
        self.read(|conn| jobs::item_counts(conn, tenant, job))
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
        self.write(|tx| jobs::start_attempt(tx, tenant, job, item, worker, now_ms, events))
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
        self.write(|tx| {
            jobs::report_result(
                tx, tenant, job, item, attempt, worker, result, now_ms, events,
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
        self.write(|tx| {
            let max = max_attempts;
            jobs::fail_attempt(tx, tenant, job, item, attempt, error, max, now_ms, events)
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
        self.write(|tx| jobs::retry_item(tx, tenant, job, item, now_ms, events))
    }

    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        self.read(|conn| jobs::attempts(conn, tenant, job, item))
    }
}
