//! A stop whose group is empty: its records and events written in
//! post-order, then its ends projected and told (as follow-ups); and a stop
//! whose group could not be confirmed empty, tried again.

use std::time::Duration;

use brood_core::AgentEvent;
use brood_core::CancelReason;
use brood_core::FailReason;
use brood_core::Terminal;
use brood_store::Agent;
use brood_store::EndItem;
use brood_store::RunEnd;

use super::{Env, Next, Step, Stop, StopFollow, Stops};
use crate::supervisor::{ev, exit_code, now_ms};

impl Stops {
    /// Every process of a stop is gone (or the group could not be emptied):
    /// write the records, then collect a result waiting on it.
    pub(in crate::supervisor) fn done(
        &mut self,
        id: u64,
        emptied: Result<(), String>,
        env: &mut Env<'_>,
    ) -> Vec<StopFollow> {
        if let Err(e) = emptied {
            self.retry(id, e, env);
            return Vec::new();
        }
        let Some(mut stop) = self.stops.remove(&id) else {
            return Vec::new();
        };
        crate::room::give_back(&mut self.stops);
        let then = stop.then.take();
        let slots = stop.slots;
        let mut follows = self.record(stop, env);
        if slots > 0 {
            follows.push(StopFollow::Emptied(slots));
        }
        if let Some(c) = then {
            follows.push(StopFollow::Then(Step(Next::Collect(c))));
        }
        follows
    }

    /// A stop whose group could not be confirmed empty: nothing is recorded
    /// as ended while a process of it may live. Its agents stay `stopping`
    /// (the intent is recorded) and the emptying is tried again, backing off
    /// from 100 ms to 10 s. A result that was waiting on it is not read: that
    /// agent joins the stop, to end `failed` naming why once it is empty.
    fn retry(&mut self, id: u64, error: String, env: &mut Env<'_>) {
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
            if let Err(e) = env.records.store.mark_stopping(
                &env.records.tenant,
                std::slice::from_ref(&c.ending.name),
                outcome,
                now_ms(),
            ) {
                tracing::error!(agent = %c.ending.name, error = %e, "recording a stop failed");
            }
            if let Some(l) = env.agents.live.get_mut(&c.ending.name) {
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
        self.empty(id, group, Vec::new(), false, delay, clear);
    }

    /// Every process of a stop is gone: write the records and the event pairs in
    /// post-order (SPEC 6 steps 4 and 5); what follows each end (its files,
    /// then who is told, then the live entry forgotten) comes back in order.
    fn record(&self, stop: Stop, env: &mut Env<'_>) -> Vec<StopFollow> {
        let t0 = std::time::Instant::now();
        let now = now_ms();
        let mut items = Vec::with_capacity(stop.targets.len());
        let mut results = Vec::with_capacity(stop.targets.len());
        // Targets whose record could not be read: nothing is recorded for
        // them here, but their live entries go all the same (issue 28: an
        // error is never a fact). Kept, an entry marked stopping by a stop
        // that is over would wait for ever (the fault campaign's node that
        // never finished its shutdown); gone, its record, still `stopping`,
        // is ended by the node's check of records no live agent accounts
        // for, as a stopped agent whose end failed to record is.
        let mut unread = Vec::new();
        for (name, outcome) in &stop.targets {
            if *outcome == Terminal::Cancelled(CancelReason::ParentDead) {
                env.metrics.cascade_termination();
            }
            let a = match env.records.store.agent(&env.records.tenant, name) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    unread.push(name.clone());
                    continue;
                }
                Err(e) => {
                    tracing::error!(agent = %name, error = %e, "reading a stopped agent failed; its end is recorded when the store is back");
                    unread.push(name.clone());
                    continue;
                }
            };
            let live = env.agents.live.get(name);
            let parent_session = match (&a.parent, live.and_then(|l| l.parent_session.clone())) {
                (Some(p), Some(ps)) => Some((p.clone(), ps)),
                (Some(p), None) => env
                    .records
                    .store
                    .agent(&env.records.tenant, p)
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
        let recorded: Vec<Option<Agent>> = match env
            .records
            .store
            .end_runs(&env.records.tenant, &items)
        {
            Ok(agents) => agents.into_iter().map(Some).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "recording a stop in one transaction failed; one by one");
                items
                    .iter()
                    .map(|it| {
                        env.records.store
                            .end_runs(&env.records.tenant, std::slice::from_ref(it))
                            .map_err(|e| tracing::error!(agent = %it.name, error = %e, "recording a stopped agent failed"))
                            .ok()
                            .and_then(|mut v| v.pop())
                    })
                    .collect()
            }
        };
        let targets = items.len();
        let mut follows = Vec::with_capacity(3 * targets + 1);
        let mut told = Vec::with_capacity(targets);
        // All files first, then the notifications: a waiter told about the first
        // record must find every file of the stop once it flushes.
        for ((it, result), agent) in items.into_iter().zip(results).zip(recorded) {
            let end = agent.map(|a| {
                follows.push(StopFollow::ProjectEnd {
                    events: it.events,
                    agent: a.clone(),
                    result: result.clone(),
                });
                (a, result)
            });
            told.push((it.name, end));
        }
        for (name, end) in told {
            if let Some((agent, result)) = end {
                follows.push(StopFollow::NotifyEnd { agent, result });
            }
            follows.push(StopFollow::Then(Step(Next::Forget(name))));
        }
        for name in unread {
            follows.push(StopFollow::Then(Step(Next::Forget(name))));
        }
        follows.push(StopFollow::Then(Step(Next::Recorded {
            targets,
            since: t0,
        })));
        follows
    }
}
