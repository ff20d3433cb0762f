//! The slot counters (SPEC 9) against their real backends: the embedded map, and a
//! real Redis — the one on 127.0.0.1:6379 when it answers PING, otherwise a
//! `redis-server` this test starts on a free port and stops when its last test
//! ends. No Redis at all is a failure, not a skip: the Redis counter is only
//! tested against the real thing.
//!
//! Every test uses its own tenant (so its own key) and deletes the key at the end,
//! so the tests run in parallel against one server, and leave a shared one clean.
//! `BROOD_TEST_REDIS_SPAWN=1` skips the 6379 probe, to exercise the fallback.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use brood_core::TenantId;
use brood_runtime::slots::{self, Embedded, Redis, SlotError, Slots};

// ---------------------------------------------------------------------------
// A real Redis
// ---------------------------------------------------------------------------

#[path = "support/redis.rs"]
mod redis_support;
use redis_support::{Server, free_port, raw, server, spawn_server_on};

/// A tenant of its own for one test, whose Redis key is deleted when it is
/// dropped, passing or failing.
struct Tenant {
    id: TenantId,
    server: Option<Arc<Server>>,
}

impl Tenant {
    fn new(test: &str, server: Option<&Arc<Server>>) -> Tenant {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = TenantId::new(&format!("t-{test}-{}-{n}", std::process::id())).unwrap();
        let tenant = Tenant {
            id,
            server: server.cloned(),
        };
        tenant.delete();
        // Its counts kept from the start, as once a supervisor has seeded
        // them (a Redis that lost them is `redis_restarted_empty_…`'s).
        if let Some(s) = &tenant.server {
            raw(s.addr, &["SET", &Redis::seeded_key(&tenant.id), "1"]);
        }
        tenant
    }
    fn key(&self) -> String {
        Redis::key(&self.id)
    }
    fn delete(&self) {
        if let Some(s) = &self.server {
            raw(s.addr, &["DEL", &self.key(), &Redis::seeded_key(&self.id)]);
        }
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.delete();
    }
}

fn redis(server: &Server) -> Arc<dyn Slots> {
    redis_as(server, "s-test")
}

/// The counter of the supervisor `holder`.
fn redis_as(server: &Server, holder: &str) -> Arc<dyn Slots> {
    slots::open(Some(&server.url()), holder).unwrap()
}

// ---------------------------------------------------------------------------
// One behaviour, both counters
// ---------------------------------------------------------------------------

/// Acquire up to max then refused; release frees; never below 0; tenants apart.
fn behaviour(slots: &dyn Slots, t: &TenantId, other: &TenantId) {
    assert_eq!(slots.count(t).unwrap(), 0);
    for i in 1..=3 {
        assert!(slots.acquire(t, 3).unwrap(), "slot {i} of 3");
        assert_eq!(slots.count(t).unwrap(), i);
    }
    assert!(!slots.acquire(t, 3).unwrap(), "a 4th slot with max 3");
    assert_eq!(slots.count(t).unwrap(), 3, "a refusal takes nothing");
    // Another tenant has its own count.
    assert!(slots.acquire(other, 1).unwrap());
    assert!(!slots.acquire(other, 1).unwrap());
    assert_eq!(slots.count(t).unwrap(), 3);

    slots.release(t).unwrap();
    assert_eq!(slots.count(t).unwrap(), 2);
    assert!(
        slots.acquire(t, 3).unwrap(),
        "a released slot is free again"
    );
    assert!(!slots.acquire(t, 3).unwrap());
    // A lowered max refuses at once; a raised one admits.
    assert!(!slots.acquire(t, 2).unwrap());
    assert!(slots.acquire(t, 4).unwrap());
    assert_eq!(slots.count(t).unwrap(), 4);

    for _ in 0..4 {
        slots.release(t).unwrap();
    }
    assert_eq!(slots.count(t).unwrap(), 0);
    slots.release(t).unwrap();
    slots.release(t).unwrap();
    assert_eq!(slots.count(t).unwrap(), 0, "release never goes below 0");
    assert!(
        slots.acquire(t, 1).unwrap(),
        "and the next acquire counts from 0"
    );
    assert!(!slots.acquire(t, 1).unwrap());
    assert!(!slots.acquire(other, 0).unwrap(), "max 0 admits nobody");
    slots.release(other).unwrap();
    assert!(!slots.acquire(other, 0).unwrap(), "max 0 admits nobody");
    assert_eq!(slots.count(other).unwrap(), 0);
}

/// 100 threads race for 8 slots: exactly 8 win. `counter(i)` gives thread i its
/// counter (the same one, or one per thread: several supervisors).
fn contend(t: &TenantId, counter: impl Fn(usize) -> Arc<dyn Slots>) {
    let barrier = Arc::new(Barrier::new(100));
    let threads: Vec<_> = (0..100)
        .map(|i| {
            let slots = counter(i);
            let (t, barrier) = (t.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                slots.acquire(&t, 8).unwrap()
            })
        })
        .collect();
    let won = threads
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|&won| won)
        .count();
    assert_eq!(won, 8);
    assert_eq!(counter(0).count(t).unwrap(), 8);
}

/// A counter knocked out of true (`knock` makes it 50) is set right by repair,
/// which reports the drift.
fn drift(slots: &dyn Slots, t: &TenantId, knock: &dyn Fn()) {
    assert_eq!(
        slots.repair(t, 0).unwrap(),
        0,
        "nothing held, nothing counted"
    );
    assert!(slots.acquire(t, 10).unwrap());
    assert!(slots.acquire(t, 10).unwrap());
    assert_eq!(
        slots.repair(t, 2).unwrap(),
        0,
        "a true counter has no drift"
    );
    knock();
    assert_eq!(slots.count(t).unwrap(), 50);
    assert!(
        !slots.acquire(t, 10).unwrap(),
        "the drifted counter refuses"
    );
    assert_eq!(slots.repair(t, 3).unwrap(), 47, "drift = 50 - 3");
    assert_eq!(slots.count(t).unwrap(), 3);
    assert!(slots.acquire(t, 4).unwrap(), "repaired, it admits again");
    assert_eq!(
        slots.repair(t, 6).unwrap(),
        -2,
        "under-counting is negative drift"
    );
    assert_eq!(slots.count(t).unwrap(), 6);
    assert_eq!(slots.repair(t, 0).unwrap(), 6);
    assert_eq!(slots.count(t).unwrap(), 0);
}

// ---------------------------------------------------------------------------
// Embedded
// ---------------------------------------------------------------------------

#[test]
fn embedded_behaviour() {
    let slots = slots::open(None, "s-test").unwrap();
    assert!(slots.describe().contains("embedded"));
    behaviour(
        slots.as_ref(),
        &Tenant::new("eb", None).id,
        &Tenant::new("eb2", None).id,
    );
}

#[test]
fn embedded_hundred_threads_eight_slots() {
    let slots = slots::open(None, "s-test").unwrap();
    contend(&Tenant::new("ec", None).id, |_| slots.clone());
}

#[test]
fn embedded_repair() {
    let slots = Embedded::new();
    let t = Tenant::new("er", None);
    drift(&slots, &t.id, &|| {
        while slots.count(&t.id).unwrap() < 50 {
            assert!(slots.acquire(&t.id, 100).unwrap());
        }
    });
}

// ---------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------

#[test]
fn redis_behaviour() {
    let server = server();
    let slots = redis(&server);
    assert_eq!(slots.describe(), format!("redis at {}", server.url()));
    let (t, other) = (
        Tenant::new("rb", Some(&server)),
        Tenant::new("rb2", Some(&server)),
    );
    behaviour(slots.as_ref(), &t.id, &other.id);
    // Only tenants holding slots have a key: refusals and the last release leave
    // none behind.
    let exists = |t: &Tenant| raw(server.addr, &["EXISTS", &t.key()]);
    assert_eq!(exists(&other), ":0", "max-0 refusals leave no key");
    assert_eq!(exists(&t), ":1");
    slots.release(&t.id).unwrap();
    assert_eq!(exists(&t), ":0", "the last release deletes the key");
    assert_eq!(slots.count(&t.id).unwrap(), 0);
    slots.release(&t.id).unwrap();
    assert_eq!(
        raw(server.addr, &["EXISTS", &t.key()]),
        ":0",
        "a release of nothing writes nothing"
    );
}

#[test]
fn redis_hundred_threads_eight_slots() {
    let server = server();
    let slots = redis(&server);
    contend(&Tenant::new("rc", Some(&server)).id, |_| slots.clone());
}

/// Several supervisors: each thread its own connection and share, so the
/// atomicity comes from the server-side script, not from the client's mutex.
#[test]
fn redis_hundred_connections_eight_slots() {
    let server = server();
    let t = Tenant::new("rcc", Some(&server));
    contend(&t.id, |i| redis_as(&server, &format!("s-{i}")));
}

#[test]
fn redis_repair() {
    let server = server();
    let slots = redis(&server);
    let t = Tenant::new("rr", Some(&server));
    drift(slots.as_ref(), &t.id, &|| {
        assert_eq!(raw(server.addr, &["HSET", &t.key(), "s-test", "50"]), ":0");
    });
    assert_eq!(
        raw(server.addr, &["EXISTS", &t.key()]),
        ":0",
        "repair to 0 deletes the key"
    );
    // A key holding garbage (or the one count of an older brood): calls fail
    // naming the command and the URL; repair drops it and writes its share.
    raw(server.addr, &["SET", &t.key(), "garbage"]);
    for err in [
        slots.acquire(&t.id, 5).unwrap_err(),
        slots.release(&t.id).unwrap_err(),
        slots.count(&t.id).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(msg.contains(&server.url()), "{msg}");
        assert!(msg.contains("EVAL") || msg.contains("GET"), "{msg}");
    }
    assert_eq!(slots.repair(&t.id, 1).unwrap(), -1);
    assert_eq!(slots.count(&t.id).unwrap(), 1);
}

/// Each supervisor holds a share; the count is their sum. A supervisor's
/// repair sets its own share only, whatever the others hold (a start another
/// one has in flight is never repaired away), and the shares of supervisors
/// that are gone are given back, the caller's own never.
#[test]
fn redis_shares_are_repaired_by_their_holder_and_given_back_when_it_is_gone() {
    let server = server();
    let t = Tenant::new("rs", Some(&server));
    let (a, b, c) = (
        redis_as(&server, "s-a"),
        redis_as(&server, "s-b"),
        redis_as(&server, "s-c"),
    );
    for _ in 0..2 {
        assert!(a.acquire(&t.id, 6).unwrap());
    }
    for _ in 0..3 {
        assert!(b.acquire(&t.id, 6).unwrap());
    }
    assert!(c.acquire(&t.id, 6).unwrap());
    assert_eq!(a.count(&t.id).unwrap(), 6);
    assert!(!c.acquire(&t.id, 6).unwrap(), "six held among three");
    // a repairs its share to what it holds: b's and c's are untouched.
    assert_eq!(a.repair(&t.id, 1).unwrap(), 1);
    assert_eq!(b.count(&t.id).unwrap(), 5);
    // b's own release takes from b's share only.
    b.release(&t.id).unwrap();
    assert_eq!(raw(server.addr, &["HGET", &t.key(), "s-b"]), "2");
    // c is gone: a gives its share back; b is alive, a is the caller.
    let freed = a.forget_holders(&t.id, &|h| h == "s-b").unwrap();
    assert_eq!(freed, 1);
    assert_eq!(a.count(&t.id).unwrap(), 3);
    assert_eq!(raw(server.addr, &["HEXISTS", &t.key(), "s-a"]), ":1");
    assert_eq!(a.forget_holders(&t.id, &|_| true).unwrap(), 0);
    // The embedded counter has no other holders.
    assert_eq!(
        Embedded::new().forget_holders(&t.id, &|_| false).unwrap(),
        0
    );
}

/// Issue 28's campaign: Redis restarted empty while node a, holding 4 of
/// the tenant's 6 slots, was stopped and could not write its share; node b
/// then took 3 where 2 were free. A counter that lost its counts now says
/// so instead of counting none held, and the supervisor that hears it seeds
/// it again: its own share exact, the others' from the store's records
/// (never over a share its holder wrote meanwhile). Then the limit holds.
#[test]
fn redis_restarted_empty_says_its_counts_are_lost_until_seeded_again() {
    let server = server();
    let t = Tenant::new("rl", Some(&server));
    let (a, b, c) = (
        redis_as(&server, "s-a"),
        redis_as(&server, "s-b"),
        redis_as(&server, "s-c"),
    );
    for _ in 0..4 {
        assert!(a.acquire(&t.id, 6).unwrap());
    }
    assert!(b.acquire(&t.id, 6).unwrap());
    // What a restart without persistence leaves: nothing of the tenant's.
    t.delete();
    let lost = b.acquire(&t.id, 6).unwrap_err();
    assert!(matches!(lost, SlotError::Lost { .. }), "{lost:?}");
    assert!(lost.to_string().contains(&server.url()), "{lost}");
    assert!(matches!(
        b.acquire_up_to(&t.id, 6, 3).unwrap_err(),
        SlotError::Lost { .. }
    ));
    // c wrote its share meanwhile (its reconciler): the seed keeps it.
    assert_eq!(c.repair(&t.id, 0).unwrap(), 0);
    c.repair(&t.id, 1).unwrap();
    b.reseed(
        &t.id,
        1,
        &[
            ("s-a".into(), 4),
            ("s-c".into(), 7),
            ("s-b".into(), 9),
            ("s-gone".into(), 0),
        ],
    )
    .unwrap();
    assert_eq!(raw(server.addr, &["HGET", &t.key(), "s-a"]), "4");
    assert_eq!(
        raw(server.addr, &["HGET", &t.key(), "s-b"]),
        "1",
        "its own word, not the list's"
    );
    assert_eq!(
        raw(server.addr, &["HGET", &t.key(), "s-c"]),
        "1",
        "c's own word kept"
    );
    assert_eq!(raw(server.addr, &["HEXISTS", &t.key(), "s-gone"]), ":0");
    assert_eq!(b.count(&t.id).unwrap(), 6);
    assert!(
        !b.acquire(&t.id, 6).unwrap(),
        "six held: a's four count again"
    );
    assert!(b.acquire(&t.id, 7).unwrap());
    let ttl: i64 = raw(server.addr, &["TTL", &t.key()])[1..].parse().unwrap();
    assert!(ttl > 0, "the seeded shares expire as any: {ttl}");
    // Seeded once is enough: another node's acquire goes straight on.
    assert!(!a.acquire(&t.id, 7).unwrap());
    // The embedded counter never loses its counts.
    let e = Embedded::new();
    e.reseed(&t.id, 3, &[("s-a".into(), 4)]).unwrap();
    assert_eq!(e.count(&t.id).unwrap(), 0);
}

#[test]
fn redis_writes_refresh_the_expiry() {
    let server = server();
    let slots = redis(&server);
    let t = Tenant::new("rt", Some(&server));
    let ttl = || -> i64 { raw(server.addr, &["TTL", &t.key()])[1..].parse().unwrap() };
    let persist = || assert_eq!(raw(server.addr, &["PERSIST", &t.key()]), ":1");
    let default = slots::DEFAULT_TTL.as_secs() as i64;
    assert_eq!(default, 3 * slots::RECONCILE_PERIOD.as_secs() as i64);

    assert!(slots.acquire(&t.id, 2).unwrap());
    assert!(
        (default - 5..=default).contains(&ttl()),
        "after acquire: {}",
        ttl()
    );
    assert!(slots.acquire(&t.id, 2).unwrap());
    persist();
    assert!(!slots.acquire(&t.id, 2).unwrap());
    assert!(
        (1..=default).contains(&ttl()),
        "after a refused acquire: {}",
        ttl()
    );
    persist();
    slots.release(&t.id).unwrap();
    assert!((1..=default).contains(&ttl()), "after release: {}", ttl());
    persist();
    slots.repair(&t.id, 4).unwrap();
    assert!((1..=default).contains(&ttl()), "after repair: {}", ttl());

    // A shorter expiry is honoured, and an expired counter is simply 0.
    let short = Redis::connect(&server.url(), "s-test")
        .unwrap()
        .with_ttl(Duration::from_secs(1));
    assert!(short.acquire(&t.id, 10).unwrap());
    assert!((0..=1).contains(&ttl()), "with a 1 s expiry: {}", ttl());
    let deadline = Instant::now() + Duration::from_secs(5);
    while short.count(&t.id).unwrap() != 0 {
        assert!(Instant::now() < deadline, "the counter never expired");
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn redis_bad_urls_and_dead_servers_are_clear_errors() {
    fn err(url: &str) -> String {
        match slots::open(Some(url), "s-test") {
            Ok(s) => panic!("{url} opened as {}", s.describe()),
            Err(e) => e.to_string(),
        }
    }
    let msg = err("memcached://127.0.0.1:11211");
    assert!(
        msg.contains("memcached://127.0.0.1:11211") && msg.contains("redis://"),
        "{msg}"
    );
    let msg = err("redis://");
    assert!(msg.contains("no host"), "{msg}");

    // Nothing listening: refused at once.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("redis://{closed}");
    let msg = err(&url);
    assert!(
        msg.contains(&url) && msg.contains("PING") && msg.contains("connect"),
        "{msg}"
    );

    // Something listening that never answers: the timeout, not a hang.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let msg = err(&url);
    assert!(
        msg.contains(&url) && msg.contains("PING") && msg.contains("timeout"),
        "{msg}"
    );

    // Something that is not Redis.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", http.local_addr().unwrap());
    let answer = thread::spawn(move || {
        let (mut s, _) = http.accept().unwrap();
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        thread::sleep(Duration::from_millis(200));
    });
    let msg = err(&url);
    assert!(
        msg.contains(&url) && msg.contains("not a RESP reply"),
        "{msg}"
    );
    answer.join().unwrap();

    // A database that does not exist.
    let server = server();
    let url = format!("{}/100000", server.url());
    let msg = err(&url);
    assert!(msg.contains(&url) && msg.contains("SELECT"), "{msg}");
    // One that does.
    let t = Tenant::new("rdb", None);
    let db1 = slots::open(Some(&format!("{}/1", server.url())), "s-test").unwrap();
    // A counter never used there says so first; seeded, it counts.
    assert!(matches!(db1.acquire(&t.id, 1), Err(SlotError::Lost { .. })));
    db1.reseed(&t.id, 0, &[]).unwrap();
    assert!(db1.acquire(&t.id, 1).unwrap());
    assert_eq!(
        raw(server.addr, &["EXISTS", &t.key()]),
        ":0",
        "written to db 1, not 0"
    );
    let in_db1 = || {
        let mut c = BufReader::new(TcpStream::connect(server.addr).unwrap());
        c.get_mut()
            .write_all(format!("SELECT 1\r\nEXISTS {}\r\n", t.key()).as_bytes())
            .unwrap();
        let (mut selected, mut exists) = (String::new(), String::new());
        c.read_line(&mut selected).unwrap();
        c.read_line(&mut exists).unwrap();
        assert_eq!(selected.trim_end(), "+OK");
        exists.trim_end() == ":1"
    };
    assert!(in_db1());
    db1.release(&t.id).unwrap();
    assert!(!in_db1(), "a count back at 0 deletes the key");
    redis_support::raw_in(server.addr, 1, &["DEL", &Redis::seeded_key(&t.id)]);
}

// ---------------------------------------------------------------------------
// Reconnection, through a proxy the test can cut
// ---------------------------------------------------------------------------

/// A TCP proxy to the server whose connections can be cut (as a Redis restart or
/// an idle-client timeout would), and which can refuse to forward at all.
struct Proxy {
    addr: SocketAddr,
    open: Arc<Mutex<Vec<TcpStream>>>,
    refuse: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(Mutex::new(Vec::new()));
        let refuse = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (o, r, a) = (open.clone(), refuse.clone(), accepted.clone());
        // The thread ends with the test process; it holds nothing but sockets.
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                if r.load(Ordering::SeqCst) {
                    continue; // dropped: closed before a byte is answered
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                o.lock().unwrap().push(client.try_clone().unwrap());
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    })
                };
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy {
            addr,
            open,
            refuse,
            accepted,
        }
    }
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A supervisor starting while its Redis restarts waits for it
/// (`open_waiting`, issue 28): a Redis that comes up on the address within
/// the wait is used; one that never does is the same clear error as
/// `open`'s, naming the URL; a URL no wait makes right fails at once.
#[test]
fn redis_absent_at_start_is_waited_for_then_refused() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    // Nothing on the port yet: started in a moment, while `open_waiting` asks.
    let launched = Arc::new(AtomicBool::new(false));
    let late = thread::spawn({
        let launched = launched.clone();
        move || {
            thread::sleep(Duration::from_millis(700));
            launched.store(true, Ordering::SeqCst);
            spawn_server_on(port)
        }
    });
    assert!(
        !redis_support::pings(format!("127.0.0.1:{port}").parse().unwrap()),
        "something already answers on {url}"
    );
    let waited = slots::open_waiting(Some(&url), "s-test", Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("a Redis that came up while waited for: {e}"));
    // It answered only once the late server was launched, and it is that server.
    assert!(
        launched.load(Ordering::SeqCst),
        "answered before any Redis was launched"
    );
    let server = late.join().unwrap();
    let t = Tenant::new("late", None);
    waited.reseed(&t.id, 0, &[]).unwrap();
    assert!(waited.acquire(&t.id, 1).unwrap());
    assert_eq!(redis_support::held(server.addr, 0, &t.key()), 1);
    drop(server);

    // Never up: the error names the URL and the command, after the wait.
    let closed = format!("redis://127.0.0.1:{}", free_port());
    let msg = match slots::open_waiting(Some(&closed), "s-test", Duration::from_millis(400)) {
        Ok(s) => panic!("{closed} opened as {}", s.describe()),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains(&closed) && msg.contains("PING") && msg.contains("connect"),
        "{msg}"
    );
    // Not a Redis URL: refused without waiting for anything.
    match slots::open_waiting(
        Some("memcached://127.0.0.1:1"),
        "s-test",
        Duration::from_secs(3600),
    ) {
        Ok(s) => panic!("memcached:// opened as {}", s.describe()),
        Err(e) => assert!(matches!(e, SlotError::Url { .. }), "{e}"),
    }
}

#[test]
fn redis_reconnects_once_after_a_lost_connection() {
    let server = server();
    let proxy = Proxy::start(server.addr);
    let url = format!("redis://{}", proxy.addr);
    let slots = slots::open(Some(&url), "s-test").unwrap();
    let t = Tenant::new("rx", Some(&server));
    assert!(slots.acquire(&t.id, 5).unwrap());
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        1,
        "one connection, reused"
    );

    // The connection dies while idle: the next call reconnects and succeeds,
    // counting its acquire once.
    proxy.cut();
    thread::sleep(Duration::from_millis(50));
    assert!(slots.acquire(&t.id, 5).unwrap());
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(slots.count(&t.id).unwrap(), 2);
    proxy.cut();
    thread::sleep(Duration::from_millis(50));
    slots.release(&t.id).unwrap();
    assert_eq!(slots.count(&t.id).unwrap(), 1);

    // Redis gone for good: one reconnect, then an error naming URL and command,
    // and the next call tries again rather than giving up for ever.
    proxy.refuse.store(true, Ordering::SeqCst);
    proxy.cut();
    thread::sleep(Duration::from_millis(50));
    let msg = slots.acquire(&t.id, 5).unwrap_err().to_string();
    assert!(msg.contains(&url) && msg.contains("EVAL acquire"), "{msg}");
    let msg = match slots.count(&t.id) {
        Err(SlotError::Redis {
            url: u, command, ..
        }) => format!("{u} {command}"),
        other => panic!("{other:?}"),
    };
    assert_eq!(msg, format!("{url} EVAL count"));
    proxy.refuse.store(false, Ordering::SeqCst);
    assert_eq!(slots.count(&t.id).unwrap(), 1, "back once Redis is");
}
