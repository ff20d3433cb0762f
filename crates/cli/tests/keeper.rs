//! The keeper is watched (issue 11 item 4): it is PID 1 of the agents' PID
//! namespace, and no agent can signal or trace it, but the operator or the
//! OOM killer can still end it. Then the kernel kills every agent in the
//! namespace, and the namespace takes no new process. The death is noticed,
//! the agents' ends are recorded as crashes (never left `running`), and the
//! next start gets a new keeper in a new namespace instead of failing.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_that_dies_is_reported_and_replaced_and_its_agents_are_recorded() {
    let env = start(Duration::from_millis(500));
    env.sup
        .spawn(me(), req("before", agent(&["--hang"])))
        .await
        .expect("spawn");
    let pid = show(&env, "before")["pid"].as_i64().unwrap() as i32;
    let keeper = keeper_of(pid).expect("the agent lives under a keeper");
    // SAFETY: killing the keeper of this test's own supervisor.
    unsafe { libc::kill(keeper, libc::SIGKILL) };

    // Its agent died with it, and that is on record.
    let r = env
        .sup
        .wait(me(), vec![name("before")], Some(Duration::from_secs(10)))
        .await
        .expect("wait");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["agents"][0]["status"], "failed", "{r}");
    assert!(!alive(pid), "the agent outlived its keeper");

    // The next agent starts, under a new keeper in a new namespace.
    env.sup
        .spawn(me(), req("after", agent(&["--hang"])))
        .await
        .expect("a start after the keeper died");
    let a = show(&env, "after");
    let after = a["pid"].as_i64().unwrap_or_else(|| panic!("{a}")) as i32;
    let new_keeper = keeper_of(after).expect("a new keeper");
    assert_ne!(new_keeper, keeper);
    assert!(alive(new_keeper));
    env.sup.cancel(me(), name("after")).await.unwrap();
}
