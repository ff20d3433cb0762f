//! Spans handed to an OTLP/HTTP collector from a thread of their own.
//!
//! [`Exporter::emit`] never blocks: it puts the span on a bounded queue, or
//! counts it dropped when the queue is full (the collector slow or away).
//! The thread sends what waits in batches (at most [`Config::batch`] spans,
//! or what came within [`Config::every`]), one POST a batch with the
//! exporter's own retries within its timeout; a batch the collector did not
//! take is dropped and counted, never kept growing.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId as OSpanId, SpanKind, Status, TraceFlags, TraceId as OTraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};

use crate::span::{Kind, Span, Value};

/// Where and how spans go.
#[derive(Debug, Clone)]
pub struct Config {
    /// The traces endpoint's whole URL (`…/v1/traces`).
    pub endpoint: String,
    /// `service.name`, unless `OTEL_SERVICE_NAME` says otherwise.
    pub service: String,
    /// Spans waiting at most; past it they are dropped and counted.
    pub queue: usize,
    /// Spans in one POST at most.
    pub batch: usize,
    /// How long a span waits for its batch to fill.
    pub every: Duration,
}

/// The traces endpoint the standard variables name, or `base` (a flag's
/// value, which wins): `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is,
/// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` added. `None` when
/// nothing names one, or `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`
/// turn traces off: tracing is off unless configured.
pub fn endpoint_from_env(base: Option<&str>) -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let Some(b) = base.filter(|b| !b.is_empty()) {
        return Some(with_traces_path(b));
    }
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
    {
        return None;
    }
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|b| with_traces_path(&b)))
}

fn with_traces_path(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

impl Config {
    pub fn new(endpoint: String, service: &str) -> Config {
        Config {
            endpoint,
            service: service.to_owned(),
            queue: 4096,
            batch: 512,
            every: Duration::from_millis(500),
        }
    }
}

/// What became of the spans emitted so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// Taken by the collector.
    pub exported: AtomicU64,
    /// Dropped: the queue was full, or the collector refused or never
    /// answered their batch.
    pub dropped: AtomicU64,
}

enum Msg {
    Span(Box<Span>),
    Flush(mpsc::Sender<()>),
}

/// The exporter: a bounded queue and the thread that empties it.
pub struct Exporter {
    tx: Mutex<Option<SyncSender<Msg>>>,
    counts: Arc<Counts>,
    thread: Mutex<Option<JoinHandle<()>>>,
    endpoint: String,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// The exporter's HTTP client: ureq, blocking, on the exporter's thread.
#[derive(Debug)]
struct Ureq(ureq::Agent);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Ureq {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let resp = self.0.run(request.map(|b| b.to_vec()))?;
        let (parts, mut body) = resp.into_parts();
        let bytes = body.with_config().limit(4 << 20).read_to_vec()?;
        Ok(opentelemetry_http::Response::from_parts(
            parts,
            opentelemetry_http::Bytes::from(bytes),
        ))
    }
}

impl Exporter {
    /// Starts the exporter's thread. Fails only when the endpoint is not a
    /// URL or the thread cannot start; a collector that is away is not an
    /// error here (its spans are dropped and counted).
    pub fn start(cfg: Config) -> Result<Exporter, String> {
        let client = Ureq(ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(10)))
                .build(),
        ));
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(cfg.endpoint.clone())
            .build()
            .map_err(|e| format!("the OTLP exporter for {}: {e}", cfg.endpoint))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(cfg.service.clone());
        }
        exporter.set_resource(&resource.build());
        let (tx, rx) = mpsc::sync_channel::<Msg>(cfg.queue.max(1));
        let counts = Arc::new(Counts::default());
        let thread_counts = counts.clone();
        let scope = InstrumentationScope::builder("brood")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let (batch_max, every) = (cfg.batch.max(1), cfg.every);
        let thread = std::thread::Builder::new()
            .name("brood-otlp".into())
            .spawn(move || {
                let mut batch: Vec<Box<Span>> = Vec::new();
                let mut due = Instant::now() + every;
                let send = |batch: &mut Vec<Box<Span>>| {
                    if batch.is_empty() {
                        return;
                    }
                    let n = batch.len() as u64;
                    let data: Vec<SpanData> =
                        batch.drain(..).map(|s| to_data(*s, &scope)).collect();
                    match futures_executor::block_on(exporter.export(data)) {
                        Ok(()) => thread_counts.exported.fetch_add(n, Ordering::Relaxed),
                        Err(_) => thread_counts.dropped.fetch_add(n, Ordering::Relaxed),
                    };
                };
                loop {
                    let wait = due.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait) {
                        Ok(Msg::Span(s)) => {
                            batch.push(s);
                            if batch.len() >= batch_max {
                                send(&mut batch);
                                due = Instant::now() + every;
                            }
                        }
                        Ok(Msg::Flush(done)) => {
                            send(&mut batch);
                            let _ = done.send(());
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            send(&mut batch);
                            due = Instant::now() + every;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            send(&mut batch);
                            break;
                        }
                    }
                }
            })
            .map_err(|e| format!("starting the OTLP exporter's thread: {e}"))?;
        Ok(Exporter {
            tx: Mutex::new(Some(tx)),
            counts,
            thread: Mutex::new(Some(thread)),
            endpoint: cfg.endpoint,
        })
    }

    /// Hands a span over without waiting: dropped and counted when the
    /// queue is full.
    pub fn emit(&self, span: Span) {
        let sent = match self.tx.lock() {
            Ok(g) => match g.as_ref() {
                Some(tx) => match tx.try_send(Msg::Span(Box::new(span))) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
                },
                None => false,
            },
            Err(_) => false,
        };
        if !sent {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends what waits and waits at most `timeout` for it to be sent: for a
    /// process about to exit (the reference agent), never for the daemon's
    /// dispatcher.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (done_tx, done_rx) = mpsc::channel();
        let queued = match self.tx.lock() {
            Ok(g) => g
                .as_ref()
                .is_some_and(|tx| tx.try_send(Msg::Flush(done_tx)).is_ok()),
            Err(_) => false,
        };
        queued && done_rx.recv_timeout(timeout).is_ok()
    }

    /// Flushes, then stops the thread (waiting at most `timeout`).
    pub fn shutdown(&self, timeout: Duration) {
        self.flush(timeout);
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle
            && h.is_finished()
        {
            let _ = h.join();
        }
    }
}

fn to_data(s: Span, scope: &InstrumentationScope) -> SpanData {
    let ns = |n: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(n);
    SpanData {
        span_context: SpanContext::new(
            OTraceId::from_bytes(s.trace.0),
            OSpanId::from_bytes(s.id.0),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: s
            .parent
            .map_or(OSpanId::INVALID, |p| OSpanId::from_bytes(p.0)),
        parent_span_is_remote: false,
        span_kind: match s.kind {
            Kind::Internal => SpanKind::Internal,
            Kind::Client => SpanKind::Client,
            Kind::Server => SpanKind::Server,
        },
        name: s.name.into(),
        start_time: ns(s.start_ns),
        end_time: ns(s.end_ns),
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| match v {
                Value::Str(x) => KeyValue::new(k, x),
                Value::Int(x) => KeyValue::new(k, x),
                Value::Float(x) => KeyValue::new(k, x),
                Value::Bool(x) => KeyValue::new(k, x),
            })
            .collect(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: match s.error {
            Some(d) => Status::error(d),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{SpanId, TraceId};

    #[test]
    fn a_collector_away_drops_and_counts_every_span() {
        // A port nothing listens on.
        let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", away.local_addr().unwrap());
        drop(away);
        let mut cfg = Config::new(url, "test");
        cfg.queue = 4;
        cfg.batch = 2;
        let x = Exporter::start(cfg).unwrap();
        for i in 0..1000u64 {
            let s = Span::new("s", TraceId([1; 16]), SpanId((i + 1).to_be_bytes()), None);
            x.emit(s.times(1, 2));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while x.counts().dropped.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(x.counts().dropped.load(Ordering::Relaxed), 1000);
        assert_eq!(x.counts().exported.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_endpoint_comes_from_the_flag_or_the_standard_variables() {
        assert_eq!(
            endpoint_from_env(Some("http://c:4318/")).as_deref(),
            Some("http://c:4318/v1/traces")
        );
    }
}
