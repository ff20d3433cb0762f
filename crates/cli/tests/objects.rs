//! The agent object and the session (SPEC 3, issue 5 items 1-2): every control
//! file of `agent/<name>.d/` in its exact format, the session's files, and a
//! `temp` agent's object removed after its run.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use brood_runtime::supervisor::handle;
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_control_file_is_written_in_its_format() {
    let env = start(Duration::from_millis(300));
    let policy = json!({
        "groups": [],
        "env": {"GREETING": "hello world", "EMPTY": ""},
        "path": ["core", "extra"],
        "mounts": ["/usr\t/usr\tro\tbind,nosuid", "/tmp\t/scratch\trw\trbind"],
        "models": ["m-small"],
    });
    // r creates its own child k (owner agent:r); the user creates r.
    let kid = json!({"name": "k", "argv": agent(&["--hang"]), "policy": {"env": {}, "mounts": ["/usr\t/usr\tro\tbind,nosuid"]}});
    let args = json!({
        "name": "r",
        "argv": agent(&["--spawn", &kid.to_string(), "--hang"]),
        "cwd": "/tmp",
        "policy": policy,
        "await_ready": true,
    });
    handle(&env.sup, &me(), "spawn", &args).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || env
        .sup
        .view()
        .agent(&name("k"))
        .is_ok_and(|a| a.status.is_live())));
    env.sup.flush().await;
    let r = show(&env, "r");
    let d = env.sup.paths().agent_dir(&name("r"));
    let file = |f: &str| read(d.join(f));
    assert_eq!(file("parent"), "\n", "a root has no parent");
    assert_eq!(file("life"), "owned\n");
    assert_eq!(file("owner"), "user:0\n");
    assert_eq!(file("label"), "\n");
    assert_eq!(file("uid"), format!("{}\n", unsafe_uid()));
    assert_eq!(file("gid"), format!("{}\n", unsafe_gid()));
    assert_eq!(file("groups"), "");
    assert_eq!(file("iso"), "none\n");
    assert_eq!(file("root"), "\n");
    assert_eq!(file("cwd"), "/tmp\n");
    assert_eq!(file("env"), "EMPTY=\nGREETING=hello world\n");
    assert_eq!(file("path"), "core\nextra\n");
    assert_eq!(
        file("mount"),
        "/usr\t/usr\tro\tbind,nosuid\n/tmp\t/scratch\trw\trbind\n"
    );
    assert_eq!(file("model"), "m-small\n");
    // A root's window is unknown (the operator's is), so it names none.
    assert_eq!(file("window"), "\n");
    let p: serde_json::Value = serde_json::from_str(&file("policy")).unwrap();
    assert_eq!(p["path"], json!(["core", "extra"]));
    assert_eq!(file("status"), "busy\n");
    assert_eq!(file("pid"), format!("{}\n", r["pid"]));
    let meta: serde_json::Value = serde_json::from_str(&file("meta.json")).unwrap();
    assert!(
        meta.is_object() && meta["containment"].is_object(),
        "{meta}"
    );
    assert!(d.join("log").exists());

    let kd = env.sup.paths().agent_dir(&name("k"));
    assert_eq!(
        read(kd.join("parent")),
        format!(
            "agent:r session:default run:{}\n",
            r["run"].as_str().unwrap()
        )
    );
    assert_eq!(read(kd.join("owner")), "agent:r\n");
    assert_eq!(read(kd.join("env")), "");
    assert_eq!(read(kd.join("mount")), "/usr\t/usr\tro\tbind,nosuid\n");
    // What a child inherits: the one model, the tool tiers.
    assert_eq!(read(kd.join("model")), "m-small\n");
    assert_eq!(read(kd.join("path")), "core\nextra\n");

    // The session's files (SPEC 3).
    let s = session_dir(&env, "k");
    for f in [
        "messages.jsonl",
        "events.jsonl",
        "latest.md",
        "state",
        "cwd",
        "created_at",
        "updated_at",
        "meta.json",
    ] {
        assert!(s.join(f).is_file(), "session file {f} missing");
    }
    assert!(s.join("context").is_dir());
    assert_eq!(read(s.join("cwd")), "\n");
    let sm: serde_json::Value = serde_json::from_str(&read(s.join("meta.json"))).unwrap();
    assert_eq!(sm["agent"], "k");
    assert_eq!(sm["parent"], "r");
    assert_eq!(sm["session"], "default");
    env.sup.cancel(me(), name("r")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temp_agent_is_removed_after_its_run_and_comes_back_on_resume() {
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(me(), req("p", agent(&["--hang"])))
        .await
        .unwrap();
    let args = json!({"name": "t", "parent": "p", "life": "temp", "argv": agent(&["--result", "temp done"])});
    handle(&env.sup, &me(), "spawn", &args).await.unwrap();
    env.sup
        .wait(me(), vec![name("t")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup.flush().await;
    let td = env.sup.paths().agent_dir(&name("t"));
    assert!(!td.exists(), "{} outlived its run", td.display());
    // Its record, and the parent's channel with the result, stay.
    assert_eq!(show(&env, "t")["status"], "completed");
    let ch = env.sup.paths().channel_dir(
        &name("p"),
        &brood_core::SessionName::default_session(),
        &name("t"),
    );
    assert_eq!(read(ch.join("result.md")), "temp done");
    // An owned sibling keeps its object.
    let args = json!({"name": "o", "parent": "p", "argv": agent(&["--result", "kept"])});
    handle(&env.sup, &me(), "spawn", &args).await.unwrap();
    env.sup
        .wait(me(), vec![name("o")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup.flush().await;
    assert_eq!(
        read(env.sup.paths().agent_dir(&name("o")).join("status")),
        "dead\n"
    );
    env.sup.cancel(me(), name("p")).await.unwrap();
}

fn unsafe_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn unsafe_gid() -> u32 {
    // SAFETY: getegid cannot fail.
    unsafe { libc::getegid() }
}

/// SPEC 3: no file is ever written through a symlink. One planted where a
/// control file goes is not followed when the agent's status changes, and
/// `brood fsck` fails naming it instead of writing through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_symlink_is_not_followed() {
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(me(), req("p", agent(&["--inputs", "1", "--result", "ok"])))
        .await
        .unwrap();
    env.sup.flush().await;
    let outside = env.root().join("outside.txt");
    std::fs::write(&outside, "untouched\n").unwrap();
    let status = env.sup.paths().agent_dir(&name("p")).join("status");
    std::fs::remove_file(&status).unwrap();
    std::os::unix::fs::symlink(&outside, &status).unwrap();
    // The agent ends: its status changes, and the projection meets the link.
    env.sup.send(me(), name("p"), "go".into()).await.unwrap();
    env.sup
        .wait(me(), vec![name("p")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup.flush().await;
    assert_eq!(show(&env, "p")["status"], "completed");
    assert_eq!(read(&outside), "untouched\n");
    assert!(
        std::fs::symlink_metadata(&status)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced instead of refused"
    );
    let o = brood(env.root(), &["fsck"]);
    assert!(!o.status.success(), "fsck wrote through a symlink");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{} is a symlink", status.display())),
        "{err}"
    );
    assert_eq!(read(&outside), "untouched\n");
    // Once the operator removes it, fsck writes the file.
    std::fs::remove_file(&status).unwrap();
    let o = brood(env.root(), &["fsck"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(read(&status), "dead\n");
}
