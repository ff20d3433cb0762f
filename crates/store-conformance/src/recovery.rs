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
