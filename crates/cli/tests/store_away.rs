//! While the store is away (issue 27 items 2 and 5): a node on PostgreSQL
//! behind a network that goes silent keeps answering its operator. Its
//! dispatcher is stuck in a store call (the sweepers read the store every
//! tick) until the call's deadline; the control socket still identifies the
//! operator without it, so `/healthz` answers at once and, once the store's
//! probe finds it silent, says the node is `degraded`, before the stuck call
//! has even failed (the node logs that failure when it comes). Once the
//! network is back, the node works as before and its health is `ok`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::cluster::proxied_node;
use common::*;
use serde_json::json;

/// The error a store call behind the silent network ends with
/// (`StoreError::PostgresDeadline`), in the node's log.
const DEADLINE: &str = "no answer within";

/// Creates a root that runs until cancelled, while the store answers.
fn hanging(sock: &std::path::Path, name: &str) {
    let (s, v) = http(
        sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": name, "argv": agent(&["--hang"])})),
    );
    assert_eq!(s, 201, "{v}");
}

#[test]
fn healthz_answers_while_the_loop_waits_on_a_silent_store() {
    let p = proxied_node(&[]);
    let (proxy, root, sock) = (&p.proxy, p.root.clone(), p.sock.clone());
    let log = root.with_extension("log");
    hanging(&sock, "before");

    proxy.go_silent(true);
    // The sweepers tick every 0.1 s: the dispatcher is in a store call that
    // will not come back before its deadline.
    std::thread::sleep(Duration::from_millis(500));
    // On a thread, so that a healthz that waits for the loop fails this test
    // (after a minute) rather than hanging the suite. It is asked until it
    // says the store is away (its probe reads once a second).
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        loop {
            let (s, v) = http(&s2, "GET", "/healthz", None);
            let done = s != 200 || v["status"] == "degraded";
            let _ = tx.send((s, v));
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut health = rx.recv_timeout(Duration::from_secs(60));
    while let Ok((200, v)) = &health
        && v["status"] == "ok"
    {
        health = rx.recv_timeout(Duration::from_secs(60));
    }
    // New work waits a bounded time, then is refused with when to ask again,
    // instead of queueing behind the stuck dispatcher.
    let (tx2, rx2) = std::sync::mpsc::channel();
    let s3 = sock.clone();
    std::thread::spawn(move || {
        let _ = tx2.send(http_full(
            &s3,
            "POST",
            "/api/agents",
            Some(&json!({"name": "during", "argv": agent(&["--hang"])})),
        ));
    });
    // Reads that must ask the store (a job, the nodes) are refused the same
    // way: the store is away, not broken (the chaos campaign saw
    // `GET /api/jobs/…` answer 500 while PostgreSQL restarted).
    let (tx3, rx3) = std::sync::mpsc::channel();
    let s4 = sock.clone();
    std::thread::spawn(move || {
        for path in ["/api/jobs/j-absent", "/api/jobs", "/api/nodes"] {
            let _ = tx3.send((path, http_full(&s4, "GET", path, None)));
        }
    });
    let refused = rx2.recv_timeout(Duration::from_secs(60));
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    // The stuck call does fail, at its deadline, and says so.
    let failed = eventually(Duration::from_secs(60), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(DEADLINE)
    });
    // The reads wait for the store's deadlines (each its own): collected
    // after the log was looked at, which they would fill.
    let reads: Vec<_> = (0..3)
        .map(|_| rx3.recv_timeout(Duration::from_secs(90)))
        .collect();
    // The network back before anything is asserted: a node whose store is
    // away does not stop (its shutdown records the ends), and the test's
    // end waits for it to stop.
    proxy.go_silent(false);
    let (status, health) = health.expect("/healthz never answered while the store was away");
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "degraded", "{health}");
    let (status, head, body) =
        refused.expect("a creation while the store was away was never answered");
    assert_eq!(status, 503, "{head}\n{body}");
    assert_eq!(body["error"]["code"], "Unavailable", "{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    for read in reads {
        let (path, (status, head, body)) =
            read.expect("a read while the store was away was never answered");
        assert_eq!(status, 503, "GET {path}: {head}\n{body}");
        assert_eq!(body["error"]["code"], "Unavailable", "GET {path}: {body}");
        assert!(
            head.to_ascii_lowercase().contains("retry-after: 1"),
            "GET {path}: {head}"
        );
    }
    assert!(
        health["store"]
            .as_str()
            .is_some_and(|s| s.contains("has not answered")),
        "{health}"
    );
    assert!(
        !logged.contains(DEADLINE),
        "/healthz waited for the dispatcher's store call to fail: {logged}"
    );
    assert!(failed, "the dispatcher's store call had no deadline");

    // The network is back: the node works as before.
    assert!(
        eventually(Duration::from_secs(60), || {
            let (s, _) = http(
                &sock,
                "POST",
                "/api/agents",
                Some(&json!({"name": "after", "argv": agent(&["--hang"])})),
            );
            s == 201
        }),
        "the node never worked again once the store was back"
    );
    let (s, v) = http(&sock, "GET", "/api/agents/before", None);
    assert_eq!((s, v["status"].as_str()), (200, Some("running")), "{v}");
    // And its health says so again.
    assert!(
        eventually(Duration::from_secs(10), || {
            let (_, h) = http(&sock, "GET", "/healthz", None);
            h["status"] == "ok" && h["store"] == "ok"
        }),
        "/healthz still says degraded once the store is back"
    );
    drop(p);
}

/// A caller cannot stall the daemon by asking reads of a store that does
/// not answer (the child is hostile, and so is the caller). The read
/// handlers wait on the store's blocking facade; the daemon has two worker
/// threads, so two such reads used to hold every request behind them,
/// `/healthz` included, until the store's deadline. Here eight reads wait
/// on the silent store at once, and `/healthz` answers while all eight
/// still wait.
#[test]
fn reads_waiting_on_a_silent_store_do_not_stall_the_daemon() {
    let p = proxied_node(&[]);
    let (proxy, sock) = (&p.proxy, p.sock.clone());
    hanging(&sock, "before");
    proxy.go_silent(true);
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..8 {
        let (tx, sock) = (tx.clone(), sock.clone());
        std::thread::spawn(move || {
            let _ = tx.send(http(&sock, "GET", "/api/agents/before", None).0);
        });
    }
    // Every read is in (the store's deadline is 20 s; none can be back).
    std::thread::sleep(Duration::from_millis(500));
    let (htx, hrx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || {
        let _ = htx.send(http(&s2, "GET", "/healthz", None));
    });
    let health = hrx.recv_timeout(Duration::from_secs(60));
    // What the reads had answered by the time /healthz did.
    let answered_before: Vec<u16> = rx.try_iter().collect();
    // The network back before anything is asserted, so that the node's
    // end (its records) does not wait on a silent store.
    proxy.go_silent(false);
    let reads: Vec<u16> = (0..8 - answered_before.len())
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(90))
                .expect("a read never answered")
        })
        .collect();
    let (status, health) = health.expect("/healthz never answered while reads waited on the store");
    assert_eq!(status, 200, "{health}");
    assert!(
        answered_before.is_empty(),
        "/healthz answered only once reads waiting on the store had: {answered_before:?}"
    );
    // Each read ends with the record or with the store away, never 500.
    assert!(
        reads.iter().all(|s| *s == 200 || *s == 503),
        "reads answered {reads:?}"
    );
    drop(p);
}

/// Issue 28 (the fault campaign, seed 1795917433201104186): a stop whose
/// target's record cannot be read when its processes are gone (the store
/// refusing connections) records nothing then, but holds nothing either:
/// the node lets go of the agent, and once the store is back the record,
/// still `stopping`, is ended with the stop's outcome. Before, the stop
/// skipped the target and its live entry stayed marked by a stop that was
/// over: the record said `stopping` for ever and the node's shutdown
/// waited for it.
#[test]
fn a_stop_that_cannot_read_its_target_lets_go_and_its_end_is_recorded_later() {
    let p = proxied_node(&[]);
    let (proxy, sock) = (&p.proxy, p.sock.clone());
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "stubborn", "argv": agent(&["--hang", "--ignore-sigterm"])})),
    );
    assert_eq!(s, 201, "{v}");
    let (_, a) = http(&sock, "GET", "/api/agents/stubborn", None);
    let pid = a["pid"].as_i64().expect("a running agent's pid") as i32;
    // The stop's intent is recorded; the agent ignores SIGTERM, so its
    // group is emptied only after the grace (3 s), by SIGKILL.
    let (s, v) = http(&sock, "POST", "/api/agents/stubborn/cancel", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "stopping/cancelled:user", "{v}");
    proxy.refuse(true);
    proxy.drop_connections();
    let gone = eventually(Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(gone, "the stopped agent's process {pid} survived its stop");
    // The stop records what it can while the store refuses: nothing.
    std::thread::sleep(Duration::from_secs(2));
    proxy.refuse(false);
    let mut last = json!(null);
    let ended = eventually(Duration::from_secs(60), || {
        let (s, a) = http(&sock, "GET", "/api/agents/stubborn", None);
        last = a;
        s == 200 && last["state"] == "cancelled:user"
    });
    assert!(ended, "the stopped agent's end was never recorded: {last}");
    drop(p);
}
