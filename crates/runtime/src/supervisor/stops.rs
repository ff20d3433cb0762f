//! Stops (SPEC 6 "Parent death"): the intent recorded for every target, the
//! whole subtree signalled at once, its group emptied off the dispatcher
//! (SIGTERM, the grace, `cgroup.kill`, confirmed empty, removed; retried with
//! backoff when that fails, the agents staying `stopping`), the stopped
//! runs' `artifact/` emptied (they hand nothing back, issue 24), then the
//! records and events written in post-order.

use super::{Cmd, Collect, Dispatcher, ev, exit_code, now_ms};
use crate::objects::project_agent;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::CancelReason;
use brood_core::FailReason;
use brood_core::Terminal;
use brood_launch::cgroup::Cgroups;
use brood_launch::cgroup::Group;
use brood_proto::ToAgent;
use brood_store::Agent;
use brood_store::EndItem;
use brood_store::RunEnd;
use std::time::Duration;

/// One stop in flight: the targets in post-order with the outcome each gets, and
/// the group whose emptiness ends it.
pub(super) struct Stop {
    targets: Vec<(AgentName, Terminal)>,
    /// The group whose emptiness ends it, kept to retry when emptying fails.
    group: Option<Group>,
    /// Failed attempts at emptying it so far (the retry backs off).
    attempts: u32,
    /// A result to collect once the group is empty (the agent whose run ended
    /// with it heads the group; its descendants were the targets).
    then: Option<Box<Collect>>,
    /// Channels whose `artifact/` is emptied once the group is: the
    /// targets' (a stopped run hands nothing back), and that of a run which
    /// ended without a result and left these descendants.
    clear: Vec<super::disk::ToClear>,
}

/// SIGTERM (when `term`) to every process of the group's subtree, up to `grace`
/// for them to go, then `cgroup.kill`, confirm empty, remove.
pub(super) async fn empty_group(
    cg: &Cgroups,
    g: &Group,
    grace: Duration,
    term: bool,
) -> Result<(), String> {
    if !g.dir.exists() {
        // Already removed (with its parent's group, or by the supervisor's shutdown).
        return Ok(());
    }
    if term {
        cg.signal(g, libc::SIGTERM).map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + grace;
        let mut step = Duration::from_millis(1);
        while cg.is_populated(g).map_err(|e| e.to_string())? {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(step).await;
            step = (step * 2).min(Duration::from_millis(2));
        }
    }
    if cg.is_populated(g).map_err(|e| e.to_string())? {
        cg.kill(g).map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut step = Duration::from_micros(200);
        while cg.is_populated(g).map_err(|e| e.to_string())? {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{} still populated 5 s after cgroup.kill",
                    g.dir.display()
                ));
            }
            tokio::time::sleep(step).await;
            step = (step * 2).min(Duration::from_millis(2));
        }
    }
    cg.remove(g).map_err(|e| e.to_string())
}

impl Dispatcher {
    pub(super) fn remove_group(&self, group: Option<Group>) {
        self.remove_group_then_clear(group, None);
    }

    /// [`Self::remove_group`], then (the group empty) the `artifact/` of
    /// `clear`, a channel whose run recorded no result. Without cgroups it
    /// is emptied at once: the run's process has exited, and that weaker
    /// mode cannot see the rest (docs/decisions/containment.md "Nothing of a
    /// refused or stopped result is left behind").
    pub(super) fn remove_group_then_clear(
        &self,
        group: Option<Group>,
        clear: Option<super::disk::ToClear>,
    ) {
        let (Some(g), Some(cg)) = (group, self.launcher.cgroups.clone()) else {
            if let Some(dir) = clear {
                tokio::spawn(super::disk::clear_channels(vec![dir]));
            }
            return;
        };
        let grace = self.host.cfg.grace;
        tokio::spawn(async move {
            match empty_group(&cg, &g, grace, false).await {
                Ok(()) => super::disk::clear_channels(clear.into_iter().collect()).await,
                // Not emptied: what it left stays for `brood fsck`, which
                // runs once nothing of it lives.
                Err(e) => {
                    tracing::error!(group = %g.dir.display(), error = %e, "removing a cgroup failed")
                }
            }
        });
    }

    /// Parent death (SPEC 6 steps 1-5) for the descendants of an agent whose run
    /// already ended (its own record is written: that is the recorded intent).
    /// `clear`: the parent's own channel, when its run recorded no result.
    pub(super) fn stop_descendants(
        &mut self,
        parent: &AgentName,
        group: Option<Group>,
        clear: Option<super::disk::ToClear>,
    ) {
        let plan = match self
            .records
            .store
            .descendants_post_order(&self.records.tenant, parent)
        {
            Ok(p) => p,
            Err(e) => {
                // A planning error changes nothing (step 2); the orphan sweeper
                // of a later version retries.
                tracing::error!(agent = %parent, error = %e, "planning a cascade failed");
                return;
            }
        };
        let targets: Vec<(AgentName, Terminal)> = plan
            .into_iter()
            .filter(|a| !a.status.is_finished())
            .map(|a| (a.name, Terminal::Cancelled(CancelReason::ParentDead)))
            .collect();
        self.begin_stop_clearing(targets, group, None, clear.into_iter().collect());
    }

    /// Stops an agent and its whole subtree: the agent with `outcome`, every
    /// descendant with `parent_dead`.
    pub(super) fn stop_subtree(&mut self, name: &AgentName, outcome: Terminal) {
        let plan = match self
            .records
            .store
            .descendants_post_order(&self.records.tenant, name)
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(agent = %name, error = %e, "planning a stop failed");
                return;
            }
        };
        let mut targets: Vec<(AgentName, Terminal)> = plan
            .into_iter()
            .filter(|a| !a.status.is_finished())
            .map(|a| (a.name, Terminal::Cancelled(CancelReason::ParentDead)))
            .collect();
        targets.push((name.clone(), outcome));
        let group = self.agents.live.get(name).and_then(|l| l.group.clone());
        self.begin_stop(targets, group);
    }

    /// Records the intent for every target, signals the whole subtree at once, and
    /// hands the waiting and killing to a task that reports `StopDone`.
    pub(super) fn begin_stop(&mut self, targets: Vec<(AgentName, Terminal)>, group: Option<Group>) {
        self.begin_stop_then(targets, group, None);
    }

    /// [`Self::begin_stop`], then the collection of a result once the group
    /// is empty.
    pub(super) fn begin_stop_then(
        &mut self,
        targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
        then: Option<Box<Collect>>,
    ) {
        self.begin_stop_clearing(targets, group, then, Vec::new());
    }

    /// [`Self::begin_stop_then`], emptying `also` (besides the targets'
    /// channels) once the group is empty.
    pub(super) fn begin_stop_clearing(
        &mut self,
        mut targets: Vec<(AgentName, Terminal)>,
        group: Option<Group>,
        then: Option<Box<Collect>>,
        also: Vec<super::disk::ToClear>,
    ) {
        // An agent whose end is being recorded (`ends_writer`) is ending
        // already: no stop of it is recorded or carried out.
        targets.retain(|(n, _)| !self.ends_writer.in_flight(n));
        let id = self.id();
        // Agents hosted by another supervisor sharing the store get the intent
        // recorded here, like every target; their host sees it on its next tick
        // and carries it out (it alone can signal them and knows when they are
        // gone), so they are not this stop's to finish.
        let mut remote = std::collections::HashSet::new();
        let now = now_ms();
        // The intent first (one transaction per outcome; in practice one or two).
        let mut by_outcome: Vec<(Terminal, Vec<AgentName>)> = Vec::new();
        for (n, t) in &targets {
            match by_outcome.iter_mut().find(|(o, _)| o == t) {
                Some((_, v)) => v.push(n.clone()),
                None => by_outcome.push((*t, vec![n.clone()])),
            }
        }
        // The top of the stop (last in post-order) is recorded first.
        by_outcome.reverse();
        for (t, names) in &by_outcome {
            match self
                .records
                .store
                .mark_stopping(&self.records.tenant, names, *t, now)
            {
                Ok(agents) => {
                    for a in agents {
                        if a.supervisor != self.host.me && !self.agents.live.contains_key(&a.name) {
                            remote.insert(a.name.clone());
                            continue;
                        }
                        let pid = self.agents.live.get(&a.name).and_then(|l| l.pid);
                        project_agent(&self.records.projection, &self.host.paths, &a, pid);
                        self.records.project_channel(&self.agents, &a, None);
                    }
                }
                Err(e) => tracing::error!(error = %e, "recording a stop failed"),
            }
        }
        targets.retain(|(n, _)| !remote.contains(n));
        let mut pgids = Vec::new();
        for (n, t) in &targets {
            if let Some(l) = self.agents.live.get_mut(n) {
                l.stopping = Some(id);
                // A stopped run calls no model: its gateway's connections
                // are cut now, not when its group is empty (issue 31).
                l.gateway = None;
                if l.pid.is_none() {
                    l.cancelled_before_start = true;
                }
                if let Some(p) = l.pid {
                    pgids.push(p);
                }
            }
            self.sockets.close(n);
            let reason = t.reason().unwrap_or("stopped").to_owned();
            self.agents.to_agent(n, &ToAgent::Cancel { reason });
        }
        if let Some(c) = &then
            && let Some(p) = self.agents.live.get(&c.ending.name).and_then(|l| l.pid)
        {
            // Without cgroups, what the collected agent left behind is in its
            // own process group.
            pgids.push(p);
        }
        let mut clear = super::disk::channels_of(&self.agents, &self.host.paths, &targets);
        clear.extend(also);
        self.stops.insert(
            id,
            Stop {
                targets,
                group: group.clone(),
                attempts: 0,
                then,
                clear: clear.clone(),
            },
        );
        self.empty_for_stop(id, group, pgids, true, Duration::ZERO, clear);
    }

    /// Empties a stop's group (SIGTERM first when `term`, then the grace,
    /// `cgroup.kill`, confirmed empty, removed) after `delay`, off the
    /// dispatcher, then the `artifact/` of `clear`, and reports `StopDone`
    /// with the outcome: by the time the ends are recorded, nothing the
    /// stopped runs wrote there is left.
    pub(super) fn empty_for_stop(
        &self,
        id: u64,
        group: Option<Group>,
        pgids: Vec<i32>,
        term: bool,
        delay: Duration,
        clear: Vec<super::disk::ToClear>,
    ) {
        let cg = self.launcher.cgroups.clone();
        let tx = self.host.tx.clone();
        let grace = self.host.cfg.grace;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let t_sig = std::time::Instant::now();
            let mut emptied: Result<(), String> = Ok(());
            match (cg, group) {
                (Some(cg), Some(g)) => {
                    if let Err(e) = empty_group(&cg, &g, grace, term).await {
                        tracing::error!(group = %g.dir.display(), error = %e, "emptying a cgroup failed");
                        emptied = Err(e);
                    }
                }
                _ => {
                    // Without cgroups: process groups only (weaker; see doctor).
                    for p in &pgids {
                        // SAFETY: signalling a process group we created.
                        unsafe { libc::killpg(*p, libc::SIGTERM) };
                    }
                    // The grace ends early once every group is gone (signal 0
                    // probes without sending).
                    // SAFETY (both closures' calls): as above.
                    let any_left = || pgids.iter().any(|p| unsafe { libc::killpg(*p, 0) } == 0);
                    let deadline = tokio::time::Instant::now() + grace;
                    while any_left() && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for p in &pgids {
                        // SAFETY: as above.
                        unsafe { libc::killpg(*p, libc::SIGKILL) };
                    }
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                    while any_left() && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if any_left() {
                        // A member may be a zombie not yet reaped by whoever
                        // adopted it: warn, as this weaker mode can only.
                        tracing::warn!(
                            ?pgids,
                            "process groups still have members 5 s after SIGKILL"
                        );
                    }
                }
            }
            tracing::debug!(
                elapsed_us = t_sig.elapsed().as_micros() as u64,
                "stop: group emptied"
            );
            if emptied.is_ok() {
                super::disk::clear_channels(clear).await;
            }
            let _ = tx.send(Cmd::StopDone(id, emptied));
        });
    }

    /// Every process of a stop is gone (or the group could not be emptied):
    /// write the records, then collect a result waiting on it.
    pub(super) fn on_stop_done(&mut self, id: u64, emptied: Result<(), String>) {
        if let Err(e) = emptied {
            return self.retry_stop(id, e);
        }
        let Some(mut stop) = self.stops.remove(&id) else {
            return;
        };
        crate::room::give_back(&mut self.stops);
        let then = stop.then.take();
        self.record_stop(stop);
        // The result's agent may have been stopped meanwhile (cancelled): that
        // stop records its end, and nothing is collected.
        if let Some(c) = then
            && self
                .agents
                .live
                .get(&c.ending.name)
                .is_some_and(|l| l.run == c.ending.run && l.stopping.is_none())
        {
            self.collect(*c);
        }
    }

    /// A stop whose group could not be confirmed empty: nothing is recorded
    /// as ended while a process of it may live. Its agents stay `stopping`
    /// (the intent is recorded) and the emptying is tried again, backing off
    /// from 100 ms to 10 s. A result that was waiting on it is not read: that
    /// agent joins the stop, to end `failed` naming why once it is empty.
    pub(super) fn retry_stop(&mut self, id: u64, error: String) {
        let Some(mut stop) = self.stops.remove(&id) else {
            return;
        };
        stop.attempts += 1;
        tracing::error!(
            stop = id,
            attempt = stop.attempts,
            error = %error,
            "a stop's group could not be confirmed empty: its agents stay stopping, retrying"
        );
        if let Some(c) = stop.then.take() {
            let outcome = Terminal::Failed(FailReason::ProtocolError);
            if let Err(e) = self.records.store.mark_stopping(
                &self.records.tenant,
                std::slice::from_ref(&c.ending.name),
                outcome,
                now_ms(),
            ) {
                tracing::error!(agent = %c.ending.name, error = %e, "recording a stop failed");
            }
            if let Some(l) = self.agents.live.get_mut(&c.ending.name) {
                l.stopping = Some(id);
                l.protocol_error = Some(format!(
                    "result not collected: its group could not be emptied first: {error}"
                ));
            }
            stop.targets.push((c.ending.name.clone(), outcome));
        }
        let delay =
            Duration::from_millis(100u64 << stop.attempts.min(7)).min(Duration::from_secs(10));
        let group = stop.group.clone();
        let clear = stop.clear.clone();
        self.stops.insert(id, stop);
        self.empty_for_stop(id, group, Vec::new(), false, delay, clear);
    }

    /// Every process of a stop is gone: write the records and the event pairs in
    /// post-order (SPEC 6 steps 4 and 5).
    pub(super) fn record_stop(&mut self, stop: Stop) {
        let t0 = std::time::Instant::now();
        let now = now_ms();
        let mut items = Vec::with_capacity(stop.targets.len());
        let mut results = Vec::with_capacity(stop.targets.len());
        for (name, outcome) in &stop.targets {
            if *outcome == Terminal::Cancelled(CancelReason::ParentDead) {
                self.host.metrics.cascade_termination();
            }
            let Ok(Some(a)) = self.records.store.agent(&self.records.tenant, name) else {
                continue;
            };
            let live = self.agents.live.get(name);
            let parent_session = match (&a.parent, live.and_then(|l| l.parent_session.clone())) {
                (Some(p), Some(ps)) => Some((p.clone(), ps)),
                (Some(p), None) => self
                    .records
                    .store
                    .agent(&self.records.tenant, p)
                    .ok()
                    .flatten()
                    .map(|pa| (pa.name, pa.session)),
                (None, _) => None,
            };
            let mut events = Vec::new();
            // A stop always has a reason (a completed run is not stopped).
            if let Some((p, ps)) = &parent_session
                && outcome.reason().is_some()
            {
                let (parent, child) = (p.clone(), name.clone());
                let e = match *outcome {
                    Terminal::Cancelled(reason) => AgentEvent::ChildCancel {
                        parent,
                        child,
                        reason,
                    },
                    outcome => AgentEvent::ChildStop {
                        parent,
                        child,
                        outcome,
                    },
                };
                events.push(ev(p, None, ps, e));
            }
            events.push(ev(
                name,
                Some(&a.run),
                &a.session,
                AgentEvent::Stop {
                    agent: name.clone(),
                    outcome: *outcome,
                    swept: None,
                },
            ));
            let protocol_error = live.and_then(|l| l.protocol_error.clone());
            let budget_note = live.and_then(|l| l.budget_note.clone());
            let result = match outcome {
                Terminal::Cancelled(CancelReason::ParentDead) => Some(format!(
                    "cancelled: parent {} stopped (parent_dead)\n",
                    a.parent.as_ref().map(|p| p.as_str()).unwrap_or("?")
                )),
                Terminal::Cancelled(r) => Some(format!("cancelled ({})\n", r.as_str())),
                Terminal::Failed(FailReason::ProtocolError) => protocol_error
                    .as_ref()
                    .map(|e| format!("failed: protocol error: {e}\n")),
                Terminal::Failed(FailReason::BudgetExceeded) => {
                    budget_note.as_ref().map(|n| format!("failed: {n}\n"))
                }
                _ => None,
            };
            // Queued when the stop came: its record already ended with the intent.
            let end = (!a.status.is_finished()).then(|| RunEnd {
                outcome: *outcome,
                exit_code: live.and_then(|l| l.exit).and_then(exit_code),
                result: result.clone(),
                detail: protocol_error.or(budget_note),
                now_ms: now,
                output: None,
            });
            items.push(EndItem {
                name: name.clone(),
                run: a.run.clone(),
                end,
                events,
                now_ms: now,
            });
            results.push(result);
        }
        // One transaction for the whole stop, written in post-order.
        let recorded: Vec<Option<Agent>> = match self
            .records
            .store
            .end_runs(&self.records.tenant, &items)
        {
            Ok(agents) => agents.into_iter().map(Some).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "recording a stop in one transaction failed; one by one");
                items
                    .iter()
                    .map(|it| {
                        self.records.store
                            .end_runs(&self.records.tenant, std::slice::from_ref(it))
                            .map_err(|e| tracing::error!(agent = %it.name, error = %e, "recording a stopped agent failed"))
                            .ok()
                            .and_then(|mut v| v.pop())
                    })
                    .collect()
            }
        };
        // All files first, then the notifications: a waiter told about the first
        // record must find every file of the stop once it flushes.
        for ((it, result), agent) in items.iter().zip(&results).zip(&recorded) {
            if let Some(a) = agent {
                self.records.project_events(&it.events);
                self.project_end(a, result.as_deref(), None);
            }
        }
        for ((it, result), agent) in items.iter().zip(&results).zip(recorded) {
            if let Some(a) = agent {
                self.notify_end(&a, result.as_deref(), None);
            }
            if let Some(l) = self.agents.live.get(&it.name)
                && l.pid.is_none()
                && l.cancelled_before_start
                && l.launching
            {
                // Its launch is still in flight: keep the entry so the launch result
                // finds it and kills what started.
                continue;
            }
            self.forget(&it.name);
        }
        tracing::debug!(
            targets = items.len(),
            elapsed_us = t0.elapsed().as_micros() as u64,
            "stop recorded"
        );
    }
}
