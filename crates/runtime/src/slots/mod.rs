//! Concurrency-slot counters (SPEC 9): how many started processes each tenant has.
//!
//! The supervisors' own agents are the truth; a counter is the fast path the
//! dispatcher consults at every start and end, one call (one round trip) each. A
//! reconciler recomputes each supervisor's share from its live agents every
//! [`RECONCILE_PERIOD`] and calls [`Slots::repair`], and gives back the shares of
//! supervisors that are gone ([`Slots::forget_holders`], judged from the store's
//! registry and the process table), so whatever drift a crash, a lost reply or a
//! dead supervisor leaves behind is corrected within one period.
//!
//! * [`Embedded`] (`embedded.rs`): an in-process map, the default (one
//!   supervisor).
//! * [`StoreShares`] (`store.rs`): a share a supervisor in the store itself, for
//!   nodes that share a store but no Redis (issue 15).
//! * [`Redis`] (`redis.rs`): `brood:slots:<tenant>`, a share a supervisor, in a
//!   Redis server shared by several supervisors, spoken to over one blocking
//!   connection of the `redis` crate, each call one Lua script.
//!
//! [`open`] picks one from the configured URL.

mod embedded;
mod redis;
mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use brood_core::TenantId;

// `self::` because `redis` alone would also name the crate of that name.
pub use self::embedded::Embedded;
pub use self::redis::Redis;
pub use self::store::StoreShares;

/// How often the reconciler recomputes the counts (SPEC 9).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(30);

/// How long a Redis counter outlives its last write: three reconcile periods. A
/// live supervisor's reconciler rewrites every counter it owns each period, so only
/// a counter whose supervisors are all gone reaches it, and then it disappears on
/// its own instead of holding slots nobody uses.
pub const DEFAULT_TTL: Duration = Duration::from_secs(90);

/// How long connecting to Redis, or waiting for one reply, may take. The counter
/// is called from the dispatcher loop: a Redis that stopped answering must turn
/// into an error quickly, not a hung supervisor.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A failed slot-counter operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// The configured URL cannot be used.
    #[error("slot counter URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// The store's shares (nodes sharing no Redis) could not be read or written.
    #[error("slot counter in the store: {command} failed: {detail}")]
    Store {
        command: &'static str,
        detail: String,
    },
    /// The counter lost its counts (a Redis restarted empty): what it says
    /// is held is not what runs. The caller seeds it again from what it
    /// knows ([`Slots::reseed`]) before asking again.
    #[error(
        "slot counter at {url}: its counts were lost (restarted empty?); they must be seeded again"
    )]
    Lost { url: String },
    /// Redis could not be reached, broke the connection, or refused a command.
    #[error("slot counter at {url}: {command} failed: {detail}")]
    Redis {
        url: String,
        command: &'static str,
        detail: String,
    },
}

/// A per-tenant counter of held concurrency slots.
///
/// Every method is one synchronous call (for [`Redis`], one round trip): they run
/// on the supervisor's dispatcher loop, once per burst of process starts and
/// once per command's ends.
pub trait Slots: Send + Sync {
    /// Takes a slot for `tenant` if fewer than `max` are held; `false` (and nothing
    /// taken) when all `max` are.
    fn acquire(&self, tenant: &TenantId, max: u32) -> Result<bool, SlotError>;
    /// Gives a slot back. Never takes the count below 0: a release without an
    /// acquire is drift, which the reconciler repairs, not a negative count.
    fn release(&self, tenant: &TenantId) -> Result<(), SlotError>;
    /// Takes up to `want` slots for `tenant` at once, as many as keep it at
    /// or under `max`; how many. One call for a burst of starts: the
    /// store's shares take them in one transaction; the others take one at
    /// a time, and an error after some were taken says how many.
    fn acquire_up_to(&self, tenant: &TenantId, max: u32, want: u32) -> Result<u32, SlotError> {
        let mut got = 0;
        while got < want {
            match self.acquire(tenant, max) {
                Ok(true) => got += 1,
                Ok(false) => break,
                // The slots taken so far are held: say so rather than lose them.
                Err(e) if got > 0 => {
                    tracing::warn!(error = %e, got, "slot counter failed part-way through a burst");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }
    /// Gives `n` slots back at once (never below 0).
    fn release_n(&self, tenant: &TenantId, n: u32) -> Result<(), SlotError> {
        for _ in 0..n {
            self.release(tenant)?;
        }
        Ok(())
    }
    /// The slots `tenant` holds according to the counter.
    fn count(&self, tenant: &TenantId) -> Result<u64, SlotError>;
    /// Sets this supervisor's share of the count to `actual` (the slots its
    /// own started agents hold, which it alone knows exactly) and returns
    /// the drift it found: the share's old value minus `actual` (positive:
    /// the counter over-counted and was refusing starts it should have
    /// allowed).
    fn repair(&self, tenant: &TenantId, actual: u64) -> Result<i64, SlotError>;
    /// Gives back the shares of the supervisors `alive` says are gone (their
    /// agents died with them); the slots freed. A counter of one supervisor
    /// has no other shares.
    fn forget_holders(
        &self,
        tenant: &TenantId,
        alive: &dyn Fn(&str) -> bool,
    ) -> Result<u64, SlotError> {
        let _ = (tenant, alive);
        Ok(0)
    }
    /// Seeds a counter that lost its counts ([`SlotError::Lost`]): this
    /// supervisor's share set to `mine` (its own count, exact), and each
    /// other holder's to what the store records running on it, unless that
    /// holder has written its own meanwhile. Other holders' figures miss
    /// only their starts in flight, which their own reconciler adds back
    /// within a period; without the seed the count would say nothing of a
    /// holder that cannot write its share (stopped, say) until it can.
    /// Only a counter that can lose its counts has anything to do.
    fn reseed(
        &self,
        tenant: &TenantId,
        mine: u64,
        others: &[(String, u64)],
    ) -> Result<(), SlotError> {
        let _ = (tenant, mine, others);
        Ok(())
    }
    /// Which counter this is, for logs and `brood status` (no credentials).
    fn describe(&self) -> String;
}

/// The counter for a configured URL: none is [`Embedded`], `redis://` is
/// [`Redis`] (checked with a PING, so a wrong address fails at start, not at the
/// first spawn; a supervisor's start asks again for a while through
/// [`open_waiting`]), holding its slots as `holder` (the supervisor's id).
pub fn open(url: Option<&str>, holder: &str) -> Result<Arc<dyn Slots>, SlotError> {
    match url {
        None => Ok(Arc::new(Embedded::new())),
        Some(url) => Ok(Arc::new(Redis::connect(url, holder)?)),
    }
}

/// How long a starting supervisor waits for its Redis to answer (see
/// [`open_waiting`]): longer than a Redis restart takes, short enough that a
/// wrong address still fails the start for the operator to see.
pub const START_WAIT: Duration = Duration::from_secs(15);

/// [`open`], but a Redis that cannot be reached is asked again, with backoff,
/// until `wait` has passed. A refused connection at start is either a wrong
/// address or a Redis restarting, and nothing tells them apart; a running
/// supervisor already rides out the second (docs/reliability.md "Redis is
/// away"), so a starting one does too rather than exit. A URL that cannot be
/// used fails at once: no wait makes it right.
pub fn open_waiting(
    url: Option<&str>,
    holder: &str,
    wait: Duration,
) -> Result<Arc<dyn Slots>, SlotError> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(50);
    loop {
        match open(url, holder) {
            Err(e @ SlotError::Redis { .. }) if Instant::now() + pause < deadline => {
                tracing::warn!(error = %e, "waiting for the slot counter to answer");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            answer => return answer,
        }
    }
}

/// The holders among `holders` that are gone: never the caller (`me`), nor
/// one `alive` vouches for.
pub(crate) fn gone<'a>(
    holders: impl Iterator<Item = &'a str>,
    me: &str,
    alive: &dyn Fn(&str) -> bool,
) -> Vec<&'a str> {
    holders
        .filter(|h| !h.is_empty() && *h != me && !alive(h))
        .collect()
}

/// Drift as the trait reports it: old minus actual, saturating rather than
/// wrapping for counts no real tree reaches.
pub(crate) fn drift(old: i64, actual: u64) -> i64 {
    old.saturating_sub(i64::try_from(actual).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::drift;

    #[test]
    fn drift_saturates() {
        assert_eq!(drift(50, 3), 47);
        assert_eq!(drift(0, 2), -2);
        assert_eq!(drift(-1, u64::MAX), i64::MIN);
    }
}
