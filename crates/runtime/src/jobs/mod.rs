//! Jobs (SPEC 10), the runtime's side: a creation checked whole before
//! anything is written (the input read into rows with their ids, the
//! instruction's columns found in it, the output schema compiled, the
//! owner, every field in its range and the worker's program: `checks`,
//! and the tenant's limits), then recorded in one store transaction with
//! its `job.created` event; and the views every surface shows. A creation
//! blocks (it reads the input and writes every item): the surfaces run it
//! on a blocking thread (issue 24).
//!
//! A job is created `pending`; running it (items to workers, reports,
//! retries) is the supervisor's (`supervisor::jobs`). Replays, exports and
//! evidence bundles are read from the store and need no supervisor.

pub mod checks;
pub mod evidence;
pub mod export;
pub mod input;
pub mod schema;
pub mod template;

use std::collections::BTreeMap;

use brood_api as api;
use brood_core::{AgentName, Code, SessionName, TenantId};
use brood_store::{Job, JobItem, NewEvent, NewItem, NewJob, Store};
use serde_json::{Value, json};

use crate::api::{ApiError, Caller};
use crate::intake::Intake;

/// SPEC 10's defaults.
pub const DEFAULT_CONCURRENCY: u32 = 8;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
pub const DEFAULT_ITEM_TIMEOUT_S: u64 = 1800;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, m)
}

use checks::check_id;

/// [`create_at`] with this process's intake and the default limits (for
/// in-process callers: the demo, benchmarks, tests).
pub fn create(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    body: api::JobBody,
    now_ms: i64,
) -> Result<Job, ApiError> {
    let intake = Intake::for_process(crate::limits::Limits::default(), None);
    create_at(store, tenant, caller, body, now_ms, &intake)
}

/// Checks a creation whole at `intake` (its fields, its input within the item
/// limit, its worker's program, the tenant's limits) and records it: the job
/// (`pending`) and its items, or nothing. It blocks (it reads the whole
/// input and writes every item): callers run it off the async threads, and
/// the memory a large input took is given back to the system after it.
pub fn create_at(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    body: api::JobBody,
    now_ms: i64,
    intake: &Intake,
) -> Result<Job, ApiError> {
    let r = create_checked(store, tenant, caller, body, now_ms, intake);
    give_back();
    r
}

/// Returns the heap glibc keeps after a large input was read and freed
/// (issue 24 saw 28 MB become 454 MB and stay). `malloc_trim` gives back
/// the top of the main heap and the free chunks of every arena, but not the
/// top of a thread's own arena, where the rows of a blocking thread went:
/// glibc shrinks that only when a chunk of 64 KiB or more is freed into it
/// (`heap_trim`), which rows never are. One such chunk, taken and freed
/// here on the thread that did the work, makes it shrink.
fn give_back() {
    let nudge: Vec<u8> = Vec::with_capacity(96 * 1024);
    drop(std::hint::black_box(nudge));
    // SAFETY: malloc_trim only releases memory that is free; it touches no
    // memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn create_checked(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    body: api::JobBody,
    now_ms: i64,
    intake: &Intake,
) -> Result<Job, ApiError> {
    // The owner: an agent owns its own jobs; the operator names one.
    let owner = match (caller, &body.owner) {
        (Caller::Agent(me), None) => me.clone(),
        (Caller::Agent(me), Some(o)) if o == me.as_str() => me.clone(),
        (Caller::Agent(me), Some(o)) => {
            return Err(ApiError::new(
                Code::Forbidden,
                format!("agent {me} may create jobs only for itself, not for {o}"),
            ));
        }
        (Caller::User { .. }, Some(o)) => AgentName::new(o)
            .map_err(|e| ApiError::new(Code::InvalidName, format!("owner: {e}")))?,
        (Caller::User { .. }, None) => {
            return Err(bad(
                "owner: a job belongs to an agent (its workers are that agent's children); name one",
            ));
        }
    };
    let id = match &body.id {
        Some(i) => {
            check_id(i)?;
            i.clone()
        }
        None => format!("job-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]),
    };
    let format = match body.input_format.as_deref() {
        None => None,
        Some(f) => Some(
            input::Format::parse(f)
                .ok_or_else(|| bad(format!("input_format: {f:?} is not csv, json or jsonl")))?,
        ),
    };
    checks::check_fields(&body)?;
    let limit = intake.limits().items_per_job;
    let rows =
        input::read(&body.input, format, body.id_column.as_deref(), limit).map_err(
            |e| match e {
                input::InputError::TooMany { .. } => ApiError::new(Code::TooLarge, e.to_string()),
                input::InputError::Bad(m) => bad(m),
            },
        )?;
    let wanted = template::columns(&body.instruction).map_err(bad)?;
    let mut known: Vec<&str> = Vec::new();
    for r in &rows {
        for k in r.fields.keys() {
            if !known.contains(&k.as_str()) {
                known.push(k);
            }
        }
    }
    for c in &wanted {
        if !known.contains(&c.as_str()) {
            return Err(bad(format!(
                "instruction: the column {c:?} is not in the input (its columns: {})",
                known.join(", ")
            )));
        }
    }
    if let Some(schema) = &body.output_schema {
        compile_schema(schema).map_err(|e| bad(format!("output_schema: {e}")))?;
    }
    if let Some(w) = &body.worker {
        if let Some(argv) = &w.argv {
            intake.check_worker(store, tenant, &owner, argv, w.policy.as_ref())?;
        } else if let Some(p) = w.policy.as_ref().filter(|p| !p.is_null()) {
            brood_proto::policy::from_value(p).map_err(|e| bad(format!("worker.policy: {e}")))?;
        }
        if let Some(c) = &w.config {
            intake.check_worker_config(store, tenant, &owner, c, w.policy.as_ref())?;
        }
    }
    let spec = json!({
        "instruction": body.instruction,
        "id_column": body.id_column,
        "output_schema": body.output_schema,
        "worker": body.worker,
        "concurrency": body.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
        "max_attempts": body.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
        "item_timeout_s": body.item_timeout_s.unwrap_or(DEFAULT_ITEM_TIMEOUT_S),
        "max_runtime_s": body.max_runtime_s,
        "columns": known,
    });
    let items: Vec<NewItem> = rows
        .iter()
        .map(|r| NewItem {
            id: r.id.clone(),
            row_index: r.index,
            input: Value::Object(r.fields.clone()).to_string(),
        })
        .collect();
    let event = NewEvent {
        agent: owner.clone(),
        run: None,
        session: SessionName::default_session(),
        kind: "job.created".into(),
        payload:
            json!({"type": "job.created", "job": id, "owner": owner.as_str(), "items": items.len()})
                .to_string(),
    };
    let new = NewJob {
        tenant: tenant.clone(),
        id,
        owner,
        spec: spec.to_string(),
        source: None,
        created_ms: now_ms,
    };
    let _one = checks::CREATING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    checks::check_tenant(store, tenant, intake.limits(), items.len())?;
    store
        .create_job(&new, &items, &[event])
        .map_err(ApiError::from)
}

/// A new job from a recorded one (SPEC 10 "Replay"): its spec and inputs,
/// every item or only the failed ones, linked to it as its `source`, owned
/// by the same agent; created `pending`, or refused with nothing created.
pub fn replay(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    source: &str,
    body: &api::ReplayBody,
    now_ms: i64,
) -> Result<Job, ApiError> {
    let intake = Intake::for_process(crate::limits::Limits::default(), None);
    replay_at(store, tenant, caller, source, body, now_ms, &intake)
}

/// [`replay`] within `intake`'s limits (the tenant's, and items per job).
pub fn replay_at(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    source: &str,
    body: &api::ReplayBody,
    now_ms: i64,
    intake: &Intake,
) -> Result<Job, ApiError> {
    let src = get(store, tenant, caller, source)?;
    let only_failed = body.failed_only.unwrap_or(false);
    let filter = only_failed.then_some(brood_core::ItemStatus::Failed);
    let items: Vec<NewItem> = store
        .job_items(tenant, &src.id, filter)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|it| NewItem {
            id: it.id,
            row_index: it.row_index,
            input: it.input,
        })
        .collect();
    if items.is_empty() {
        // The request is well formed; the job, as it is, has nothing for it.
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "job {source} has no {}items to replay",
                if only_failed { "failed " } else { "" }
            ),
        ));
    }
    let limit = intake.limits().items_per_job;
    if items.len() > limit as usize {
        return Err(ApiError::new(
            Code::TooLarge,
            format!(
                "job {source} has {} items to replay; a job holds at most items_per_job = {limit}",
                items.len()
            ),
        ));
    }
    let id = match &body.id {
        Some(i) => {
            check_id(i)?;
            i.clone()
        }
        None => format!("job-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]),
    };
    let event = NewEvent {
        agent: src.owner.clone(),
        run: None,
        session: SessionName::default_session(),
        kind: "job.created".into(),
        payload: json!({"type": "job.created", "job": id, "owner": src.owner.as_str(),
                        "items": items.len(), "source": src.id, "failed_only": only_failed})
        .to_string(),
    };
    let new = NewJob {
        tenant: tenant.clone(),
        id,
        owner: src.owner.clone(),
        spec: src.spec.clone(),
        source: Some(src.id.clone()),
        created_ms: now_ms,
    };
    let _one = checks::CREATING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    checks::check_tenant(store, tenant, intake.limits(), items.len())?;
    store
        .create_job(&new, &items, &[event])
        .map_err(ApiError::from)
}

/// The jobs the caller may see, oldest first.
pub fn list(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
) -> Result<api::JobList, ApiError> {
    let mut jobs = Vec::new();
    for j in store.jobs(tenant).map_err(ApiError::from)? {
        if let Caller::Agent(me) = caller
            && !store
                .is_ancestor_or_self(tenant, me, &j.owner)
                .map_err(ApiError::from)?
        {
            continue;
        }
        jobs.push(view(store, &j)?);
    }
    Ok(api::JobList { jobs })
}

/// A job's items in input order, of one status when `status` names one.
pub fn items(
    store: &dyn Store,
    job: &Job,
    status: Option<&str>,
) -> Result<api::ItemList, ApiError> {
    let status = match status {
        None => None,
        Some(s) => Some(brood_core::ItemStatus::parse(s).ok_or_else(|| {
            bad(format!(
                "status: {s:?} is not pending, running, completed, failed or reported"
            ))
        })?),
    };
    let items = store
        .job_items(&job.tenant, &job.id, status)
        .map_err(ApiError::from)?;
    Ok(api::ItemList {
        items: items.iter().map(item_view).collect(),
    })
}

/// A job exported as `csv` or `jsonl` (SPEC 10 "Export").
pub fn export_text(store: &dyn Store, job: &Job, format: &str) -> Result<String, ApiError> {
    let f = export::Format::parse(format)
        .ok_or_else(|| bad(format!("format: {format:?} is not csv or jsonl")))?;
    export::export(store, job, f).map_err(|e| {
        tracing::error!(job = job.id, error = %e, "exporting a job");
        ApiError::new(Code::Internal, format!("exporting job {}: {e}", job.id))
    })
}

/// A job's evidence bundle, as the API carries it.
pub fn evidence_bundle(store: &dyn Store, job: &Job) -> Result<api::EvidenceBundle, ApiError> {
    let files = evidence::bundle(store, job).map_err(|e| {
        tracing::error!(job = job.id, error = %e, "a job's evidence");
        ApiError::new(
            Code::Internal,
            format!("the evidence of job {}: {e}", job.id),
        )
    })?;
    let files = files
        .into_iter()
        .map(|(path, bytes)| {
            String::from_utf8(bytes)
                .map(|content| api::EvidenceFile {
                    path: path.clone(),
                    content,
                })
                .map_err(|_| {
                    ApiError::new(Code::Internal, format!("evidence file {path} is not UTF-8"))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(api::EvidenceBundle {
        job: job.id.clone(),
        files,
    })
}

pub use schema::{compile as compile_schema, validate};

/// A job as the surfaces show it, with its counts.
pub fn view(store: &dyn Store, job: &Job) -> Result<api::JobView, ApiError> {
    let counts: BTreeMap<String, u32> = store
        .item_counts(&job.tenant, &job.id)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|(s, n)| (s.as_str().to_owned(), n))
        .collect();
    Ok(api::JobView {
        id: job.id.clone(),
        owner: job.owner.to_string(),
        status: job.status.as_str().to_owned(),
        total: job.total,
        counts,
        spec: shown_spec(&job.spec),
        source: job.source.clone(),
        created_ms: job.created_ms,
        started_ms: job.started_ms,
        ended_ms: job.ended_ms,
    })
}

/// A job's spec as it is shown (the view, the evidence bundle): its
/// workers' policy with the values of `env` hidden, as every policy is
/// shown (issue 25). The store keeps them: a worker is started with them.
pub fn shown_spec(spec: &str) -> Value {
    let mut v: Value = serde_json::from_str(spec).unwrap_or(Value::Null);
    if let Some(p) = v.get_mut("worker").and_then(|w| w.get_mut("policy")) {
        brood_proto::policy::hide_env(p);
    }
    v
}

pub fn item_view(it: &JobItem) -> api::ItemView {
    api::ItemView {
        id: it.id.clone(),
        row_index: it.row_index,
        status: it.status.as_str().to_owned(),
        attempts: it.attempts,
        last_error: it.last_error.clone(),
        result: it
            .result
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok()),
        worker: it.worker.as_ref().map(|w| w.to_string()),
        input: serde_json::from_str(&it.input).unwrap_or(Value::Null),
        completed_ms: it.completed_ms,
    }
}

/// A job the caller may see: an agent sees its own jobs (and its
/// descendants'); the operator every one.
pub fn get(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    id: &str,
) -> Result<Job, ApiError> {
    let job = store
        .job(tenant, id)
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::new(Code::NotFound, format!("no job {id}")))?;
    if let Caller::Agent(me) = caller {
        let mine = store
            .is_ancestor_or_self(tenant, me, &job.owner)
            .map_err(ApiError::from)?;
        if !mine {
            return Err(ApiError::new(
                Code::Forbidden,
                format!(
                    "job {id} belongs to {}, outside agent {me}'s subtree",
                    job.owner
                ),
            ));
        }
    }
    Ok(job)
}
