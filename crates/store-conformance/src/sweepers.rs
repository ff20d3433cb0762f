//! Budgets, leases and sweepers (SPEC 9).

use crate::*;

pub fn spend_rolls_up_the_subtree(store: &dyn Store) {
    let t = tenant("conf-spend");
    let root = running(store, &t, "root", None);
    let a = running(store, &t, "a", Some("root"));
    let b = running(store, &t, "b", Some("a"));
    let c = running(store, &t, "c", Some("root"));
    store.record_usage(&t, &root.run, 1, 2, 0.25).unwrap();
    store.record_usage(&t, &a.run, 10, 20, 0.5).unwrap();
    store.record_usage(&t, &b.run, 100, 200, 1.0).unwrap();
    store.record_usage(&t, &c.run, 1000, 2000, 2.0).unwrap();
    // A finished descendant's spend still counts.
    end(store, &b, Terminal::Completed, Some("ok"));
    let s = store.spend(&t, &name("a")).unwrap();
    assert_eq!(
        s.own,
        Usage {
            tokens_in: 10,
            tokens_out: 20,
            cost_usd: 0.5
        }
    );
    assert_eq!(
        s.subtree,
        Usage {
            tokens_in: 110,
            tokens_out: 220,
            cost_usd: 1.5
        }
    );
    let s = store.spend(&t, &name("root")).unwrap();
    assert_eq!(s.own.cost_usd, 0.25);
    assert_eq!(
        s.subtree,
        Usage {
            tokens_in: 1111,
            tokens_out: 2222,
            cost_usd: 3.75
        }
    );
    // Every run of an agent counts, not only the newest.
    let b = get(store, &t, "b");
    let run2 = new_run();
    let b2 = store.resume(&t, &b.name, &run2, "sup", now(), &[]);
    // (resume needs a live parent; `a` is running)
    let b2 = b2.unwrap();
    start(store, &b2);
    store.record_usage(&t, &run2, 1, 1, 0.125).unwrap();
    assert_eq!(store.spend(&t, &name("b")).unwrap().own.cost_usd, 1.125);
    assert_eq!(
        store.spend(&t, &name("root")).unwrap().subtree.cost_usd,
        3.875
    );
    assert!(matches!(
        store.spend(&t, &name("nobody")),
        Err(StoreError::NotFound { .. })
    ));
}

/// SPEC 5's `create_limit`, counted by the store inside the admission: the
/// children the parent's current run created, finished ones included; a new
/// run of the parent starts a new count.
pub fn create_limit_is_counted_in_the_admission_transaction(store: &dyn Store) {
    let t = tenant("conf-create-limit");
    let q = Quotas::CEILINGS;
    let mut new = new_agent(&t, "p", None, "sup");
    new.spec = r#"{"argv":["x"],"policy":{"create_limit":3}}"#.to_owned();
    let p = store.admit_with_quotas(&new, &q, &[]).unwrap();
    let p = start(store, &p);
    let child = |n: &str| {
        let new = new_agent(&t, n, Some("p"), "sup");
        let events = spawn_events(&new);
        store.admit_with_quotas(&new, &q, &events)
    };
    for i in 0..3 {
        let c = start(store, &child(&format!("c{i}")).unwrap());
        // A finished child still counts against its parent's run.
        end(store, &c, Terminal::Completed, Some("ok"));
    }
    let before = snapshot(store, &t);
    let (code, msg) = refusal(child("c3"));
    assert_eq!(code, Code::CreateLimit, "{msg}");
    assert!(msg.contains("3 of its 3") && msg.contains("p"), "{msg}");
    assert_eq!(snapshot(store, &t), before, "nothing written: {msg}");
    // A new run of the parent has created nothing yet.
    end(store, &p, Terminal::Completed, Some("done"));
    let p2 = store
        .resume(&t, &name("p"), &new_run(), "sup", now(), &[])
        .unwrap();
    start(store, &p2);
    assert!(child("c3").is_ok());
}

pub fn lease_epochs_fence_old_holders(store: &dyn Store) {
    let t = tenant("conf-lease");
    let lease = "conf-lease-sweeper";
    assert_eq!(store.lease(lease).unwrap(), None);
    let first = store.acquire_lease(lease, "sup-a", now()).unwrap();
    let second = store.acquire_lease(lease, "sup-b", now()).unwrap();
    assert!(second.epoch > first.epoch, "{first:?} then {second:?}");
    assert_eq!(store.lease(lease).unwrap(), Some(second.clone()));
    let x = running(store, &t, "x", None);
    let before = snapshot(store, &t);
    // The old holder's writes are refused and change nothing.
    let (code, msg) = refusal(store.sweep_stop(
        &first,
        &t,
        std::slice::from_ref(&x.name),
        Terminal::Failed(FailReason::TimedOut),
        now(),
        &[event(&x.name, Some(&x.run), "agent.sweep")],
    ));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("fenced") && msg.contains("sup-b"), "{msg}");
    let end1 = RunEnd {
        outcome: Terminal::Failed(FailReason::Lost),
        exit_code: None,
        result: None,
        detail: Some("process gone".into()),
        now_ms: now(),
        output: None,
    };
    assert_eq!(
        refusal(store.sweep_end(&first, &t, &x.name, &end1, &[])).0,
        Code::Conflict
    );
    let nobody = Fence {
        lease: "conf-lease-never".into(),
        holder: "sup-a".into(),
        epoch: 1,
    };
    assert_eq!(
        refusal(store.sweep_end(&nobody, &t, &x.name, &end1, &[])).0,
        Code::Conflict
    );
    assert_eq!(snapshot(store, &t), before);
    // The holder's own writes go through.
    let stopped = store
        .sweep_stop(
            &second,
            &t,
            std::slice::from_ref(&x.name),
            Terminal::Failed(FailReason::TimedOut),
            now(),
            &[],
        )
        .unwrap();
    assert_eq!(
        stopped[0].status,
        Status::Stopping(Terminal::Failed(FailReason::TimedOut))
    );
    let y = running(store, &t, "y", None);
    let ended = store.sweep_end(&second, &t, &y.name, &end1, &[]).unwrap();
    assert_eq!(
        ended.status,
        Status::Ended(Terminal::Failed(FailReason::Lost))
    );
    assert_eq!(ended.detail.as_deref(), Some("process gone"));
}

pub fn overdue_runs_are_found_by_deadline(store: &dyn Store) {
    let t = tenant("conf-overdue");
    let mut new = new_agent(&t, "slow", None, "sup-overdue");
    new.spec = r#"{"argv":["/bin/true"],"policy":{"timeout_s":5}}"#.to_owned();
    let slow = store.admit(&new, &[]).unwrap();
    let started_at = now();
    store
        .start_run(&t, &slow.name, &slow.run, 1, "", started_at, &[])
        .unwrap();
    let _no_limit = running(store, &t, "free", None);
    let mine = |v: Vec<Agent>| -> Vec<String> {
        v.into_iter()
            .filter(|a| a.tenant == t)
            .map(|a| a.name.to_string())
            .collect()
    };
    assert!(mine(store.overdue(started_at + 4_999, 500).unwrap()).is_empty());
    assert_eq!(
        mine(store.overdue(started_at + 5_000, 500).unwrap()),
        ["slow"]
    );
    // Once stopping it is no longer the sweeper's business.
    store
        .mark_stopping(
            &t,
            std::slice::from_ref(&slow.name),
            Terminal::Failed(FailReason::TimedOut),
            now(),
        )
        .unwrap();
    assert!(mine(store.overdue(started_at + 60_000, 500).unwrap()).is_empty());
}

/// SPEC 5: a child's run ends no later than its parent's deadline, to the
/// millisecond, though `timeout_s` counts whole seconds: one whose own
/// timeout would end later ends with its parent (both overdue together, so
/// the sweeper takes the parent's subtree as one); one whose own ends sooner
/// keeps it.
pub fn a_childs_deadline_is_never_after_its_parents(store: &dyn Store) {
    let t = tenant("conf-deadline-cap");
    let spec = |s: u64| format!(r#"{{"argv":["/bin/true"],"policy":{{"timeout_s":{s}}}}}"#);
    let started = now();
    let start = |n: &str, parent: Option<&str>, timeout_s: u64, at: i64| {
        let mut new = new_agent(&t, n, parent, "sup-deadline-cap");
        new.spec = spec(timeout_s);
        let a = store.admit(&new, &[]).unwrap();
        store
            .start_run(&t, &a.name, &a.run, 1, "", at, &[])
            .unwrap();
        a
    };
    start("top", None, 5, started);
    start("kid", Some("top"), 5, started + 700);
    start("quick", Some("top"), 1, started + 700);
    start("grandkid", Some("kid"), 5, started + 900);
    let mine = |at: i64| -> Vec<String> {
        let mut v: Vec<String> = store
            .overdue(at, 500)
            .unwrap()
            .into_iter()
            .filter(|a| a.tenant == t)
            .map(|a| a.name.to_string())
            .collect();
        v.sort();
        v
    };
    assert!(mine(started + 1_699).is_empty());
    assert_eq!(
        mine(started + 1_700),
        ["quick"],
        "its own timeout is sooner"
    );
    assert_eq!(mine(started + 4_999), ["quick"]);
    assert_eq!(
        mine(started + 5_000),
        ["grandkid", "kid", "quick", "top"],
        "capped at the parent's deadline, the grandchild at its parent's capped one"
    );
}

pub fn orphans_have_a_finished_or_missing_parent(store: &dyn Store) {
    let t = tenant("conf-orphans");
    let p = running(store, &t, "p", None);
    let _c = running(store, &t, "c", Some("p"));
    let _d = running(store, &t, "d", Some("c"));
    let q = running(store, &t, "q", None);
    let _e = running(store, &t, "e", Some("q"));
    let mine = |store: &dyn Store| -> Vec<String> {
        let mut v: Vec<String> = store
            .orphans(500)
            .unwrap()
            .into_iter()
            .filter(|a| a.tenant == t)
            .map(|a| a.name.to_string())
            .collect();
        v.sort();
        v
    };
    assert!(mine(store).is_empty());
    // A parent that ended without its children being stopped (a crash between
    // the two, or a hand edit): its live child is an orphan, the grandchild not.
    end(store, &p, Terminal::Completed, None);
    assert_eq!(mine(store), ["c"]);
    // A stopping child is not: its intent is recorded.
    store
        .mark_stopping(
            &t,
            &[name("c")],
            Terminal::Cancelled(CancelReason::ParentDead),
            now(),
        )
        .unwrap();
    assert!(mine(store).is_empty());
    // It is what its host reads each tick to carry the stop out.
    let host = format!("sup-{t}");
    let stopping: Vec<String> = store
        .stopping_of(&host)
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(stopping, ["c"]);
    let _ = q;
}
