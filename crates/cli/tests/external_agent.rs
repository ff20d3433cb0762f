//! An existing agent CLI as a contained brood child (issue 13 item 7):
//! Claude Code, installed from npm by `.ci/setup`, run with `protocol =
//! exec` (the task on its stdin, its `-p` answer on stdout is the result)
//! against an Anthropic Messages server on loopback that scripts its model.
//! It completes the task with its own Bash tool, that tool cannot read a
//! file the policy hides (the kernel refuses it inside brood's sandbox), and
//! it dies with its parent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::anthropic::{Anthropic, tool_result};
use common::*;
use serde_json::json;

fn claude() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/ci-node/node_modules/@anthropic-ai/claude-code-linux-x64/claude");
    assert!(
        p.exists(),
        "{} is missing: run `bash .ci/setup` (it installs Claude Code from npm)",
        p.display()
    );
    p
}

/// Claude Code as a brood child: non-interactive, its Bash tool allowed,
/// its model at `base_url`, its home in `home`, `secret` hidden.
fn claude_child(
    name: &str,
    base_url: &str,
    home: &Path,
    work: &Path,
    secret: &Path,
) -> brood_runtime::SpawnRequest {
    let argv = vec![
        claude().display().to_string(),
        "-p".into(),
        "--output-format".into(),
        "text".into(),
        "--allowedTools".into(),
        "Bash".into(),
    ];
    let mut r = req(name, argv);
    r.protocol = brood_store::Protocol::Exec;
    r.await_ready = false;
    r.task = "Run the command you are given, then report.".into();
    r.cwd = Some(work.display().to_string());
    r.policy = Some(json!({
        "files": [
            {"path": "/", "mode": "ro"},
            {"path": work.display().to_string(), "mode": "rw"},
            {"path": home.display().to_string(), "mode": "rw"},
            {"path": "/tmp", "mode": "rw"},
            {"path": secret.display().to_string(), "mode": "hidden"},
        ],
        // Only what it needs reaches it: its model's address and key, and
        // its own switches; nothing else of the test's environment.
        "env": {
            "HOME": home.display().to_string(),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-test-not-a-key",
            // Its scratch directory inside its home: a new entry directly in
            // /tmp is refused, since /tmp holds the hidden `secret` (landlock
            // grants are fixed at start, so new siblings fail closed).
            "CLAUDE_CODE_TMPDIR": home.join("tmp").display().to_string(),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
    }));
    r
}

struct Dirs {
    _t: tempfile::TempDir,
    home: PathBuf,
    work: PathBuf,
    secret: PathBuf,
}

fn dirs() -> Dirs {
    let t = tempfile::tempdir().unwrap();
    let (home, work, secret) = (
        t.path().join("home"),
        t.path().join("work"),
        t.path().join("secret"),
    );
    for d in [&home, &work, &secret] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Claude Code wants its scratch directory private (0700) and existing.
    let tmp = home.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(secret.join("key.txt"), "the-secret-value\n").unwrap();
    Dirs {
        _t: t,
        home,
        work,
        secret,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_as_a_contained_child() {
    let env = start(Duration::from_millis(500));
    let d = dirs();
    let command = format!(
        "cat {}/key.txt; echo written > {}/out.txt; echo status $?",
        d.secret.display(),
        d.work.display()
    );
    let model = Anthropic::start(command, false).await;
    env.sup
        .spawn(
            me(),
            claude_child("claude", &model.base_url, &d.home, &d.work, &d.secret),
        )
        .await
        .unwrap();
    let r = env
        .sup
        .wait(me(), vec![name("claude")], Some(Duration::from_secs(120)))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    let a = &r["agents"][0];
    assert_eq!(
        a["status"],
        "completed",
        "{a}\nlog: {}",
        read(env.sup.paths().agent_dir(&name("claude")).join("log"))
    );
    // It completed the scripted task with its own tool: the file it wrote is
    // there, and its answer is its result.
    assert_eq!(read(d.work.join("out.txt")), "written\n");
    let result = a["result"].as_str().unwrap();
    assert!(result.starts_with("done:"), "{result}");
    // Its Bash tool could not read what the policy hides, and the model was told.
    let bodies = model.bodies();
    let told = bodies
        .iter()
        .find_map(tool_result)
        .expect("the tool's result reached the model");
    assert!(told.contains("Permission denied"), "{told}");
    assert!(
        !told.contains("the-secret-value") && !result.contains("the-secret-value"),
        "{told}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_dies_with_its_parent() {
    let env = start(Duration::from_millis(500));
    let d = dirs();
    // Its model never answers: it is mid-call when its parent goes.
    let model = Anthropic::start("true".into(), true).await;
    let mut c = claude_child("claude", &model.base_url, &d.home, &d.work, &d.secret);
    // The parent holds what it passes on (the child asks no more than that).
    let mut p = req("p", agent(&["--hang"]));
    p.policy = c.policy.clone();
    env.sup.spawn(me(), p).await.unwrap();
    c.parent = Some(name("p"));
    env.sup.spawn(me(), c).await.unwrap();
    assert!(
        eventually_async(Duration::from_secs(60), || !model.bodies().is_empty()).await,
        "Claude Code called its model"
    );
    let pids = processes_of(&env, "claude");
    assert!(!pids.is_empty());
    env.sup.cancel(me(), name("p")).await.unwrap();
    let r = env
        .sup
        .wait(me(), vec![name("claude")], Some(Duration::from_secs(20)))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    let a = &r["agents"][0];
    assert_eq!(
        (a["status"].as_str(), a["reason"].as_str()),
        (Some("cancelled"), Some("parent_dead")),
        "{a}"
    );
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "{pids:?}"
    );
}
