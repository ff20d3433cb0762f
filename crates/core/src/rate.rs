//! Rate limits on model calls (issue 31, docs/models.md "Rate limits"): the
//! requests and tokens a minute an agent (its policy's `model_rate`) and a
//! tenant (`quotas.models`) may send through brood's gateway, counted over
//! a fixed one-minute window.
//!
//! A [`Window`] opens at the first call counted after the previous one
//! closed and lasts [`WINDOW_MS`]; within it, a call is let through while
//! the calls already counted are fewer than the requests limit and the
//! tokens already metered are fewer than the tokens limit. Its state is two
//! counters and a start, whatever the limits or the rate of calls; a
//! refusal's `Retry-After` is exactly when the window closes. The price of
//! the fixed window (docs/decisions/models.md "Rate limits: a fixed window")
//! is that across the edge of two windows up to twice a limit may pass
//! within one minute; a sliding log would be exact but hold an entry per
//! call of the last minute.
//!
//! Tokens are known only once a call has been answered, so a call is
//! refused once the window's metered tokens have reached the limit: the
//! call that reaches it (and any sent at the same time) may pass it by its
//! own size.
//!
//! Time comes in as milliseconds on a clock that does not go back (the
//! runtime's monotonic one); this module reads none.

use std::fmt;

use crate::policy::ModelRate;

/// The length of a window: one minute.
pub const WINDOW_MS: u64 = 60_000;

/// Whose limit it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The agent's policy's `model_rate`.
    Agent,
    /// The tenant's, `quotas.models` of the configuration.
    Tenant,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Agent => "agent",
            Scope::Tenant => "tenant",
        }
    }
}

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Measure {
    Requests,
    Tokens,
}

impl Measure {
    /// The limit's key: `requests_per_minute` or `tokens_per_minute`.
    pub fn key(self) -> &'static str {
        match self {
            Measure::Requests => "requests_per_minute",
            Measure::Tokens => "tokens_per_minute",
        }
    }
}

/// A call refused: which limit, its value, what the window had counted,
/// and the whole seconds until the window closes (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Over {
    pub scope: Scope,
    pub measure: Measure,
    pub limit: u64,
    pub used: u64,
    pub retry_after_s: u64,
}

impl Over {
    /// Where the limit is set: the policy's `model_rate.…` for an agent,
    /// the configuration's `quotas.models.…` for a tenant.
    pub fn field(&self) -> String {
        match self.scope {
            Scope::Agent => format!("model_rate.{}", self.measure.key()),
            Scope::Tenant => format!("quotas.models.{}", self.measure.key()),
        }
    }
}

impl fmt::Display for Over {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.measure {
            Measure::Requests => "calls",
            Measure::Tokens => "tokens",
        };
        write!(
            f,
            "the {} rate limit {} = {} is reached ({} {what} in this minute's window); \
             retry in {} s",
            self.scope.as_str(),
            self.field(),
            self.limit,
            self.used,
            self.retry_after_s
        )
    }
}

/// One fixed one-minute window of calls (module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// When the window opened; `None` before the first call.
    start_ms: Option<u64>,
    requests: u64,
    tokens: u64,
}

impl Window {
    /// Whether the window is open at `now_ms`.
    fn open_at(&self, now_ms: u64) -> Option<u64> {
        self.start_ms
            .filter(|s| now_ms >= *s && now_ms - *s < WINDOW_MS)
    }

    /// The window as it counts at `now_ms`: a closed one is a new one.
    fn at(&mut self, now_ms: u64) {
        if self.open_at(now_ms).is_none() {
            *self = Window {
                start_ms: Some(now_ms),
                requests: 0,
                tokens: 0,
            };
        }
    }

    /// Whether a call at `now_ms` is within `limits`; counts nothing.
    /// Requests are checked first: a window that reached both says so.
    pub fn check(&self, now_ms: u64, limits: &ModelRate, scope: Scope) -> Result<(), Over> {
        let Some(start) = self.open_at(now_ms) else {
            return Ok(());
        };
        let left_ms = start + WINDOW_MS - now_ms;
        let over = |measure, limit, used| Over {
            scope,
            measure,
            limit,
            used,
            retry_after_s: left_ms.div_ceil(1000).max(1),
        };
        if let Some(limit) = limits.requests_per_minute
            && self.requests >= limit
        {
            return Err(over(Measure::Requests, limit, self.requests));
        }
        if let Some(limit) = limits.tokens_per_minute
            && self.tokens >= limit
        {
            return Err(over(Measure::Tokens, limit, self.tokens));
        }
        Ok(())
    }

    /// A call sent at `now_ms` counted.
    pub fn count_request(&mut self, now_ms: u64) {
        self.at(now_ms);
        self.requests = self.requests.saturating_add(1);
    }

    /// `tokens` metered of a call that ended at `now_ms` counted (in the
    /// window open then, or a new one).
    pub fn count_tokens(&mut self, now_ms: u64, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.at(now_ms);
        self.tokens = self.tokens.saturating_add(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(r: Option<u64>, t: Option<u64>) -> ModelRate {
        ModelRate {
            requests_per_minute: r,
            tokens_per_minute: t,
        }
    }

    #[test]
    fn requests_are_refused_at_the_limit_until_the_window_closes() {
        let l = limits(Some(3), None);
        let mut w = Window::default();
        for i in 0..3 {
            assert_eq!(w.check(1000 + i, &l, Scope::Agent), Ok(()));
            w.count_request(1000 + i);
        }
        let over = w.check(1500, &l, Scope::Agent).unwrap_err();
        assert_eq!(
            over,
            Over {
                scope: Scope::Agent,
                measure: Measure::Requests,
                limit: 3,
                used: 3,
                // The window opened at 1000 and closes at 61000.
                retry_after_s: 60,
            }
        );
        assert_eq!(over.field(), "model_rate.requests_per_minute");
        assert_eq!(
            over.to_string(),
            "the agent rate limit model_rate.requests_per_minute = 3 is reached \
             (3 calls in this minute's window); retry in 60 s"
        );
        // Rounded up, never 0 while the window is open.
        assert_eq!(
            w.check(60_999, &l, Scope::Agent).unwrap_err().retry_after_s,
            1
        );
        assert_eq!(
            w.check(59_001, &l, Scope::Agent).unwrap_err().retry_after_s,
            2
        );
        // Closed: a new window, counted from the next call.
        assert_eq!(w.check(61_000, &l, Scope::Agent), Ok(()));
        w.count_request(61_000);
        assert_eq!(w.requests, 1);
        assert_eq!(w.start_ms, Some(61_000));
    }

    #[test]
    fn tokens_are_refused_once_the_metered_tokens_reach_the_limit() {
        let l = limits(None, Some(2000));
        let mut w = Window::default();
        w.count_request(0);
        // A call's tokens are known at its end: it may pass the limit.
        w.count_tokens(10, 1500);
        assert_eq!(w.check(20, &l, Scope::Tenant), Ok(()));
        w.count_request(20);
        w.count_tokens(30, 1500);
        let over = w.check(40, &l, Scope::Tenant).unwrap_err();
        assert_eq!(
            (over.measure, over.limit, over.used),
            (Measure::Tokens, 2000, 3000)
        );
        assert_eq!(over.field(), "quotas.models.tokens_per_minute");
        // No tokens limit: never refused for tokens.
        assert_eq!(w.check(40, &limits(Some(5), None), Scope::Agent), Ok(()));
    }

    #[test]
    fn unlimited_never_refuses_and_a_fresh_window_is_empty() {
        let mut w = Window::default();
        for t in 0..10_000 {
            w.count_request(t);
            w.count_tokens(t, 1_000_000);
            assert_eq!(w.check(t, &ModelRate::default(), Scope::Agent), Ok(()));
        }
        assert_eq!(
            Window::default().check(5, &limits(Some(1), Some(1)), Scope::Agent),
            Ok(())
        );
    }

    #[test]
    fn tokens_metered_after_the_window_closed_open_a_new_one() {
        let l = limits(None, Some(100));
        let mut w = Window::default();
        w.count_request(0);
        w.count_tokens(70_000, 500);
        assert_eq!(w.start_ms, Some(70_000));
        assert_eq!(w.requests, 0);
        assert!(w.check(70_001, &l, Scope::Agent).is_err());
        assert_eq!(w.check(130_000, &l, Scope::Agent), Ok(()));
    }

    #[test]
    fn a_clock_before_the_window_s_start_counts_as_closed() {
        // The runtime's clock does not go back; if a caller's did, the
        // window restarts rather than refusing for ever.
        let l = limits(Some(1), None);
        let mut w = Window::default();
        w.count_request(100_000);
        assert!(w.check(100_001, &l, Scope::Agent).is_err());
        assert_eq!(w.check(5, &l, Scope::Agent), Ok(()));
    }
}
