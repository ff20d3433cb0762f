//! A run's end worked out from its live entry, what its record did (or why
//! it is kept to retry), and what the run leaves behind once it is told:
//! its group, and descendants to stop.

use brood_core::{AgentEvent, AgentName, RunId, Terminal};
use brood_launch::cgroup::Group;
use brood_store::{Agent, RunEnd, StoreError};

use super::{EndFollow, Ending, Ends, Env};
use crate::supervisor::disk::{ToClear, set_aside_artifacts};
use crate::supervisor::{UnrecordedEnd, ev, now_ms};

/// A run's end as the store recorded it, projected: what the loop tells
/// next (`after_end`), then what the run leaves behind ([`Ends::leaves`],
/// [`Ends::left_behind`]).
pub(in crate::supervisor) struct Ended {
    pub(in crate::supervisor) name: AgentName,
    pub(in crate::supervisor) agent: Agent,
    pub(in crate::supervisor) result: Option<String>,
    pub(in crate::supervisor) harvest: Option<crate::channel::Harvest>,
    /// Its channel's `artifact/`, set aside when it recorded no result:
    /// emptied once its group is.
    pub(in crate::supervisor) clear: Option<ToClear>,
}

impl Ends {
    /// What a run's end records: its outcome and the events of it (in its
    /// log and in its parent's). `None` when `name` is not live here.
    pub(in crate::supervisor) fn ending(
        name: &AgentName,
        outcome: Terminal,
        exit_code: Option<i32>,
        result: Option<String>,
        detail: Option<String>,
        harvest: Option<crate::channel::Harvest>,
        env: &Env<'_>,
    ) -> Option<Ending> {
        let l = env.agents.live.get(name)?;
        let run = l.run.clone();
        let session = l.session.clone();
        let mut events = vec![ev(
            name,
            Some(&run),
            &session,
            AgentEvent::Stop {
                agent: name.clone(),
                outcome,
                swept: None,
            },
        )];
        if let (Some(p), Some(ps)) = (&l.parent, &l.parent_session) {
            events.push(ev(
                p,
                None,
                ps,
                AgentEvent::ChildStop {
                    parent: p.clone(),
                    child: name.clone(),
                    outcome,
                },
            ));
        }
        let end = RunEnd {
            outcome,
            exit_code,
            result,
            detail,
            now_ms: now_ms(),
            output: harvest.as_ref().map(|h| h.output.clone()),
        };
        Some(Ending {
            name: name.clone(),
            run,
            end,
            events,
            harvest,
        })
    }

    /// What the store did with a run's end: recorded (or ended by another
    /// writer first), its events projected; or failed, kept in the live
    /// entry and tried again at the next tick (`None`).
    pub(in crate::supervisor) fn recorded(
        &mut self,
        e: Ending,
        recorded: Result<Agent, StoreError>,
        env: &mut Env<'_>,
    ) -> Option<Ended> {
        let Ending {
            name,
            run,
            end,
            events,
            harvest,
        } = e;
        let mut result = end.result;
        let mut harvest = harvest;
        let mut events = events;
        let agent = match recorded {
            Ok(a) => a,
            Err(err) if let Some(a) = ended_by_another(&name, &run, &err, env) => {
                // Another writer (a sweeper, another node's recovery) ended
                // this run first: its outcome stands, and retrying ours
                // could only fail again, for ever (issue 28's campaign:
                // the node kept the agent and never stopped). What follows
                // an end follows the one recorded, which handed nothing back.
                tracing::warn!(agent = %name, recorded = %a.status.encode(), ours = %end.outcome.encode(), "the run's end was already recorded; its outcome stands");
                result = None;
                harvest = None;
                // Ours were not written: the log holds the other's.
                events.clear();
                a
            }
            Err(err) => {
                tracing::error!(agent = %name, error = %err, "recording the end of a run failed; retried at the next tick");
                if let Some(l) = env.agents.live.get_mut(&name) {
                    l.unrecorded = Some(Box::new(UnrecordedEnd {
                        outcome: end.outcome,
                        exit_code: end.exit_code,
                        result,
                        detail: end.detail,
                        harvest,
                    }));
                }
                return None;
            }
        };
        // A run that recorded no result hands nothing back (issue 24): what
        // it left in its channel's `artifact/` is set aside now, before
        // anyone hears of the end (so a resume finds an empty one), and goes
        // once its group is empty.
        let clear = match &harvest {
            None => set_aside_artifacts(env.agents, env.paths, &name),
            Some(_) => None,
        };
        env.records.project_events(&events);
        Some(Ended {
            name,
            agent,
            result,
            harvest,
            clear,
        })
    }

    /// The group of an ended run, taken from its live entry once its end is
    /// told (before the entry is forgotten).
    pub(in crate::supervisor) fn leaves(
        &mut self,
        name: &AgentName,
        env: &mut Env<'_>,
    ) -> Option<Group> {
        env.agents.live.get_mut(name).and_then(|l| l.group.take())
    }

    /// What an ended run left behind, its entry forgotten: its descendants
    /// to stop, or only its group to remove; `slot`, the run's slot, kept
    /// until then. `below`: whether it left an unfinished descendant, when
    /// read with its end's batch (`Store::unfinished_below`); read here
    /// otherwise.
    pub(in crate::supervisor) fn left_behind(
        &mut self,
        name: AgentName,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
        below: Option<bool>,
        env: &mut Env<'_>,
    ) -> EndFollow {
        // Owned children die with their parent (SPEC 6), or at least its leftovers do.
        // A read that fails is not taken for "no children": the stop plans
        // again (issue 28).
        let unfinished = match below {
            Some(b) => b,
            None => match env
                .records
                .store
                .descendants_post_order(&env.records.tenant, &name)
            {
                Ok(d) => d.into_iter().any(|a| !a.status.is_finished()),
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "reading the descendants of an ended agent failed; stopping them as planned again");
                    true
                }
            },
        };
        if unfinished {
            EndFollow::StopDescendants {
                parent: name,
                group,
                clear,
                slot,
            }
        } else {
            EndFollow::RemoveGroup { group, clear, slot }
        }
    }

    /// The run ends that could not be recorded, taken to be recorded now
    /// (each tick).
    pub(in crate::supervisor) fn unrecorded(
        &mut self,
        env: &mut Env<'_>,
    ) -> Vec<(AgentName, Box<UnrecordedEnd>)> {
        env.agents
            .live
            .iter_mut()
            .filter_map(|(n, l)| l.unrecorded.take().map(|u| (n.clone(), u)))
            .collect()
    }
}

/// The record of `name` when `err` refused our end because that run is
/// already over (its end recorded by another writer); `None` for any
/// other failure, which is worth retrying. A read that fails is not
/// taken for an end.
fn ended_by_another(
    name: &AgentName,
    run: &RunId,
    err: &StoreError,
    env: &Env<'_>,
) -> Option<Agent> {
    if !matches!(err, StoreError::Transition { .. }) {
        return None;
    }
    let a = env
        .records
        .store
        .agent(&env.records.tenant, name)
        .ok()
        .flatten()?;
    (a.run == *run && a.status.is_finished()).then_some(a)
}
