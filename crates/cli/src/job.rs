//! `brood job`: jobs (SPEC 10) through the API: create one from a file of
//! rows, start and cancel it, list them, show one with its counts, list its
//! items (docs/jobs.md).

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use serde_json::{Value, json};

use crate::Exit;
use crate::remote::{Remote, typed};

#[derive(Subcommand)]
pub enum JobCmd {
    /// Create a job: one instruction over every row of INPUT.
    Create {
        /// The agent the job belongs to (its workers will be its children).
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
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
        #[arg(long)]
        concurrency: Option<u32>,
        #[arg(long)]
        max_attempts: Option<u32>,
        #[arg(long)]
        item_timeout: Option<u64>,
        #[arg(long)]
        max_runtime: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Start a pending job: its workers are created as its owner's children.
    Start { id: String },
    /// Cancel a job: no more assignment, its workers cancelled, completed items kept.
    Cancel { id: String },
    /// The jobs, oldest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One job: its status, its settings, its items by status.
    Get {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// A job's items, in input order (one status with --status).
    Items {
        id: String,
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
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

fn line(j: &brood_api::JobView) -> String {
    let counts: Vec<String> = j
        .counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    format!("{}\t{}\t{}\t{}", j.id, j.owner, j.status, counts.join(", "))
}

pub async fn run(r: &Remote, cmd: JobCmd) -> Result<i32> {
    match cmd {
        JobCmd::Create {
            owner,
            id,
            instruction,
            input,
            input_format,
            id_column,
            schema,
            concurrency,
            max_attempts,
            item_timeout,
            max_runtime,
            json: as_json,
        } => {
            let text = read_file(&input, "the input")?;
            let format = input_format.or_else(|| {
                input
                    .extension()
                    .and_then(|e| e.to_str())
                    .filter(|e| matches!(*e, "csv" | "json" | "jsonl" | "ndjson"))
                    .map(str::to_owned)
            });
            let mut body = json!({"instruction": instruction, "input": text});
            let mut set = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    body[k] = v;
                }
            };
            set("owner", owner.map(Value::from));
            set("id", id.map(Value::from));
            set("input_format", format.map(Value::from));
            set("id_column", id_column.map(Value::from));
            set("concurrency", concurrency.map(Value::from));
            set("max_attempts", max_attempts.map(Value::from));
            set("item_timeout_s", item_timeout.map(Value::from));
            set("max_runtime_s", max_runtime.map(Value::from));
            if let Some(p) = schema {
                let s: Value = serde_json::from_str(&read_file(&p, "the schema")?)
                    .map_err(|e| Exit(2, format!("the schema {}: not JSON: {e}", p.display())))?;
                body["output_schema"] = s;
            }
            let v = r.call("POST", "/api/jobs", Some(body)).await?;
            let j: brood_api::JobView = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                println!("{}", line(&j));
            }
        }
        JobCmd::Start { id } => {
            let v = r
                .call("POST", &format!("/api/jobs/{id}/start"), None)
                .await?;
            println!("{}", line(&typed(&v)?));
        }
        JobCmd::Cancel { id } => {
            let v = r
                .call("POST", &format!("/api/jobs/{id}/cancel"), None)
                .await?;
            println!("{}", line(&typed(&v)?));
        }
        JobCmd::List { json: as_json } => {
            let v = r.call("GET", "/api/jobs", None).await?;
            let l: brood_api::JobList = typed(&v)?;
            if as_json {
                println!("{}", v["jobs"]);
            } else {
                for j in &l.jobs {
                    println!("{}", line(j));
                }
            }
        }
        JobCmd::Get { id, json: as_json } => {
            let v = r.call("GET", &format!("/api/jobs/{id}"), None).await?;
            let j: brood_api::JobView = typed(&v)?;
            if as_json {
                println!("{v}");
            } else {
                println!("{}", line(&j));
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
    }
    Ok(0)
}
