//! The work one caller may cause (issue 24): items in one job, unfinished
//! jobs and items of a tenant, agents created a second by one caller. Each
//! limit is refused with a 4xx naming it (`TooLarge` 413, `QuotaJobs`,
//! `QuotaItems`, `RateLimited` 429), and each comes from `[limits]` in the
//! platform configuration file (`config`), with defaults generous enough
//! that brood's own tests, demo and benchmarks never meet them.
//!
//! The rate is a token bucket per caller (the operator's uid, or the agent):
//! `agents_burst` creations at once, refilled at `agents_per_second`. A
//! refusal tells when one token will be back (`Retry-After`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use brood_core::Code;

use crate::api::{ApiError, Caller};

/// The limits in force (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Items one job may hold (413 beyond).
    pub items_per_job: u32,
    /// Jobs of a tenant not finished (pending or running) at once (429 beyond).
    pub jobs_per_tenant: u32,
    /// Items in a tenant's unfinished jobs, all together (429 beyond).
    pub items_per_tenant: u64,
    /// Agents one caller may create a second, sustained.
    pub agents_per_second: f64,
    /// Agents one caller may create at once, before the rate applies.
    pub agents_burst: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            items_per_job: 100_000,
            jobs_per_tenant: 1_000,
            items_per_tenant: 1_000_000,
            // A spawn to `ready` takes about 2.4 ms (docs/benchmarks.md), so a
            // caller that waits for each start, as every benchmark does,
            // makes about 400 a second; `brood bench cascade`'s rounds of
            // 1,001 agents fit the burst whole.
            agents_per_second: 500.0,
            agents_burst: 2_000,
        }
    }
}

/// One caller's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The token buckets of every caller that created agents lately.
#[derive(Debug, Default)]
pub struct Rates {
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// Buckets kept before full ones (callers idle long enough to have all their
/// tokens back) are dropped: a full bucket is the same as none.
const KEPT: usize = 4096;

impl Rates {
    /// Takes one creation from `caller`'s bucket, or refuses with the time
    /// until one is back.
    pub fn take(&self, limits: &Limits, caller: &Caller, now: Instant) -> Result<(), ApiError> {
        let burst = f64::from(limits.agents_burst.max(1));
        let rate = limits.agents_per_second;
        let key = match caller {
            Caller::User { uid } => format!("user:{uid}"),
            Caller::Agent(a) => format!("agent:{a}"),
        };
        let mut m = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if m.len() >= KEPT {
            m.retain(|_, b| b.tokens + rate * now.duration_since(b.at).as_secs_f64() < burst);
        }
        let b = m.entry(key).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refilled = b.tokens + rate * now.duration_since(b.at).as_secs_f64();
        b.tokens = refilled.min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = if rate > 0.0 {
            Duration::from_secs_f64((1.0 - b.tokens) / rate)
        } else {
            Duration::from_secs(3600)
        };
        // Retry-After is in whole seconds: rounded up, at least 1.
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let secs = secs.max(1);
        let who = match caller {
            Caller::User { uid } => format!("the operator (uid {uid})"),
            Caller::Agent(a) => format!("agent {a}"),
        };
        Err(ApiError::new(
            Code::RateLimited,
            format!(
                "{who} creates agents faster than the limit agents_per_second = {rate} \
                 (agents_burst = {}); try again in {secs} s",
                limits.agents_burst
            ),
        )
        .retry_after(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_then_the_rate_then_a_refusal_naming_when() {
        let limits = Limits {
            agents_per_second: 2.0,
            agents_burst: 3,
            ..Limits::default()
        };
        let rates = Rates::default();
        let me = Caller::User { uid: 7 };
        let other = Caller::Agent(brood_core::AgentName::new("a").unwrap());
        let t0 = Instant::now();
        for _ in 0..3 {
            rates.take(&limits, &me, t0).unwrap();
        }
        let e = rates.take(&limits, &me, t0).unwrap_err();
        assert_eq!(e.code, Code::RateLimited);
        assert_eq!(e.retry_after_s, Some(1));
        assert!(e.message.contains("agents_per_second = 2"), "{}", e.message);
        // Another caller has a bucket of its own.
        rates.take(&limits, &other, t0).unwrap();
        // Half a second gives one token back at 2 a second.
        rates
            .take(&limits, &me, t0 + Duration::from_millis(500))
            .unwrap();
        assert!(
            rates
                .take(&limits, &me, t0 + Duration::from_millis(500))
                .is_err()
        );
    }
}
