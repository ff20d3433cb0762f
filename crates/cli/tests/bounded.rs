//! Issue 24, "the daemon never blocks on what a caller names" and "bounded
//! work per request", attacked for real against `brood serve`: a job whose
//! `output_schema` refers to a FIFO, to a file that exists and to one that
//! does not; a 1 MiB CSV of tiny rows; a caller creating agents faster
//! than its rate; a tenant past its unfinished jobs and items. Each request
//! is written by hand on the daemon's control socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// An answer: the status, the head (for its headers) and the JSON body.
struct Answer {
    status: u16,
    head: String,
    json: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
    fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
    fn message(&self) -> &str {
        self.json["error"]["message"].as_str().unwrap_or("")
    }
}

/// Writes one request on a new connection; `sent` is told once the whole
/// body is written. A connection that answers nothing within a minute fails
/// the test rather than hanging it.
fn call_then(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
    sent: impl FnOnce(),
) -> Answer {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body.as_bytes()).unwrap();
    sent();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    Answer {
        status,
        head: head.to_owned(),
        json: serde_json::from_str(rest).unwrap_or(Value::Null),
    }
}

fn call(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let text = body.map(Value::to_string);
    call_then(sock, method, path, text.as_deref(), || {})
}

/// A daemon on a fresh root, with `config` as its `config.toml`, and a live
/// owner for jobs (`lead`).
fn daemon(config: &str) -> (tempfile::TempDir, Daemon, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let d = serve_daemon(dir.path(), None);
    let sock = dir.path().join("brood.sock");
    let a = call(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "lead", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(a.status, 201, "{}", a.json);
    (dir, d, sock)
}

fn no_job(sock: &Path, id: &str) {
    let a = call(sock, "GET", &format!("/api/jobs/{id}"), None);
    assert_eq!(a.status, 404, "job {id} was recorded: {}", a.json);
}

/// `/proc/<pid>/status`'s figure `key` (kB).
fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap()
}

#[test]
fn a_schema_referring_to_a_fifo_or_any_file_is_refused_at_once_and_opens_nothing() {
    let (dir, _d, sock) = daemon("");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let job = |id: &str, schema: Value| {
        json!({"id": id, "owner": "lead", "instruction": "say {t}", "input": "t\na\n",
               "output_schema": schema})
    };
    let url = |p: &Path| format!("file://{}", p.display());

    // The FIFO: answered while /healthz keeps answering, and nobody holds
    // the FIFO open for reading afterwards (a writer finds no reader).
    let (tx, rx) = std::sync::mpsc::channel();
    let fifo_job = job("fifo", json!({"$ref": url(&fifo)})).to_string();
    let s2 = sock.clone();
    let t = std::thread::spawn(move || {
        call_then(&s2, "POST", "/api/jobs", Some(&fifo_job), || {
            tx.send(()).unwrap()
        })
    });
    rx.recv().unwrap();
    let h = call(&sock, "GET", "/healthz", None);
    assert_eq!(h.status, 200);
    let a = t.join().unwrap();
    assert_eq!((a.status, a.code()), (400, "BadRequest"), "{}", a.json);
    assert!(
        a.message().starts_with("output_schema:") && a.message().contains(&url(&fifo)),
        "{}",
        a.message()
    );
    // SAFETY: a path we own; O_NONBLOCK, so this never waits.
    let w = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
    let err = std::io::Error::last_os_error();
    assert_eq!(w, -1, "the daemon holds the FIFO open for reading");
    assert_eq!(err.raw_os_error(), Some(libc::ENXIO));
    no_job(&sock, "fifo");

    // A readable file and a missing one: the same answer but for the name.
    let there = dir.path().join("there.json");
    std::fs::write(&there, r#"{"type": "string"}"#).unwrap();
    let gone = dir.path().join("gone.json");
    let a1 = call(
        &sock,
        "POST",
        "/api/jobs",
        Some(&job("there", json!({"$ref": url(&there)}))),
    );
    let a2 = call(
        &sock,
        "POST",
        "/api/jobs",
        Some(&job("gone", json!({"$ref": url(&gone)}))),
    );
    assert_eq!((a1.status, a2.status), (400, 400));
    assert_eq!(
        a1.message().replace(&url(&there), "URL"),
        a2.message().replace(&url(&gone), "URL"),
        "an existence oracle"
    );
    // Nor through $schema, nor through an $id the $ref resolves against.
    for (id, schema) in [
        ("meta", json!({"$schema": url(&there)})),
        (
            "base",
            json!({"$id": format!("{}/", url(dir.path())), "$ref": "there.json"}),
        ),
        ("web", json!({"$ref": "https://example.com/schema.json"})),
    ] {
        let a = call(&sock, "POST", "/api/jobs", Some(&job(id, schema)));
        assert_eq!(a.status, 400, "{id}: {}", a.json);
        assert!(
            a.message().contains("outside the schema"),
            "{id}: {}",
            a.message()
        );
        no_job(&sock, id);
    }
    for id in ["there", "gone"] {
        no_job(&sock, id);
    }
    // The drafts brood carries still compile.
    for (id, draft) in [
        ("d2020", "https://json-schema.org/draft/2020-12/schema"),
        ("d7", "http://json-schema.org/draft-07/schema#"),
    ] {
        let a = call(
            &sock,
            "POST",
            "/api/jobs",
            Some(&job(id, json!({"$schema": draft, "type": "object"}))),
        );
        assert_eq!(a.status, 201, "{id}: {}", a.json);
    }
}

#[test]
fn a_megabyte_of_tiny_rows_is_refused_at_the_item_limit_while_healthz_answers() {
    let (_dir, d, sock) = daemon("");
    let pid = d.0.id();
    // 330,000 rows of one character: just under the body's 1 MiB as JSON.
    let rows = 330_000;
    let mut csv = String::with_capacity(rows * 2 + 2);
    csv.push_str("t\n");
    for _ in 0..rows {
        csv.push_str("1\n");
    }
    let body =
        json!({"id": "big", "owner": "lead", "instruction": "say {t}", "input": csv}).to_string();
    assert!(body.len() < 1 << 20, "{} bytes", body.len());
    let before = status_kb(pid, "VmRSS:");

    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let (s2, done2) = (sock.clone(), done.clone());
    let t = std::thread::spawn(move || {
        let a = call_then(&s2, "POST", "/api/jobs", Some(&body), || {
            tx.send(()).unwrap()
        });
        done2.store(true, Ordering::SeqCst);
        a
    });
    rx.recv().unwrap();
    // /healthz while the input is read: answered before the job's answer.
    let mut during = 0;
    while !done.load(Ordering::SeqCst) {
        let h = call(&sock, "GET", "/healthz", None);
        assert_eq!(h.status, 200);
        if !done.load(Ordering::SeqCst) {
            during += 1;
        }
    }
    let a = t.join().unwrap();
    assert_eq!((a.status, a.code()), (413, "TooLarge"), "{}", a.json);
    assert!(
        a.message().contains("items_per_job = 100000"),
        "{}",
        a.message()
    );
    assert!(
        during >= 1,
        "/healthz never answered while the input was read"
    );
    no_job(&sock, "big");
    let peak = status_kb(pid, "VmHWM:");
    let after = status_kb(pid, "VmRSS:");
    eprintln!(
        "daemon RSS: {before} kB before, {peak} kB at its peak, {after} kB after; \
         /healthz answered {during} times during the request"
    );
    // The memory the refused input took is given back (issue 24 saw 28 MB
    // become 454 MB and stay; without the trim of the blocking thread's
    // arena, 40 MB of the 52 MB this one took stayed).
    assert!(
        after < before + 16 * 1024,
        "the daemon kept {} kB after a refused input",
        after - before
    );
}

#[test]
fn a_caller_creating_agents_faster_than_its_rate_is_told_when_to_come_back() {
    // One creation back every 100 s: none comes back while the test runs.
    let (dir, _d, sock) = daemon("[limits]\nagents_per_second = 0.01\nagents_burst = 3\n");
    let quick = agent(&["--result", "x"]);
    // `boss` creates four children itself, over the child protocol: its
    // own bucket, not the operator's, holds three of them.
    let mut flags: Vec<String> = Vec::new();
    for k in ["k1", "k2", "k3", "k4"] {
        flags.push("--spawn".into());
        flags.push(json!({"name": k, "argv": quick}).to_string());
    }
    flags.extend(["--tolerate-refusal".into(), "--hang".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // The operator: `lead` took one creation, `boss` and `a1` the rest.
    for (n, argv) in [("boss", agent(&flags)), ("a1", quick.clone())] {
        let a = call(
            &sock,
            "POST",
            "/api/agents",
            Some(&json!({"name": n, "argv": argv})),
        );
        assert_eq!(a.status, 201, "{n}: {}", a.json);
    }
    let a = call(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "a2", "argv": quick})),
    );
    assert_eq!((a.status, a.code()), (429, "RateLimited"), "{}", a.json);
    assert!(
        a.message().contains("agents_per_second = 0.01") && a.message().contains("operator"),
        "{}",
        a.message()
    );
    let after: u64 = a
        .header("retry-after")
        .expect("a Retry-After header")
        .parse()
        .unwrap();
    assert!((1..=100).contains(&after), "Retry-After: {after}");
    let gone = call(&sock, "GET", "/api/agents/a2", None);
    assert_eq!(gone.status, 404, "a refused creation left a record");

    // The agent's fourth child is refused the same way (the test agent
    // writes the refusal to its stderr, the agent's `log`).
    let log = brood_runtime::paths::Paths::new(dir.path().to_path_buf(), 0)
        .agent_dir(&brood_core::AgentName::new("boss").unwrap())
        .join("log");
    assert!(
        eventually(Duration::from_secs(20), || {
            let l = std::fs::read_to_string(&log).unwrap_or_default();
            l.contains("refused") && l.contains("RateLimited") && l.contains("k4")
        }),
        "no refusal of k4 in {}: {}",
        log.display(),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for k in ["k1", "k2", "k3"] {
        let a = call(&sock, "GET", &format!("/api/agents/{k}"), None);
        assert_eq!(a.status, 200, "{k}: {}", a.json);
    }
    let k4 = call(&sock, "GET", "/api/agents/k4", None);
    assert_eq!(k4.status, 404, "{}", k4.json);
}

#[test]
fn a_tenant_past_its_unfinished_jobs_or_items_is_refused_naming_the_limit() {
    let (_dir, _d, sock) = daemon("[limits]\njobs_per_tenant = 2\nitems_per_tenant = 5\n");
    let job = |id: &str, rows: usize| {
        let input: String = std::iter::once("t\n".to_owned())
            .chain((0..rows).map(|i| format!("{i}\n")))
            .collect();
        json!({"id": id, "owner": "lead", "instruction": "say {t}", "input": input})
    };
    for id in ["j1", "j2"] {
        let a = call(&sock, "POST", "/api/jobs", Some(&job(id, 2)));
        assert_eq!(a.status, 201, "{id}: {}", a.json);
    }
    let a = call(&sock, "POST", "/api/jobs", Some(&job("j3", 1)));
    assert_eq!((a.status, a.code()), (429, "QuotaJobs"), "{}", a.json);
    assert!(
        a.message().contains("jobs_per_tenant = 2"),
        "{}",
        a.message()
    );
    no_job(&sock, "j3");
    // A finished job no longer counts.
    let c = call(&sock, "POST", "/api/jobs/j1/cancel", None);
    assert_eq!(c.status, 200, "{}", c.json);
    // j2 holds 2 items: 4 more would make 6, over 5.
    let a = call(&sock, "POST", "/api/jobs", Some(&job("j4", 4)));
    assert_eq!((a.status, a.code()), (429, "QuotaItems"), "{}", a.json);
    assert!(
        a.message().contains("items_per_tenant = 5"),
        "{}",
        a.message()
    );
    no_job(&sock, "j4");
    let a = call(&sock, "POST", "/api/jobs", Some(&job("j5", 3)));
    assert_eq!(a.status, 201, "{}", a.json);
}
