//! The store conformance suite: what every [`Store`] backend must do, written only
//! against `&dyn Store` so the SQLite store and a later PostgreSQL store run the
//! same cases.
//!
//! Each case works in its own tenant (named after the case) and names its
//! supervisors after it too, so the cases can run one after another on one shared
//! database ([`conformance`]) as well as each on a fresh one. "Nothing was
//! written" is checked through the trait alone: a [`Snapshot`] is everything the
//! store shows about a tenant, taken before and after a refused call.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use brood_core::{
    AgentName, CancelReason, Code, FailReason, Quotas, RunId, SessionName, Status, TenantId,
    Terminal,
};
use brood_store::{
    Agent, Artifact, Channel, ChannelOutput, Event, Fence, Message, NewAgent, NewEvent, Protocol,
    Run, RunEnd, Store, StoreError, Usage,
};

/// One case of the suite.
pub type Case = fn(&dyn Store);

/// Every case, by name, in the order [`conformance`] runs them.
pub const CASES: &[(&str, Case)] = &[
    ("admit_root_and_children", admit_root_and_children),
    ("admit_refuses_a_taken_name", admit_refuses_a_taken_name),
    (
        "admit_refuses_a_missing_parent",
        admit_refuses_a_missing_parent,
    ),
    (
        "admit_refuses_a_queued_or_finished_parent",
        admit_refuses_a_queued_or_finished_parent,
    ),
    (
        "admit_refuses_a_stopping_parent",
        admit_refuses_a_stopping_parent,
    ),
    (
        "admit_refuses_a_missing_customer",
        admit_refuses_a_missing_customer,
    ),
    (
        "a_refused_admission_creates_no_tenant",
        a_refused_admission_creates_no_tenant,
    ),
    ("admit_refuses_bad_json", admit_refuses_bad_json),
    (
        "start_run_records_pid_and_cgroup",
        start_run_records_pid_and_cgroup,
    ),
    (
        "start_run_after_cancel_while_queued_is_refused",
        start_run_after_cancel_while_queued_is_refused,
    ),
    (
        "start_run_of_a_stale_run_is_refused",
        start_run_of_a_stale_run_is_refused,
    ),
    (
        "illegal_transitions_are_refused_and_change_nothing",
        illegal_transitions_are_refused_and_change_nothing,
    ),
    (
        "set_status_blocks_unblocks_and_closes",
        set_status_blocks_unblocks_and_closes,
    ),
    (
        "end_run_records_the_run_and_the_channel_result",
        end_run_records_the_run_and_the_channel_result,
    ),
    (
        "end_run_from_stopping_keeps_the_recorded_outcome",
        end_run_from_stopping_keeps_the_recorded_outcome,
    ),
    (
        "end_run_of_an_old_run_is_refused",
        end_run_of_an_old_run_is_refused,
    ),
    (
        "mark_stopping_records_the_intent",
        mark_stopping_records_the_intent,
    ),
    (
        "mark_stopping_with_an_unknown_name_changes_nothing",
        mark_stopping_with_an_unknown_name_changes_nothing,
    ),
    ("messages_read_back_in_order", messages_read_back_in_order),
    (
        "resume_makes_a_new_run_and_keeps_messages",
        resume_makes_a_new_run_and_keeps_messages,
    ),
    (
        "resume_is_refused_unless_finished",
        resume_is_refused_unless_finished,
    ),
    (
        "resume_is_refused_under_a_dead_parent",
        resume_is_refused_under_a_dead_parent,
    ),
    (
        "recover_ends_the_dead_supervisors_agents",
        recover_ends_the_dead_supervisors_agents,
    ),
    (
        "record_usage_replaces_the_counters",
        record_usage_replaces_the_counters,
    ),
    (
        "events_filter_by_agent_after_and_limit",
        events_filter_by_agent_after_and_limit,
    ),
    (
        "append_events_refuses_unknown_agents_and_bad_payloads",
        append_events_refuses_unknown_agents_and_bad_payloads,
    ),
    (
        "event_sequences_are_gapless_under_concurrency",
        event_sequences_are_gapless_under_concurrency,
    ),
    ("children_in_creation_order", children_in_creation_order),
    (
        "agents_lists_all_or_unfinished",
        agents_lists_all_or_unfinished,
    ),
    (
        "descendants_are_in_post_order",
        descendants_are_in_post_order,
    ),
    ("spend_rolls_up_the_subtree", spend_rolls_up_the_subtree),
    (
        "lease_epochs_fence_old_holders",
        lease_epochs_fence_old_holders,
    ),
    (
        "overdue_runs_are_found_by_deadline",
        overdue_runs_are_found_by_deadline,
    ),
    (
        "orphans_have_a_finished_or_missing_parent",
        orphans_have_a_finished_or_missing_parent,
    ),
    (
        "create_limit_is_counted_in_the_admission_transaction",
        create_limit_is_counted_in_the_admission_transaction,
    ),
];

/// Runs every case on one store, one after another.
pub fn conformance(store: &dyn Store) {
    for (name, case) in CASES {
        eprintln!("conformance: {name}");
        case(store);
    }
}

// ---- helpers ------------------------------------------------------------------

static CLOCK: AtomicI64 = AtomicI64::new(1_700_000_000_000);
static RUNS: AtomicU64 = AtomicU64::new(1);

/// A strictly increasing clock, so creation order is never a tie.
pub fn now() -> i64 {
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// A run id no other case uses (run ids are unique across tenants).
pub fn new_run() -> RunId {
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    // Millisecond part from the counter keeps the ids distinct and sorted; the
    // random part carries the process id so two test processes on one database
    // would not collide either.
    RunId::v7(
        1_700_000_000_000 + n,
        0,
        u64::from(std::process::id()) << 32 | n,
    )
}

pub fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

pub fn name(s: &str) -> AgentName {
    AgentName::new(s).unwrap()
}

pub fn session() -> SessionName {
    SessionName::default_session()
}

pub fn event(agent: &AgentName, run: Option<&RunId>, kind: &str) -> NewEvent {
    NewEvent {
        agent: agent.clone(),
        run: run.cloned(),
        session: session(),
        kind: kind.to_owned(),
        payload: format!(r#"{{"type":"{kind}","agent":"{agent}"}}"#),
    }
}

pub fn new_agent(t: &TenantId, n: &str, parent: Option<&str>, supervisor: &str) -> NewAgent {
    NewAgent {
        tenant: t.clone(),
        name: name(n),
        parent: parent.map(name),
        customer: None,
        session: session(),
        protocol: Protocol::Brood,
        spec: r#"{"argv":["/bin/true"],"env":{},"cwd":"/"}"#.to_owned(),
        handoff: format!("task of {n}"),
        supervisor: supervisor.to_owned(),
        run: new_run(),
        now_ms: now(),
    }
}

/// The events SPEC 6 names for a creation: `agent.spawn` in the child's log and
/// `agent.child.spawn` in the parent's.
pub fn spawn_events(new: &NewAgent) -> Vec<NewEvent> {
    let mut v = vec![event(&new.name, Some(&new.run), "agent.spawn")];
    if let Some(p) = &new.parent {
        v.push(NewEvent {
            payload: format!(
                r#"{{"type":"agent.child.spawn","parent":"{p}","child":"{}"}}"#,
                new.name
            ),
            ..event(p, None, "agent.child.spawn")
        });
    }
    v
}

pub fn admit(store: &dyn Store, t: &TenantId, n: &str, parent: Option<&str>) -> Agent {
    let new = new_agent(t, n, parent, &format!("sup-{t}"));
    store.admit(&new, &spawn_events(&new)).unwrap()
}

pub fn start(store: &dyn Store, a: &Agent) -> Agent {
    store
        .start_run(
            &a.tenant,
            &a.name,
            &a.run,
            4242,
            &format!("/sys/fs/cgroup/brood/{}", a.name),
            now(),
            &[event(&a.name, Some(&a.run), "agent.start")],
        )
        .unwrap()
}

/// Admits and starts: a running agent, as a parent must be.
pub fn running(store: &dyn Store, t: &TenantId, n: &str, parent: Option<&str>) -> Agent {
    let a = admit(store, t, n, parent);
    start(store, &a)
}

pub fn end(store: &dyn Store, a: &Agent, outcome: Terminal, result: Option<&str>) -> Agent {
    store
        .end_run(
            &a.tenant,
            &a.name,
            &a.run,
            &RunEnd {
                outcome,
                exit_code: Some(0),
                result: result.map(str::to_owned),
                detail: None,
                now_ms: now(),
                output: None,
            },
            &[event(&a.name, Some(&a.run), "agent.stop")],
        )
        .unwrap()
}

pub fn get(store: &dyn Store, t: &TenantId, n: &str) -> Agent {
    store.agent(t, &name(n)).unwrap().unwrap()
}

pub fn all_events(store: &dyn Store, t: &TenantId) -> Vec<Event> {
    store.events(t, 0, None, u32::MAX).unwrap()
}

/// The code and message of a refusal; panics on anything else.
#[track_caller]
pub fn refusal<T: std::fmt::Debug>(r: brood_store::Result<T>) -> (Code, String) {
    match r {
        Err(StoreError::Refused { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Everything the store shows about one tenant.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    pub has_tenant: bool,
    pub agents: Vec<Agent>,
    pub runs: Vec<Run>,
    pub channels: Vec<Channel>,
    pub messages: Vec<Message>,
    pub events: Vec<Event>,
    pub unfinished: Vec<Agent>,
}

pub fn snapshot(store: &dyn Store, t: &TenantId) -> Snapshot {
    let agents = store.agents(t, true).unwrap();
    let mut runs = Vec::new();
    let mut channels = Vec::new();
    let mut messages = Vec::new();
    for a in &agents {
        runs.extend(store.runs(t, &a.name).unwrap());
        if let Some(p) = &a.parent {
            channels.push(store.channel(t, p, &a.name).unwrap().unwrap());
        }
        messages.extend(store.messages(t, &a.name, &a.session).unwrap());
    }
    Snapshot {
        has_tenant: store.tenants().unwrap().contains(t),
        agents,
        runs,
        channels,
        messages,
        events: all_events(store, t),
        unfinished: store.agents(t, false).unwrap(),
    }
}

fn terminals() -> Vec<Terminal> {
    let mut v = vec![Terminal::Completed];
    v.extend(FailReason::ALL.map(Terminal::Failed));
    v.extend(CancelReason::ALL.map(Terminal::Cancelled));
    v
}

fn all_statuses() -> Vec<Status> {
    let mut v = vec![Status::Queued, Status::Running, Status::Blocked];
    for t in terminals() {
        v.extend([Status::Stopping(t), Status::Ended(t), Status::Closed(t)]);
    }
    v
}

const USER: Terminal = Terminal::Cancelled(CancelReason::User);
const PARENT_DEAD: Terminal = Terminal::Cancelled(CancelReason::ParentDead);
const RESTART: Terminal = Terminal::Cancelled(CancelReason::RuntimeRestart);

// ---- admission ------------------------------------------------------------------

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

// ---- start, status, end ---------------------------------------------------------

pub fn start_run_records_pid_and_cgroup(store: &dyn Store) {
    let t = tenant("conf-start");
    let a = admit(store, &t, "a", None);
    let at = now();
    let started = store
        .start_run(
            &t,
            &a.name,
            &a.run,
            777,
            "/cg/a",
            at,
            &[event(&a.name, Some(&a.run), "agent.start")],
        )
        .unwrap();
    assert_eq!((started.status, started.updated_ms), (Status::Running, at));
    let run = store.run(&t, &a.run).unwrap().unwrap();
    assert_eq!(
        (run.pid, run.cgroup.as_deref(), run.started_ms),
        (Some(777), Some("/cg/a"), Some(at))
    );
    let last = all_events(store, &t).pop().unwrap();
    assert_eq!((last.kind.as_str(), last.ts_ms), ("agent.start", at));
}

pub fn start_run_after_cancel_while_queued_is_refused(store: &dyn Store) {
    // The race of SPEC 6: the launcher starts the process while a cancel lands
    // between admission and start. The store must refuse the start, so the caller
    // kills what it started, and must not have written any of it.
    let t = tenant("conf-cancelrace");
    let a = admit(store, &t, "a", None);
    let after = store
        .mark_stopping(&t, std::slice::from_ref(&a.name), USER, now())
        .unwrap();
    assert_eq!(after[0].status, Status::Ended(USER));
    let before = snapshot(store, &t);
    let r = store.start_run(
        &t,
        &a.name,
        &a.run,
        99,
        "/cg/a",
        now(),
        &[event(&a.name, Some(&a.run), "agent.start")],
    );
    match r {
        Err(StoreError::Transition { name, source }) => {
            assert_eq!(name, "a");
            assert_eq!(
                (source.from, source.to),
                (Status::Ended(USER), Status::Running)
            );
        }
        other => panic!("expected a transition refusal, got {other:?}"),
    }
    assert_eq!(snapshot(store, &t), before);
    let run = store.run(&t, &a.run).unwrap().unwrap();
    assert_eq!((run.pid, run.outcome), (None, Some(USER)));
}

pub fn start_run_of_a_stale_run_is_refused(store: &dyn Store) {
    let t = tenant("conf-stalestart");
    let a = admit(store, &t, "a", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&a.name), USER, now())
        .unwrap();
    let run2 = new_run();
    store
        .resume(&t, &a.name, &run2, "sup-stalestart", now(), &[])
        .unwrap();
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.start_run(&t, &a.name, &a.run, 1, "/cg", now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains(a.run.as_str()), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn illegal_transitions_are_refused_and_change_nothing(store: &dyn Store) {
    let t = tenant("conf-illegal");
    running(store, &t, "root", None);
    admit(store, &t, "q", Some("root"));
    running(store, &t, "r", Some("root"));
    let b = running(store, &t, "b", Some("root"));
    store
        .set_status(&t, &b.name, Status::Blocked, Some("input"), now(), &[])
        .unwrap();
    let s = running(store, &t, "s", Some("root"));
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), USER, now())
        .unwrap();
    let e = running(store, &t, "e", Some("root"));
    end(store, &e, Terminal::Completed, Some("done"));
    let c = running(store, &t, "c", Some("root"));
    end(store, &c, Terminal::Completed, Some("done"));
    store
        .set_status(
            &t,
            &c.name,
            Status::Closed(Terminal::Completed),
            None,
            now(),
            &[],
        )
        .unwrap();

    let mut refused = 0;
    for n in ["q", "r", "b", "s", "e", "c"] {
        let from = get(store, &t, n).status;
        for to in all_statuses() {
            let legal = from.transition(to).is_ok();
            // Legal moves that have their own method (the run record would be
            // left behind otherwise) are refused by set_status too.
            let elsewhere = matches!(to, Status::Ended(_) | Status::Queued)
                || (from, to) == (Status::Queued, Status::Running);
            if legal && !elsewhere {
                // Covered by set_status_blocks_unblocks_and_closes; doing it here
                // would change the state under the rest of the loop.
                continue;
            }
            refused += 1;
            let before = snapshot(store, &t);
            let r = store.set_status(
                &t,
                &name(n),
                to,
                Some("nope"),
                now(),
                &[event(&name(n), None, "x")],
            );
            if legal {
                let (code, msg) = refusal(r);
                assert_eq!(code, Code::BadRequest, "{msg}");
            } else {
                match r {
                    Err(StoreError::Transition { name: got, source }) => {
                        assert_eq!(got, n);
                        assert_eq!((source.from, source.to), (from, to));
                    }
                    other => panic!("{n}: {from:?} -> {to:?} gave {other:?}"),
                }
            }
            assert_eq!(snapshot(store, &t), before, "{n}: {from:?} -> {to:?}");
        }
    }
    assert!(refused > 200, "only {refused} moves were tried");

    // The dedicated methods refuse illegal moves the same way.
    let before = snapshot(store, &t);
    let e = get(store, &t, "e");
    let r = store.end_run(
        &t,
        &e.name,
        &e.run,
        &RunEnd {
            outcome: Terminal::Completed,
            exit_code: Some(0),
            result: Some("twice".into()),
            detail: None,
            now_ms: now(),
            output: None,
        },
        &[],
    );
    assert!(matches!(r, Err(StoreError::Transition { .. })), "{r:?}");
    let r = get(store, &t, "r");
    let x = store.start_run(&t, &r.name, &r.run, 1, "/cg", now(), &[]);
    assert!(matches!(x, Err(StoreError::Transition { .. })), "{x:?}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn set_status_blocks_unblocks_and_closes(store: &dyn Store) {
    let t = tenant("conf-setstatus");
    let a = running(store, &t, "a", None);
    let at = now();
    let blocked = store
        .set_status(
            &t,
            &a.name,
            Status::Blocked,
            Some("waiting for input"),
            at,
            &[event(&a.name, Some(&a.run), "agent.blocked")],
        )
        .unwrap();
    assert_eq!(
        (
            blocked.status,
            blocked.detail.as_deref(),
            blocked.updated_ms
        ),
        (Status::Blocked, Some("waiting for input"), at)
    );
    let back = store
        .set_status(&t, &a.name, Status::Running, None, now(), &[])
        .unwrap();
    assert_eq!(
        (back.status, back.detail.as_deref()),
        (Status::Running, None)
    );
    end(store, &back, Terminal::Completed, Some("r"));
    let closed = store
        .set_status(
            &t,
            &a.name,
            Status::Closed(Terminal::Completed),
            None,
            now(),
            &[],
        )
        .unwrap();
    assert_eq!(closed.status, Status::Closed(Terminal::Completed));
    assert_eq!(
        store
            .events(&t, 0, Some(&a.name), 100)
            .unwrap()
            .iter()
            .filter(|e| e.kind == "agent.blocked")
            .count(),
        1
    );
}

pub fn end_run_records_the_run_and_the_channel_result(store: &dyn Store) {
    let t = tenant("conf-endrun");
    running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    let at = now();
    let ended = store
        .end_run(
            &t,
            &kid.name,
            &kid.run,
            &RunEnd {
                outcome: Terminal::Completed,
                exit_code: Some(0),
                result: Some("the answer".into()),
                detail: Some("fine".into()),
                now_ms: at,
                output: Some(ChannelOutput {
                    refs: "{\"id\":\"ref-1\"}\n".into(),
                    artifacts: vec![Artifact {
                        name: "out/a.txt".into(),
                        sha256: "ab".repeat(32),
                        size: 5,
                    }],
                }),
            },
            &[event(&kid.name, Some(&kid.run), "agent.stop")],
        )
        .unwrap();
    assert_eq!(
        (ended.status, ended.detail.as_deref()),
        (Status::Ended(Terminal::Completed), Some("fine"))
    );
    let run = store.run(&t, &kid.run).unwrap().unwrap();
    assert_eq!(run.outcome, Some(Terminal::Completed));
    assert_eq!(
        (run.exit_code, run.result.as_deref(), run.ended_ms),
        (Some(0), Some("the answer"), Some(at))
    );
    let ch = store
        .channel(&t, &name("root"), &kid.name)
        .unwrap()
        .unwrap();
    assert_eq!(
        (ch.result.as_deref(), ch.status),
        (Some("the answer"), Status::Ended(Terminal::Completed))
    );
    // What the child handed back besides the result (SPEC 4) reads back whole.
    assert_eq!(ch.refs.as_deref(), Some("{\"id\":\"ref-1\"}\n"));
    assert_eq!(
        ch.artifacts,
        vec![Artifact {
            name: "out/a.txt".into(),
            sha256: "ab".repeat(32),
            size: 5
        }]
    );

    // A failure without a result leaves the channel's result empty.
    let kid2 = running(store, &t, "kid2", Some("root"));
    let failed = Terminal::Failed(FailReason::ExitCode);
    store
        .end_run(
            &t,
            &kid2.name,
            &kid2.run,
            &RunEnd {
                outcome: failed,
                exit_code: Some(3),
                result: None,
                detail: Some("exit 3".into()),
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    let ch = store
        .channel(&t, &name("root"), &kid2.name)
        .unwrap()
        .unwrap();
    assert_eq!((ch.result, ch.status), (None, Status::Ended(failed)));

    // A queued agent whose start failed ends without ever running.
    let kid3 = admit(store, &t, "kid3", Some("root"));
    let crashed = Terminal::Failed(FailReason::Crashed);
    let e = store
        .end_run(
            &t,
            &kid3.name,
            &kid3.run,
            &RunEnd {
                outcome: crashed,
                exit_code: None,
                result: None,
                detail: None,
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    assert_eq!(e.status, Status::Ended(crashed));
}

pub fn end_run_from_stopping_keeps_the_recorded_outcome(store: &dyn Store) {
    let t = tenant("conf-endstopping");
    running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    store
        .mark_stopping(&t, std::slice::from_ref(&kid.name), PARENT_DEAD, now())
        .unwrap();
    // The process exited 0 with a result after SIGTERM; the intent stands.
    let ended = store
        .end_run(
            &t,
            &kid.name,
            &kid.run,
            &RunEnd {
                outcome: Terminal::Completed,
                exit_code: Some(0),
                result: Some("late answer".into()),
                detail: None,
                now_ms: now(),
                output: None,
            },
            &[],
        )
        .unwrap();
    assert_eq!(ended.status, Status::Ended(PARENT_DEAD));
    let run = store.run(&t, &kid.run).unwrap().unwrap();
    assert_eq!(run.outcome, Some(PARENT_DEAD));
    assert_eq!(
        store
            .channel(&t, &name("root"), &kid.name)
            .unwrap()
            .unwrap()
            .status,
        Status::Ended(PARENT_DEAD)
    );
}

pub fn end_run_of_an_old_run_is_refused(store: &dyn Store) {
    let t = tenant("conf-oldrun");
    let a = running(store, &t, "a", None);
    end(store, &a, Terminal::Completed, Some("one"));
    let run2 = new_run();
    let a2 = store
        .resume(&t, &a.name, &run2, "sup-oldrun", now(), &[])
        .unwrap();
    start(store, &a2);
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.end_run(
        &t,
        &a.name,
        &a.run,
        &RunEnd {
            outcome: USER,
            exit_code: None,
            result: None,
            detail: None,
            now_ms: now(),
            output: None,
        },
        &[],
    ));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains(a.run.as_str()), "{msg}");
    assert_eq!(snapshot(store, &t), before);
}

pub fn mark_stopping_records_the_intent(store: &dyn Store) {
    let t = tenant("conf-markstop");
    running(store, &t, "root", None);
    running(store, &t, "run", Some("root"));
    let b = running(store, &t, "blk", Some("root"));
    store
        .set_status(&t, &b.name, Status::Blocked, None, now(), &[])
        .unwrap();
    let q = admit(store, &t, "que", Some("root"));
    let d = running(store, &t, "done", Some("root"));
    end(store, &d, Terminal::Completed, Some("x"));
    let s = running(store, &t, "stp", Some("root"));
    let timed_out = Terminal::Failed(FailReason::TimedOut);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), timed_out, now())
        .unwrap();

    let names: Vec<AgentName> = ["stp", "done", "que", "blk", "run"].map(name).to_vec();
    let at = now();
    let out = store.mark_stopping(&t, &names, PARENT_DEAD, at).unwrap();
    let got: Vec<(&str, Status)> = out.iter().map(|a| (a.name.as_str(), a.status)).collect();
    assert_eq!(
        got,
        vec![
            ("stp", Status::Stopping(timed_out)),
            ("done", Status::Ended(Terminal::Completed)),
            ("que", Status::Ended(PARENT_DEAD)),
            ("blk", Status::Stopping(PARENT_DEAD)),
            ("run", Status::Stopping(PARENT_DEAD)),
        ]
    );
    // The queued one never ran: its run is over now.
    let run = store.run(&t, &q.run).unwrap().unwrap();
    assert_eq!(
        (run.outcome, run.ended_ms, run.started_ms),
        (Some(PARENT_DEAD), Some(at), None)
    );
    for a in &out {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
    }
}

pub fn mark_stopping_with_an_unknown_name_changes_nothing(store: &dyn Store) {
    let t = tenant("conf-markstop-unknown");
    running(store, &t, "a", None);
    let before = snapshot(store, &t);
    let r = store.mark_stopping(&t, &[name("a"), name("ghost")], USER, now());
    match r {
        Err(StoreError::NotFound { tenant, name }) => {
            assert_eq!((tenant.as_str(), name.as_str()), (t.as_str(), "ghost"))
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert_eq!(snapshot(store, &t), before);
}

// ---- messages and resume --------------------------------------------------------

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

// ---- recovery -------------------------------------------------------------------

pub fn recover_ends_the_dead_supervisors_agents(store: &dyn Store) {
    let t = tenant("conf-recover");
    let dead = "sup-recover-dead".to_owned();
    let live = "sup-recover-live".to_owned();
    let on = |n: &str, parent: Option<&str>, sup: &str| {
        let new = new_agent(&t, n, parent, sup);
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    start(store, &on("root", None, &dead));
    on("q", Some("root"), &dead);
    start(store, &on("r", Some("root"), &dead));
    let b = start(store, &on("b", Some("root"), &dead));
    store
        .set_status(&t, &b.name, Status::Blocked, None, now(), &[])
        .unwrap();
    let s = start(store, &on("s", Some("root"), &dead));
    let timed_out = Terminal::Failed(FailReason::TimedOut);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), timed_out, now())
        .unwrap();
    let e = start(store, &on("e", Some("root"), &dead));
    end(store, &e, Terminal::Completed, Some("e"));
    let other = start(store, &on("other", None, &live));

    let sups = store.supervisors_with_unfinished().unwrap();
    assert!(sups.contains(&dead) && sups.contains(&live), "{sups:?}");
    let mut unfinished: Vec<String> = store
        .unfinished_of(std::slice::from_ref(&dead))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    unfinished.sort();
    assert_eq!(unfinished, ["b", "q", "r", "root", "s"]);

    let last_seq = all_events(store, &t).last().unwrap().seq;
    let at = now();
    let out = store.recover(std::slice::from_ref(&dead), at).unwrap();
    let mut got: Vec<(String, Status)> =
        out.iter().map(|a| (a.name.to_string(), a.status)).collect();
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        vec![
            ("b".into(), Status::Ended(RESTART)),
            ("q".into(), Status::Ended(RESTART)),
            ("r".into(), Status::Ended(RESTART)),
            ("root".into(), Status::Ended(RESTART)),
            ("s".into(), Status::Ended(timed_out)),
        ]
    );
    for a in &out {
        assert_eq!(get(store, &t, a.name.as_str()), *a);
        assert_eq!(a.updated_ms, at);
        let run = store.run(&t, &a.run).unwrap().unwrap();
        assert_eq!((run.outcome, run.ended_ms), (a.status.outcome(), Some(at)));
    }
    // One agent.stop per recovered agent, numbered after what was there.
    let stops: Vec<Event> = store.events(&t, last_seq, None, 100).unwrap();
    assert_eq!(stops.len(), out.len());
    for ev in &stops {
        assert_eq!(ev.kind, "agent.stop");
        let a = out.iter().find(|a| a.name == ev.agent).unwrap();
        let payload: serde_json::Value = serde_json::from_str(&ev.payload).unwrap();
        assert_eq!(payload["type"], "agent.stop");
        assert_eq!(payload["agent"], a.name.as_str());
        assert_eq!(payload["status"], a.status.outcome().unwrap().word());
        assert_eq!((ev.ts_ms, ev.run.as_ref()), (at, Some(&a.run)));
    }
    assert_eq!(
        stops.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (last_seq + 1..=last_seq + out.len() as i64).collect::<Vec<_>>()
    );

    // The live supervisor's agent and the finished one are untouched.
    assert_eq!(get(store, &t, "other"), other);
    assert_eq!(
        get(store, &t, "e").status,
        Status::Ended(Terminal::Completed)
    );
    let sups = store.supervisors_with_unfinished().unwrap();
    assert!(!sups.contains(&dead) && sups.contains(&live), "{sups:?}");
    assert!(
        store
            .unfinished_of(std::slice::from_ref(&dead))
            .unwrap()
            .is_empty()
    );
    // Recovering again finds nothing to do.
    assert!(store.recover(&[dead], now()).unwrap().is_empty());
}

// ---- usage and events -----------------------------------------------------------

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
    let a = admit(store, &t, "a", None);
    let b = admit(store, &t, "b", None);
    let mut evs = Vec::new();
    for i in 0..10 {
        let who = if i % 2 == 0 { &a } else { &b };
        evs.push(event(&who.name, None, &format!("k{i}")));
    }
    let at = now();
    let out = store.append_events(&t, &evs, at).unwrap();
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

// ---- listing and the tree -------------------------------------------------------

pub fn children_in_creation_order(store: &dyn Store) {
    let t = tenant("conf-children");
    running(store, &t, "root", None);
    for n in ["z", "m", "a"] {
        admit(store, &t, n, Some("root"));
    }
    let kids: Vec<String> = store
        .children(&t, &name("root"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(kids, ["z", "m", "a"]);
    assert!(store.children(&t, &name("z")).unwrap().is_empty());
    assert!(matches!(
        store.children(&t, &name("ghost")),
        Err(StoreError::NotFound { .. })
    ));
}

pub fn agents_lists_all_or_unfinished(store: &dyn Store) {
    let t = tenant("conf-agents");
    let r = running(store, &t, "r", None);
    admit(store, &t, "q", None);
    let d = running(store, &t, "d", None);
    end(store, &d, Terminal::Completed, None);
    let s = running(store, &t, "s", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), USER, now())
        .unwrap();
    let names = |all| -> Vec<String> {
        store
            .agents(&t, all)
            .unwrap()
            .into_iter()
            .map(|a| a.name.to_string())
            .collect()
    };
    assert_eq!(names(true), ["r", "q", "d", "s"]);
    assert_eq!(names(false), ["r", "q", "s"]);
    assert_eq!(store.agent(&t, &name("ghost")).unwrap(), None);
    assert_eq!(
        store.agent(&tenant("conf-agents-other"), &r.name).unwrap(),
        None
    );
}

/// Checks that every agent of `plan` comes after all of its own descendants, found
/// independently through `children`, and that the plan is exactly the subtree.
pub fn assert_post_order(store: &dyn Store, t: &TenantId, top: &AgentName, plan: &[Agent]) {
    let pos = |n: &AgentName| plan.iter().position(|a| a.name == *n);
    let mut all = Vec::new();
    let mut stack = vec![top.clone()];
    while let Some(n) = stack.pop() {
        for kid in store.children(t, &n).unwrap() {
            let (pk, pn) = (
                pos(&kid.name).expect("every descendant is planned"),
                pos(&n),
            );
            if let Some(pn) = pn {
                assert!(pk < pn, "{} must come before its ancestor {n}", kid.name);
            }
            all.push(kid.name.clone());
            stack.push(kid.name);
        }
    }
    // Transitively: a grandchild before its grandparent follows from the edges.
    assert_eq!(all.len(), plan.len(), "the plan is exactly the subtree");
}

pub fn descendants_are_in_post_order(store: &dyn Store) {
    let t = tenant("conf-descendants");
    running(store, &t, "root", None);
    running(store, &t, "a", Some("root"));
    running(store, &t, "b", Some("root"));
    running(store, &t, "a1", Some("a"));
    admit(store, &t, "a2", Some("a"));
    admit(store, &t, "b1", Some("b"));
    admit(store, &t, "a1x", Some("a1"));
    admit(store, &t, "a1y", Some("a1"));
    let plan = store.descendants_post_order(&t, &name("root")).unwrap();
    assert_eq!(plan.len(), 7);
    assert_post_order(store, &t, &name("root"), &plan);
    let names: Vec<&str> = plan.iter().map(|a| a.name.as_str()).collect();
    // Deepest first: level 3, then 2, then 1.
    assert_eq!(
        &names[..2]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        &["a1x", "a1y"].into()
    );
    assert_eq!(
        &names[5..]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        &["a", "b"].into()
    );
    let sub: Vec<String> = store
        .descendants_post_order(&t, &name("a1"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(sub.len(), 2);
    assert!(
        store
            .descendants_post_order(&t, &name("b1"))
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.descendants_post_order(&t, &name("ghost")),
        Err(StoreError::NotFound { .. })
    ));
    // The plan comes back as stored, statuses included.
    assert!(plan.iter().all(|a| *a == get(store, &t, a.name.as_str())));
}

// ---- budgets, leases, sweepers (SPEC 9) -------------------------------------------

pub fn spend_rolls_up_the_subtree(store: &dyn Store) {
    let t = tenant("conf-spend");
    let root = running(store, &t, "root", None);
    let a = running(store, &t, "a", Some("root"));
    let b = running(store, &t, "b", Some("a"));
    let c = running(store, &t, "c", Some("root"));
    store.record_usage(&t, &root.run, 1, 2, 0.25).unwrap();
    store.record_usage(&t, &a.run, 10, 20, 0.5).unwrap();
    store.record_usage(&t, &b.run, 100, 200, 1.0).unwrap();
    store.record_usage(&t, &c.run, 1000, 2000, 2.0).unwrap();
    // A finished descendant's spend still counts.
    end(store, &b, Terminal::Completed, Some("ok"));
    let s = store.spend(&t, &name("a")).unwrap();
    assert_eq!(
        s.own,
        Usage {
            tokens_in: 10,
            tokens_out: 20,
            cost_usd: 0.5
        }
    );
    assert_eq!(
        s.subtree,
        Usage {
            tokens_in: 110,
            tokens_out: 220,
            cost_usd: 1.5
        }
    );
    let s = store.spend(&t, &name("root")).unwrap();
    assert_eq!(s.own.cost_usd, 0.25);
    assert_eq!(
        s.subtree,
        Usage {
            tokens_in: 1111,
            tokens_out: 2222,
            cost_usd: 3.75
        }
    );
    // Every run of an agent counts, not only the newest.
    let b = get(store, &t, "b");
    let run2 = new_run();
    let b2 = store.resume(&t, &b.name, &run2, "sup", now(), &[]);
    // (resume needs a live parent; `a` is running)
    let b2 = b2.unwrap();
    start(store, &b2);
    store.record_usage(&t, &run2, 1, 1, 0.125).unwrap();
    assert_eq!(store.spend(&t, &name("b")).unwrap().own.cost_usd, 1.125);
    assert_eq!(
        store.spend(&t, &name("root")).unwrap().subtree.cost_usd,
        3.875
    );
    assert!(matches!(
        store.spend(&t, &name("nobody")),
        Err(StoreError::NotFound { .. })
    ));
}

/// SPEC 5's `create_limit`, counted by the store inside the admission: the
/// children the parent's current run created, finished ones included; a new
/// run of the parent starts a new count.
pub fn create_limit_is_counted_in_the_admission_transaction(store: &dyn Store) {
    let t = tenant("conf-create-limit");
    let q = Quotas::CEILINGS;
    let mut new = new_agent(&t, "p", None, "sup");
    new.spec = r#"{"argv":["x"],"policy":{"create_limit":3}}"#.to_owned();
    let p = store.admit_with_quotas(&new, &q, &[]).unwrap();
    let p = start(store, &p);
    let child = |n: &str| {
        let new = new_agent(&t, n, Some("p"), "sup");
        let events = spawn_events(&new);
        store.admit_with_quotas(&new, &q, &events)
    };
    for i in 0..3 {
        let c = start(store, &child(&format!("c{i}")).unwrap());
        // A finished child still counts against its parent's run.
        end(store, &c, Terminal::Completed, Some("ok"));
    }
    let before = snapshot(store, &t);
    let (code, msg) = refusal(child("c3"));
    assert_eq!(code, Code::CreateLimit, "{msg}");
    assert!(msg.contains("3 of its 3") && msg.contains("p"), "{msg}");
    assert_eq!(snapshot(store, &t), before, "nothing written: {msg}");
    // A new run of the parent has created nothing yet.
    end(store, &p, Terminal::Completed, Some("done"));
    let p2 = store
        .resume(&t, &name("p"), &new_run(), "sup", now(), &[])
        .unwrap();
    start(store, &p2);
    assert!(child("c3").is_ok());
}

pub fn lease_epochs_fence_old_holders(store: &dyn Store) {
    let t = tenant("conf-lease");
    let lease = "conf-lease-sweeper";
    assert_eq!(store.lease(lease).unwrap(), None);
    let first = store.acquire_lease(lease, "sup-a", now()).unwrap();
    let second = store.acquire_lease(lease, "sup-b", now()).unwrap();
    assert!(second.epoch > first.epoch, "{first:?} then {second:?}");
    assert_eq!(store.lease(lease).unwrap(), Some(second.clone()));
    let x = running(store, &t, "x", None);
    let before = snapshot(store, &t);
    // The old holder's writes are refused and change nothing.
    let (code, msg) = refusal(store.sweep_stop(
        &first,
        &t,
        std::slice::from_ref(&x.name),
        Terminal::Failed(FailReason::TimedOut),
        now(),
        &[event(&x.name, Some(&x.run), "agent.sweep")],
    ));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("fenced") && msg.contains("sup-b"), "{msg}");
    let end1 = RunEnd {
        outcome: Terminal::Failed(FailReason::Lost),
        exit_code: None,
        result: None,
        detail: Some("process gone".into()),
        now_ms: now(),
        output: None,
    };
    assert_eq!(
        refusal(store.sweep_end(&first, &t, &x.name, &end1, &[])).0,
        Code::Conflict
    );
    let nobody = Fence {
        lease: "conf-lease-never".into(),
        holder: "sup-a".into(),
        epoch: 1,
    };
    assert_eq!(
        refusal(store.sweep_end(&nobody, &t, &x.name, &end1, &[])).0,
        Code::Conflict
    );
    assert_eq!(snapshot(store, &t), before);
    // The holder's own writes go through.
    let stopped = store
        .sweep_stop(
            &second,
            &t,
            std::slice::from_ref(&x.name),
            Terminal::Failed(FailReason::TimedOut),
            now(),
            &[],
        )
        .unwrap();
    assert_eq!(
        stopped[0].status,
        Status::Stopping(Terminal::Failed(FailReason::TimedOut))
    );
    let y = running(store, &t, "y", None);
    let ended = store.sweep_end(&second, &t, &y.name, &end1, &[]).unwrap();
    assert_eq!(
        ended.status,
        Status::Ended(Terminal::Failed(FailReason::Lost))
    );
    assert_eq!(ended.detail.as_deref(), Some("process gone"));
}

pub fn overdue_runs_are_found_by_deadline(store: &dyn Store) {
    let t = tenant("conf-overdue");
    let mut new = new_agent(&t, "slow", None, "sup-overdue");
    new.spec = r#"{"argv":["/bin/true"],"policy":{"timeout_s":5}}"#.to_owned();
    let slow = store.admit(&new, &[]).unwrap();
    let started_at = now();
    store
        .start_run(&t, &slow.name, &slow.run, 1, "", started_at, &[])
        .unwrap();
    let _no_limit = running(store, &t, "free", None);
    let mine = |v: Vec<Agent>| -> Vec<String> {
        v.into_iter()
            .filter(|a| a.tenant == t)
            .map(|a| a.name.to_string())
            .collect()
    };
    assert!(mine(store.overdue(started_at + 4_999, 500).unwrap()).is_empty());
    assert_eq!(
        mine(store.overdue(started_at + 5_000, 500).unwrap()),
        ["slow"]
    );
    // Once stopping it is no longer the sweeper's business.
    store
        .mark_stopping(
            &t,
            std::slice::from_ref(&slow.name),
            Terminal::Failed(FailReason::TimedOut),
            now(),
        )
        .unwrap();
    assert!(mine(store.overdue(started_at + 60_000, 500).unwrap()).is_empty());
}

pub fn orphans_have_a_finished_or_missing_parent(store: &dyn Store) {
    let t = tenant("conf-orphans");
    let p = running(store, &t, "p", None);
    let _c = running(store, &t, "c", Some("p"));
    let _d = running(store, &t, "d", Some("c"));
    let q = running(store, &t, "q", None);
    let _e = running(store, &t, "e", Some("q"));
    let mine = |store: &dyn Store| -> Vec<String> {
        let mut v: Vec<String> = store
            .orphans(500)
            .unwrap()
            .into_iter()
            .filter(|a| a.tenant == t)
            .map(|a| a.name.to_string())
            .collect();
        v.sort();
        v
    };
    assert!(mine(store).is_empty());
    // A parent that ended without its children being stopped (a crash between
    // the two, or a hand edit): its live child is an orphan, the grandchild not.
    end(store, &p, Terminal::Completed, None);
    assert_eq!(mine(store), ["c"]);
    // A stopping child is not: its intent is recorded.
    store
        .mark_stopping(
            &t,
            &[name("c")],
            Terminal::Cancelled(CancelReason::ParentDead),
            now(),
        )
        .unwrap();
    assert!(mine(store).is_empty());
    // It is what its host reads each tick to carry the stop out.
    let host = format!("sup-{t}");
    let stopping: Vec<String> = store
        .stopping_of(&host)
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(stopping, ["c"]);
    let _ = q;
}
