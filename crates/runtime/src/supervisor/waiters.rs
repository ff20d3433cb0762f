//! The `wait`s not yet answered: who waits for which agents, each with the
//! reply it is owed. Owned by the dispatcher; it decides when a wait is done
//! (every agent it names has ended), this keeps the book.

use std::collections::HashMap;

use brood_core::AgentName;

use super::Reply;

pub(super) struct Waiter {
    pub(super) names: Vec<AgentName>,
    pub(super) reply: Reply<brood_api::WaitReply>,
}

#[derive(Default)]
pub(super) struct Waiters {
    by_id: HashMap<u64, Waiter>,
}

impl Waiters {
    pub(super) fn add(
        &mut self,
        id: u64,
        names: Vec<AgentName>,
        reply: Reply<brood_api::WaitReply>,
    ) {
        self.by_id.insert(id, Waiter { names, reply });
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The wait `id`, taken out (its timeout came, or it is answered).
    pub(super) fn take(&mut self, id: u64) -> Option<Waiter> {
        self.by_id.remove(&id)
    }

    /// Every agent some wait names (once each).
    pub(super) fn names(&self) -> Vec<AgentName> {
        let mut v: Vec<AgentName> = self
            .by_id
            .values()
            .flat_map(|w| w.names.iter().cloned())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The ids of the waits that are done by `done`: every agent they name
    /// passes it.
    pub(super) fn done_by(&self, done: impl Fn(&AgentName) -> bool) -> Vec<u64> {
        self.by_id
            .iter()
            .filter(|(_, w)| w.names.iter().all(&done))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The ids of the waits naming `ended` that are done by `done` for the
    /// others (`ended` itself has just ended).
    pub(super) fn done_with(
        &self,
        ended: &AgentName,
        done: impl Fn(&AgentName) -> bool,
    ) -> Vec<u64> {
        self.by_id
            .iter()
            .filter(|(_, w)| w.names.contains(ended))
            .filter(|(_, w)| w.names.iter().all(|n| n == ended || done(n)))
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    fn reply() -> Reply<brood_api::WaitReply> {
        tokio::sync::oneshot::channel().0
    }

    #[test]
    fn a_wait_is_done_when_every_agent_it_names_has_ended() {
        let mut w = Waiters::default();
        w.add(1, vec![n("a"), n("b")], reply());
        w.add(2, vec![n("a")], reply());
        w.add(3, vec![n("c")], reply());
        // a ends while b runs: only the wait for a alone is done.
        assert_eq!(w.done_with(&n("a"), |x| *x == n("c")), vec![2]);
        // a ends after b: both waits naming a are done.
        let mut both = w.done_with(&n("a"), |x| *x == n("b"));
        both.sort_unstable();
        assert_eq!(both, vec![1, 2]);
        assert_eq!(w.done_by(|x| *x == n("c")), vec![3]);
        assert!(w.take(3).is_some() && w.take(3).is_none());
    }
}
