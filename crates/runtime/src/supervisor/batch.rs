//! Creations that arrive together are admitted together, and the starts and
//! ends of processes that arrive together are recorded together (issue 27).
//! The loop takes, with a creation (a start, an exit), those of its kind
//! queued right behind it, works out each (reads only), then has the store
//! record them all at once instead of one transaction after another: the
//! admissions as one group commit (`Store::admit_all_with_quotas`: on
//! PostgreSQL a few set-based statements for the lot), the starts in one
//! transaction (`Store::start_runs`), the ends in one (`Store::end_runs`).
//! What follows each (the projection, the live entry, the queue for a slot,
//! the answer, the parent told) is done in arrival order, as for one.
//!
//! A batch holds only creations that cannot see each other: decisions read
//! the loop's state and the store before anything of the batch is written,
//! so two creations under one parent (its `create_limit`, its budget), a
//! creation under another of the batch, two asking for one name, or one
//! naming a customer, each start a batch of their own. The store's
//! transaction checks the quotas either way.

use brood_core::{AgentName, RunId};
use std::collections::HashSet;

use brood_launch::{LaunchError, Launched};
use brood_store::EndItem;
use tokio::sync::mpsc;

use super::launch::{Made, Starting};
use super::{AgentEv, Cmd, Dispatcher, Reply, answer};
use crate::api::{ApiError, Caller, SpawnRequest, internal};

/// The most creations admitted together: enough for a burst of clients, few
/// enough that the first does not wait long for the last.
pub(super) const MAX_BATCH: usize = 64;

/// One creation of a batch, as it came to the loop.
pub(super) struct Spawn {
    pub(super) caller: Caller,
    pub(super) req: SpawnRequest,
    pub(super) reply: Reply<brood_api::Agent>,
}

impl Spawn {
    /// Who the new agent's parent is asked to be.
    fn parent(&self) -> Option<&AgentName> {
        match &self.caller {
            Caller::Agent(me) => Some(me),
            Caller::User { .. } => self.req.parent.as_ref(),
        }
    }
}

/// A spawner's answer: the process of a run (or why it did not start).
pub(super) struct Launch {
    name: AgentName,
    run: RunId,
    result: Result<Launched, LaunchError>,
    made: Made,
}

/// A process that exited: its agent, run and wait status.
pub(super) struct Exit {
    name: AgentName,
    run: RunId,
    status: i32,
}

/// What the loop does next: a batch, or one command.
pub(super) enum Work {
    Spawns(Vec<Spawn>),
    Starts(Vec<Launch>),
    Exits(Vec<Exit>),
    One(Cmd),
}

/// `first` and the commands of its kind queued right behind it that may go
/// with it, and the first that may not (the next to do). Nothing new is
/// admitted together while shutting down.
pub(super) fn gather(
    first: Cmd,
    rx: &mut mpsc::UnboundedReceiver<Cmd>,
    shutting_down: bool,
) -> (Work, Option<Cmd>) {
    match first {
        Cmd::Spawn(caller, req, reply) if !shutting_down => {
            let mut spawns = vec![Spawn {
                caller,
                req: *req,
                reply,
            }];
            while let Ok(c) = rx.try_recv() {
                let Cmd::Spawn(caller, req, reply) = c else {
                    return (Work::Spawns(spawns), Some(c));
                };
                let s = Spawn {
                    caller,
                    req: *req,
                    reply,
                };
                if !joins(&spawns, &s) {
                    let next = Cmd::Spawn(s.caller, Box::new(s.req), s.reply);
                    return (Work::Spawns(spawns), Some(next));
                }
                spawns.push(s);
            }
            (Work::Spawns(spawns), None)
        }
        Cmd::Launched(name, run, result, made) => {
            let mut starts = vec![Launch {
                name,
                run,
                result,
                made: *made,
            }];
            while starts.len() < MAX_BATCH
                && let Ok(c) = rx.try_recv()
            {
                let Cmd::Launched(name, run, result, made) = c else {
                    return (Work::Starts(starts), Some(c));
                };
                starts.push(Launch {
                    name,
                    run,
                    result,
                    made: *made,
                });
            }
            (Work::Starts(starts), None)
        }
        Cmd::Agent(name, run, AgentEv::Exited { status }) => {
            let mut exits = vec![Exit { name, run, status }];
            while exits.len() < MAX_BATCH
                && let Ok(c) = rx.try_recv()
            {
                let Cmd::Agent(name, run, AgentEv::Exited { status }) = c else {
                    return (Work::Exits(exits), Some(c));
                };
                exits.push(Exit { name, run, status });
            }
            (Work::Exits(exits), None)
        }
        cmd => (Work::One(cmd), None),
    }
}

/// Whether `next` may be admitted together with `batch` (module docs).
pub(super) fn joins(batch: &[Spawn], next: &Spawn) -> bool {
    if batch.len() >= MAX_BATCH || next.req.customer.is_some() {
        return false;
    }
    let parent = next.parent();
    let name = next.req.name.as_ref();
    batch.iter().all(|s| {
        let (p, n) = (s.parent(), s.req.name.as_ref());
        let same_parent = parent.is_some() && p == parent;
        let under_it = parent.is_some() && n == parent;
        let over_it = name.is_some() && p == name;
        let same_name = name.is_some() && n == name;
        !(same_parent || under_it || over_it || same_name)
    })
}

impl Dispatcher {
    /// Admits a batch (see [`joins`]): decided one by one, recorded by the
    /// store together, followed up in arrival order.
    pub(super) fn on_spawns(&mut self, batch: Vec<Spawn>) {
        if batch.len() == 1 {
            for s in batch {
                self.on_spawn(s.caller, s.req, s.reply);
            }
            return;
        }
        let mut decided = Vec::with_capacity(batch.len());
        for s in batch {
            if self.agents.tool_granted(&s.caller, "create").is_ok()
                && let Some(child) = self.created_before(&s.caller, &s.req)
            {
                answer(s.reply, Ok(child));
                continue;
            }
            let d = self
                .agents
                .tool_granted(&s.caller, "create")
                .and_then(|()| self.decide(&s.caller, &s.req));
            match d {
                Ok(d) => decided.push((s, d)),
                Err(e) => self.refuse_spawn(s, e),
            }
        }
        if decided.is_empty() {
            return;
        }
        // The tenant's overrides, read once for the batch.
        let quotas = match self.tenant_quotas() {
            Ok(q) => q,
            Err(e) => {
                for (s, _) in decided {
                    self.refuse_spawn(s, e.clone());
                }
                return;
            }
        };
        self.launcher.max_concurrent = quotas.max_concurrent;
        tracing::debug!(n = decided.len(), "admitting creations together");
        let records: Vec<_> = decided
            .iter()
            .map(|(_, d)| (&d.new, d.events.as_slice()))
            .collect();
        let recorded = self.records.store.admit_all_with_quotas(&records, &quotas);
        for ((s, d), r) in decided.into_iter().zip(recorded) {
            let parent = s.parent().cloned();
            let requested = s.req.name.as_ref().map(|n| n.to_string());
            let r = r.map_err(internal);
            match r.and_then(|agent| self.record_admission(d, s.req, agent)) {
                Ok(admitted) => self.answer_spawn(admitted, s.reply),
                Err(e) => {
                    self.note_refusal(parent.as_ref(), requested.as_deref(), &e);
                    answer(s.reply, Err(e));
                }
            }
        }
    }

    /// Starts answered by the spawner: each taken up, their records written
    /// together, what follows each in order.
    pub(super) fn on_launches(&mut self, starts: Vec<Launch>) {
        let starting: Vec<Starting> = starts
            .into_iter()
            .filter_map(|l| self.launch_begins(l.name, l.run, l.result, l.made))
            .collect();
        let items: Vec<_> = starting.iter().map(|s| s.item(&self.host.me)).collect();
        let recorded = self.records.store.start_runs(&self.records.tenant, &items);
        for (s, r) in starting.into_iter().zip(recorded) {
            self.launch_started(s, r);
        }
    }

    /// Processes that exited together: each end worked out as alone, the
    /// ends recorded in one transaction (`Store::end_runs`), what follows
    /// each in order. An exit whose agent is the parent or a child of
    /// another in the batch is handled alone, after the ones before it are
    /// recorded: what follows an end (its descendants stopped) must see the
    /// others' records as they would be had each come alone.
    pub(super) fn on_exits(&mut self, exits: Vec<Exit>) {
        let names: HashSet<AgentName> = exits.iter().map(|e| e.name.clone()).collect();
        let parent_of =
            |d: &Dispatcher, n: &AgentName| d.agents.live.get(n).and_then(|l| l.parent.clone());
        let parents: HashSet<AgentName> = names.iter().filter_map(|n| parent_of(self, n)).collect();
        self.ends_together = Some(Vec::new());
        for e in exits {
            let related = parents.contains(&e.name)
                || parent_of(self, &e.name).is_some_and(|p| names.contains(&p));
            if related {
                self.record_ends_together();
                self.ends_together = None;
                self.on_agent(e.name, e.run, AgentEv::Exited { status: e.status });
                self.ends_together = Some(Vec::new());
            } else {
                self.on_agent(e.name, e.run, AgentEv::Exited { status: e.status });
            }
        }
        self.record_ends_together();
        self.ends_together = None;
    }

    /// The ends waiting in `ends_together`, recorded in one transaction and
    /// followed up in order; if that transaction fails, each alone.
    fn record_ends_together(&mut self) {
        let Some(ends) = self.ends_together.replace(Vec::new()) else {
            return;
        };
        if ends.is_empty() {
            return;
        }
        let items: Vec<EndItem> = ends
            .iter()
            .map(|e| EndItem {
                name: e.name.clone(),
                run: e.run.clone(),
                end: Some(e.end.clone()),
                events: e.events.clone(),
                now_ms: e.end.now_ms,
            })
            .collect();
        match self.records.store.end_runs(&self.records.tenant, &items) {
            Ok(agents) if agents.len() == ends.len() => {
                for (e, a) in ends.into_iter().zip(agents) {
                    self.finish_recorded(e, Ok(a));
                }
            }
            r => {
                if let Err(err) = &r {
                    tracing::warn!(error = %err, n = ends.len(), "recording ends together failed; each alone");
                }
                for e in ends {
                    let r = e.record(self.records.store.as_ref(), &self.records.tenant);
                    self.finish_recorded(e, r);
                }
            }
        }
    }

    /// A creation refused before anything was written.
    fn refuse_spawn(&mut self, s: Spawn, e: ApiError) {
        let requested = s.req.name.as_ref().map(|n| n.to_string());
        self.note_refusal(s.parent(), requested.as_deref(), &e);
        answer(s.reply, Err(e));
    }
}
