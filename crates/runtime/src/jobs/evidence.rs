//! A job's evidence bundle (SPEC 10 "Export", `--evidence`): the job's spec,
//! its inputs and their hashes, its items, every attempt, its events, its
//! workers' session references, and `manifest.json` with the SHA-256 of every
//! other file, which [`verify`] checks against a directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

use brood_core::AgentName;
use brood_store::{Job, Store};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::export::{self, Format};
use brood_core::time::rfc3339_utc_ms;

pub const MANIFEST: &str = "manifest.json";
/// Events read from the owner's log per call.
const EVENT_PAGE: u32 = 1000;

/// SHA-256 in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn pretty(what: &str, v: &Value) -> Result<Vec<u8>, String> {
    let mut out = serde_json::to_vec_pretty(v).map_err(|e| format!("{what}: {e}"))?;
    out.push(b'\n');
    Ok(out)
}

fn lines(vals: &[Value]) -> Vec<u8> {
    let mut out = String::new();
    for v in vals {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

/// The files of the job's bundle, as paths relative to its directory, with
/// `manifest.json` last.
pub fn bundle(store: &dyn Store, job: &Job) -> Result<Vec<(String, Vec<u8>)>, String> {
    let (t, id) = (&job.tenant, job.id.as_str());
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    serde_json::from_str::<Value>(&job.spec)
        .map_err(|e| format!("job {id}: its spec is not JSON: {e}"))?;
    // As the job's view shows it: its workers' `env` values hidden.
    let spec = super::shown_spec(&job.spec);
    let record = json!({
        "id": id, "tenant": t.as_str(), "owner": job.owner.as_str(),
        "status": job.status.as_str(), "spec": spec, "source": job.source,
        "created_ms": job.created_ms, "started_ms": job.started_ms,
        "ended_ms": job.ended_ms, "total": job.total,
    });
    files.push(("job.json".into(), pretty("job.json", &record)?));

    let items = store
        .job_items(t, id, None)
        .map_err(|e| format!("job {id}: reading its items: {e}"))?;
    let mut inputs = Vec::new();
    let mut hashes = Map::new();
    for it in &items {
        let input: Value = serde_json::from_str(&it.input)
            .map_err(|e| format!("job {id} item {}: its input is not JSON: {e}", it.id))?;
        // The stored text is the input's canonical form: what was recorded
        // at creation, byte for byte.
        let h = sha256_hex(it.input.as_bytes());
        inputs.push(json!({"id": it.id, "row_index": it.row_index, "input": input, "sha256": h}));
        hashes.insert(it.id.clone(), Value::String(h));
    }
    let inputs = lines(&inputs);
    let hashes = json!({"items": hashes, "all": sha256_hex(&inputs)});
    files.push(("inputs.jsonl".into(), inputs));
    let hashes = pretty("input-hashes.json", &hashes)?;
    files.push(("input-hashes.json".into(), hashes));

    let exported = export::export(store, job, Format::Jsonl)?;
    files.push(("items.jsonl".into(), exported.into_bytes()));

    let mut attempts = Vec::new();
    let mut workers: Vec<AgentName> = Vec::new();
    for it in &items {
        let of = store
            .attempts(t, id, &it.id)
            .map_err(|e| format!("job {id} item {}: reading its attempts: {e}", it.id))?;
        for a in of {
            if let Some(w) = a.worker.as_ref().filter(|w| !workers.contains(w)) {
                workers.push(w.clone());
            }
            attempts.push(json!({
                "job": a.job, "item": a.item, "number": a.number,
                "worker": a.worker.as_ref().map(AgentName::as_str),
                "started_ms": a.started_ms, "ended_ms": a.ended_ms,
                "outcome": a.outcome.as_str(), "error": a.error,
            }));
        }
    }
    files.push(("attempts.jsonl".into(), lines(&attempts)));
    files.push(("events.jsonl".into(), lines(&events(store, job)?)));
    let workers = json!({"workers": worker_entries(store, job, &workers)?});
    files.push(("workers.json".into(), pretty("workers.json", &workers)?));

    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let sums: Map<String, Value> = files
        .iter()
        .map(|(p, b)| (p.clone(), Value::String(sha256_hex(b))))
        .collect();
    let created = rfc3339_utc_ms(now_ms);
    let manifest = json!({"job": id, "created": created, "algorithm": "sha256", "files": sums});
    files.push((MANIFEST.into(), pretty(MANIFEST, &manifest)?));
    Ok(files)
}

/// The job's events: in its owner's log among the owner's others, told
/// apart by their kind (`job.*`) and their payload's `job`. Read in pages
/// until the log is exhausted.
fn events(store: &dyn Store, job: &Job) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .events(&job.tenant, after, Some(&job.owner), EVENT_PAGE)
            .map_err(|e| format!("job {}: reading {}'s event log: {e}", job.id, job.owner))?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        after = last.seq;
        for e in page.iter().filter(|e| e.kind.starts_with("job.")) {
            let Ok(payload) = serde_json::from_str::<Value>(&e.payload) else {
                continue;
            };
            if payload.get("job").and_then(Value::as_str) == Some(job.id.as_str()) {
                out.push(json!({
                    "sequence": e.seq, "event_id": format!("{}-{}", e.tenant, e.seq),
                    "kind": e.kind, "ts_ms": e.ts_ms, "payload": payload,
                }));
            }
        }
    }
}

/// Each worker's session reference: its record, its runs and its ctx path.
fn worker_entries(store: &dyn Store, job: &Job, names: &[AgentName]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for w in names {
        let failed = |what: &str, e| format!("job {}: reading worker {w}'s {what}: {e}", job.id);
        let ctx = format!("ctx/agent/{w}");
        let agent = store
            .agent(&job.tenant, w)
            .map_err(|e| failed("record", e))?;
        let Some(agent) = agent else {
            // A worker's record can be gone; the bundle says so rather than
            // failing the whole export.
            let missing = format!("no agent record named {w}");
            out.push(json!({"name": w.as_str(), "missing": missing, "ctx": ctx}));
            continue;
        };
        let runs = store.runs(&job.tenant, w).map_err(|e| failed("runs", e))?;
        let runs: Vec<Value> = runs
            .iter()
            .map(|r| {
                let outcome = r.outcome.map(|o| o.encode());
                json!({"id": r.id.as_str(), "seq": r.seq, "started_ms": r.started_ms,
                       "ended_ms": r.ended_ms, "outcome": outcome})
            })
            .collect();
        out.push(json!({
            "name": w.as_str(), "status": agent.status.encode(),
            "session": agent.session.as_str(), "runs": runs, "ctx": ctx,
        }));
    }
    Ok(out)
}

/// A relative path of plain components (no `..`, no root, not empty).
fn plain(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Writes the bundle into `dir`, which must not exist or be an empty
/// directory. Each file is created new (`O_EXCL`: never through a link).
pub fn write(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), String> {
    if let Some((rel, _)) = files.iter().find(|(p, _)| !plain(p)) {
        return Err(format!("{rel:?} is not a relative path inside the bundle"));
    }
    let d = dir.display();
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {
            let mut entries = fs::read_dir(dir).map_err(|e| format!("reading {d}: {e}"))?;
            if entries.next().is_some() {
                return Err(format!(
                    "{d} is not empty: an evidence bundle needs a directory of its own"
                ));
            }
        }
        Ok(_) => return Err(format!("{d} exists and is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(|e| format!("creating {d}: {e}"))?;
        }
        Err(e) => return Err(format!("{d}: {e}")),
    }
    for (rel, bytes) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A bundle that checked out: its job and how many files the manifest names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub job: String,
    pub files: usize,
}

/// What is wrong with a bundle; paths are relative to its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// In the manifest, but its bytes hash otherwise (or it is no longer a
    /// regular file).
    Changed(String),
    /// In the directory, not in the manifest (a symlink or other non-regular
    /// file included).
    Added(String),
    /// In the manifest, missing from the directory.
    Removed(String),
    /// `manifest.json` missing, unreadable or not of the expected form.
    BadManifest(String),
    /// A file or directory that could not be read, and why.
    Unreadable(String, String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Changed(p) => write!(f, "changed: {p} (sha256 mismatch)"),
            Problem::Added(p) => write!(f, "added: {p} (not in the manifest)"),
            Problem::Removed(p) => write!(f, "removed: {p} (in the manifest, missing)"),
            Problem::BadManifest(why) => write!(f, "bad manifest: {why}"),
            Problem::Unreadable(p, why) => write!(f, "unreadable: {p} ({why})"),
        }
    }
}

/// What the directory holds, by relative path: `true` for a regular file.
fn walk(root: &Path, rel: &str, found: &mut BTreeMap<String, bool>, problems: &mut Vec<Problem>) {
    let unreadable = |e: std::io::Error| {
        let shown = if rel.is_empty() { "." } else { rel };
        Problem::Unreadable(shown.to_owned(), e.to_string())
    };
    let entries = match fs::read_dir(root.join(rel)) {
        Ok(e) => e,
        Err(e) => return problems.push(unreadable(e)),
    };
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return problems.push(unreadable(e)),
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        // `DirEntry::file_type` does not follow a symlink.
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(root, &path, found, problems),
            Ok(t) => {
                found.insert(path, t.is_file());
            }
            Err(e) => problems.push(Problem::Unreadable(path, e.to_string())),
        }
    }
}

/// The SHA-256 of a regular file, opened without following a link.
fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// The manifest's job and its files (path to hex SHA-256).
fn manifest(dir: &Path) -> Result<(String, BTreeMap<String, String>), String> {
    let path = dir.join(MANIFEST);
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f: File| f.read_to_string(&mut text))
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{MANIFEST} is not JSON: {e}"))?;
    let job = v
        .get("job")
        .and_then(Value::as_str)
        .ok_or(format!("{MANIFEST} names no job"))?;
    match v.get("algorithm").and_then(Value::as_str) {
        Some("sha256") => {}
        other => return Err(format!("{MANIFEST}: algorithm {other:?} is not \"sha256\"")),
    }
    let listed = v
        .get("files")
        .and_then(Value::as_object)
        .ok_or(format!("{MANIFEST} has no files object"))?;
    let mut files = BTreeMap::new();
    for (p, h) in listed {
        let hex_digit = |b: u8| matches!(b, b'0'..=b'9' | b'a'..=b'f');
        let h = h
            .as_str()
            .filter(|h| h.len() == 64 && h.bytes().all(hex_digit));
        let Some(h) = h else {
            return Err(format!(
                "{MANIFEST}: the hash of {p:?} is not 64 lowercase hex digits"
            ));
        };
        if !plain(p) || p == MANIFEST {
            return Err(format!("{MANIFEST}: {p:?} is not a file of the bundle"));
        }
        files.insert(p.clone(), h.to_owned());
    }
    Ok((job.to_owned(), files))
}

/// Checks `dir` against its manifest: every file named there present, a
/// regular file, with its hash, and no other file. Every problem is
/// reported, not just the first.
pub fn verify(dir: &Path) -> Result<Verified, Vec<Problem>> {
    let (job, listed) = manifest(dir).map_err(|e| vec![Problem::BadManifest(e)])?;
    let mut problems = Vec::new();
    let mut found = BTreeMap::new();
    walk(dir, "", &mut found, &mut problems);
    found.remove(MANIFEST);
    let names: BTreeSet<&String> = listed.keys().chain(found.keys()).collect();
    for p in names {
        match (listed.get(p), found.get(p)) {
            (Some(_), None) => problems.push(Problem::Removed(p.clone())),
            (None, Some(_)) => problems.push(Problem::Added(p.clone())),
            (Some(_), Some(false)) => problems.push(Problem::Changed(p.clone())),
            (Some(want), Some(true)) => match hash_file(&dir.join(p)) {
                Ok(got) if &got == want => {}
                Ok(_) => problems.push(Problem::Changed(p.clone())),
                Err(e) => problems.push(Problem::Unreadable(p.clone(), e.to_string())),
            },
            (None, None) => {}
        }
    }
    if problems.is_empty() {
        Ok(Verified {
            job,
            files: listed.len(),
        })
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::export::tests::fixture;

    type Files = Vec<(String, Vec<u8>)>;

    fn written() -> (tempfile::TempDir, std::path::PathBuf, Files) {
        let (d, store, job) = fixture();
        let files = bundle(&store, &job).unwrap();
        let dir = d.path().join("evidence");
        write(&dir, &files).unwrap();
        (d, dir, files)
    }

    fn file<'a>(files: &'a Files, name: &str) -> &'a str {
        let (_, b) = files.iter().find(|(p, _)| p == name).unwrap();
        std::str::from_utf8(b).unwrap()
    }

    fn jsonl(files: &Files, name: &str) -> Vec<Value> {
        let lines = file(files, name).lines();
        lines.map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn json_file(files: &Files, name: &str) -> Value {
        serde_json::from_str(file(files, name)).unwrap()
    }

    /// `verify`'s problems as it shows them.
    fn shown(dir: &Path) -> Vec<String> {
        let problems = verify(dir).unwrap_err();
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_bundle_holds_the_jobs_record_and_verifies() {
        let (_d, dir, files) = written();
        let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        let want = "job.json inputs.jsonl input-hashes.json items.jsonl attempts.jsonl \
                    events.jsonl workers.json manifest.json";
        assert_eq!(names.join(" "), want);
        let job = json_file(&files, "job.json");
        assert_eq!((&job["id"], &job["total"]), (&json!("books"), &json!(2)));
        assert_eq!(job["spec"]["instruction"], "Summarise {title}");
        let inputs = jsonl(&files, "inputs.jsonl");
        let hashes = json_file(&files, "input-hashes.json");
        assert_eq!(hashes["items"]["a"], inputs[0]["sha256"]);
        assert_eq!(inputs[1]["input"], json!({"id": "b", "title": "Dune"}));
        assert_eq!(
            hashes["all"],
            sha256_hex(&files[1].1),
            "inputs.jsonl's hash"
        );
        assert_eq!(jsonl(&files, "items.jsonl").len(), 2);
        let a = &jsonl(&files, "attempts.jsonl")[1];
        let got = (&a["item"], &a["worker"], &a["outcome"], &a["error"]);
        assert_eq!(
            got,
            (
                &json!("b"),
                &json!("ghost"),
                &json!("failed"),
                &json!("timed out")
            )
        );
        // Only this job's events, not those of the owner's other job.
        let events = jsonl(&files, "events.jsonl");
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
        assert_eq!(kinds, ["job.created", "job.started", "job.item.failed"]);
        let w = &json_file(&files, "workers.json")["workers"];
        assert_eq!(
            (&w[0]["name"], &w[0]["ctx"]),
            (&json!("books-w1"), &json!("ctx/agent/books-w1"))
        );
        assert_eq!(w[0]["runs"].as_array().map(Vec::len), Some(1));
        assert_eq!(w[1]["name"], "ghost");
        assert!(w[1]["missing"].is_string(), "{w}");
        let manifest = json_file(&files, "manifest.json");
        assert_eq!(manifest["files"].as_object().map(|f| f.len()), Some(7));
        assert_eq!(manifest["files"]["job.json"], sha256_hex(&files[0].1));
        let ok = Verified {
            job: "books".into(),
            files: 7,
        };
        assert_eq!(verify(&dir), Ok(ok));
    }

    #[test]
    fn write_refuses_a_directory_in_use() {
        let (_d, dir, files) = written();
        let e = write(&dir, &files).unwrap_err();
        assert!(
            e.starts_with(&format!("{} is not empty", dir.display())),
            "{e}"
        );
    }

    #[test]
    fn a_changed_byte_is_named() {
        let (_d, dir, _) = written();
        let p = dir.join("items.jsonl");
        let mut b = fs::read(&p).unwrap();
        b[0] ^= 1;
        fs::write(&p, b).unwrap();
        assert_eq!(
            verify(&dir),
            Err(vec![Problem::Changed("items.jsonl".into())])
        );
        assert_eq!(shown(&dir), ["changed: items.jsonl (sha256 mismatch)"]);
    }

    #[test]
    fn added_removed_and_linked_files_are_all_named() {
        let (_d, dir, _) = written();
        fs::write(dir.join("extra.txt"), "x").unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/more"), "y").unwrap();
        fs::remove_file(dir.join("events.jsonl")).unwrap();
        // A link where a file was: not followed, so not the file.
        let job = dir.join("job.json");
        fs::rename(&job, dir.join("moved")).unwrap();
        std::os::unix::fs::symlink("moved", &job).unwrap();
        assert_eq!(
            shown(&dir),
            [
                "removed: events.jsonl (in the manifest, missing)",
                "added: extra.txt (not in the manifest)",
                "changed: job.json (sha256 mismatch)",
                "added: moved (not in the manifest)",
                "added: sub/more (not in the manifest)",
            ]
        );
    }

    #[test]
    fn a_corrupt_manifest_is_bad() {
        let (_d, dir, _) = written();
        let m = dir.join(MANIFEST);
        let bad = |text: &str, why: &str| {
            fs::write(&m, text).unwrap();
            let problems = verify(&dir).unwrap_err();
            assert!(
                matches!(&problems[..], [Problem::BadManifest(w)] if w.contains(why)),
                "{problems:?}"
            );
        };
        bad(r#"{"job": "books", "#, "not JSON");
        bad(
            r#"{"job": "books", "algorithm": "md5", "files": {}}"#,
            "md5",
        );
        let zeros = "0".repeat(64);
        let outside =
            format!(r#"{{"job": "b", "algorithm": "sha256", "files": {{"../x": "{zeros}"}}}}"#);
        bad(&outside, "\"../x\" is not a file of the bundle");
        bad(
            r#"{"job": "b", "algorithm": "sha256", "files": {"x": "00"}}"#,
            "hex",
        );
        fs::remove_file(&m).unwrap();
        assert!(shown(&dir)[0].contains("manifest.json"));
    }
}
