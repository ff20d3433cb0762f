//! Jobs on SQLite (`Jobs`): every mutation one `BEGIN IMMEDIATE`
//! transaction that checks its preconditions (the status machines, the
//! fencing token) and writes the change and its events, or nothing.

use std::collections::BTreeSet;

use brood_core::job::after_failure;
use brood_core::{AgentName, Code, ItemStatus, JobStatus, TenantId};
use rusqlite::{OptionalExtension, Row};

use super::{
    Fail, SqliteStore, Tx, agent_exists, append_events_tx, check_json_object, collect, corrupt,
    not_found, parse_name, refused,
};
use crate::contract::Jobs;
use crate::types::NewEvent;
use crate::types::Result;
use crate::types::StoreError;
use crate::types::{Attempt, AttemptOutcome, Job, JobItem, NewItem, NewJob};
use rusqlite::Connection;
use rusqlite::Transaction;

const JOB_COLS: &str =
    "tenant, id, owner, status, spec, source, total, created_ms, started_ms, ended_ms, updated_ms";
const ITEM_COLS: &str = "tenant, job, id, row_index, input, status, attempts, last_error, result, worker, not_before_ms, completed_ms";
const ATTEMPT_COLS: &str = "job, item, number, worker, started_ms, ended_ms, outcome, error";

fn job_from(r: &Row<'_>) -> Tx<Job> {
    let status: String = r.get(3)?;
    Ok(Job {
        tenant: parse_name("jobs.tenant", r.get(0)?, TenantId::new)?,
        id: r.get(1)?,
        owner: parse_name("jobs.owner", r.get(2)?, AgentName::new)?,
        status: JobStatus::parse(&status).ok_or_else(|| corrupt("jobs.status", status))?,
        spec: r.get(4)?,
        source: r.get(5)?,
        total: r.get(6)?,
        created_ms: r.get(7)?,
        started_ms: r.get(8)?,
        ended_ms: r.get(9)?,
        updated_ms: r.get(10)?,
    })
}

fn item_from(r: &Row<'_>) -> Tx<JobItem> {
    let status: String = r.get(5)?;
    Ok(JobItem {
        tenant: parse_name("job_items.tenant", r.get(0)?, TenantId::new)?,
        job: r.get(1)?,
        id: r.get(2)?,
        row_index: r.get(3)?,
        input: r.get(4)?,
        status: ItemStatus::parse(&status).ok_or_else(|| corrupt("job_items.status", status))?,
        attempts: r.get(6)?,
        last_error: r.get(7)?,
        result: r.get(8)?,
        worker: match r.get::<_, Option<String>>(9)? {
            Some(w) => Some(parse_name("job_items.worker", w, AgentName::new)?),
            None => None,
        },
        not_before_ms: r.get(10)?,
        completed_ms: r.get(11)?,
    })
}

fn attempt_from(r: &Row<'_>) -> Tx<Attempt> {
    let outcome: String = r.get(6)?;
    Ok(Attempt {
        job: r.get(0)?,
        item: r.get(1)?,
        number: r.get(2)?,
        worker: match r.get::<_, Option<String>>(3)? {
            Some(w) => Some(parse_name("job_attempts.worker", w, AgentName::new)?),
            None => None,
        },
        started_ms: r.get(4)?,
        ended_ms: r.get(5)?,
        outcome: AttemptOutcome::parse(&outcome)
            .ok_or_else(|| corrupt("job_attempts.outcome", outcome))?,
        error: r.get(7)?,
    })
}

fn no_job(tenant: &TenantId, id: &str) -> Fail {
    refused(Code::NotFound, format!("no job {id} in tenant {tenant}"))
}

pub(super) fn load_job(conn: &Connection, tenant: &TenantId, id: &str) -> Tx<Option<Job>> {
    let sql = format!("SELECT {JOB_COLS} FROM jobs WHERE tenant = ?1 AND id = ?2");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query((tenant.as_str(), id))?;
    match rows.next()? {
        Some(r) => Ok(Some(job_from(r)?)),
        None => Ok(None),
    }
}

fn load_item(conn: &Connection, tenant: &TenantId, job: &str, item: &str) -> Tx<JobItem> {
    let sql =
        format!("SELECT {ITEM_COLS} FROM job_items WHERE tenant = ?1 AND job = ?2 AND id = ?3");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query((tenant.as_str(), job, item))?;
    match rows.next()? {
        Some(r) => item_from(r),
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

fn set_item(tx: &Transaction<'_>, it: &JobItem, now_ms: i64) -> Tx<()> {
    tx.prepare_cached(
        "UPDATE job_items SET status = ?4, attempts = ?5, last_error = ?6, result = ?7, worker = ?8, \
         not_before_ms = ?9, completed_ms = ?10, updated_ms = ?11 WHERE tenant = ?1 AND job = ?2 AND id = ?3",
    )?
    .execute(rusqlite::params![
        it.tenant.as_str(),
        it.job,
        it.id,
        it.status.as_str(),
        it.attempts,
        it.last_error,
        it.result,
        it.worker.as_ref().map(AgentName::as_str),
        it.not_before_ms,
        it.completed_ms,
        now_ms,
    ])?;
    Ok(())
}

/// The item's current attempt, which must be running with this number.
fn current_attempt(tx: &Transaction<'_>, it: &JobItem, attempt: u32) -> Tx<()> {
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
    let outcome: Option<String> = tx
        .prepare_cached("SELECT outcome FROM job_attempts WHERE tenant = ?1 AND job = ?2 AND item = ?3 AND number = ?4")?
        .query_row((it.tenant.as_str(), &it.job, &it.id, attempt), |r| r.get(0))
        .optional()?;
    if outcome.as_deref() != Some("running") {
        return Err(refused(
            Code::Conflict,
            format!("job {} item {}: attempt {attempt} has ended", it.job, it.id),
        ));
    }
    Ok(())
}

fn end_attempt(
    tx: &Transaction<'_>,
    it: &JobItem,
    attempt: u32,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now_ms: i64,
) -> Tx<()> {
    tx.prepare_cached(
        "UPDATE job_attempts SET ended_ms = ?5, outcome = ?6, error = ?7 \
         WHERE tenant = ?1 AND job = ?2 AND item = ?3 AND number = ?4 AND outcome = 'running'",
    )?
    .execute(rusqlite::params![
        it.tenant.as_str(),
        it.job,
        it.id,
        attempt,
        now_ms,
        outcome.as_str(),
        error,
    ])?;
    Ok(())
}

impl Jobs for SqliteStore {
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
        self.write(|tx| {
            if !agent_exists(tx, t, &job.owner)? {
                return Err(not_found(t, &job.owner));
            }
            if load_job(tx, t, &job.id)?.is_some() {
                return Err(refused(Code::Conflict, format!("a job {} exists in tenant {t}", job.id)));
            }
            check_json_object(|| format!("the spec of job {:?}", job.id), &job.spec, false)?;
            tx.prepare_cached(
                "INSERT INTO jobs (tenant, id, owner, status, spec, source, total, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, 'pending', ?4, ?5, ?6, ?7, ?7)",
            )?
            .execute(rusqlite::params![
                t.as_str(),
                job.id,
                job.owner.as_str(),
                job.spec,
                job.source,
                items.len() as u32,
                job.created_ms,
            ])?;
            let mut ins = tx.prepare_cached(
                "INSERT INTO job_items (tenant, job, id, row_index, input, status, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6)",
            )?;
            for it in items {
                check_json_object(|| format!("item {:?} of job {:?}", it.id, job.id), &it.input, false)?;
                ins.execute(rusqlite::params![t.as_str(), job.id, it.id, it.row_index, it.input, job.created_ms])?;
            }
            append_events_tx(tx, t, events, job.created_ms)?;
            load_job(tx, t, &job.id)?.ok_or_else(|| no_job(t, &job.id))
        })
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>> {
        self.read(|conn| load_job(conn, tenant, id))
    }

    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>> {
        let sql = format!("SELECT {JOB_COLS} FROM jobs WHERE tenant = ?1 ORDER BY created_ms, id");
        self.read(|conn| collect(conn, &sql, [tenant.as_str()], job_from))
    }

    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job> {
        self.write(|tx| {
            let j = load_job(tx, tenant, id)?.ok_or_else(|| no_job(tenant, id))?;
            j.status
                .transition(to)
                .map_err(|e| refused(Code::Conflict, format!("job {id}: {e}")))?;
            tx.prepare_cached(
                "UPDATE jobs SET status = ?3, updated_ms = ?4, \
                 started_ms = CASE WHEN ?3 = 'running' THEN COALESCE(started_ms, ?4) ELSE started_ms END, \
                 ended_ms = CASE WHEN ?3 IN ('completed', 'failed', 'cancelled') THEN ?4 \
                                 WHEN ?3 = 'running' THEN NULL ELSE ended_ms END \
                 WHERE tenant = ?1 AND id = ?2",
            )?
            .execute((tenant.as_str(), id, to.as_str(), now_ms))?;
            append_events_tx(tx, tenant, events, now_ms)?;
            load_job(tx, tenant, id)?.ok_or_else(|| no_job(tenant, id))
        })
    }

    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<ItemStatus>,
    ) -> Result<Vec<JobItem>> {
        self.read(|conn| {
            if load_job(conn, tenant, job)?.is_none() {
                return Err(no_job(tenant, job));
            }
            match status {
                Some(s) => collect(
                    conn,
                    &format!("SELECT {ITEM_COLS} FROM job_items WHERE tenant = ?1 AND job = ?2 AND status = ?3 ORDER BY row_index"),
                    (tenant.as_str(), job, s.as_str()),
                    item_from,
                ),
                None => collect(
                    conn,
                    &format!("SELECT {ITEM_COLS} FROM job_items WHERE tenant = ?1 AND job = ?2 ORDER BY row_index"),
                    (tenant.as_str(), job),
                    item_from,
                ),
            }
        })
    }

    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>> {
        let sql = format!(
            "SELECT {ITEM_COLS} FROM job_items WHERE tenant = ?1 AND job = ?2 AND status = 'pending' \
             AND not_before_ms <= ?3 ORDER BY row_index LIMIT 1"
        );
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&sql)?;
            let mut rows = stmt.query((tenant.as_str(), job, now_ms))?;
            match rows.next()? {
                Some(r) => Ok(Some(item_from(r)?)),
                None => Ok(None),
            }
        })
    }

    fn item_counts(&self, tenant: &TenantId, job: &str) -> Result<Vec<(ItemStatus, u32)>> {
        self.read(|conn| {
            if load_job(conn, tenant, job)?.is_none() {
                return Err(no_job(tenant, job));
            }
            let rows = collect(
                conn,
                "SELECT status, COUNT(*) FROM job_items WHERE tenant = ?1 AND job = ?2 GROUP BY status",
                (tenant.as_str(), job),
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)),
            )?;
            Ok(ItemStatus::ALL
                .iter()
                .map(|s| {
                    let n = rows.iter().find(|(k, _)| k == s.as_str()).map_or(0, |(_, n)| *n);
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
        self.write(|tx| {
            let j = load_job(tx, tenant, job)?.ok_or_else(|| no_job(tenant, job))?;
            if j.status != JobStatus::Running {
                return Err(refused(
                    Code::Conflict,
                    format!(
                        "job {job} is {}; attempts start only while it runs",
                        j.status.as_str()
                    ),
                ));
            }
            let mut it = load_item(tx, tenant, job, item)?;
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
            set_item(tx, &it, now_ms)?;
            tx.prepare_cached(
                "INSERT INTO job_attempts (tenant, job, item, number, worker, started_ms, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running')",
            )?
            .execute(rusqlite::params![
                tenant.as_str(),
                job,
                item,
                it.attempts,
                worker.as_str(),
                now_ms
            ])?;
            append_events_tx(tx, tenant, events, now_ms)?;
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
        self.write(|tx| {
            let mut it = load_item(tx, tenant, job, item)?;
            current_attempt(tx, &it, attempt)?;
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
            set_item(tx, &it, now_ms)?;
            end_attempt(tx, &it, attempt, AttemptOutcome::Completed, None, now_ms)?;
            append_events_tx(tx, tenant, events, now_ms)?;
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
        self.write(|tx| {
            let mut it = load_item(tx, tenant, job, item)?;
            current_attempt(tx, &it, attempt)?;
            let (to, backoff) = after_failure(it.attempts, max_attempts.max(1));
            it.status = item_move(&it, to)?;
            it.last_error = Some(error.to_owned());
            it.not_before_ms = backoff.map_or(it.not_before_ms, |b| now_ms + b as i64);
            set_item(tx, &it, now_ms)?;
            end_attempt(
                tx,
                &it,
                attempt,
                AttemptOutcome::Failed,
                Some(error),
                now_ms,
            )?;
            append_events_tx(tx, tenant, events, now_ms)?;
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
        self.write(|tx| {
            let mut it = load_item(tx, tenant, job, item)?;
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
            set_item(tx, &it, now_ms)?;
            append_events_tx(tx, tenant, events, now_ms)?;
            Ok(it)
        })
    }

    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>> {
        let sql = format!(
            "SELECT {ATTEMPT_COLS} FROM job_attempts WHERE tenant = ?1 AND job = ?2 AND item = ?3 ORDER BY number"
        );
        self.read(|conn| {
            load_item(conn, tenant, job, item)?;
            collect(conn, &sql, (tenant.as_str(), job, item), attempt_from)
        })
    }
}
