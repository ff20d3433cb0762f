//! Runs: start, status changes, ends, and the recorded intent of a stop.

use crate::*;

pub fn start_run_records_pid_and_cgroup(store: &dyn Store) {
    let t = tenant("conf-start");
    let a = admit(store, &t, "a", None);
    let at = now();
    let started = store
        .start_run(
            &t,
            &a.name,
            &a.run,
            777,
            "/cg/a",
            at,
            &[event(&a.name, Some(&a.run), "agent.start")],
        )
        .unwrap();
    assert_eq!((started.status, started.updated_ms), (Status::Running, at));
    let run = store.run(&t, &a.run).unwrap().unwrap();
    assert_eq!(
        (run.pid, run.cgroup.as_deref(), run.started_ms),
        (Some(777), Some("/cg/a"), Some(at))
    );
    let last = all_events(store, &t).pop().unwrap();
    assert_eq!((last.kind.as_str(), last.ts_ms), ("agent.start", at));
}

pub fn start_run_after_cancel_while_queued_is_refused(store: &dyn Store) {
    // The race of SPEC 6: the launcher starts the process while a cancel lands
    // between admission and start. The store must refuse the start, so the caller
    // kills what it started, and must not have written any of it.
    let t = tenant("conf-cancelrace");
    let a = admit(store, &t, "a", None);
    let after = store
        .mark_stopping(&t, std::slice::from_ref(&a.name), USER, now())
        .unwrap();
    assert_eq!(after[0].status, Status::Ended(USER));
    let before = snapshot(store, &t);
    let r = store.start_run(
        &t,
        &a.name,
        &a.run,
        99,
        "/cg/a",
        now(),
        &[event(&a.name, Some(&a.run), "agent.start")],
    );
    match r {
        Err(StoreError::Transition { name, source }) => {
            assert_eq!(name, "a");
            assert_eq!(
                (source.from, source.to),
                (Status::Ended(USER), Status::Running)
            );
        }
        other => panic!("expected a transition refusal, got {other:?}"),
    }
    assert_eq!(snapshot(store, &t), before);
    let run = store.run(&t, &a.run).unwrap().unwrap();
    assert_eq!((run.pid, run.outcome), (None, Some(USER)));
}

/// Starts recorded together (`start_runs`) are each answered as if alone: a
/// start refused (its agent cancelled meanwhile) writes nothing and refuses
/// only itself; the others are recorded with their pids and events.
pub fn starts_recorded_together_refuse_only_their_own(store: &dyn Store) {
    let t = tenant("conf-starts");
    let a = admit(store, &t, "a", None);
    let b = admit(store, &t, "b", None);
    let c = admit(store, &t, "c", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&b.name), USER, now())
        .unwrap();
    let items: Vec<StartItem> = [(&a, 11), (&b, 12), (&c, 13)]
        .into_iter()
        .map(|(x, pid)| StartItem {
            name: x.name.clone(),
            run: x.run.clone(),
            pid,
            cgroup: format!("/cg/{}", x.name),
            now_ms: now(),
            events: vec![event(&x.name, Some(&x.run), "agent.start")],
            supervisor: None,
        })
        .collect();
    let before = all_events(store, &t).len();
    let answers = store.start_runs(&t, &items);
    assert_eq!(answers.len(), 3);
    match &answers[1] {
        Err(StoreError::Transition { name, .. }) => assert_eq!(name, "b"),
        other => panic!("b: expected a transition refusal, got {other:?}"),
    }
    for (i, x, pid) in [(0, &a, 11), (2, &c, 13)] {
        let got = answers[i].as_ref().unwrap();
        assert_eq!(
            (got.name.as_str(), got.status),
            (x.name.as_str(), Status::Running)
        );
        let run = store.run(&t, &x.run).unwrap().unwrap();
        assert_eq!(run.pid, Some(pid));
    }
    let run_b = store.run(&t, &b.run).unwrap().unwrap();
    assert_eq!((run_b.pid, run_b.outcome), (None, Some(USER)));
    let evs = all_events(store, &t);
    let starts: Vec<&str> = evs[before..]
        .iter()
        .filter(|e| e.kind == "agent.start")
        .map(|e| e.agent.as_str())
        .collect();
    assert_eq!(
        starts,
        ["a", "c"],
        "one agent.start each for the started ones"
    );
}

pub fn start_run_of_a_stale_run_is_refused(store: &dyn Store) {
    let t = tenant("conf-stalestart");
    let a = admit(store, &t, "a", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&a.name), USER, now())
        .unwrap();
    let run2 = new_run();
    store
        .resume(&t, &a.name, &run2, "sup-stalestart", now(), &[])
        .unwrap();
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.start_run(&t, &a.name, &a.run, 1, "/cg", now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains(a.run.as_str()), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

/// Issue 28's fault campaign: a node declared lost (paused past the
/// expiry) still held a queued agent that the others had placed again on
/// another node, and started it when it woke; both nodes then ran it. A
/// start that names its supervisor is refused when the record names
/// another, alone or with others, with nothing written; the node the record
/// names starts it.
pub fn a_start_by_a_supervisor_the_record_does_not_name_is_refused(store: &dyn Store) {
    let t = tenant("conf-startfence");
    let a = admit(store, &t, "a", None);
    let b = admit(store, &t, "b", None);
    let sup = a.supervisor.clone();
    assert!(
        store.replace_queued(&t, &a.name, &sup, "node-b").unwrap(),
        "a is placed again on node-b"
    );
    let item = |x: &Agent, by: &str| StartItem {
        name: x.name.clone(),
        run: x.run.clone(),
        pid: 7,
        cgroup: format!("/cg/{}", x.name),
        now_ms: now(),
        events: vec![event(&x.name, Some(&x.run), "agent.start")],
        supervisor: Some(by.to_owned()),
    };
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.start_one(&t, &item(&a, &sup)));
    assert_eq!(code, Code::Conflict, "{msg}");
    assert!(msg.contains(&sup), "{msg}");
    assert_eq!(snapshot(store, &t), before);
    // With another start that stands: only its own is refused.
    let answers = store.start_runs(&t, &[item(&a, &sup), item(&b, &sup)]);
    assert!(
        matches!(
            &answers[0],
            Err(StoreError::Refused {
                code: Code::Conflict,
                ..
            })
        ),
        "{:?}",
        answers[0]
    );
    assert_eq!(answers[1].as_ref().unwrap().status, Status::Running);
    let a_now = store.agent(&t, &a.name).unwrap().unwrap();
    assert_eq!(a_now.status, Status::Queued);
    // Claimed by the node it was placed on, it starts there.
    let claimed = store.claim_placed(&t, "node-b", 10).unwrap();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let started = store.start_one(&t, &item(&a, "node-b")).unwrap();
    assert_eq!(started.status, Status::Running);
}

pub fn illegal_transitions_are_refused_and_change_nothing(store: &dyn Store) {
    let t = tenant("conf-illegal");
    running(store, &t, "root", None);
    admit(store, &t, "q", Some("root"));
    running(store, &t, "r", Some("root"));
    let b = running(store, &t, "b", Some("root"));
    store
        .set_status(&t, &b.name, Status::Blocked, Some("input"), now(), &[])
        .unwrap();
    let s = running(store, &t, "s", Some("root"));
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), USER, now())
        .unwrap();
    let e = running(store, &t, "e", Some("root"));
    end(store, &e, Terminal::Completed, Some("done"));
    let c = running(store, &t, "c", Some("root"));
    end(store, &c, Terminal::Completed, Some("done"));
    store
        .set_status(
            &t,
            &c.name,
            Status::Closed(Terminal::Completed),
            None,
            now(),
            &[],
        )
        .unwrap();

    let mut refused = 0;
    for n in ["q", "r", "b", "s", "e", "c"] {
        let from = get(store, &t, n).status;
        for to in all_statuses() {
            let legal = from.transition(to).is_ok();
            // Legal moves that have their own method (the run record would be
            // left behind otherwise) are refused by set_status too.
            let elsewhere = matches!(to, Status::Ended(_) | Status::Queued)
                || (from, to) == (Status::Queued, Status::Running);
            if legal && !elsewhere {
                // Covered by set_status_blocks_unblocks_and_closes; doing it here
                // would change the state under the rest of the loop.
                continue;
            }
            refused += 1;
            let before = snapshot(store, &t);
            let r = store.set_status(
                &t,
                &name(n),
                to,
                Some("nope"),
                now(),
                &[event(&name(n), None, "x")],
            );
            if legal {
                let (code, msg) = refusal(r);
                assert_eq!(code, Code::BadRequest, "{msg}");
            } else {
                match r {
                    Err(StoreError::Transition { name: got, source }) => {
                        assert_eq!(got, n);
                        assert_eq!((source.from, source.to), (from, to));
                    }
                    other => panic!("{n}: {from:?} -> {to:?} gave {other:?}"),
                }
            }
            assert_eq!(snapshot(store, &t), before, "{n}: {from:?} -> {to:?}");
        }
    }
    assert!(refused > 200, "only {refused} moves were tried");

    // The dedicated methods refuse illegal moves the same way.
    let before = snapshot(store, &t);
    let e = get(store, &t, "e");
    let r = store.end_run(
        &t,
        &e.name,
        &e.run,
        &RunEnd {
            outcome: Terminal::Completed,
            exit_code: Some(0),
            result: Some("twice".into()),
            detail: None,
            now_ms: now(),
            output: None,
        },
        &[],
    );
    assert!(matches!(r, Err(StoreError::Transition { .. })), "{r:?}");
    let r = get(store, &t, "r");
    let x = store.start_run(&t, &r.name, &r.run, 1, "/cg", now(), &[]);
    assert!(matches!(x, Err(StoreError::Transition { .. })), "{x:?}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn set_status_blocks_unblocks_and_closes(store: &dyn Store) {
    let t = tenant("conf-setstatus");
    let a = running(store, &t, "a", None);
    let at = now();
    let blocked = store
        .set_status(
            &t,
            &a.name,
            Status::Blocked,
            Some("waiting for input"),
            at,
            &[event(&a.name, Some(&a.run), "agent.blocked")],
        )
        .unwrap();
    assert_eq!(
        (
            blocked.status,
            blocked.detail.as_deref(),
            blocked.updated_ms
        ),
        (Status::Blocked, Some("waiting for input"), at)
    );
    let back = store
        .set_status(&t, &a.name, Status::Running, None, now(), &[])
        .unwrap();
    assert_eq!(
        (back.status, back.detail.as_deref()),
        (Status::Running, None)
    );
    end(store, &back, Terminal::Completed, Some("r"));
    let closed = store
        .set_status(
            &t,
            &a.name,
            Status::Closed(Terminal::Completed),
            None,
            now(),
            &[],
        )
        .unwrap();
    assert_eq!(closed.status, Status::Closed(Terminal::Completed));
    assert_eq!(
        store
            .events(&t, 0, Some(&a.name), 100)
            .unwrap()
            .iter()
            .filter(|e| e.kind == "agent.blocked")
            .count(),
        1
    );
}

pub fn end_run_records_the_run_and_the_channel_result(store: &dyn Store) {
    let t = tenant("conf-endrun");
    running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    let at = now();
    let ended = store
        .end_run(
            &t,
            &kid.name,
            &kid.run,
            &RunEnd {
                outcome: Terminal::Completed,
                exit_code: Some(0),
                result: Some("the answer".into()),
                detail: Some("fine".into()),
                now_ms: at,
                output: Some(ChannelOutput {
                    refs: "{\"id\":\"ref-1\"}\n".into(),
                    artifacts: vec![Artifact {
                        name: "out/a.txt".into(),
                        sha256: "ab".repeat(32),
                        size: 5,
                    }],
                }),
            },
            &[event(&kid.name, Some(&kid.run), "agent.stop")],
        )
        .unwrap();
    assert_eq!(
        (ended.status, ended.detail.as_deref()),
        (Status::Ended(Terminal::Completed), Some("fine"))
    );
    let run = store.run(&t, &kid.run).unwrap().unwrap();
    assert_eq!(run.outcome, Some(Terminal::Completed));
    assert_eq!(
        (run.exit_code, run.result.as_deref(), run.ended_ms),
        (Some(0), Some("the answer"), Some(at))
    );
    let ch = store
        .channel(&t, &name("root"), &kid.name)
        .unwrap()
        .unwrap();
    assert_eq!(
        (ch.result.as_deref(), ch.status),
        (Some("the answer"), Status::Ended(Terminal::Completed))
    );
    // What the child handed back besides the result (SPEC 4) reads back whole.
    assert_eq!(ch.refs.as_deref(), Some("{\"id\":\"ref-1\"}\n"));
    assert_eq!(
        ch.artifacts,
        vec![Artifact {
            name: "out/a.txt".into(),
            sha256: "ab".repeat(32),
            size: 5
        }]
    );

    // A failure without a result leaves the channel's result empty.
    let kid2 = running(store, &t, "kid2", Some("root"));
    let failed = Terminal::Failed(FailReason::ExitCode);
    store
        .end_run(
            &t,
            &kid2.name,
            &kid2.run,
            &RunEnd {
                outcome: failed,
                exit_code: Some(3),
                result: None,
                detail: Some("exit 3".into()),
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    let ch = store
        .channel(&t, &name("root"), &kid2.name)
        .unwrap()
        .unwrap();
    assert_eq!((ch.result, ch.status), (None, Status::Ended(failed)));

    // A queued agent whose start failed ends without ever running.
    let kid3 = admit(store, &t, "kid3", Some("root"));
    let crashed = Terminal::Failed(FailReason::Crashed);
    let e = store
        .end_run(
            &t,
            &kid3.name,
            &kid3.run,
            &RunEnd {
                outcome: crashed,
                exit_code: None,
                result: None,
                detail: None,
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    assert_eq!(e.status, Status::Ended(crashed));
}

pub fn end_run_from_stopping_keeps_the_recorded_outcome(store: &dyn Store) {
    let t = tenant("conf-endstopping");
    running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    store
        .mark_stopping(&t, std::slice::from_ref(&kid.name), PARENT_DEAD, now())
        .unwrap();
    // The process exited 0 with a result after SIGTERM; the intent stands.
    let ended = store
        .end_run(
            &t,
            &kid.name,
            &kid.run,
            &RunEnd {
                outcome: Terminal::Completed,
                exit_code: Some(0),
                result: Some("late answer".into()),
                detail: None,
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    assert_eq!(ended.status, Status::Ended(PARENT_DEAD));
    let run = store.run(&t, &kid.run).unwrap().unwrap();
    assert_eq!(run.outcome, Some(PARENT_DEAD));
    assert_eq!(
        store
            .channel(&t, &name("root"), &kid.name)
            .unwrap()
            .unwrap()
            .status,
        Status::Ended(PARENT_DEAD)
    );
}

pub fn end_run_of_an_old_run_is_refused(store: &dyn Store) {
    let t = tenant("conf-oldrun");
    let a = running(store, &t, "a", None);
    end(store, &a, Terminal::Completed, Some("one"));
    let run2 = new_run();
    let a2 = store
        .resume(&t, &a.name, &run2, "sup-oldrun", now(), &[])
        .unwrap();
    start(store, &a2);
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.end_run(
        &t,
        &a.name,
        &a.run,
        &RunEnd {
            outcome: USER,
            exit_code: None,
            result: None,
            detail: None,
            now_ms: now(),
            output: None,
        },
        &[],
    ));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains(a.run.as_str()), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn mark_stopping_records_the_intent(store: &dyn Store) {
    let t = tenant("conf-markstop");
    running(store, &t, "root", None);
    running(store, &t, "run", Some("root"));
    let b = running(store, &t, "blk", Some("root"));
    store
        .set_status(&t, &b.name, Status::Blocked, None, now(), &[])
        .unwrap();
    let q = admit(store, &t, "que", Some("root"));
    let d = running(store, &t, "done", Some("root"));
    end(store, &d, Terminal::Completed, Some("x"));
    let s = running(store, &t, "stp", Some("root"));
    let timed_out = Terminal::Failed(FailReason::TimedOut);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), timed_out, now())
        .unwrap();

    let names: Vec<AgentName> = ["stp", "done", "que", "blk", "run"].map(name).to_vec();
    let at = now();
    let out = store.mark_stopping(&t, &names, PARENT_DEAD, at).unwrap();
    let got: Vec<(&str, Status)> = out.iter().map(|a| (a.name.as_str(), a.status)).collect();
    assert_eq!(
        got,
        vec![
            ("stp", Status::Stopping(timed_out)),
            ("done", Status::Ended(Terminal::Completed)),
            ("que", Status::Ended(PARENT_DEAD)),
            ("blk", Status::Stopping(PARENT_DEAD)),
            ("run", Status::Stopping(PARENT_DEAD)),
        ]
    );
    // The queued one never ran: its run is over now.
    let run = store.run(&t, &q.run).unwrap().unwrap();
    assert_eq!(
        (run.outcome, run.ended_ms, run.started_ms),
        (Some(PARENT_DEAD), Some(at), None)
    );
    for a in &out {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
    }
}

pub fn mark_stopping_with_an_unknown_name_changes_nothing(store: &dyn Store) {
    let t = tenant("conf-markstop-unknown");
    running(store, &t, "a", None);
    let before = snapshot(store, &t);
    let r = store.mark_stopping(&t, &[name("a"), name("ghost")], USER, now());
    match r {
        Err(StoreError::NotFound { tenant, name }) => {
            assert_eq!((tenant.as_str(), name.as_str()), (t.as_str(), "ghost"))
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_eq!(snapshot(store, &t), before);
}

/// What a write answers is the record a read gives right after it: the
/// answer is built from what the write read and wrote, not read again, so
/// it must not drift from the row. Starts and ends recorded together number
/// their events in the items' order, each at its own item's time, and a
/// start whose event is malformed is refused alone, before it writes.
pub fn writes_answer_the_record_they_leave(store: &dyn Store) {
    let t = tenant("conf-answers");
    running(store, &t, "p", None);
    let a = admit(store, &t, "a", Some("p"));
    let b = admit(store, &t, "b", Some("p"));
    let c = admit(store, &t, "c", None);
    let base = now();
    let mut bad = event(&c.name, Some(&c.run), "agent.start");
    bad.payload = "not an object".into();
    let item = |x: &Agent, at: i64, events: Vec<NewEvent>| StartItem {
        name: x.name.clone(),
        run: x.run.clone(),
        pid: 40,
        cgroup: format!("/cg/{}", x.name),
        now_ms: at,
        events,
        supervisor: None,
    };
    let items = [
        item(
            &a,
            base + 1,
            vec![event(&a.name, Some(&a.run), "agent.start")],
        ),
        item(&c, base + 2, vec![bad]),
        item(
            &b,
            base + 3,
            vec![event(&b.name, Some(&b.run), "agent.start")],
        ),
    ];
    let before = all_events(store, &t).len();
    let mut answers = store.start_runs(&t, &items);
    assert_eq!(answers[0].as_ref().unwrap(), &get(store, &t, "a"));
    assert_eq!(answers[2].as_ref().unwrap(), &get(store, &t, "b"));
    let (code, msg) = refusal(answers.remove(1));
    assert_eq!(code, Code::BadRequest, "{msg}");
    assert_eq!(
        get(store, &t, "c").status,
        Status::Queued,
        "c wrote nothing"
    );
    let timed: Vec<(String, i64)> = all_events(store, &t)[before..]
        .iter()
        .map(|e| (e.agent.to_string(), e.ts_ms))
        .collect();
    assert_eq!(timed, [("a".into(), base + 1), ("b".into(), base + 3)]);

    let blocked = store
        .set_status(&t, &b.name, Status::Blocked, Some("waiting"), base + 4, &[])
        .unwrap();
    assert_eq!(blocked, get(store, &t, "b"));
    let stopping = store
        .mark_stopping(&t, &[a.name.clone(), c.name.clone()], USER, base + 5)
        .unwrap();
    assert_eq!(stopping, [get(store, &t, "a"), get(store, &t, "c")]);
    assert_eq!(stopping[1].status, Status::Ended(USER), "c was queued");

    let end = |x: &Agent, at: i64| EndItem {
        name: x.name.clone(),
        run: x.run.clone(),
        end: Some(RunEnd {
            outcome: Terminal::Completed,
            exit_code: Some(0),
            result: Some(format!("{} done", x.name)),
            detail: Some(format!("{} detail", x.name)),
            now_ms: at,
            output: None,
        }),
        events: vec![event(&x.name, Some(&x.run), "agent.end")],
        now_ms: at,
    };
    let before = all_events(store, &t).len();
    let ended = store
        .end_runs(&t, &[end(&b, base + 6), end(&a, base + 7)])
        .unwrap();
    assert_eq!(ended, [get(store, &t, "b"), get(store, &t, "a")]);
    assert_eq!(
        ended[1].status,
        Status::Ended(USER),
        "a's stop intent stands"
    );
    assert_eq!(ended[0].detail.as_deref(), Some("b detail"));
    let timed: Vec<(String, i64)> = all_events(store, &t)[before..]
        .iter()
        .map(|e| (e.agent.to_string(), e.ts_ms))
        .collect();
    assert_eq!(timed, [("b".into(), base + 6), ("a".into(), base + 7)]);
}
