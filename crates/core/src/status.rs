//! The agent status machine of SPEC 6 and its one mapping onto the ctx ABI.
//!
//! `Status` is what the store records and the API shows. Every change goes through
//! [`Status::transition`], which refuses the moves the lifecycle does not have, so
//! no code path can, say, complete a closed agent or resume a running one. The ABI
//! files (process `status`, session `state`, channel `status`) say the same truth in
//! their own words; [`Status::abi`] is the only place that translation lives, and
//! `docs/lifecycle.md` shows it as a table.

use std::fmt;

/// Why a run failed (SPEC 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    ExitCode,
    Crashed,
    ProtocolError,
    TimedOut,
    BudgetExceeded,
    Lost,
    ExitedWithoutResult,
}

/// Why an agent was cancelled (SPEC 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelReason {
    ParentDead,
    ParentCancelled,
    User,
    JobCancelled,
    RuntimeRestart,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Terminal {
    Completed,
    Failed(FailReason),
    Cancelled(CancelReason),
}

/// An agent's status. `Stopping` is the window between recording a stop and the
/// process being gone (SPEC 6 "intent recorded first"); it carries the outcome that
/// was decided, so a crash in between can finish the job at the next start.
/// `Closed` keeps the outcome of the run it closed, so `wait` still answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Queued,
    Running,
    Blocked,
    Stopping(Terminal),
    Ended(Terminal),
    Closed(Terminal),
}

/// A refused move of the status machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IllegalTransition {
    pub from: Status,
    pub to: Status,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal status change from {} to {}",
            self.from.encode(),
            self.to.encode()
        )
    }
}

impl std::error::Error for IllegalTransition {}

/// The process status word of the ABI (`status` control file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStatus {
    Start,
    Ready,
    Busy,
    Idle,
    Stopping,
    Dead,
}

/// The session `state` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    Active,
    Idle,
    Done,
    Error,
    Cancelled,
}

/// The parent's channel `status` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelStatus {
    Pending,
    Active,
    Done,
    Error,
    Cancelled,
}

/// One status seen through the three ABI files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbiView {
    pub process: ProcessStatus,
    pub session: SessionState,
    pub channel: ChannelStatus,
}

impl FailReason {
    pub const ALL: [FailReason; 7] = [
        FailReason::ExitCode,
        FailReason::Crashed,
        FailReason::ProtocolError,
        FailReason::TimedOut,
        FailReason::BudgetExceeded,
        FailReason::Lost,
        FailReason::ExitedWithoutResult,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::ExitCode => "exit_code",
            FailReason::Crashed => "crashed",
            FailReason::ProtocolError => "protocol_error",
            FailReason::TimedOut => "timed_out",
            FailReason::BudgetExceeded => "budget_exceeded",
            FailReason::Lost => "lost",
            FailReason::ExitedWithoutResult => "exited_without_result",
        }
    }
    pub fn parse(s: &str) -> Option<FailReason> {
        FailReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl CancelReason {
    pub const ALL: [CancelReason; 5] = [
        CancelReason::ParentDead,
        CancelReason::ParentCancelled,
        CancelReason::User,
        CancelReason::JobCancelled,
        CancelReason::RuntimeRestart,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::ParentDead => "parent_dead",
            CancelReason::ParentCancelled => "parent_cancelled",
            CancelReason::User => "user",
            CancelReason::JobCancelled => "job_cancelled",
            CancelReason::RuntimeRestart => "runtime_restart",
        }
    }
    pub fn parse(s: &str) -> Option<CancelReason> {
        CancelReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl Terminal {
    /// `completed`, `failed:<reason>` or `cancelled:<reason>`.
    pub fn encode(self) -> String {
        match self {
            Terminal::Completed => "completed".to_owned(),
            Terminal::Failed(r) => format!("failed:{}", r.as_str()),
            Terminal::Cancelled(r) => format!("cancelled:{}", r.as_str()),
        }
    }
    pub fn decode(s: &str) -> Option<Terminal> {
        match s.split_once(':') {
            None if s == "completed" => Some(Terminal::Completed),
            Some(("failed", r)) => FailReason::parse(r).map(Terminal::Failed),
            Some(("cancelled", r)) => CancelReason::parse(r).map(Terminal::Cancelled),
            _ => None,
        }
    }
    /// The API status word of this outcome.
    pub fn word(self) -> &'static str {
        match self {
            Terminal::Completed => "completed",
            Terminal::Failed(_) => "failed",
            Terminal::Cancelled(_) => "cancelled",
        }
    }
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Terminal::Completed => None,
            Terminal::Failed(r) => Some(r.as_str()),
            Terminal::Cancelled(r) => Some(r.as_str()),
        }
    }
    /// The exit code of `brood wait` for this outcome (SPEC 4: like `waitpid`).
    pub fn wait_exit_code(self) -> i32 {
        match self {
            Terminal::Completed => 0,
            Terminal::Failed(_) => 1,
            Terminal::Cancelled(_) => 130,
        }
    }
}

impl Status {
    /// Applies a move, or refuses it. This is the one place the lifecycle's arrows
    /// live (SPEC 6):
    ///
    /// ```text
    /// queued ──► running ◄──► blocked
    ///    │          │ (stopping: intent recorded, process still alive)
    ///    ▼          ▼
    /// cancelled  completed | failed | cancelled ──► closed
    /// ended or closed ──► queued   (resume: a new run on the same session)
    /// ```
    pub fn transition(self, to: Status) -> Result<Status, IllegalTransition> {
        use Status::*;
        let ok = match (self, to) {
            (Queued, Running) => true,
            // Cancelled before its process started, or the start itself failed.
            (Queued, Ended(Terminal::Cancelled(_) | Terminal::Failed(_))) => true,
            (Queued, Stopping(Terminal::Cancelled(_))) => true,
            (Running, Blocked) | (Blocked, Running) => true,
            (Running | Blocked, Stopping(_) | Ended(_)) => true,
            // The outcome decided when the stop was recorded is the one that stands.
            (Stopping(a), Ended(b)) => a == b,
            (Ended(a), Closed(b)) => a == b,
            (Ended(_) | Closed(_), Queued) => true,
            _ => false,
        };
        if ok {
            Ok(to)
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// True while a process may exist for this agent.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Status::Running | Status::Blocked | Status::Stopping(_)
        )
    }

    /// True when the agent's current run is over (ended or closed).
    pub fn is_finished(self) -> bool {
        matches!(self, Status::Ended(_) | Status::Closed(_))
    }

    /// The outcome of the current run, once decided.
    pub fn outcome(self) -> Option<Terminal> {
        match self {
            Status::Stopping(t) | Status::Ended(t) | Status::Closed(t) => Some(t),
            _ => None,
        }
    }

    /// The status word the API shows: one of SPEC 6's
    /// `queued running blocked completed failed cancelled closed`. A stopping
    /// agent still has a process, so it shows `running`.
    pub fn api_word(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running | Status::Stopping(_) => "running",
            Status::Blocked => "blocked",
            Status::Ended(t) => t.word(),
            Status::Closed(_) => "closed",
        }
    }

    /// The reason shown next to the status, if any.
    pub fn reason(self) -> Option<&'static str> {
        self.outcome().and_then(Terminal::reason)
    }

    /// A stable text form for the store and for people:
    /// `queued`, `running`, `blocked`, `stopping/<terminal>`, `<terminal>`,
    /// `closed/<terminal>` where `<terminal>` is [`Terminal::encode`].
    pub fn encode(self) -> String {
        match self {
            Status::Queued => "queued".to_owned(),
            Status::Running => "running".to_owned(),
            Status::Blocked => "blocked".to_owned(),
            Status::Stopping(t) => format!("stopping/{}", t.encode()),
            Status::Ended(t) => t.encode(),
            Status::Closed(t) => format!("closed/{}", t.encode()),
        }
    }

    pub fn decode(s: &str) -> Option<Status> {
        match s {
            "queued" => return Some(Status::Queued),
            "running" => return Some(Status::Running),
            "blocked" => return Some(Status::Blocked),
            _ => {}
        }
        if let Some(t) = s.strip_prefix("stopping/") {
            return Terminal::decode(t).map(Status::Stopping);
        }
        if let Some(t) = s.strip_prefix("closed/") {
            return Terminal::decode(t).map(Status::Closed);
        }
        Terminal::decode(s).map(Status::Ended)
    }

    /// The one mapping from a status to the ABI's words (table in docs/lifecycle.md).
    pub fn abi(self) -> AbiView {
        use ChannelStatus as C;
        use ProcessStatus as P;
        use SessionState as S;
        let (process, session, channel) = match self {
            Status::Queued => (P::Start, S::Idle, C::Pending),
            Status::Running => (P::Busy, S::Active, C::Active),
            Status::Blocked => (P::Idle, S::Idle, C::Active),
            Status::Stopping(_) => (P::Stopping, S::Active, C::Active),
            Status::Ended(t) | Status::Closed(t) => match t {
                Terminal::Completed => (P::Dead, S::Done, C::Done),
                Terminal::Failed(_) => (P::Dead, S::Error, C::Error),
                Terminal::Cancelled(_) => (P::Dead, S::Cancelled, C::Cancelled),
            },
        };
        AbiView {
            process,
            session,
            channel,
        }
    }
}

impl ProcessStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessStatus::Start => "start",
            ProcessStatus::Ready => "ready",
            ProcessStatus::Busy => "busy",
            ProcessStatus::Idle => "idle",
            ProcessStatus::Stopping => "stopping",
            ProcessStatus::Dead => "dead",
        }
    }
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Active => "active",
            SessionState::Idle => "idle",
            SessionState::Done => "done",
            SessionState::Error => "error",
            SessionState::Cancelled => "cancelled",
        }
    }
}

impl ChannelStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelStatus::Pending => "pending",
            ChannelStatus::Active => "active",
            ChannelStatus::Done => "done",
            ChannelStatus::Error => "error",
            ChannelStatus::Cancelled => "cancelled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn terminals() -> Vec<Terminal> {
        let mut v = vec![Terminal::Completed];
        v.extend(FailReason::ALL.map(Terminal::Failed));
        v.extend(CancelReason::ALL.map(Terminal::Cancelled));
        v
    }

    fn all_statuses() -> Vec<Status> {
        let mut v = vec![Status::Queued, Status::Running, Status::Blocked];
        for t in terminals() {
            v.extend([Status::Stopping(t), Status::Ended(t), Status::Closed(t)]);
        }
        v
    }

    #[test]
    fn encode_decode_round_trips_every_status() {
        for s in all_statuses() {
            assert_eq!(Status::decode(&s.encode()), Some(s), "{}", s.encode());
        }
        assert_eq!(Status::decode("failed:nope"), None);
        assert_eq!(Status::decode("stopping"), None);
    }

    #[test]
    fn the_lifecycle_arrows_are_allowed() {
        use Status::*;
        let dead = Terminal::Cancelled(CancelReason::ParentDead);
        for (a, b) in [
            (Queued, Running),
            (Queued, Ended(dead)),
            (Running, Blocked),
            (Blocked, Running),
            (Running, Stopping(dead)),
            (Stopping(dead), Ended(dead)),
            (Running, Ended(Terminal::Completed)),
            (Ended(Terminal::Completed), Closed(Terminal::Completed)),
            (Ended(dead), Queued),
            (Closed(Terminal::Completed), Queued),
        ] {
            assert_eq!(a.transition(b), Ok(b), "{a:?} -> {b:?}");
        }
    }

    #[test]
    fn illegal_moves_are_refused_by_name() {
        use Status::*;
        let done = Terminal::Completed;
        let dead = Terminal::Cancelled(CancelReason::ParentDead);
        for (a, b) in [
            (Running, Queued),
            (Queued, Ended(done)),
            (Ended(done), Running),
            (Closed(done), Ended(done)),
            (Stopping(dead), Ended(done)),
            (Ended(done), Closed(dead)),
            (Running, Closed(done)),
            (Queued, Queued),
        ] {
            let e = a.transition(b).unwrap_err();
            assert_eq!((e.from, e.to), (a, b));
            assert!(e.to_string().starts_with("illegal status change from"));
        }
    }

    #[test]
    fn abi_mapping_table() {
        use ChannelStatus as C;
        use ProcessStatus as P;
        use SessionState as S;
        let rows = [
            (Status::Queued, P::Start, S::Idle, C::Pending),
            (Status::Running, P::Busy, S::Active, C::Active),
            (Status::Blocked, P::Idle, S::Idle, C::Active),
            (
                Status::Stopping(Terminal::Completed),
                P::Stopping,
                S::Active,
                C::Active,
            ),
            (
                Status::Ended(Terminal::Completed),
                P::Dead,
                S::Done,
                C::Done,
            ),
            (
                Status::Ended(Terminal::Failed(FailReason::Lost)),
                P::Dead,
                S::Error,
                C::Error,
            ),
            (
                Status::Closed(Terminal::Cancelled(CancelReason::User)),
                P::Dead,
                S::Cancelled,
                C::Cancelled,
            ),
        ];
        for (s, p, ss, c) in rows {
            assert_eq!(
                s.abi(),
                AbiView {
                    process: p,
                    session: ss,
                    channel: c
                }
            );
        }
    }

    fn any_status() -> impl Strategy<Value = Status> {
        let all = all_statuses();
        (0..all.len()).prop_map(move |i| all[i])
    }

    proptest! {
        /// Whatever path is taken through the machine, these hold: only a finished
        /// agent can be resumed, an outcome once decided never changes before the run
        /// is over, and a dead process is never shown as live.
        #[test]
        fn walks_keep_the_invariants(start in any_status(), steps in proptest::collection::vec(any_status(), 0..40)) {
            let mut s = start;
            for next in steps {
                if let Ok(n) = s.transition(next) {
                    if n == Status::Queued { prop_assert!(s.is_finished()); }
                    if let (Some(a), Some(b)) = (s.outcome(), n.outcome())
                        && n != Status::Queued
                    {
                        prop_assert_eq!(a, b);
                    }
                    s = n;
                }
                prop_assert_eq!(s.abi().process == ProcessStatus::Dead, s.is_finished());
            }
        }
    }
}
