//! Writes that survive a lost acknowledgement (issue 28): a transaction's
//! answer is given only once the server has committed it, and a
//! transaction that may have committed is never run again.
//!
//! A connection lost before the COMMIT was sent leaves nothing behind (the
//! server rolls the transaction back with the session), so the body runs
//! once more on a new connection, as it always did. A connection lost after
//! it was sent (or a COMMIT whose answer never came) leaves one question:
//! did it commit? The server keeps the answer: every write transaction has
//! an id (`Conn::tx` reads it with its `BEGIN`, in the same round trip),
//! and `txid_status` tells, on a new connection, whether that transaction
//! committed, was rolled back, or is still in progress. Committed: the
//! body's answer, which the client still holds, is the answer (nothing is
//! stored to give it again). Rolled back: nothing stands, the body runs
//! again. Still in progress (its session has the COMMIT and is at it, or
//! never got it and has not seen its client go): a short wait, then that
//! session is ended, which settles it (a commit under way is finished
//! first, anything else rolled back). When the fate cannot be learnt, the
//! write is reported in doubt (`StoreError::PostgresInDoubt`), never run
//! again: an error is never taken for a fact, and never a second write.
//!
//! A transaction the server ended for a conflict (a deadlock, `40P01`, or a
//! serialization failure, `40001`) was rolled back whole, so nothing of it
//! stands: it runs again, a few times, after a short pause.

use std::time::{Duration, Instant};

use super::db::{Commit, Conn, Db};
use super::{Fail, Pool, Tx};
use crate::types::connection_lost;
use crate::types::{Result, StoreError};

/// The fate of transaction `$1` (`committed`, `aborted`, `in progress`, or
/// NULL for one too old to be known).
const Q_STATUS: &str = "SELECT txid_status($1)";
/// Ends session `$1` if it still runs transaction `$2` (its 32-bit xid, as
/// text): a process id alone might be another session's by now.
const Q_END_SESSION: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
     WHERE pid = $1 AND backend_xid::text = $2";

/// How long a transaction whose COMMIT went unanswered may stay in progress
/// before its session is ended: a commit under way ends in milliseconds.
const GRACE: Duration = Duration::from_millis(200);
/// How often its fate is asked meanwhile.
const POLL: Duration = Duration::from_millis(10);
/// How many times a transaction the server ended for a conflict runs again.
const CONFLICT_RETRIES: u32 = 4;

/// Whether the server ended the transaction for a conflict with another
/// (a deadlock, a serialization failure): it rolled it back whole.
fn ended_for_a_conflict(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            || *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// What became of a transaction whose COMMIT went unanswered.
enum Fate {
    Committed,
    RolledBack,
}

impl Pool {
    /// Runs `f` in a transaction on a connection of the pool (with `lock`'s
    /// advisory lock first, when given), and answers once it committed.
    /// `f` runs once more, on a new connection, only when nothing of its
    /// first run stands: the connection was lost before the COMMIT was sent,
    /// or the server says that transaction was rolled back. A COMMIT whose
    /// answer was lost is asked about instead (the module's doc): committed,
    /// the answer is `f`'s; unknown, the write is in doubt.
    pub(crate) fn transact<T>(
        &self,
        lock: Option<&str>,
        mut f: impl FnMut(&Db<'_>) -> Tx<T>,
    ) -> Result<T> {
        let mut slot = self.take();
        let r = self.transact_on(&mut slot, lock, &mut f);
        self.give(slot);
        // A transaction in doubt may have committed: ringing for nothing
        // costs a reader one read, missing a ring costs it latency.
        let maybe = matches!(
            r,
            Ok(_) | Err(Fail::Store(StoreError::PostgresInDoubt { .. }))
        );
        self.bell.after_transaction(maybe);
        r.map_err(|e| e.at(&self.target))
    }

    fn transact_on<T>(
        &self,
        slot: &mut Option<Conn>,
        lock: Option<&str>,
        f: &mut impl FnMut(&Db<'_>) -> Tx<T>,
    ) -> Tx<T> {
        let mut again = true;
        let mut conflicts = 0;
        loop {
            let ran = self.live(slot).and_then(|c| c.tx(lock, &mut *f));
            match ran {
                Ok(Commit::Done(out)) => return Ok(out),
                Ok(Commit::Unanswered {
                    out,
                    xid,
                    backend,
                    lost,
                }) => {
                    *slot = None;
                    let why = match &lost {
                        // The server or the network is silent: asking would
                        // meet the same silence.
                        Fail::Deadline(after) => {
                            return Err(self.in_doubt(
                                xid,
                                &format!("no answer within {after:?}"),
                                "not asked: the server is silent",
                            ));
                        }
                        Fail::Pg(e) => crate::types::said(e),
                        Fail::Store(e) => e.to_string(),
                    };
                    eprintln!(
                        "brood store: postgres connection to {} lost at the COMMIT of \
                         transaction {xid} ({why}); asking whether it committed",
                        self.target
                    );
                    match self.fate(slot, xid, backend) {
                        Ok(Fate::Committed) => return Ok(out),
                        Ok(Fate::RolledBack) if again => again = false,
                        // Not done, and already run twice: the loss is the answer.
                        Ok(Fate::RolledBack) => return Err(lost),
                        Err(doubt) => return Err(self.in_doubt(xid, &why, &doubt)),
                    }
                }
                Err(Fail::Pg(e)) if again && connection_lost(&e) => {
                    eprintln!(
                        "brood store: postgres connection to {} lost ({}); trying once more",
                        self.target,
                        crate::types::said(&e)
                    );
                    *slot = None;
                    again = false;
                }
                Err(Fail::Pg(e)) if conflicts < CONFLICT_RETRIES && ended_for_a_conflict(&e) => {
                    conflicts += 1;
                    eprintln!(
                        "brood store: postgres at {} rolled a transaction back ({}); running it again ({conflicts} of {CONFLICT_RETRIES})",
                        self.target,
                        crate::types::said(&e)
                    );
                    // The other party goes on meanwhile.
                    std::thread::sleep(Duration::from_millis(5 << conflicts));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether transaction `xid`, whose COMMIT went unanswered, committed:
    /// asked on a new connection (left in `slot` for what follows), waiting
    /// while it is in progress, its session `backend` ended past [`GRACE`],
    /// and given up past the call's deadline. The error says why its fate
    /// is not known.
    fn fate(
        &self,
        slot: &mut Option<Conn>,
        xid: i64,
        backend: i32,
    ) -> std::result::Result<Fate, String> {
        let target = &self.target;
        let c = self
            .live(slot)
            .map_err(|e| format!("connecting again: {}", e.at(target)))?;
        let db = c.db();
        let asked = Instant::now();
        let mut ended = false;
        loop {
            let status: Option<String> = db
                .query_one(Q_STATUS, &[&xid])
                .and_then(|r| Ok(r.try_get(0)?))
                .map_err(|e| format!("asking its status: {}", e.at(target)))?;
            match status.as_deref() {
                Some("committed") => return Ok(Fate::Committed),
                Some("aborted") => return Ok(Fate::RolledBack),
                Some("in progress") => {}
                Some(other) => return Err(format!("the server says it is {other:?}")),
                None => return Err("the server no longer knows it".into()),
            }
            let waited = asked.elapsed();
            if waited >= self.call_timeout {
                return Err(format!("still in progress after {waited:?}"));
            }
            if !ended && waited >= GRACE {
                // Its session never got the COMMIT, or is stuck at it.
                let xid32 = (xid & 0xffff_ffff).to_string();
                db.query(Q_END_SESSION, &[&backend, &xid32])
                    .map_err(|e| format!("ending its session {backend}: {}", e.at(target)))?;
                ended = true;
            }
            std::thread::sleep(POLL);
        }
    }

    fn in_doubt(&self, xid: i64, why: &str, doubt: &str) -> Fail {
        Fail::Store(StoreError::PostgresInDoubt {
            target: self.target.clone(),
            message: format!(
                "the COMMIT of transaction {xid} went unanswered ({why}) and whether it \
                 committed is not known ({doubt}): the write may have been done, and was \
                 not done again"
            ),
        })
    }
}
