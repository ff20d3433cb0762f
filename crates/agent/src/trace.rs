//! The agent's own spans (issue 30, docs/tracing.md): `chat {model}` for
//! each model call and `execute_tool {tool}` for each tool call, children of
//! its run's span as `TRACEPARENT` names it, sent with the standard
//! `OTEL_EXPORTER_OTLP_*` variables when its environment (its policy's
//! `env`) names a collector; nothing at all otherwise.
//!
//! One agent process is one run, so its traces are set once for the process
//! ([`init`]) rather than threaded through every call of the loop.

use std::sync::OnceLock;
use std::time::Duration;

use brood_otel::{Exporter, Kind, Span, TraceContext};

struct Traces {
    exporter: Exporter,
    run: TraceContext,
}

static TRACES: OnceLock<Traces> = OnceLock::new();

/// Starts the exporter when there is both a run span to hang under and a
/// collector to send to; says on stderr why not when one is given without
/// the other being usable.
pub fn init() {
    let Some(endpoint) = brood_otel::endpoint_from_env(None) else {
        return;
    };
    let run = match std::env::var(brood_otel::TRACEPARENT) {
        Ok(tp) => match TraceContext::parse(&tp) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("brood agent: no spans: TRACEPARENT: {e}");
                return;
            }
        },
        Err(_) => {
            eprintln!("brood agent: no spans: TRACEPARENT is not set (not started by brood?)");
            return;
        }
    };
    match Exporter::start(brood_otel::Config::new(endpoint, "brood-agent")) {
        Ok(exporter) => {
            let _ = TRACES.set(Traces { exporter, run });
        }
        Err(e) => eprintln!("brood agent: no spans: {e}"),
    }
}

/// Sends what waits before the process exits (bounded: a collector that is
/// away costs the exit at most this long).
pub fn finish() {
    if let Some(t) = TRACES.get() {
        t.exporter.shutdown(Duration::from_secs(2));
    }
}

fn emit(name: String, start_ns: u64, build: impl FnOnce(Span) -> Span) {
    if let Some(t) = TRACES.get() {
        let s = Span::new(
            name,
            t.run.trace,
            brood_otel::random_span_id(),
            Some(t.run.span),
        )
        .times(start_ns, brood_otel::now_ns());
        t.exporter.emit(build(s));
    }
}

/// Whether spans are sent at all (so a caller can skip building them).
pub fn on() -> bool {
    TRACES.get().is_some()
}

/// One model call, `start_ns` to now.
pub fn chat(
    provider: &str,
    model: &str,
    start_ns: u64,
    usage: Option<(u64, u64)>,
    calls: usize,
    error: Option<&str>,
) {
    emit(format!("chat {model}"), start_ns, |s| {
        let mut s = s
            .kind(Kind::Client)
            .attr("gen_ai.operation.name", "chat")
            .attr("gen_ai.provider.name", provider)
            .attr("gen_ai.request.model", model)
            .attr("brood.tool_calls", calls as u64);
        if let Some((i, o)) = usage {
            s = s
                .attr("gen_ai.usage.input_tokens", i)
                .attr("gen_ai.usage.output_tokens", o);
        }
        match error {
            Some(e) => s.attr("error.type", "model_call").failed(e),
            None => s,
        }
    })
}

/// One tool call, `start_ns` to now; a result that says `error:` is an
/// error span.
pub fn tool(name: &str, call_id: &str, start_ns: u64, result: &str, replayed: bool) {
    emit(format!("execute_tool {name}"), start_ns, |s| {
        let s = s
            .attr("gen_ai.operation.name", "execute_tool")
            .attr("gen_ai.tool.name", name)
            .attr("gen_ai.tool.call.id", call_id)
            .attr("brood.replayed", replayed);
        match result.strip_prefix("error:") {
            Some(e) => s
                .attr("error.type", "tool_error")
                .failed(e.trim().to_owned()),
            None => s,
        }
    })
}
