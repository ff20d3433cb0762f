//! The bell a store rings once events it appended have committed (issue 27:
//! events are pushed, not polled): a reader of the event log (the API's
//! event hub) waits on it and reads the log at once, instead of polling or
//! waiting for whoever wrote to say so when it is done with the rest of its
//! work. A store other nodes share rings it too when another node announces
//! a write (`Nodes::hear`), so their events reach this node's readers as
//! soon as their news does.
//!
//! The bell carries no events, only "look": the store stays the one truth,
//! and a reader reads what follows the last event it has, in order, so a
//! ring missed or rung for nothing costs latency or one read, never an event
//! lost or repeated. It rings after the commit, so the read it prompts sees
//! what was appended (and, the sequence numbers being taken under a lock
//! held to the commit, everything numbered before it).
//!
//! Which transactions appended events is noted per thread: the statements
//! that insert events (`note_appended`) run on the thread of the transaction
//! that holds them (a SQLite write, a PostgreSQL `Pool::transact`), and
//! that thread asks once its transaction has ended (`take_appended`). A
//! transaction that appended and then rolled back rings for nothing, which
//! is harmless.

use std::cell::Cell;

use tokio::sync::watch;

thread_local! {
    /// Whether the transaction running on this thread appended events.
    static APPENDED: Cell<bool> = const { Cell::new(false) };
}

/// Notes that the transaction on this thread inserted events.
pub(crate) fn note_appended() {
    APPENDED.set(true);
}

/// Whether the transaction that just ended on this thread inserted events,
/// forgetting it (the next transaction starts clean).
pub(crate) fn take_appended() -> bool {
    APPENDED.replace(false)
}

/// A counter bumped at every ring; readers hold its receivers.
pub(crate) struct Bell {
    tx: watch::Sender<u64>,
}

impl Default for Bell {
    fn default() -> Bell {
        Bell {
            tx: watch::channel(0).0,
        }
    }
}

impl Bell {
    /// Rings: every receiver's `changed` resolves. Never blocks (it runs on
    /// a writer's thread, some holding the store's write lock).
    pub(crate) fn ring(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Rings when the transaction that just ended on this thread appended
    /// events and `committed`; forgets the note either way.
    pub(crate) fn after_transaction(&self, committed: bool) {
        if take_appended() && committed {
            self.ring();
        }
    }

    /// A receiver that sees every ring from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bell_rings_after_a_committed_transaction_that_appended_only() {
        let bell = Bell::default();
        let mut rx = bell.subscribe();
        bell.after_transaction(true);
        assert!(!rx.has_changed().unwrap_or(true), "nothing was appended");
        note_appended();
        bell.after_transaction(false);
        assert!(!rx.has_changed().unwrap_or(true), "the append rolled back");
        note_appended();
        bell.after_transaction(true);
        assert!(rx.has_changed().unwrap_or(false), "an append committed");
        rx.mark_unchanged();
        // The note was forgotten with the transaction that made it.
        bell.after_transaction(true);
        assert!(!rx.has_changed().unwrap_or(true));
    }
}
