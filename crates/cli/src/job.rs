//! `brood job`: jobs (SPEC 10) through the API: create one from a file of
//! rows (and run it to its end), start, watch and cancel it, list them, show
//! one with its counts, list its items; assign, retry and report items;
//! export, write and verify evidence, replay (docs/jobs.md).

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use serde_json::{Value, json};

use crate::Exit;
use crate::remote::{Remote, typed};
use crate::render;

#[derive(Subcommand)]
pub enum JobCmd {
    /// Create a job: one instruction over every row of INPUT.
    Create {
        #[command(flatten)]
        spec: CreateArgs,
        /// Print the job as JSON instead of one line.
        #[arg(long)]
        json: bool,
    },
    /// Create a job, start it and watch it to its end (a progress bar on a
    /// terminal, lines otherwise); exit 0 completed, 1 failed, 130 cancelled.
    Run {
        #[command(flatten)]
        spec: CreateArgs,
    },
    /// Watch a job to its end: a progress bar on a terminal, a line a second
    /// otherwise; exit 0 completed, 1 failed, 130 cancelled.
    Watch {
        /// The job's id.
        id: String,
    },
    /// Start a pending job: its workers are created as its owner's children.
    Start {
        /// The job's id.
        id: String,
    },
    /// Cancel a job: no more assignment, its workers cancelled, completed items kept.
    Cancel {
        /// The job's id.
        id: String,
    },
    /// Remove a job that is not running (pending, completed, failed or
    /// cancelled): its items, attempts and its own workers' trees go, and
    /// its id is free again. A running job is refused: cancel it first.
    Rm {
        /// The job's id.
        id: String,
        /// The answer as JSON: {"job","status","agents"}.
        #[arg(long)]
        json: bool,
    },
    /// The jobs, oldest first.
    List {
        /// Print the jobs as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// One job: its status, its settings, its items by status.
    Get {
        /// The job's id.
        id: String,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A job's items, in input order (one status with --status).
    Items {
        /// The job's id.
        id: String,
        /// Only the items in this status: pending, running, completed,
        /// failed or reported.
        #[arg(long, value_name = "STATUS")]
        status: Option<String>,
        /// Print the items as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Start an item's next attempt now: on WORKER (an agent under the
    /// job's owner, which you then give the printed instruction), or on a
    /// new worker.
    Assign {
        /// The job's id.
        id: String,
        /// The item's id.
        item: String,
        /// The agent that takes the attempt (default: a new worker).
        #[arg(long, value_name = "NAME")]
        worker: Option<String>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A failed item back to pending (one more attempt), or every failed item
    /// without ITEM; a failed job reopens.
    Retry {
        /// The job's id.
        id: String,
        /// The item (default: every failed item).
        item: Option<String>,
    },
    /// A worker's report of its item's result (from inside the worker).
    Report {
        /// The job's id.
        id: String,
        /// The item's id.
        item: String,
        /// The result, as JSON.
        #[arg(long)]
        result: String,
        /// No next item wanted.
        #[arg(long)]
        stop: bool,
    },
    /// Export the items (CSV or JSON lines) to stdout or --out; with
    /// --evidence DIR also write the evidence bundle there.
    Export {
        /// The job's id.
        id: String,
        /// `csv` or `jsonl`.
        #[arg(long, default_value = "csv")]
        format: String,
        /// Write the items to this file (default: stdout).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Also write the evidence bundle (the spec, inputs, every attempt,
        /// a sha256 manifest) to this directory, new or empty, and check it.
        #[arg(long, value_name = "DIR")]
        evidence: Option<PathBuf>,
    },
    /// Check an evidence bundle against its manifest; names every file
    /// changed, added or removed (exit 1 when any).
    Verify {
        /// The bundle's directory (as `export --evidence` wrote it).
        dir: PathBuf,
    },
    /// A new job from a recorded one's spec and inputs (all items, or the
    /// failed ones with --failed), linked to it.
    Replay {
        /// The recorded job's id.
        id: String,
        /// Only the items that failed.
        #[arg(long)]
        failed: bool,
        /// The new job's id (default: one brood picks).
        #[arg(long = "new-id", value_name = "ID")]
        new_id: Option<String>,
        /// Start it at once.
        #[arg(long)]
        start: bool,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What a job is created from (`create` and `run`).
#[derive(clap::Args)]
pub struct CreateArgs {
    /// The agent the job belongs to (its workers will be its children);
    /// required of the operator, inside an agent the calling agent.
    #[arg(long, value_name = "NAME")]
    owner: Option<String>,
    /// The job's id (default: one brood picks).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// The template: `{column}` fills in a field, `{{` and `}}` are braces.
    #[arg(long)]
    instruction: String,
    /// CSV with headers, a JSON array or JSON lines; `-` for stdin.
    #[arg(long)]
    input: PathBuf,
    /// `csv`, `json` or `jsonl` (default: from the file's extension, else its text).
    #[arg(long)]
    input_format: Option<String>,
    /// The column holding each row's id (default: the row's place).
    #[arg(long)]
    id_column: Option<String>,
    /// A JSON Schema file every item's result must satisfy.
    #[arg(long)]
    schema: Option<PathBuf>,
    /// The worker program and its arguments, as a JSON array (default: `brood agent`).
    #[arg(long)]
    worker_argv: Option<String>,
    /// The workers' policy file (no more than the owner holds).
    #[arg(long)]
    worker_policy: Option<PathBuf>,
    /// The reference agent's type for the workers (explore, general, plan,
    /// code or research).
    #[arg(long, value_name = "TYPE")]
    worker_type: Option<String>,
    /// The reference agent's model for the default workers (`brood agent --model`).
    #[arg(long, value_name = "MODEL")]
    worker_model: Option<String>,
    /// The reference agent's provider for the default workers (`openai` or
    /// `script`; `brood agent --provider`).
    #[arg(long, value_name = "PROVIDER")]
    worker_provider: Option<String>,
    /// The reference agent's configuration file for the default workers
    /// (`brood agent --config`, docs/agent.md): provider, model, base URL,
    /// key variable, prices. Read by the workers, with their own rights.
    #[arg(long, value_name = "FILE")]
    worker_config: Option<PathBuf>,
    /// Workers at once, 1 to 1024 (default 8).
    #[arg(long, value_name = "N")]
    concurrency: Option<u32>,
    /// Attempts per item, 1 to 100 (default 3).
    #[arg(long, value_name = "N")]
    max_attempts: Option<u32>,
    /// How long one attempt may take before it is stopped and failed:
    /// seconds or with a unit (`90`, `30m`, `2h`; default 1800 s, 30 min).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::whole_seconds)]
    item_timeout: Option<u64>,
    /// How long the job may run before it fails and its workers are
    /// stopped: seconds or with a unit (`3600`, `8h`; default: no limit).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::whole_seconds)]
    max_runtime: Option<u64>,
}

impl CreateArgs {
    /// The `POST /api/jobs` body.
    fn body(self) -> Result<Value> {
        let text = read_file(&self.input, "the input")?;
        let format = self.input_format.or_else(|| {
            self.input
                .extension()
                .and_then(|e| e.to_str())
                .filter(|e| matches!(*e, "csv" | "json" | "jsonl" | "ndjson"))
                .map(str::to_owned)
        });
        let mut body = json!({"instruction": self.instruction, "input": text});
        let mut set = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                body[k] = v;
            }
        };
        set("owner", self.owner.map(Value::from));
        set("id", self.id.map(Value::from));
        set("input_format", format.map(Value::from));
        set("id_column", self.id_column.map(Value::from));
        set("concurrency", self.concurrency.map(Value::from));
        set("max_attempts", self.max_attempts.map(Value::from));
        set("item_timeout_s", self.item_timeout.map(Value::from));
        set("max_runtime_s", self.max_runtime.map(Value::from));
        if let Some(p) = self.schema {
            body["output_schema"] = read_json(&p, "the schema")?;
        }
        let mut worker = serde_json::Map::new();
        if let Some(a) = self.worker_argv {
            let argv: Vec<String> = serde_json::from_str(&a).map_err(|e| {
                Exit(
                    2,
                    format!("--worker-argv: not a JSON array of strings: {e}"),
                )
            })?;
            worker.insert("argv".into(), json!(argv));
        }
        if let Some(p) = self.worker_policy {
            worker.insert("policy".into(), read_json(&p, "the worker policy")?);
        }
        if let Some(t) = self.worker_type {
            worker.insert("type".into(), json!(t));
        }
        if let Some(m) = self.worker_model {
            worker.insert("model".into(), json!(m));
        }
        if let Some(p) = self.worker_provider {
            worker.insert("provider".into(), json!(p));
        }
        if let Some(c) = self.worker_config {
            // The workers read it where they run: give them the path the
            // caller meant, not one relative to the supervisor.
            let abs = crate::start::absolute(&c)?;
            if !abs.is_file() {
                return Err(Exit(2, format!("--worker-config {}: not a file", c.display())).into());
            }
            worker.insert("config".into(), json!(abs));
        }
        if !worker.is_empty() {
            body["worker"] = Value::Object(worker);
        }
        Ok(body)
    }
}

fn read_json(p: &PathBuf, what: &str) -> Result<Value> {
    serde_json::from_str(&read_file(p, what)?)
        .map_err(|e| Exit(2, format!("{what} {}: not JSON: {e}", p.display())).into())
}

fn read_file(p: &PathBuf, what: &str) -> Result<String> {
    if p.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map_err(|e| Exit(2, format!("reading {what} from stdin: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(p)
        .map_err(|e| Exit(2, format!("reading {what} {}: {e}", p.display())).into())
}

pub async fn run(r: &Remote, cmd: JobCmd) -> Result<i32> {
    match cmd {
        JobCmd::Create {
            spec,
            json: as_json,
        } => {
            let v = r.call("POST", "/api/jobs", Some(spec.body()?)).await?;
            let j: brood_api::JobView = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                println!("{}", render::job_line(&j));
            }
        }
        JobCmd::Run { spec } => {
            let v = r.call("POST", "/api/jobs", Some(spec.body()?)).await?;
            let j: brood_api::JobView = typed(&v)?;
            let started = r
                .call("POST", &format!("/api/jobs/{}/start", j.id), None)
                .await;
            if let Err(e) = started {
                // Nothing of a run that did not start is left behind (issue
                // 25): the job just created goes, so the same command can
                // run again once the cause is fixed.
                if let Err(undo) = r.call("DELETE", &format!("/api/jobs/{}", j.id), None).await {
                    eprintln!(
                        "brood: job {} was created but not started, and removing it failed: {undo:#}",
                        j.id
                    );
                }
                return Err(e);
            }
            return crate::job_watch::watch(r, &j.id).await;
        }
        JobCmd::Watch { id } => return crate::job_watch::watch(r, &id).await,
        JobCmd::Start { id } => {
            let v = r
                .call("POST", &format!("/api/jobs/{id}/start"), None)
                .await?;
            println!("{}", render::job_line(&typed(&v)?));
        }
        JobCmd::Cancel { id } => {
            let v = r
                .call("POST", &format!("/api/jobs/{id}/cancel"), None)
                .await?;
            println!("{}", render::job_line(&typed(&v)?));
        }
        JobCmd::Rm { id, json: as_json } => {
            let v = r.call("DELETE", &format!("/api/jobs/{id}"), None).await?;
            let gone: brood_api::RemovedJob = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                let n = gone.agents.len();
                println!(
                    "removed job {} ({}, {n} worker agent{})",
                    gone.job,
                    gone.status,
                    if n == 1 { "" } else { "s" }
                );
            }
        }
        JobCmd::List { json: as_json } => {
            let v = r.call("GET", "/api/jobs", None).await?;
            let l: brood_api::JobList = typed(&v)?;
            if as_json {
                println!("{}", v["jobs"]);
            } else {
                for j in &l.jobs {
                    println!("{}", render::job_line(j));
                }
            }
        }
        JobCmd::Get { id, json: as_json } => {
            let v = r.call("GET", &format!("/api/jobs/{id}"), None).await?;
            let j: brood_api::JobView = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                println!("{}", render::job_line(&j));
                println!(
                    "instruction: {}",
                    j.spec["instruction"].as_str().unwrap_or("")
                );
            }
        }
        JobCmd::Items {
            id,
            status,
            json: as_json,
        } => {
            let path = match &status {
                Some(s) => format!("/api/jobs/{id}/items?status={s}"),
                None => format!("/api/jobs/{id}/items"),
            };
            let v = r.call("GET", &path, None).await?;
            let l: brood_api::ItemList = typed(&v)?;
            if as_json {
                println!("{}", v["items"]);
            } else {
                for it in &l.items {
                    println!(
                        "{}\t{}\t{} attempts{}",
                        it.id,
                        it.status,
                        it.attempts,
                        it.last_error
                            .as_ref()
                            .map(|e| format!("\t{e}"))
                            .unwrap_or_default()
                    );
                }
            }
        }
        JobCmd::Assign {
            id,
            item,
            worker,
            json: as_json,
        } => {
            let body = match worker {
                Some(w) => json!({"worker": w}),
                None => json!({}),
            };
            let v = r
                .call(
                    "POST",
                    &format!("/api/jobs/{id}/items/{item}/assign"),
                    Some(body),
                )
                .await?;
            let a: brood_api::AssignReply = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                let attempt = a.assignment.as_ref().and_then(|x| x.attempt);
                println!(
                    "{item}\tattempt {}\t{}",
                    attempt.map_or("?".into(), |n| n.to_string()),
                    a.assigned
                );
                if let Some(i) = a.assignment.and_then(|x| x.instruction) {
                    println!("{i}");
                }
            }
        }
        JobCmd::Retry { id, item } => {
            let path = match &item {
                Some(i) => format!("/api/jobs/{id}/items/{i}/retry"),
                None => format!("/api/jobs/{id}/retry"),
            };
            let v = r.call("POST", &path, None).await?;
            let reply: brood_api::RetryReply = typed(&v)?;
            println!(
                "{} items back to pending: {}",
                reply.retried.len(),
                reply.retried.join(" ")
            );
        }
        JobCmd::Report {
            id,
            item,
            result,
            stop,
        } => {
            let result: Value = serde_json::from_str(&result)
                .map_err(|e| Exit(2, format!("--result: not JSON: {e}")))?;
            let v = r
                .call(
                    "POST",
                    &format!("/api/jobs/{id}/items/{item}/report"),
                    Some(json!({"result": result, "stop": stop})),
                )
                .await?;
            println!("{v}");
        }
        JobCmd::Export {
            id,
            format,
            out,
            evidence,
        } => {
            let v = r
                .call(
                    "GET",
                    &format!("/api/jobs/{id}/export?format={format}"),
                    None,
                )
                .await?;
            // The body is CSV or JSON lines; a one-line JSON-lines export
            // reads as one JSON value, so it is written back as its line.
            let text = match v {
                Value::String(s) => s,
                Value::Null => String::new(),
                other => format!("{other}\n"),
            };
            match &out {
                Some(p) => std::fs::write(p, &text)
                    .map_err(|e| Exit(1, format!("writing {}: {e}", p.display())))?,
                None => {
                    use std::io::Write;
                    let _ = std::io::stdout().write_all(text.as_bytes());
                }
            }
            if let Some(dir) = evidence {
                let v = r
                    .call("GET", &format!("/api/jobs/{id}/evidence"), None)
                    .await?;
                let b: brood_api::EvidenceBundle = typed(&v)?;
                let files: Vec<(String, Vec<u8>)> = b
                    .files
                    .into_iter()
                    .map(|f| (f.path, f.content.into_bytes()))
                    .collect();
                brood_runtime::jobs::evidence::write(&dir, &files)
                    .map_err(|e| Exit(1, format!("writing the evidence: {e}")))?;
                // What was written is checked at once, as `verify` would.
                let ok = brood_runtime::jobs::evidence::verify(&dir).map_err(|ps| {
                    let names: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
                    Exit(
                        1,
                        format!(
                            "the evidence written to {} does not verify: {}",
                            dir.display(),
                            names.join("; ")
                        ),
                    )
                })?;
                eprintln!(
                    "evidence of job {} written to {} ({} files, manifest checked)",
                    ok.job,
                    dir.display(),
                    ok.files
                );
            }
        }
        JobCmd::Verify { dir } => match brood_runtime::jobs::evidence::verify(&dir) {
            Ok(ok) => println!(
                "ok: the evidence of job {} in {}: {} files match the manifest",
                ok.job,
                dir.display(),
                ok.files
            ),
            Err(problems) => {
                for p in &problems {
                    println!("{p}");
                }
                return Err(Exit(
                    1,
                    format!(
                        "the evidence in {} does not verify: {} problems",
                        dir.display(),
                        problems.len()
                    ),
                )
                .into());
            }
        },
        JobCmd::Replay {
            id,
            failed,
            new_id,
            start,
            json: as_json,
        } => {
            let mut body = json!({"failed_only": failed, "start": start});
            if let Some(n) = new_id {
                body["id"] = json!(n);
            }
            let v = r
                .call("POST", &format!("/api/jobs/{id}/replay"), Some(body))
                .await?;
            let j: brood_api::JobView = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                println!("{}", render::job_line(&j));
            }
        }
    }
    Ok(0)
}
