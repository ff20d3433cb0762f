//! A job's items as a table (SPEC 10 "Export"): CSV with the input columns
//! then `job_id item_id row_index status attempt_count last_error
//! result_json completed_at`, or JSON lines with the same facts and the input
//! as an object. One row per item, in input order.

use brood_store::{Job, JobItem, Store};
use serde_json::{Map, Value, json};

use brood_core::time::rfc3339_utc_ms;

/// The columns every CSV export ends with, after the input's own.
pub const FIXED_COLUMNS: [&str; 8] = [
    "job_id",
    "item_id",
    "row_index",
    "status",
    "attempt_count",
    "last_error",
    "result_json",
    "completed_at",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Jsonl,
}

impl Format {
    /// `csv`, or `jsonl` (also spelt `json-lines` / `ndjson`).
    pub fn parse(s: &str) -> Option<Format> {
        match s.to_ascii_lowercase().as_str() {
            "csv" => Some(Format::Csv),
            "jsonl" | "json-lines" | "ndjson" => Some(Format::Jsonl),
            _ => None,
        }
    }
}

/// The job's items in `format`, every line ending in `\n`.
pub fn export(store: &dyn Store, job: &Job, format: Format) -> Result<String, String> {
    let items = store
        .job_items(&job.tenant, &job.id, None)
        .map_err(|e| format!("job {}: reading its items: {e}", job.id))?;
    let rows = items
        .iter()
        .map(|it| Row::of(job, it))
        .collect::<Result<Vec<_>, _>>()?;
    match format {
        Format::Csv => csv_text(job, &rows),
        Format::Jsonl => {
            let mut out = String::new();
            for r in &rows {
                out.push_str(&r.json().to_string());
                out.push('\n');
            }
            Ok(out)
        }
    }
}

/// One item, its stored JSON texts parsed.
struct Row<'a> {
    job: &'a Job,
    item: &'a JobItem,
    input: Map<String, Value>,
    result: Option<Value>,
}

impl<'a> Row<'a> {
    fn of(job: &'a Job, item: &'a JobItem) -> Result<Row<'a>, String> {
        // The store refuses an input that is not an object and a result that
        // is not JSON, so either failing here means a corrupt record: named,
        // not papered over, since an export is evidence.
        let input = match serde_json::from_str::<Value>(&item.input) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(format!(
                    "job {} item {}: its input is not a JSON object",
                    job.id, item.id
                ));
            }
            Err(e) => {
                return Err(format!(
                    "job {} item {}: its input is not JSON: {e}",
                    job.id, item.id
                ));
            }
        };
        let result = match &item.result {
            None => None,
            Some(r) => Some(serde_json::from_str::<Value>(r).map_err(|e| {
                format!(
                    "job {} item {}: its result is not JSON: {e}",
                    job.id, item.id
                )
            })?),
        };
        Ok(Row {
            job,
            item,
            input,
            result,
        })
    }

    fn completed_at(&self) -> Option<String> {
        self.item.completed_ms.map(rfc3339_utc_ms)
    }

    fn json(&self) -> Value {
        json!({
            "job_id": self.job.id,
            "item_id": self.item.id,
            "row_index": self.item.row_index,
            "status": self.item.status.as_str(),
            "attempt_count": self.item.attempts,
            "last_error": self.item.last_error,
            "result": self.result,
            "completed_at": self.completed_at(),
            "input": self.input,
        })
    }
}

/// The input's columns in order: the spec's `columns` (written at creation
/// in the order the input had them), else, for a spec without them, every key
/// of the items' inputs in the order first seen.
fn columns(job: &Job, rows: &[Row]) -> Vec<String> {
    let spec: Value = serde_json::from_str(&job.spec).unwrap_or(Value::Null);
    if let Some(cols) = spec.get("columns").and_then(Value::as_array) {
        return cols
            .iter()
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect();
    }
    let mut seen: Vec<String> = Vec::new();
    for r in rows {
        for k in r.input.keys() {
            if !seen.contains(k) {
                seen.push(k.clone());
            }
        }
    }
    seen
}

/// A field of the input as a cell: a string as its text, any other value as
/// its JSON text, a missing field empty.
fn cell(v: Option<&Value>) -> String {
    match v {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn csv_text(job: &Job, rows: &[Row]) -> Result<String, String> {
    let cols = columns(job, rows);
    let failed = |e: csv::Error| format!("job {}: writing its CSV export: {e}", job.id);
    let mut w = csv::Writer::from_writer(Vec::new());
    // An input column named like a fixed one (say `status`) is still written,
    // under its own name before the fixed columns: the header then names it
    // twice, and a reader tells them apart by position. Renaming either would
    // make the export disagree with the input or with SPEC 10.
    let header = cols
        .iter()
        .map(String::as_str)
        .chain(FIXED_COLUMNS)
        .collect::<Vec<_>>();
    w.write_record(&header).map_err(failed)?;
    for r in rows {
        let mut rec: Vec<String> = cols.iter().map(|c| cell(r.input.get(c))).collect();
        rec.extend([
            r.job.id.clone(),
            r.item.id.clone(),
            r.item.row_index.to_string(),
            r.item.status.as_str().to_owned(),
            r.item.attempts.to_string(),
            r.item.last_error.clone().unwrap_or_default(),
            r.result.as_ref().map(Value::to_string).unwrap_or_default(),
            r.completed_at().unwrap_or_default(),
        ]);
        w.write_record(&rec).map_err(failed)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| format!("job {}: finishing its CSV export: {e}", job.id))?;
    String::from_utf8(bytes)
        .map_err(|e| format!("job {}: its CSV export is not UTF-8: {e}", job.id))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use brood_core::{AgentName, JobStatus, RunId, SessionName, TenantId};
    use brood_store::prelude::*;
    use brood_store::{NewAgent, NewEvent, NewItem, NewJob, Protocol, SqliteStore};

    pub(crate) fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    fn event(agent: &AgentName, kind: &str, job: &str) -> NewEvent {
        NewEvent {
            agent: agent.clone(),
            run: None,
            session: SessionName::default_session(),
            kind: kind.to_owned(),
            payload: json!({"type": kind, "job": job}).to_string(),
        }
    }

    fn admit(store: &SqliteStore, t: &TenantId, n: &str, parent: Option<&str>, seq: u64) {
        let new = NewAgent {
            tenant: t.clone(),
            name: name(n),
            parent: parent.map(name),
            customer: None,
            session: SessionName::default_session(),
            protocol: Protocol::Brood,
            spec: r#"{"argv":["/bin/true"],"env":{},"cwd":"/"}"#.to_owned(),
            handoff: format!("task of {n}"),
            supervisor: "sup".to_owned(),
            run: RunId::v7(1_700_000_000_000 + seq, 0, seq),
            now_ms: 1_700_000_000_000,
        };
        let a = store.admit(&new, &[]).unwrap();
        store
            .start_run(t, &a.name, &a.run, 42, "/cg", 1_700_000_000_001, &[])
            .unwrap();
    }

    /// A store with a running owner `lead`, its worker `books-w1`, and a
    /// running job `books` of two items: `a` completed by `books-w1`, `b`
    /// failed once by `ghost` (a worker with no record). Another job's
    /// events are in the same log.
    pub(crate) fn fixture() -> (tempfile::TempDir, SqliteStore, Job) {
        let d = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&d.path().join("brood.db")).unwrap();
        let t = TenantId::new("t").unwrap();
        admit(&store, &t, "lead", None, 1);
        admit(&store, &t, "books-w1", Some("lead"), 2);
        let lead = name("lead");
        let spec = json!({"instruction": "Summarise {title}", "columns": ["id", "title", "n"]});
        let new = |id: &str| NewJob {
            tenant: t.clone(),
            id: id.to_owned(),
            owner: lead.clone(),
            spec: spec.to_string(),
            source: None,
            created_ms: 1_700_000_000_100,
        };
        let items = [
            NewItem {
                id: "a".into(),
                row_index: 1,
                input: json!({"id": "a", "title": "Emma, a \"novel\"", "n": 3}).to_string(),
            },
            NewItem {
                id: "b".into(),
                row_index: 2,
                input: json!({"id": "b", "title": "Dune"}).to_string(),
            },
        ];
        let ev = |k: &str, j: &str| [event(&lead, k, j)];
        store
            .create_job(&new("books"), &items, &ev("job.created", "books"))
            .unwrap();
        store
            .create_job(&new("other"), &items[..1], &ev("job.created", "other"))
            .unwrap();
        let at = 1_779_720_714_123; // 2026-05-25T14:51:54.123Z
        store
            .set_job_status(
                &t,
                "books",
                JobStatus::Running,
                at,
                &ev("job.started", "books"),
            )
            .unwrap();
        let w1 = name("books-w1");
        store.start_attempt(&t, "books", "a", &w1, at, &[]).unwrap();
        store
            .report_result(
                &t,
                "books",
                "a",
                1,
                &w1,
                r#"{"summary": "ok, \"fine\""}"#,
                at,
                &[],
            )
            .unwrap();
        let ghost = name("ghost");
        store
            .start_attempt(&t, "books", "b", &ghost, at, &[])
            .unwrap();
        let failed = ev("job.item.failed", "books");
        store
            .fail_attempt(&t, "books", "b", 1, "timed out", 1, at + 5, &failed)
            .unwrap();
        let job = store.job(&t, "books").unwrap().unwrap();
        (d, store, job)
    }

    #[test]
    fn formats_parse() {
        assert_eq!(Format::parse("CSV"), Some(Format::Csv));
        assert_eq!(Format::parse("jsonl"), Some(Format::Jsonl));
        assert_eq!(Format::parse("xml"), None);
    }

    #[test]
    fn csv_round_trips_commas_and_quotes() {
        let (_d, store, job) = fixture();
        let text = export(&store, &job, Format::Csv).unwrap();
        let mut r = csv::Reader::from_reader(text.as_bytes());
        let header: Vec<String> = r.headers().unwrap().iter().map(str::to_owned).collect();
        assert_eq!(
            header,
            [
                "id",
                "title",
                "n",
                "job_id",
                "item_id",
                "row_index",
                "status",
                "attempt_count",
                "last_error",
                "result_json",
                "completed_at"
            ]
        );
        let rows: Vec<Vec<String>> = r
            .records()
            .map(|x| x.unwrap().iter().map(str::to_owned).collect())
            .collect();
        assert_eq!(
            rows[0],
            [
                "a",
                "Emma, a \"novel\"",
                "3",
                "books",
                "a",
                "1",
                "completed",
                "1",
                "",
                r#"{"summary":"ok, \"fine\""}"#,
                "2026-05-25T14:51:54.123Z"
            ]
        );
        assert_eq!(
            rows[1],
            [
                "b",
                "Dune",
                "",
                "books",
                "b",
                "2",
                "failed",
                "1",
                "timed out",
                "",
                ""
            ]
        );
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn jsonl_lines_parse() {
        let (_d, store, job) = fixture();
        let text = export(&store, &job, Format::Jsonl).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        let keys: Vec<&str> = lines[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "job_id",
                "item_id",
                "row_index",
                "status",
                "attempt_count",
                "last_error",
                "result",
                "completed_at",
                "input"
            ]
        );
        assert_eq!(lines[0]["result"], json!({"summary": "ok, \"fine\""}));
        assert_eq!(lines[0]["input"]["title"], "Emma, a \"novel\"");
        assert_eq!(lines[0]["completed_at"], "2026-05-25T14:51:54.123Z");
        assert_eq!(lines[1]["status"], "failed");
        assert_eq!(lines[1]["last_error"], "timed out");
        assert_eq!(lines[1]["result"], Value::Null);
    }

    #[test]
    fn a_column_named_like_a_fixed_one_is_written_twice() {
        let (_d, store, mut job) = fixture();
        job.spec = json!({"columns": ["status", "title"]}).to_string();
        let text = export(&store, &job, Format::Csv).unwrap();
        let first = text.lines().next().unwrap();
        assert!(first.starts_with("status,title,job_id,"), "{first}");
        assert_eq!(first.matches("status").count(), 2, "{first}");
    }
}
