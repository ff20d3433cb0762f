//! Traces of the tree (issue 30, docs/tracing.md): where an agent's trace
//! context is recorded, the `TRACEPARENT` each run gets, and the spans of
//! admissions and runs handed to the exporter.
//!
//! Nothing is held open: an agent's trace (its tree's trace id and the span
//! its runs hang under) is recorded in its spec at admission, a run's span id
//! is its run id's random half (`brood_otel::span_of_run`), and a run's span
//! is built at its end from its record. So a child admitted on one node under
//! a parent running on another finds its parent's span in the store, and a
//! run that outlives its node's memory (resumed, moved) keeps its place.
//!
//! The dispatcher never waits for any of it: a run's end is handed to this
//! module's thread on a bounded queue (dropped and counted when full), which
//! reads the run's record and emits the span on the exporter's own bounded
//! queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};

use brood_core::{AgentName, ModelCall, RunId, TenantId};
use brood_otel::{Exporter, Kind, Span, SpanId, TraceContext, TraceId};
use brood_store::{Agent, Job, Store};
use serde_json::{Value, json};

/// An agent's place in its trace, as its spec records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub trace: TraceId,
    /// The span its runs are children of: its parent's run at its creation,
    /// or the caller's span for a root created with a `traceparent`; `None`
    /// for a root that started its trace.
    pub parent: Option<SpanId>,
}

impl Placed {
    /// The spec's `trace` object.
    pub fn to_json(self) -> Value {
        json!({
            "trace_id": self.trace.hex(),
            "parent_span": self.parent.map(|p| p.hex()),
        })
    }

    /// Read back from an agent's spec; `None` for an agent admitted before
    /// traces were recorded.
    pub fn of_spec(spec: &Value) -> Option<Placed> {
        let t = &spec["trace"];
        let trace = TraceId::parse(t["trace_id"].as_str()?).ok()?;
        let parent = match t["parent_span"].as_str() {
            Some(p) => Some(SpanId::parse(p).ok()?),
            None => None,
        };
        Some(Placed { trace, parent })
    }

    pub fn of_agent(a: &Agent) -> Option<Placed> {
        serde_json::from_str::<Value>(&a.spec)
            .ok()
            .and_then(|s| Placed::of_spec(&s))
    }

    /// The `TRACEPARENT` of one of its runs: its trace, the run's span.
    pub fn traceparent(self, run: &RunId) -> Option<TraceContext> {
        Some(TraceContext {
            trace: self.trace,
            span: brood_otel::span_of_run(run.as_str()).ok()?,
            sampled: true,
        })
    }
}

/// Where a new agent goes in the traces. A child joins its parent's trace
/// under the parent's current run (`parent_run`), or under the caller's
/// span when the caller's `traceparent` is of the same trace (a harness
/// running as the parent, nesting brood's spans under its own); a
/// `traceparent` of another trace is refused for a child, whose trace is its
/// tree's. A root continues its caller's trace, or starts one from its first
/// run's id.
pub fn place(
    parent: Option<(Placed, &RunId)>,
    caller: Option<&TraceContext>,
    first_run: &RunId,
) -> Result<Placed, String> {
    match (parent, caller) {
        (Some((p, _)), Some(c)) if c.trace == p.trace => Ok(Placed {
            trace: p.trace,
            parent: Some(c.span),
        }),
        (Some((p, _)), Some(c)) => Err(format!(
            "traceparent: names trace {}, but the parent's tree is trace {}",
            c.trace.hex(),
            p.trace.hex()
        )),
        (Some((p, run)), None) => Ok(Placed {
            trace: p.trace,
            parent: brood_otel::span_of_run(run.as_str()).ok(),
        }),
        (None, Some(c)) => Ok(Placed {
            trace: c.trace,
            parent: Some(c.span),
        }),
        (None, None) => Ok(Placed {
            trace: brood_otel::trace_of_run(first_run.as_str())
                .unwrap_or_else(|_| brood_otel::random_trace_id()),
            parent: None,
        }),
    }
}

/// What ended, to be read and traced off the loop.
enum Ended {
    Run { tenant: TenantId, agent: Agent },
    Job(Job),
}

/// The dispatcher's side of tracing: off (every call a no-op) unless an
/// exporter was configured.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    exporter: Arc<Exporter>,
    ends: SyncSender<Ended>,
    /// Run ends dropped because the reader's queue was full.
    dropped: AtomicU64,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("on", &self.inner.is_some())
            .finish()
    }
}

/// Run ends waiting to be read at most.
const ENDS_QUEUE: usize = 4096;

impl Tracer {
    /// Starts the thread that reads ended runs and emits their spans.
    /// `containment` is this host's (its `meta.json`'s), which every run it
    /// ends was contained by.
    pub fn start(
        exporter: Arc<Exporter>,
        store: Arc<dyn Store>,
        containment: String,
    ) -> Result<Tracer, String> {
        let (tx, rx) = mpsc::sync_channel::<Ended>(ENDS_QUEUE);
        let out = exporter.clone();
        std::thread::Builder::new()
            .name("brood-trace".into())
            .spawn(move || {
                while let Ok(e) = rx.recv() {
                    match e {
                        Ended::Run { tenant, agent } => {
                            if let Some(s) = run_span(store.as_ref(), &tenant, &agent) {
                                out.emit(s.attr("brood.containment", containment.clone()));
                            }
                        }
                        Ended::Job(job) => {
                            for s in job_spans(store.as_ref(), &job) {
                                out.emit(s);
                            }
                        }
                    }
                }
            })
            .map_err(|e| format!("starting the tracer's thread: {e}"))?;
        Ok(Tracer {
            inner: Some(Arc::new(Inner {
                exporter,
                ends: tx,
                dropped: AtomicU64::new(0),
            })),
        })
    }

    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Hands a span to the exporter, never waiting.
    pub fn emit(&self, s: Span) {
        if let Some(i) = &self.inner {
            i.exporter.emit(s);
        }
    }

    fn hand_over(&self, e: impl FnOnce() -> Ended) {
        if let Some(i) = &self.inner
            && i.ends.try_send(e()).is_err()
        {
            i.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A run's end, recorded: its span is built off the loop.
    pub fn run_ended(&self, tenant: &TenantId, agent: &Agent) {
        self.hand_over(|| Ended::Run {
            tenant: tenant.clone(),
            agent: agent.clone(),
        });
    }

    /// A job's end, recorded: its span and its attempts' are built off the
    /// loop.
    pub fn job_ended(&self, job: &Job) {
        self.hand_over(|| Ended::Job(job.clone()));
    }

    /// Spans exported and dropped so far (the `/metrics` counters).
    pub fn counts(&self) -> (u64, u64) {
        match &self.inner {
            None => (0, 0),
            Some(i) => {
                let c = i.exporter.counts();
                (
                    c.exported.load(Ordering::Relaxed),
                    c.dropped.load(Ordering::Relaxed) + i.dropped.load(Ordering::Relaxed),
                )
            }
        }
    }
}

/// The log's span for what concerns one run (`brood serve --log-format
/// json` writes its fields on each line logged inside it): the agent, the
/// run, and the run's trace and span ids, which join the log to the traces.
pub fn log_span(name: &AgentName, run: &RunId, placed: Option<Placed>) -> tracing::Span {
    let ctx = placed.and_then(|p| p.traceparent(run));
    tracing::info_span!(
        "run",
        agent = %name,
        run = %run,
        trace_id = ctx.map(|c| c.trace.hex()).unwrap_or_default(),
        span_id = ctx.map(|c| c.span.hex()).unwrap_or_default(),
    )
}

/// The attributes every agent's span carries (GenAI's agent attributes and
/// the session as the conversation).
fn agent_attrs(s: Span, a: &Agent) -> Span {
    s.attr("gen_ai.agent.id", format!("{}/{}", a.tenant, a.name))
        .attr("gen_ai.agent.name", a.name.to_string())
        .attr("gen_ai.conversation.id", a.session.to_string())
        .attr("brood.tenant", a.tenant.to_string())
        .attr_opt("brood.parent", a.parent.as_ref().map(|p| p.to_string()))
}

/// The `invoke_agent {name}` span of an ended run, from its records.
fn run_span(store: &dyn Store, tenant: &TenantId, a: &Agent) -> Option<Span> {
    let placed = Placed::of_agent(a)?;
    let run = store.run(tenant, &a.run).ok().flatten()?;
    let id = brood_otel::span_of_run(a.run.as_str()).ok()?;
    let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
    let start = run.started_ms.unwrap_or(run.created_ms);
    let end = run.ended_ms.unwrap_or(a.updated_ms);
    let mut s = Span::new(
        format!("invoke_agent {}", a.name),
        placed.trace,
        id,
        placed.parent,
    )
    .kind(Kind::Internal)
    .times(brood_otel::ms_to_ns(start), brood_otel::ms_to_ns(end))
    .attr("gen_ai.operation.name", "invoke_agent")
    .attr("gen_ai.provider.name", "brood");
    s = agent_attrs(s, a)
        .attr("brood.run", a.run.to_string())
        .attr("brood.run.seq", run.seq)
        .attr("gen_ai.usage.input_tokens", run.tokens_in)
        .attr("gen_ai.usage.output_tokens", run.tokens_out)
        .attr("brood.cost_usd", run.cost_usd)
        .attr("brood.status", a.status.api_word())
        .attr_opt("brood.reason", a.status.reason())
        .attr_opt("brood.detail", a.detail.clone())
        .attr_opt("brood.exit_code", run.exit_code.map(i64::from))
        .attr("brood.node", a.supervisor.clone())
        .attr("brood.queued_ms", (start - run.created_ms).max(0))
        .attr("brood.policy", policy_summary(&spec["policy"]))
        .attr_opt("brood.iso", spec["iso"].as_str().map(str::to_owned));
    if a.status.api_word() == "failed" {
        let why = a.status.reason().unwrap_or("failed");
        s = s.failed(match &a.detail {
            Some(d) => format!("{why}: {d}"),
            None => why.to_owned(),
        });
    }
    Some(s)
}

/// A job's span (`job {id}`, from its creation to its end) under its
/// owner's run, and a span for each attempt of each of its items under it
/// (`attempt {item}`), from the records.
fn job_spans(store: &dyn Store, job: &Job) -> Vec<Span> {
    let Some(owner) = store.agent(&job.tenant, &job.owner).ok().flatten() else {
        return Vec::new();
    };
    let Some(placed) = Placed::of_agent(&owner) else {
        return Vec::new();
    };
    let parent = brood_otel::span_of_run(owner.run.as_str()).ok();
    let id = brood_otel::random_span_id();
    let end = job.ended_ms.unwrap_or(job.updated_ms);
    let mut out = vec![
        Span::new(format!("job {}", job.id), placed.trace, id, parent)
            .times(
                brood_otel::ms_to_ns(job.created_ms),
                brood_otel::ms_to_ns(end),
            )
            .attr("brood.job", job.id.clone())
            .attr("brood.job.owner", job.owner.to_string())
            .attr("brood.job.items", job.total)
            .attr("brood.status", job.status.as_str())
            .attr_opt(
                "brood.queued_ms",
                job.started_ms.map(|s| (s - job.created_ms).max(0)),
            ),
    ];
    let items = store
        .job_items(&job.tenant, &job.id, None)
        .unwrap_or_default();
    for item in items {
        for a in store
            .attempts(&job.tenant, &job.id, &item.id)
            .unwrap_or_default()
        {
            let mut s = Span::new(
                format!("attempt {}", item.id),
                placed.trace,
                brood_otel::random_span_id(),
                Some(id),
            )
            .times(
                brood_otel::ms_to_ns(a.started_ms),
                brood_otel::ms_to_ns(a.ended_ms.unwrap_or(end)),
            )
            .attr("brood.job", job.id.clone())
            .attr("brood.item", item.id.clone())
            .attr("brood.attempt", a.number)
            .attr("brood.status", a.outcome.as_str())
            .attr_opt("brood.worker", a.worker.as_ref().map(|w| w.to_string()));
            if let Some(e) = &a.error {
                s = s.failed(e.clone());
            }
            out.push(s);
        }
    }
    out
}

/// A policy in a few words for a span (the whole one is in the record):
/// its tools, network, file rules and limits counted.
pub fn policy_summary(p: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(t) = p["tools"].as_array() {
        let names: Vec<&str> = t.iter().filter_map(Value::as_str).collect();
        parts.push(format!("tools={}", names.join(",")));
    }
    for k in [
        "network",
        "cost_limit",
        "timeout_s",
        "max_depth",
        "create_limit",
    ] {
        if !p[k].is_null() {
            parts.push(format!("{k}={}", p[k]));
        }
    }
    if let Some(f) = p["files"].as_array().or_else(|| p["fs"].as_array()) {
        parts.push(format!("file_rules={}", f.len()));
    }
    parts.join(" ")
}

/// The `create_agent {name}` span of an admission (a refusal when `refused`
/// says with what code and why), under the span the new agent's runs hang
/// under.
pub fn create_span(
    placed: Placed,
    name: Option<&AgentName>,
    requested: Option<&str>,
    node: &str,
    start_ms: i64,
    refused: Option<(&str, &str)>,
) -> Span {
    let shown = name
        .map(|n| n.to_string())
        .or_else(|| requested.map(str::to_owned))
        .unwrap_or_else(|| "agent".to_owned());
    let now = brood_otel::now_ns();
    let mut s = Span::new(
        format!("create_agent {shown}"),
        placed.trace,
        brood_otel::random_span_id(),
        placed.parent,
    )
    .times(brood_otel::ms_to_ns(start_ms).min(now), now)
    .attr("gen_ai.operation.name", "create_agent")
    .attr("gen_ai.provider.name", "brood")
    .attr("gen_ai.agent.name", shown)
    .attr("brood.node", node.to_owned());
    if let Some((code, message)) = refused {
        s = s
            .attr("error.type", code.to_owned())
            .attr("brood.refusal.code", code.to_owned())
            .failed(format!("{code}: {message}"));
    }
    s
}

/// A call through the model gateway (issue 31) as a `chat {model}` span
/// under its run's span, as brood counted it: the GenAI attributes, its
/// cost and outcome; a refused, cut or failed call is an error naming why.
/// `None` when the run has no place in a trace.
pub fn model_call_span(placed: Option<Placed>, call: &ModelCall) -> Option<Span> {
    let parent = placed?.traceparent(&call.run)?;
    let end = brood_otel::now_ns();
    let start = end.saturating_sub(call.latency_ms.saturating_mul(1_000_000));
    let provider = if call.endpoint.starts_with("/v1/messages") {
        "anthropic"
    } else {
        "openai"
    };
    let mut s = Span::new(
        format!("chat {}", call.model),
        parent.trace,
        brood_otel::random_span_id(),
        Some(parent.span),
    )
    .kind(Kind::Client)
    .times(start, end)
    .attr("gen_ai.operation.name", "chat")
    .attr("gen_ai.provider.name", provider)
    .attr("gen_ai.request.model", call.model.clone())
    .attr("gen_ai.usage.input_tokens", call.tokens_in)
    .attr("gen_ai.usage.output_tokens", call.tokens_out)
    .attr("gen_ai.agent.name", call.agent.to_string())
    .attr("brood.cost_usd", call.cost_usd)
    .attr("brood.model.endpoint", call.endpoint)
    .attr("brood.model.stream", call.stream)
    .attr("brood.model.estimated", call.estimated)
    .attr("brood.model.outcome", call.outcome)
    .attr("http.response.status_code", u64::from(call.status))
    .attr("brood.metered_by", "gateway");
    if call.outcome != "ok" {
        let why = call
            .detail
            .clone()
            .unwrap_or_else(|| call.outcome.to_owned());
        s = s
            .attr("error.type", call.outcome)
            .failed(format!("{}: {why}", call.outcome));
    }
    Some(s)
}

/// An admitted agent's attributes on its `create_agent` span.
pub fn admitted_attrs(s: Span, a: &Agent) -> Span {
    agent_attrs(s, a).attr("brood.run", a.run.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> RunId {
        RunId::parse(s).unwrap()
    }

    #[test]
    fn a_child_joins_its_parents_trace_and_a_foreign_traceparent_is_refused() {
        let r1 = run("019ac4f2-7d3e-7abc-8def-0123456789ab");
        let r2 = run("019ac4f2-7d3e-7abc-9aaa-bbbbbbbbbbbb");
        let root = place(None, None, &r1).unwrap();
        assert_eq!(root.trace.hex(), "019ac4f27d3e7abc8def0123456789ab");
        assert_eq!(root.parent, None);
        let child = place(Some((root, &r1)), None, &r2).unwrap();
        assert_eq!(child.trace, root.trace);
        assert_eq!(child.parent.unwrap().hex(), "8def0123456789ab");
        let foreign =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let e = place(Some((root, &r1)), Some(&foreign), &r2).unwrap_err();
        assert!(e.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{e}");
        let caller_root = place(None, Some(&foreign), &r1).unwrap();
        assert_eq!(caller_root.trace, foreign.trace);
        assert_eq!(caller_root.parent, Some(foreign.span));
        let back = Placed::of_spec(&json!({"trace": caller_root.to_json()})).unwrap();
        assert_eq!(back, caller_root);
        assert_eq!(Placed::of_spec(&json!({})), None);
    }
}
