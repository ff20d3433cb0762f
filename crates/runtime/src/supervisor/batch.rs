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
//! Here: the gathering ([`gather`]) and the starts and ends taken together
//! (they belong with launch and ends). Which creations may go together
//! ([`joins`]) and how a batch of them is admitted are admission's
//! (`supervisor::admission`, `route::admission`'s `on_spawns`).

use brood_core::{AgentName, RunId};
use std::collections::{HashSet, VecDeque};

use brood_launch::{LaunchError, Launched};
use brood_store::EndItem;
use tokio::sync::mpsc;

use super::admission::{Spawn, joins};
use super::ends::Ending;
use super::ends_writer::EndsRecorded;
use super::launch::{Made, Starting};
use super::starts_writer::StartsRecorded;
use super::{AgentEv, Cmd, Dispatcher};
use crate::api::Caller;

/// The most creations admitted together: enough for a burst of clients, few
/// enough that the first does not wait long for the last.
pub(super) const MAX_BATCH: usize = 64;

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

/// The most commands read ahead of the one at hand, looking for starts and
/// ends to record with it.
const LOOK_AHEAD: usize = 1024;

/// `first` and the commands of its kind that may go with it. Creations: those
/// queued right behind it (the first that may not stays first in `ahead`).
/// Starts and ends: also those further back in the queue (read into
/// `ahead`, which the loop takes its next commands from) of agents that are
/// `lone` (a root with no child live here: no other agent's command is
/// about it) and that may overtake the commands before them
/// ([`overtakes`]), so a burst of processes started or ended while the loop
/// was busy is recorded in one transaction, not one each. Nothing new is
/// admitted together while shutting down.
pub(super) fn gather(
    first: Cmd,
    ahead: &mut VecDeque<Cmd>,
    rx: &mut mpsc::UnboundedReceiver<Cmd>,
    shutting_down: bool,
    lone: &dyn Fn(&AgentName) -> bool,
) -> Work {
    match first {
        Cmd::Spawn(caller, req, reply) if !shutting_down => {
            let mut spawns = vec![Spawn {
                caller,
                req: *req,
                reply,
            }];
            while let Some(c) = next_queued(ahead, rx) {
                let Cmd::Spawn(caller, req, reply) = c else {
                    ahead.push_front(c);
                    break;
                };
                let s = Spawn {
                    caller,
                    req: *req,
                    reply,
                };
                if !joins(&spawns, &s) {
                    ahead.push_front(Cmd::Spawn(s.caller, Box::new(s.req), s.reply));
                    break;
                }
                spawns.push(s);
            }
            Work::Spawns(spawns)
        }
        Cmd::Launched(name, run, result, made) => {
            let mut starts = vec![Launch {
                name,
                run,
                result,
                made: *made,
            }];
            let taken = take_ahead(ahead, rx, &starts[0].name, |c| {
                matches!(c, Cmd::Launched(..)) && agent_of(c).is_some_and(lone)
            });
            for c in taken {
                if let Cmd::Launched(name, run, result, made) = c {
                    starts.push(Launch {
                        name,
                        run,
                        result,
                        made: *made,
                    });
                }
            }
            Work::Starts(starts)
        }
        Cmd::Agent(name, run, AgentEv::Exited { status }) => {
            let mut exits = vec![Exit { name, run, status }];
            let taken = take_ahead(ahead, rx, &exits[0].name, |c| {
                matches!(c, Cmd::Agent(_, _, AgentEv::Exited { .. }))
                    && agent_of(c).is_some_and(lone)
            });
            for c in taken {
                if let Cmd::Agent(name, run, AgentEv::Exited { status }) = c {
                    exits.push(Exit { name, run, status });
                }
            }
            Work::Exits(exits)
        }
        cmd => Work::One(cmd),
    }
}

/// The next command already queued: read ahead first, then the channel.
fn next_queued(ahead: &mut VecDeque<Cmd>, rx: &mut mpsc::UnboundedReceiver<Cmd>) -> Option<Cmd> {
    ahead.pop_front().or_else(|| rx.try_recv().ok())
}

/// Takes out of the queue (read into `ahead`, up to [`LOOK_AHEAD`]) up to
/// [`MAX_BATCH`] - 1 commands that are `kind`, each one that may overtake
/// every command left before it. The scan stops at the first command no
/// other may overtake.
fn take_ahead(
    ahead: &mut VecDeque<Cmd>,
    rx: &mut mpsc::UnboundedReceiver<Cmd>,
    first: &AgentName,
    kind: impl Fn(&Cmd) -> bool,
) -> Vec<Cmd> {
    while ahead.len() < LOOK_AHEAD
        && let Ok(c) = rx.try_recv()
    {
        ahead.push_back(c);
    }
    let mut taken = Vec::new();
    // The agents the commands left in front name: one of theirs stays behind them.
    let mut named: HashSet<AgentName> = HashSet::from([first.clone()]);
    let mut i = 0;
    while i < ahead.len() && taken.len() + 1 < MAX_BATCH {
        let c = &ahead[i];
        if kind(c)
            && let Some(n) = agent_of(c)
            && !named.contains(n)
        {
            named.insert(n.clone());
            if let Some(c) = ahead.remove(i) {
                taken.push(c);
            }
            continue;
        }
        if !overtakes(c, &mut named) {
            break;
        }
        i += 1;
    }
    taken
}

/// The agent a start or a process's report is about.
fn agent_of(c: &Cmd) -> Option<&AgentName> {
    match c {
        Cmd::Launched(n, ..) | Cmd::Agent(n, ..) => Some(n),
        _ => None,
    }
}

/// Whether a start or an end further back may be recorded before `c`,
/// which stays queued: `c` is about one agent (its start, its report, a
/// creation it asked for) or about none of those running (a user's
/// creation, an admission answered, an identification), and the agents it
/// names go into `named`, whose starts and ends stay behind it. Every other
/// command (a verb, a stop, a tick, news) may touch any agent: nothing
/// overtakes it.
fn overtakes(c: &Cmd, named: &mut HashSet<AgentName>) -> bool {
    match c {
        Cmd::Launched(n, ..) | Cmd::Agent(n, ..) => {
            named.insert(n.clone());
            true
        }
        Cmd::Spawn(caller, req, _) => {
            if let Caller::Agent(me) = caller {
                named.insert(me.clone());
            }
            if let Some(p) = &req.parent {
                named.insert(p.clone());
            }
            true
        }
        Cmd::Admitted(..) | Cmd::EndsRecorded(..) | Cmd::StartsRecorded(..) | Cmd::Identify(..) => {
            true
        }
        _ => false,
    }
}

impl Dispatcher {
    /// Starts answered by the spawner: each taken up, their records handed
    /// to the start writer, to be written together off the loop
    /// (`starts_writer`); what follows each comes with its answer.
    pub(super) fn on_launches(&mut self, starts: Vec<Launch>) {
        let starting: Vec<Starting> = starts
            .into_iter()
            .filter_map(|l| self.launch_begins(l.name, l.run, l.result, l.made))
            .collect();
        self.record_starts(starting);
    }

    /// Taken-up starts recorded: by the start writer, or, should it be
    /// gone, here, then followed up in order.
    pub(super) fn record_starts(&mut self, starting: Vec<Starting>) {
        if starting.is_empty() {
            return;
        }
        let starting = match self.starts_writer.hand_over(starting, &self.host.me) {
            Ok(()) => return,
            Err(s) => s,
        };
        let items: Vec<_> = starting.iter().map(|s| s.item(&self.host.me)).collect();
        let recorded = self.records.store.start_runs(&self.records.tenant, &items);
        for (s, r) in starting.into_iter().zip(recorded) {
            self.launch_started(s, r);
        }
    }

    /// The start writer's answer: what follows each start, in order.
    pub(super) fn on_starts_recorded(&mut self, r: StartsRecorded) {
        let starts = self.starts_writer.flight.landed(r.id);
        for (s, recorded) in starts.into_iter().zip(r.results) {
            self.launch_started(s, recorded);
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
    /// followed up in order; if that transaction fails, each alone. Ends of
    /// lone agents only go to the end writer, off the loop
    /// (`ends_writer`), and are followed up when its answer comes.
    fn record_ends_together(&mut self) {
        let Some(ends) = self.ends_together.replace(Vec::new()) else {
            return;
        };
        if ends.is_empty() {
            return;
        }
        let live = &self.agents.live;
        let parents: HashSet<&AgentName> =
            live.values().filter_map(|l| l.parent.as_ref()).collect();
        let lone = ends.iter().all(|e| {
            live.get(&e.name).is_some_and(|l| l.parent.is_none()) && !parents.contains(&e.name)
        });
        let ends = if lone {
            match self.ends_writer.hand_over(ends) {
                Ok(()) => return,
                Err(ends) => ends,
            }
        } else {
            ends
        };
        let items: Vec<EndItem> = ends.iter().map(Ending::item).collect();
        let recorded = self.records.store.end_runs(&self.records.tenant, &items);
        let agents = match recorded {
            Ok(agents) if agents.len() == ends.len() => Some(agents),
            Ok(_) => None,
            Err(err) => {
                tracing::warn!(error = %err, n = ends.len(), "recording ends together failed; each alone");
                None
            }
        };
        // What they left below them, one read for the lot.
        let below = agents.as_ref().and_then(|_| {
            let names: Vec<AgentName> = ends.iter().map(|e| e.name.clone()).collect();
            self.records
                .store
                .unfinished_below(&self.records.tenant, &names)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, n = names.len(), "reading what the ended agents left below them failed; each is planned alone");
                })
                .ok()
        });
        self.follow_ends(ends, agents, below);
    }

    /// The end writer's answer: what follows each end, in order.
    pub(super) fn on_ends_recorded(&mut self, r: EndsRecorded) {
        let ends = self.ends_writer.flight.landed(r.id);
        self.follow_ends(ends, r.agents, r.below);
    }

    /// What follows ends recorded together (`agents`, one per end), or,
    /// when they were not, each recorded alone first. `below`, when known:
    /// the ends that left an unfinished descendant; the others leave only
    /// their group.
    fn follow_ends(
        &mut self,
        ends: Vec<Ending>,
        agents: Option<Vec<brood_store::Agent>>,
        below: Option<HashSet<AgentName>>,
    ) {
        match agents {
            Some(agents) => {
                for (e, a) in ends.into_iter().zip(agents) {
                    let left = below.as_ref().map(|b| b.contains(&e.name));
                    self.finish_recorded_left(e, Ok(a), left);
                }
            }
            None => {
                for e in ends {
                    let r = e.record(self.records.store.as_ref(), &self.records.tenant);
                    self.finish_recorded(e, r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AgentEv, Cmd, VecDeque, Work, gather, mpsc};
    use brood_core::AgentName;

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    fn exit(n: &str) -> Cmd {
        Cmd::Agent(
            name(n),
            super::super::new_run_id(),
            AgentEv::Exited { status: 0 },
        )
    }

    fn said(n: &str) -> Cmd {
        Cmd::Agent(
            name(n),
            super::super::new_run_id(),
            AgentEv::Stderr("x".into()),
        )
    }

    /// The agents of the exits gathered, and what is left queued, by kind.
    fn gathered(queue: Vec<Cmd>, lone: &dyn Fn(&AgentName) -> bool) -> (Vec<String>, Vec<String>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut queue = queue.into_iter();
        let first = queue.next().unwrap();
        for c in queue {
            tx.send(c).ok().unwrap();
        }
        let mut ahead = VecDeque::new();
        let Work::Exits(exits) = gather(first, &mut ahead, &mut rx, false, lone) else {
            panic!("not a batch of exits");
        };
        let left = ahead
            .iter()
            .map(|c| match c {
                Cmd::Agent(n, _, AgentEv::Exited { .. }) => format!("exit {n}"),
                Cmd::Agent(n, ..) => format!("said {n}"),
                Cmd::Tick => "tick".into(),
                _ => "other".into(),
            })
            .collect();
        (exits.iter().map(|e| e.name.to_string()).collect(), left)
    }

    #[test]
    fn an_end_overtakes_other_agents_reports_but_not_its_own_nor_a_tick() {
        let all_lone = |_: &AgentName| true;
        let (taken, left) = gathered(
            vec![
                exit("a"),
                said("b"),
                exit("c"),
                said("d"),
                exit("d"),
                exit("b"),
                said("e"),
                exit("e"),
                Cmd::Tick,
                exit("f"),
            ],
            &all_lone,
        );
        // c's end overtakes b's report; d's, b's and e's ends stay behind a
        // report of their own agent; nothing passes the tick.
        assert_eq!(taken, ["a", "c"]);
        assert_eq!(
            left,
            [
                "said b", "said d", "exit d", "exit b", "said e", "exit e", "tick", "exit f"
            ]
        );
    }

    #[test]
    fn only_lone_agents_ends_are_taken_from_further_back() {
        let lone = |n: &AgentName| n.as_str() != "p";
        let (taken, left) = gathered(vec![exit("a"), said("x"), exit("p"), exit("c")], &lone);
        assert_eq!(taken, ["a", "c"]);
        assert_eq!(left, ["said x", "exit p"]);
    }
}
