//! An error is never a fact, across nodes (issue 28 item 1): a node whose
//! store calls fail while it takes up work another node handed it does not
//! take the failure for an answer. The failure is real: the test's own
//! session holds a table locked, and the nodes' sessions, given a short
//! `lock_timeout` in their URL, fail on it as they would on a server that
//! stalls. Nothing is mocked: two `brood serve` nodes on one PostgreSQL.
//!
//! - An agent placed on a node whose reads fail while it claims it is not
//!   ended for it (it was: `failed (lost)`, "the node it was placed on
//!   could not start it"); it is hosted once the reads succeed.
//! - A child's end its node could not post to its parent's node reaches
//!   that node later (it was logged and lost: the parent never heard).
//! - A child's end heard while the parent's node cannot read the child's
//!   channel keeps its result (it was told with none).
//! - A close heard while the agent cannot be read is shown later (the
//!   node's tree said open for good).
//! - A node declared lost that comes back while it cannot read its agents'
//!   records lets go of the one that moved once it can (it ran on two
//!   nodes at once for good).
//! - A ready spawn's news heard while the agent cannot be read answers its
//!   wait once it can (the wait hung until the agent ended).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use brood_store_conformance::pg::Fresh;
use common::cluster::serve_with;
use common::*;
use serde_json::{Value, json};

/// A node's sessions give up on a lock after this long (the URL's
/// `options`), so a locked table fails their calls at once.
const SHORT_LOCKS: &str = "options=-c%20lock_timeout%3D300";

/// A table held locked by a session of the test's own until dropped.
struct Locked {
    release: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Locked {
    /// Locks `table` (`ACCESS EXCLUSIVE`: no node reads or writes it) in a
    /// transaction on `url`; returns once the lock is held.
    fn hold(url: &str, table: &str) -> Locked {
        let (url, stmt) = (
            url.to_owned(),
            format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
        );
        let (held_tx, held_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (mut c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                let task = tokio::spawn(conn);
                let tx = c.transaction().await.unwrap();
                tx.batch_execute(&stmt).await.unwrap();
                held_tx.send(()).unwrap();
                let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                tx.rollback().await.unwrap();
                drop(c);
                let _ = task.await;
            });
        });
        held_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the test's session locked the table");
        Locked {
            release: Some(release),
            thread: Some(thread),
        }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `url` with the nodes' short lock timeout.
fn short_locks(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{SHORT_LOCKS}")
}

fn state(sock: &Path, name: &str) -> Value {
    http(sock, "GET", &format!("/api/agents/{name}"), None).1
}

fn signal(d: &Daemon, sig: i32) {
    // SAFETY: signalling a node this test started.
    unsafe { libc::kill(d.0.id() as i32, sig) };
}

/// The first column of the first row of `sql` (with `params`), read by a
/// session of the test's own (a node's API may be refused while the test
/// holds a table it reads); `None` when there is no row.
fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    url: &str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Option<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(conn);
        let row = c.query_opt(sql, params).await.unwrap();
        drop(c);
        let _ = task.await;
        row.map(|r| r.get::<_, T>(0))
    })
}

/// `name`'s status in the store (empty while it has no record).
fn status(url: &str, name: &str) -> String {
    one(url, "SELECT status FROM agents WHERE name = $1", &[&name]).unwrap_or_default()
}

/// How many nodes are registered.
fn node_count(url: &str) -> i64 {
    one(url, "SELECT count(*) FROM nodes", &[]).unwrap_or_default()
}

/// How many notes wait in the store's inbox.
fn inbox_len(url: &str) -> i64 {
    one(url, "SELECT count(*) FROM inbox", &[]).unwrap_or_default()
}

/// Two nodes (zones z0 and z1) on one fresh database, neither with Redis,
/// both with short lock timeouts; ticks fast.
struct Two {
    nodes: Vec<Daemon>,
    roots: Vec<PathBuf>,
    url: String,
    _dir: tempfile::TempDir,
    _db: Fresh,
}

/// A node a test stopped (SIGSTOP) and did not resume, because it failed
/// first, is resumed before it is stopped for good: a stopped process
/// keeps its SIGTERM pending, and the wait for it would never end.
impl Drop for Two {
    fn drop(&mut self) {
        for d in &self.nodes {
            signal(d, libc::SIGCONT);
        }
    }
}

impl Two {
    fn start() -> Two {
        Two::with_expiry("3600")
    }

    /// [`Two::start`] with the nodes' `--node-expiry` (seconds).
    fn with_expiry(expiry: &str) -> Two {
        let db = Fresh::new();
        let url = db.url.clone();
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        let mut roots = Vec::new();
        for i in 0..2 {
            let root = dir.path().join(format!("n{i}"));
            std::fs::create_dir_all(&root).unwrap();
            nodes.push(serve_with(
                &root,
                &short_locks(&url),
                &format!("z{i}"),
                &[common::cluster::NO_REDIS, "--node-expiry", expiry],
            ));
            roots.push(root);
        }
        let sock = roots[0].join("brood.sock");
        assert!(
            eventually(Duration::from_secs(20), || {
                let (s, v) = http(&sock, "GET", "/api/nodes", None);
                s == 200 && v["nodes"].as_array().is_some_and(|n| n.len() == 2)
            }),
            "both nodes registered: {}",
            http(&sock, "GET", "/api/nodes", None).1
        );
        Two {
            nodes,
            roots,
            url,
            _dir: dir,
            _db: db,
        }
    }

    fn sock(&self, i: usize) -> PathBuf {
        self.roots[i].join("brood.sock")
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.roots[i].with_extension("log")).unwrap_or_default()
    }
}

/// `top` on node 0 and its child `kid` on node 1 (placed by its zone),
/// which ends with a result once told; the path of their channel on node
/// 0's disk.
fn parent_here_child_there(two: &Two) -> PathBuf {
    let (s, v) = http(
        &two.sock(0),
        "POST",
        "/api/agents",
        Some(&json!({"name": "top", "argv": agent(&["--hang"]), "await_ready": true})),
    );
    assert_eq!(s, 201, "{v}");
    let (s, v) = http(
        &two.sock(0),
        "POST",
        "/api/agents",
        Some(&json!({"name": "kid", "parent": "top", "await_ready": true,
                     "placement": {"labels": {"zone": "z1"}},
                     "argv": agent(&["--inputs", "1", "--result", "kid's answer"])})),
    );
    assert_eq!(s, 201, "{v}");
    let kid = state(&two.sock(1), "kid");
    assert_eq!(kid["status"], "running", "{kid}");
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    two.roots[0].join(format!(
        "ctx/home/{uid}/agent/top/session/default/context/child/kid"
    ))
}

/// An agent placed on node 1 is claimed there while every read of `runs`
/// fails (the hosting reads an earlier run, the subtree's spend): node 1
/// keeps it, queued, and hosts it once the reads succeed. Before, the
/// failed read ended it `failed (lost)`.
#[test]
fn an_agent_claimed_while_the_store_fails_is_hosted_once_it_answers() {
    let two = Two::start();
    // Node 1 cannot claim while stopped: the agent waits, placed on it.
    signal(&two.nodes[1], libc::SIGSTOP);
    let (s, v) = http(
        &two.sock(0),
        "POST",
        "/api/agents",
        Some(&json!({"name": "placed", "argv": agent(&["--hang"]),
                     "placement": {"labels": {"zone": "z1"}}})),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["status"], "queued", "{v}");
    let lock = Locked::hold(&two.url, "runs");
    // Back: the news of the placement wakes its claim, and its hosting's
    // reads fail on the lock.
    signal(&two.nodes[1], libc::SIGCONT);
    let tried = eventually(Duration::from_secs(30), || {
        two.log(1).contains("placed on this node")
    });
    assert!(tried, "node 1 never claimed the agent:\n{}", two.log(1));
    // A few more failed tries, at its ticks.
    std::thread::sleep(Duration::from_secs(1));
    let during = status(&two.url, "placed");
    drop(lock);
    let mut last = String::new();
    let moved_on = eventually(Duration::from_secs(30), || {
        last = status(&two.url, "placed");
        last != "queued"
    });
    assert!(moved_on, "never hosted: {last}");
    assert_eq!(
        last,
        "running",
        "ended for a read that failed (while locked: {during}):\n{}",
        two.log(1)
    );
    assert_eq!(during, "queued");
    assert!(
        two.log(1)
            .contains("hosting an agent placed on this node: the store failed"),
        "the hosting's reads failed (the test's fault): {}",
        two.log(1)
    );
    let a = state(&two.sock(0), "placed");
    assert_eq!(a["status"], "running", "{a}");
}

/// A child on node 1 of a parent on node 0 ends while every post to the
/// store's inbox fails: node 1 tells node 0 of the end once the store takes
/// it, and the parent's channel on node 0's disk says the child is done.
/// Before, the failed post was logged and the parent never heard.
#[test]
fn a_child_s_end_its_node_could_not_post_reaches_the_parent_s_node_later() {
    let two = Two::start();
    let channel = parent_here_child_there(&two);
    let lock = Locked::hold(&two.url, "inbox");
    // Told on node 1, which runs it: no inbox on the way in.
    let (s, v) = http(
        &two.sock(1),
        "POST",
        "/api/agents/kid/input",
        Some(&json!({"text": "finish"})),
    );
    assert_eq!(s, 200, "{v}");
    let ended = eventually(Duration::from_secs(30), || {
        status(&two.url, "kid") == "completed"
    });
    assert!(ended, "kid never ended:\n{}", two.log(1));
    let tried = eventually(Duration::from_secs(30), || {
        two.log(1).contains("posting a note to another node")
    });
    assert!(
        tried,
        "node 1's post of the end never failed (the test's fault):\n{}",
        two.log(1)
    );
    let status_file = channel.join("status");
    let during = std::fs::read_to_string(&status_file).unwrap_or_default();
    drop(lock);
    let mut last = String::new();
    let told = eventually(Duration::from_secs(30), || {
        last = std::fs::read_to_string(&status_file).unwrap_or_default();
        last.trim() == "done"
    });
    assert!(
        told,
        "the parent's node never heard of its child's end (status {last:?}, while locked {during:?}):\n{}",
        two.log(1)
    );
    assert_ne!(during.trim(), "done", "heard while the inbox was locked");
}

/// The parent's node hears of a child's end (node 1 ran it) while its reads
/// of the child's channel fail: it hears of it again at its next tick,
/// and the parent's channel gets the child's result once the reads
/// succeed. Before, the failed read was taken for "no result": the channel
/// said `done` with no `result.md`, for good.
#[test]
fn a_child_s_end_heard_while_its_channel_cannot_be_read_keeps_its_result() {
    let two = Two::start();
    let channel = parent_here_child_there(&two);
    // Node 0 stopped: the news of the end waits in the inbox for it.
    signal(&two.nodes[0], libc::SIGSTOP);
    let (s, v) = http(
        &two.sock(1),
        "POST",
        "/api/agents/kid/input",
        Some(&json!({"text": "finish"})),
    );
    assert_eq!(s, 200, "{v}");
    let ended = eventually(Duration::from_secs(30), || {
        status(&two.url, "kid") == "completed"
    });
    assert!(ended, "kid never ended:\n{}", two.log(1));
    // The channels locked, node 0 back: it takes the news and
    // its read of the channel fails.
    let lock = Locked::hold(&two.url, "channels");
    signal(&two.nodes[0], libc::SIGCONT);
    let tried = eventually(Duration::from_secs(30), || {
        two.log(0).contains("a child's end another node told of")
            || std::fs::read_to_string(channel.join("status")).is_ok_and(|s| s.trim() == "done")
    });
    assert!(tried, "node 0 never heard of the end:\n{}", two.log(0));
    std::thread::sleep(Duration::from_millis(500));
    let result = channel.join("result.md");
    let during = std::fs::read_to_string(&result).unwrap_or_default();
    drop(lock);
    let mut last = String::new();
    let kept = eventually(Duration::from_secs(30), || {
        last = std::fs::read_to_string(&result).unwrap_or_default();
        last.contains("kid's answer")
    });
    assert!(
        kept,
        "the parent's channel never got the child's result (result.md {last:?}, status {:?}):\n{}",
        std::fs::read_to_string(channel.join("status")).unwrap_or_default(),
        two.log(0)
    );
    assert!(
        !during.contains("kid's answer"),
        "read while the channels were locked"
    );
    assert!(
        two.log(0)
            .contains("reading the channel of a child's end another node told of"),
        "the channel's read failed (the test's fault):\n{}",
        two.log(0)
    );
}

/// An agent node 0 ran is closed through node 1; node 0 takes the news while
/// its read of the agent fails: it reads it again at its next tick, and its
/// ctx tree shows the close once the read succeeds. Before, the failed read
/// was taken for "not closed": node 0's tree said open for good.
#[test]
fn a_close_heard_while_the_agent_cannot_be_read_is_shown_later() {
    let two = Two::start();
    let (s, v) = http(
        &two.sock(0),
        "POST",
        "/api/agents",
        Some(&json!({"name": "solo", "await_ready": true,
                     "argv": agent(&["--inputs", "1", "--result", "done"])})),
    );
    assert_eq!(s, 201, "{v}");
    let (s, v) = http(
        &two.sock(0),
        "POST",
        "/api/agents/solo/input",
        Some(&json!({"text": "finish"})),
    );
    assert_eq!(s, 200, "{v}");
    assert!(
        eventually(Duration::from_secs(30), || status(&two.url, "solo")
            == "completed"),
        "solo never ended:\n{}",
        two.log(0)
    );
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let events = two.roots[0].join(format!(
        "ctx/home/{uid}/agent/solo/session/default/events.jsonl"
    ));
    // Node 0 stopped: the news of the close waits in the inbox for it.
    signal(&two.nodes[0], libc::SIGSTOP);
    let (s, v) = http(&two.sock(1), "POST", "/api/agents/solo/close", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(inbox_len(&two.url), 1, "the close posted for node 0");
    let lock = Locked::hold(&two.url, "agents");
    signal(&two.nodes[0], libc::SIGCONT);
    let taken = eventually(Duration::from_secs(30), || inbox_len(&two.url) == 0);
    assert!(taken, "node 0 never took the news:\n{}", two.log(0));
    std::thread::sleep(Duration::from_millis(500));
    let during = std::fs::read_to_string(&events).unwrap_or_default();
    drop(lock);
    let mut last = String::new();
    let shown = eventually(Duration::from_secs(30), || {
        last = std::fs::read_to_string(&events).unwrap_or_default();
        last.contains("\"agent.close\"")
    });
    assert!(
        shown,
        "node 0's tree never showed the close:\n{last}\n{}",
        two.log(0)
    );
    assert!(
        !during.contains("\"agent.close\""),
        "shown while the agents were locked"
    );
    assert!(
        two.log(0).contains("reading an agent another node closed"),
        "the read failed (the test's fault):\n{}",
        two.log(0)
    );
}

/// Node 1 is paused until it is declared lost; its resumable agent moves to
/// node 0 and runs there. Node 1 comes back while every read of the
/// agents' records fails: it cannot tell whether its agent moved, so it
/// keeps it and reads again at its next tick, and lets it go once the read
/// succeeds. Before, the failed read was taken for "it did not move": its
/// old process ran on beside the new run for good.
#[test]
fn a_node_back_from_the_lost_that_cannot_read_its_agents_lets_the_moved_go_later() {
    let two = Two::with_expiry("2");
    // A root runs on the node it is asked through.
    let (s, v) = http(
        &two.sock(1),
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "wanderer", "argv": agent(&["--hang"]), "await_ready": true,
                     "policy": {"on_restart": "resume"}}),
        ),
    );
    assert_eq!(s, 201, "{v}");
    let first = state(&two.sock(1), "wanderer");
    let old_pid = first["pid"].as_i64().expect("a running agent's pid") as i32;
    let node1 = first["node"].clone();
    signal(&two.nodes[1], libc::SIGSTOP);
    let mut last = json!(null);
    let moved = eventually(Duration::from_secs(60), || {
        last = state(&two.sock(0), "wanderer");
        last["status"] == "running" && last["node"] != node1 && last["pid"] != first["pid"]
    });
    if !moved {
        signal(&two.nodes[1], libc::SIGCONT);
        panic!(
            "the paused node's agent never moved: {last}\n{}",
            two.log(0)
        );
    }
    let lock = Locked::hold(&two.url, "agents");
    signal(&two.nodes[1], libc::SIGCONT);
    // Back, it finds its record gone, fences itself off (where it reads
    // its agents' records, which fails) and registers again.
    let tried = eventually(Duration::from_secs(30), || node_count(&two.url) == 2);
    std::thread::sleep(Duration::from_secs(1));
    let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let during = alive(old_pid);
    drop(lock);
    assert!(tried, "node 1 never registered again:\n{}", two.log(1));
    let gone = eventually(Duration::from_secs(30), || !alive(old_pid));
    assert!(
        gone,
        "node 1 kept the old process {old_pid} of the agent that moved:\n{}",
        two.log(1)
    );
    assert!(during, "let go while its record could not be read");
    assert!(
        two.log(1)
            .contains("reading a live agent's record after this node was declared lost"),
        "the read failed (the test's fault):\n{}",
        two.log(1)
    );
    let now = state(&two.sock(0), "wanderer");
    assert_eq!(now["status"], "running", "the moved run goes on: {now}");
}

/// A spawn through node 0 placed on node 1 waits for the agent to be ready
/// there. Node 1 says so through node 0's inbox; node 0 takes the note
/// while its read of the agent fails: it keeps the news and answers the
/// wait once the read succeeds. Before, the note was spent on the failed
/// read and the wait hung until the agent ended (here: never).
#[test]
fn a_ready_spawn_s_news_heard_while_the_agent_cannot_be_read_answers_its_wait() {
    let two = Two::start();
    // Node 1 stopped: it claims and starts the agent only when let go.
    signal(&two.nodes[1], libc::SIGSTOP);
    let sock0 = two.sock(0);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http(
            &sock0,
            "POST",
            "/api/agents",
            Some(
                &json!({"name": "far", "argv": agent(&["--hang"]), "await_ready": true,
                         "placement": {"labels": {"zone": "z1"}}}),
            ),
        ));
    });
    let admitted = eventually(Duration::from_secs(30), || {
        status(&two.url, "far") == "queued"
    });
    assert!(admitted, "never admitted:\n{}", two.log(0));
    // The wait is parked on node 0 before node 0 stops.
    std::thread::sleep(Duration::from_millis(500));
    signal(&two.nodes[0], libc::SIGSTOP);
    signal(&two.nodes[1], libc::SIGCONT);
    let told = eventually(Duration::from_secs(30), || inbox_len(&two.url) == 1);
    if !told {
        signal(&two.nodes[0], libc::SIGCONT);
        panic!(
            "node 1 never told node 0 the agent is ready:\n{}",
            two.log(1)
        );
    }
    let lock = Locked::hold(&two.url, "agents");
    signal(&two.nodes[0], libc::SIGCONT);
    let taken = eventually(Duration::from_secs(30), || inbox_len(&two.url) == 0);
    std::thread::sleep(Duration::from_millis(500));
    let during = rx.try_recv().ok();
    drop(lock);
    assert!(taken, "node 0 never took the note:\n{}", two.log(0));
    assert!(
        during.is_none(),
        "answered while the agents were locked: {during:?}"
    );
    let answered = rx.recv_timeout(Duration::from_secs(30));
    let (s, v) = answered
        .unwrap_or_else(|_| panic!("the ready spawn's wait was never answered:\n{}", two.log(0)));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["status"], "running", "{v}");
    assert!(
        two.log(0).contains("reading an agent placed elsewhere"),
        "the read failed (the test's fault):\n{}",
        two.log(0)
    );
}
