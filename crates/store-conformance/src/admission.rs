//! Admission: what `admit` records and every refusal, each leaving nothing written.

use crate::*;

pub fn admit_root_and_children(store: &dyn Store) {
    let t = tenant("conf-admit");
    let new = new_agent(&t, "root", None, "sup-admit");
    let root = store.admit(&new, &spawn_events(&new)).unwrap();
    assert_eq!(root.status, Status::Queued);
    assert_eq!(
        (root.depth, root.root.as_str(), root.parent.as_ref()),
        (0, "root", None)
    );
    assert_eq!(root.run, new.run);
    assert_eq!(root.spec, new.spec);
    assert_eq!(root.supervisor, "sup-admit");
    assert_eq!((root.created_ms, root.updated_ms), (new.now_ms, new.now_ms));
    assert!(store.tenants().unwrap().contains(&t));
    let runs = store.runs(&t, &root.name).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].seq, &runs[0].id, runs[0].created_ms),
        (1, &new.run, new.now_ms)
    );
    assert_eq!(
        (runs[0].pid, runs[0].outcome, runs[0].started_ms),
        (None, None, None)
    );
    assert_eq!(store.run(&t, &new.run).unwrap().as_ref(), Some(&runs[0]));
    let root = start(store, &root);

    let a = admit(store, &t, "a", Some("root"));
    let b = admit(store, &t, "b", Some("root"));
    let a = start(store, &a);
    let a1 = admit(store, &t, "a1", Some("a"));
    for (x, parent, depth) in [(&a, "root", 1), (&b, "root", 1), (&a1, "a", 2)] {
        assert_eq!(x.parent.as_ref().map(AgentName::as_str), Some(parent));
        assert_eq!((x.depth, x.root.as_str()), (depth, "root"));
    }
    let ch = store.channel(&t, &root.name, &b.name).unwrap().unwrap();
    assert_eq!(ch.parent_session, root.session);
    assert_eq!(ch.child_session, b.session);
    assert_eq!(ch.handoff, "task of b");
    assert_eq!((ch.result, ch.status), (None, Status::Queued));
    assert!(store.channel(&t, &a.name, &b.name).unwrap().is_none());

    // A customer other than the parent is recorded.
    let mut new = new_agent(&t, "c", Some("a"), "sup-admit");
    new.customer = Some(name("b"));
    let c = store.admit(&new, &spawn_events(&new)).unwrap();
    assert_eq!(c.customer, Some(name("b")));

    // The spawn events landed in the right logs, numbered from 1.
    let evs = all_events(store, &t);
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>());
    let child_spawn: Vec<_> = evs
        .iter()
        .filter(|e| e.kind == "agent.child.spawn")
        .collect();
    assert_eq!(child_spawn.len(), 4);
    assert!(
        child_spawn
            .iter()
            .take(2)
            .all(|e| e.agent.as_str() == "root")
    );
    let spawn_a: Vec<_> = store
        .events(&t, 0, Some(&name("a")), 100)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "agent.spawn")
        .collect();
    assert_eq!(spawn_a.len(), 1);
    assert_eq!(spawn_a[0].run.as_ref(), Some(&a.run));
}

pub fn admit_refuses_a_taken_name(store: &dyn Store) {
    let t = tenant("conf-taken");
    running(store, &t, "root", None);
    admit(store, &t, "kid", Some("root"));
    let before = snapshot(store, &t);
    for parent in [None, Some("root")] {
        let new = new_agent(&t, "kid", parent, "sup-taken");
        let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
        assert_eq!(code, Code::NameTaken);
        assert!(msg.contains("kid"), "{msg}");
        // The refused run id was not kept either.
        assert_eq!(store.run(&t, &new.run).unwrap(), None);
    }
    assert_eq!(snapshot(store, &t), before);
}

pub fn admit_refuses_a_missing_parent(store: &dyn Store) {
    let t = tenant("conf-noparent");
    running(store, &t, "root", None);
    let before = snapshot(store, &t);
    let new = new_agent(&t, "kid", Some("ghost"), "sup-noparent");
    let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
    assert_eq!(code, Code::ParentMismatch);
    assert!(msg.contains("ghost"), "{msg}");
    // The parent is checked before the name: a taken name under a missing parent
    // is a parent problem.
    let new = new_agent(&t, "root", Some("ghost"), "sup-noparent");
    assert_eq!(refusal(store.admit(&new, &[])).0, Code::ParentMismatch);
    assert_eq!(snapshot(store, &t), before);
}

pub fn admit_refuses_a_queued_or_finished_parent(store: &dyn Store) {
    let t = tenant("conf-deadparent");
    admit(store, &t, "queued", None);
    let done = running(store, &t, "done", None);
    end(store, &done, Terminal::Completed, Some("ok"));
    let before = snapshot(store, &t);
    for (parent, word) in [("queued", "queued"), ("done", "completed")] {
        let new = new_agent(&t, "kid", Some(parent), "sup-deadparent");
        let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
        assert_eq!(code, Code::ParentMismatch);
        assert!(msg.contains(parent) && msg.contains(word), "{msg}");
    }
    assert_eq!(snapshot(store, &t), before);
}

pub fn admit_refuses_a_stopping_parent(store: &dyn Store) {
    let t = tenant("conf-stopparent");
    let root = running(store, &t, "root", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&root.name), PARENT_DEAD, now())
        .unwrap();
    let before = snapshot(store, &t);
    let new = new_agent(&t, "kid", Some("root"), "sup-stopparent");
    let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
    assert_eq!(code, Code::ParentMismatch);
    assert!(msg.contains("root") && msg.contains("stopping"), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn admit_refuses_a_missing_customer(store: &dyn Store) {
    let t = tenant("conf-nocustomer");
    running(store, &t, "root", None);
    let before = snapshot(store, &t);
    let mut new = new_agent(&t, "kid", Some("root"), "sup-nocustomer");
    new.customer = Some(name("nobody"));
    let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
    assert_eq!(code, Code::ParentMismatch);
    assert!(msg.contains("nobody"), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn a_refused_admission_creates_no_tenant(store: &dyn Store) {
    let t = tenant("conf-notenant");
    let new = new_agent(&t, "kid", Some("ghost"), "sup-notenant");
    refusal(store.admit(&new, &spawn_events(&new)));
    assert!(!store.tenants().unwrap().contains(&t));
    assert_eq!(
        snapshot(store, &t),
        Snapshot {
            has_tenant: false,
            agents: vec![],
            runs: vec![],
            channels: vec![],
            messages: vec![],
            events: vec![],
            unfinished: vec![],
        }
    );
}

pub fn admit_refuses_bad_json(store: &dyn Store) {
    let t = tenant("conf-badjson");
    running(store, &t, "root", None);
    let before = snapshot(store, &t);
    let mut new = new_agent(&t, "kid", Some("root"), "sup-badjson");
    new.spec = "[1, 2]".to_owned();
    let (code, msg) = refusal(store.admit(&new, &spawn_events(&new)));
    assert_eq!(code, Code::BadRequest);
    assert!(msg.contains("spec of agent kid"), "{msg}");
    let new = new_agent(&t, "kid", Some("root"), "sup-badjson");
    let mut evs = spawn_events(&new);
    evs[0].payload = "{\"type\":\n\"agent.spawn\"}".to_owned();
    let (code, msg) = refusal(store.admit(&new, &evs));
    assert_eq!(code, Code::BadRequest);
    assert!(
        msg.contains("agent.spawn") && msg.contains("one-line"),
        "{msg}"
    );
    assert_eq!(snapshot(store, &t), before);
}

/// Admissions racing under one parent, as a store's group commit batches
/// them: each is exact against the writes of those before it (the fanout
/// quota admits exactly `max_fanout`), and each fails alone. Half of them
/// fail late (an event names an agent that does not exist, after the agent,
/// run, edge and channel rows are written) and must leave nothing behind
/// while the others commit; the event log stays gapless.
pub fn concurrent_admissions_are_exact_and_each_fails_alone(store: &dyn Store) {
    const N: usize = 100;
    const FANOUT: u32 = 30;
    let t = tenant("conf-group");
    let p = running(store, &t, "p", None);
    let before = all_events(store, &t).len();
    let q = Quotas {
        max_fanout: FANOUT,
        ..Quotas::CEILINGS
    };
    let barrier = std::sync::Barrier::new(N);
    let outcomes = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..N {
            let (t, q, barrier, outcomes) = (&t, &q, &barrier, &outcomes);
            s.spawn(move || {
                let new = new_agent(t, &format!("c{i}"), Some("p"), "sup-group");
                let mut events = spawn_events(&new);
                if i % 2 == 1 {
                    events.push(event(&name("ghost"), None, "agent.note"));
                }
                barrier.wait();
                let r = store.admit_with_quotas(&new, q, &events);
                outcomes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((i, r));
            });
        }
    });
    let mut admitted = Vec::new();
    for (i, r) in outcomes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        let child = name(&format!("c{i}"));
        match (i % 2, r) {
            (0, Ok(a)) => {
                assert_eq!(Some(a), store.agent(&t, &child).unwrap());
                admitted.push(child);
            }
            (_, Err(StoreError::Refused { code, message })) => {
                assert_eq!(code, Code::QuotaFanout, "c{i}: {message}");
                assert_eq!(store.agent(&t, &child).unwrap(), None, "c{i}");
            }
            (1, Err(StoreError::NotFound { name, .. })) => {
                assert_eq!(name, "ghost");
                assert_eq!(store.agent(&t, &child).unwrap(), None, "c{i}");
            }
            (_, r) => panic!("creation c{i}: unexpected {r:?}"),
        }
    }
    assert_eq!(
        admitted.len(),
        FANOUT as usize,
        "exactly max_fanout admitted"
    );
    let mut kids: Vec<AgentName> = store
        .children(&t, &p.name)
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    kids.sort();
    admitted.sort();
    assert_eq!(kids, admitted);
    let evs = all_events(store, &t);
    assert_eq!(evs.len(), before + 2 * admitted.len());
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>());
}

/// Admissions handed over together (`admit_all_with_quotas`, one caller's
/// batch, here two callers' at once, more than one group commit takes) are
/// each answered as if alone, in its batch's order: a taken name and a
/// missing agent fail alone, and the fanout holds exactly, decided in queue
/// order, so in each batch the admitted ones come before the refused ones.
pub fn admissions_handed_over_together_are_each_answered_in_order(store: &dyn Store) {
    const EACH: usize = 45;
    const FANOUT: u32 = 60;
    let t = tenant("conf-batch");
    let p = running(store, &t, "p", None);
    let before = all_events(store, &t).len();
    let q = Quotas {
        max_fanout: FANOUT,
        ..Quotas::CEILINGS
    };
    let barrier = std::sync::Barrier::new(2);
    let answers: Vec<Vec<Result<brood_store::Agent, StoreError>>> = std::thread::scope(|s| {
        let calls: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|batch| {
                let (t, q, barrier) = (&t, &q, &barrier);
                s.spawn(move || {
                    let mut news = Vec::new();
                    let mut events = Vec::new();
                    for i in 0..EACH {
                        // The first of each batch takes p's own name.
                        let n = if i == 0 {
                            "p".to_owned()
                        } else {
                            format!("{batch}{i}")
                        };
                        let new = new_agent(t, &n, Some("p"), "sup-batch");
                        let mut ev = spawn_events(&new);
                        if i == 7 {
                            ev.push(event(&name("ghost"), None, "agent.note"));
                        }
                        events.push(ev);
                        news.push(new);
                    }
                    let batch: Vec<_> = news
                        .iter()
                        .zip(&events)
                        .map(|(n, e)| (n, e.as_slice()))
                        .collect();
                    barrier.wait();
                    store.admit_all_with_quotas(&batch, q)
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let mut admitted = Vec::new();
    for (batch, answers) in ["a", "b"].into_iter().zip(answers) {
        assert_eq!(answers.len(), EACH, "one answer per admission");
        let mut refused_for_fanout = false;
        for (i, r) in answers.into_iter().enumerate() {
            match (i, r) {
                (0, Err(StoreError::Refused { code, .. })) => assert_eq!(code, Code::NameTaken),
                (7, Err(StoreError::NotFound { name, .. })) => assert_eq!(name, "ghost"),
                (i, Ok(a)) => {
                    assert!(
                        !refused_for_fanout,
                        "{batch}{i} admitted after a refusal of its batch"
                    );
                    assert_eq!(a.name.as_str(), format!("{batch}{i}"));
                    assert_eq!(Some(&a), store.agent(&t, &a.name).unwrap().as_ref());
                    admitted.push(a.name);
                }
                (i, Err(StoreError::Refused { code, message })) => {
                    assert_eq!(code, Code::QuotaFanout, "{batch}{i}: {message}");
                    refused_for_fanout = true;
                }
                (i, r) => panic!("{batch}{i}: unexpected {r:?}"),
            }
        }
    }
    assert_eq!(
        admitted.len(),
        FANOUT as usize,
        "exactly max_fanout admitted"
    );
    let mut kids: Vec<AgentName> = store
        .children(&t, &p.name)
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    kids.sort();
    admitted.sort();
    assert_eq!(kids, admitted);
    let evs = all_events(store, &t);
    assert_eq!(evs.len(), before + 2 * admitted.len());
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>());
}

/// A parent's `create_limit` and budget hold against admissions racing under
/// it, as a group commit decides them together: each counts the children
/// admitted before it in the same transaction, not only those written.
pub fn racing_children_keep_create_limit_and_budget(store: &dyn Store) {
    const N: usize = 40;
    let t = tenant("conf-group-limits");
    let q = Quotas::CEILINGS;
    let parent = |n: &str, policy: &str| {
        let mut new = new_agent(&t, n, None, "sup-limits");
        new.spec = format!(r#"{{"argv":["x"],"policy":{policy}}}"#);
        start(store, &store.admit_with_quotas(&new, &q, &[]).unwrap())
    };
    parent("limited", r#"{"create_limit":7}"#);
    // 1.0 holds six children of 0.15, not seven.
    parent("budgeted", r#"{"cost_limit":1.0}"#);
    let barrier = std::sync::Barrier::new(2 * N);
    let outcomes = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for i in 0..2 * N {
            let (t, q, barrier, outcomes) = (&t, &q, &barrier, &outcomes);
            s.spawn(move || {
                let (p, spec) = if i % 2 == 0 {
                    ("limited", r#"{"argv":["x"]}"#)
                } else {
                    ("budgeted", r#"{"argv":["x"],"policy":{"cost_limit":0.15}}"#)
                };
                let mut new = new_agent(t, &format!("k{i}"), Some(p), "sup-limits");
                new.spec = spec.to_owned();
                let events = spawn_events(&new);
                barrier.wait();
                let r = store.admit_with_quotas(&new, q, &events);
                outcomes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((p, r));
            });
        }
    });
    let mut admitted = std::collections::BTreeMap::<&str, usize>::new();
    for (p, r) in outcomes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        match r {
            Ok(_) => *admitted.entry(p).or_default() += 1,
            Err(StoreError::Refused { code, message }) => {
                let want = if p == "limited" {
                    Code::CreateLimit
                } else {
                    Code::BudgetExceeded
                };
                assert_eq!(code, want, "{p}: {message}");
            }
            Err(e) => panic!("a child of {p}: unexpected {e:?}"),
        }
    }
    assert_eq!(admitted.get("limited"), Some(&7), "{admitted:?}");
    assert_eq!(admitted.get("budgeted"), Some(&6), "{admitted:?}");
    for (p, n) in [("limited", 7), ("budgeted", 6)] {
        assert_eq!(store.children(&t, &name(p)).unwrap().len(), n, "{p}");
    }
    let evs = all_events(store, &t);
    let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=evs.len() as i64).collect::<Vec<_>>());
}
