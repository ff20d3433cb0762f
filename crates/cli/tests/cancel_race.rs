//! A cancel that lands between admission and process start leaves no orphan: the
//! process that starts anyway is killed, its group removed, its record `cancelled`.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_between_admission_and_start_leaves_no_orphan() {
    // The hook holds the launch until the test has cancelled.
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let g2 = gate.clone();
    let env = start_with(Duration::from_millis(500), move |cfg| {
        cfg.hooks.before_launch = Some(Arc::new(move |n: &brood_core::AgentName| {
            if n.as_str() != "racer" {
                return;
            }
            let (m, cv) = &*g2;
            let mut s = m.lock().unwrap();
            s.0 = true; // reached the window
            cv.notify_all();
            while !s.1 {
                s = cv.wait(s).unwrap();
            }
        }));
    });
    let sup = env.sup.clone();
    let spawn = tokio::spawn(async move {
        let mut r = req("racer", agent(&["--hang"]));
        r.await_ready = false;
        sup.spawn(me(), r).await
    });
    // Wait until the launch sits in the window, then cancel.
    let g3 = gate.clone();
    tokio::task::spawn_blocking(move || {
        let (m, cv) = &*g3;
        let mut s = m.lock().unwrap();
        while !s.0 {
            s = cv.wait(s).unwrap();
        }
    })
    .await
    .unwrap();
    let a = show(&env, "racer");
    assert_eq!(a["status"], "queued", "admitted but not started: {a}");
    let c = env.sup.cancel(me(), name("racer")).await.expect("cancel");
    let c = serde_json::to_value(&c).unwrap();
    assert_eq!(c["status"], "cancelled", "{c}");
    {
        let (m, cv) = &*gate;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    }
    let reply = spawn.await.unwrap().expect("spawn answers");
    let reply = serde_json::to_value(&reply).unwrap();
    assert_eq!(reply["status"], "cancelled", "{reply}");
    // The process that started anyway is killed and its group removed.
    let clean = eventually_async(Duration::from_secs(5), || {
        processes_of(&env, "racer").is_empty()
    })
    .await;
    assert!(
        clean,
        "an orphan of racer survived: {:?}",
        processes_of(&env, "racer")
    );
    let a = show(&env, "racer");
    assert_eq!(a["state"], "cancelled:user", "{a}");
    assert_eq!(a["pid"], serde_json::Value::Null);
    let base = brood_runtime::paths::instance_key(env.root());
    let det = brood_launch::cgroup::detect(std::path::Path::new("/")).unwrap();
    let v2 = det
        .v2_mount
        .unwrap()
        .join(det.own_v2.unwrap_or_default().trim_start_matches('/'));
    let groups_left = eventually_async(Duration::from_secs(5), || {
        walk_named(&v2.join(format!("brood-{base}")), "r1.racer").is_empty()
    })
    .await;
    assert!(groups_left, "racer's cgroup was left behind");
}

fn walk_named(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Some(rd) = unless_gone(std::fs::read_dir(dir), dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name() == name {
                    out.push(e.path());
                }
                out.extend(walk_named(&e.path(), name));
            }
        }
    }
    out
}
