//! A slow store (issue 27 items 2 and 7): a node on PostgreSQL behind a
//! network that adds latency to every round trip. A user's root is recorded
//! by the store's admission writer off the loop, so while it is in flight
//! the node answers, and a verb naming the root is told to ask again (`409
//! Conflict` with `Retry-After`) rather than act on a record the loop has
//! not taken up. Afterwards every root runs once, with one `agent.spawn`
//! each, nothing was ended for it by the sweepers, and the cancel asked
//! again ends it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::proxied_node;
use common::*;
use serde_json::json;

/// Each round trip's added delay: an admission takes a dozen or more, so it
/// is in flight for seconds, several times what the loop takes to decide
/// the creations (one read of the tenant's quotas) and reach the cancel.
const LATENCY: Duration = Duration::from_millis(400);

#[test]
fn a_root_in_flight_is_asked_about_again_and_ended_by_nothing_else() {
    // A slow tick, so the loop's own reads do not stand between the
    // creations and the cancel.
    let p = proxied_node(&["--sweep-every", "5"]);
    let (proxy, sock) = (&p.proxy, p.sock.clone());

    proxy.set_latency(LATENCY);
    let names = ["slow-0", "slow-1", "slow-2", "slow-3"];
    let started = Instant::now();
    let posts: Vec<_> = names
        .iter()
        .map(|n| {
            let sock = sock.clone();
            let body = json!({"name": n, "argv": agent(&["--hang"])});
            std::thread::spawn(move || http(&sock, "POST", "/api/agents", Some(&body)))
        })
        .collect();
    // The creations reach the loop first; then a cancel of one of them.
    std::thread::sleep(Duration::from_millis(200));
    let (s, head, body) = http_full(&sock, "POST", "/api/agents/slow-0/cancel", None);
    let asked_at = started.elapsed();
    // The node answers meanwhile without waiting for the store.
    let (hs, health) = http(&sock, "GET", "/healthz", None);
    proxy.set_latency(Duration::ZERO);
    let created: Vec<(u16, serde_json::Value)> =
        posts.into_iter().map(|h| h.join().unwrap()).collect();
    let admitted_at = started.elapsed();

    assert_eq!(hs, 200, "{health}");
    assert_eq!(
        s, 409,
        "a cancel of a root in flight (asked at {asked_at:?}, admitted by {admitted_at:?}): {head}\n{body}"
    );
    assert_eq!(body["error"]["code"], "Conflict", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("slow-0") && m.contains("being admitted")),
        "{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    for ((s, v), n) in created.iter().zip(names) {
        assert_eq!(*s, 201, "{n}: {v}");
    }
    // None of the roots was ended for having no process while its
    // admission was in flight, nor since.
    for n in names {
        let (s, v) = http(&sock, "GET", &format!("/api/agents/{n}"), None);
        assert_eq!(
            (s, v["status"].as_str()),
            (200, Some("running")),
            "{n}: {v}"
        );
        let (s, ev) = http(
            &sock,
            "GET",
            &format!("/api/events?agent={n}&follow=false"),
            None,
        );
        assert_eq!(s, 200, "{ev}");
        let text = ev.as_str().unwrap_or_default();
        assert_eq!(
            text.matches("data: {\"type\":\"agent.spawn\"").count(),
            1,
            "{n} admitted once: {text}"
        );
    }
    // Asked again, the cancel ends it.
    let (s, v) = http(&sock, "POST", "/api/agents/slow-0/cancel", None);
    assert_eq!(s, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(20), || {
            let (_, v) = http(&sock, "GET", "/api/agents/slow-0", None);
            v["status"] == "cancelled"
        }),
        "the cancel asked again did not end slow-0"
    );
    drop(p);
}

/// The clock does not bury a slow loop in ticks: with every round trip
/// slowed, a tick takes longer than the clock's period, and ticks that
/// queued up for as long as the store was slow would keep every command
/// behind them (a creation stayed `queued` for minutes). One tick is queued
/// at a time, so creations go through.
#[test]
fn a_slow_store_does_not_bury_the_loop_in_ticks() {
    let p = proxied_node(&[]);
    let (proxy, sock) = (&p.proxy, p.sock.clone());
    proxy.set_latency(Duration::from_millis(150));
    // Long enough for ticks to pile up at 0.1 s each.
    std::thread::sleep(Duration::from_secs(3));
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        let body = json!({"name": "through", "argv": agent(&["--hang"])});
        let _ = tx.send(http(&s2, "POST", "/api/agents", Some(&body)));
    });
    let created = rx.recv_timeout(Duration::from_secs(120));
    proxy.set_latency(Duration::ZERO);
    let (s, v) = created.expect("a creation on a slow store was never answered");
    assert_eq!(s, 201, "{v}");
    let (s, v) = http(&sock, "GET", "/api/agents/through", None);
    assert_eq!((s, v["status"].as_str()), (200, Some("running")), "{v}");
    drop(p);
}

/// Issue 28's campaign, round 15: a node started again behind a slow store
/// took 48 s to recover and rebuild its ctx tree, and answered nothing
/// meanwhile, `/healthz` included. Its listeners now serve from the moment
/// they are bound: `/healthz` says at once that the node is starting (503,
/// `Unavailable`, `Retry-After`), and a request made meanwhile waits for the
/// start and is then served as usual.
#[test]
fn a_node_starting_behind_a_slow_store_says_so_and_serves_what_waited() {
    let mut p = proxied_node(&[]);
    // A tree to rebuild: twelve agents that ended with a result.
    for i in 0..12 {
        let (s, v) = http(
            &p.sock,
            "POST",
            "/api/agents",
            Some(&json!({"name": format!("done-{i}"), "argv": agent(&["--result", "kept"])})),
        );
        assert_eq!(s, 201, "{v}");
    }
    let (s, v) = http(
        &p.sock,
        "POST",
        "/api/agents/done-11/wait",
        Some(&json!({"timeout_s": 30})),
    );
    assert_eq!(s, 200, "{v}");

    // Every round trip of the start (its recovery reads, the rebuild's)
    // now takes 0.6 s.
    p.proxy.set_latency(Duration::from_millis(300));
    p.restart(&[]);
    let (s, head, body) = http_full(&p.sock, "GET", "/healthz", None);
    // Asked while it starts: a creation waits for the start.
    let sock = p.sock.clone();
    let creation = std::thread::spawn(move || {
        http(
            &sock,
            "POST",
            "/api/agents",
            Some(&json!({"name": "after", "argv": agent(&["--result", "late"])})),
        )
    });
    assert_eq!(s, 503, "healthz while the node starts: {head}\n{body}");
    assert_eq!(body["error"]["code"], "Unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("starting")),
        "{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    let up = eventually(Duration::from_secs(120), || {
        http(&p.sock, "GET", "/healthz", None).0 == 200
    });
    assert!(up, "the node never finished its start");
    p.proxy.set_latency(Duration::ZERO);
    let (s, v) = creation.join().unwrap();
    assert_eq!(s, 201, "a creation made while the node started: {v}");
    // The tree was rebuilt, and the one made meanwhile is there too.
    let (s, v) = http(
        &p.sock,
        "POST",
        "/api/agents/after/wait",
        Some(&json!({"timeout_s": 30})),
    );
    assert_eq!(s, 200, "{v}");
    for n in ["done-0", "done-11", "after"] {
        let (s, v) = http(&p.sock, "GET", &format!("/api/agents/{n}"), None);
        assert_eq!(s, 200, "{n}: {v}");
        assert_eq!(v["status"], "completed", "{n}: {v}");
    }
    let dir = p.root.join("ctx/agent/done-0.d");
    assert!(dir.is_dir(), "the rebuilt tree has no {}", dir.display());
}
