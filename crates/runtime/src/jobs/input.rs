//! A job's input (SPEC 10): CSV with headers, a JSON array of objects, or
//! JSON lines, read into rows (JSON objects) with their ids. Every refusal
//! names what was wrong: the line, the column, the duplicate id.
//!
//! Reading stops at the item limit (issue 24): the text is read a row at a
//! time and the row past the limit ends it, so an input of a million tiny
//! rows costs no more than the limit's worth before it is refused. Only an
//! input given as a JSON array of objects is whole before it gets here (the
//! request body held it, within the body's 1 MiB); its length is checked
//! before a row is made of it.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why an input was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum InputError {
    /// Malformed: the message names the row, line or column.
    Bad(String),
    /// More rows than a job may hold.
    TooMany { limit: u32 },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputError::Bad(m) => f.write_str(m),
            InputError::TooMany { limit } => write!(
                f,
                "input: more than {limit} rows; a job holds at most items_per_job = {limit} items \
                 (split the input into several jobs)"
            ),
        }
    }
}

impl From<String> for InputError {
    fn from(m: String) -> InputError {
        InputError::Bad(m)
    }
}

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
/// with ids from `id_column` (a string or a number) or their place (1, 2, ...),
/// at most `max_items` of them.
pub fn read(
    input: &Value,
    format: Option<Format>,
    id_column: Option<&str>,
    max_items: u32,
) -> Result<Vec<Row>, InputError> {
    let limit = max_items as usize;
    let objects: Vec<Map<String, Value>> = match input {
        Value::Array(a) if a.len() > limit => {
            return Err(InputError::TooMany { limit: max_items });
        }
        Value::Array(a) => objects_of_array(a)?,
        Value::String(text) if text.trim().is_empty() => Vec::new(),
        Value::String(text) => match format.unwrap_or_else(|| Format::guess(text)) {
            Format::Json => json_array(text, limit)?,
            Format::JsonLines => json_lines(text, limit)?,
            Format::Csv => csv_rows(text, limit)?,
        },
        other => {
            return Err(InputError::Bad(format!(
                "input: give CSV or JSON lines as text, or an array of objects, not {}",
                kind(other)
            )));
        }
    };
    if objects.len() > limit {
        return Err(InputError::TooMany { limit: max_items });
    }
    if objects.is_empty() {
        // The API takes the input itself; a path is the CLI's to read
        // (`brood job create --input FILE`): the supervisor opens nothing
        // a caller names.
        if let Value::String(text) = input
            && looks_like_a_path(text)
        {
            return Err(InputError::Bad(format!(
                "input: {:?} looks like a file path; the API takes the input's text (CSV, JSON \
                 or JSON lines) or an array of objects, never a path (brood job create --input \
                 FILE reads the file and sends its text)",
                text.trim()
            )));
        }
        return Err(InputError::Bad(
            "input: no rows (an empty input, or a CSV with a header and nothing under it)".into(),
        ));
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
                    )
                    .into());
                }
                None => {
                    return Err(
                        format!("input row {}: no column {col:?} (the id_column)", i + 1).into(),
                    );
                }
            },
        };
        if id.len() > 256 || id.chars().any(char::is_control) {
            return Err(format!(
                "input row {}: the id {id:?} is longer than 256 bytes or holds control characters",
                i + 1
            )
            .into());
        }
        if !seen.insert(id.clone()) {
            return Err(format!("input row {}: the id {id:?} is used twice", i + 1).into());
        }
        // A NUL byte cannot be stored by PostgreSQL, nor given to a worker
        // as its task: refused here rather than at the first attempt.
        if let Some(col) = fields.iter().find_map(|(k, v)| holds_nul(k, v)) {
            return Err(format!("input row {}: the column {col:?} holds a NUL byte", i + 1).into());
        }
        rows.push(Row {
            id,
            index: i as u32,
            fields,
        });
    }
    Ok(rows)
}

/// The name of the first field (of `k: v`, nested values included) that
/// holds a NUL byte in a key or a string.
fn holds_nul(k: &str, v: &Value) -> Option<String> {
    let nul = |s: &str| s.contains('\0');
    if nul(k) {
        return Some(k.to_owned());
    }
    let inside = match v {
        Value::String(s) => nul(s),
        Value::Array(a) => a.iter().any(|x| holds_nul("", x).is_some()),
        Value::Object(o) => o.iter().any(|(k2, x)| holds_nul(k2, x).is_some()),
        _ => false,
    };
    inside.then(|| k.to_owned())
}

/// One line that names a file rather than holding rows: `/…`, `./…`,
/// `../…` or `~/…`, without a comma or a brace.
fn looks_like_a_path(text: &str) -> bool {
    let t = text.trim();
    !t.contains('\n')
        && !t.contains(',')
        && !t.contains('{')
        && ["/", "./", "../", "~/"].iter().any(|p| t.starts_with(p))
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

fn objects_of_array(a: &[Value]) -> Result<Vec<Map<String, Value>>, InputError> {
    a.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Object(o) => Ok(o.clone()),
            other => Err(InputError::Bad(format!(
                "input[{i}]: each row must be an object, not {}",
                kind(other)
            ))),
        })
        .collect()
}

/// A JSON array of objects read an element at a time, stopping at the
/// element past `limit` (which ends with an `over` error) instead of
/// holding the whole array first.
struct Capped<'a> {
    limit: usize,
    out: &'a mut Vec<Map<String, Value>>,
}

/// The message that says the limit stopped the read (never seen by a caller).
const OVER: &str = "brood: over the item limit";

impl<'de> DeserializeSeed<'de> for Capped<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Capped<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of objects")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(v) = seq.next_element::<Value>()? {
            if self.out.len() == self.limit {
                return Err(de::Error::custom(OVER));
            }
            match v {
                Value::Object(o) => self.out.push(o),
                other => {
                    return Err(de::Error::custom(format!(
                        "input[{}]: each row must be an object, not {}",
                        self.out.len(),
                        kind(&other)
                    )));
                }
            }
        }
        Ok(())
    }
}

fn json_array(text: &str, limit: usize) -> Result<Vec<Map<String, Value>>, InputError> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let read = Capped {
        limit,
        out: &mut out,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match read {
        Ok(()) => Ok(out),
        Err(e) if e.to_string().starts_with(OVER) => Err(InputError::TooMany {
            limit: limit as u32,
        }),
        Err(e) if e.to_string().starts_with("input[") => Err(InputError::Bad(e.to_string())),
        Err(e) => Err(InputError::Bad(format!(
            "input: not a JSON array of objects: {e}"
        ))),
    }
}

fn json_lines(text: &str, limit: usize) -> Result<Vec<Map<String, Value>>, InputError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if out.len() == limit {
            return Err(InputError::TooMany {
                limit: limit as u32,
            });
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(o)) => out.push(o),
            Ok(other) => {
                return Err(InputError::Bad(format!(
                    "input line {}: each line must be a JSON object, not {}",
                    i + 1,
                    kind(&other)
                )));
            }
            Err(e) => {
                return Err(InputError::Bad(format!(
                    "input line {}: not JSON: {e}",
                    i + 1
                )));
            }
        }
    }
    Ok(out)
}

fn csv_rows(text: &str, limit: usize) -> Result<Vec<Map<String, Value>>, InputError> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let headers: Vec<String> = r
        .headers()
        .map_err(|e| InputError::Bad(format!("input: the CSV header: {e}")))?
        .iter()
        .map(str::to_owned)
        .collect();
    if headers.iter().all(String::is_empty) {
        return Err(InputError::Bad("input: the CSV has no header".into()));
    }
    let mut names = BTreeSet::new();
    for h in &headers {
        if !names.insert(h.as_str()) {
            return Err(InputError::Bad(format!(
                "input: the CSV header names {h:?} twice"
            )));
        }
    }
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        if out.len() == limit {
            return Err(InputError::TooMany {
                limit: limit as u32,
            });
        }
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

    fn read_all(
        input: &Value,
        format: Option<Format>,
        id: Option<&str>,
    ) -> Result<Vec<Row>, String> {
        read(input, format, id, 100).map_err(|e| e.to_string())
    }

    #[test]
    fn reading_stops_at_the_item_limit_in_every_format() {
        let csv: String = std::iter::once("t\n".to_owned())
            .chain((0..10).map(|i| format!("{i}\n")))
            .collect();
        let jl: String = (0..10).map(|i| format!("{{\"t\": {i}}}\n")).collect();
        let arr = format!("[{}]", ["{}"; 10].join(","));
        let value = json!(vec![json!({}); 10]);
        for input in [json!(csv), json!(jl), json!(arr), value] {
            assert_eq!(read(&input, None, None, 10).unwrap().len(), 10);
            let e = read(&input, None, None, 9).unwrap_err();
            assert_eq!(e, InputError::TooMany { limit: 9 }, "{input}");
            assert!(e.to_string().contains("items_per_job = 9"), "{e}");
        }
    }

    #[test]
    fn a_path_is_named_as_one_and_nul_bytes_are_refused() {
        let e = read_all(&json!("/tmp/books.csv"), None, None).unwrap_err();
        assert!(e.contains("looks like a file path"), "{e}");
        let e = read_all(&json!([{"t": "a\u{0}b"}]), None, None).unwrap_err();
        assert!(
            e.contains("row 1") && e.contains("\"t\"") && e.contains("NUL"),
            "{e}"
        );
    }

    #[test]
    fn each_format_reads_into_rows_with_ids() {
        let csv = "id,text\nx1,hello\nx2,\"a, b\"\n";
        let rows = read_all(&json!(csv), None, Some("id")).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].id.as_str(), rows[1].index), ("x2", 1));
        assert_eq!(rows[1].fields["text"], "a, b");
        let jl = "{\"n\": 1, \"t\": \"a\"}\n\n{\"n\": 2, \"t\": \"b\"}\n";
        let rows = read_all(&json!(jl), None, Some("n")).unwrap();
        assert_eq!(
            rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["1", "2"]
        );
        let rows = read_all(&json!([{"t": "a"}, {"t": "b"}]), None, None).unwrap();
        assert_eq!(rows[1].id, "2", "without an id column, the place");
        let rows = read_all(&json!("[{\"t\": 1}]"), Some(Format::Json), None).unwrap();
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn bad_inputs_are_refused_naming_what_is_wrong() {
        let e = read_all(&json!(""), None, None).unwrap_err();
        assert!(e.contains("no rows"), "{e}");
        let e = read_all(&json!("id,text\n"), None, Some("id")).unwrap_err();
        assert!(e.contains("no rows"), "{e}");
        let e = read_all(&json!("name,text\na,b\n"), None, Some("id")).unwrap_err();
        assert!(e.contains("no column \"id\""), "{e}");
        let e = read_all(&json!("id,text\na,1\na,2\n"), None, Some("id")).unwrap_err();
        assert!(
            e.contains("row 2") && e.contains("\"a\" is used twice"),
            "{e}"
        );
        let e = read_all(&json!("{\"a\": 1}\n{\"a\": \n"), None, None).unwrap_err();
        assert!(e.starts_with("input line 2: not JSON"), "{e}");
        let e = read_all(&json!([1, 2]), None, None).unwrap_err();
        assert!(e.contains("input[0]"), "{e}");
        let e = read_all(&json!("a,a\n1,2\n"), None, None).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
