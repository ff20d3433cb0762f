//! Admitted agents waiting for a concurrency slot (SPEC 9: a full tenant
//! queues instead of failing), first in first out. The dispatcher pumps it
//! after every command; an entry that is no longer waiting (cancelled, ended)
//! is skipped when it comes up.

use std::collections::VecDeque;

use brood_core::AgentName;

#[derive(Default)]
pub(super) struct Queue {
    order: VecDeque<AgentName>,
}

impl Queue {
    pub(super) fn push(&mut self, name: AgentName) {
        self.order.push_back(name);
    }

    /// The next in line, left in place.
    pub(super) fn front(&self) -> Option<&AgentName> {
        self.order.front()
    }

    /// The line, first first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &AgentName> {
        self.order.iter()
    }

    pub(super) fn pop(&mut self) {
        self.order.pop_front();
    }

    pub(super) fn remove(&mut self, name: &AgentName) {
        self.order.retain(|n| n != name);
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn clear(&mut self) {
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_in_first_out_and_a_removed_entry_never_comes_up() {
        let n = |s: &str| AgentName::new(s).unwrap();
        let mut q = Queue::default();
        for s in ["a", "b", "c"] {
            q.push(n(s));
        }
        q.remove(&n("b"));
        assert_eq!(q.front(), Some(&n("a")));
        q.pop();
        assert_eq!(q.front(), Some(&n("c")));
        q.clear();
        assert_eq!(q.front(), None);
    }
}
