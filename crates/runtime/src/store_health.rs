//! Whether the store answers, as this supervisor sees it (issue 27 item 5).
//! A probe on a thread of its own reads the store once a second, one read
//! at a time, and keeps what it found; `/healthz` then says at once whether
//! the store is away, without asking the store and without the dispatcher
//! (which may be inside a call that does not come back before its deadline).
//! One read in flight at most, so a store that is away holds one of its
//! connections for the probe, never more.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use brood_core::TenantId;
use brood_store::Store;

/// A probe that has not answered after this long means the store is not
/// answering (its round trips take milliseconds when it is there).
const LATE: Duration = Duration::from_secs(1);

pub struct StoreHealth {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the read in flight was sent, if one is.
    probing_since: Option<Instant>,
    /// What the last read that came back failed with.
    last_error: Option<String>,
}

impl StoreHealth {
    /// Starts the probe: a read of `tenant`'s last event number every
    /// `every`, for as long as someone holds the returned health.
    pub fn start(store: Arc<dyn Store>, tenant: TenantId, every: Duration) -> Arc<StoreHealth> {
        let health = Arc::new(StoreHealth {
            state: Mutex::new(State::default()),
        });
        let weak = Arc::downgrade(&health);
        let spawned = std::thread::Builder::new()
            .name("brood-store-probe".into())
            .spawn(move || {
                while let Some(h) = weak.upgrade() {
                    h.update(|s| s.probing_since = Some(Instant::now()));
                    let read = store.last_event_seq(&tenant);
                    h.update(|s| {
                        s.probing_since = None;
                        s.last_error = read.err().map(|e| e.to_string());
                    });
                    drop(h);
                    std::thread::sleep(every);
                }
            });
        if let Err(e) = spawned {
            // Not knowing is not "the store is away": say what is missing.
            health
                .update(|s| s.last_error = Some(format!("the store's probe could not start: {e}")));
        }
        health
    }

    /// `Ok` while the store answers: the last read came back, and none has
    /// been waiting longer than a second; otherwise why it does not.
    pub fn check(&self) -> Result<(), String> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = s.probing_since
            && t.elapsed() > LATE
        {
            return Err(format!(
                "the store has not answered for {:.1} s",
                t.elapsed().as_secs_f64()
            ));
        }
        match &s.last_error {
            Some(e) => Err(format!("the store's last read failed: {e}")),
            None => Ok(()),
        }
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
