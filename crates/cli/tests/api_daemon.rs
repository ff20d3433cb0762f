//! The API of a real `brood serve`: idempotency keys that outlive a restart,
//! and the CLI as a client of the API, over TCP with the token (where no
//! store fallback exists, so every answer came through the API) and over the
//! socket, `brood events -f` following the SSE stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::wire::*;
use common::*;
use serde_json::{Value, json};

/// `brood ARGS` with extra environment, as a user outside any agent.
fn brood_env(root: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe());
    c.arg("--root")
        .arg(root)
        .args(args)
        .env_remove("BROOD_SOCKET");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_gets_the_first_answer_across_a_daemon_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let to = To::Unix(root.join("brood.sock"));
    let body = json!({"name": "once", "argv": agent(&["--result", "done"])}).to_string();
    let key = [("Idempotency-Key", "create-once-7f3a")];
    let d = serve_daemon(&root, None);
    let first = raw(&to, "POST", "/api/agents", &key, body.as_bytes()).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let w = raw(
        &to,
        "POST",
        "/api/agents/once/wait",
        &[],
        br#"{"timeout_s": 20}"#,
    )
    .await;
    assert_eq!(w.json()["agents"][0]["status"], "completed", "{}", w.body);
    drop(d); // SIGTERM, and reaped

    let _d = serve_daemon(&root, None);
    let again = raw(&to, "POST", "/api/agents", &key, body.as_bytes()).await;
    assert_eq!(
        (again.status, &again.body),
        (201, &first.body),
        "the first answer, kept"
    );
    assert!(
        again.headers.contains("idempotent-replayed: true"),
        "{}",
        again.headers
    );
    // Not done again: one agent, one run.
    let show = raw(&to, "GET", "/api/agents/once", &[], b"").await.json();
    assert_eq!(show["runs"].as_array().unwrap().len(), 1, "{show}");
    let all = raw(&to, "GET", "/api/agents?all=true", &[], b"")
        .await
        .json();
    assert_eq!(all["agents"].as_array().unwrap().len(), 1, "{all}");
    // The same key for another request is refused, after the restart too.
    let other = json!({"name": "twice", "argv": agent(&[])}).to_string();
    let a = raw(&to, "POST", "/api/agents", &key, other.as_bytes()).await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "IdempotencyMismatch");
    // Without a key, a retry is a new request (and here a taken name).
    let a = raw(&to, "POST", "/api/agents", &[], body.as_bytes()).await;
    assert_eq!(a.status, 409, "{}", a.body);
}

#[test]
fn the_cli_is_a_client_of_the_api_over_tcp_and_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    // Only loopback is served, and the refusal says so before anything starts.
    let o = brood(&root, &["serve", "--listen", "0.0.0.0:8420"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("loopback"), "{}", text(&o));
    assert!(!root.join("brood.sock").exists());

    let addr = format!("127.0.0.1:{}", free_port());
    let _d = serve_daemon(&root, Some(&addr));
    let token = std::fs::read_to_string(root.join("token"))
        .unwrap()
        .trim()
        .to_owned();
    let url = format!("http://{addr}");
    // Another root: nothing local to fall back on, so every answer is the API's.
    let elsewhere = dir.path().join("elsewhere");
    let tcp = |args: &[&str]| {
        let mut all = vec!["--url", url.as_str()];
        all.extend(args);
        brood_env(&elsewhere, &[("BROOD_TOKEN", &token)], &all)
    };
    let hang = agent(&["--hang"]);
    let mut spawn = vec!["spawn", "--name", "a", "--ready", "--"];
    spawn.extend(hang.iter().map(String::as_str));
    let o = tcp(&spawn);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("a\trunning\t"),
        "{}",
        text(&o)
    );
    let o = tcp(&["ps", "--json"]);
    let ps: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ps[0]["name"], "a", "{}", text(&o));
    let o = tcp(&["show", "a", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["status"],
        "running"
    );
    let o = tcp(&["tree"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("a  running"),
        "{}",
        text(&o)
    );
    let o = tcp(&["wait", "a", "--timeout", "0.2"]);
    assert_eq!(o.status.code(), Some(2), "timed out: {}", text(&o));
    let o = tcp(&["cancel", "a"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = tcp(&["wait", "a"]);
    assert_eq!(o.status.code(), Some(130), "cancelled: {}", text(&o));
    let o = tcp(&["events"]);
    let types: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        types.first().map(String::as_str),
        Some("agent.spawn"),
        "{types:?}"
    );
    assert!(types.contains(&"agent.stop".to_owned()), "{types:?}");
    // Errors keep their exit codes; a wrong token is refused.
    let o = tcp(&["show", "ghost"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = brood_env(
        &elsewhere,
        &[("BROOD_TOKEN", "wrong")],
        &["--url", &url, "ps"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("Unauthorized"), "{}", text(&o));
    let o = brood_env(&elsewhere, &[], &["--url", "https://example.org", "ps"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // `brood events -f` over the socket follows the SSE stream: an agent
    // created after it started shows up.
    #[allow(clippy::disallowed_methods)]
    let mut follow = Command::new(exe())
        .arg("--root")
        .arg(&root)
        .args(["events", "-f"])
        .env_remove("BROOD_SOCKET")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    // The backlog first (a's events), then what happens next.
    let mut seen = Vec::new();
    let o = brood(
        &root,
        &["spawn", "--name", "later", "--", "sh", "-c", "echo hi"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    while !seen
        .iter()
        .any(|t: &Value| t["agent"] == "later" && t["type"] == "agent.stop")
    {
        let l = lines.next().expect("events -f printed more").unwrap();
        seen.push(serde_json::from_str(&l).unwrap());
    }
    let seqs: Vec<i64> = seen
        .iter()
        .map(|e| e["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "each once, in order"
    );
    let _ = follow.kill();
    let _ = follow.wait();
}

/// Issue 25 item 9: a client's error (a taken name, an unknown agent) is
/// answered with its code and is not logged as the daemon's own error.
#[test]
fn a_clients_error_is_not_logged_as_the_daemons() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let log = dir.path().join("daemon.log");
    #[allow(clippy::disallowed_methods)]
    let child = Command::new(exe())
        .arg("--root")
        .arg(&root)
        .args(["serve", "--grace", "0.3"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _d = Daemon(child);
    let sock = root.join("brood.sock");
    // The file exists from bind(2) on, before the daemon listens: wait
    // until a connection is taken.
    assert!(
        eventually(std::time::Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "the daemon's socket"
    );
    let body = json!({"name": "x", "argv": ["/bin/sleep", "30"], "protocol": "exec"});
    assert_eq!(http(&sock, "POST", "/api/agents", Some(&body)).0, 201);
    assert_eq!(http(&sock, "POST", "/api/agents", Some(&body)).0, 409);
    assert_eq!(
        http(&sock, "POST", "/api/agents/nosuch/cancel", Some(&json!({}))).0,
        404
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("ERROR"),
        "the daemon logged a client's error as its own:\n{text}"
    );
}
