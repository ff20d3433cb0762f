//! `brood bench jobs`: items per second for a job with trivial workers
//! (SPEC 16), two ways, against the store alone in the same run:
//! - reused workers: `concurrency` test agents each take item after item
//!   through the reply to their `job.report`;
//! - a worker per item: each test agent reports one item with `stop` and
//!   ends, so every item costs a process (run with fewer items);
//! - the floor: the same store calls the reused run makes per item
//!   (`next_pending_item`, `start_attempt`, `report_result`, each with its
//!   event) on a fresh SQLite store, with no supervisor and no process. Its
//!   rate is the store's ceiling, and its time over the reused run's is the
//!   store's share of that run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use brood_api::{JobBody, WorkerBody};
use brood_core::{AgentName, ItemStatus, JobStatus, SessionName, TenantId};
use brood_runtime::{Caller, Supervisor};
use brood_store::prelude::*;
use brood_store::{NewAgent, NewEvent, SqliteStore};
use serde_json::{Value, json};

use super::req;

pub(super) struct Params {
    /// Items of the reused-worker run and of the store floor.
    pub items: usize,
    /// Items of the run with a new worker per item (0: not run).
    pub per_item: usize,
    pub concurrency: u32,
}

/// How often the job's record is read while it runs. Its duration is taken
/// from the record's own times, not from this poll, so the poll adds no error.
const POLL: Duration = Duration::from_millis(20);

const INSTRUCTION: &str = "Echo {text}";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `id,text` with rows `i{n},row {n}`: every item's instruction differs.
fn input(n: usize) -> String {
    let mut s = String::with_capacity(16 + n * 24);
    s.push_str("id,text\n");
    for i in 0..n {
        s.push_str(&format!("i{i},row {i}\n"));
    }
    s
}

fn body(id: &str, owner: &str, n: usize, argv: Vec<String>, concurrency: u32) -> JobBody {
    JobBody {
        id: Some(id.to_owned()),
        owner: Some(owner.to_owned()),
        instruction: INSTRUCTION.to_owned(),
        input: Value::String(input(n)),
        input_format: Some("csv".to_owned()),
        id_column: Some("id".to_owned()),
        output_schema: None,
        worker: Some(WorkerBody {
            kind: None,
            argv: Some(argv),
            ..WorkerBody::default()
        }),
        concurrency: Some(concurrency),
        // A trivial worker does not fail; one attempt makes a failure show
        // as a failed item (and a refused benchmark) instead of a retry
        // hidden inside the figure.
        max_attempts: Some(1),
        item_timeout_s: None,
        max_runtime_s: None,
    }
}

/// One measured job run.
struct Run {
    items: usize,
    /// From creation (the CSV read, the items recorded) to the job's end.
    total: Duration,
    /// From its start (`job.started`) to its end.
    running: Duration,
    /// Worker agents the job started.
    workers: usize,
}

impl Run {
    fn per_s(&self) -> f64 {
        self.items as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

/// What the store alone took for the same items.
struct Floor {
    items: usize,
    total: Duration,
    create: Duration,
    next_pending: Duration,
    start_attempt: Duration,
    report_result: Duration,
}

impl Floor {
    fn per_s(&self) -> f64 {
        self.items as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e3).round() / 1e3
}

fn us_per(d: Duration, n: usize) -> f64 {
    (d.as_secs_f64() * 1e7 / n.max(1) as f64).round() / 10.0
}

pub(super) async fn run(root: &Option<PathBuf>, exe: &str, p: &Params) -> Result<Value> {
    if p.items == 0 {
        bail!("bench jobs: --items must be at least 1");
    }
    let (sup, dir) = super::supervisor(root, "jobs").await?;
    // The floor first, with no supervisor work going on beside it (the
    // supervisor is idle: no agent is live yet), on the same file system as
    // the supervisor's own store.
    let floor = store_floor(&dir, p.items);
    let measured = match floor {
        Ok(floor) => with_supervisor(&sup, exe, p)
            .await
            .map(|(reused, per_item)| (floor, reused, per_item)),
        Err(e) => Err(e),
    };
    // Whatever happened, the supervisor is shut down: no worker outlives it.
    sup.shutdown().await;
    if root.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (floor, reused, per_item) = measured?;
    Ok(report(p, &floor, &reused, per_item.as_ref()))
}

async fn with_supervisor(sup: &Supervisor, exe: &str, p: &Params) -> Result<(Run, Option<Run>)> {
    let me = Caller::User {
        uid: crate::unsafe_uid(),
    };
    // The jobs' owner: workers are its children, so it must be a running
    // agent. The default max_tree_size (64) counts every agent ever created
    // under the root, ended workers included, so it would refuse the
    // per-item run's 64th worker; the bench supervisor's root has the
    // platform ceilings instead (`super::supervisor`): 100,000 in the tree,
    // 1,024 unfinished children, 4,096 at once, against `concurrency` live
    // workers and one worker per item at most.
    let owner = "bench-jobs-owner";
    let a = crate::api(
        sup.spawn(
            me.clone(),
            req(
                owner.to_owned(),
                None,
                vec![exe.to_owned(), "test-agent".into(), "--hang".into()],
                true,
            )?,
        )
        .await,
    )
    .context("starting the jobs' owner")?;
    if a.status == "failed" {
        bail!(
            "bench jobs: the owner failed to start: {}",
            serde_json::json!(a.detail)
        );
    }
    let worker = vec![exe.to_owned(), "test-agent".into(), "--job-worker".into()];
    let out = async {
        let reused = job(sup, &me, "bench-reused", owner, p.items, worker.clone(), p)
            .await
            .context("the reused-worker run")?;
        let per_item = if p.per_item == 0 {
            None
        } else {
            let mut argv = worker.clone();
            argv.push("--one-item".into());
            Some(
                job(sup, &me, "bench-per-item", owner, p.per_item, argv, p)
                    .await
                    .context("the worker-per-item run")?,
            )
        };
        Ok((reused, per_item))
    }
    .await;
    let owner = AgentName::new(owner)?;
    let _ = sup.cancel(me.clone(), owner.clone()).await;
    let _ = sup
        .wait(me, vec![owner], Some(Duration::from_secs(10)))
        .await;
    out
}

/// Creates, starts and runs one job to its end; refused unless every item
/// completed.
async fn job(
    sup: &Supervisor,
    me: &Caller,
    id: &str,
    owner: &str,
    n: usize,
    argv: Vec<String>,
    p: &Params,
) -> Result<Run> {
    let per_item = argv.iter().any(|a| a == "--one-item");
    let store = sup.store().clone();
    let tenant = sup.tenant().clone();
    let created = now_ms();
    let t0 = Instant::now();
    crate::api(brood_runtime::jobs::create(
        store.as_ref(),
        &tenant,
        me,
        body(id, owner, n, argv, p.concurrency),
        created,
    ))
    .with_context(|| format!("creating job {id} ({n} items)"))?;
    crate::api(sup.job_start(me.clone(), id.to_owned()).await)
        .with_context(|| format!("starting job {id}"))?;
    // A generous bound, so a job that stalls (a worker refused, a report
    // lost) ends the benchmark with its counts instead of hanging it.
    let limit = Duration::from_secs(120) + Duration::from_millis(100u64.saturating_mul(n as u64));
    let done = loop {
        let j = store
            .job(&tenant, id)
            .with_context(|| format!("reading job {id}"))?
            .ok_or_else(|| anyhow!("job {id} vanished from the store"))?;
        if j.status.is_finished() {
            break j;
        }
        if t0.elapsed() > limit {
            let _ = sup.job_cancel(me.clone(), id.to_owned()).await;
            bail!(
                "job {id} did not end within {} s: {}",
                limit.as_secs(),
                counts(store.as_ref(), &tenant, id)?
            );
        }
        tokio::time::sleep(POLL).await;
    };
    let item_counts: Vec<(ItemStatus, u32)> = store
        .item_counts(&tenant, id)
        .with_context(|| format!("counting job {id}'s items"))?;
    let ok: u32 = item_counts
        .iter()
        .filter(|(s, _)| matches!(s, ItemStatus::Completed | ItemStatus::Reported))
        .map(|(_, c)| c)
        .sum();
    // A benchmark that measured failures would report a rate of nothing.
    if done.status != JobStatus::Completed || ok as usize != n {
        bail!(
            "job {id} ended {} with {ok} of {n} items completed: {}",
            done.status.as_str(),
            counts(store.as_ref(), &tenant, id)?
        );
    }
    let prefix = format!("{id}-w");
    let workers = store
        .children(&tenant, &AgentName::new(owner)?)
        .with_context(|| format!("reading job {id}'s workers"))?
        .iter()
        .filter(|a| a.name.as_str().starts_with(&prefix))
        .count();
    // A worker per item means what it says: a worker that went on to a
    // second item would make this run measure the reused one again.
    if per_item && workers != n {
        bail!("job {id}: {workers} workers for {n} items, not one each");
    }
    let ended = done.ended_ms.unwrap_or_else(now_ms);
    let started = done.started_ms.unwrap_or(created);
    let span = |from: i64| Duration::from_millis(ended.saturating_sub(from).max(0) as u64);
    Ok(Run {
        items: n,
        total: span(created),
        running: span(started),
        workers,
    })
}

fn counts(store: &dyn brood_store::Store, tenant: &TenantId, id: &str) -> Result<String> {
    let c = store
        .item_counts(tenant, id)
        .with_context(|| format!("counting job {id}'s items"))?;
    Ok(c.iter()
        .map(|(s, n)| format!("{n} {}", s.as_str()))
        .collect::<Vec<_>>()
        .join(", "))
}

/// The store calls of the reused run, without the supervisor: the job
/// created by the same code from the same CSV, started, then per item the
/// next pending one read, its attempt started and its result reported, each
/// write with the event the supervisor records with it.
fn store_floor(dir: &Path, n: usize) -> Result<Floor> {
    let db = dir.join("jobs-floor.db");
    for suffix in ["", "-wal", "-shm"] {
        let mut f = db.clone().into_os_string();
        f.push(suffix);
        let _ = std::fs::remove_file(f);
    }
    let store =
        SqliteStore::open(&db).with_context(|| format!("opening the floor's store {db:?}"))?;
    let tenant = TenantId::for_uid(crate::unsafe_uid());
    let owner = AgentName::new("floor-owner")?;
    let session = SessionName::default_session();
    let run = brood_core::RunId::v7(now_ms() as u64, 0, u64::from(std::process::id()));
    // The owner exists and runs, as `create_job` and the runner need.
    store
        .admit(
            &NewAgent {
                tenant: tenant.clone(),
                name: owner.clone(),
                parent: None,
                customer: None,
                session: session.clone(),
                protocol: brood_store::Protocol::Brood,
                spec: json!({"argv": ["x"]}).to_string(),
                handoff: String::new(),
                supervisor: "bench".into(),
                run: run.clone(),
                now_ms: now_ms(),
            },
            &[],
        )
        .context("recording the floor's owner")?;
    store
        .start_run(&tenant, &owner, &run, 1, "", now_ms(), &[])
        .context("starting the floor's owner")?;
    let ev = |payload: Value| NewEvent {
        agent: owner.clone(),
        run: Some(run.clone()),
        session: session.clone(),
        kind: payload["type"].as_str().unwrap_or_default().to_owned(),
        payload: payload.to_string(),
    };
    let me = Caller::User {
        uid: crate::unsafe_uid(),
    };
    let id = "floor";
    let workers: Vec<AgentName> = (1..=8)
        .map(|w| AgentName::new(&format!("{id}-w{w}")))
        .collect::<Result<_, _>>()?;
    // Never run (the floor only times the store), but a creation's worker
    // program must resolve: this binary's test agent, as the real run's.
    let exe = std::env::current_exe()
        .context("the brood binary")?
        .display()
        .to_string();
    let worker = vec![exe, "test-agent".into(), "--job-worker".into()];
    let t0 = Instant::now();
    crate::api(brood_runtime::jobs::create(
        &store,
        &tenant,
        &me,
        body(id, owner.as_str(), n, worker, 8),
        now_ms(),
    ))
    .context("creating the floor's job")?;
    store
        .set_job_status(
            &tenant,
            id,
            JobStatus::Running,
            now_ms(),
            &[ev(json!({"type": "job.started", "job": id}))],
        )
        .context("starting the floor's job")?;
    let create = t0.elapsed();
    let (mut next_pending, mut start_attempt, mut report_result) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let result = json!({"echo": "Echo row 0"}).to_string();
    for k in 0..n {
        let worker = &workers[k % workers.len()];
        let t = Instant::now();
        let item = store
            .next_pending_item(&tenant, id, now_ms())
            .context("reading the floor's next pending item")?
            .ok_or_else(|| anyhow!("the floor's job has no pending item after {k} of {n}"))?;
        let t1 = Instant::now();
        let a = store
            .start_attempt(
                &tenant,
                id,
                &item.id,
                worker,
                now_ms(),
                &[ev(
                    json!({"type": "job.item.started", "job": id, "item": item.id, "attempt": item.attempts + 1, "worker": worker.as_str()}),
                )],
            )
            .with_context(|| format!("starting the floor's item {}", item.id))?;
        let t2 = Instant::now();
        store
            .report_result(
                &tenant,
                id,
                &item.id,
                a.number,
                worker,
                &result,
                now_ms(),
                &[ev(
                    json!({"type": "job.item.completed", "job": id, "item": item.id, "attempt": a.number, "worker": worker.as_str()}),
                )],
            )
            .with_context(|| format!("reporting the floor's item {}", item.id))?;
        let t3 = Instant::now();
        next_pending += t1 - t;
        start_attempt += t2 - t1;
        report_result += t3 - t2;
    }
    let total = t0.elapsed();
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let mut f = db.clone().into_os_string();
        f.push(suffix);
        let _ = std::fs::remove_file(f);
    }
    Ok(Floor {
        items: n,
        total,
        create,
        next_pending,
        start_attempt,
        report_result,
    })
}

fn report(p: &Params, floor: &Floor, reused: &Run, per_item: Option<&Run>) -> Value {
    // Per item, the store alone over the reused run: the share of that run
    // the store's own work accounts for. It is the same number as the rate
    // ratio (reused items/s over the floor's items/s).
    let ratio = reused.per_s() / floor.per_s().max(1e-9);
    let mut out = json!({
        "bench": "jobs",
        "concurrency": p.concurrency,
        "reused_items": reused.items,
        "reused_s": secs(reused.total),
        "reused_running_s": secs(reused.running),
        "reused_per_s": reused.per_s().round(),
        "reused_workers": reused.workers,
        "floor_items": floor.items,
        "floor_s": secs(floor.total),
        "floor_per_s": floor.per_s().round(),
        "floor_create_ms": ms(floor.create),
        "floor_next_pending_us": us_per(floor.next_pending, floor.items),
        "floor_start_attempt_us": us_per(floor.start_attempt, floor.items),
        "floor_report_result_us": us_per(floor.report_result, floor.items),
        "store_share_pct": (ratio * 1000.0).round() / 10.0,
        "ratio": (ratio * 100.0).round() / 100.0,
        "floor": "the same store calls per item (next_pending_item, start_attempt, report_result, each with its event) after the same creation, on a fresh SQLite store in the same directory, one thread, no supervisor, no process",
        "workers": "brood test-agent --job-worker (reports at once); per item: --one-item (reports with stop and ends)",
    });
    if let Some(r) = per_item {
        out["per_item_items"] = json!(r.items);
        out["per_item_s"] = json!(secs(r.total));
        out["per_item_per_s"] = json!(r.per_s().round());
        out["per_item_workers"] = json!(r.workers);
    }
    out
}

/// The human lines of [`report`]'s figures.
pub(super) fn print(v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    let c = v["concurrency"].as_u64().unwrap_or(0);
    println!(
        "jobs (reused workers, {c} at once): {} items in {:.2} s = {:.0} items/s ({:.2} s from the start; workers started: {})",
        f("reused_items"),
        f("reused_s"),
        f("reused_per_s"),
        f("reused_running_s"),
        f("reused_workers"),
    );
    if v.get("per_item_items").is_some() {
        println!(
            "jobs (a worker per item, {c} at once): {} items in {:.2} s = {:.0} items/s (fewer items: a process each; --per-item N)",
            f("per_item_items"),
            f("per_item_s"),
            f("per_item_per_s"),
        );
    }
    println!(
        "store alone (create, next_pending_item, start_attempt, report_result): {} items in {:.2} s = {:.0} items/s; store share of the reused run {:.0}%",
        f("floor_items"),
        f("floor_s"),
        f("floor_per_s"),
        f("store_share_pct"),
    );
    println!(
        "  per item: next_pending_item {} µs, start_attempt {} µs, report_result {} µs; creation {} ms",
        f("floor_next_pending_us"),
        f("floor_start_attempt_us"),
        f("floor_report_result_us"),
        f("floor_create_ms"),
    );
    println!("ratio reused/store-floor: {:.2}x", f("ratio"));
}
