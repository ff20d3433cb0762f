//! The one reader of the store's event log a server has (`GET /api/events`
//! subscribes to it): it reads what was appended whenever the supervisor's
//! dispatcher has handled a command (and every quarter second, for events
//! other supervisors of a shared store wrote) and broadcasts each batch. An
//! empty batch means "read the store": the hub could not follow the log for
//! a while (issue 28: a failed read is retried, never taken for "empty").

use std::sync::Arc;
use std::time::Duration;

use brood_runtime::Supervisor;
use brood_store::Event;
use tokio::sync::broadcast;

/// Events read from the store at a time.
pub(crate) const PAGE: u32 = 1000;
/// How often the hub looks at the store without being told of a change.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// The first and the longest pause between tries of a read that failed.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How far a subscriber may fall behind before it is told to resync.
#[derive(Debug, Clone, Copy)]
pub struct EventLimits {
    /// Batches of the log (one per change the hub read) it may lag by.
    pub backlog_batches: usize,
    /// Events its connection buffers while the client is not reading.
    pub connection_buffer: usize,
    /// How often an idle stream gets a `:` comment, which keeps it (and any
    /// proxy on the way) open and tells the client the server is alive.
    pub keep_alive: Duration,
}

impl Default for EventLimits {
    fn default() -> EventLimits {
        EventLimits {
            backlog_batches: 1024,
            connection_buffer: 256,
            keep_alive: Duration::from_secs(15),
        }
    }
}

/// An event as the control plane shows it (SPEC 11: `type event_id timestamp
/// sequence tenant agent run session` and a `payload`).
pub fn event_json(e: &Event) -> brood_api::Event {
    brood_api::Event {
        kind: e.kind.clone(),
        event_id: format!("{}-{}", e.tenant, e.seq),
        timestamp: e.ts_ms,
        sequence: e.seq,
        tenant: e.tenant.to_string(),
        agent: e.agent.to_string(),
        run: e.run.as_ref().map(|r| r.to_string()),
        session: e.session.to_string(),
        payload: serde_json::from_str(&e.payload).unwrap_or(serde_json::Value::Null),
    }
}

/// Runs a store read on the blocking pool: a store that is away holds a
/// blocking thread until its deadline, never one of the runtime's few
/// workers, which go on serving every other request (issue 27: reads never
/// queue behind a stuck store call).
pub(crate) async fn off_the_runtime<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, brood_store::StoreError> + Send + 'static,
) -> Result<T, brood_store::StoreError> {
    match tokio::task::spawn_blocking(read).await {
        Ok(r) => r,
        // Only a read that panicked (or a runtime shutting down) gets here.
        Err(e) => Err(brood_store::StoreError::Io {
            path: "(a store read on the blocking pool)".into(),
            source: std::io::Error::other(format!("it did not finish: {e}")),
        }),
    }
}

/// The one reader of the store's event log, broadcasting what it reads.
pub(crate) struct Hub {
    pub(crate) tx: broadcast::Sender<Arc<Vec<Event>>>,
    pub(crate) limits: EventLimits,
}

impl Hub {
    pub(crate) fn start(sup: &Supervisor, limits: EventLimits) -> Hub {
        let (tx, _) = broadcast::channel(limits.backlog_batches.max(1));
        let weak = tx.downgrade();
        let store = sup.store().clone();
        let tenant = sup.tenant().clone();
        let mut changed = sup.changed();
        tokio::spawn(async move {
            // A failed read is not "no events" (issue 28): the head is read
            // again, backing off, until the store answers; subscribers wait
            // meanwhile and miss nothing (they catch up from their own point).
            let mut pause = RETRY_FIRST;
            let mut failed = false;
            let mut head = loop {
                let (st, t) = (store.clone(), tenant.clone());
                match off_the_runtime(move || st.last_event_seq(&t)).await {
                    Ok(h) => {
                        // Subscribers that came while the log could not be
                        // read may have missed what was appended up to this
                        // head: an empty batch tells them to read the store.
                        if failed && let Some(tx) = weak.upgrade() {
                            let _ = tx.send(Arc::new(Vec::new()));
                        }
                        break h;
                    }
                    Err(e) => {
                        failed = true;
                        tracing::error!(error = %e, retry_in = ?pause, "reading the event log's head failed; trying again");
                        if weak.upgrade().is_none() {
                            return;
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_MAX);
                    }
                }
            };
            loop {
                // The API is gone when nobody holds the sender any more.
                let Some(tx) = weak.upgrade() else { return };
                loop {
                    let (st, t) = (store.clone(), tenant.clone());
                    match off_the_runtime(move || st.events(&t, head, None, PAGE)).await {
                        Ok(batch) if batch.is_empty() => break,
                        Ok(batch) => {
                            let full = batch.len() == PAGE as usize;
                            head = batch.last().map_or(head, |e| e.seq);
                            // No subscriber is not an error.
                            let _ = tx.send(Arc::new(batch));
                            if !full {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "reading the event log failed");
                            break;
                        }
                    }
                }
                drop(tx);
                tokio::select! {
                    r = changed.changed() => if r.is_err() {
                        // The supervisor is gone; other writers may remain.
                        tokio::time::sleep(IDLE_POLL).await;
                    },
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                }
            }
        });
        Hub { tx, limits }
    }
}
