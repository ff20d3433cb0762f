//! Quotas, queueing and cycles (SPEC 9, issue 4 items 1-3): race-free admission
//! inside the store's transaction, each quota refused at exactly its bound, a full
//! tenant queueing first in first out, and a resume that would loop refused.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use brood_core::Code;
use brood_runtime::Caller;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::json;

fn set_quota(env: &Env, key: &str, v: u32) {
    env.sup
        .store()
        .set_tenant_quota(env.sup.tenant(), key, v)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_creations_at_once_admit_exactly_the_fanout() {
    let env = start(Duration::from_millis(300));
    set_quota(&env, "max_tree_size", 1000);
    env.sup
        .spawn(me(), req("p", agent(&["--hang"])))
        .await
        .unwrap();
    let mut calls = Vec::new();
    for i in 0..100 {
        let sup = env.sup.clone();
        calls.push(tokio::spawn(async move {
            let args = json!({"parent": "p", "name": format!("c{i}"), "argv": agent(&["--hang"])});
            handle(&sup, &me(), "spawn", &args).await
        }));
    }
    let (mut ok, mut fanout) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.code == Code::QuotaFanout => fanout += 1,
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    assert_eq!((ok, fanout), (8, 92));
    let kids = env
        .sup
        .store()
        .children(env.sup.tenant(), &name("p"))
        .unwrap();
    assert_eq!(kids.len(), 8, "exactly 8 records");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_and_tree_size_are_refused_at_exactly_the_bound() {
    let env = start(Duration::from_millis(300));
    // Depth: the default max_depth is 3.
    env.sup
        .spawn(me(), req("d0", agent(&["--hang"])))
        .await
        .unwrap();
    for (child, parent) in [("d1", "d0"), ("d2", "d1"), ("d3", "d2")] {
        let args = json!({"parent": parent, "name": child, "argv": agent(&["--hang"]), "await_ready": true});
        handle(&env.sup, &me(), "spawn", &args)
            .await
            .unwrap_or_else(|e| panic!("{child}: {e}"));
    }
    let args = json!({"parent": "d3", "name": "d4", "argv": agent(&["--hang"])});
    let e = handle(&env.sup, &me(), "spawn", &args).await.unwrap_err();
    assert_eq!(e.code, Code::QuotaDepth, "{e}");
    env.sup.cancel(me(), name("d0")).await.unwrap();

    // Tree size counts every agent ever created under the root, finished or not.
    set_quota(&env, "max_tree_size", 4);
    env.sup
        .spawn(me(), req("t0", agent(&["--hang"])))
        .await
        .unwrap();
    let a = json!({"parent": "t0", "name": "t1", "argv": agent(&["--result", "done"])});
    handle(&env.sup, &me(), "spawn", &a).await.unwrap();
    env.sup
        .wait(me(), vec![name("t1")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    for n in ["t2", "t3"] {
        handle(
            &env.sup,
            &me(),
            "spawn",
            &json!({"parent": "t0", "name": n, "argv": agent(&["--hang"])}),
        )
        .await
        .unwrap();
    }
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"parent": "t0", "name": "t4", "argv": agent(&["--hang"])}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::QuotaTreeSize, "{e}");
    assert!(
        env.sup.view().agent(&name("t4")).is_err(),
        "nothing written for t4"
    );
    env.sup.cancel(me(), name("t0")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tenant_queues_and_starts_when_a_slot_frees() {
    let env = start(Duration::from_millis(300));
    set_quota(&env, "max_concurrent", 2);
    for n in ["q1", "q2"] {
        let r = env
            .sup
            .spawn(me(), req(n, agent(&["--hang"])))
            .await
            .unwrap();
        let r = serde_json::to_value(&r).unwrap();
        assert_eq!(r["status"], "running", "{r}");
    }
    // Not waiting for `ready` (a `--ready` spawn is held until then, slot
    // or not): the answer is at once, queued.
    let queued = |n: &str| {
        let mut r = req(n, agent(&["--hang"]));
        r.await_ready = false;
        r
    };
    let r3 = env.sup.spawn(me(), queued("q3")).await.unwrap();
    let r3 = serde_json::to_value(&r3).unwrap();
    assert_eq!(r3["status"], "queued", "no slot: {r3}");
    let r4 = env.sup.spawn(me(), queued("q4")).await.unwrap();
    let r4 = serde_json::to_value(&r4).unwrap();
    assert_eq!(r4["status"], "queued");
    assert!(
        processes_of(&env, "q3").is_empty(),
        "a queued agent has no process"
    );
    // Cancelling a queued agent leaves nothing behind.
    env.sup.cancel(me(), name("q4")).await.unwrap();
    // A slot frees: the first in line starts.
    env.sup.cancel(me(), name("q1")).await.unwrap();
    env.sup
        .wait(me(), vec![name("q1")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let started = eventually_async(Duration::from_secs(10), || {
        show(&env, "q3")["status"] == "running"
    })
    .await;
    assert!(started, "q3 never started: {}", show(&env, "q3"));
    assert_eq!(show(&env, "q4")["state"], "cancelled:user");
    assert!(processes_of(&env, "q4").is_empty());
    for n in ["q2", "q3"] {
        env.sup.cancel(me(), name(n)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_would_make_the_requester_its_own_ancestor_is_a_cycle() {
    let env = start(Duration::from_millis(300));
    env.sup
        .spawn(me(), req("top", agent(&["--hang"])))
        .await
        .unwrap();
    handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"parent": "top", "name": "low", "argv": agent(&["--hang"]), "await_ready": true}),
    )
    .await
    .unwrap();
    let as_low = Caller::Agent(name("low"));
    for target in ["top", "low"] {
        let e = handle(&env.sup, &as_low, "resume", &json!({"name": target}))
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Cycle, "{target}: {e}");
    }
    env.sup.cancel(me(), name("top")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_chain_that_would_loop_is_refused_with_cycle() {
    let env = start(Duration::from_millis(300));
    // x and y are in p's tree: a customer lies in the requester's own tree.
    env.sup
        .spawn(me(), req("p", agent(&["--hang"])))
        .await
        .unwrap();
    for n in ["x", "y"] {
        let mut r = req(n, agent(&["--hang"]));
        r.parent = Some(name("p"));
        env.sup.spawn(me(), r).await.unwrap();
    }
    let spawn = |name: &str, customer: &str| json!({"parent": "p", "name": name, "customer": customer, "argv": agent(&["--hang"])});
    // Its own customer.
    let e = handle(&env.sup, &me(), "spawn", &spawn("a", "a"))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Cycle, "{e}");
    assert!(e.message.contains("own result"), "{e}");
    assert!(env.sup.view().agent(&name("a")).is_err(), "nothing written");
    // A customer chain that already loops (made by hand: x -> y -> x).
    let db = env.sup.paths().db();
    let c = rusqlite::Connection::open(&db).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c.execute_batch(
        "UPDATE agents SET customer = 'y' WHERE name = 'x';
         UPDATE agents SET customer = 'x' WHERE name = 'y';",
    )
    .unwrap();
    let e = handle(&env.sup, &me(), "spawn", &spawn("b", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Cycle, "{e}");
    assert!(e.message.contains("x -> y -> x"), "{e}");
    // A customer elsewhere in the tree is fine, and recorded.
    c.execute_batch("UPDATE agents SET customer = NULL WHERE name IN ('x', 'y');")
        .unwrap();
    handle(&env.sup, &me(), "spawn", &spawn("k", "x"))
        .await
        .unwrap();
    assert_eq!(show(&env, "k")["customer"], "x");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_in_another_tree_is_refused_even_for_the_operator() {
    let env = start(Duration::from_millis(300));
    for n in ["p", "other"] {
        env.sup
            .spawn(me(), req(n, agent(&["--hang"])))
            .await
            .unwrap();
    }
    // Under p, naming the root of another tree: refused, nothing made.
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"parent": "p", "name": "c", "customer": "other", "argv": agent(&["--hang"])}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::Forbidden, "{e}");
    assert!(e.message.contains("customer other"), "{e}");
    assert!(env.sup.view().agent(&name("c")).is_err(), "nothing written");
    // A root names no customer: it has no tree yet.
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"name": "r", "customer": "p", "argv": agent(&["--hang"])}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::Forbidden, "{e}");
    assert!(e.message.contains("customer p"), "{e}");
    assert!(env.sup.view().agent(&name("r")).is_err(), "nothing written");
    for n in ["p", "other"] {
        env.sup.cancel(me(), name(n)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_limit_and_depth_limit_are_refused_at_exactly_the_bound() {
    let env = start(Duration::from_millis(300));
    let spawn = |name: &str, parent: Option<&str>, policy: serde_json::Value| json!({"name": name, "parent": parent, "argv": agent(&["--hang"]), "policy": policy, "await_ready": true});
    // create_limit 3: three children, not a fourth (finished ones still count).
    handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn("r", None, json!({"create_limit": 3})),
    )
    .await
    .unwrap();
    for n in ["k1", "k2", "k3"] {
        handle(&env.sup, &me(), "spawn", &spawn(n, Some("r"), json!({})))
            .await
            .unwrap_or_else(|e| panic!("{n}: {e}"));
        if n == "k1" {
            env.sup.cancel(me(), name("k1")).await.unwrap();
        }
    }
    let e = handle(&env.sup, &me(), "spawn", &spawn("k4", Some("r"), json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::CreateLimit, "{e}");
    assert!(e.message.contains("already created 3 of its 3"), "{e}");
    env.sup.cancel(me(), name("r")).await.unwrap();

    // depth_limit 2: a child and a grandchild, not a great-grandchild.
    let chain = [
        ("d0", None, json!({"depth_limit": 2})),
        ("d1", Some("d0"), json!({})),
        ("d2", Some("d1"), json!({})),
    ];
    for (n, parent, policy) in chain {
        handle(&env.sup, &me(), "spawn", &spawn(n, parent, policy))
            .await
            .unwrap_or_else(|e| panic!("{n}: {e}"));
    }
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &spawn("d3", Some("d2"), json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::DepthLimit, "{e}");
    assert!(e.message.contains("parent's is 0"), "{e}");
    assert!(
        env.sup.view().agent(&name("d3")).is_err(),
        "nothing written for d3"
    );
    env.sup.cancel(me(), name("d0")).await.unwrap();
}

/// Creations that reach the loop together are admitted together (one store
/// commit for the lot); none of them may see past another's write: per parent,
/// `create_limit` holds exactly; every root is admitted once, under its own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creations_that_arrive_together_keep_every_bound() {
    let env = start(Duration::from_millis(300));
    set_quota(&env, "max_tree_size", 1000);
    set_quota(&env, "max_fanout", 100);
    let parents = ["q1", "q2", "q3", "q4"];
    for p in parents {
        let args = json!({"name": p, "argv": agent(&["--hang"]), "policy": {"create_limit": 3}, "await_ready": true});
        handle(&env.sup, &me(), "spawn", &args).await.unwrap();
    }
    let mut calls = Vec::new();
    for i in 0..80 {
        let sup = env.sup.clone();
        // Children of the four parents interleaved with roots, as a burst of
        // clients sends them.
        let args = if i % 2 == 0 {
            json!({"parent": parents[(i / 2) % 4], "name": format!("k{i}"), "argv": agent(&["--hang"])})
        } else {
            json!({"name": format!("root{i}"), "argv": agent(&["--hang"])})
        };
        calls.push(tokio::spawn(async move {
            (i, handle(&sup, &me(), "spawn", &args).await)
        }));
    }
    let (mut roots, mut kids, mut limited) = (0, 0, 0);
    for c in calls {
        let (i, r) = c.await.unwrap();
        match r {
            Ok(_) if i % 2 == 1 => roots += 1,
            Ok(_) => kids += 1,
            Err(e) if e.code == Code::CreateLimit && i % 2 == 0 => limited += 1,
            Err(e) => panic!("creation {i}: unexpected refusal: {e}"),
        }
    }
    assert_eq!((roots, kids, limited), (40, 12, 28));
    for p in parents {
        let n = env
            .sup
            .store()
            .children(env.sup.tenant(), &name(p))
            .unwrap()
            .len();
        assert_eq!(n, 3, "{p} has exactly its create_limit of children");
    }
    let all = env.sup.store().agents(env.sup.tenant(), true).unwrap();
    assert_eq!(all.len(), 4 + 12 + 40, "one record per admitted creation");
    for i in (1..80).step_by(2) {
        env.sup
            .cancel(me(), name(&format!("root{i}")))
            .await
            .unwrap();
    }
    for p in parents {
        env.sup.cancel(me(), name(p)).await.unwrap();
    }
}

/// Issue 28's fault campaign (round 3): 7 of 6 by the kernel's count. A run
/// that ends leaves processes in its group until the group is emptied, and
/// its slot was given back at once, so a queued agent started beside them.
/// Here `p` ends (crashes) leaving an idler that ignores SIGTERM and a child
/// `c` that does too: the stop of `c` waits the whole grace before its
/// `cgroup.kill`, and all that time `p`'s idler lives. With `max_concurrent`
/// 2, the queued `q` must not start until both are gone: at no sample may
/// three agents have processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_runs_slot_is_free_only_once_what_it_left_in_its_group_is_gone() {
    let grace = Duration::from_millis(1500);
    let env = start(grace);
    set_quota(&env, "max_concurrent", 2);
    let spawn = json!({
        "name": "c",
        "argv": agent(&["--hang", "--ignore-sigterm", "--ignore-cancel"]),
        "task": "hang around",
        "await_ready": true,
    })
    .to_string();
    let p = agent(&[
        "--ignore-sigterm",
        "--grandchildren",
        "1",
        "--spawn",
        spawn.as_str(),
        "--inputs",
        "1",
        "--crash",
    ]);
    env.sup.spawn(me(), req("p", p)).await.expect("spawn p");
    let both = eventually_async(Duration::from_secs(10), || {
        processes_of(&env, "p").len() >= 2 && !processes_of(&env, "c").is_empty()
    })
    .await;
    assert!(both, "p's idler or c never started");
    let mut q = req("q", agent(&["--hang"]));
    q.await_ready = false;
    let r = env.sup.spawn(me(), q).await.expect("spawn q");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["status"], "queued", "two slots are held: {r}");

    env.sup
        .send(me(), name("p"), "go".into())
        .await
        .expect("send go");
    // Until q runs, and a grace past it: no instant with three agents'
    // processes.
    let t0 = std::time::Instant::now();
    let mut q_ran_at = None;
    loop {
        let with: Vec<&str> = ["p", "c", "q"]
            .into_iter()
            .filter(|n| !processes_of(&env, n).is_empty())
            .collect();
        assert!(
            with.len() <= 2,
            "{with:?} have processes at once {:?} after p ended (max_concurrent 2)",
            t0.elapsed()
        );
        if q_ran_at.is_none() && with.contains(&"q") {
            q_ran_at = Some(t0.elapsed());
        }
        if q_ran_at.is_some_and(|t| t0.elapsed() > t + Duration::from_millis(500)) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "q never started once p and c were gone: {}",
            show(&env, "q")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let p = show(&env, "p");
    assert_eq!(p["status"], "failed", "{p}");
    let c = show(&env, "c");
    assert_eq!(c["reason"], "parent_dead", "{c}");
    assert!(processes_of(&env, "p").is_empty() && processes_of(&env, "c").is_empty());
    env.sup.cancel(me(), name("q")).await.unwrap();
}
