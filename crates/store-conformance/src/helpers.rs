//! Building blocks of the cases: names, clocks, agents admitted, started and ended, refusals and snapshots.

use crate::*;

pub(crate) static CLOCK: AtomicI64 = AtomicI64::new(1_700_000_000_000);
pub(crate) static RUNS: AtomicU64 = AtomicU64::new(1);

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

pub(crate) fn terminals() -> Vec<Terminal> {
    let mut v = vec![Terminal::Completed];
    v.extend(FailReason::ALL.map(Terminal::Failed));
    v.extend(CancelReason::ALL.map(Terminal::Cancelled));
    v
}

pub(crate) fn all_statuses() -> Vec<Status> {
    let mut v = vec![Status::Queued, Status::Running, Status::Blocked];
    for t in terminals() {
        v.extend([Status::Stopping(t), Status::Ended(t), Status::Closed(t)]);
    }
    v
}

pub(crate) const USER: Terminal = Terminal::Cancelled(CancelReason::User);
pub(crate) const PARENT_DEAD: Terminal = Terminal::Cancelled(CancelReason::ParentDead);
pub(crate) const RESTART: Terminal = Terminal::Cancelled(CancelReason::RuntimeRestart);
