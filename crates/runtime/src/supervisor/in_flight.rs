//! What the loop has handed to one of the store's writers and not yet heard
//! back about (`starts_writer`, `ends_writer`): the items of each job, the
//! names of their agents, and the commands held until those agents' records
//! land. One bookkeeping for both writers, so that what is held, counted and
//! waited for means the same for a start as for an end.

use std::collections::{HashMap, HashSet};

use brood_core::AgentName;

use super::Cmd;

pub(super) struct InFlight<T> {
    next_id: u64,
    by_job: HashMap<u64, Vec<T>>,
    names: HashSet<AgentName>,
    /// Commands naming an agent in flight, in arrival order.
    held: Vec<Cmd>,
    /// The agent an item is for.
    name_of: fn(&T) -> &AgentName,
}

impl<T> InFlight<T> {
    pub(super) fn new(name_of: fn(&T) -> &AgentName) -> InFlight<T> {
        InFlight {
            next_id: 0,
            by_job: HashMap::new(),
            names: HashSet::new(),
            held: Vec::new(),
            name_of,
        }
    }

    /// The id the next job is handed over with.
    pub(super) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A job handed over: its items are in flight until it lands.
    pub(super) fn enter(&mut self, id: u64, items: Vec<T>) {
        for it in &items {
            self.names.insert((self.name_of)(it).clone());
        }
        self.by_job.insert(id, items);
    }

    /// The items an answer is for, no longer in flight.
    pub(super) fn landed(&mut self, id: u64) -> Vec<T> {
        let items = self.by_job.remove(&id).unwrap_or_default();
        for it in &items {
            self.names.remove((self.name_of)(it));
        }
        items
    }

    /// Whether an item for `name` is in flight.
    pub(super) fn contains(&self, name: &AgentName) -> bool {
        self.names.contains(name)
    }

    /// Nothing in flight and nothing held.
    pub(super) fn idle(&self) -> bool {
        self.by_job.is_empty() && self.held.is_empty()
    }

    /// What it holds for agents: jobs, names, commands held.
    pub(super) fn count(&self) -> usize {
        self.by_job.len() + self.names.len() + self.held.len()
    }

    /// Holds a command until the agent it names lands.
    pub(super) fn hold(&mut self, cmd: Cmd) {
        self.held.push(cmd);
    }

    /// The commands held, to be handled now (those whose agent is still in
    /// flight are held again when handled).
    pub(super) fn take_held(&mut self) -> Vec<Cmd> {
        std::mem::take(&mut self.held)
    }
}
