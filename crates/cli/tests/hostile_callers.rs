//! A hostile caller of the API (issue 24, attacks 6 and 9, and parts of
//! items 7 and 8), each attack performed for real against `brood serve`:
//!
//! * an agent names another tree's agent as its child's `customer`, through
//!   the child protocol and through the API from inside its sandbox: both
//!   refused, nothing made;
//! * an agent squats an `Idempotency-Key` the operator then uses: the
//!   operator's answer is its own, and a 422 names only its own request;
//! * a PostgreSQL password on `brood serve`'s command line is refused (every
//!   local process reads `/proc/<pid>/cmdline`); the same URL from the
//!   environment or a private file runs against the real PostgreSQL.
//!
//! (An agent reading `/metrics`, `/api/nodes` and `/api/ui/sequence` is in
//! `api.rs`'s agent requests; the MCP session's confinement in `mcp.rs`; the
//! UI's sessions in `ui.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use brood_store_conformance::pg::Fresh;
use common::*;
use serde_json::{Value, json};

/// One request on the control socket with extra header lines: the status,
/// the head and the JSON body.
fn http_with(
    sock: &Path,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, String, Value) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    write!(s, "{head}\r\n{body}").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let v = serde_json::from_str(rest).unwrap_or(Value::String(rest.to_owned()));
    (status, head.to_owned(), v)
}

/// A root agent running `script` in `sh` (protocol `exec`: its stdout is
/// its result); its result once it ended.
fn run_sh(sock: &Path, name: &str, script: &str) -> String {
    let (c, v) = http(
        sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": name, "argv": ["sh", "-c", script], "protocol": "exec"})),
    );
    assert_eq!(c, 201, "{v}");
    let (_, w) = http(
        sock,
        "POST",
        &format!("/api/agents/{name}/wait"),
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    w["agents"][0]["result"].as_str().unwrap().to_owned()
}

/// `curl` on the agent's own `$BROOD_SOCKET`: the body, then the status.
fn curl(method: &str, path: &str, headers: &[&str], body: &Value) -> String {
    let mut c = format!(
        "curl -s -w ' %{{http_code}}' --unix-socket \"$BROOD_SOCKET\" -X {method} -H 'Content-Type: application/json'"
    );
    for h in headers {
        c.push_str(&format!(" -H '{h}'"));
    }
    format!("{c} --data '{body}' http://brood{path}")
}

fn status_of(sock: &Path, name: &str) -> (u16, Value) {
    http(sock, "GET", &format!("/api/agents/{name}"), None)
}

/// Attack 6: an agent names another tree's agent as the `customer` of a
/// child, so the child's result (whatever it says) would be written on that
/// agent's stdin. Refused through the child protocol and through the API
/// from inside the agent, naming the customer, with nothing made; a
/// customer in its own tree is still taken. Before the fix only a cycle
/// was checked, and both forgeries were admitted.
#[test]
fn a_customer_in_another_tree_is_refused_from_the_protocol_and_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "victim", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(c, 201, "{v}");

    // Through the child protocol: `request spawn` with the customer.
    let forged = json!({"name": "forged-p", "customer": "victim", "task": "x",
                        "argv": agent(&["--result", "FORGED RESULT"])});
    let own = json!({"name": "own-p", "customer": "evil", "task": "x",
                     "argv": agent(&["--result", "fine"])});
    let flags = [
        "--request".to_owned(),
        format!("spawn={forged}"),
        "--request".to_owned(),
        format!("spawn={own}"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (c, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "evil", "argv": agent(&flags)})),
    );
    assert_eq!(c, 201, "{v}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/evil/wait",
        Some(&json!({"timeout_s": 60})),
    );
    let lines = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut replies = lines.lines().filter(|l| l.starts_with("spawn: "));
    assert_eq!(
        replies.next(),
        Some("spawn: Forbidden"),
        "the forged customer: {w}"
    );
    assert!(
        replies.next().is_some_and(|l| l.starts_with("spawn: ok")),
        "a customer in its own tree is taken: {w}"
    );
    assert_eq!(status_of(&sock, "forged-p").0, 404, "nothing was made");
    // Its refusal is in its own log, naming the customer.
    let (_, ev) = http(
        &sock,
        "GET",
        "/api/events?agent=evil&type=agent.child.refused&follow=false",
        None,
    );
    assert!(
        ev.to_string().contains("customer victim"),
        "the refusal names the customer: {ev}"
    );

    // Through the API, from inside an agent of another tree.
    let body = json!({"name": "forged-a", "customer": "victim", "argv": ["true"]});
    let said = run_sh(&sock, "evil2", &curl("POST", "/api/agents", &[], &body));
    assert!(said.ends_with(" 403"), "{said}");
    assert!(said.contains("customer victim"), "{said}");
    assert_eq!(status_of(&sock, "forged-a").0, 404, "nothing was made");

    // The victim heard of no child.
    let (_, ev) = http(&sock, "GET", "/api/events?agent=victim&follow=false", None);
    assert!(!ev.to_string().contains("forged"), "{ev}");
    let (_, kids) = http(&sock, "GET", "/api/agents/victim/children", None);
    assert_eq!(kids["agents"], json!([]), "{kids}");
}

/// Attack 9: an agent sends the operator's next `Idempotency-Key` first.
/// The operator's request is then its own (201, not replayed, not a 422
/// naming the agent's request), its retry replays its own answer, and a
/// reuse of its key for another request names only its own.
#[test]
fn an_agent_squatting_a_key_does_not_change_the_operators_answer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    let key = "deploy-2024-07-01";

    let squat = json!({"name": "squatted", "argv": ["true"]});
    let said = run_sh(
        &sock,
        "squatter",
        &curl(
            "POST",
            "/api/agents",
            &[&format!("Idempotency-Key: {key}")],
            &squat,
        ),
    );
    assert!(said.ends_with(" 201"), "the squat itself: {said}");

    let mine = json!({"name": "mine", "argv": agent(&["--hang"])});
    let (c, head, v) = http_with(
        &sock,
        "POST",
        "/api/agents",
        &[("Idempotency-Key", key)],
        Some(&mine),
    );
    assert_eq!(c, 201, "the operator's request is its own: {v}");
    assert_eq!(v["name"], "mine", "{v}");
    assert!(
        !head.to_ascii_lowercase().contains("idempotent-replayed"),
        "{head}"
    );
    // Its retry replays its own answer.
    let (c, head, again) = http_with(
        &sock,
        "POST",
        "/api/agents",
        &[("Idempotency-Key", key)],
        Some(&mine),
    );
    assert_eq!(c, 201, "{again}");
    assert_eq!(again["name"], "mine", "{again}");
    assert!(
        head.to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{head}"
    );
    // Reused for another request: a 422 naming the operator's own only.
    let other = json!({"name": "other", "argv": ["true"]});
    let (c, _, v) = http_with(
        &sock,
        "POST",
        "/api/agents",
        &[("Idempotency-Key", key)],
        Some(&other),
    );
    assert_eq!(c, 422, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("user:"), "{m}");
    assert!(
        !m.contains("squatter"),
        "names another caller's request: {m}"
    );
    // And the squatter's own retry is still its own.
    let said = run_sh(
        &sock,
        "squatter2",
        &curl(
            "POST",
            "/api/agents",
            &[&format!("Idempotency-Key: {key}")],
            &json!({"name": "squatted2", "argv": ["true"]}),
        ),
    );
    assert!(
        said.ends_with(" 201"),
        "another agent's key is its own: {said}"
    );
    let (c, v) = http(&sock, "POST", "/api/agents/mine/cancel", Some(&json!({})));
    assert_eq!(c, 200, "{v}");
}

/// `brood serve` with `BROOD_STORE` (and more) in its environment, once
/// its socket answers.
fn serve_env(root: &Path, env: &[(&str, &str)], args: &[&str]) -> Daemon {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe());
    c.arg("--root")
        .arg(root)
        .args(args)
        .args(["serve", "--grace", "0.3"])
        .env_remove("BROOD_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        c.env(k, v);
    }
    let d = Daemon(c.spawn().unwrap());
    let sock = root.join("brood.sock");
    assert!(
        eventually(Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "the daemon serves {}",
        sock.display()
    );
    d
}

/// `brood ARGS serve` that must exit at once: its exit code and stderr. A
/// daemon that starts instead (the attack got through) is stopped and the
/// test fails, rather than waiting on it.
fn refused_at_start(root: &Path, args: &[&str]) -> (Option<i32>, String) {
    let err = root.with_extension("stderr");
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(args)
        .arg("serve")
        .env_remove("BROOD_STORE")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    let _ = eventually(Duration::from_secs(20), || {
        status = c.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        drop(Daemon(c));
        panic!(
            "brood serve {args:?} started: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    };
    (status.code(), std::fs::read_to_string(&err).unwrap())
}

/// A PostgreSQL URL of `db` with a password in it (trust auth ignores it;
/// the test server's own, when it has one).
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (creds, host) = rest.split_once('@').unwrap();
    if creds.contains(':') {
        url.to_owned()
    } else {
        format!("{scheme}://{creds}:secret@{host}")
    }
}

/// Part of item 7: a store password is never on a command line, where every
/// local process (every agent, through the host's `/proc`) reads it.
#[test]
fn a_store_password_is_refused_on_the_command_line_and_taken_from_env_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = Fresh::new();
    let url = with_password(&db.url);

    // On the command line: refused before anything starts, saying where to put it.
    let (code, err) = refused_at_start(&dir.path().join("r0"), &["--store", &url]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("password"), "{err}");
    assert!(
        err.contains("BROOD_STORE") && err.contains("--store-file"),
        "{err}"
    );
    assert!(!err.contains("secret") && !err.contains(&url), "{err}");
    assert!(!dir.path().join("r0/brood.sock").exists());

    // From the environment: it runs on the real PostgreSQL, and its command
    // line holds no password.
    let r1 = dir.path().join("r1");
    let d1 = serve_env(&r1, &[("BROOD_STORE", &url)], &[]);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", d1.0.id())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(
        !cmdline.contains("secret") && !cmdline.contains("postgres"),
        "{cmdline}"
    );
    let sock1 = r1.join("brood.sock");
    let (c, v) = http(
        &sock1,
        "POST",
        "/api/agents",
        Some(&json!({"name": "in-pg", "argv": agent(&["--result", "kept"])})),
    );
    assert_eq!(c, 201, "{v}");
    let (_, w) = http(
        &sock1,
        "POST",
        "/api/agents/in-pg/wait",
        Some(&json!({"timeout_s": 30})),
    );
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    drop(d1);

    // From a file: refused while others may read it, taken once it is private;
    // a second root on the same store sees what the first recorded.
    let f = dir.path().join("store.url");
    std::fs::write(&f, format!("{url}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let f_arg = f.display().to_string();
    let (code, err) = refused_at_start(&dir.path().join("r2"), &["--store-file", &f_arg]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r2 = dir.path().join("r2");
    let _d2 = serve_env(&r2, &[], &["--store-file", &f_arg]);
    let (c, v) = status_of(&r2.join("brood.sock"), "in-pg");
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["result"], "kept", "{v}");
}
