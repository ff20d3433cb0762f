//! A refused creation leaves nothing behind but what [`note`] writes: a
//! count in `/metrics`, its `create_agent` span, and an event in the
//! would-be parent's log.

use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Code;

use super::Env;
use crate::api::ApiError;
use crate::supervisor::{ev, now_ms};

/// A refused creation leaves nothing behind but this: an event in the would-be
/// parent's `events.jsonl` (SPEC 5), when that parent exists, and its
/// `create_agent` span, an error naming the code (issue 30): under the
/// parent's run, or under the caller's span (`caller_trace`) for a root.
pub(in crate::supervisor) fn note(
    parent: Option<&AgentName>,
    requested: Option<&str>,
    caller_trace: Option<&brood_otel::TraceContext>,
    e: &ApiError,
    env: &Env<'_>,
) {
    let host = env.host;
    let quota = match e.code {
        Code::QuotaDepth => Some("max_depth"),
        Code::QuotaFanout => Some("max_fanout"),
        Code::QuotaTreeSize => Some("max_tree_size"),
        Code::CreateLimit => Some("create_limit"),
        Code::BudgetExceeded => Some("budget"),
        _ => None,
    };
    if let Some(q) = quota {
        host.metrics.quota_denial(q);
    }
    host.metrics.refusal(e.code);
    let refusal_span = |placed: crate::trace::Placed| {
        let s = crate::trace::create_span(
            placed,
            None,
            requested,
            &host.me,
            now_ms(),
            Some((e.code.as_str(), &e.message)),
        );
        host.tracer.emit(match parent {
            Some(p) => s.attr("brood.parent", p.to_string()),
            None => s,
        });
    };
    let Some(p) = parent else {
        tracing::info!(code = %e.code, message = %e.message, "root creation refused");
        if host.tracer.on() {
            refusal_span(crate::trace::Placed {
                trace: caller_trace.map_or_else(brood_otel::random_trace_id, |c| c.trace),
                parent: caller_trace.map(|c| c.span),
            });
        }
        return;
    };
    let pa = match env.records.store.agent(&env.records.tenant, p) {
        Ok(Some(pa)) => pa,
        Ok(None) => return,
        // The caller has its refusal; the parent's log misses the event,
        // which is said here rather than passed over.
        Err(err) => {
            tracing::warn!(parent = %p, refused = %e.code, error = %err, "recording a refused creation under its parent: reading the parent failed");
            return;
        }
    };
    if host.tracer.on()
        && let Some(t) = crate::trace::Placed::of_agent(&pa)
    {
        // Under the caller's span when it is of the tree's trace, else
        // under the parent's run (a foreign one is what was refused).
        let placed = crate::trace::place(Some((t, &pa.run)), caller_trace, &pa.run)
            .or_else(|_| crate::trace::place(Some((t, &pa.run)), None, &pa.run));
        if let Ok(placed) = placed {
            refusal_span(placed);
        }
    }
    env.records.append_events(&[ev(
        p,
        Some(&pa.run),
        &pa.session,
        AgentEvent::ChildRefused {
            parent: p.clone(),
            child: requested.map(str::to_owned),
            code: e.code,
            message: e.message.clone(),
        },
    )]);
}
