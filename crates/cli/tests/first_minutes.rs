//! Issue 25, "the first five minutes", items 1 and 2, with the real binary
//! on real roots: programs start as a shell would start them (a relative
//! program, root and directory; a missing program refused at the door by
//! the name it was given, leaving no record; piped stdin as the task;
//! `--protocol auto` never passing a protocol agent's handshake off as a
//! result), and failures say why where the user is (`run` and `wait` print
//! the detail and the stderr's end, `brood logs [-f]`, `brood show`'s
//! tails and times, a job's failed attempts with their worker's cause).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// `brood` run in directory `dir`, with `stdin` written to it when given.
fn brood_in(dir: &Path, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe())
        .args(args)
        .current_dir(dir)
        .env_remove("BROOD_SOCKET")
        .env_remove("BROOD_ROOT")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        let mut i = c.stdin.take().unwrap();
        i.write_all(s.as_bytes()).unwrap();
    }
    c.wait_with_output().unwrap()
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn agents(root: &Path) -> Vec<String> {
    let o = brood(root, &["ps", "-a", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A brood-protocol agent written as a script: it says ready, a message
/// for the transcript and a line on stderr, then, after one input, another
/// line on stderr and its result.
const PROTO: &str = r#"read -r init
echo '{"type":"ready"}'
echo '{"type":"message","role":"assistant","content":"thinking hard"}'
echo "first line" >&2
if [ "$1" = wait ]; then read -r input; fi
echo "second line" >&2
echo '{"type":"done","result":{"response":"the answer"}}'"#;

#[test]
fn programs_start_in_the_callers_directory_found_as_a_shell_finds_them() {
    let w = tempfile::tempdir().unwrap();
    let wd = std::fs::canonicalize(w.path()).unwrap();
    script(&wd.join("my-agent"), "echo \"hello from $(pwd)\"");
    std::fs::create_dir(wd.join("bin")).unwrap();
    script(&wd.join("bin/x"), "echo x ran");
    std::fs::write(wd.join("plain"), "not a program").unwrap();

    // A relative root and a relative program, as README writes them: the
    // program runs in the caller's directory.
    let o = brood_in(&wd, &["--root", "rt", "run", "--", "./my-agent"], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(out(&o), format!("hello from {}\n", wd.display()));
    assert!(wd.join("rt/brood.db").is_file(), "the root is ./rt");
    let root = wd.join("rt");
    let o = brood_in(&wd, &["--root", "rt", "run", "--", "bin/x"], None);
    assert_eq!(out(&o), "x ran\n", "{}", text(&o));
    // --cwd chooses another directory.
    let o = brood_in(
        &wd,
        &["--root", "rt", "run", "--cwd", "/", "--", "pwd"],
        None,
    );
    assert_eq!(out(&o), "/\n", "{}", text(&o));
    let before = agents(&root);
    assert_eq!(before.len(), 3, "{before:?}");

    // Refused at the door, by the name the caller gave, with exit 2 and
    // nothing recorded.
    for (prog, why) in [
        ("./nosuch", "does not exist"),
        ("./plain", "is not executable"),
        ("no-such-program-25", "not found"),
    ] {
        let o = brood_in(&wd, &["--root", "rt", "run", "--", prog], None);
        assert_eq!(o.status.code(), Some(2), "{prog}: {}", text(&o));
        let e = err(&o);
        assert!(
            e.contains(&format!("{prog:?}")) && e.contains(why),
            "{prog}: {e}"
        );
        assert!(!e.contains("failed (exit_code)"), "{e}");
    }
    assert_eq!(agents(&root), before, "a refused program leaves no record");

    // Piped stdin is the task; --task - says so explicitly.
    let o = brood_in(
        &wd,
        &["--root", "rt", "run", "--protocol", "exec", "--", "cat"],
        Some("hi\n"),
    );
    assert_eq!(out(&o), "hi\n", "{}", text(&o));
    let o = brood_in(
        &wd,
        &[
            "--root", "rt", "run", "--task", "-", "--", "tr", "a-z", "A-Z",
        ],
        Some("shout"),
    );
    assert_eq!(out(&o), "SHOUT\n", "{}", text(&o));

    // The same through a daemon with `spawn`.
    let _d = serve_daemon(&root, None);
    let o = brood_in(
        &wd,
        &["--root", "rt", "spawn", "--name", "sp", "--", "./my-agent"],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood_in(
        &wd,
        &[
            "--root",
            "rt",
            "spawn",
            "--name",
            "piped",
            "--protocol",
            "exec",
            "--",
            "cat",
        ],
        Some("from a pipe\n"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(&root, &["wait", "sp", "piped"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let result = |n: &str| {
        let o = brood(&root, &["show", n, "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["result"].as_str().unwrap_or("").to_owned()
    };
    assert_eq!(result("sp"), format!("hello from {}\n", wd.display()));
    assert_eq!(result("piped"), "from a pipe\n");
    let o = brood_in(&wd, &["--root", "rt", "spawn", "--", "./nosuch"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        err(&o).contains("\"./nosuch\" does not exist"),
        "{}",
        text(&o)
    );
}

#[test]
fn auto_never_reports_a_protocol_agents_handshake_as_its_result() {
    let w = tempfile::tempdir().unwrap();
    let wd = std::fs::canonicalize(w.path()).unwrap();
    script(&wd.join("proto-agent"), PROTO);
    // Run as a plain program (auto cannot tell it speaks the protocol), its
    // answer is its handshake: refused as a result, with the way out.
    let o = brood_in(&wd, &["--root", "rt", "run", "--", "./proto-agent"], None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!out(&o).contains("ready"), "{}", text(&o));
    assert!(
        err(&o).contains("handshake") && err(&o).contains("--protocol brood"),
        "{}",
        text(&o)
    );
    let o = brood_in(
        &wd,
        &[
            "--root",
            "rt",
            "run",
            "--protocol",
            "brood",
            "--",
            "./proto-agent",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(out(&o), "the answer\n");
    // Asked for exec, the same output is the result: the caller said so.
    let o = brood_in(
        &wd,
        &[
            "--root",
            "rt",
            "run",
            "--protocol",
            "exec",
            "--",
            "./proto-agent",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(out(&o).starts_with("{\"type\":\"ready\"}"), "{}", text(&o));
}

#[test]
fn a_failure_prints_its_reason_detail_and_stderr_where_the_user_is() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let o = brood(
        root,
        &[
            "run",
            "--name",
            "f",
            "--",
            "sh",
            "-c",
            "echo oops >&2; exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e = err(&o);
    assert!(
        e.contains("f failed (exit_code): exit code 3") && e.contains("  oops"),
        "{e}"
    );
    // `wait` through a daemon, and its detail for every other surface.
    let _d = serve_daemon(root, None);
    let o = brood(
        root,
        &[
            "spawn",
            "--name",
            "g",
            "--",
            "sh",
            "-c",
            "echo 'no provider: give --provider' >&2; exit 4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = brood(root, &["wait", "g"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(out(&o).contains("g\tfailed (exit_code)"), "{}", text(&o));
    assert!(
        err(&o).contains("exit code 4") && err(&o).contains("  no provider: give --provider"),
        "{}",
        text(&o)
    );
    let o = brood(root, &["show", "g", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["detail"], "exit code 4; stderr tail: no provider: give --provider",
        "{v}"
    );
}

#[test]
fn logs_follow_a_running_agent_and_show_gives_tails_and_times() {
    let dir = tempfile::tempdir().unwrap();
    let root = &dir.path().join("root");
    // The program outside the root (which is hidden from every agent).
    let prog = dir.path().join("proto-agent");
    script(&prog, PROTO);
    let prog = prog.display().to_string();
    let d = serve_daemon(root, None);
    let o = brood(
        root,
        &[
            "spawn",
            "--name",
            "p",
            "--ready",
            "--protocol",
            "brood",
            "--",
            &prog,
            "wait",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // While it runs: what it said so far, and its log.
    assert!(
        eventually(Duration::from_secs(10), || {
            let o = brood(root, &["logs", "p"]);
            out(&o) == "assistant: thinking hard\n" && err(&o) == "first line\n"
        }),
        "{}",
        text(&brood(root, &["logs", "p"]))
    );
    // Following: it prints as the agent goes, and ends when the agent does.
    #[allow(clippy::disallowed_methods)]
    let follower = Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(["logs", "-f", "p"])
        .env_remove("BROOD_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = brood(root, &["send", "p", "go on"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = follower.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(err(&o), "first line\nsecond line\n", "{}", text(&o));
    assert!(
        out(&o).starts_with("assistant: thinking hard\n"),
        "{}",
        text(&o)
    );

    let shown = |root: &Path| {
        let o = brood(root, &["show", "p"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        out(&o)
    };
    let check = |s: &str| {
        assert!(s.contains("transcript ("), "{s}");
        assert!(s.contains("  assistant: thinking hard\n"), "{s}");
        assert!(s.contains("log (") && s.contains("  second line\n"), "{s}");
        let times = regex::Regex::new(
            r"(?m)^created +\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC \((\d+ (s|min|h|d) ago|in \d+ s)\)$",
        )
        .unwrap();
        assert!(times.is_match(s), "{s}");
        assert!(!s.contains("created_ms"), "{s}");
    };
    check(&shown(root));
    // `--json` stays a machine's.
    let o = brood(root, &["show", "p", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["created_ms"].is_i64(), "{v}");
    // Without a daemon: the store and the ctx tree.
    drop(d);
    let o = brood(root, &["logs", "p"]);
    assert_eq!(
        out(&o),
        "assistant: thinking hard\nuser: go on\n",
        "{}",
        text(&o)
    );
    assert_eq!(err(&o), "first line\nsecond line\n", "{}", text(&o));
    check(&shown(root));
    let o = brood(root, &["logs", "ghost"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
}

/// A log the agent replaced with a link to a file it may not read is not
/// read through the link for the caller.
#[test]
fn a_log_replaced_by_a_symlink_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let o = brood(
        root,
        &["run", "--name", "l", "--", "sh", "-c", "echo mine >&2"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let secret = root.join("secret");
    std::fs::write(
        &secret,
        "{\"ts\":1,\"run\":\"r\",\"stream\":\"stderr\",\"text\":\"SECRET\"}\n",
    )
    .unwrap();
    let log = root.join("ctx/agent/l.d/log");
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&secret, &log).unwrap();
    let o = brood(root, &["logs", "l"]);
    assert!(!text(&o).contains("SECRET"), "{}", text(&o));
    let _d = serve_daemon(root, None);
    let (_, v) = http(&root.join("brood.sock"), "GET", "/api/agents/l/log", None);
    assert!(!v.to_string().contains("SECRET"), "{v}");
}

#[test]
fn a_jobs_failed_attempts_carry_their_workers_cause() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let _d = serve_daemon(root, None);
    let mut args = vec!["spawn", "--name", "owner", "--ready", "--"];
    let a = agent(&["--hang"]);
    args.extend(a.iter().map(String::as_str));
    let o = brood(root, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let input = root.join("in.csv");
    std::fs::write(&input, "id,text\na,hello\n").unwrap();
    // The default worker, `brood agent`, without a provider: the cause is
    // the reference agent's own, not "ended without reporting" alone.
    let o = brood(
        root,
        &[
            "job",
            "run",
            "--owner",
            "owner",
            "--id",
            "j",
            "--instruction",
            "say {text}",
            "--input",
            input.to_str().unwrap(),
            "--max-attempts",
            "2",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e = err(&o);
    assert!(e.contains("item 1 failed:"), "{e}");
    assert_eq!(e.matches("  attempt ").count(), 2, "{e}");
    assert!(e.contains("no provider"), "{e}");
    let o = brood(root, &["job", "items", "j"]);
    assert!(out(&o).contains("no provider"), "{}", text(&o));
}

/// Issue 25 item 4: `brood run` on a root a daemon serves is that daemon's
/// client (it used to refuse), prints what an in-process run prints, and
/// the daemon keeps the record.
#[test]
fn run_on_a_served_root_is_the_daemons_client() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let r = root.display().to_string();
    let o = brood_in(
        dir.path(),
        &[
            "--root",
            &r,
            "run",
            "--name",
            "via",
            "--",
            "sh",
            "-c",
            "echo hello from $PWD",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(out(&o), format!("hello from {}\n", dir.path().display()));
    assert!(err(&o).contains("via"), "the tree on stderr: {}", text(&o));
    let o = brood_in(
        dir.path(),
        &[
            "--root",
            &r,
            "run",
            "--name",
            "oops",
            "--",
            "sh",
            "-c",
            "echo bad >&2; exit 3",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        err(&o).contains("exit_code") && err(&o).contains("bad"),
        "{}",
        text(&o)
    );
    // The daemon ran both: they are its agents, still there after the runs.
    let names = agents(&root);
    assert!(
        names.contains(&"via".to_owned()) && names.contains(&"oops".to_owned()),
        "{names:?}"
    );
}
