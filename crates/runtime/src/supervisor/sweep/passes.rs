//! The sweepers' passes: timeouts and orphans, written under the lease's
//! fence; and, on every supervisor, the stops recorded for its agents that
//! it has yet to carry out.

use std::collections::{HashMap, HashSet};

use brood_core::{AgentEvent, AgentName, CancelReason, FailReason, Status, TenantId, Terminal};
use brood_store::{Agent, Fence, RunEnd, StoreError};

use super::{BATCH, Env, SweepFollow, note_read};
use crate::hosts::{host_alive, registered_nodes};
use crate::metrics::Sweeper;
use crate::supervisor::{ev, now_ms};

/// What the orphans pass found gone with their process: nodes of the
/// cluster to declare lost (what can move moves), and the agents of other
/// supervisors (or ours, with no process here) to end `lost`.
pub(in crate::supervisor) struct Lost {
    pub(in crate::supervisor) nodes: Vec<String>,
    agents: Vec<(Agent, String)>,
}

impl super::Sweeps {
    /// Runs past their deadline fail `timed_out`, their subtrees cancelled.
    pub(in crate::supervisor) fn timeouts(
        &self,
        env: &Env<'_>,
        fence: &Fence,
        follows: &mut Vec<SweepFollow>,
    ) -> Result<(), StoreError> {
        let overdue = env.store.overdue(now_ms(), BATCH)?;
        // A child's deadline is at most its parent's, so a parent past its
        // deadline comes with its children, often at the very same
        // millisecond (an inherited deadline). The parent's sweep cancels its
        // subtree (`parent_dead`); a child swept first would instead fail
        // `timed_out` on its own, an answer that depends on row order. So a
        // row whose parent is in the same batch is left to that parent's
        // sweep; a grandchild's parent is then in the batch too.
        let batch: HashSet<(TenantId, AgentName)> = overdue
            .iter()
            .map(|a| (a.tenant.clone(), a.name.clone()))
            .collect();
        for a in overdue {
            if let Some(p) = &a.parent
                && batch.contains(&(a.tenant.clone(), p.clone()))
            {
                continue;
            }
            note_read(env, &a);
            let note = "its run passed the policy's timeout_s";
            sweep_subtree(
                env,
                fence,
                &a,
                Terminal::Failed(FailReason::TimedOut),
                Sweeper::Timeouts,
                note,
                follows,
            )?;
        }
        Ok(())
    }

    /// Orphans (a parent finished or missing) cancelled `parent_dead`; then
    /// what is alive in the store with no process, found, not yet ended:
    /// the nodes among it are declared lost by the loop first, then
    /// [`Self::end_lost`] ends the rest.
    pub(in crate::supervisor) fn orphans(
        &self,
        env: &Env<'_>,
        fence: &Fence,
        follows: &mut Vec<SweepFollow>,
    ) -> Result<Lost, StoreError> {
        for a in env.store.orphans(BATCH)? {
            note_read(env, &a);
            let note = "its parent is finished or missing";
            sweep_subtree(
                env,
                fence,
                &a,
                Terminal::Cancelled(CancelReason::ParentDead),
                Sweeper::Orphans,
                note,
                follows,
            )?;
        }
        // Alive in the store, but no process: a host that is gone, or our own
        // record that no process of ours answers to.
        let mut lost = Vec::new();
        // A failed read ends this sweep: no agent is recorded lost for it.
        let nodes = registered_nodes(env.store)?;
        let mut lost_nodes: Vec<String> = Vec::new();
        for host in env.store.supervisors_with_unfinished()? {
            let ours = host == env.me;
            if !ours && host_alive(&host, &nodes) {
                continue;
            }
            // A node of the cluster whose process is gone (this machine's
            // process table says so before its heartbeat expires): declared
            // lost now, so that what can move moves (`cluster::moved`), rather than
            // its agents ended one by one here.
            let node = brood_store::placed_for(&host).unwrap_or(&host);
            if !ours && node != env.me && nodes.iter().any(|n| n.id == node) {
                if !lost_nodes.iter().any(|l| l == node) {
                    lost_nodes.push(node.to_owned());
                }
                continue;
            }
            for a in env.store.unfinished_of(std::slice::from_ref(&host))? {
                // Ours and live, or ours with its admission's answer on the
                // way to the loop (`admitting`): not lost.
                if ours
                    && a.tenant == *env.tenant
                    && (env.agents.live.contains_key(&a.name) || env.admitting.in_flight(&a.name))
                {
                    continue;
                }
                note_read(env, &a);
                lost.push((a, host.clone()));
                if lost.len() >= BATCH as usize {
                    break;
                }
            }
        }
        Ok(Lost {
            nodes: lost_nodes,
            agents: lost,
        })
    }

    /// The agents [`Self::orphans`] found without a process end (the stop's
    /// recorded outcome, or `failed (lost)`), their subtrees cancelled.
    pub(in crate::supervisor) fn end_lost(
        &self,
        env: &Env<'_>,
        fence: &Fence,
        lost: Lost,
        follows: &mut Vec<SweepFollow>,
    ) -> Result<(), StoreError> {
        for (a, host) in lost.agents {
            let outcome = match a.status {
                // Its stop was recorded: carry the recorded outcome out.
                Status::Stopping(t) => t,
                _ => Terminal::Failed(FailReason::Lost),
            };
            let detail = if host == env.me {
                format!("its process is gone: supervisor {host} holds none for it")
            } else {
                format!("its process is gone with its supervisor {host}")
            };
            let events = [ev(
                &a.name,
                Some(&a.run),
                &a.session,
                AgentEvent::Stop {
                    agent: a.name.clone(),
                    outcome,
                    swept: Some((Sweeper::Orphans.as_str(), detail.clone())),
                },
            )];
            let end = RunEnd::without_process(outcome, detail, now_ms());
            let ended = env
                .store
                .sweep_end(fence, &a.tenant, &a.name, &end, &events)?;
            env.metrics.sweeper_action(Sweeper::Orphans);
            if a.tenant == *env.tenant {
                (env.project)(&events);
                follows.push(SweepFollow::Ended(ended));
            }
            stop_descendants_recorded(env, fence, &a, follows)?;
        }
        Ok(())
    }
}

/// Records the stop of `a` with `outcome` and of its unfinished descendants
/// with `parent_dead`, the top first (SPEC 6: the intent before anything).
fn sweep_subtree(
    env: &Env<'_>,
    fence: &Fence,
    a: &Agent,
    outcome: Terminal,
    sweeper: Sweeper,
    why: &str,
    follows: &mut Vec<SweepFollow>,
) -> Result<(), StoreError> {
    let events = [ev(
        &a.name,
        Some(&a.run),
        &a.session,
        AgentEvent::Sweep {
            agent: a.name.clone(),
            sweeper: sweeper.as_str(),
            outcome,
            detail: why.to_owned(),
        },
    )];
    let after = env.store.sweep_stop(
        fence,
        &a.tenant,
        std::slice::from_ref(&a.name),
        outcome,
        now_ms(),
        &events,
    )?;
    env.metrics.sweeper_action(sweeper);
    if a.tenant == *env.tenant {
        (env.project)(&events);
        ended_queued(after, follows);
    }
    stop_descendants_recorded(env, fence, a, follows)
}

fn stop_descendants_recorded(
    env: &Env<'_>,
    fence: &Fence,
    a: &Agent,
    follows: &mut Vec<SweepFollow>,
) -> Result<(), StoreError> {
    let desc: Vec<AgentName> = env
        .store
        .descendants_post_order(&a.tenant, &a.name)?
        .into_iter()
        .filter(|d| !d.status.is_finished())
        .map(|d| d.name)
        .collect();
    if desc.is_empty() {
        return Ok(());
    }
    let after = env.store.sweep_stop(
        fence,
        &a.tenant,
        &desc,
        Terminal::Cancelled(CancelReason::ParentDead),
        now_ms(),
        &[],
    )?;
    if a.tenant == *env.tenant {
        ended_queued(after, follows);
    }
    Ok(())
}

/// Of the records a stop left, those it ended at once: they were queued
/// (a running one is `stopping` until its processes are gone).
fn ended_queued(after: Vec<Agent>, follows: &mut Vec<SweepFollow>) {
    follows.extend(
        after
            .into_iter()
            .filter(|b| b.status.is_finished())
            .map(SweepFollow::EndedQueued),
    );
}

/// Every supervisor, every tick: stops whose intent is recorded for agents
/// it hosts but that it is not carrying out yet (recorded by a sweeper, or
/// by another supervisor's cascade), to be carried out like its own: the
/// whole picked subtree signalled at once, the records written in
/// post-order. A failed read carries nothing out: the next tick looks
/// again (issue 28: an error is not "nothing stopping").
pub(in crate::supervisor) fn recorded_stops(env: &Env<'_>) -> Vec<SweepFollow> {
    let mine = match env.store.stopping_of(env.me) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "reading our stopping agents failed");
            return Vec::new();
        }
    };
    let live = &env.agents.live;
    let picked: HashMap<AgentName, Terminal> = mine
        .into_iter()
        .filter(|a| a.tenant == *env.tenant)
        .filter_map(|a| match a.status {
            Status::Stopping(t) => Some((a.name, t)),
            _ => None,
        })
        .filter(|(n, _)| {
            live.get(n).is_some_and(|l| l.stopping.is_none()) && !env.ends_writer.flight.contains(n)
        })
        .collect();
    let tops = picked.keys().filter(|n| {
        live.get(*n)
            .and_then(|l| l.parent.as_ref())
            .is_none_or(|p| !picked.contains_key(p))
    });
    let mut stops = Vec::new();
    for top in tops {
        let Some(&outcome) = picked.get(top) else {
            continue;
        };
        // Its picked descendants stop with it, in post-order; which they
        // are is the store's to say. Unread, the stop waits for the next
        // tick rather than leaving them out (their records would then wait
        // for a stop of their own).
        let below = match env.store.descendants_post_order(env.tenant, top) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(agent = %top, error = %e, "reading a recorded stop's descendants failed; the next tick tries again");
                continue;
            }
        };
        let mut targets: Vec<(AgentName, Terminal)> = below
            .into_iter()
            .filter_map(|d| picked.get(&d.name).map(|t| (d.name, *t)))
            .collect();
        targets.push((top.clone(), outcome));
        let group = live.get(top).and_then(|l| l.group.clone());
        tracing::info!(agent = %top, outcome = %outcome.encode(), targets = targets.len(), "carrying out a recorded stop");
        stops.push(SweepFollow::Stop(targets, group));
    }
    stops
}
