//! Jobs, their items and every attempt (SPEC 10, [`crate::Jobs`]), written
//! once for both stores over [`Db`]: the reads, the checks (the status
//! machines, the fencing of an attempt), the writes and the events of each
//! call, in order. Each call runs in the store's transaction of the
//! tenant (`sql_store::jobs`: SQLite's `BEGIN IMMEDIATE`, PostgreSQL's
//! tenant lock), so the checks still hold when it commits.

use std::collections::BTreeSet;

use brood_core::job::after_failure;
use brood_core::{AgentName, Code, ItemStatus, JobStatus, TenantId};

use crate::checks::{check_json_object, refused};
use crate::db::{Db, Row, int, narrow, parse};
use crate::types::{Attempt, AttemptOutcome, Job, JobItem, NewEvent, NewItem, NewJob, StoreError};

// The columns of a job, an item and an attempt row, in the order `job_from`,
// `item_from` and `attempt_from` read them; macros so the statements are
// assembled at compile time.
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
    " FROM jobs WHERE tenant = ?1 AND id = ?2"
);
const Q_JOBS: &str = concat!(
    "SELECT ",
    job_cols!(),
    " FROM jobs WHERE tenant = ?1 ORDER BY created_ms, id"
);
const Q_ITEM: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = ?1 AND job = ?2 AND id = ?3"
);
const Q_ITEMS: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = ?1 AND job = ?2 ORDER BY row_index"
);
const Q_ITEMS_OF_STATUS: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = ?1 AND job = ?2 AND status = ?3 ORDER BY row_index"
);
// What a job assigns next: the (tenant, job, status, row_index) index, in order.
const Q_NEXT_PENDING: &str = concat!(
    "SELECT ",
    item_cols!(),
    " FROM job_items WHERE tenant = ?1 AND job = ?2 AND status = 'pending'",
    " AND not_before_ms <= ?3 ORDER BY row_index LIMIT 1"
);
const Q_ITEM_COUNTS: &str =
    "SELECT status, COUNT(*) FROM job_items WHERE tenant = ?1 AND job = ?2 GROUP BY status";
const Q_ATTEMPTS: &str = concat!(
    "SELECT ",
    attempt_cols!(),
    " FROM job_attempts WHERE tenant = ?1 AND job = ?2 AND item = ?3 ORDER BY number"
);
const Q_ATTEMPT_OUTCOME: &str = "SELECT outcome FROM job_attempts \
     WHERE tenant = ?1 AND job = ?2 AND item = ?3 AND number = ?4";
const I_JOB: &str = "INSERT INTO jobs (tenant, id, owner, status, spec, source, total, created_ms, updated_ms) \
     VALUES (?1, ?2, ?3, 'pending', ?4, ?5, ?6, ?7, ?7)";
const I_ITEM: &str = "INSERT INTO job_items (tenant, job, id, row_index, input, status, updated_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6)";
const I_ATTEMPT: &str = "INSERT INTO job_attempts (tenant, job, item, number, worker, started_ms, outcome) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running')";
// `CAST(?3 AS TEXT)`: the new status is also compared with literals, and
// PostgreSQL wants its type spelt out there rather than inferred.
const U_JOB_STATUS: &str = "UPDATE jobs SET status = ?3, updated_ms = ?4, \
     started_ms = CASE WHEN CAST(?3 AS TEXT) = 'running' THEN COALESCE(started_ms, ?4) ELSE started_ms END, \
     ended_ms = CASE WHEN CAST(?3 AS TEXT) IN ('completed', 'failed', 'cancelled') THEN ?4 \
                     WHEN CAST(?3 AS TEXT) = 'running' THEN NULL ELSE ended_ms END \
     WHERE tenant = ?1 AND id = ?2";
const U_ITEM: &str = "UPDATE job_items SET status = ?4, attempts = ?5, last_error = ?6, result = ?7, \
     worker = ?8, not_before_ms = ?9, completed_ms = ?10, updated_ms = ?11 \
     WHERE tenant = ?1 AND job = ?2 AND id = ?3";
const U_ATTEMPT_END: &str = "UPDATE job_attempts SET ended_ms = ?5, outcome = ?6, error = ?7 \
     WHERE tenant = ?1 AND job = ?2 AND item = ?3 AND number = ?4 AND outcome = 'running'";

fn opt_agent<R: Row>(r: &R, i: usize, what: &'static str) -> Result<Option<AgentName>, R::Err> {
    match r.text_opt(i)? {
        Some(w) => Ok(Some(parse(what, w, AgentName::new)?)),
        None => Ok(None),
    }
}

fn job_from<R: Row>(r: &R) -> Result<Job, R::Err> {
    Ok(Job {
        tenant: parse("jobs.tenant", r.text(0)?, TenantId::new)?,
        id: r.text(1)?,
        owner: parse("jobs.owner", r.text(2)?, AgentName::new)?,
        status: parse("jobs.status", r.text(3)?, |s| JobStatus::parse(s).ok_or(()))?,
        spec: r.text(4)?,
        source: r.text_opt(5)?,
        total: narrow(r.int(6)?, "jobs.total")?,
        created_ms: r.int(7)?,
        started_ms: r.int_opt(8)?,
        ended_ms: r.int_opt(9)?,
        updated_ms: r.int(10)?,
    })
}

fn item_from<R: Row>(r: &R) -> Result<JobItem, R::Err> {
    Ok(JobItem {
        tenant: parse("job_items.tenant", r.text(0)?, TenantId::new)?,
        job: r.text(1)?,
        id: r.text(2)?,
        row_index: narrow(r.int(3)?, "job_items.row_index")?,
        input: r.text(4)?,
        status: parse("job_items.status", r.text(5)?, |s| {
            ItemStatus::parse(s).ok_or(())
        })?,
        attempts: narrow(r.int(6)?, "job_items.attempts")?,
        last_error: r.text_opt(7)?,
        result: r.text_opt(8)?,
        worker: opt_agent(r, 9, "job_items.worker")?,
        not_before_ms: r.int(10)?,
        completed_ms: r.int_opt(11)?,
    })
}

fn attempt_from<R: Row>(r: &R) -> Result<Attempt, R::Err> {
    Ok(Attempt {
        job: r.text(0)?,
        item: r.text(1)?,
        number: narrow(r.int(2)?, "job_attempts.number")?,
        worker: opt_agent(r, 3, "job_attempts.worker")?,
        started_ms: r.int(4)?,
        ended_ms: r.int_opt(5)?,
        outcome: parse("job_attempts.outcome", r.text(6)?, |s| {
            AttemptOutcome::parse(s).ok_or(())
        })?,
        error: r.text_opt(7)?,
    })
}

fn no_job(tenant: &TenantId, id: &str) -> StoreError {
    refused(Code::NotFound, format!("no job {id} in tenant {tenant}"))
}

/// Job `id`, if the tenant has it.
pub(crate) fn load_job<D: Db>(db: &D, tenant: &TenantId, id: &str) -> Result<Option<Job>, D::Err> {
    db.query_opt(Q_JOB, &[tenant.as_str().into(), id.into()], |r| job_from(r))
}

fn must_job<D: Db>(db: &D, tenant: &TenantId, id: &str) -> Result<Job, D::Err> {
    load_job(db, tenant, id)?.ok_or_else(|| no_job(tenant, id).into())
}

fn load_item<D: Db>(db: &D, tenant: &TenantId, job: &str, item: &str) -> Result<JobItem, D::Err> {
    let params = [tenant.as_str().into(), job.into(), item.into()];
    db.query_opt(Q_ITEM, &params, |r| item_from(r))?
        .ok_or_else(|| refused(Code::NotFound, format!("job {job} has no item {item}")).into())
}

fn item_move(it: &JobItem, to: ItemStatus) -> Result<ItemStatus, StoreError> {
    it.status.transition(to).map_err(|e| {
        refused(
            Code::Conflict,
            format!("job {} item {}: {e}", it.job, it.id),
        )
    })
}

fn set_item<D: Db>(db: &D, it: &JobItem, now_ms: i64) -> Result<(), D::Err> {
    db.exec(
        U_ITEM,
        &[
            it.tenant.as_str().into(),
            (&it.job).into(),
            (&it.id).into(),
            it.status.as_str().into(),
            it.attempts.into(),
            it.last_error.as_deref().into(),
            it.result.as_deref().into(),
            it.worker.as_ref().map(AgentName::as_str).into(),
            it.not_before_ms.into(),
            it.completed_ms.into(),
            now_ms.into(),
        ],
    )?;
    Ok(())
}

/// The item's current attempt, which must be running with this number.
fn current_attempt<D: Db>(db: &D, it: &JobItem, attempt: u32) -> Result<(), D::Err> {
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
        )
        .into());
    }
    let params = [
        it.tenant.as_str().into(),
        (&it.job).into(),
        (&it.id).into(),
        attempt.into(),
    ];
    let outcome = db.query_opt(Q_ATTEMPT_OUTCOME, &params, |r| r.text(0))?;
    if outcome.as_deref() != Some("running") {
        return Err(refused(
            Code::Conflict,
            format!("job {} item {}: attempt {attempt} has ended", it.job, it.id),
        )
        .into());
    }
    Ok(())
}

fn end_attempt<D: Db>(
    db: &D,
    it: &JobItem,
    attempt: u32,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now_ms: i64,
) -> Result<(), D::Err> {
    db.exec(
        U_ATTEMPT_END,
        &[
            it.tenant.as_str().into(),
            (&it.job).into(),
            (&it.id).into(),
            attempt.into(),
            now_ms.into(),
            outcome.as_str().into(),
            error.into(),
        ],
    )?;
    Ok(())
}

/// What [`create_job`] refuses before any transaction: no item, or two
/// items with one id.
pub(crate) fn check_new_job(job: &NewJob, items: &[NewItem]) -> Result<(), StoreError> {
    if items.is_empty() {
        return Err(refused(
            Code::BadRequest,
            format!("job {} has no item", job.id),
        ));
    }
    let mut ids = BTreeSet::new();
    for it in items {
        if !ids.insert(it.id.as_str()) {
            return Err(refused(
                Code::BadRequest,
                format!("job {}: two items have the id {:?}", job.id, it.id),
            ));
        }
    }
    Ok(())
}

/// [`crate::Jobs::create_job`] inside the store's transaction, after
/// [`check_new_job`].
pub(crate) fn create_job<D: Db>(
    db: &D,
    job: &NewJob,
    items: &[NewItem],
    events: &[NewEvent],
) -> Result<Job, D::Err> {
    let t = &job.tenant;
    if !db.exists(t, &job.owner)? {
        return Err(StoreError::NotFound {
            tenant: t.to_string(),
            name: job.owner.to_string(),
        }
        .into());
    }
    // Checked before the insert, not caught from it: on PostgreSQL a
    // failed statement aborts the whole transaction.
    if load_job(db, t, &job.id)?.is_some() {
        return Err(refused(
            Code::Conflict,
            format!("a job {} exists in tenant {t}", job.id),
        )
        .into());
    }
    check_json_object(|| format!("the spec of job {:?}", job.id), &job.spec, false)?;
    db.exec(
        I_JOB,
        &[
            t.as_str().into(),
            (&job.id).into(),
            job.owner.as_str().into(),
            (&job.spec).into(),
            job.source.as_deref().into(),
            int(items.len()),
            job.created_ms.into(),
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
                t.as_str().into(),
                (&job.id).into(),
                (&it.id).into(),
                it.row_index.into(),
                (&it.input).into(),
                job.created_ms.into(),
            ],
        )?;
    }
    db.append_events(t, events, job.created_ms)?;
    must_job(db, t, &job.id)
}

/// [`crate::Jobs::jobs`].
pub(crate) fn jobs<D: Db>(db: &D, tenant: &TenantId) -> Result<Vec<Job>, D::Err> {
    db.query(Q_JOBS, &[tenant.as_str().into()], |r| job_from(r))
}

/// [`crate::Jobs::set_job_status`] inside the store's transaction.
pub(crate) fn set_job_status<D: Db>(
    db: &D,
    tenant: &TenantId,
    id: &str,
    to: JobStatus,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<Job, D::Err> {
    let j = must_job(db, tenant, id)?;
    j.status
        .transition(to)
        .map_err(|e| refused(Code::Conflict, format!("job {id}: {e}")))?;
    db.exec(
        U_JOB_STATUS,
        &[
            tenant.as_str().into(),
            id.into(),
            to.as_str().into(),
            now_ms.into(),
        ],
    )?;
    db.append_events(tenant, events, now_ms)?;
    must_job(db, tenant, id)
}

/// [`crate::Jobs::job_items`].
pub(crate) fn job_items<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    status: Option<ItemStatus>,
) -> Result<Vec<JobItem>, D::Err> {
    must_job(db, tenant, job)?;
    let t = tenant.as_str();
    match status {
        Some(s) => db.query(
            Q_ITEMS_OF_STATUS,
            &[t.into(), job.into(), s.as_str().into()],
            |r| item_from(r),
        ),
        None => db.query(Q_ITEMS, &[t.into(), job.into()], |r| item_from(r)),
    }
}

/// [`crate::Jobs::next_pending_item`].
pub(crate) fn next_pending_item<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    now_ms: i64,
) -> Result<Option<JobItem>, D::Err> {
    let params = [tenant.as_str().into(), job.into(), now_ms.into()];
    db.query_opt(Q_NEXT_PENDING, &params, |r| item_from(r))
}

/// [`crate::Jobs::item_counts`]: every status, with 0 for those no item has.
pub(crate) fn item_counts<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
) -> Result<Vec<(ItemStatus, u32)>, D::Err> {
    must_job(db, tenant, job)?;
    let rows = db.query(Q_ITEM_COUNTS, &[tenant.as_str().into(), job.into()], |r| {
        Ok((r.text(0)?, narrow::<u32>(r.int(1)?, "job_items count")?))
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
}

/// [`crate::Jobs::start_attempt`] inside the store's transaction.
pub(crate) fn start_attempt<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    item: &str,
    worker: &AgentName,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<Attempt, D::Err> {
    let j = must_job(db, tenant, job)?;
    if j.status != JobStatus::Running {
        return Err(refused(
            Code::Conflict,
            format!(
                "job {job} is {}; attempts start only while it runs",
                j.status.as_str()
            ),
        )
        .into());
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
        )
        .into());
    }
    it.attempts += 1;
    it.worker = Some(worker.clone());
    set_item(db, &it, now_ms)?;
    db.exec(
        I_ATTEMPT,
        &[
            tenant.as_str().into(),
            job.into(),
            item.into(),
            it.attempts.into(),
            worker.as_str().into(),
            now_ms.into(),
        ],
    )?;
    db.append_events(tenant, events, now_ms)?;
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
}

/// [`crate::Jobs::report_result`] inside the store's transaction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn report_result<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    item: &str,
    attempt: u32,
    worker: &AgentName,
    result: &str,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<JobItem, D::Err> {
    let mut it = load_item(db, tenant, job, item)?;
    current_attempt(db, &it, attempt)?;
    if it.worker.as_ref() != Some(worker) {
        return Err(refused(
            Code::Conflict,
            format!(
                "job {job} item {item}: attempt {attempt} belongs to {}, not {worker}",
                it.worker.as_ref().map_or("nobody", AgentName::as_str)
            ),
        )
        .into());
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
    db.append_events(tenant, events, now_ms)?;
    Ok(it)
}

/// [`crate::Jobs::fail_attempt`] inside the store's transaction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fail_attempt<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    item: &str,
    attempt: u32,
    error: &str,
    max_attempts: u32,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<JobItem, D::Err> {
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
    db.append_events(tenant, events, now_ms)?;
    Ok(it)
}

/// [`crate::Jobs::retry_item`] inside the store's transaction.
pub(crate) fn retry_item<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    item: &str,
    now_ms: i64,
    events: &[NewEvent],
) -> Result<JobItem, D::Err> {
    let mut it = load_item(db, tenant, job, item)?;
    if it.status != ItemStatus::Failed {
        return Err(refused(
            Code::Conflict,
            format!(
                "job {job} item {item} is {}; only a failed item is retried",
                it.status.as_str()
            ),
        )
        .into());
    }
    it.status = item_move(&it, ItemStatus::Pending)?;
    it.not_before_ms = now_ms;
    set_item(db, &it, now_ms)?;
    db.append_events(tenant, events, now_ms)?;
    Ok(it)
}

/// [`crate::Jobs::attempts`].
pub(crate) fn attempts<D: Db>(
    db: &D,
    tenant: &TenantId,
    job: &str,
    item: &str,
) -> Result<Vec<Attempt>, D::Err> {
    load_item(db, tenant, job, item)?;
    let params = [tenant.as_str().into(), job.into(), item.into()];
    db.query(Q_ATTEMPTS, &params, |r| attempt_from(r))
}
