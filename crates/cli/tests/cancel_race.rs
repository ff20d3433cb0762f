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

/// A gate a hook waits at: `reached` once the hook is there, and it goes on
/// once the test opens it.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Gate {
    /// The hook's side: says it is here, waits to be let through.
    fn hold(&self) {
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.cv.notify_all();
        while !s.1 {
            s = self.cv.wait(s).unwrap();
        }
    }

    async fn reached(self: &Arc<Self>) {
        let g = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut s = g.state.lock().unwrap();
            while !s.0 {
                s = g.cv.wait(s).unwrap();
            }
        })
        .await
        .unwrap();
    }

    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

/// Issue 27: starts are recorded off the loop, by the start writer. In the
/// window after a start is recorded and before the loop hears of it (the
/// record says running, the loop knows no process), a cancel waits for
/// the loop to hear, then stops what started: it answers `cancelled` and
/// leaves no process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_a_start_is_being_recorded_waits_for_it_then_stops_it() {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let env = start_with(Duration::from_millis(500), move |cfg| {
        cfg.hooks.start_recorded = Some(Arc::new(move |n: &brood_core::AgentName| {
            if n.as_str() == "late" {
                g.hold();
            }
        }));
    });
    let mut r = req("late", agent(&["--hang"]));
    r.await_ready = false;
    // Its creator is answered once the start is recorded: not yet.
    let sup = env.sup.clone();
    let spawn = tokio::spawn(async move { sup.spawn(me(), r).await });
    gate.reached().await;
    assert_eq!(show(&env, "late")["status"], "running");
    let sup = env.sup.clone();
    let mut cancel = tokio::spawn(async move { sup.cancel(me(), name("late")).await });
    // Held until the loop has heard of the start.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut cancel)
            .await
            .is_err(),
        "the cancel was answered before the loop knew the process it stops"
    );
    gate.open();
    spawn.await.unwrap().expect("admitted");
    let c = cancel.await.unwrap().expect("cancel");
    let c = serde_json::to_value(&c).unwrap();
    // Its stop recorded (or already done): not a cancel that missed it.
    assert!(
        c["state"] == "stopping/cancelled:user" || c["state"] == "cancelled:user",
        "{c}"
    );
    let a = wait_end(&env, "late").await;
    assert_eq!(a["state"], "cancelled:user", "{a}");
    let clean = eventually_async(Duration::from_secs(5), || {
        processes_of(&env, "late").is_empty()
    })
    .await;
    assert!(clean, "late survived: {:?}", processes_of(&env, "late"));
}

/// Issue 27: a parent stopped while its child's start is being recorded
/// takes the child with it once the loop hears of the start (SPEC 6: an
/// owned child dies with its parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_stopped_while_its_childs_start_is_recorded_takes_the_child() {
    parent_stopped_while_childs_start_is_recorded(true).await;
}

/// The same without cgroups, where no group's kill takes the child: the
/// stop is made for it once its process is known, by its process group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_a_parent_stopped_while_its_childs_start_is_recorded_takes_the_child() {
    parent_stopped_while_childs_start_is_recorded(false).await;
}

async fn parent_stopped_while_childs_start_is_recorded(cgroups: bool) {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let env = start_with(Duration::from_millis(500), move |cfg| {
        cfg.cgroups = cgroups;
        cfg.hooks.start_recorded = Some(Arc::new(move |n: &brood_core::AgentName| {
            if n.as_str() == "kid" {
                g.hold();
            }
        }));
    });
    env.sup
        .spawn(me(), req("mum", agent(&["--hang"])))
        .await
        .expect("parent ready");
    let mut r = req("kid", agent(&["--hang"]));
    r.parent = Some(name("mum"));
    r.await_ready = false;
    let sup = env.sup.clone();
    let spawn = tokio::spawn(async move { sup.spawn(me(), r).await });
    gate.reached().await;
    let m = env.sup.cancel(me(), name("mum")).await.expect("cancel");
    let m = serde_json::to_value(&m).unwrap();
    assert!(
        m["state"] == "stopping/cancelled:user" || m["state"] == "cancelled:user",
        "{m}"
    );
    gate.open();
    spawn.await.unwrap().expect("child admitted");
    let k = wait_end(&env, "kid").await;
    assert_eq!(k["state"], "cancelled:parent_dead", "{k}");
    let clean = eventually_async(Duration::from_secs(5), || {
        processes_of(&env, "kid").is_empty() && processes_of(&env, "mum").is_empty()
    })
    .await;
    assert!(
        clean,
        "left behind: kid {:?}, mum {:?}",
        processes_of(&env, "kid"),
        processes_of(&env, "mum")
    );
    let m = wait_end(&env, "mum").await;
    assert_eq!(m["state"], "cancelled:user", "{m}");
}
