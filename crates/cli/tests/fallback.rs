//! The fallback without cgroups is honest (issue 11 item 3): a socket caller
//! inside a tree is never taken for the operator (a child acts as itself; a
//! `setsid`'d orphan its agent left behind is nobody), a policy with resource
//! limits does not start without the layer that holds them unless the
//! operator allows a weaker sandbox (and then `meta.json` says so), and the
//! orphans the supervisor adopts as subreaper are reaped: no zombies, and
//! here a zombie counts as alive (`common::alive`).

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::json;

const GRACE: Duration = Duration::from_millis(500);

/// The child calls the control socket as itself, then leaves a `setsid`'d
/// grandchild behind that calls it after the child is gone; both try to
/// cancel the child's sibling, which only the operator (or an ancestor) may.
const CHILD: &str = r#"
setsid sh -c '
  echo $$ > "$DIR/orphan.pid"
  while kill -0 "$PPID" 2>/dev/null; do sleep 0.05; done
  sleep 0.3
  brood --root "$ROOT" cancel sib > "$DIR/orphan.out" 2>&1
  echo "rc=$?" >> "$DIR/orphan.out"
' </dev/null >/dev/null 2>&1 &
brood --root "$ROOT" cancel sib > "$DIR/child.out" 2>&1
echo "rc=$?" >> "$DIR/child.out"
echo done
"#;

fn read_or_empty(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

async fn nobody_inside_a_tree_is_the_operator(pid_namespace: bool) {
    let env = start_with(GRACE, |cfg| {
        cfg.cgroups = false;
        cfg.pid_namespace = pid_namespace;
    });
    assert!(env.sup.host_info().cgroup.contains("process groups"));
    // The control socket, served as `brood serve` and `brood run` serve it.
    let listener = brood_server::bind_unix(&env.root().join("brood.sock"))
        .await
        .unwrap();
    let server = tokio::spawn(brood_server::serve_unix(
        brood_server::Api::new(env.sup.clone(), None),
        listener,
    ));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vars = vec![
        ("DIR".to_owned(), d.display().to_string()),
        ("ROOT".to_owned(), env.root().display().to_string()),
    ];
    let mut p = req("p", agent(&["--hang"]));
    p.env = vars.clone();
    env.sup.spawn(me(), p).await.expect("spawn p");
    let mut sib = req("sib", agent(&["--hang"]));
    sib.parent = Some(name("p"));
    env.sup.spawn(me(), sib).await.expect("spawn sib");
    let mut c = req("c", vec!["sh".into(), "-c".into(), CHILD.into()]);
    c.parent = Some(name("p"));
    c.protocol = brood_store::Protocol::Exec;
    c.await_ready = false;
    c.env = vars;
    env.sup.spawn(me(), c).await.expect("spawn c");

    let r = env
        .sup
        .wait(me(), vec![name("c")], Some(Duration::from_secs(20)))
        .await
        .expect("wait c");
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["agents"][0]["status"], "completed", "{r}");
    let child = read_or_empty(&d.join("child.out"));
    assert!(
        child.contains("Forbidden") && child.contains("rc=") && !child.contains("rc=0"),
        "the child acted as itself, and was refused: {child}"
    );
    // The orphan calls once the child is gone.
    let finished = eventually_async(Duration::from_secs(20), || {
        read_or_empty(&d.join("orphan.out")).contains("rc=")
    })
    .await;
    let orphan = read_or_empty(&d.join("orphan.out"));
    assert!(finished, "the orphan never called: {orphan:?}");
    assert!(
        !orphan.contains("rc=0") && orphan.contains("belongs to no live agent"),
        "an orphan inside the tree was taken for someone: {orphan}"
    );
    assert_eq!(
        show(&env, "sib")["status"],
        "running",
        "the sibling was cancelled"
    );

    if !pid_namespace {
        // The orphan exits, re-parented to the supervisor: it is reaped, not
        // left a zombie (which `alive` counts as alive).
        let pid: i32 = read_or_empty(&d.join("orphan.pid")).trim().parse().unwrap();
        assert!(
            eventually_async(Duration::from_secs(10), || !alive(pid)).await,
            "the orphan {pid} was left behind: {:?}",
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        );
    }
    env.sup.cancel(me(), name("p")).await.unwrap();
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_an_orphan_in_the_agents_pid_namespace_is_not_the_operator() {
    nobody_inside_a_tree_is_the_operator(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_or_a_pid_namespace_an_adopted_orphan_is_not_the_operator_and_is_reaped() {
    nobody_inside_a_tree_is_the_operator(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_a_policy_with_limits_needs_allow_weaker_sandbox() {
    let policy = json!({"resources": {"pids_max": 32}});
    let env = start_with(GRACE, |cfg| cfg.cgroups = false);
    let mut r = req("limited", agent(&["--result", "ran"]));
    r.policy = Some(policy.clone());
    r.await_ready = false;
    env.sup.spawn(me(), r).await.expect("admitted");
    let w = env
        .sup
        .wait(me(), vec![name("limited")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(a["status"], "failed", "{a}");
    let detail = a["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("limits layer") && detail.contains("--allow-weaker-sandbox"),
        "{a}"
    );

    let env = start_with(GRACE, |cfg| {
        cfg.cgroups = false;
        cfg.allow_weaker_sandbox = true;
    });
    let mut r = req("limited", agent(&["--result", "ran"]));
    r.policy = Some(policy);
    r.await_ready = false;
    env.sup.spawn(me(), r).await.expect("admitted");
    let w = env
        .sup
        .wait(me(), vec![name("limited")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    env.sup.flush().await;
    let meta: serde_json::Value = serde_json::from_str(&read(
        env.sup
            .paths()
            .agent_dir(&name("limited"))
            .join("meta.json"),
    ))
    .unwrap();
    assert_eq!(meta["sandbox"]["limits_not_enforced"], true, "{meta}");
    assert_eq!(meta["sandbox"]["allow_weaker_sandbox"], true, "{meta}");
}
