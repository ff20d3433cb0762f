//! Recovery: a dead supervisor's agents ended at the next start.

use crate::*;

pub fn recover_ends_the_dead_supervisors_agents(store: &dyn Store) {
    let t = tenant("conf-recover");
    let dead = "sup-recover-dead".to_owned();
    let live = "sup-recover-live".to_owned();
    let on = |n: &str, parent: Option<&str>, sup: &str| {
        let new = new_agent(&t, n, parent, sup);
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    start(store, &on("root", None, &dead));
    on("q", Some("root"), &dead);
    start(store, &on("r", Some("root"), &dead));
    let b = start(store, &on("b", Some("root"), &dead));
    store
        .set_status(&t, &b.name, Status::Blocked, None, now(), &[])
        .unwrap();
    let s = start(store, &on("s", Some("root"), &dead));
    let timed_out = Terminal::Failed(FailReason::TimedOut);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), timed_out, now())
        .unwrap();
    let e = start(store, &on("e", Some("root"), &dead));
    end(store, &e, Terminal::Completed, Some("e"));
    let other = start(store, &on("other", None, &live));

    let sups = store.supervisors_with_unfinished().unwrap();
    assert!(sups.contains(&dead) && sups.contains(&live), "{sups:?}");
    let mut unfinished: Vec<String> = store
        .unfinished_of(std::slice::from_ref(&dead))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    unfinished.sort();
    assert_eq!(unfinished, ["b", "q", "r", "root", "s"]);

    let last_seq = all_events(store, &t).last().unwrap().seq;
    let at = now();
    let out = store.recover(std::slice::from_ref(&dead), at).unwrap();
    let mut got: Vec<(String, Status)> =
        out.iter().map(|a| (a.name.to_string(), a.status)).collect();
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        vec![
            ("b".into(), Status::Ended(RESTART)),
            ("q".into(), Status::Ended(RESTART)),
            ("r".into(), Status::Ended(RESTART)),
            ("root".into(), Status::Ended(RESTART)),
            ("s".into(), Status::Ended(timed_out)),
        ]
    );
    for a in &out {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
        assert_eq!(a.updated_ms, at);
        let run = store.run(&t, &a.run).unwrap().unwrap();
        assert_eq!((run.outcome, run.ended_ms), (a.status.outcome(), Some(at)));
    }
    // One agent.stop per recovered agent, numbered after what was there.
    let stops: Vec<Event> = store.events(&t, last_seq, None, 100).unwrap();
    assert_eq!(stops.len(), out.len());
    for ev in &stops {
        assert_eq!(ev.kind, "agent.stop");
        let a = out.iter().find(|a| a.name == ev.agent).unwrap();
        let payload: serde_json::Value = serde_json::from_str(&ev.payload).unwrap();
        assert_eq!(payload["type"], "agent.stop");
        assert_eq!(payload["agent"], a.name.as_str());
        assert_eq!(payload["status"], a.status.outcome().unwrap().word());
        assert_eq!((ev.ts_ms, ev.run.as_ref()), (at, Some(&a.run)));
    }
    assert_eq!(
        stops.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (last_seq + 1..=last_seq + out.len() as i64).collect::<Vec<_>>()
    );

    // The live supervisor's agent and the finished one are untouched.
    assert_eq!(get(store, &t, "other"), other);
    assert_eq!(
        get(store, &t, "e").status,
        Status::Ended(Terminal::Completed)
    );
    let sups = store.supervisors_with_unfinished().unwrap();
    assert!(!sups.contains(&dead) && sups.contains(&live), "{sups:?}");
    assert!(
        store
            .unfinished_of(std::slice::from_ref(&dead))
            .unwrap()
            .is_empty()
    );
    // Recovering again finds nothing to do.
    assert!(store.recover(&[dead], now()).unwrap().is_empty());
}

/// A node declared dead by the others (issue 15): what it ran ends lost, a
/// recorded stop is carried out, other nodes' agents are untouched.
pub fn recover_lost_ends_a_lost_nodes_agents_lost(store: &dyn Store) {
    let t = tenant("conf-lost");
    let dead = "sup-lost-dead".to_owned();
    let live = "sup-lost-live".to_owned();
    let on = |n: &str, parent: Option<&str>, sup: &str| {
        let new = new_agent(&t, n, parent, sup);
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    start(store, &on("root", None, &dead));
    on("q", Some("root"), &dead);
    let s = start(store, &on("s", Some("root"), &dead));
    let cancelled = Terminal::Cancelled(CancelReason::User);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), cancelled, now())
        .unwrap();
    // A child on a node that lives: not the lost node's to end.
    let kid = start(store, &on("kid", Some("root"), &live));
    let out = store
        .recover_lost(std::slice::from_ref(&dead), now())
        .unwrap();
    let mut got: Vec<(String, Status)> =
        out.iter().map(|a| (a.name.to_string(), a.status)).collect();
    got.sort_by(|x, y| x.0.cmp(&y.0));
    let lost = Status::Ended(Terminal::Failed(FailReason::Lost));
    assert_eq!(
        got,
        vec![
            ("q".into(), lost),
            ("root".into(), lost),
            ("s".into(), Status::Ended(cancelled)),
        ]
    );
    assert!(
        get(store, &t, "root")
            .detail
            .unwrap()
            .contains("sup-lost-dead"),
        "the detail names the node"
    );
    assert_eq!(get(store, &t, "kid"), kid);
    assert!(store.recover_lost(&[dead], now()).unwrap().is_empty());
}

/// Issue 29: a recovery that resumes. The agents named (parents first) that
/// it ended `cancelled (runtime_restart)` start again as a new `queued` run
/// on the new supervisor, in the same transaction; a child only under a
/// parent resumed, a stop's recorded intent carried out whatever the list
/// says, the rest ended as `recover` ends them.
pub fn recover_resuming_starts_again_what_it_is_asked_to(store: &dyn Store) {
    let t = tenant("conf-resuming");
    let dead = "sup-resuming-dead".to_owned();
    let on = |n: &str, parent: Option<&str>| {
        let new = new_agent(&t, n, parent, &dead);
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    let root = start(store, &on("root", None));
    start(store, &on("kid", Some("root")));
    start(store, &on("cancels", Some("root")));
    let s = start(store, &on("stopping", Some("root")));
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), RESTART, now())
        .unwrap();
    let lone = start(store, &on("lone", None));
    start(store, &on("orphan", Some("lone")));
    let asked = |n: &str| brood_store::Resuming {
        tenant: t.clone(),
        name: name(n),
        run: new_run(),
        events: Vec::new(),
    };
    // `orphan` is asked for, its parent `lone` is not; `stopping` is asked
    // for, but its stop was recorded.
    let resuming = [
        asked("root"),
        asked("kid"),
        asked("stopping"),
        asked("orphan"),
    ];
    let at = now();
    let r = store
        .recover_resuming(std::slice::from_ref(&dead), &resuming, "sup-new", at)
        .unwrap();
    assert_eq!(
        r.resumed,
        vec![(t.clone(), name("root")), (t.clone(), name("kid"))]
    );
    assert_eq!(r.agents.len(), 6);
    for a in &r.agents {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
    }
    for (n, asked) in [("root", &resuming[0]), ("kid", &resuming[1])] {
        let a = get(store, &t, n);
        assert_eq!(
            (a.status, &a.run, a.supervisor.as_str()),
            (Status::Queued, &asked.run, "sup-new"),
            "{n}"
        );
        // The run the crash ended stays, ended; the new one follows it.
        let runs = store.runs(&t, &a.name).unwrap();
        assert_eq!(runs.len(), 2, "{n}");
        assert_eq!(runs[0].outcome, Some(RESTART));
        assert_eq!(runs[1].id, asked.run);
    }
    assert_ne!(get(store, &t, "root").run, root.run);
    for (n, s) in [
        ("cancels", Status::Ended(RESTART)),
        ("stopping", Status::Ended(RESTART)),
        ("lone", Status::Ended(RESTART)),
        ("orphan", Status::Ended(RESTART)),
    ] {
        assert_eq!(get(store, &t, n).status, s, "{n}");
    }
    assert_eq!(get(store, &t, "lone").run, lone.run);
    // Nothing of the dead supervisor is left unfinished; the resumed wait
    // on the new one.
    assert!(store.unfinished_of(&[dead]).unwrap().is_empty());
    let mut queued: Vec<String> = store
        .unfinished_of(&["sup-new".to_owned()])
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    queued.sort();
    assert_eq!(queued, ["kid", "root"]);
}

/// Issue 29 item 4: a lost node's queue and its resumable agents placed on
/// live nodes in the transaction that ends the rest lost. A queued agent
/// (queued there, or placed there and unclaimed) is placed again with its
/// run; one that ran ends `failed (lost)` and starts again as a new run
/// placed on its node, under a parent resumed with it or one that lives
/// elsewhere; a stop recorded before the loss is carried out and a child
/// whose parent ended stays ended, whatever the plan says. The lost node
/// can neither start nor end a moved agent's new run.
pub fn recover_lost_placing_moves_the_queue_and_the_resumable(store: &dyn Store) {
    let t = tenant("conf-placing");
    let dead = "sup-placing-dead".to_owned();
    let live = "sup-placing-live".to_owned();
    let on = |n: &str, parent: Option<&str>, sup: &str| {
        let new = new_agent(&t, n, parent, sup);
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    let root = start(store, &on("root", None, &dead));
    start(store, &on("kid", Some("root"), &dead));
    let q = on("q", Some("root"), &dead);
    let pq = on("pq", None, &brood_store::placed_on(&dead));
    start(store, &on("stays", Some("root"), &dead));
    // Its stop was recorded before the loss, as `failed (lost)` even (a
    // node fencing itself off records that): carried out, not moved.
    let s = start(store, &on("stopping", Some("root"), &dead));
    store
        .mark_stopping(
            &t,
            std::slice::from_ref(&s.name),
            Terminal::Failed(FailReason::Lost),
            now(),
        )
        .unwrap();
    start(store, &on("lone", None, &dead));
    start(store, &on("orphan", Some("lone"), &dead));
    let far = start(store, &on("far", None, &live));
    start(store, &on("near", Some("far"), &dead));
    let asked = |n: &str, to: &str| brood_store::Placing {
        agent: brood_store::Resuming {
            tenant: t.clone(),
            name: name(n),
            run: new_run(),
            events: vec![event(&name(n), None, "agent.resume")],
        },
        to: to.to_owned(),
    };
    let placing = [
        asked("root", "node-2"),
        asked("kid", "node-2"),
        asked("q", "node-3"),
        asked("pq", "node-3"),
        asked("stopping", "node-2"),
        asked("orphan", "node-2"),
        asked("near", "node-3"),
    ];
    let dead_hosts = [dead.clone(), brood_store::placed_on(&dead)];
    let r = store
        .recover_lost_placing(&dead_hosts, &placing, now())
        .unwrap();
    assert_eq!(
        r.resumed,
        vec![
            (t.clone(), name("root")),
            (t.clone(), name("kid")),
            (t.clone(), name("near"))
        ]
    );
    assert_eq!(
        r.replaced,
        vec![(t.clone(), name("q")), (t.clone(), name("pq"))]
    );
    for a in &r.agents {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
    }
    let lost = Terminal::Failed(FailReason::Lost);
    for (n, p) in [
        ("root", &placing[0]),
        ("kid", &placing[1]),
        ("near", &placing[6]),
    ] {
        let a = get(store, &t, n);
        assert_eq!(
            (a.status, &a.run, a.supervisor.clone()),
            (Status::Queued, &p.agent.run, brood_store::placed_on(&p.to)),
            "{n}"
        );
        // The run the loss ended stays, ended lost; the new one follows it.
        let runs = store.runs(&t, &a.name).unwrap();
        assert_eq!(runs.len(), 2, "{n}");
        assert_eq!(runs[0].outcome, Some(lost), "{n}");
        assert_eq!(runs[1].id, p.agent.run, "{n}");
    }
    assert_ne!(get(store, &t, "root").run, root.run);
    for (n, was) in [("q", &q), ("pq", &pq)] {
        let a = get(store, &t, n);
        assert_eq!(
            (a.status, &a.run, a.supervisor),
            (Status::Queued, &was.run, brood_store::placed_on("node-3")),
            "{n}"
        );
    }
    for (n, st) in [
        ("stays", Status::Ended(lost)),
        ("stopping", Status::Ended(lost)),
        ("lone", Status::Ended(lost)),
        ("orphan", Status::Ended(lost)),
    ] {
        assert_eq!(get(store, &t, n).status, st, "{n}");
    }
    assert_eq!(get(store, &t, "far"), far);
    assert!(store.unfinished_of(&dead_hosts).unwrap().is_empty());
    // The lost node, back, can neither start the new run nor end it.
    let moved = get(store, &t, "root");
    let item = StartItem {
        name: moved.name.clone(),
        run: moved.run.clone(),
        pid: 7,
        cgroup: "/cg/root".into(),
        now_ms: now(),
        events: vec![event(&moved.name, Some(&moved.run), "agent.start")],
        supervisor: Some(dead.clone()),
    };
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.start_one(&t, &item));
    assert_eq!(code, Code::Conflict, "{msg}");
    assert_eq!(snapshot(store, &t), before);
    // Claimed by the node it was placed on, the new run starts there.
    let claimed = store.claim_placed(&t, "node-2", 10).unwrap();
    let names: Vec<&str> = claimed.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["root", "kid"]);
    let started = store
        .start_one(
            &t,
            &StartItem {
                supervisor: Some("node-2".into()),
                ..item
            },
        )
        .unwrap();
    assert_eq!(started.status, Status::Running);
    // The lost node's end of the run it held ends nothing.
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.end_run(
        &t,
        &root.name,
        &root.run,
        &RunEnd {
            outcome: Terminal::Completed,
            exit_code: Some(0),
            result: Some("from the lost node".into()),
            detail: None,
            now_ms: now(),
            output: None,
        },
        &[],
    ));
    assert_eq!(code, Code::Conflict, "{msg}");
    assert_eq!(snapshot(store, &t), before);
    // Nothing left of the lost node: a second recovery finds nothing.
    let again = store
        .recover_lost_placing(&dead_hosts, &placing, now())
        .unwrap();
    assert!(again.agents.is_empty() && again.resumed.is_empty() && again.replaced.is_empty());
}
