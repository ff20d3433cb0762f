//! Attenuation at creation (SPEC 5, issue 3 items 2 and 4): a child asking for more
//! than its parent holds is refused with the code of the first failing check, and
//! the refusal leaves nothing behind but an event in the parent's `events.jsonl`.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use brood_core::Code;
use brood_runtime::supervisor::handle;
use common::*;
use serde_json::{Value, json};

fn parent_policy() -> Value {
    json!({
        "tools": ["create", "wait", "file_read"],
        "files": [{"path": "/", "mode": "ro"}, {"path": "/tmp", "mode": "rw"}],
        "mounts": ["/srv/data\t/work\trw\tbind,nosuid,nodev"],
        "network": {"connect": [443]},
        "cost_limit": 1.0,
        "depth_limit": 2,
        "create_limit": 20,
        "groups": [],
        "models": ["small"],
        "path": "a:b:c",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_asking_for_more_is_refused_with_the_right_code_and_leaves_nothing() {
    let env = start(Duration::from_millis(500));
    let mut p = req("p", agent(&["--hang"]));
    p.policy = Some(parent_policy());
    env.sup
        .spawn(me(), p)
        .await
        .expect("the parent is admitted");
    let shown = show(&env, "p");
    assert_eq!(
        shown["policy"]["cost_limit"], 1.0,
        "brood show prints the effective policy: {shown}"
    );

    let cases: Vec<(&str, Value, Code)> = vec![
        (
            "one-more-tool",
            json!({"tools": ["create", "shell"]}),
            Code::ToolExpansion,
        ),
        (
            "wider-mode",
            json!({"files": [{"path": "/etc", "mode": "rw"}]}),
            Code::FileExpansion,
        ),
        (
            "dropped-nosuid",
            json!({"mounts": ["/srv/data\t/work\tro\tbind,nodev"]}),
            Code::MountExpansion,
        ),
        (
            "rbind",
            json!({"mounts": ["/srv/data\t/work\tro\trbind,nosuid,nodev"]}),
            Code::MountExpansion,
        ),
        ("other-uid", json!({"uid": 4242}), Code::IdentityExpansion),
        (
            "more-groups",
            json!({"groups": [4242]}),
            Code::GroupExpansion,
        ),
        (
            "bigger-budget",
            json!({"cost_limit": 2.0}),
            Code::BudgetExceeded,
        ),
        (
            "wider-network",
            json!({"network": "all"}),
            Code::NetworkExpansion,
        ),
        (
            "other-model",
            json!({"models": ["large"]}),
            Code::ModelExpansion,
        ),
        (
            "reordered-path",
            json!({"path": "c:a"}),
            Code::ToolPathExpansion,
        ),
        ("deeper", json!({"depth_limit": 2}), Code::DepthLimit),
        (
            "dotdot-path",
            json!({"files": [{"path": "/tmp/../etc", "mode": "ro"}]}),
            Code::BadRequest,
        ),
        (
            "dotdot-mount",
            json!({"mounts": ["/srv/../etc\t/work\tro\tbind,nosuid,nodev"]}),
            Code::BadRequest,
        ),
        (
            "two-failures",
            json!({"uid": 4242, "tools": ["shell"]}),
            Code::IdentityExpansion,
        ),
    ];
    for (name, policy, code) in &cases {
        let args = json!({"parent": "p", "name": name, "argv": agent(&["--result", "x"]), "policy": policy});
        let e = handle(&env.sup, &me(), "spawn", &args).await.unwrap_err();
        assert_eq!(e.code, *code, "{name}: {e}");
        if *code == Code::BadRequest {
            assert!(
                e.message.contains(".."),
                "{name}: the message names the bad part: {e}"
            );
        }
    }
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"parent": "p", "name": "loose", "argv": ["true"], "life": "detached"}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::UnsupportedLifecycle, "{e}");

    // Nothing of any refused child exists: no record, no files, no group, no process.
    env.sup.flush().await;
    let agents: Vec<String> = env
        .sup
        .store()
        .agents(env.sup.tenant(), true)
        .unwrap()
        .iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(agents, ["p"]);
    // p's own: its object, its shim, and its socket (bound once it is ready).
    let mut ctx_agents: Vec<String> = std::fs::read_dir(env.sup.paths().ctx().join("agent"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "p.sock")
        .collect();
    ctx_agents.sort();
    assert_eq!(ctx_agents, ["p", "p.d"], "no files of refused children");
    let pgroup = std::path::PathBuf::from(show(&env, "p")["cgroup"].as_str().unwrap());
    let sub: Vec<_> = std::fs::read_dir(&pgroup)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(sub.is_empty(), "no cgroup of a refused child: {sub:?}");
    for (name, _, _) in &cases {
        assert!(processes_of(&env, name).is_empty());
    }
    // Each refusal is noted in the parent's events.jsonl with its code.
    let ev = json_lines(session_dir(&env, "p").join("events.jsonl"));
    for (name, _, code) in &cases {
        assert!(
            ev.iter().any(|e| e["type"] == "agent.child.refused"
                && e["child"] == *name
                && e["code"] == code.as_str()),
            "no refusal event for {name}: {ev:?}"
        );
    }

    // A narrower child is admitted, and holds exactly what it asked for.
    // It hangs, so its reservation is still held when `greedy` asks (a child
    // that had already finished would have given its unspent part back).
    let ok = json!({"parent": "p", "name": "narrow", "argv": agent(&["--hang"]),
        "policy": {"tools": ["wait"], "files": [{"path": "/tmp", "mode": "ro"}], "cost_limit": 0.25, "network": "none"}});
    let r = handle(&env.sup, &me(), "spawn", &ok)
        .await
        .expect("narrow child admitted");
    assert_eq!(r["parent"], "p");
    let n = show(&env, "narrow");
    assert_eq!(n["policy"]["tools"], json!(["wait"]), "{n}");
    assert_eq!(n["policy"]["network"], "none", "{n}");
    // Its budget is reserved from the parent's: 0.25 of 1.0 is gone.
    let e = handle(
        &env.sup,
        &me(),
        "spawn",
        &json!({"parent": "p", "name": "greedy", "argv": ["true"], "policy": {"cost_limit": 0.8}}),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, Code::BudgetExceeded, "{e}");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_refuses_its_own_tools_when_not_granted() {
    let env = start(Duration::from_millis(500));
    // No `create`: a spawn request through the protocol is refused, with the code in
    // the reply, and the agent goes on (it tolerates the refusal).
    let child = json!({"name": "kid", "argv": agent(&["--result", "x"])}).to_string();
    let mut r = req(
        "toolless",
        agent(&[
            "--spawn",
            &child,
            "--tolerate-refusal",
            "--result",
            "went on",
        ]),
    );
    r.policy = Some(json!({"tools": ["file_read"]}));
    env.sup.spawn(me(), r).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("toolless")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    assert!(
        env.sup.view().agent(&name("kid")).is_err(),
        "kid must not exist"
    );
    env.sup.flush().await;
    let ev = json_lines(session_dir(&env, "toolless").join("events.jsonl"));
    assert!(
        ev.iter()
            .any(|e| e["type"] == "agent.child.refused" && e["code"] == "Forbidden"),
        "{ev:?}"
    );
}
