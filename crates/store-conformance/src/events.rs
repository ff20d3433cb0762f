//! Usage and events: counters, the event log, its filters and gapless sequences.

use crate::*;

pub fn record_usage_replaces_the_counters(store: &dyn Store) {
    let t = tenant("conf-usage");
    let a = running(store, &t, "a", None);
    store.record_usage(&t, &a.run, 10, 20, 0.5).unwrap();
    store.record_usage(&t, &a.run, 100, 200, 1.25).unwrap();
    let run = store.run(&t, &a.run).unwrap().unwrap();
    assert_eq!(
        (run.tokens_in, run.tokens_out, run.cost_usd),
        (100, 200, 1.25)
    );
    let (code, msg) = refusal(store.record_usage(&t, &new_run(), 1, 1, 0.0));
    assert_eq!(code, Code::NotFound);
    assert!(msg.contains("run"), "{msg}");
    // A run is only found in its own tenant.
    assert_eq!(
        refusal(store.record_usage(&tenant("conf-usage-other"), &a.run, 1, 1, 0.0)).0,
        Code::NotFound
    );
    assert_eq!(
        store.run(&tenant("conf-usage-other"), &a.run).unwrap(),
        None
    );
}

pub fn events_filter_by_agent_after_and_limit(store: &dyn Store) {
    let t = tenant("conf-events");
    assert_eq!(store.last_event_seq(&t).unwrap(), 0);
    let a = admit(store, &t, "a", None);
    let b = admit(store, &t, "b", None);
    let mut evs = Vec::new();
    for i in 0..10 {
        let who = if i % 2 == 0 { &a } else { &b };
        evs.push(event(&who.name, None, &format!("k{i}")));
    }
    let at = now();
    let out = store.append_events(&t, &evs, at).unwrap();
    assert_eq!(store.last_event_seq(&t).unwrap(), 12);
    assert_eq!(
        out.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (3..=12).collect::<Vec<_>>()
    );
    assert!(out.iter().all(|e| e.ts_ms == at && e.tenant == t));
    assert_eq!(store.events(&t, 0, None, u32::MAX).unwrap().len(), 12);
    let page = store.events(&t, 4, None, 3).unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [5, 6, 7]);
    let of_b = store.events(&t, 0, Some(&b.name), u32::MAX).unwrap();
    assert!(of_b.iter().all(|e| e.agent == b.name));
    assert_eq!(of_b.len(), 6);
    let of_a_after = store.events(&t, 8, Some(&a.name), 2).unwrap();
    assert_eq!(
        of_a_after.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [9, 11]
    );
    assert_eq!(store.append_events(&t, &[], now()).unwrap(), vec![]);
    assert!(
        store
            .events(&tenant("conf-events-none"), 0, None, 10)
            .unwrap()
            .is_empty()
    );
}

pub fn append_events_refuses_unknown_agents_and_bad_payloads(store: &dyn Store) {
    let t = tenant("conf-badevents");
    let a = admit(store, &t, "a", None);
    let before = snapshot(store, &t);
    let r = store.append_events(
        &t,
        &[event(&a.name, None, "ok"), event(&name("ghost"), None, "x")],
        now(),
    );
    assert!(
        matches!(r, Err(StoreError::NotFound { ref name, .. }) if name == "ghost"),
        "{r:?}"
    );
    let mut bad = event(&a.name, None, "bad");
    bad.payload = "not json".into();
    assert_eq!(
        refusal(store.append_events(&t, &[bad], now())).0,
        Code::BadRequest
    );
    assert_eq!(snapshot(store, &t), before);
}

pub fn event_sequences_are_gapless_under_concurrency(store: &dyn Store) {
    let ta = tenant("conf-seq-a");
    let tb = tenant("conf-seq-b");
    let a = admit(store, &ta, "a", None);
    let b = admit(store, &tb, "b", None);
    const THREADS: usize = 4;
    const BATCHES: usize = 40;
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let (a, b, ta, tb) = (&a, &b, &ta, &tb);
            s.spawn(move || {
                for i in 0..BATCHES {
                    // Alternate tenants and batch sizes so the two sequences
                    // interleave in time.
                    let (t, who) = if (th + i) % 2 == 0 { (ta, a) } else { (tb, b) };
                    let n = 1 + i % 3;
                    let evs: Vec<NewEvent> = (0..n)
                        .map(|k| NewEvent {
                            payload: format!(r#"{{"type":"t","thread":{th},"batch":{i},"k":{k}}}"#),
                            ..event(&who.name, None, "t")
                        })
                        .collect();
                    let out = store.append_events(t, &evs, now()).unwrap();
                    // A batch is one transaction: its numbers are consecutive.
                    for w in out.windows(2) {
                        assert_eq!(w[1].seq, w[0].seq + 1);
                    }
                }
            });
        }
    });
    for (t, who) in [(&ta, &a), (&tb, &b)] {
        let evs = all_events(store, t);
        let seqs: Vec<i64> = evs.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (1..=evs.len() as i64).collect::<Vec<_>>(),
            "tenant {t}"
        );
        assert!(evs.iter().all(|e| e.agent == who.name));
        // Both tenants got half the batches; each batch's events stayed together.
        let expected: usize = (0..THREADS)
            .flat_map(|th| (0..BATCHES).map(move |i| (th, i)))
            .filter(|(th, i)| ((th + i) % 2 == 0) == (*t == ta))
            .map(|(_, i)| 1 + i % 3)
            .sum();
        assert_eq!(
            evs.len(),
            expected + 1,
            "tenant {t}: the spawn event and the batches"
        );
    }
}
