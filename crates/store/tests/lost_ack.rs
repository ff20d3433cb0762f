//! Issue 28 item 1: every write that may be retried after a lost
//! acknowledgement is done once. Each kind of write the PostgreSQL store
//! makes (`lost_ack/cases.rs`) runs twice, on two databases of their own
//! with the same inputs: once acknowledged, once through a proxy that loses
//! its commit (`brood_store_conformance::proxy`). The caller must get the
//! answer the acknowledged write gave (not an error, not "already
//! exists"), and the store must hold what the acknowledged write left (one
//! row, one event, counted once), whichever way the commit was lost: its
//! answer lost after the server committed, or the COMMIT itself lost with
//! the connection closed or left open.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "lost_ack/cases.rs"]
mod cases;

use std::cell::Cell;
use std::time::Duration;

use brood_core::{RunId, TenantId, Terminal};
use brood_store::postgres::{Options, PgStore};
use brood_store::prelude::*;
use brood_store::{Agent, NewAgent, NewEvent, RunEnd, StoreError};
use brood_store_conformance::pg::Fresh;
use brood_store_conformance::proxy::{Loss, Proxy};
use brood_store_conformance::{self as conf, event};

use cases::{CASES, Case};

/// What a case works with: its store, its tenant (named after the case, the
/// same on both databases), and a clock and run ids of its own, so that both
/// runs of a case write the same values.
pub struct Ctx<'a> {
    pub store: &'a PgStore,
    pub t: TenantId,
    case: u64,
    clock: Cell<i64>,
    runs: Cell<u64>,
    arm: &'a dyn Fn(),
}

impl Ctx<'_> {
    /// Arms the proxy (a no-op for the acknowledged run): the next write's
    /// commit is the one lost.
    pub fn arm(&self) {
        (self.arm)();
    }

    pub fn now(&self) -> i64 {
        self.clock.set(self.clock.get() + 1);
        self.clock.get()
    }

    pub fn run(&self) -> RunId {
        self.runs.set(self.runs.get() + 1);
        let n = self.runs.get();
        RunId::v7(
            1_700_000_000_000 + self.case * 1_000 + n,
            0,
            self.case << 32 | n,
        )
    }

    /// The supervisor of the case's agents.
    pub fn supervisor(&self) -> String {
        format!("sup-{}", self.t)
    }

    pub fn new_agent(&self, n: &str, parent: Option<&str>) -> NewAgent {
        NewAgent {
            run: self.run(),
            now_ms: self.now(),
            ..conf::new_agent(&self.t, n, parent, &self.supervisor())
        }
    }

    pub fn spawn_events(&self, new: &NewAgent) -> Vec<NewEvent> {
        conf::spawn_events(new)
    }

    pub fn admit(&self, n: &str, parent: Option<&str>) -> Agent {
        let new = self.new_agent(n, parent);
        self.store.admit(&new, &self.spawn_events(&new)).unwrap()
    }

    /// A root admitted for `supervisor` to run.
    pub fn admit_on(&self, n: &str, supervisor: &str) -> Agent {
        let new = NewAgent {
            supervisor: supervisor.to_owned(),
            ..self.new_agent(n, None)
        };
        self.store.admit(&new, &[]).unwrap()
    }

    pub fn try_start(&self, a: &Agent) -> brood_store::Result<Agent> {
        let ev = [event(&a.name, Some(&a.run), "agent.start")];
        let cgroup = format!("/sys/fs/cgroup/brood/{}", a.name);
        let s = self.store;
        s.start_run(&a.tenant, &a.name, &a.run, 4242, &cgroup, self.now(), &ev)
    }

    pub fn running(&self, n: &str, parent: Option<&str>) -> Agent {
        let a = self.admit(n, parent);
        self.try_start(&a).unwrap()
    }

    pub fn end(&self, a: &Agent, outcome: Terminal) -> Agent {
        let end = RunEnd::without_process(outcome, "ended".into(), self.now());
        self.store
            .end_run(&a.tenant, &a.name, &a.run, &end, &[])
            .unwrap()
    }
}

/// Everything the store shows of a case's tenant: its records and events,
/// its jobs with their items and attempts, its slot shares and quotas, the
/// case's nodes (without the store's times), and the lease named after it.
fn state(store: &PgStore, t: &TenantId) -> String {
    let snapshot = conf::snapshot(store, t);
    let jobs: Vec<_> = store
        .jobs(t)
        .unwrap()
        .into_iter()
        .map(|j| {
            let items = store.job_items(t, &j.id, None).unwrap();
            let attempts: Vec<_> = items
                .iter()
                .map(|i| store.attempts(t, &j.id, &i.id).unwrap())
                .collect();
            (j, items, attempts)
        })
        .collect();
    let nodes: Vec<_> = store
        .nodes()
        .unwrap()
        .into_iter()
        .filter(|n| n.id.starts_with(&format!("{t}-")))
        .map(|n| (n.id, n.address, n.labels, n.capacity, n.live_agents))
        .collect();
    format!(
        "{snapshot:#?}\njobs {jobs:#?}\nshares {:?}\nquotas {:?}\nnodes {nodes:?}\nlease {:?}",
        store.slot_shares(t).unwrap(),
        store.tenant_quotas(t).unwrap(),
        store.lease(t.as_str()).unwrap(),
    )
}

/// Runs case `i` on `store`: its answer and the state it left.
fn run(store: &PgStore, i: usize, case: &Case, arm: &dyn Fn()) -> (String, String) {
    let ctx = Ctx {
        store,
        t: TenantId::new(&format!("case-{i}")).unwrap(),
        case: i as u64,
        clock: Cell::new(1_700_000_000_000 + i as i64 * 1_000_000),
        runs: Cell::new(0),
        arm,
    };
    let answer = (case.2)(&ctx);
    (answer, state(store, &ctx.t))
}

/// The first line where `a` and `b` differ, both ways.
fn first_difference(a: &str, b: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    loop {
        match (la.next(), lb.next()) {
            (None, None) => return "none".into(),
            (x, y) if x != y => return format!("acknowledged {x:?}, lost {y:?}"),
            _ => {}
        }
    }
}

/// Every case, acknowledged on one database and with its commit lost as
/// `how` says on another: the same answers, the same state.
fn every_write_is_done_once(how: Loss) {
    let acked_db = Fresh::new();
    let acked = PgStore::open(&acked_db.url).unwrap();
    let lost_db = Fresh::new();
    let (proxy, url) = Proxy::for_postgres(&lost_db.url);
    let lost = PgStore::open(&url).unwrap();
    let mut failed = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let (name, nth, _) = case;
        let want = run(&acked, i, case, &|| {});
        let before = proxy.lost();
        let got = run(&lost, i, case, &|| proxy.lose_commit(*nth, how));
        proxy.disarm();
        if proxy.lost() != before + 1 {
            failed.push(format!(
                "{name}: no commit was lost (it does not commit {nth} times)"
            ));
        } else if got.0 != want.0 {
            failed.push(format!(
                "{name}: answered\n  {}\nwhere acknowledged it answered\n  {}",
                got.0, want.0
            ));
        } else if got.1 != want.1 {
            failed.push(format!(
                "{name}: left another state: {}",
                first_difference(&want.1, &got.1)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} writes with their commit lost ({how:?}):\n{}",
        failed.len(),
        CASES.len(),
        failed.join("\n")
    );
}

/// The server committed; the answer to the COMMIT never came back. The
/// store asks the server what became of the transaction, and answers as
/// the write did.
#[test]
fn a_write_whose_commit_answer_is_lost_is_answered_as_done_once() {
    every_write_is_done_once(Loss::Answer);
}

/// The COMMIT never reached the server, which saw its client go and rolled
/// the transaction back: the write runs again, once.
#[test]
fn a_write_whose_commit_is_lost_is_done_again_once() {
    every_write_is_done_once(Loss::Commit);
}

/// The COMMIT never reached the server, and the server's side of the
/// connection stays open: its transaction waits, holding its locks, until
/// the store ends its session; then the write runs again, once.
#[test]
fn a_write_whose_commit_is_lost_on_a_connection_left_open_is_done_once() {
    every_write_is_done_once(Loss::CommitUnseen);
}

/// A single statement that commits on its own (a heartbeat) is run again
/// when its answer is lost: it sets what it sets, so twice is once.
#[test]
fn a_heartbeat_whose_answer_is_lost_is_answered() {
    let db = Fresh::new();
    let (proxy, url) = Proxy::for_postgres(&db.url);
    let store = PgStore::open(&url).unwrap();
    let node = brood_store::NewNode {
        id: "hb-a".into(),
        address: "/run/hb-a.sock".into(),
        labels: "{}".into(),
        capacity: None,
    };
    store.register_node(&node).unwrap();
    proxy.lose_implicit_commit_answer();
    store.heartbeat_node("hb-a").unwrap();
    assert_eq!(proxy.lost(), 1, "the heartbeat's answer was not lost");
    let ids: Vec<String> = store.nodes().unwrap().into_iter().map(|n| n.id).collect();
    assert_eq!(ids, ["hb-a"]);
}

/// A COMMIT with no answer at all (the network went silent right after
/// it): the store cannot ask the server, so the write is reported in doubt,
/// and never run again (the server, which never got the COMMIT, holds no
/// admission; a retry would have written one).
#[test]
fn a_commit_unanswered_past_the_deadline_is_in_doubt_and_not_run_again() {
    let db = Fresh::new();
    // The schema first, with the usual deadline: making it takes more than
    // the short deadline below on a machine busy with other tests.
    drop(PgStore::open(&db.url).unwrap());
    let (proxy, url) = Proxy::for_postgres(&db.url);
    let opts = Options {
        call_timeout: Duration::from_secs(2),
        ..Options::default()
    };
    let store = PgStore::open_with(&url, opts).unwrap();
    let t = conf::tenant("doubt");
    let new = conf::new_agent(&t, "root", None, "sup");
    proxy.lose_commit(1, Loss::Silence);
    match store.admit(&new, &[]) {
        Err(e @ StoreError::PostgresInDoubt { .. }) => {
            let text = e.to_string();
            assert!(text.contains("no answer within 2s"), "{text}");
            assert!(text.contains("not done again"), "{text}");
        }
        other => panic!("expected the write in doubt, got {other:?}"),
    }
    assert_eq!(proxy.lost(), 1);
    assert_eq!(store.agent(&t, &new.name).unwrap(), None);
}

/// Issue 28's fault campaign: a transaction whose COMMIT a silent network
/// lost holds the tenant's lock on the server, its session idle inside the
/// transaction, its client gone past the deadline. The server ends that
/// session once it has been idle `idle_in_transaction_timeout`, so the
/// tenant's writes go on; before, every one of them waited on the lock until
/// its `lock_timeout`, for ever, and the cluster stood still.
#[test]
fn a_session_left_idle_in_a_transaction_is_ended_and_the_tenant_writes_again() {
    let db = Fresh::new();
    let (proxy, url) = Proxy::for_postgres(&db.url);
    // The client gives up first (in doubt), then the server ends the session.
    let opts = Options {
        call_timeout: Duration::from_secs(1),
        idle_in_transaction_timeout: Duration::from_secs(3),
        ..Options::default()
    };
    let store = PgStore::open_with(&url, opts).unwrap();
    let t = conf::tenant("idle");
    let first = conf::new_agent(&t, "first", None, "sup");
    proxy.lose_commit(1, Loss::Silence);
    assert!(matches!(
        store.admit(&first, &[]),
        Err(StoreError::PostgresInDoubt { .. })
    ));
    // Another node, straight to the server, writes in the same tenant.
    let other = PgStore::open_with(&db.url, Options::default()).unwrap();
    let second = conf::new_agent(&t, "second", None, "sup");
    let admitted = other.admit(&second, &[]);
    assert!(
        admitted.is_ok(),
        "the tenant's lock is still held by the lost transaction: {admitted:?}"
    );
    assert_eq!(other.agent(&t, &first.name).unwrap(), None);
}
