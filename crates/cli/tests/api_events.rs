//! The API's event stream (`GET /api/events`, server-sent events): resumed
//! with `Last-Event-ID` after a dropped connection with no event lost or
//! repeated, filtered, in both forms, and delivered whole to 100
//! subscribers at once. Read over raw sockets (`common::wire::Stream`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::sql;
use common::wire::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_after_a_dropped_connection_with_no_gap_and_no_repeat() {
    let s = Served::start(|_| {}).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["a1", "a2"]).await;
    let mut first = Stream::open(&sock, "/api/events", None).await;
    let mut got = Vec::new();
    let mut last_id = String::new();
    for _ in 0..5 {
        let (id, seq) = first.next_seq().await;
        got.push(seq);
        last_id = id;
    }
    drop(first); // the connection drops mid-stream
    quick_agents(&s, &["a3", "a4"]).await;
    let head = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let mut second = Stream::open(&sock, "/api/events", Some(&last_id)).await;
    // Followed live too: what happens after the reconnect arrives as well.
    quick_agents(&s, &["a5"]).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    assert!(end > head && head > 5, "{head} {end}");
    while *got.last().unwrap() < end {
        got.push(second.next_seq().await.1);
    }
    assert_eq!(
        got,
        (1..=end).collect::<Vec<_>>(),
        "every event exactly once, in order"
    );

    // Filters: one agent's events, by type, in the agentruntime form.
    let mut only = Stream::open(
        &sock,
        "/api/events?agent=a3&type=agent.stop,agent.start",
        None,
    )
    .await;
    let (_, _, d) = only.next().await;
    let v: Value = serde_json::from_str(&d).unwrap();
    assert_eq!(
        (v["agent"].as_str(), v["type"].as_str()),
        (Some("a3"), Some("agent.start"))
    );
    let (_, _, d) = only.next().await;
    assert_eq!(
        serde_json::from_str::<Value>(&d).unwrap()["type"],
        "agent.stop"
    );
    let mut std = Stream::open(
        &sock,
        "/api/events?format=agentruntime&type=agent.spawn&agent=a1",
        None,
    )
    .await;
    let (_, _, d) = std.next().await;
    let v: Value = serde_json::from_str(&d).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["subagentId"].as_str()),
        (Some("subagent.spawned"), Some("a1"))
    );
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sse_subscribers_each_get_every_event_once() {
    let s = Served::start(|_| {}).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["before"]).await;
    let head = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let from = format!("{}-{head}", s.env.sup.tenant());
    let mut subs = Vec::new();
    for _ in 0..100 {
        subs.push(Stream::open(&sock, "/api/events", Some(&from)).await);
    }
    let names: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    quick_agents(&s, &refs).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let want: Vec<i64> = (head + 1..=end).collect();
    assert!(want.len() >= 15, "{want:?}");
    let tasks: Vec<_> = subs
        .into_iter()
        .map(|mut st| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.last().is_none_or(|l| *l < end) {
                    got.push(st.next_seq().await.1);
                }
                got
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), want);
    }
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_is_told_to_resync_and_catches_up() {
    // Small limits, so a client that stops reading falls behind soon.
    let limits = brood_server::EventLimits {
        backlog_batches: 2,
        connection_buffer: 1,
        ..Default::default()
    };
    let s = Served::start_limited(|_| {}, limits).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    let mut slow = Stream::open(&sock, "/api/events", None).await;
    // The log grows by far more than the socket, the connection and the
    // backlog hold while `slow` reads nothing.
    let names: Vec<String> = (0..150).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    quick_agents(&s, &refs).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    let mut got = Vec::new();
    let mut last_id = None;
    let told = loop {
        let (id, ev, data) = slow.next().await;
        if ev.as_deref() == Some("resync") {
            break serde_json::from_str::<Value>(&data).unwrap();
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        got.push(v["sequence"].as_i64().unwrap());
        last_id = id;
        assert!(*got.last().unwrap() < end, "never told to resync");
    };
    assert!(
        told["reason"].as_str().unwrap().contains("Last-Event-ID"),
        "{told}"
    );
    // Reconnecting from the last event received catches up from the store.
    let mut again = Stream::open(&sock, "/api/events", last_id.as_deref()).await;
    while *got.last().unwrap() < end {
        got.push(again.next_seq().await.1);
    }
    assert_eq!(
        got,
        (1..=end).collect::<Vec<_>>(),
        "nothing lost, nothing twice"
    );
    s.env.sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_keep_alives() {
    let limits = brood_server::EventLimits {
        keep_alive: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let s = Served::start_limited(|_| {}, limits).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    let mut idle = Stream::open(&sock, "/api/events", None).await;
    // Nothing happens; comment lines arrive all the same.
    while idle.comments() < 3 {
        idle.fill().await;
    }
    s.env.sup.shutdown().await;
}

/// Issue 28: a failed read is never "no events". The event log cannot be
/// read when the API starts (its table is renamed away under the running
/// supervisor); the hub tries again until it can, and a subscriber that
/// connected meanwhile gets every event, in order, with none missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_comes_back_when_the_event_log_could_not_be_read_at_first() {
    let s = Served::start_hooked(
        |_| {},
        brood_server::EventLimits::default(),
        |env| {
            sql(
                &env.root().join("brood.db"),
                "ALTER TABLE events RENAME TO events_away",
            );
        },
    )
    .await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    // The hub has failed at least once by now (it starts with the API).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // The log is back; a subscriber from its start connects before the
    // hub's next try, so what is appended next may fall between its
    // catch-up and the head the hub then reads.
    sql(
        &s.env.root().join("brood.db"),
        "ALTER TABLE events_away RENAME TO events",
    );
    let mut stream = Stream::open(&sock, "/api/events", None).await;
    quick_agents(&s, &["after1", "after2"]).await;
    let end = s
        .env
        .sup
        .store()
        .last_event_seq(s.env.sup.tenant())
        .unwrap();
    assert!(end > 0);
    let mut got = Vec::new();
    while got.last().is_none_or(|l| *l < end) {
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next_seq())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no event after {got:?} in 30 s: the hub gave up on the event log (head {end})"
                )
            });
        got.push(next.1);
    }
    assert_eq!(
        got,
        (1..=end).collect::<Vec<_>>(),
        "every event once, in order"
    );
}

/// Limits whose hub never looks at the store on its own within a test: an
/// event reaches a subscriber only because its commit (or, on PostgreSQL,
/// the other node's news) rang the store's bell (issue 27 item 4).
fn told_only() -> brood_server::EventLimits {
    brood_server::EventLimits {
        look_every: std::time::Duration::from_secs(3600),
        ..Default::default()
    }
}

/// `rounds` appends of one to three `test.tick` events of `agent`, straight
/// into `store` (no supervisor's loop is told), from the calling thread.
fn append_ticks(
    store: &dyn brood_store::Store,
    tenant: &brood_core::TenantId,
    agent: &str,
    writer: usize,
    rounds: usize,
) {
    let name = brood_core::AgentName::new(agent).unwrap();
    for r in 0..rounds {
        let events: Vec<_> = (0..1 + r % 3)
            .map(|i| brood_store::NewEvent {
                agent: name.clone(),
                run: None,
                session: brood_core::SessionName::default_session(),
                kind: "test.tick".into(),
                payload: serde_json::json!({"writer": writer, "round": r, "i": i}).to_string(),
            })
            .collect();
        store.append_events(tenant, &events, 1).unwrap();
    }
}

/// What a subscriber receives until `end`, each event's sequence, failing
/// when nothing comes for 30 s (the hub was not told of a commit).
async fn seqs_until(st: &mut Stream, end: i64) -> Vec<i64> {
    let mut got = Vec::new();
    while got.last().is_none_or(|l| *l < end) {
        let (_, seq) = tokio::time::timeout(std::time::Duration::from_secs(30), st.next_seq())
            .await
            .unwrap_or_else(|_| panic!("nothing after {:?} in 30 s (head {end})", got.last()));
        got.push(seq);
    }
    got
}

/// Issue 27 item 4: events are pushed at their commit, in order and with no
/// gap, across the seam between a subscriber's catch-up and the live stream.
/// Four threads append straight into the store (so no command of the
/// supervisor's loop tells the hub) while subscribers connect: one before,
/// others in the middle of the writing, from the start of the log or from an
/// event already written; the hub never looks on its own, so everything
/// after a subscriber's catch-up reaches it through the store's bell. Each
/// gets every event after its starting point once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_pushed_at_their_commit_in_order_and_gapless_across_the_seam() {
    let s = Served::start_limited(|_| {}, told_only()).await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["w"]).await;
    let (store, tenant) = (s.env.sup.store().clone(), s.env.sup.tenant().clone());
    let mut early = Stream::open(&sock, "/api/events", None).await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, tenant) = (store.clone(), tenant.clone());
            std::thread::spawn(move || append_ticks(&*store, &tenant, "w", w, 150))
        })
        .collect();
    // Subscribers whose catch-up ends while the writers write.
    let mut late = Vec::new();
    for i in 0..6 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let at = store.last_event_seq(&tenant).unwrap();
        let from = (i % 2 == 0).then(|| format!("{tenant}-{}", at / 2));
        let start = if from.is_some() { at / 2 } else { 0 };
        late.push((
            start,
            Stream::open(&sock, "/api/events", from.as_deref()).await,
        ));
    }
    for w in writers {
        w.join().unwrap();
    }
    let end = store.last_event_seq(&tenant).unwrap();
    assert!(end > 4 * 150, "{end}");
    assert_eq!(
        seqs_until(&mut early, end).await,
        (1..=end).collect::<Vec<_>>(),
        "the first subscriber: every event once, in order"
    );
    for (start, mut st) in late {
        assert_eq!(
            seqs_until(&mut st, end).await,
            (start + 1..=end).collect::<Vec<_>>(),
            "a subscriber from {start}: every event once, in order"
        );
    }
    s.env.sup.shutdown().await;
}

/// Issue 27 item 4 on PostgreSQL: another node's events reach this node's
/// subscribers through its news (`LISTEN/NOTIFY`), interleaved with this
/// node's own, in order and with no gap. The other node is a second store on
/// the same database that announces its writes as a node of its own; this
/// node's hub never looks on its own, so what the other writes arrives only
/// because its news rang this node's bell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_s_events_are_pushed_through_its_news_in_order_and_gapless() {
    let db = brood_store_conformance::pg::Fresh::new();
    let url = db.url.clone();
    let s = Served::start_limited(
        |cfg| {
            cfg.store = Some(url.clone().into());
            cfg.node = Some(brood_runtime::NodeConfig {
                address: "here".into(),
                labels: Default::default(),
                capacity: None,
                expiry: std::time::Duration::from_secs(3600),
            });
        },
        told_only(),
    )
    .await;
    let To::Unix(sock) = s.unix.clone() else {
        unreachable!()
    };
    quick_agents(&s, &["w"]).await;
    let (here, tenant) = (s.env.sup.store().clone(), s.env.sup.tenant().clone());
    let other = brood_store::open(&url).unwrap();
    other
        .hear("the-other-node", std::sync::Arc::new(|_| {}))
        .unwrap();
    let mut early = Stream::open(&sock, "/api/events", None).await;
    let writers: Vec<_> = [other.clone(), other.clone(), here.clone()]
        .into_iter()
        .enumerate()
        .map(|(w, store)| {
            let tenant = tenant.clone();
            std::thread::spawn(move || append_ticks(&*store, &tenant, "w", w, 60))
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let at = here.last_event_seq(&tenant).unwrap();
    let mut late = Stream::open(&sock, "/api/events", Some(&format!("{tenant}-{at}"))).await;
    for w in writers {
        w.join().unwrap();
    }
    // The last word is the other node's, so the end arrives only as news.
    append_ticks(&*other, &tenant, "w", 9, 1);
    let end = here.last_event_seq(&tenant).unwrap();
    assert_eq!(
        seqs_until(&mut early, end).await,
        (1..=end).collect::<Vec<_>>(),
        "every event of both nodes once, in order"
    );
    assert_eq!(
        seqs_until(&mut late, end).await,
        (at + 1..=end).collect::<Vec<_>>(),
        "a subscriber from {at}: every event once, in order"
    );
    s.env.sup.shutdown().await;
}

/// Issue 27 item 4 with real `brood serve` nodes on one PostgreSQL: agents
/// created and ended through both nodes, one subscriber on node 1 from the
/// start of the log and one that joins in the middle from an event already
/// sent; both get every event of both nodes once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_events_reach_a_subscriber_of_either_in_order_and_gapless() {
    use common::cluster::Nodes;
    let nodes = Nodes::start_with(2, &["--sweep-every", "600", "--node-expiry", "3600"]);
    let sock1 = nodes.roots[1].join("brood.sock");
    let mut early = Stream::open(&sock1, "/api/events", None).await;
    let spawn_round = |round: usize| {
        let roots = nodes.roots.clone();
        tokio::task::spawn_blocking(move || {
            let names: Vec<String> = (0..6).map(|i| format!("r{round}n{i}")).collect();
            for (i, n) in names.iter().enumerate() {
                let sock = roots[i % 2].join("brood.sock");
                let body = serde_json::json!({"name": n, "argv": common::agent(&["--result", n])});
                let (s, v) = common::http(&sock, "POST", "/api/agents", Some(&body));
                assert_eq!(s, 201, "{n}: {v}");
            }
            for (i, n) in names.iter().enumerate() {
                let sock = roots[(i + 1) % 2].join("brood.sock");
                let body = serde_json::json!({"timeout_s": 30});
                let (s, v) =
                    common::http(&sock, "POST", &format!("/api/agents/{n}/wait"), Some(&body));
                assert_eq!(
                    (s, &v["agents"][0]["status"]),
                    (200, &Value::from("completed")),
                    "{n}: {v}"
                );
            }
        })
    };
    spawn_round(0).await.unwrap();
    let store = brood_store::open(&nodes.store).unwrap();
    // SAFETY: geteuid cannot fail; the nodes run as this test's user.
    let tenant = brood_core::TenantId::for_uid(unsafe { libc::geteuid() });
    let at = store.last_event_seq(&tenant).unwrap();
    let mut late = Stream::open(&sock1, "/api/events", Some(&format!("{tenant}-{at}"))).await;
    spawn_round(1).await.unwrap();
    let end = store.last_event_seq(&tenant).unwrap();
    // Each agent's start, result and stop at least, on both sides of the join.
    assert!(at >= 18 && end - at >= 18, "{at} {end}");
    assert_eq!(
        seqs_until(&mut early, end).await,
        (1..=end).collect::<Vec<_>>(),
        "from the start: every event of both nodes once, in order"
    );
    assert_eq!(
        seqs_until(&mut late, end).await,
        (at + 1..=end).collect::<Vec<_>>(),
        "from {at}: every event once, in order"
    );
}
