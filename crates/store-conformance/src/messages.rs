//! Messages and resume: a session's transcript and new runs on it.

use crate::*;

pub fn messages_read_back_in_order(store: &dyn Store) {
    let t = tenant("conf-messages");
    let a = running(store, &t, "a", None);
    let other = SessionName::new("side").unwrap();
    for (i, (role, content)) in [
        ("user", "hello"),
        ("assistant", "hi\nthere"),
        ("user", "bye"),
    ]
    .into_iter()
    .enumerate()
    {
        let m = store
            .append_message(&t, &a.name, &a.session, &a.run, role, content, now())
            .unwrap();
        assert_eq!(m.seq, i as i64 + 1);
    }
    let m = store
        .append_message(&t, &a.name, &other, &a.run, "user", "elsewhere", now())
        .unwrap();
    assert_eq!(m.seq, 1, "positions are per session");
    let got: Vec<(i64, String, String)> = store
        .messages(&t, &a.name, &a.session)
        .unwrap()
        .into_iter()
        .map(|m| (m.seq, m.role, m.content))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "user".into(), "hello".into()),
            (2, "assistant".into(), "hi\nthere".into()),
            (3, "user".into(), "bye".into()),
        ]
    );
    // Unknown agent and a run of another agent are refused.
    assert!(matches!(
        store.append_message(&t, &name("ghost"), &a.session, &a.run, "user", "x", now()),
        Err(StoreError::NotFound { .. })
    ));
    let b = admit(store, &t, "b", None);
    assert_eq!(
        refusal(store.append_message(&t, &a.name, &a.session, &b.run, "user", "x", now())).0,
        Code::Conflict
    );
}

pub fn resume_makes_a_new_run_and_keeps_messages(store: &dyn Store) {
    let t = tenant("conf-resume");
    running(store, &t, "root", None);
    let a = running(store, &t, "a", Some("root"));
    store
        .append_message(&t, &a.name, &a.session, &a.run, "user", "one", now())
        .unwrap();
    store
        .append_message(&t, &a.name, &a.session, &a.run, "assistant", "two", now())
        .unwrap();
    end(store, &a, Terminal::Completed, Some("first answer"));
    store
        .set_status(
            &t,
            &a.name,
            Status::Closed(Terminal::Completed),
            None,
            now(),
            &[],
        )
        .unwrap();

    let run2 = new_run();
    let at = now();
    let resumed = store
        .resume(
            &t,
            &a.name,
            &run2,
            "sup-other",
            at,
            &[event(&a.name, Some(&run2), "agent.resume")],
        )
        .unwrap();
    assert_eq!(
        (resumed.status, &resumed.run, resumed.supervisor.as_str()),
        (Status::Queued, &run2, "sup-other")
    );
    assert_eq!((resumed.created_ms, resumed.updated_ms), (a.created_ms, at));
    let runs = store.runs(&t, &a.name).unwrap();
    assert_eq!(
        runs.iter()
            .map(|r| (r.seq, r.id.clone()))
            .collect::<Vec<_>>(),
        vec![(1, a.run.clone()), (2, run2.clone())]
    );
    assert_eq!(
        runs[0].result.as_deref(),
        Some("first answer"),
        "the old run keeps its result"
    );
    assert_eq!((runs[1].outcome, runs[1].created_ms), (None, at));
    // The tenant's runs, each agent's in order: root's one and a's two, and
    // nothing of another tenant's.
    let mut all = store.runs(&t, &name("root")).unwrap();
    all.extend(runs.iter().cloned());
    let mut listed = store.tenant_runs(&t).unwrap();
    let by_agent = |x: &Run, y: &Run| (x.agent.as_str(), x.seq).cmp(&(y.agent.as_str(), y.seq));
    listed.sort_by(by_agent);
    all.sort_by(by_agent);
    assert_eq!(listed, all);
    let ch = store.channel(&t, &name("root"), &a.name).unwrap().unwrap();
    assert_eq!((ch.result, ch.status), (None, Status::Queued));
    assert!(ch.refs.is_none() && ch.artifacts.is_empty());

    let m = store
        .append_message(&t, &a.name, &a.session, &run2, "user", "three", now())
        .unwrap();
    assert_eq!(m.seq, 3);
    let msgs = store.messages(&t, &a.name, &a.session).unwrap();
    assert_eq!(
        msgs.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["one", "two", "three"]
    );
    assert_eq!((&msgs[0].run, &msgs[2].run), (&a.run, &run2));

    let again = start(store, &resumed);
    assert_eq!(again.status, Status::Running);
    assert_eq!(store.run(&t, &run2).unwrap().unwrap().pid, Some(4242));
}

pub fn resume_is_refused_unless_finished(store: &dyn Store) {
    let t = tenant("conf-resume-live");
    let a = running(store, &t, "a", None);
    let q = admit(store, &t, "q", None);
    let before = snapshot(store, &t);
    for (x, word) in [(&a, "running"), (&q, "queued")] {
        let (code, msg) = refusal(store.resume(&t, &x.name, &new_run(), "sup", now(), &[]));
        assert_eq!(code, Code::Conflict);
        assert!(msg.contains(word) && msg.contains(x.name.as_str()), "{msg}");
    }
    assert!(matches!(
        store.resume(&t, &name("ghost"), &new_run(), "sup", now(), &[]),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(snapshot(store, &t), before);
}

pub fn resume_is_refused_under_a_dead_parent(store: &dyn Store) {
    // An owned child never outlives its parent, so it cannot be brought back under
    // a parent that is stopping or over: no cascade would ever reach it.
    let t = tenant("conf-resume-orphan");
    let root = running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    end(store, &kid, Terminal::Completed, Some("k"));
    store
        .mark_stopping(&t, std::slice::from_ref(&root.name), USER, now())
        .unwrap();
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.resume(&t, &kid.name, &new_run(), "sup", now(), &[]));
    assert_eq!(code, Code::ParentMismatch);
    assert!(msg.contains("root") && msg.contains("stopping"), "{msg}");
    end(store, &root, USER, None);
    let (code, _) = refusal(store.resume(&t, &kid.name, &new_run(), "sup", now(), &[]));
    assert_eq!(code, Code::ParentMismatch);
    let mut after = snapshot(store, &t);
    after.agents.retain(|a| a.name.as_str() == "kid");
    let mut expected = before;
    expected.agents.retain(|a| a.name.as_str() == "kid");
    assert_eq!(after.agents, expected.agents);
    assert_eq!(store.runs(&t, &kid.name).unwrap().len(), 1);
    // A root (and a parent that is only queued, as after a restart) is fine.
    let root = store
        .resume(&t, &root.name, &new_run(), "sup", now(), &[])
        .unwrap();
    assert_eq!(root.status, Status::Queued);
    let kid = store
        .resume(&t, &kid.name, &new_run(), "sup", now(), &[])
        .unwrap();
    assert_eq!(kid.status, Status::Queued);
}

pub fn resume_within_counts_the_parents_fanout(store: &dyn Store) {
    // A resume is admitted again (SPEC 4): the agent it brings back counts
    // against its parent's fanout like a new child would.
    let t = tenant("conf-resume-fanout");
    let quotas = Quotas {
        max_fanout: 2,
        ..Quotas::DEFAULTS
    };
    running(store, &t, "root", None);
    let done = running(store, &t, "done", Some("root"));
    end(store, &done, Terminal::Completed, Some("d"));
    running(store, &t, "a", Some("root"));
    let b = running(store, &t, "b", Some("root"));
    let before = snapshot(store, &t);
    let (code, msg) =
        refusal(store.resume_within(&t, &done.name, &new_run(), "sup", now(), &quotas, &[]));
    assert_eq!(code, Code::QuotaFanout);
    assert!(
        msg.contains("root") && msg.contains("max_fanout is 2"),
        "{msg}"
    );
    assert_eq!(
        snapshot(store, &t),
        before,
        "a refused resume writes nothing"
    );
    // With a place free, it is resumed.
    end(store, &b, Terminal::Completed, Some("b"));
    let again = store
        .resume_within(&t, &done.name, &new_run(), "sup", now(), &quotas, &[])
        .unwrap();
    assert_eq!(again.status, Status::Queued);
    // A root has no parent's fanout to count.
    let lone = running(store, &t, "lone", None);
    end(store, &lone, Terminal::Completed, Some("l"));
    store
        .resume_within(&t, &lone.name, &new_run(), "sup", now(), &quotas, &[])
        .unwrap();
}
