//! A job's input (SPEC 10): CSV with headers, a JSON array of objects, or
//! JSON lines, read into rows (JSON objects) with their ids. Every refusal
//! names what was wrong: the line, the column, the duplicate id.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// One row of input: its id, its place, its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub index: u32,
    pub fields: Map<String, Value>,
}

/// How the input is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Json,
    JsonLines,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            "jsonl" | "ndjson" => Some(Format::JsonLines),
            _ => None,
        }
    }

    /// What text looks like: a JSON array, JSON lines (the first line an
    /// object), else CSV.
    pub fn guess(text: &str) -> Format {
        let t = text.trim_start();
        if t.starts_with('[') {
            Format::Json
        } else if t.starts_with('{') {
            Format::JsonLines
        } else {
            Format::Csv
        }
    }
}

/// The rows of `input` (text in `format`, or a JSON array already parsed),
/// with ids from `id_column` (a string or a number) or their place (1, 2, ...).
pub fn read(
    input: &Value,
    format: Option<Format>,
    id_column: Option<&str>,
) -> Result<Vec<Row>, String> {
    let objects: Vec<Map<String, Value>> = match input {
        Value::Array(a) => objects_of_array(a)?,
        Value::String(text) if text.trim().is_empty() => Vec::new(),
        Value::String(text) => match format.unwrap_or_else(|| Format::guess(text)) {
            Format::Json => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| format!("input: not a JSON array: {e}"))?;
                match v {
                    Value::Array(a) => objects_of_array(&a)?,
                    other => {
                        return Err(format!(
                            "input: a JSON input must be an array of objects, not {}",
                            kind(&other)
                        ));
                    }
                }
            }
            Format::JsonLines => json_lines(text)?,
            Format::Csv => csv_rows(text)?,
        },
        other => {
            return Err(format!(
                "input: give CSV or JSON lines as text, or an array of objects, not {}",
                kind(other)
            ));
        }
    };
    if objects.is_empty() {
        return Err(
            "input: no rows (an empty input, or a CSV with a header and nothing under it)".into(),
        );
    }
    let mut seen = BTreeSet::new();
    let mut rows = Vec::with_capacity(objects.len());
    for (i, fields) in objects.into_iter().enumerate() {
        let id = match id_column {
            None => (i + 1).to_string(),
            Some(col) => match fields.get(col) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(other) => {
                    return Err(format!(
                        "input row {}: id_column {col:?} must be a non-empty string or a number, not {other}",
                        i + 1
                    ));
                }
                None => {
                    return Err(format!(
                        "input row {}: no column {col:?} (the id_column)",
                        i + 1
                    ));
                }
            },
        };
        if id.len() > 256 || id.chars().any(char::is_control) {
            return Err(format!(
                "input row {}: the id {id:?} is longer than 256 bytes or holds control characters",
                i + 1
            ));
        }
        if !seen.insert(id.clone()) {
            return Err(format!("input row {}: the id {id:?} is used twice", i + 1));
        }
        rows.push(Row {
            id,
            index: i as u32,
            fields,
        });
    }
    Ok(rows)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn objects_of_array(a: &[Value]) -> Result<Vec<Map<String, Value>>, String> {
    a.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Object(o) => Ok(o.clone()),
            other => Err(format!(
                "input[{i}]: each row must be an object, not {}",
                kind(other)
            )),
        })
        .collect()
}

fn json_lines(text: &str) -> Result<Vec<Map<String, Value>>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(o)) => out.push(o),
            Ok(other) => {
                return Err(format!(
                    "input line {}: each line must be a JSON object, not {}",
                    i + 1,
                    kind(&other)
                ));
            }
            Err(e) => return Err(format!("input line {}: not JSON: {e}", i + 1)),
        }
    }
    Ok(out)
}

fn csv_rows(text: &str) -> Result<Vec<Map<String, Value>>, String> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let headers: Vec<String> = r
        .headers()
        .map_err(|e| format!("input: the CSV header: {e}"))?
        .iter()
        .map(str::to_owned)
        .collect();
    if headers.iter().all(String::is_empty) {
        return Err("input: the CSV has no header".into());
    }
    let mut names = BTreeSet::new();
    for h in &headers {
        if !names.insert(h.as_str()) {
            return Err(format!("input: the CSV header names {h:?} twice"));
        }
    }
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| format!("input: CSV row {}: {e}", i + 1))?;
        let mut o = Map::new();
        for (h, v) in headers.iter().zip(rec.iter()) {
            o.insert(h.clone(), Value::String(v.to_owned()));
        }
        out.push(o);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_format_reads_into_rows_with_ids() {
        let csv = "id,text\nx1,hello\nx2,\"a, b\"\n";
        let rows = read(&json!(csv), None, Some("id")).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].id.as_str(), rows[1].index), ("x2", 1));
        assert_eq!(rows[1].fields["text"], "a, b");
        let jl = "{\"n\": 1, \"t\": \"a\"}\n\n{\"n\": 2, \"t\": \"b\"}\n";
        let rows = read(&json!(jl), None, Some("n")).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["1", "2"]
        );
        let rows = read(&json!([{"t": "a"}, {"t": "b"}]), None, None).unwrap();
        assert_eq!(rows[1].id, "2", "without an id column, the place");
        let rows = read(&json!("[{\"t\": 1}]"), Some(Format::Json), None).unwrap();
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn bad_inputs_are_refused_naming_what_is_wrong() {
        let e = read(&json!(""), None, None).unwrap_err();
        assert!(e.contains("no rows"), "{e}");
        let e = read(&json!("id,text\n"), None, Some("id")).unwrap_err();
        assert!(e.contains("no rows"), "{e}");
        let e = read(&json!("name,text\na,b\n"), None, Some("id")).unwrap_err();
        assert!(e.contains("no column \"id\""), "{e}");
        let e = read(&json!("id,text\na,1\na,2\n"), None, Some("id")).unwrap_err();
        assert!(
            e.contains("row 2") && e.contains("\"a\" is used twice"),
            "{e}"
        );
        let e = read(&json!("{\"a\": 1}\n{\"a\": \n"), None, None).unwrap_err();
        assert!(e.starts_with("input line 2: not JSON"), "{e}");
        let e = read(&json!([1, 2]), None, None).unwrap_err();
        assert!(e.contains("input[0]"), "{e}");
        let e = read(&json!("a,a\n1,2\n"), None, None).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
