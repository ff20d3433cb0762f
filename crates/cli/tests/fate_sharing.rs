//! Fate sharing (SPEC 6, issue 2 item 10): a parent that {finishes normally,
//! crashes, is SIGKILLed, is cancelled by a user} × a child that is {cooperative,
//! ignores SIGTERM, starts grandchildren, double-forks and setsid()s a grandchild}.
//! Each case checks, with real processes and real cgroups: within grace + 1 s no
//! process of the subtree is left (through the cgroup and /proc), the child is
//! `cancelled (parent_dead)`, both `events.jsonl` files hold the event pair, and
//! the child's transcript is intact.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

#[derive(Clone, Copy, Debug)]
enum Parent {
    Finishes,
    Crashes,
    Sigkilled,
    Cancelled,
}

#[derive(Clone, Copy, Debug)]
enum Child {
    Cooperative,
    IgnoresSigterm,
    Grandchildren,
    SetsidGrandchild,
}

const GRACE: Duration = Duration::from_millis(1000);

async fn case(parent: Parent, child: Child) {
    let env = start(GRACE);
    let mut cflags = vec!["--message", "hello from c", "--hang"];
    let expected_procs = match child {
        Child::Cooperative => 2,
        Child::IgnoresSigterm => {
            cflags.extend(["--ignore-sigterm", "--ignore-cancel"]);
            2
        }
        Child::Grandchildren => {
            cflags.extend(["--grandchildren", "2"]);
            4
        }
        Child::SetsidGrandchild => {
            cflags.extend(["--setsid-grandchild"]);
            3
        }
    };
    let spawn =
        json!({"name": "c", "argv": agent(&cflags), "task": "hang around", "await_ready": true})
            .to_string();
    let mut pflags = vec!["--spawn", spawn.as_str()];
    match parent {
        Parent::Finishes => pflags.extend(["--inputs", "1"]),
        Parent::Crashes => pflags.extend(["--inputs", "1", "--crash"]),
        Parent::Sigkilled | Parent::Cancelled => pflags.push("--hang"),
    }
    env.sup
        .spawn(me(), req("p", agent(&pflags)))
        .await
        .expect("spawn p");

    // Wait until the child and all of its processes are there.
    let ok = eventually_async(Duration::from_secs(10), || {
        env.sup
            .view()
            .show(&name("c"))
            .ok()
            .and_then(|c| c.agent.cgroup.map(PathBuf::from))
            .is_some_and(|g| pids_under(&g).len() >= expected_procs - 1)
    })
    .await;
    assert!(
        ok,
        "{parent:?}/{child:?}: the child's processes never appeared"
    );
    // Let the grandchildren finish forking (the setsid one reparents on the way).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pgroup = PathBuf::from(
        show(&env, "p")["cgroup"]
            .as_str()
            .expect("p has a cgroup")
            .to_owned(),
    );
    let pids = pids_under(&pgroup);
    assert!(
        pids.len() >= expected_procs,
        "{parent:?}/{child:?}: expected {expected_procs} processes in {}, found {pids:?}",
        pgroup.display()
    );
    let ppid = show(&env, "p")["pid"].as_i64().expect("p has a pid") as i32;

    let t0 = Instant::now();
    match parent {
        Parent::Finishes | Parent::Crashes => {
            env.sup
                .send(me(), name("p"), "go".into())
                .await
                .expect("send go");
        }
        Parent::Sigkilled => {
            // SAFETY: killing the parent agent this test started.
            unsafe { libc::kill(ppid, libc::SIGKILL) };
        }
        Parent::Cancelled => {
            env.sup.cancel(me(), name("p")).await.expect("cancel p");
        }
    }
    let limit = GRACE + Duration::from_secs(1);
    let gone = eventually_async(limit, || pids.iter().all(|p| !alive(*p))).await;
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        gone,
        "{parent:?}/{child:?}: processes {left:?} still alive {:?} after the trigger",
        t0.elapsed()
    );

    let r = env
        .sup
        .wait(
            me(),
            vec![name("p"), name("c")],
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("wait");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["timed_out"], false, "{parent:?}/{child:?}: {r}");
    let c = show(&env, "c");
    assert_eq!(c["status"], "cancelled", "{parent:?}/{child:?}: {c}");
    assert_eq!(c["reason"], "parent_dead", "{parent:?}/{child:?}: {c}");
    let p = show(&env, "p");
    let (pstatus, preason) = match parent {
        Parent::Finishes => ("completed", None),
        Parent::Crashes | Parent::Sigkilled => ("failed", Some("crashed")),
        Parent::Cancelled => ("cancelled", Some("user")),
    };
    assert_eq!(p["status"], pstatus, "{parent:?}/{child:?}: {p}");
    assert_eq!(p["reason"].as_str(), preason, "{parent:?}/{child:?}: {p}");
    // The whole group is gone, not just emptied.
    assert!(
        eventually(Duration::from_secs(2), || !pgroup.exists()),
        "{parent:?}/{child:?}: cgroup {} was not removed",
        pgroup.display()
    );

    env.sup.flush().await;
    let pev = json_lines(session_dir(&env, "p").join("events.jsonl"));
    assert!(
        pev.iter().any(|e| e["type"] == "agent.child.cancel"
            && e["parent"] == "p"
            && e["child"] == "c"
            && e["reason"] == "parent_dead"),
        "{parent:?}/{child:?}: parent's events.jsonl lacks agent.child.cancel: {pev:?}"
    );
    let cev = json_lines(session_dir(&env, "c").join("events.jsonl"));
    assert!(
        cev.iter()
            .any(|e| e["type"] == "agent.stop" && e["agent"] == "c" && e["status"] == "cancelled"),
        "{parent:?}/{child:?}: child's events.jsonl lacks agent.stop: {cev:?}"
    );
    let msgs = json_lines(session_dir(&env, "c").join("messages.jsonl"));
    assert!(
        msgs.iter().any(|m| m["content"] == "hello from c"),
        "{parent:?}/{child:?}: transcript lost: {msgs:?}"
    );
    assert_eq!(
        read(session_dir(&env, "c").join("state")).trim(),
        "cancelled"
    );
    let chan = env.sup.paths().channel_dir(
        &name("p"),
        &brood_core::SessionName::default_session(),
        &name("c"),
    );
    assert_eq!(read(chan.join("status")).trim(), "cancelled");
    assert!(
        read(chan.join("result.md")).contains("parent p stopped"),
        "{}",
        read(chan.join("result.md"))
    );
    // The store agrees with the files: nothing of this tree is live.
    assert!(processes_of(&env, "c").is_empty());
}

macro_rules! matrix {
    ($($t:ident: $p:ident, $c:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $t() {
            case(Parent::$p, Child::$c).await;
        }
    )*};
}

matrix! {
    finishes_x_cooperative: Finishes, Cooperative;
    finishes_x_ignores_sigterm: Finishes, IgnoresSigterm;
    finishes_x_grandchildren: Finishes, Grandchildren;
    finishes_x_setsid_grandchild: Finishes, SetsidGrandchild;
    crashes_x_cooperative: Crashes, Cooperative;
    crashes_x_ignores_sigterm: Crashes, IgnoresSigterm;
    crashes_x_grandchildren: Crashes, Grandchildren;
    crashes_x_setsid_grandchild: Crashes, SetsidGrandchild;
    sigkilled_x_cooperative: Sigkilled, Cooperative;
    sigkilled_x_ignores_sigterm: Sigkilled, IgnoresSigterm;
    sigkilled_x_grandchildren: Sigkilled, Grandchildren;
    sigkilled_x_setsid_grandchild: Sigkilled, SetsidGrandchild;
    cancelled_x_cooperative: Cancelled, Cooperative;
    cancelled_x_ignores_sigterm: Cancelled, IgnoresSigterm;
    cancelled_x_grandchildren: Cancelled, Grandchildren;
    cancelled_x_setsid_grandchild: Cancelled, SetsidGrandchild;
}

/// Without cgroups (a host that has none, or forbids creating them) brood falls
/// back to process groups plus a subreaper, says so, and still stops an owned
/// child whose parent died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_process_groups_still_take_the_child() {
    let env = start_with(GRACE, |cfg| cfg.cgroups = false);
    assert!(
        env.sup.host_info().cgroup.contains("process groups"),
        "the fallback is announced: {:?}",
        env.sup.host_info()
    );
    let spawn = json!({"name": "c", "argv": agent(&["--hang"]), "await_ready": true}).to_string();
    env.sup
        .spawn(me(), req("p", agent(&["--spawn", &spawn, "--hang"])))
        .await
        .expect("spawn p");
    assert!(
        eventually_async(Duration::from_secs(10), || !processes_of(&env, "c")
            .is_empty())
        .await,
        "the child never started"
    );
    let cpids = processes_of(&env, "c");
    let ppid = show(&env, "p")["pid"].as_i64().expect("p has a pid") as i32;
    // SAFETY: killing the parent agent this test started.
    unsafe { libc::kill(ppid, libc::SIGKILL) };
    let gone = eventually_async(GRACE + Duration::from_secs(1), || {
        cpids.iter().all(|p| !alive(*p))
    })
    .await;
    assert!(
        gone,
        "the child outlived its parent without cgroups: {cpids:?}"
    );
    let r = env
        .sup
        .wait(me(), vec![name("c")], Some(Duration::from_secs(5)))
        .await
        .expect("wait");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["agents"][0]["state"], "cancelled:parent_dead", "{r}");
    env.sup.flush().await;
    let meta: serde_json::Value = serde_json::from_str(&read(
        env.sup.paths().agent_dir(&name("c")).join("meta.json"),
    ))
    .expect("meta.json");
    assert_eq!(meta["containment"]["weaker"], true, "{meta}");
}

/// The lower bound of SPEC 6: a child that ignores SIGTERM (and the cancel
/// frame) is given the whole grace before the kill, whether its own cancel
/// or its parent's stop takes it. The instant is taken before the stop is
/// asked for, so the grace cannot be counted short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_lives_at_least_the_grace() {
    for cancel_parent in [false, true] {
        let env = start(GRACE);
        env.sup
            .spawn(me(), req("p", agent(&["--hang"])))
            .await
            .expect("spawn p");
        let mut c = req(
            "c",
            agent(&["--ignore-sigterm", "--ignore-cancel", "--hang"]),
        );
        c.parent = Some(name("p"));
        env.sup.spawn(me(), c).await.expect("spawn c");
        let pids = processes_of(&env, "c");
        assert!(!pids.is_empty(), "c has no process");
        let t0 = Instant::now();
        let target = if cancel_parent { "p" } else { "c" };
        env.sup.cancel(me(), name(target)).await.expect("cancel");
        let mut died = None;
        while t0.elapsed() < GRACE + Duration::from_secs(5) {
            if pids.iter().all(|p| !alive(*p)) {
                died = Some(t0.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let died = died.unwrap_or_else(|| panic!("cancelling {target}: c never died"));
        assert!(
            died >= GRACE,
            "cancelling {target}: c, which ignores SIGTERM, died {died:?} after the stop, before the grace of {GRACE:?}"
        );
        let r = env
            .sup
            .wait(me(), vec![name("c")], Some(Duration::from_secs(5)))
            .await
            .expect("wait");
        let r = serde_json::to_value(&r).unwrap();
        assert_eq!(r["timed_out"], false, "{r}");
    }
}
