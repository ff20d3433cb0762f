//! Issue 25 item 3, secrets that stay secret, attacked for real: a value
//! given with `--secret` (or a request's `secrets`) reaches the agent's
//! environment and is then looked for everywhere brood writes or answers:
//! the store's files (`brood.db`, its WAL and shared memory, as bytes),
//! every file of the root (the ctx tree, the blobs), the daemon's log at
//! `trace`, `brood show`, `brood logs`, `brood events`, every read of the API and the web
//! UI, the MCP `show` tool, idempotent answers kept in the store (and their
//! requests' hashes). A child inherits a secret only
//! when its policy names it, a child naming one its parent lacks is refused,
//! and nobody hands a child a value of its own. A literal `env` value is
//! hidden on the same surfaces (it stays in the store, which launches with
//! it, and in the agent's `0600` `env` control file, docs/decisions/policies.md
//! "Literal `env` values are hidden where a policy is shown").
//! No value outlives its run: a resume, after an end or a daemon restart,
//! needs the root's values again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const KEY: &str = "OPENAI_API_KEY";

/// A value found nowhere by chance.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{}-{nanos:x}", std::process::id())
}

/// `sha256sum`'s hex digest of `s`: what an agent prints to prove it holds
/// a value without writing it anywhere.
fn sha(s: &str) -> String {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    String::from_utf8(o.stdout).unwrap()[..64].to_owned()
}

/// The program that prints the digest of `$OPENAI_API_KEY` (or `unset`).
fn print_key() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "if [ -n \"${{{KEY}+x}}\" ]; then printf %s \"${KEY}\" | sha256sum; else echo unset; fi"
        ),
    ]
}

/// `brood ARGS` with `env` added, outside any agent, its log at `trace`.
fn brood_env(root: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe());
    c.arg("--root")
        .arg(root)
        .args(args)
        .env_remove("BROOD_SOCKET")
        .env("BROOD_LOG", "trace");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// `brood serve` on `root`, its log (at `trace`, the most it says) into
/// `log`.
fn serve_logged(root: &Path, log: &Path) -> Daemon {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    #[allow(clippy::disallowed_methods)]
    let child = Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(["serve", "--grace", "0.3"])
        .env("BROOD_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let sock = root.join("brood.sock");
    assert!(
        eventually(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "the daemon serves {}",
        sock.display()
    );
    d
}

/// One request with an `Idempotency-Key`, so its answer is kept in the
/// store: the status and the body's text.
fn post_keyed(sock: &Path, path: &str, key: &str, body: &Value) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, rest.to_owned())
}

/// One JSON-RPC message to the daemon's `/mcp` (streamable HTTP) on its
/// socket: the answer's head and its body, de-chunked.
fn mcp_post(sock: &Path, session: Option<&str>, msg: &Value) -> (String, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = msg.to_string();
    let sid = session.map_or(String::new(), |id| format!("Mcp-Session-Id: {id}\r\n"));
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{sid}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        common::wire::dechunk(rest)
    } else {
        rest.to_owned()
    };
    (head, body)
}

/// What the MCP `show` tool answers about `name`, over `/mcp`.
fn mcp_show(sock: &Path, name: &str) -> String {
    let (head, body) = mcp_post(
        sock,
        None,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "secrets-test", "version": "1"}}}),
    );
    let sid = head
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .unwrap_or_else(|| panic!("no MCP session: {head}\n{body}"))
        .trim()
        .to_owned();
    mcp_post(
        sock,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let (_, shown) = mcp_post(
        sock,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "show", "arguments": {"agent": name}}}),
    );
    assert!(
        shown.contains("OPENAI_API_KEY"),
        "the show tool answered: {shown}"
    );
    shown
}

/// Waits for `name` to finish; its record.
fn wait_for(sock: &Path, name: &str) -> Value {
    let (s, w) = http(
        sock,
        "POST",
        &format!("/api/agents/{name}/wait"),
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(s, 200, "waiting for {name}: {w}");
    assert_eq!(w["timed_out"], false, "{name} did not end: {w}");
    w["agents"][0].clone()
}

/// Every regular file under `dir` (no link followed) whose bytes hold
/// `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Some(entries) = unless_gone(std::fs::read_dir(&d), &d) else {
            continue;
        };
        for e in entries.flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file()
                && std::fs::read(e.path())
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                out.push(e.path());
            }
        }
    }
    out
}

/// The store's own files (the database, its WAL and shared memory).
fn store_files(root: &Path) -> Vec<PathBuf> {
    ["brood.db", "brood.db-wal", "brood.db-shm"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect()
}

fn holds(p: &Path, needle: &str) -> bool {
    std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// What every read surface answers about the agents of `root`: `brood
/// show` (text and JSON), `brood events`, and the API's and the UI's reads.
fn surfaces(root: &Path, names: &[&str]) -> Vec<(String, String)> {
    let sock = root.join("brood.sock");
    let mut out = Vec::new();
    for path in [
        "/api/agents?all=true",
        "/api/tree",
        "/api/ui/tree",
        "/api/sessions/tree",
    ] {
        let (_, v) = http(&sock, "GET", path, None);
        out.push((path.to_owned(), v.to_string()));
    }
    for n in names {
        for path in [
            format!("/api/agents/{n}"),
            format!("/api/agents/{n}/children"),
            format!("/api/agents/{n}/descendants"),
            format!("/api/sessions/{n}"),
            format!("/api/ui/agents/{n}"),
            format!("/api/ui/agents/{n}/transcript"),
            format!("/api/agents/{n}/log"),
        ] {
            let (_, v) = http(&sock, "GET", &path, None);
            out.push((path, v.to_string()));
        }
        for args in [vec!["show", n], vec!["show", n, "--json"], vec!["logs", n]] {
            let o = brood(root, &args);
            assert!(o.status.success(), "brood {args:?}: {}", text(&o));
            out.push((format!("brood {}", args.join(" ")), text(&o)));
        }
    }
    for n in names {
        out.push((format!("MCP show {n}"), mcp_show(&sock, n)));
    }
    let o = brood(root, &["events"]);
    assert!(o.status.success(), "{}", text(&o));
    out.push(("brood events".into(), text(&o)));
    out
}

#[test]
fn a_secret_reaches_its_agent_and_its_children_and_is_written_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let log = dir.path().join("daemon.log");
    let sock = root.join("brood.sock");
    let _d = serve_logged(&root, &log);
    let secret = unique("sk-secret");
    let literal = unique("literal-env");

    // The root, by `brood spawn --secret`: a literal env value in its
    // policy, its key from this environment. Through its door it creates
    // one child that inherits the key, asks one its parent lacks, and
    // hands a child a value of its own; then a marker, and it waits.
    let more = dir.path().join("more.json");
    std::fs::write(&more, json!({"secrets": ["OTHER_KEY"]}).to_string()).unwrap();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, json!({"env": {"LITERAL": literal}}).to_string()).unwrap();
    let script = dir.path().join("keyed.sh");
    std::fs::write(
        &script,
        format!(
            "{exe} spawn --name kid-door -- {print}\n\
             {exe} spawn --name kid-door-more --policy {more} -- /bin/true\n\
             {exe} spawn --name kid-door-given --secret {KEY} -- /bin/true\n\
             {exe} spawn --name marker -- /bin/true\n\
             exec sleep 600\n",
            exe = exe(),
            print = print_key()
                .iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(" "),
            more = more.display(),
        ),
    )
    .unwrap();
    let o = brood_env(
        &root,
        &[(KEY, &secret)],
        &[
            "spawn",
            "--name",
            "keyed",
            "--secret",
            KEY,
            "--policy",
            policy.to_str().unwrap(),
            "--protocol",
            "exec",
            "--",
            "/bin/sh",
            script.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains(&secret), "{}", text(&o));
    assert!(
        eventually(Duration::from_secs(30), || http(
            &sock,
            "GET",
            "/api/agents/marker",
            None
        )
        .0 == 200),
        "the root's script ran"
    );
    let door = wait_for(&sock, "kid-door");
    assert_eq!(door["status"], "completed", "{door}");
    assert!(
        door["result"].as_str().unwrap().contains(&sha(&secret)),
        "a child that names nothing inherits its parent's secret: {door}"
    );
    for refused in ["kid-door-more", "kid-door-given"] {
        let (s, v) = http(&sock, "GET", &format!("/api/agents/{refused}"), None);
        assert_eq!(s, 404, "{refused} was refused and left nothing: {v}");
    }

    // The operator creates children of the root.
    let kid = |name: &str, extra: Value| {
        let mut body =
            json!({"name": name, "parent": "keyed", "argv": print_key(), "protocol": "exec"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        http(&sock, "POST", "/api/agents", Some(&body))
    };
    let (s, v) = kid("kid-op", json!({}));
    assert_eq!(s, 201, "{v}");
    let r = wait_for(&sock, "kid-op");
    assert!(r["result"].as_str().unwrap().contains(&sha(&secret)), "{r}");
    let (s, v) = kid("kid-none", json!({"policy": {"secrets": []}}));
    assert_eq!(s, 201, "{v}");
    let r = wait_for(&sock, "kid-none");
    assert_eq!(
        r["result"].as_str().unwrap().trim(),
        "unset",
        "a child whose policy names no secret gets none: {r}"
    );
    let (s, v) = kid("kid-more", json!({"policy": {"secrets": ["OTHER_KEY"]}}));
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (403, Some("PolicyExpansion")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secrets.OTHER_KEY: the parent holds no secret OTHER_KEY"),
        "{v}"
    );
    // A value handed to a child, even the parent's own, is refused; the
    // answer is kept (an Idempotency-Key) and must not hold it.
    let (s, body) = post_keyed(
        &sock,
        "/api/agents",
        "given-to-a-child",
        &json!({"name": "kid-given", "parent": "keyed", "argv": print_key(),
                "protocol": "exec", "secrets": {KEY: secret}}),
    );
    assert_eq!(s, 400, "{body}");
    assert!(
        body.contains(&format!("secrets.{KEY}")) && !body.contains(&secret),
        "{body}"
    );
    assert_eq!(http(&sock, "GET", "/api/agents/kid-given", None).0, 404);

    // A root by the API with its value in `secrets`, kept idempotently.
    let flat_body = json!({
        "name": "flat", "protocol": "exec", "secrets": {KEY: secret},
        "env": {"LITERAL": literal},
        "argv": ["/bin/sh", "-c", format!("printf %s \"${KEY}\" | sha256sum; printf %s \"$LITERAL\" | sha256sum")],
    });
    let (s, first) = post_keyed(&sock, "/api/agents", "flat-once", &flat_body);
    assert_eq!(s, 201, "{first}");
    assert!(
        !first.contains(&secret) && !first.contains(&literal),
        "{first}"
    );
    // The key's record holds a hash of the request without the value (a
    // hash of the value would check a guess): the same request with
    // another value is the same request, replayed.
    let mut without = flat_body.clone();
    without["secrets"] = json!([KEY]);
    let (hash_sent, hash_kept) = (sha(&flat_body.to_string()), sha(&without.to_string()));
    let mut other = flat_body.clone();
    other["secrets"][KEY] = json!("another-value");
    let (s, again) = post_keyed(&sock, "/api/agents", "flat-once", &other);
    assert_eq!((s, &again), (201, &first), "replayed");
    let r = wait_for(&sock, "flat");
    let result = r["result"].as_str().unwrap();
    assert!(
        result.contains(&sha(&secret)) && result.contains(&sha(&literal)),
        "{r}"
    );
    // A root whose policy names a secret it is not given is refused,
    // naming it, and nothing is made.
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "bare", "argv": print_key(), "protocol": "exec",
                     "policy": {"secrets": [KEY]}}),
        ),
    );
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("BadRequest")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("secrets.{KEY}: no value given")),
        "{v}"
    );
    assert_eq!(http(&sock, "GET", "/api/agents/bare", None).0, 404);
    let o = brood_env(
        &root,
        &[],
        &["spawn", "--secret", "NOT_SET_ANYWHERE", "--", "/bin/true"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--secret NOT_SET_ANYWHERE: NOT_SET_ANYWHERE is not set"),
        "{}",
        text(&o)
    );

    // A job whose workers' policy holds a literal value shows its name only.
    let (s, job) = http(
        &sock,
        "POST",
        "/api/jobs",
        Some(
            &json!({"id": "j1", "owner": "keyed", "instruction": "x {a}", "input": [{"a": 1}],
                     "worker": {"argv": ["/bin/true"], "policy": {"env": {"LITERAL": literal}}}}),
        ),
    );
    assert_eq!(s, 201, "{job}");

    // What each surface shows: names, never a value.
    let (_, shown) = http(&sock, "GET", "/api/agents/keyed", None);
    assert_eq!(shown["policy"]["secrets"], json!([KEY]), "{shown}");
    assert_eq!(shown["policy"]["env"], json!({"LITERAL": null}), "{shown}");
    let o = brood(&root, &["show", "keyed"]);
    assert!(
        text(&o).contains("LITERAL (values not shown)") && text(&o).contains(KEY),
        "{}",
        text(&o)
    );
    let mut seen = surfaces(&root, &["keyed", "kid-door", "kid-op", "flat"]);
    for path in ["/api/jobs/j1", "/api/jobs"] {
        let (_, v) = http(&sock, "GET", path, None);
        seen.push((path.to_owned(), v.to_string()));
    }
    let (_, j) = http(&sock, "GET", "/api/jobs/j1", None);
    assert_eq!(
        j["spec"]["worker"]["policy"]["env"],
        json!({"LITERAL": null}),
        "{j}"
    );
    for (what, answer) in &seen {
        assert!(
            !answer.contains(&secret),
            "{what} shows the secret:\n{answer}"
        );
        assert!(
            !answer.contains(&literal),
            "{what} shows the literal env value:\n{answer}"
        );
    }

    // The files. The secret is in none under the root, the store's
    // included; the literal value is in the store (the positive control:
    // the scan finds what is there) and in the agents' `0600` `env`
    // control files, and nowhere else.
    let (s, v) = http(&sock, "POST", "/api/agents/keyed/cancel", None);
    assert_eq!(s, 200, "{v}");
    wait_for(&sock, "keyed");
    assert!(!store_files(&root).is_empty());
    assert!(
        store_files(&root).iter().any(|p| holds(p, &literal)),
        "the store keeps the literal env value (it launches with it)"
    );
    assert_eq!(files_holding(&root, &secret), Vec::<PathBuf>::new());
    assert!(
        store_files(&root).iter().any(|p| holds(p, &hash_kept)),
        "the key's record is there, hashed without the value"
    );
    assert_eq!(files_holding(&root, &hash_sent), Vec::<PathBuf>::new());
    let with_literal = files_holding(&root.join("ctx"), &literal);
    assert!(!with_literal.is_empty(), "the env control files keep it");
    for p in &with_literal {
        assert_eq!(
            p.file_name().unwrap(),
            "env",
            "{} holds the literal",
            p.display()
        );
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{}", p.display());
    }
    let policy_file = read(root.join("ctx/agent/keyed.d/policy"));
    assert!(
        policy_file.contains(KEY) && policy_file.contains("\"LITERAL\": null"),
        "{policy_file}"
    );
    let logged = read(&log);
    assert!(!logged.is_empty(), "the daemon logged at trace");
    assert!(
        !logged.contains(&secret),
        "the daemon's log holds the secret"
    );
    assert!(
        !logged.contains(&literal),
        "the daemon's log holds the literal"
    );
}

#[test]
fn brood_run_passes_a_secret_from_its_own_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let secret = unique("sk-run");
    let mut args = vec!["run", "--secret", KEY, "--protocol", "exec", "--"];
    let argv = print_key();
    args.extend(argv.iter().map(String::as_str));
    let o = brood_env(&root, &[(KEY, &secret)], &args);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&sha(&secret)), "{}", text(&o));
    // Its log (stderr, at trace) and every file of the root: not a byte.
    assert!(!text(&o).contains(&secret), "{}", text(&o));
    assert!(!store_files(&root).is_empty());
    assert_eq!(files_holding(&root, &secret), Vec::<PathBuf>::new());

    // A name not set in the caller's environment is refused at once,
    // naming it, and starts nothing.
    let empty = dir.path().join("e");
    let o = brood_env(
        &empty,
        &[],
        &["run", "--secret", "NOT_SET_ANYWHERE", "--", "/bin/true"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o)
            .contains("--secret NOT_SET_ANYWHERE: NOT_SET_ANYWHERE is not set in this environment"),
        "{}",
        text(&o)
    );
    assert!(!empty.join("brood.db").exists(), "nothing was started");
    // A policy naming a secret with no `--secret` for it: refused, named.
    let policy = dir.path().join("p.json");
    std::fs::write(&policy, json!({"secrets": [KEY]}).to_string()).unwrap();
    let o = brood_env(
        &root,
        &[(KEY, &secret)],
        &[
            "run",
            "--name",
            "nokey",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "/bin/true",
        ],
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("secrets.{KEY}: no value given")),
        "{}",
        text(&o)
    );

    // On a root a daemon serves, `brood run` is its client: the value goes
    // in the request, and the daemon writes it nowhere either.
    let served = dir.path().join("served");
    let log = dir.path().join("daemon.log");
    let _d = serve_logged(&served, &log);
    let o = brood_env(&served, &[(KEY, &secret)], &args);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&sha(&secret)),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains(&secret), "{}", text(&o));
    assert!(!store_files(&served).is_empty());
    assert_eq!(files_holding(&served, &secret), Vec::<PathBuf>::new());
    assert!(
        !read(&log).contains(&secret),
        "the daemon's log holds the secret"
    );
}

#[test]
fn no_value_outlives_its_run_a_resume_or_a_restart_needs_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let log = dir.path().join("daemon.log");
    let sock = root.join("brood.sock");
    let secret = unique("sk-resume");
    let mut d = serve_logged(&root, &log);

    // A root that ends, and a resume: without the value it is refused
    // naming the secret (nothing recorded); with it, the new run has it.
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "once", "argv": print_key(), "protocol": "exec", "secrets": {KEY: secret}}),
        ),
    );
    assert_eq!(s, 201, "{v}");
    assert!(
        wait_for(&sock, "once")["result"]
            .as_str()
            .unwrap()
            .contains(&sha(&secret))
    );
    let runs = |n: &str| {
        http(&sock, "GET", &format!("/api/agents/{n}"), None).1["runs"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let (s, v) = http(&sock, "POST", "/api/agents/once/resume", Some(&json!({})));
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&format!(
            "secrets.{KEY}: the policy of once names secret {KEY}, whose value is not kept"
        )),
        "{v}"
    );
    assert_eq!(runs("once"), 1, "a refused resume records nothing");
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents/once/resume",
        Some(&json!({"secrets": {KEY: secret, "EXTRA": "x"}})),
    );
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secrets.EXTRA"),
        "{v}"
    );
    let o = brood_env(
        &root,
        &[(KEY, &secret)],
        &["resume", "--secret", KEY, "once"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let r = wait_for(&sock, "once");
    assert_eq!(runs("once"), 2);
    assert!(r["result"].as_str().unwrap().contains(&sha(&secret)), "{r}");

    // A child's resume takes its parent's values; it is given none.
    let hold = |name: &str, marker: &Path| {
        json!({"name": name, "protocol": "exec", "secrets": {KEY: secret},
               "argv": ["/bin/sh", "-c", format!(
                   "printf %s \"${KEY}\" | sha256sum; if [ ! -e {m} ]; then touch {m}; exec sleep 600; fi",
                   m = marker.display())]})
    };
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&hold("parent", &dir.path().join("p-once"))),
    );
    assert_eq!(s, 201, "{v}");
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "kid", "parent": "parent", "argv": print_key(), "protocol": "exec"})),
    );
    assert_eq!(s, 201, "{v}");
    wait_for(&sock, "kid");
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents/kid/resume",
        Some(&json!({"secrets": {KEY: secret}})),
    );
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is a child"),
        "{v}"
    );
    let (s, v) = http(&sock, "POST", "/api/agents/kid/resume", Some(&json!({})));
    assert_eq!(s, 200, "{v}");
    let r = wait_for(&sock, "kid");
    assert_eq!(runs("kid"), 2);
    assert!(r["result"].as_str().unwrap().contains(&sha(&secret)), "{r}");

    // The daemon dies (SIGKILL) while a root holds the value: the restart
    // cancels it, and its resume needs the value again.
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&hold("holder", &dir.path().join("h-once"))),
    );
    assert_eq!(s, 201, "{v}");
    assert!(eventually(Duration::from_secs(10), || dir
        .path()
        .join("h-once")
        .exists()));
    // SAFETY: the daemon this test started.
    unsafe { libc::kill(d.0.id() as i32, libc::SIGKILL) };
    let _ = d.0.wait();
    d = serve_logged(&root, &log);
    assert!(
        eventually(Duration::from_secs(20), || {
            http(&sock, "GET", "/api/agents/holder", None).1["status"] == "cancelled"
        }),
        "the restart ended the root"
    );
    let (s, v) = http(&sock, "POST", "/api/agents/holder/resume", None);
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("secrets.{KEY}")),
        "{v}"
    );
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents/holder/resume",
        Some(&json!({"secrets": {KEY: secret}})),
    );
    assert_eq!(s, 200, "{v}");
    let r = wait_for(&sock, "holder");
    assert_eq!(r["status"], "completed", "{r}");
    assert!(r["result"].as_str().unwrap().contains(&sha(&secret)), "{r}");

    drop(d);
    assert!(!store_files(&root).is_empty());
    assert_eq!(files_holding(&root, &secret), Vec::<PathBuf>::new());
    assert!(
        !read(&log).contains(&secret),
        "the daemon's log holds the secret"
    );
}

/// `brood mcp --secret`'s request: an MCP session's root holds the values
/// (the model key its `brood agent` children need) and its children
/// inherit them; nothing of them is written.
#[test]
fn an_mcp_session_root_holds_the_secrets_its_children_inherit() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let log = dir.path().join("daemon.log");
    let sock = root.join("brood.sock");
    let _d = serve_logged(&root, &log);
    let secret = unique("sk-mcp");
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let body = json!({"client": "secrets-test", "secrets": {KEY: secret}}).to_string();
    write!(
        c,
        "POST /api/mcp/session HTTP/1.1\r\nHost: brood\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut stream = std::io::BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    let first: Value = loop {
        line.clear();
        assert!(
            stream.read_line(&mut line).unwrap() > 0,
            "the session's stream ended"
        );
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            break serde_json::from_str(d).unwrap();
        }
    };
    let owner = first["owner"].as_str().expect("a session root").to_owned();
    assert!(!first.to_string().contains(&secret), "{first}");
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "tool-kid", "parent": owner, "argv": print_key(), "protocol": "exec"}),
        ),
    );
    assert_eq!(s, 201, "{v}");
    let r = wait_for(&sock, "tool-kid");
    assert!(r["result"].as_str().unwrap().contains(&sha(&secret)), "{r}");
    let (_, shown) = http(&sock, "GET", &format!("/api/agents/{owner}"), None);
    assert_eq!(shown["policy"]["secrets"], json!([KEY]), "{shown}");
    drop((c, stream));
    assert!(
        eventually(Duration::from_secs(10), || {
            http(&sock, "GET", &format!("/api/agents/{owner}"), None).1["status"] == "cancelled"
        }),
        "the session root ends with its stream"
    );
    assert!(!store_files(&root).is_empty());
    assert_eq!(files_holding(&root, &secret), Vec::<PathBuf>::new());
    assert!(
        !read(&log).contains(&secret),
        "the daemon's log holds the secret"
    );
}
