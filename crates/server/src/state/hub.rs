//! The one reader of the store's event log a server has (`GET /api/events`
//! subscribes to it): it reads what was appended as soon as the store says
//! events committed (`Transcripts::appended`: rung by the writer at its
//! commit, and on PostgreSQL by another node's news), and every quarter
//! second for writers the store does not hear (another process on the same
//! SQLite file), and broadcasts each batch. Each event's SSE frame is
//! rendered once, by the first subscriber that sends it, and shared by the
//! others ([`Live`]). An empty batch means "read the store": the hub could
//! not follow the log for a while (issue 28: a failed read is retried, never
//! taken for "empty").

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Bytes;
use brood_runtime::Supervisor;
use brood_runtime::agentruntime::{EventFormat, to_agentruntime};
use brood_store::Event;
use tokio::sync::broadcast;

/// Events read from the store at a time.
pub(crate) const PAGE: u32 = 1000;
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
    /// How often the hub reads the log without being told of a change: only
    /// writers the store does not hear (another process on the same SQLite
    /// file) wait this long; every other event is read at its commit.
    pub look_every: Duration,
}

impl Default for EventLimits {
    fn default() -> EventLimits {
        EventLimits {
            backlog_batches: 1024,
            connection_buffer: 256,
            keep_alive: Duration::from_secs(15),
            look_every: Duration::from_millis(250),
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

/// An event as the hub broadcasts it, with its SSE frames, each rendered at
/// most once however many subscribers send it (with 100 subscribers, the
/// rendering, JSON of a JSON payload, was most of a delivery's cost).
pub(crate) struct Live {
    pub(crate) event: Event,
    brood: OnceLock<Option<Bytes>>,
    agentruntime: OnceLock<Option<Bytes>>,
}

impl Live {
    fn new(event: Event) -> Live {
        Live {
            event,
            brood: OnceLock::new(),
            agentruntime: OnceLock::new(),
        }
    }

    /// The event's frame in `format` (`None`: the format has no counterpart
    /// of it).
    pub(crate) fn frame(&self, format: EventFormat) -> Option<Bytes> {
        let cell = match format {
            EventFormat::Brood => &self.brood,
            EventFormat::AgentRuntime => &self.agentruntime,
        };
        cell.get_or_init(|| frame_of(&self.event, format)).clone()
    }
}

/// An event's SSE frame: its `id` (`<tenant>-<seq>`, what `Last-Event-ID`
/// gives back) and its JSON as `data` (one line: JSON as serde writes it has
/// no raw newline), then the blank line that ends it.
pub(crate) fn frame_of(e: &Event, format: EventFormat) -> Option<Bytes> {
    let data = match format {
        EventFormat::Brood => serde_json::to_string(&event_json(e)).ok()?,
        EventFormat::AgentRuntime => to_agentruntime(e)?.to_string(),
    };
    Some(Bytes::from(format!(
        "id: {}-{}\ndata: {data}\n\n",
        e.tenant, e.seq
    )))
}

/// The one reader of the store's event log, broadcasting what it reads.
pub(crate) struct Hub {
    pub(crate) tx: broadcast::Sender<Arc<Vec<Live>>>,
    pub(crate) limits: EventLimits,
}

impl Hub {
    pub(crate) fn start(sup: &Supervisor, limits: EventLimits) -> Hub {
        let (tx, _) = broadcast::channel(limits.backlog_batches.max(1));
        let weak = tx.downgrade();
        let store = sup.store().clone();
        let tenant = sup.tenant().clone();
        let mut appended = store.appended();
        tokio::spawn(async move {
            let Some(mut head) = read_head(&store, &tenant, &weak, false).await else {
                return;
            };
            // Whether the log went unread because nobody listened.
            let mut behind = false;
            loop {
                // The API is gone when nobody holds the sender any more.
                let Some(tx) = weak.upgrade() else { return };
                // Seen before the read: a ring while it runs reads again.
                appended.mark_unchanged();
                if tx.receiver_count() == 0 {
                    // Nobody listens: the log is not read (issue 27: every
                    // node of a cluster read it after every write any node
                    // committed, a third of a busy cluster's statements).
                    // A subscriber catches up from the store on its own.
                    behind = true;
                } else {
                    if behind {
                        // Caught up to the log's head, and the subscribers
                        // told to read up to it themselves (an empty batch),
                        // so one that came meanwhile misses nothing.
                        drop(tx);
                        let Some(h) = read_head(&store, &tenant, &weak, true).await else {
                            return;
                        };
                        head = h;
                        behind = false;
                        continue;
                    }
                    loop {
                        let (st, t) = (store.clone(), tenant.clone());
                        match off_the_runtime(move || st.events(&t, head, None, PAGE)).await {
                            Ok(batch) if batch.is_empty() => break,
                            Ok(batch) => {
                                let full = batch.len() == PAGE as usize;
                                head = batch.last().map_or(head, |e| e.seq);
                                // No subscriber is not an error.
                                let _ =
                                    tx.send(Arc::new(batch.into_iter().map(Live::new).collect()));
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
                }
                drop(tx);
                tokio::select! {
                    r = appended.changed() => if r.is_err() {
                        // The store is gone; other writers may remain.
                        tokio::time::sleep(limits.look_every).await;
                    },
                    _ = tokio::time::sleep(limits.look_every) => {}
                }
            }
        });
        Hub { tx, limits }
    }
}

/// The log's head, read until the store answers (backing off): a failed
/// read is not "no events" (issue 28). Subscribers wait meanwhile and miss
/// nothing: they are sent an empty batch once it is read, which tells them
/// to read the store up to where the log is now (`tell`, or a read that
/// failed first). `None`: the API is gone.
async fn read_head(
    store: &Arc<dyn brood_store::Store>,
    tenant: &brood_core::TenantId,
    weak: &broadcast::WeakSender<Arc<Vec<Live>>>,
    mut tell: bool,
) -> Option<i64> {
    let mut pause = RETRY_FIRST;
    loop {
        let (st, t) = (store.clone(), tenant.clone());
        match off_the_runtime(move || st.last_event_seq(&t)).await {
            Ok(h) => {
                if tell && let Some(tx) = weak.upgrade() {
                    let _ = tx.send(Arc::new(Vec::new()));
                }
                return Some(h);
            }
            Err(e) => {
                tell = true;
                tracing::error!(error = %e, retry_in = ?pause, "reading the event log's head failed; trying again");
                weak.upgrade()?;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}
