//! brood's traces (issue 30, docs/tracing.md): W3C trace context in and
//! out (`context`), spans built whole at the end of what they describe with
//! explicit ids and times (`span`), and the exporter that sends them to an
//! OpenTelemetry collector over OTLP/HTTP (protobuf) from a bounded queue of
//! its own, never blocking whoever emits (`export`).
//!
//! It knows nothing of brood's records: the supervisor and the reference
//! agent build the spans; this crate carries them.

pub mod context;
pub mod export;
pub mod span;

pub use context::{ContextError, SpanId, TraceContext, TraceId, span_of_run, trace_of_run};
pub use export::{Config, Counts, Exporter, endpoint_from_env};
pub use span::{Kind, Span, Value, ms_to_ns, now_ns, random_span_id, random_trace_id};

/// The variable every agent finds its trace context in.
pub const TRACEPARENT: &str = "TRACEPARENT";
