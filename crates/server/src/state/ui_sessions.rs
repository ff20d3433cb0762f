//! The web UI's sessions, kept server-side (`ui::session` logs in and out
//! with them): each cookie's digest and its times, ended when idle or old.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::secret::{digest, new_secret};

/// How long a UI session lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UiLimits {
    /// Ended after this long without a request.
    pub idle: Duration,
    /// Ended this long after the login, however busy.
    pub max: Duration,
}

impl Default for UiLimits {
    /// An hour idle, twelve in all: a working day at the dashboard logs in
    /// once or twice, and a cookie left behind is dead within the hour.
    fn default() -> Self {
        UiLimits {
            idle: Duration::from_secs(3600),
            max: Duration::from_secs(12 * 3600),
        }
    }
}

/// At most this many sessions at once; the least recently used goes first.
/// Only a token holder makes one, so this bounds a runaway script, not an
/// attacker.
const MAX_SESSIONS: usize = 256;

struct Times {
    made: Instant,
    used: Instant,
}

/// The UI's sessions, kept server-side: each cookie's digest and its times.
#[derive(Default)]
pub(crate) struct UiSessions(Mutex<(UiLimits, HashMap<[u8; 32], Times>)>);

impl UiSessions {
    pub(crate) fn set_limits(&self, limits: UiLimits) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0 = limits;
    }

    pub(crate) fn limits(&self) -> UiLimits {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// A new session: its cookie value.
    pub(crate) fn open(&self) -> std::io::Result<String> {
        let value = new_secret()?;
        let now = Instant::now();
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (limits, map) = &mut *g;
        let limits = *limits;
        map.retain(|_, t| live(&limits, t, now));
        while map.len() >= MAX_SESSIONS {
            let Some(oldest) = map.iter().min_by_key(|(_, t)| t.used).map(|(k, _)| *k) else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(
            digest(&value),
            Times {
                made: now,
                used: now,
            },
        );
        Ok(value)
    }

    /// Whether `value` is a live session, which this request then uses;
    /// an ended one is forgotten.
    pub(crate) fn check(&self, value: &str) -> bool {
        let now = Instant::now();
        let key = digest(value);
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (limits, map) = &mut *g;
        let limits = *limits;
        match map.get_mut(&key) {
            Some(t) if live(&limits, t, now) => {
                t.used = now;
                true
            }
            Some(_) => {
                map.remove(&key);
                false
            }
            None => false,
        }
    }

    pub(crate) fn close(&self, value: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .remove(&digest(value));
    }
}

fn live(limits: &UiLimits, t: &Times, now: Instant) -> bool {
    now.duration_since(t.used) < limits.idle && now.duration_since(t.made) < limits.max
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{UiLimits, UiSessions};

    #[test]
    fn a_session_is_random_and_ends_at_logout_idle_or_its_age() {
        let s = UiSessions::default();
        let a = s.open().unwrap();
        let b = s.open().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(s.check(&a) && s.check(&b));
        assert!(!s.check("0123"), "not a session");
        s.close(&a);
        assert!(!s.check(&a), "logged out");
        assert!(s.check(&b), "the other lives on");
        s.set_limits(UiLimits {
            idle: Duration::ZERO,
            max: Duration::from_secs(60),
        });
        assert!(!s.check(&b), "idle past the limit");
        s.set_limits(UiLimits {
            idle: Duration::from_secs(60),
            max: Duration::ZERO,
        });
        let c = s.open().unwrap();
        assert!(!s.check(&c), "older than the limit");
    }
}
