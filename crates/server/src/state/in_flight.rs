//! The idempotency keys whose first request is still being served: a
//! second request with the same key waits for the first one's answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Keys whose first request is still being served.
#[derive(Default)]
pub(crate) struct InFlight(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl InFlight {
    pub(crate) fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry(key.to_owned()).or_default().clone()
    }

    pub(crate) fn release(&self, key: &str) {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the map holds it once nobody waits on it.
        if m.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            m.remove(key);
        }
    }
}
