//! What a committed write changed, as far as the other nodes' looks go
//! (issue 27): the news a node announces says it, so that a node hearing it
//! makes only the looks it concerns (the agents placed on it, its inbox,
//! the stops recorded for its agents, the waits for agents ended
//! elsewhere, the event log) instead of all of them after every write of
//! every node.
//!
//! A write says nothing unless its body narrows it: a transaction whose body
//! never called [`only`] changed [`Changed::ALL`], so a write nobody
//! thought about costs the looks it always did, never a look missed. The
//! hot bodies (a run's start and end, an admission) narrow theirs. As with
//! the bell (`crate::bell`), the note is per thread: the body runs on the
//! thread of the transaction that holds it, which clears the note before the
//! body and takes it after the commit ([`begin`], [`take`]).

use std::cell::Cell;

/// A set of the kinds of change the other nodes look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed(u8);

impl Changed {
    /// Nothing: no look.
    pub const NONE: Changed = Changed(0);
    /// Events appended: the event log's readers read on.
    pub const EVENTS: Changed = Changed(1);
    /// A run ended: the waits for agents hosted elsewhere are answered.
    pub const ENDS: Changed = Changed(1 << 1);
    /// An agent placed on a node (queued for it): that node claims it.
    pub const PLACED: Changed = Changed(1 << 2);
    /// An input in a node's inbox: that node takes it.
    pub const INPUTS: Changed = Changed(1 << 3);
    /// A stop recorded for an agent: its node carries it out.
    pub const STOPS: Changed = Changed(1 << 4);
    /// Everything: every look.
    pub const ALL: Changed = Changed(0b1_1111);

    /// Whether any kind of `other` is in this set.
    pub fn any(self, other: Changed) -> bool {
        self.0 & other.0 != 0
    }

    /// The set as news carries it (`postgres::news`).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// A set read from news; kinds this build does not know of are kept
    /// (a newer node's) and [`Changed::any`] ignores them.
    pub fn from_bits(bits: u8) -> Changed {
        Changed(bits)
    }
}

impl std::ops::BitOr for Changed {
    type Output = Changed;
    fn bitor(self, other: Changed) -> Changed {
        Changed(self.0 | other.0)
    }
}

thread_local! {
    /// What the transaction running on this thread said it changed; `None`
    /// while it said nothing.
    static NOTED: Cell<Option<u8>> = const { Cell::new(None) };
}

/// Says that the transaction on this thread changes `what` (among what
/// other calls of its body say).
pub(crate) fn only(what: Changed) {
    NOTED.set(Some(NOTED.get().unwrap_or(0) | what.0));
}

/// A transaction begins on this thread: nothing said yet.
pub(crate) fn begin() {
    NOTED.set(None);
}

/// What the transaction that just ended on this thread changed:
/// [`Changed::ALL`] when its body said nothing.
pub(crate) fn take() -> Changed {
    NOTED.replace(None).map_or(Changed::ALL, Changed)
}

#[cfg(test)]
mod tests {
    use super::{Changed, begin, only, take};

    #[test]
    fn a_body_that_says_nothing_changed_everything() {
        begin();
        assert_eq!(take(), Changed::ALL);
        begin();
        only(Changed::EVENTS);
        only(Changed::ENDS);
        let said = take();
        assert!(said.any(Changed::ENDS) && said.any(Changed::EVENTS));
        assert!(!said.any(Changed::PLACED | Changed::INPUTS | Changed::STOPS));
        // Taken: the next transaction starts from nothing said.
        assert_eq!(take(), Changed::ALL);
    }
}
