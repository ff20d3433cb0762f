//! Jobs (SPEC 10): one instruction over many items, run by worker agents.
//! The status machines of a job and of an item, each with its one transition
//! function, so no code path can, say, complete a cancelled job or give an
//! item a second result; the attempt outcome; and the item's place in its
//! retries (attempts left, backoff).

use std::fmt;

/// A job's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobStatus {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
}

/// An item's status. `Reported`: its result was delivered to the job's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ItemStatus {
    Pending,
    Running,
    Completed,
    Failed,
    Reported,
}

/// A refused move of a job's or an item's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IllegalJobTransition {
    pub what: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

impl fmt::Display for IllegalJobTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal {} status change from {} to {}",
            self.what, self.from, self.to
        )
    }
}

impl std::error::Error for IllegalJobTransition {}

impl JobStatus {
    pub const ALL: [JobStatus; 5] = [
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Completed,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.iter().copied().find(|j| j.as_str() == s)
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled
        )
    }

    /// The moves a job has: pending → running (start) or cancelled; running →
    /// completed (every item has its result), failed (items ran out of
    /// attempts, or `max_runtime_s`) or cancelled; failed → running when its
    /// failed items are retried (it reopens). Otherwise a finished job never
    /// moves: a cancelled or completed job is replayed as a new job instead.
    pub fn transition(self, to: JobStatus) -> Result<JobStatus, IllegalJobTransition> {
        use JobStatus::*;
        let ok = matches!(
            (self, to),
            (Pending, Running)
                | (Pending, Cancelled)
                | (Running, Completed)
                | (Running, Failed)
                | (Running, Cancelled)
                | (Failed, Running)
        );
        if ok {
            Ok(to)
        } else {
            Err(IllegalJobTransition {
                what: "job",
                from: self.as_str(),
                to: to.as_str(),
            })
        }
    }
}

impl ItemStatus {
    pub const ALL: [ItemStatus; 5] = [
        ItemStatus::Pending,
        ItemStatus::Running,
        ItemStatus::Completed,
        ItemStatus::Failed,
        ItemStatus::Reported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Pending => "pending",
            ItemStatus::Running => "running",
            ItemStatus::Completed => "completed",
            ItemStatus::Failed => "failed",
            ItemStatus::Reported => "reported",
        }
    }

    pub fn parse(s: &str) -> Option<ItemStatus> {
        ItemStatus::ALL.iter().copied().find(|i| i.as_str() == s)
    }

    /// Done for good: it has its one result (or was delivered).
    pub fn has_result(self) -> bool {
        matches!(self, ItemStatus::Completed | ItemStatus::Reported)
    }

    /// The moves an item has: pending → running (an attempt starts); running →
    /// completed (its current attempt's worker reported a valid result),
    /// pending (the attempt failed and attempts remain) or failed (none
    /// remain); failed → pending (retried by hand); completed → reported.
    /// Nothing leaves completed but to reported, so an item has one result.
    pub fn transition(self, to: ItemStatus) -> Result<ItemStatus, IllegalJobTransition> {
        use ItemStatus::*;
        let ok = matches!(
            (self, to),
            (Pending, Running)
                | (Running, Completed)
                | (Running, Pending)
                | (Running, Failed)
                | (Failed, Pending)
                | (Completed, Reported)
        );
        if ok {
            Ok(to)
        } else {
            Err(IllegalJobTransition {
                what: "item",
                from: self.as_str(),
                to: to.as_str(),
            })
        }
    }
}

/// Where a failed attempt sends its item: back to `pending` after a backoff
/// while attempts remain, else `failed`. `attempts` counts the attempts made
/// so far, the failed one included.
pub fn after_failure(attempts: u32, max_attempts: u32) -> (ItemStatus, Option<u64>) {
    if attempts < max_attempts {
        (ItemStatus::Pending, Some(backoff_ms(attempts)))
    } else {
        (ItemStatus::Failed, None)
    }
}

/// The pause before attempt `n + 1`: 1 s, 2 s, 4 s, ... at most 60 s.
pub fn backoff_ms(n: u32) -> u64 {
    1000u64
        .saturating_mul(1u64 << n.saturating_sub(1).min(6))
        .min(60_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_moves_forward_or_reopens_when_failed() {
        use JobStatus::*;
        for from in JobStatus::ALL {
            for to in JobStatus::ALL {
                let allowed = from.transition(to).is_ok();
                let expected = matches!(
                    (from, to),
                    (Pending, Running)
                        | (Pending, Cancelled)
                        | (Running, Completed)
                        | (Running, Failed)
                        | (Running, Cancelled)
                        | (Failed, Running)
                );
                assert_eq!(allowed, expected, "{from:?} -> {to:?}");
            }
            assert_eq!(JobStatus::parse(from.as_str()), Some(from));
        }
        let e = Completed.transition(Running).unwrap_err();
        assert_eq!(
            e.to_string(),
            "illegal job status change from completed to running"
        );
    }

    #[test]
    fn an_item_has_one_result() {
        use ItemStatus::*;
        for from in ItemStatus::ALL {
            for to in ItemStatus::ALL {
                let r = from.transition(to);
                if from.has_result() && to != Reported {
                    assert!(r.is_err(), "{from:?} -> {to:?} would give a second result");
                }
            }
            assert_eq!(ItemStatus::parse(from.as_str()), Some(from));
        }
        assert!(Running.transition(Completed).is_ok());
        assert!(Failed.transition(Pending).is_ok());
        assert!(
            Pending.transition(Completed).is_err(),
            "no result without an attempt"
        );
        assert!(Reported.transition(Pending).is_err());
    }

    #[test]
    fn a_failure_retries_until_the_attempts_run_out() {
        assert_eq!(after_failure(1, 3), (ItemStatus::Pending, Some(1000)));
        assert_eq!(after_failure(2, 3), (ItemStatus::Pending, Some(2000)));
        assert_eq!(after_failure(3, 3), (ItemStatus::Failed, None));
        assert_eq!(after_failure(1, 1), (ItemStatus::Failed, None));
        assert_eq!(backoff_ms(30), 60_000);
    }
}
