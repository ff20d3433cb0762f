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
