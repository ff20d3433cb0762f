//! Names, resume, send, close and wait through the supervisor's API.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use brood_core::Code;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_and_nothing_is_created() {
    let env = start(Duration::from_millis(500));
    let long = "a".repeat(65);
    for bad in ["../x", "a/b", "x.sock", long.as_str(), ""] {
        let args = json!({"name": bad, "argv": agent(&["--result", "x"])});
        let e = handle(&env.sup, &me(), "spawn", &args).await.unwrap_err();
        assert_eq!(e.code, Code::InvalidName, "{bad:?}: {e}");
        assert!(
            e.message.contains(&bad.escape_debug().to_string()) || bad.is_empty(),
            "{bad:?}: {e}"
        );
    }
    assert!(
        env.sup
            .store()
            .agents(env.sup.tenant(), true)
            .unwrap()
            .is_empty()
    );
    let agents_dir = env.sup.paths().ctx().join("agent");
    // No agent's files: the directory is empty, or not made yet.
    if let Some(d) = unless_gone(std::fs::read_dir(&agents_dir), &agents_dir) {
        assert_eq!(d.count(), 0, "{}", agents_dir.display());
    }
    // And the same name twice is NameTaken.
    env.sup
        .spawn(me(), req("twice", agent(&["--hang"])))
        .await
        .unwrap();
    let e = env
        .sup
        .spawn(me(), req("twice", agent(&["--hang"])))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NameTaken, "{e}");
    env.sup.cancel(me(), name("twice")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_starts_a_new_run_that_sees_its_history() {
    let env = start(Duration::from_millis(500));
    env.sup
        .spawn(
            me(),
            req(
                "mem",
                agent(&[
                    "--message",
                    "I remember this",
                    "--history",
                    "--result",
                    "first",
                ]),
            ),
        )
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("mem")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed");
    let run1 = w["agents"][0]["run"].as_str().unwrap().to_owned();

    let r = env
        .sup
        .resume(me(), name("mem"), Some("second question".into()))
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    assert_ne!(r["run"].as_str().unwrap(), run1, "a new run");
    let w = env
        .sup
        .wait(me(), vec![name("mem")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    let res = a["result"].as_str().unwrap();
    assert!(
        res.contains("assistant: I remember this"),
        "the new run sees the old message: {res}"
    );
    assert!(
        res.contains("user: second question"),
        "and the new input: {res}"
    );
    let shown = show(&env, "mem");
    assert_eq!(shown["runs"].as_array().unwrap().len(), 2);
    // Both runs' messages are in the one session transcript.
    env.sup.flush().await;
    let msgs = json_lines(session_dir(&env, "mem").join("messages.jsonl"));
    assert!(
        msgs.iter()
            .filter(|m| m["content"] == "I remember this")
            .count()
            >= 2,
        "{msgs:?}"
    );
    // Resuming a running agent is a conflict.
    env.sup
        .spawn(me(), req("busy", agent(&["--hang"])))
        .await
        .unwrap();
    let e = env.sup.resume(me(), name("busy"), None).await.unwrap_err();
    assert_eq!(e.code, Code::Conflict);
    env.sup.cancel(me(), name("busy")).await.unwrap();
}

/// An init larger than the stdin pipe (a resumed run with a long history): the
/// launch puts what fits in the pipe before the agent starts, the supervisor
/// sends the rest, and the agent reads one whole init.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_larger_than_the_pipe_arrives_whole() {
    let env = start(Duration::from_millis(500));
    let long = format!("{}END", "x".repeat(100_000));
    env.sup
        .spawn(
            me(),
            req(
                "long",
                agent(&["--message", &long, "--history", "--result", "r"]),
            ),
        )
        .await
        .unwrap();
    env.sup
        .wait(me(), vec![name("long")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup
        .resume(me(), name("long"), Some("and then".into()))
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("long")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    let res = a["result"].as_str().unwrap();
    assert!(res.contains("xEND"), "the whole long message came back");
    assert!(res.contains("user: and then"), "and the input after it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_close_and_wait_timeout() {
    let env = start(Duration::from_millis(500));
    env.sup
        .spawn(
            me(),
            req("ear", agent(&["--inputs", "2", "--result", "heard"])),
        )
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("ear")], Some(Duration::from_millis(200)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], true);
    env.sup.send(me(), name("ear"), "one".into()).await.unwrap();
    env.sup.send(me(), name("ear"), "two".into()).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("ear")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["result"], "heard\none\ntwo", "{w}");
    let e = env
        .sup
        .send(me(), name("ear"), "three".into())
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Conflict, "{e}");
    let c = env.sup.close(me(), name("ear")).await.unwrap();
    let c = serde_json::to_value(&c).unwrap();
    assert_eq!(c["status"], "closed");
    assert_eq!(c["state"], "closed/completed");
    // A closed agent can still be resumed.
    let r = env
        .sup
        .resume(me(), name("ear"), Some("again".into()))
        .await;
    assert!(r.is_ok(), "{r:?}");
    env.sup.cancel(me(), name("ear")).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("ear")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["state"], "cancelled:user");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_built_from_nothing() {
    let env = start(Duration::from_millis(500));
    let mut r = req("envy", vec!["sh".into(), "-c".into(), "env | sort".into()]);
    r.protocol = brood_store::Protocol::Exec;
    r.await_ready = false;
    r.env = vec![("EXTRA".into(), "yes".into())];
    // SAFETY: the test sets a variable the agent must not inherit.
    unsafe { std::env::set_var("BROOD_TEST_SECRET", "leak") };
    env.sup.spawn(me(), r).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("envy")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let out = w["agents"][0]["result"].as_str().unwrap().to_owned();
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for must in [
        "BROOD_AGENT",
        "BROOD_RUN",
        "BROOD_PARENT",
        "BROOD_CUSTOMER",
        "BROOD_SESSION",
        "BROOD_TENANT",
        "BROOD_SOCKET",
        "BROOD_POLICY",
        "CTX_ROOT",
        "CTX_HOME",
        "CTX_AGENT",
        "HOME",
        "PATH",
        "LANG",
        "TERM",
        "EXTRA",
    ] {
        assert!(names.contains(&must), "{must} missing from {out}");
    }
    assert!(out.contains("BROOD_AGENT=envy\n"));
    assert!(
        !out.contains("BROOD_TEST_SECRET"),
        "the supervisor's environment leaked: {out}"
    );
    // Refused: a caller may not set the identity.
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"name": "forger", "argv": ["true"], "env": {"BROOD_AGENT": "root"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::BadRequest, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_child_leaves_only_an_event_in_its_parents_log() {
    let env = start(Duration::from_millis(500));
    let bad = json!({"name": "../escape", "argv": agent(&["--result", "x"])}).to_string();
    let taken = json!({"name": "twin", "argv": agent(&["--result", "x"])}).to_string();
    env.sup
        .spawn(
            me(),
            req(
                "mother",
                agent(&[
                    "--spawn",
                    &taken,
                    "--spawn",
                    &taken,
                    "--spawn",
                    &bad,
                    "--tolerate-refusal",
                    "--result",
                    "done",
                ]),
            ),
        )
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("mother")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    env.sup.flush().await;
    let ev = json_lines(session_dir(&env, "mother").join("events.jsonl"));
    let refused: Vec<&serde_json::Value> = ev
        .iter()
        .filter(|e| e["type"] == "agent.child.refused")
        .collect();
    assert_eq!(refused.len(), 2, "{ev:?}");
    assert_eq!(refused[0]["code"], "NameTaken");
    assert_eq!(refused[1]["code"], "InvalidName");
    assert_eq!(refused[1]["child"], "../escape");
    // Nothing of the refused children exists: one twin, no escape.
    let all = env.sup.store().agents(env.sup.tenant(), true).unwrap();
    let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["mother", "twin"]);
    assert!(!env.sup.paths().ctx().join("escape.d").exists());
}

/// A mount over a directory inside an agent's cgroup: `rmdir` of the group
/// then fails (EBUSY) until it is unmounted; detached on drop.
struct StuckGroup(std::path::PathBuf);

impl StuckGroup {
    fn new(group: &std::path::Path) -> StuckGroup {
        let dir = group.join("stuck");
        std::fs::create_dir(&dir).unwrap();
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let target = c(dir.to_str().unwrap());
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let r = unsafe {
            libc::mount(
                c("none").as_ptr(),
                target.as_ptr(),
                c("tmpfs").as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(
            r,
            0,
            "mount tmpfs on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        StuckGroup(dir)
    }

    fn release(&self) {
        let target = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        // SAFETY: umount2(2) with a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Drop for StuckGroup {
    fn drop(&mut self) {
        self.release();
    }
}

/// A group that cannot be confirmed empty and removed is never recorded as
/// ended: the agent stays `stopping` while the stop is retried, and ends
/// `cancelled` once the retry gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_cannot_be_removed_leaves_the_agent_stopping_and_the_stop_is_retried() {
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(me(), req("a", agent(&["--hang"])))
        .await
        .expect("spawn a");
    let pids = processes_of(&env, "a");
    assert!(!pids.is_empty());
    let group = std::path::PathBuf::from(show(&env, "a")["cgroup"].as_str().unwrap());
    let stuck = StuckGroup::new(&group);
    env.sup.cancel(me(), name("a")).await.expect("cancel a");
    // Its processes die (cgroup.kill works), but the group cannot be removed.
    assert!(eventually_async(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))).await);
    // Several retries later, it is still not recorded as ended.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v = show(&env, "a");
    assert_eq!(v["state"], "stopping/cancelled:user", "{v}");
    assert_eq!(v["ended_ms"], serde_json::Value::Null, "{v}");
    assert!(group.exists());
    stuck.release();
    let w = env
        .sup
        .wait(me(), vec![name("a")], Some(Duration::from_secs(20)))
        .await
        .expect("wait");
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], false, "the retry never got through: {w}");
    let v = show(&env, "a");
    assert_eq!(
        (v["status"].as_str(), v["reason"].as_str()),
        (Some("cancelled"), Some("user")),
        "{v}"
    );
    assert!(eventually(Duration::from_secs(5), || !group.exists()));
}

/// Processes that exit together have their ends recorded together (one
/// transaction, `supervisor::batch`): each ends once, with its own outcome,
/// result and `agent.stop`, and a parent whose children end in a burst hears
/// each child's end exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_exit_together_each_end_once() {
    let env = start(Duration::from_millis(300));
    let n: usize = 48;
    let mut calls = Vec::new();
    for i in 0..n {
        let sup = env.sup.clone();
        let argv = if i.is_multiple_of(3) {
            agent(&["--error", &format!("e{i}")])
        } else {
            agent(&["--result", &format!("r{i}")])
        };
        calls.push(tokio::spawn(async move {
            sup.spawn(me(), req(&format!("x{i}"), argv)).await
        }));
    }
    for c in calls {
        c.await.unwrap().unwrap();
    }
    // A parent whose children all end at once, waited for by it.
    let child = serde_json::json!({"name": "kid", "argv": agent(&["--result", "k"])});
    let spawn_n = format!("12:{child}");
    env.sup
        .spawn(me(), req("mum", agent(&["--spawn-n", &spawn_n, "--wait"])))
        .await
        .unwrap();
    let mut names: Vec<_> = (0..n).map(|i| name(&format!("x{i}"))).collect();
    names.push(name("mum"));
    let w = env
        .sup
        .wait(me(), names, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    for a in w["agents"].as_array().unwrap() {
        let who = a["name"].as_str().unwrap();
        if who == "mum" {
            assert_eq!(a["status"], "completed", "{a}");
            let res = a["result"].as_str().unwrap();
            for k in 1..=12 {
                assert_eq!(
                    res.matches(&format!("kid-{k}: completed: k")).count(),
                    1,
                    "mum heard kid-{k} once: {res}"
                );
            }
            continue;
        }
        let i: usize = who[1..].parse().unwrap();
        if i.is_multiple_of(3) {
            assert_eq!(a["status"], "failed", "{a}");
        } else {
            assert_eq!(
                (&a["status"], &a["result"]),
                (&"completed".into(), &format!("r{i}").into()),
                "{a}"
            );
        }
    }
    let events = env
        .sup
        .store()
        .events(env.sup.tenant(), 0, None, u32::MAX)
        .unwrap();
    let mut ended: Vec<String> = (0..n)
        .map(|i| format!("x{i}"))
        .chain((1..=12).map(|k| format!("kid-{k}")))
        .chain(["mum".to_owned()])
        .collect();
    ended.sort();
    let mut stops: Vec<String> = events
        .iter()
        .filter(|e| e.kind == "agent.stop")
        .map(|e| e.agent.to_string())
        .collect();
    stops.sort();
    assert_eq!(stops, ended, "one agent.stop per agent");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as i64).collect::<Vec<_>>(),
        "gapless"
    );
}

/// Issue 28: a read that fails is not an empty answer. A resumed agent
/// waits for a slot; when the slot frees, its history cannot be read (the
/// messages table is renamed away under the running supervisor). It is not
/// started without its history: it keeps waiting, and once the table is
/// back it starts and sees its earlier messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_whose_history_cannot_be_read_waits_until_it_can() {
    let env = start(Duration::from_millis(300));
    env.sup
        .store()
        .set_tenant_quota(env.sup.tenant(), "max_concurrent", 1)
        .unwrap();
    env.sup
        .spawn(
            me(),
            req("mem", agent(&["--message", "I remember this", "--history"])),
        )
        .await
        .unwrap();
    env.sup
        .wait(me(), vec![name("mem")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    // The one slot held, so the resume below waits for it.
    env.sup
        .spawn(me(), req("hog", agent(&["--hang"])))
        .await
        .unwrap();
    // The resume is answered once its run starts: asked on a task of its own.
    let sup = env.sup.clone();
    let resumed =
        tokio::spawn(async move { sup.resume(me(), name("mem"), Some("again".into())).await });
    assert!(
        eventually_async(Duration::from_secs(10), || show(&env, "mem")["status"]
            == "queued")
        .await,
        "the resume never queued: {}",
        show(&env, "mem")
    );
    let db = env.root().join("brood.db");
    sql(&db, "ALTER TABLE messages RENAME TO messages_away");
    env.sup.cancel(me(), name("hog")).await.unwrap();
    // Several ticks with the slot free and the history unreadable.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        show(&env, "mem")["status"],
        "queued",
        "not started without its history"
    );
    assert!(processes_of(&env, "mem").is_empty());
    sql(&db, "ALTER TABLE messages_away RENAME TO messages");
    resumed.await.unwrap().unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("mem")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    let res = a["result"].as_str().unwrap();
    assert!(res.contains("assistant: I remember this"), "{res}");
    assert!(res.contains("user: again"), "{res}");
}

/// How a daemon learns its agents exited (issue 28 item 4): on its one
/// io_uring, with no descriptor an agent, or, with `BROOD_EXIT_WATCH=pidfd`
/// (a kernel without the ring, or one whose ring misbehaves), through a
/// pidfd each. Either way an exit is seen and recorded, and what the
/// daemon holds for a live agent says which way it went.
#[test]
fn an_exit_is_seen_through_the_ring_or_through_a_pidfd_where_the_ring_is_off() {
    for (vars, pidfds_per_agent) in [
        (&[][..], 0),
        (&[(brood_launch::spawn::exits::ENV, "pidfd")][..], 1),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        let d = serve_daemon_with(&root, None, vars);
        let o = brood(
            &root,
            &["spawn", "--name", "quick", "--", "sh", "-c", "exit 3"],
        );
        assert!(o.status.success(), "{}", text(&o));
        let o = brood(&root, &["wait", "quick", "--timeout", "20s"]);
        let v = show_via(&root, "quick");
        assert_eq!(
            (v["status"].as_str(), v["exit_code"].as_i64()),
            (Some("failed"), Some(3)),
            "{vars:?}: {v} ({})",
            text(&o)
        );
        let hang = agent(&["--hang"]);
        let mut args = vec!["spawn", "--name", "idle", "--"];
        args.extend(hang.iter().map(String::as_str));
        let o = brood(&root, &args);
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            eventually(
                Duration::from_secs(20),
                || show_via(&root, "idle")["status"] == "running"
            ),
            "{vars:?}: idle never ran"
        );
        let pidfds = std::fs::read_dir(format!("/proc/{}/fd", d.0.id()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy() == "anon_inode:[pidfd]")
            .count();
        assert_eq!(
            pidfds, pidfds_per_agent,
            "{vars:?}: pidfds held for one live agent"
        );
        let o = brood(&root, &["cancel", "idle"]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            eventually(
                Duration::from_secs(20),
                || show_via(&root, "idle")["status"] == "cancelled"
            ),
            "{vars:?}: idle never ended"
        );
        drop(d);
    }
}

/// What an agent wrote just before it exited is read whatever told the
/// exit first: the ring's word comes from another thread and can come
/// before tokio's reactor has seen the last bytes arrive (found by `brood
/// bench spawn --sandbox full`: about one run in 250 "exited without done").
/// Three hundred agents that answer and exit at once each end with their
/// own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_words_are_read_before_the_exit_is_recorded() {
    let env = start(Duration::from_millis(300));
    let n: usize = 300;
    let mut names = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let mut calls = Vec::new();
        for &i in chunk {
            let sup = env.sup.clone();
            let argv = if i.is_multiple_of(2) {
                agent(&["--result", &format!("r{i}")])
            } else {
                vec!["sh".into(), "-c".into(), format!("echo r{i}")]
            };
            let mut r = req(&format!("w{i}"), argv);
            if !i.is_multiple_of(2) {
                r.protocol = brood_store::Protocol::Exec;
            }
            calls.push(tokio::spawn(async move { sup.spawn(me(), r).await }));
            names.push(name(&format!("w{i}")));
        }
        for c in calls {
            c.await.unwrap().unwrap();
        }
    }
    let w = env
        .sup
        .wait(me(), names, Some(Duration::from_secs(120)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], false, "{w}");
    for a in w["agents"].as_array().unwrap() {
        let i: usize = a["name"].as_str().unwrap()[1..].parse().unwrap();
        assert_eq!(a["status"], "completed", "{a}");
        assert_eq!(
            a["result"].as_str().map(str::trim_end),
            Some(format!("r{i}").as_str()),
            "{a}"
        );
    }
}

fn show_via(root: &Path, name: &str) -> Value {
    let o = brood(root, &["show", name, "--json"]);
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

/// Issue 28's fault campaign: a run whose end another writer recorded first
/// (a sweeper, the recovery of a node that took this one for dead) while its
/// process still ran. When the process then exits, the end already recorded
/// stands and the supervisor lets the agent go (its group removed), instead
/// of retrying its own end at every tick for ever, which kept the node from
/// ever stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_another_writer_recorded_first_stands_when_the_process_exits() {
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(
            me(),
            req("x", agent(&["--sleep-ms", "1500", "--result", "mine"])),
        )
        .await
        .expect("spawn x");
    let pids = processes_of(&env, "x");
    assert!(!pids.is_empty());
    let group = std::path::PathBuf::from(show(&env, "x")["cgroup"].as_str().unwrap());
    let a = env
        .sup
        .store()
        .agent(env.sup.tenant(), &name("x"))
        .unwrap()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    env.sup
        .store()
        .recover(std::slice::from_ref(&a.supervisor), now)
        .unwrap();
    // The process finishes on its own, and its end (completed) is refused.
    assert!(eventually_async(Duration::from_secs(10), || pids.iter().all(|p| !alive(*p))).await);
    assert!(
        eventually_async(Duration::from_secs(10), || !group.exists()).await,
        "the agent's group is left: its supervisor still holds it"
    );
    let v = show(&env, "x");
    assert_eq!(v["state"], "cancelled:runtime_restart", "{v}");
    assert_eq!(v["result"], serde_json::Value::Null, "{v}");
}

/// Issue 28: nothing the dispatcher holds for an agent outlives it. More
/// roots live at once than a map keeps room for when idle, a few ending on
/// their own and answering a wait, the rest cancelled: afterwards every
/// per-agent map is empty and has given back the room the burst took, so a
/// daemon's memory does not grow with the agents it ever ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_held_for_an_agent_outlives_it() {
    const N: usize = 150;
    let room = 2 * brood_runtime::room::KEPT_ROOM;
    let env = start_with(Duration::from_millis(300), |cfg| {
        cfg.quotas.defaults.max_concurrent = N as u32 + 8;
    });
    let ending: Vec<_> = (0..5).map(|i| name(&format!("done{i}"))).collect();
    for n in &ending {
        let mut r = req(n.as_str(), agent(&["--result", "x"]));
        r.await_ready = false;
        env.sup.spawn(me(), r).await.unwrap();
    }
    for i in 0..N {
        let mut r = req(&format!("h{i}"), agent(&["--hang"]));
        r.await_ready = false;
        env.sup.spawn(me(), r).await.unwrap();
    }
    let w = env
        .sup
        .wait(me(), ending, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert!(
        w["agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["status"] == "completed"),
        "{w}"
    );
    // Every hanging root runs and serves its socket (SPEC 8).
    let peak = held_until(&env, "every root serving its socket", |h| {
        h.live == N && h.sockets == N
    })
    .await;
    assert!(
        peak.live_room > room && peak.sockets_room > room,
        "the burst should take more room than an idle map keeps: {peak:?}"
    );
    for i in 0..N {
        env.sup.cancel(me(), name(&format!("h{i}"))).await.unwrap();
    }
    let after = held_until(&env, "nothing held", |h| h.entries() == 0).await;
    assert!(
        after.live_room <= room && after.sockets_room <= room && after.stops_room <= room,
        "the room taken for {N} agents was kept after they ended: {after:?}"
    );
    assert!(
        env.sup
            .store()
            .agents(env.sup.tenant(), false)
            .unwrap()
            .is_empty()
    );
}

/// What the supervisor holds, once `ok` says so; fails naming `what` and
/// the last reading if it never does.
async fn held_until(
    env: &Env,
    what: &str,
    ok: impl Fn(&brood_runtime::supervisor::Held) -> bool,
) -> brood_runtime::supervisor::Held {
    let t = std::time::Instant::now();
    loop {
        let h = env.sup.held().await.unwrap();
        if ok(&h) {
            return h;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{what}: not reached, holding {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
