//! `brood job watch` (and the end of `brood job run`): a job followed to its
//! end. On a terminal a progress bar (indicatif) with the counts by status
//! and an ETA; otherwise a plain line whenever the counts change, at most
//! one a second, so a log or a pipe reads well. The exit code says how it
//! ended: 0 completed, 1 failed, 130 cancelled (as `brood wait` does).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Result;
use brood_api::JobView;
use indicatif::{ProgressBar, ProgressStyle};

use crate::remote::{Remote, typed};

/// How often the job is read: often enough for a bar that moves, rarely
/// enough to cost the supervisor nothing.
const POLL: Duration = Duration::from_millis(250);

fn done(j: &JobView) -> u64 {
    ["completed", "failed", "reported"]
        .iter()
        .map(|s| u64::from(j.counts.get(*s).copied().unwrap_or(0)))
        .sum()
}

fn counts(j: &JobView) -> String {
    j.counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn watch(r: &Remote, id: &str) -> Result<i32> {
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut bar: Option<ProgressBar> = None;
    let mut last_line: (String, Option<Instant>) = (String::new(), None);
    let mut first_done: Option<u64> = None;
    loop {
        let v = r.call("GET", &format!("/api/jobs/{id}"), None).await?;
        let j: JobView = typed(&v)?;
        let d = done(&j);
        let base = *first_done.get_or_insert(d);
        if tty {
            let b = bar.get_or_insert_with(|| {
                let b = ProgressBar::new(u64::from(j.total));
                let style = ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
                b.set_style(style);
                b.set_prefix(id.to_owned());
                b
            });
            // The message first: each call redraws, and the count should
            // never run ahead of the words beside it.
            b.set_message(counts(&j));
            b.set_position(d);
        } else {
            let text = format!("{}\t{}\t{}/{}\t{}", j.id, j.status, d, j.total, counts(&j));
            let finished = matches!(j.status.as_str(), "completed" | "failed" | "cancelled");
            if text != last_line.0
                && (finished
                    || last_line
                        .1
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(1)))
            {
                // The ETA from the rate seen while watching.
                let rate = (d - base) as f64 / started.elapsed().as_secs_f64().max(0.001);
                let left = u64::from(j.total).saturating_sub(d);
                let eta = if finished || left == 0 {
                    String::new()
                } else if rate > 0.0 {
                    format!("\teta {:.0}s", left as f64 / rate)
                } else {
                    "\teta ?".into()
                };
                println!("{text}{eta}");
                last_line = (text, Some(Instant::now()));
            }
        }
        match j.status.as_str() {
            "completed" | "failed" | "cancelled" => {
                if let Some(b) = bar.take() {
                    b.finish_with_message(format!("{} ({})", counts(&j), j.status));
                }
                if tty {
                    println!("{}", crate::render::job_line(&j));
                }
                if j.counts.get("failed").copied().unwrap_or(0) > 0 {
                    failed_attempts(r, id).await;
                }
                return Ok(match j.status.as_str() {
                    "completed" => 0,
                    "failed" => 1,
                    _ => 130,
                });
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// The failed items printed in full, at most this many.
const SHOWN_FAILED: usize = 10;

/// Why each failed item failed, attempt by attempt, on stderr (issue 25:
/// the worker's own detail is in each attempt's error).
async fn failed_attempts(r: &Remote, id: &str) {
    let Ok(v) = r
        .call("GET", &format!("/api/jobs/{id}/items?status=failed"), None)
        .await
    else {
        return;
    };
    let Ok(l) = typed::<brood_api::ItemList>(&v) else {
        return;
    };
    for it in l.items.iter().take(SHOWN_FAILED) {
        eprintln!("brood: item {} failed:", it.id);
        let path = format!("/api/ui/jobs/{id}/items/{}/attempts", it.id);
        let attempts = match r.call("GET", &path, None).await {
            Ok(v) => typed::<brood_api::AttemptList>(&v).map(|a| a.attempts),
            Err(e) => Err(e),
        };
        match attempts {
            Ok(a) => {
                for at in a.iter().filter(|a| a.outcome == "failed") {
                    eprintln!(
                        "  attempt {}{}: {}",
                        at.number,
                        at.worker
                            .as_ref()
                            .map(|w| format!(" ({w})"))
                            .unwrap_or_default(),
                        at.error.as_deref().unwrap_or("-").trim_end()
                    );
                }
            }
            Err(_) => eprintln!("  {}", it.last_error.as_deref().unwrap_or("-")),
        }
    }
    if l.items.len() > SHOWN_FAILED {
        eprintln!(
            "brood: … and {} more failed items (brood job items {id} --status failed)",
            l.items.len() - SHOWN_FAILED
        );
    }
}
