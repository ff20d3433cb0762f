//! Part 4 of the demo: a job (SPEC 10). One instruction over 24 rows of a
//! CSV, run by reused workers, four at a time, that are the owner's
//! children; three rows fail their first attempt and are retried, one fails
//! every attempt and ends `failed` with both attempts kept. A worker whose
//! attempt fails ends with it and another takes its place, so more than four
//! run in all (how many depends on timing; the demo counts them). Then the
//! results exported as CSV and the evidence bundle written and verified, as
//! `brood job export --evidence` and `brood job verify` do, and the owner's
//! tree drawn with its workers.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brood_core::{AgentName, ItemStatus};
use brood_runtime::{Caller, Supervisor};
use serde_json::json;

use super::spawn_req;

const ROWS: usize = 24;
/// Workers at once (the job's `concurrency`).
const AT_ONCE: u32 = 4;

pub(super) async fn part4(
    sup: &Supervisor,
    me: &Caller,
    root: &Path,
    work: &Path,
    exe: &str,
) -> Result<()> {
    println!(
        "\nbrood demo, part 4: a job of {ROWS} rows run by reused workers, {AT_ONCE} at a time"
    );
    let owner = AgentName::new("batch")?;
    let mut r = spawn_req(
        owner.as_str(),
        vec![exe.to_owned(), "test-agent".into(), "--hang".into()],
        "Own the demo's job.",
    )?;
    r.await_ready = true;
    crate::api(sup.spawn(me.clone(), r).await)?;
    let mut csv = String::from("id,city\n");
    let cities = [
        "Lisbon", "Oslo", "Quito", "Hanoi", "Accra", "Lima", "Perth", "Riga",
    ];
    for i in 0..ROWS {
        let city = cities[i % cities.len()];
        let mark = match i {
            5 | 11 | 17 => " FAIL-ONCE",
            20 => " FAIL-ALWAYS",
            _ => "",
        };
        csv.push_str(&format!("c{i:02},{city}{mark}\n"));
    }
    let marks = work.join("job-marks");
    std::fs::create_dir_all(&marks)?;
    let body: brood_api::JobBody = serde_json::from_value(json!({
        "id": "cities", "owner": owner.as_str(), "instruction": "Describe {city}",
        "input": csv, "id_column": "id", "concurrency": AT_ONCE, "max_attempts": 2,
        "worker": {"argv": [exe, "test-agent", "--job-worker", "--item-delay", "40",
                            "--fail-first", marks.display().to_string(), "--fail-marked-only"]},
    }))?;
    let store = sup.store().clone();
    let job = brood_runtime::jobs::create(store.as_ref(), sup.tenant(), me, body, 0)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::api(sup.job_start(me.clone(), job.id.clone()).await)?;
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let j = store
            .job(sup.tenant(), &job.id)?
            .context("the demo's job")?;
        let counts = store.item_counts(sup.tenant(), &job.id)?;
        let line: Vec<String> = counts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| format!("{n} {}", s.as_str()))
            .collect();
        let line = format!(
            "  {:>5.1} s  {}: {}",
            started.elapsed().as_secs_f64(),
            j.status.as_str(),
            line.join(", ")
        );
        if line[9..] != *last.get(9..).unwrap_or("") {
            println!("{line}");
            last = line;
        }
        if j.status.is_finished() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the demo's job did not finish in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let items = store.job_items(sup.tenant(), &job.id, None)?;
    let retried = items
        .iter()
        .filter(|i| i.status == ItemStatus::Completed && i.attempts > 1)
        .count();
    let workers = store
        .children(sup.tenant(), &owner)?
        .iter()
        .filter(|a| a.name.as_str().starts_with("cities-w"))
        .count();
    for it in items.iter().filter(|i| i.status == ItemStatus::Failed) {
        println!(
            "  item {} failed after {} attempts: {}",
            it.id,
            it.attempts,
            it.last_error.as_deref().unwrap_or("")
        );
    }
    println!(
        "  {} items completed ({retried} after a retry) by {workers} workers, each attempt kept",
        items
            .iter()
            .filter(|i| i.status == ItemStatus::Completed)
            .count()
    );
    let j = store
        .job(sup.tenant(), &job.id)?
        .context("the demo's job")?;
    let csv_out = root.join("cities.csv");
    let text = brood_runtime::jobs::export_text(store.as_ref(), &j, "csv")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::write(&csv_out, &text)?;
    let evidence = root.join("cities-evidence");
    let files = brood_runtime::jobs::evidence::bundle(store.as_ref(), &j)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    brood_runtime::jobs::evidence::write(&evidence, &files).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ok = brood_runtime::jobs::evidence::verify(&evidence).map_err(|ps| {
        anyhow::anyhow!(
            "{}",
            ps.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        )
    })?;
    println!("  results: {} (first rows below)", csv_out.display());
    for l in text.lines().take(3) {
        println!("    {l}");
    }
    println!(
        "  evidence: {} ({} files, sha256 manifest verified; try brood job verify {})",
        evidence.display(),
        ok.files,
        evidence.display()
    );
    sup.flush().await;
    println!();
    super::draw(
        sup,
        &owner,
        false,
        "the job's owner and its workers (a worker ends with a failed attempt; another takes its place)",
    )?;
    crate::api(sup.cancel(me.clone(), owner).await)?;

    Ok(())
}
