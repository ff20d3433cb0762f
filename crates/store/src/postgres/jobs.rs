//! Jobs on PostgreSQL (`Jobs`), ported from `sqlite::jobs`: every mutation
//! one transaction that first takes the tenant's advisory lock (as SQLite's
//! `BEGIN IMMEDIATE` takes the write lock), checks its preconditions (the
//! status machines, the fencing token) and writes the change and its events,
//! or nothing.

use std::collections::BTreeSet;

use brood_core::job::after_failure;
use brood_core::{AgentName, Code, ItemStatus, JobStatus, TenantId};
use tokio_postgres::Row;

use super::rows::{collect, narrow, parse_name};
use super::steps::{agent_exists, append_events_tx, check_json_object, to_sql_count};
use super::{Db, Fail, PgStore, Tx, corrupt, not_found, refused};
use crate::contract::Jobs;
use crate::types::{
    Attempt, AttemptOutcome, Job, JobItem, NewEvent, NewItem, NewJob, Result, StoreError,
};

// The columns of a job, an item and an attempt row, in the order `job_from`,
// `item_from` and `attempt_from` read them. Macros and not consts so the
// statements are assembled with `concat!` at compile time (the connection
// keeps its prepared statements by their text).
macro_rules! job_cols {
    () => {
        "tenant, id, owner, status, spec, source, total, created_ms, started_ms, ended_ms, updated_ms"
    };
}
macro_rules! item_cols {
    () => {
        "tenant, job, id, row_index, input, status, attempts, last_error, result, worker, \
         not_before_ms, completed_ms"
    };
}
macro_rules! attempt_cols {
    () => {
        "job, item, number, worker, started_ms, ended_ms, outcome, error"
    };
}

const Q_JOB: &str = concat!(
    "SELECT ",
    job_cols!(),
    " FROM jobs WHERE tenant = $1 AND id = $2"
);
const Q_JOBS: &str = concat!(
    "SELECT ",
    job_cols!(),
    " FROM jobs WHERE tenant = $1 ORDER BY created_ms, id"
);
const Q_ITEM: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = $1 AND job = $2 AND id = $3"
);
const Q_ITEMS: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = $1 AND job = $2 ORDER BY row_index"
);
const Q_ITEMS_OF_STATUS: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = $1 AND job = $2 AND status = $3 ORDER BY row_index"
);
// What a job assigns next: the (tenant, job, status, row_index) index, in order.
const Q_NEXT_PENDING: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = $1 AND job = $2 AND status = 'pending'",
    " AND not_before_ms <= $3 ORDER BY row_index LIMIT 1"
);
const Q_ITEM_COUNTS: &str =
    "SELECT status, COUNT(*) FROM job_items WHERE tenant = $1 AND job = $2 GROUP BY status";
const Q_ATTEMPTS: &str = concat!(
    "SELECT ",
    attempt_cols!(),
    " FROM job_attempts WHERE tenant = $1 AND job = $2 AND item = $3 ORDER BY number"
);
const Q_ATTEMPT_OUTCOME: &str = "SELECT outcome FROM job_attempts \
     WHERE tenant = $1 AND job = $2 AND item = $3 AND number = $4";
const I_JOB: &str = "INSERT INTO jobs (tenant, id, owner, status, spec, source, total, created_ms, updated_ms) \
     VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7, $7)";
const I_ITEM: &str = "INSERT INTO job_items (tenant, job, id, row_index, input, status, updated_ms) \
     VALUES ($1, $2, $3, $4, $5, 'pending', $6)";
const I_ATTEMPT: &str = "INSERT INTO job_attempts (tenant, job, item, number, worker, started_ms, outcome) \
     VALUES ($1, $2, $3, $4, $5, $6, 'running')";
// `$3::TEXT`: the new status is also compared with literals, so its type is
// spelt out rather than left to PostgreSQL's inference.
const U_JOB_STATUS: &str = "UPDATE jobs SET status = $3::TEXT, updated_ms = $4, \
     started_ms = CASE WHEN $3::TEXT = 'running' THEN COALESCE(started_ms, $4) ELSE started_ms END, \
     ended_ms = CASE WHEN $3::TEXT IN ('completed', 'failed', 'cancelled') THEN $4 \
                     WHEN $3::TEXT = 'running' THEN NULL ELSE ended_ms END \
     WHERE tenant = $1 AND id = $2";
const U_ITEM: &str = "UPDATE job_items SET status = $4, attempts = $5, last_error = $6, result = $7, \
     worker = $8, not_before_ms = $9, completed_ms = $10, updated_ms = $11 \
     WHERE tenant = $1 AND job = $2 AND id = $3";
const U_ATTEMPT_END: &str = "UPDATE job_attempts SET ended_ms = $5, outcome = $6, error = $7 \
     WHERE tenant = $1 AND job = $2 AND item = $3 AND number = $4 AND outcome = 'running'";

fn opt_agent(row: &Row, i: usize, what: &'static str) -> Tx<Option<AgentName>> {
    row.try_get::<_, Option<String>>(i)?
        .map(|w| parse_name(what, w, AgentName::new))
        .transpose()
}

fn job_from(r: &Row) -> Tx<Job> {
    let status: String = r.try_get(3)?;
    Ok(Job {
        tenant: parse_name("jobs.tenant", r.try_get(0)?, TenantId::new)?,
        id: r.try_get(1)?,
        owner: parse_name("jobs.owner", r.try_get(2)?, AgentName::new)?,
        status: JobStatus::parse(&status).ok_or_else(|| corrupt("jobs.status", status))?,
        spec: r.try_get(4)?,
        source: r.try_get(5)?,
        total: narrow(r, 6, "jobs.total")?,
        created_ms: r.try_get(7)?,
        started_ms: r.try_get(8)?,
        ended_ms: r.try_get(9)?,
        updated_ms: r.try_get(10)?,
    })
}

fn item_from(r: &Row) -> Tx<JobItem> {
    let status: String = r.try_get(5)?;
    Ok(JobItem {
        tenant: parse_name("job_items.tenant", r.try_get(0)?, TenantId::new)?,
        job: r.try_get(1)?,
        id: r.try_get(2)?,
        row_index: narrow(r, 3, "job_items.row_index")?,
        input: r.try_get(4)?,
        status: ItemStatus::parse(&status).ok_or_else(|| corrupt("job_items.status", status))?,
        attempts: narrow(r, 6, "job_items.attempts")?,
        last_error: r.try_get(7)?,
        result: r.try_get(8)?,
        worker: opt_agent(r, 9, "job_items.worker")?,
        not_before_ms: r.try_get(10)?,
        completed_ms: r.try_get(11)?,
    })
}

fn attempt_from(r: &Row) -> Tx<Attempt> {
    let outcome: String = r.try_get(6)?;
    Ok(Attempt {
        job: r.try_get(0)?,
        item: r.try_get(1)?,
        number: narrow(r, 2, "job_attempts.number")?,
        worker: opt_agent(r, 3, "job_attempts.worker")?,
        started_ms: r.try_get(4)?,
        ended_ms: r.try_get(5)?,
        outcome: AttemptOutcome::parse(&outcome)
            .ok_or_else(|| corrupt("job_attempts.outcome", outcome))?,
        error: r.try_get(7)?,
    })
}

fn no_job(tenant: &TenantId, id: &str) -> Fail {
    refused(Code::NotFound, format!("no job {id} in tenant {tenant}"))
}

pub(super) fn load_job(db: &Db<'_>, tenant: &TenantId, id: &str) -> Tx<Option<Job>> {
    db.query_opt(Q_JOB, &[&tenant.as_str(), &id])?
        .map(|r| job_from(&r))
        .transpose()
}

fn load_item(db: &Db<'_>, tenant: &TenantId, job: &str, item: &str) -> Tx<JobItem> {
    match db.query_opt(Q_ITEM, &[&tenant.as_str(), &job, &item])? {
        Some(r) => item_from(&r),
        None => Err(refused(
            Code::NotFound,
            format!("job {job} has no item {item}"),
        )),
    }
}

fn item_move(it: &JobItem, to: ItemStatus) -> Tx<ItemStatus> {
    it.status.transition(to).map_err(|e| {
        refused(
            Code::Conflict,
            format!("job {} item {}: {e}", it.job, it.id),
        )
    })
}

fn set_item(db: &Db<'_>, it: &JobItem, now_ms: i64) -> Tx<()> {
    db.exec(
        U_ITEM,
        &[
            &it.tenant.as_str(),
            &it.job,
            &it.id,
            &it.status.as_str(),
            &i64::from(it.attempts),
            &it.last_error,
            &it.result,
            &it.worker.as_ref().map(AgentName::as_str),
            &it.not_before_ms,
            &it.completed_ms,
            &now_ms,
        ],
    )?;
    Ok(())
}

/// The item's current attempt, which must be running with this number.
fn current_attempt(db: &Db<'_>, it: &JobItem, attempt: u32) -> Tx<()> {
    if it.status != ItemStatus::Running || it.attempts != attempt {
        return Err(refused(
            Code::Conflict,
            format!(
                "job {} item {}: attempt {attempt} is not its current one (the item is {}, at attempt {})",
                it.job,
                it.id,
                it.status.as_str(),
                it.attempts
            ),
        ));
    }
    let outcome: Option<String> = db
        .query_opt(
            Q_ATTEMPT_OUTCOME,
            &[&it.tenant.as_str(), &it.job, &it.id, &i64::from(attempt)],
        )?
        .map(|r| r.try_get(0))
        .transpose()?;
    if outcome.as_deref() != Some("running") {
        return Err(refused(
            Code::Conflict,
            format!("job {} item {}: attempt {attempt} has ended", it.job, it.id),
        ));
    }
    Ok(())
}

fn end_attempt(
    db: &Db<'_>,
    it: &JobItem,
    attempt: u32,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now_ms: i64,
) -> Tx<()> {
    db.exec(
        U_ATTEMPT_END,
        &[
            &it.tenant.as_str(),
            &it.job,
            &it.id,
            &i64::from(attempt),
            &now_ms,
            &outcome.as_str(),
            &error,
        ],
    )?;
    Ok(())
}

impl Jobs for PgStore {
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job> {
        if items.is_empty() {
            return Err(StoreError::Refused {
                code: Code::BadRequest,
                message: format!("job {} has no item", job.id),
            });
        }
        let mut ids = BTreeSet::new();
        for it in items {
            if !ids.insert(it.id.as_str()) {
                return Err(StoreError::Refused {
                    code: Code::BadRequest,
                    message: format!("job {}: two items have the id {:?}", job.id, it.id),
                });
            }
        }
        let t = &job.tenant;
        self.write(t.as_str(), |db| {
            if !agent_exists(db, t, &job.owner)? {
                return Err(not_found(t, &job.owner));
            }
            // Checked before the insert, not caught from it: on PostgreSQL a
            // failed statement aborts the whole transaction.
            if load_job(db, t, &job.id)?.is_some() {
                return Err(refused(
                    Code::Conflict,
                    format!("a job {} exists in tenant {t}", job.id),
                ));
            }
            check_json_object(|| format!("the spec of job {:?}", job.id), &job.spec, false)?;
            db.exec(
                I_JOB,
                &[
                    &t.as_str(),
                    &job.id,
                    &job.owner.as_str(),
                    &job.spec,
                    &job.source,
                    &to_sql_count(items.len() as u64),
                    &job.created_ms,
                ],
            )?;
            for it in items {
                check_json_object(
                    || format!("item {:?} of job {:?}", it.id, job.id),
                    &it.input,
                    false,
                )?;
                db.exec(
                    I_ITEM,
                    &[
                        &t.as_str(),
                        &job.id,
                        &it.id,
                        &i64::from(it.row_index),
                        &it.input,
                        &job.created_ms,
                    ],
                )?;
            }
            append_events_tx(db, t, events, job.created_ms)?;
            load_job(db, t, &job.id)?.ok_or_else(|| no_job(t, &job.id))
        })
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        self.read(|db| load_job(db, tenant, id))
    }

    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        self.read(|db| collect(db, Q_JOBS, &[&tenant.as_str()], job_from))
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
            let j = load_job(db, tenant, id)?.ok_or_else(|| no_job(tenant, id))?;
            j.status
                .transition(to)
                .map_err(|e| refused(Code::Conflict, format!("job {id}: {e}")))?;
            db.exec(
                U_JOB_STATUS,
                &[&tenant.as_str(), &id, &to.as_str(), &now_ms],
            )?;
            append_events_tx(db, tenant, events, now_ms)?;
            load_job(db, tenant, id)?.ok_or_else(|| no_job(tenant, id))
        })
    }

    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        self.read(|db| {
            if load_job(db, tenant, job)?.is_none() {
                return Err(no_job(tenant, job));
            }
            match status {
                Some(s) => collect(
                    db,
                    Q_ITEMS_OF_STATUS,
                    &[&tenant.as_str(), &job, &s.as_str()],
                    item_from,
                ),
                None => collect(db, Q_ITEMS, &[&tenant.as_str(), &job], item_from),
            }
        })
    }

    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        self.read(|db| {
            db.query_opt(Q_NEXT_PENDING, &[&tenant.as_str(), &job, &now_ms])?
                .map(|r| item_from(&r))
                .transpose()
        })
    }

    fn item_counts(&self, tenant: &TenantId, job: &str) -> Result<Vec<(ItemStatus, u32)>> {
        self.read(|db| {
            if load_job(db, tenant, job)?.is_none() {
                return Err(no_job(tenant, job));
            }
            // COUNT(*) is a BIGINT on PostgreSQL: narrowed with a check.
            let rows = collect(db, Q_ITEM_COUNTS, &[&tenant.as_str(), &job], |r| {
                Ok((
                    r.try_get::<_, String>(0)?,
                    narrow::<u32>(r, 1, "job_items count")?,
                ))
            })?;
            Ok(ItemStatus::ALL
                .iter()
                .map(|s| {
                    let n = rows
                        .iter()
                        .find(|(k, _)| k == s.as_str())
                        .map_or(0, |(_, n)| *n);
                    (*s, n)
                })
                .collect())
        })
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
            let j = load_job(db, tenant, job)?.ok_or_else(|| no_job(tenant, job))?;
            if j.status != JobStatus::Running {
                return Err(refused(
                    Code::Conflict,
                    format!(
                        "job {job} is {}; attempts start only while it runs",
                        j.status.as_str()
                    ),
                ));
            }
            let mut it = load_item(db, tenant, job, item)?;
            it.status = item_move(&it, ItemStatus::Running)?;
            if it.not_before_ms > now_ms {
                return Err(refused(
                    Code::Conflict,
                    format!(
                        "job {job} item {item} waits until {} (backoff)",
                        it.not_before_ms
                    ),
                ));
            }
            it.attempts += 1;
            it.worker = Some(worker.clone());
            set_item(db, &it, now_ms)?;
            db.exec(
                I_ATTEMPT,
                &[
                    &tenant.as_str(),
                    &job,
                    &item,
                    &i64::from(it.attempts),
                    &worker.as_str(),
                    &now_ms,
                ],
            )?;
            append_events_tx(db, tenant, events, now_ms)?;
            Ok(Attempt {
                job: job.to_owned(),
                item: item.to_owned(),
                number: it.attempts,
                worker: Some(worker.clone()),
                started_ms: now_ms,
                ended_ms: None,
                outcome: AttemptOutcome::Running,
                error: None,
            })
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
            let mut it = load_item(db, tenant, job, item)?;
            current_attempt(db, &it, attempt)?;
            if it.worker.as_ref() != Some(worker) {
                return Err(refused(
                    Code::Conflict,
                    format!(
                        "job {job} item {item}: attempt {attempt} belongs to {}, not {worker}",
                        it.worker.as_ref().map_or("nobody", AgentName::as_str)
                    ),
                ));
            }
            // Any JSON value is a result; only text that is not JSON is refused.
            serde_json::from_str::<serde_json::Value>(result).map_err(|e| {
                refused(
                    Code::BadRequest,
                    format!("the result of job {job} item {item} is not JSON: {e}"),
                )
            })?;
            it.status = item_move(&it, ItemStatus::Completed)?;
            it.result = Some(result.to_owned());
            it.completed_ms = Some(now_ms);
            it.last_error = None;
            set_item(db, &it, now_ms)?;
            end_attempt(db, &it, attempt, AttemptOutcome::Completed, None, now_ms)?;
            append_events_tx(db, tenant, events, now_ms)?;
            Ok(it)
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
            let mut it = load_item(db, tenant, job, item)?;
            current_attempt(db, &it, attempt)?;
            let (to, backoff) = after_failure(it.attempts, max_attempts.max(1));
            it.status = item_move(&it, to)?;
            it.last_error = Some(error.to_owned());
            // The backoff is at most 60 s (`backoff_ms`), far inside an i64.
            it.not_before_ms = backoff.map_or(it.not_before_ms, |b| {
                now_ms.saturating_add(i64::try_from(b).unwrap_or(i64::MAX))
            });
            set_item(db, &it, now_ms)?;
            end_attempt(
                db,
                &it,
                attempt,
                AttemptOutcome::Failed,
                Some(error),
                now_ms,
            )?;
            append_events_tx(db, tenant, events, now_ms)?;
            Ok(it)
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
            let mut it = load_item(db, tenant, job, item)?;
            if it.status != ItemStatus::Failed {
                return Err(refused(
                    Code::Conflict,
                    format!(
                        "job {job} item {item} is {}; only a failed item is retried",
                        it.status.as_str()
                    ),
                ));
            }
            it.status = item_move(&it, ItemStatus::Pending)?;
            it.not_before_ms = now_ms;
            set_item(db, &it, now_ms)?;
            append_events_tx(db, tenant, events, now_ms)?;
            Ok(it)
        })
    }

    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        self.read(|db| {
            load_item(db, tenant, job, item)?;
            collect(
                db,
                Q_ATTEMPTS,
                &[&tenant.as_str(), &job, &item],
                attempt_from,
            )
        })
    }
}
