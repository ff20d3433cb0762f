//! Budgets (SPEC 9, issue 4 item 4): spend rolls up the tree, a child's
//! `cost_limit` is reserved from its parent and the unspent part returns when it
//! ends, and a subtree whose spend reaches its limit is stopped with
//! `budget_exceeded`, its descendants with it. `show` and `tree` give each
//! agent's own spend and its subtree's.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use brood_core::Code;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};

fn spawn_args(name: &str, parent: Option<&str>, flags: &[&str], policy: Value) -> Value {
    json!({"name": name, "parent": parent, "argv": agent(flags), "policy": policy, "await_ready": true})
}

fn subtree_cost(env: &Env, n: &str) -> f64 {
    show(env, n)["spend"]["subtree"]["cost_usd"]
        .as_f64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_held_while_the_child_lives_and_its_unspent_part_returns() {
    let env = start(Duration::from_millis(300));
    let p = spawn_args("p", None, &["--hang"], json!({"cost_limit": 1.0}));
    handle(&env.sup, &me(), "spawn", &p).await.unwrap();
    // a reserves 0.6 and spends 0.1 of it.
    let a = spawn_args(
        "a",
        Some("p"),
        &["--usage", "10,20,0.1", "--hang"],
        json!({"cost_limit": 0.6}),
    );
    handle(&env.sup, &me(), "spawn", &a).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || (subtree_cost(&env, "p") - 0.1)
            .abs()
            < 1e-9),
        "a's usage rolled up into p: {}",
        show(&env, "p")["spend"]
    );
    // Left for p: 1.0 - 0.1 spent - 0.5 still reserved by a = 0.4.
    let b = spawn_args("b", Some("p"), &["--hang"], json!({"cost_limit": 0.6}));
    let e = handle(&env.sup, &me(), "spawn", &b).await.unwrap_err();
    assert_eq!(e.code, Code::BudgetExceeded, "{e}");
    assert!(e.message.contains("remaining budget 0.4"), "{e}");
    assert!(
        env.sup.view().agent(&name("b")).is_err(),
        "nothing written for b"
    );
    // a ends: its unspent 0.5 returns, its 0.1 stays spent; 0.9 is left.
    env.sup.cancel(me(), name("a")).await.unwrap();
    env.sup
        .wait(me(), vec![name("a")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    handle(&env.sup, &me(), "spawn", &b).await.unwrap();
    let c = spawn_args("c", Some("p"), &["--hang"], json!({"cost_limit": 0.35}));
    let e = handle(&env.sup, &me(), "spawn", &c).await.unwrap_err();
    assert_eq!(e.code, Code::BudgetExceeded, "0.9 - 0.6 = 0.3 left: {e}");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_past_a_limit_stops_the_whole_subtree() {
    let env = start(Duration::from_millis(300));
    let p = spawn_args(
        "p",
        None,
        &["--usage", "1,1,0.25", "--hang"],
        json!({"cost_limit": 1.0}),
    );
    handle(&env.sup, &me(), "spawn", &p).await.unwrap();
    // c has no limit of its own: it spends from p's budget.
    let c = spawn_args(
        "c",
        Some("p"),
        &["--usage", "5,6,0.25", "--hang"],
        json!({}),
    );
    handle(&env.sup, &me(), "spawn", &c).await.unwrap();
    let sib = spawn_args("sib", None, &["--hang"], json!({}));
    handle(&env.sup, &me(), "spawn", &sib).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || (subtree_cost(
        &env, "p"
    ) - 0.5)
        .abs()
        < 1e-9));
    let pids: Vec<i32> = ["p", "c"]
        .iter()
        .flat_map(|n| processes_of(&env, n))
        .collect();
    assert!(!pids.is_empty());
    // The grandchild's spend takes the tree to 1.1 >= 1.0.
    let g = spawn_args(
        "g",
        Some("c"),
        &["--usage", "100,200,0.6", "--hang"],
        json!({}),
    );
    handle(&env.sup, &me(), "spawn", &g).await.unwrap();
    let r = env
        .sup
        .wait(
            me(),
            vec![name("p"), name("c"), name("g")],
            Some(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let r = serde_json::to_value(&r).unwrap();
    // Every agent of the tree ended inside the wait's bound: the stop was the
    // budget's, not the wait's.
    assert_eq!(r["timed_out"], false, "{r}");
    let pv = show(&env, "p");
    assert_eq!(pv["status"], "failed", "{pv}");
    assert_eq!(pv["reason"], "budget_exceeded", "{pv}");
    assert!(
        pv["detail"]
            .as_str()
            .unwrap()
            .contains("cost_limit $1.0000"),
        "{pv}"
    );
    for n in ["c", "g"] {
        let v = show(&env, n);
        assert_eq!(
            (v["status"].as_str(), v["reason"].as_str()),
            (Some("cancelled"), Some("parent_dead")),
            "{v}"
        );
    }
    // Reaped by the keeper right after the group was emptied; under load
    // the last zombie may take a moment to go.
    assert!(
        eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))),
        "every process of the tree is gone"
    );
    // The sibling tree is untouched.
    assert_eq!(show(&env, "sib")["status"], "running");
    // show and tree: own and subtree spend, tokens and dollars.
    assert_eq!(pv["spend"]["own"]["cost_usd"], 0.25);
    assert!((pv["spend"]["subtree"]["cost_usd"].as_f64().unwrap() - 1.1).abs() < 1e-9);
    assert_eq!(pv["spend"]["subtree"]["tokens_in"], 106);
    assert_eq!(pv["spend"]["subtree"]["tokens_out"], 207);
    let tree = serde_json::to_value(env.sup.view().tree(Some(&name("p"))).unwrap()).unwrap();
    let c_node = &tree["trees"][0]["children"][0];
    assert_eq!(c_node["name"], "c");
    assert_eq!(c_node["spend"]["own"]["tokens_in"], 5);
    assert!((c_node["spend"]["subtree"]["cost_usd"].as_f64().unwrap() - 0.85).abs() < 1e-9);
    env.sup.cancel(me(), name("sib")).await.unwrap();
}
