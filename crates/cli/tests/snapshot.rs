//! A snapshot of a whole ctx tree after a scripted run (issue 5 item 8): every
//! file's name, owner, mode and content, with what changes from run to run
//! (times, run ids, pids, the temporary root) redacted, compared with
//! `tests/snapshots/ctx-tree.txt`. A change to any file's name or format shows
//! up as a diff of that file; when the change is meant, regenerate it with
//! `BROOD_UPDATE_SNAPSHOTS=1 cargo test -p brood-cli --test snapshot` and
//! review the diff.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use brood_runtime::supervisor::handle;
use common::*;
use regex::Regex;
use serde_json::{Value, json};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/ctx-tree.txt");

/// Replaces what differs between runs, keeping relations: the n-th distinct
/// run id is always `<run-n>`.
struct Redactor {
    root: String,
    bin: String,
    ids: HashMap<String, String>,
    uuid: Regex,
    ms: Regex,
    incarnation: Regex,
    key: Regex,
}

impl Redactor {
    fn text(&mut self, s: &str) -> String {
        let s = s.replace(&self.root, "$ROOT").replace(&self.bin, "$BIN");
        let mut out = String::new();
        let mut last = 0;
        for m in self.uuid.find_iter(&s) {
            out.push_str(&s[last..m.start()]);
            let n = self.ids.len() + 1;
            let id = self
                .ids
                .entry(m.as_str().to_owned())
                .or_insert_with(|| format!("<run-{n}>"));
            out.push_str(id);
            last = m.end();
        }
        out.push_str(&s[last..]);
        let out = self.ms.replace_all(&out, "<ms>");
        let out = self.incarnation.replace_all(&out, "s<pid>-<start>");
        self.key.replace_all(&out, "brood-<key>").into_owned()
    }

    /// JSON files: times and pids by key, the host-dependent sandbox and
    /// containment details down to their keys.
    fn json(&mut self, v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    match k.as_str() {
                        "pid" if x.is_number() => *x = json!("<pid>"),
                        "ts" => *x = json!("<ms>"),
                        k if k.ends_with("_ms") && x.is_number() => *x = json!("<ms>"),
                        "sandbox" | "containment" if x.is_object() => {
                            let keys: Vec<&String> = x.as_object().unwrap().keys().collect();
                            *x = json!(format!("<{} keys: {keys:?}>", k));
                        }
                        _ => self.json(x),
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.json(x)),
            Value::String(s) => *s = self.text(s),
            _ => {}
        }
    }

    fn file(&mut self, rel: &str, bytes: &[u8]) -> String {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return format!("<{} bytes, not UTF-8>\n", bytes.len());
        };
        if rel.ends_with("/pid") {
            return if text.trim().is_empty() {
                text.to_owned()
            } else {
                "<pid>\n".to_owned()
            };
        }
        if rel.ends_with(".json") || rel.ends_with(".jsonl") {
            let mut out = String::new();
            for line in text.lines() {
                match serde_json::from_str::<Value>(line) {
                    Ok(mut v) => {
                        self.json(&mut v);
                        out.push_str(&v.to_string());
                    }
                    Err(_) => out.push_str(&self.text(line)),
                }
                out.push('\n');
            }
            if !text.ends_with('\n') && !out.is_empty() {
                out.pop();
            }
            return out;
        }
        self.text(text)
    }
}

/// Every entry under `dir`, sorted, as `== path owner mode` lines each followed
/// by the redacted content of a file.
fn render(dir: &Path, r: &mut Redactor) -> String {
    let mut entries = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            entries.push(p);
        }
    }
    entries.sort();
    let mut out = String::new();
    for p in entries {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let rel = r.text(&p.strip_prefix(dir).unwrap().to_string_lossy());
        let kind = if md.is_dir() { "/" } else { "" };
        out.push_str(&format!(
            "== {rel}{kind} {}:{} {:o}\n",
            md.uid(),
            md.gid(),
            md.mode() & 0o7777
        ));
        // The log is stderr as it came (chunked by the pipe), and not in the store.
        if md.is_file() && p.file_name().is_some_and(|n| n != "log") {
            let text = r.file(&rel, &std::fs::read(&p).unwrap());
            out.push_str(&text);
            if !text.ends_with('\n') {
                out.push_str("\n<no newline at end>\n");
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_runs_ctx_tree_matches_the_snapshot() {
    let env = start(Duration::from_millis(300));
    // lead → alpha → gamma (temp), one at a time so every file's order is fixed;
    // alpha hands back a ref and an artifact; x speaks no protocol.
    let gamma = json!({"name": "gamma", "life": "temp", "task": "the smallest part", "argv": agent(&["--result", "gamma done"])});
    let r = json!({"path": "artifact/notes.md", "summary": "what alpha found", "kind": "artifact"});
    let alpha = json!({"name": "alpha", "task": "part of it", "label": "worker", "argv": agent(&[
        "--message", "alpha at work", "--spawn", &gamma.to_string(), "--wait",
        "--artifact", "notes.md=# notes\n", "--ref", &r.to_string(), "--result", "alpha done"])});
    let lead = json!({"name": "lead", "task": "the whole job", "argv": agent(&[
        "--message", "planning", "--usage", "10,20,0.01", "--spawn", &alpha.to_string(), "--wait",
        "--result", "lead done"])});
    handle(&env.sup, &me(), "spawn", &lead).await.unwrap();
    env.sup
        .wait(me(), vec![name("lead")], Some(Duration::from_secs(20)))
        .await
        .unwrap();
    let x = json!({"name": "x", "protocol": "exec", "task": "echo me", "argv": ["cat"]});
    handle(&env.sup, &me(), "spawn", &x).await.unwrap();
    env.sup
        .wait(me(), vec![name("x")], Some(Duration::from_secs(20)))
        .await
        .unwrap();
    env.sup.flush().await;
    assert_eq!(show(&env, "lead")["status"], "completed");

    let mut r = Redactor {
        root: env.root().to_string_lossy().into_owned(),
        bin: Path::new(exe())
            .parent()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        ids: HashMap::new(),
        uuid: Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap(),
        ms: Regex::new(r"\b1[0-9]{12}\b").unwrap(),
        incarnation: Regex::new(r"s[0-9]+-[0-9]+").unwrap(),
        key: Regex::new("brood-[0-9a-f]{8,}").unwrap(),
    };
    let got = render(&env.sup.paths().ctx(), &mut r);
    if std::env::var_os("BROOD_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
    }
    let want = std::fs::read_to_string(GOLDEN)
        .unwrap_or_else(|e| panic!("{GOLDEN}: {e} (BROOD_UPDATE_SNAPSHOTS=1 writes it)"));
    if got != want {
        // Name the first differing line, then the whole files for the diff.
        let (n, (g, w)) = got
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
            .unwrap_or((
                got.lines().count().min(want.lines().count()),
                ("<end>", "<end>"),
            ));
        let out = std::env::temp_dir().join("brood-ctx-tree.actual.txt");
        std::fs::write(&out, &got).unwrap();
        panic!(
            "the ctx tree differs from {GOLDEN} at line {}:\n  got:  {g}\n  want: {w}\n(whole tree in {}; diff them, and if the change is meant, BROOD_UPDATE_SNAPSHOTS=1 rewrites the snapshot)",
            n + 1,
            out.display()
        );
    }
}
