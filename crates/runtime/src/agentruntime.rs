//! brood's events in the form of the "Agent Runtime" draft standard
//! (limecloud/agentruntime; its event schema is
//! `../shared/peer/agentruntime-event.schema.json`, JSON Schema 2020-12).
//!
//! One function, [`to_agentruntime`], turns one stored [`Event`] into one
//! standard event, or into nothing when the standard has no counterpart. The
//! API's `GET /api/events?format=agentruntime` and the CLI's
//! `brood events --format agentruntime` (when it reads the store itself) both
//! go through it, so the two surfaces cannot disagree.
//!
//! # Mapping
//!
//! Every agent is a subagent in the standard's words: a child has its parent
//! agent as parent, a root has the operator who started it (its `parent` is
//! null in the payload). The standard's terminal events are only
//! `subagent.completed` and `subagent.failed`, so a cancellation is a
//! `subagent.failed` whose `status` is `cancelled`: a consumer waiting for the
//! end of a subagent sees every end, and can still tell a cancellation apart.
//!
//! | brood kind | standard `type` | `status` | `statusReason` |
//! | --- | --- | --- | --- |
//! | `agent.spawn` | `subagent.spawned` | `queued` | |
//! | `agent.start` | `subagent.status` | `running` | |
//! | `agent.status` | `subagent.status` | `blocked` or `running` | the agent's reason |
//! | `agent.input` | `subagent.input` | | |
//! | `agent.stop`, status `completed` | `subagent.completed` | `completed` | |
//! | `agent.stop`, status `failed` | `subagent.failed` | `failed` | `exit_code crashed protocol_error timed_out budget_exceeded lost exited_without_result` |
//! | `agent.stop`, status `cancelled` | `subagent.failed` | `cancelled` | `parent_dead parent_cancelled user job_cancelled runtime_restart` |
//! | `agent.close` | `subagent.closed` | `closed` | |
//! | `agent.resume` | `subagent.status` | `queued` | `resume` |
//! | `agent.sweep` | `subagent.status` (`phase` `stopping`) | `running` | the outcome's reason |
//! | `agent.protocol.error` | `runtime.error` | | |
//! | `agent.protocol.unknown` | `runtime.warning` | | |
//! | `job.*` (SPEC 10's nine kinds) | the same name | | |
//! | `agent.child.spawn`, `agent.child.stop`, `agent.child.cancel` | none: the parent's view of a fact the child's own event already carries | | |
//! | `agent.child.refused` | none: a refused creation leaves no subagent behind | | |
//! | anything else | none | | |
//!
//! `agent.sweep` records a sweeper's decision; the stop itself follows as an
//! `agent.stop` once the host carried it out, which is why the sweep is only a
//! status (`running`, as the API shows a stopping agent, with `phase`
//! `stopping`). An agent that a sweeper ends while it is still queued gets no
//! later `agent.stop` from brood today, so its end shows only there.
//!
//! Fields of every standard event: `type`; `eventId` `<tenant>-<seq>` (unique
//! and stable, the same id the brood form calls `event_id`); `timestamp`, RFC
//! 3339 UTC with milliseconds; `sequence`, the store's per-tenant sequence;
//! `sessionId`, the event's session; `subagentId`, the agent's name; `runId`
//! when the event belongs to a run; `status`, `statusReason` and `phase` as in
//! the table; `nativeStatus`, brood's own `status/reason` words when the stop
//! or sweep has them; `payload`, the brood line of `events.jsonl` verbatim
//! (its `type` is brood's kind), so nothing brood recorded is lost. Job events
//! add `jobId` and `jobItemId` from the payload's `job` and `item`.

use brood_core::time::rfc3339_utc_ms;
use brood_store::Event;
use serde_json::{Map, Value, json};

/// The two forms the event stream can take, as the control socket's `format`
/// argument and the CLI's `--format` spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFormat {
    /// brood's own form (SPEC 11): `type event_id timestamp sequence ...`.
    Brood,
    /// The Agent Runtime draft standard's events ([`to_agentruntime`]).
    AgentRuntime,
}

impl EventFormat {
    /// `brood` or `agentruntime`; anything else is `None`.
    pub fn parse(s: &str) -> Option<EventFormat> {
        match s {
            "brood" => Some(EventFormat::Brood),
            "agentruntime" => Some(EventFormat::AgentRuntime),
            _ => None,
        }
    }
}

/// The job event kinds of SPEC 10, which the standard names the same way.
const JOB_KINDS: [&str; 9] = [
    "job.created",
    "job.started",
    "job.progress",
    "job.item.started",
    "job.item.completed",
    "job.item.failed",
    "job.completed",
    "job.failed",
    "job.cancelled",
];

/// One stored event as the standard's event, or `None` when the standard has
/// no counterpart (see the module docs for the table).
pub fn to_agentruntime(e: &Event) -> Option<Value> {
    // brood writes every payload itself with `json!`, so it parses; a row that
    // does not (a hand-edited store) still maps, with its text as the payload.
    let payload: Value =
        serde_json::from_str(&e.payload).unwrap_or_else(|_| Value::String(e.payload.clone()));
    let field = |k: &str| payload.get(k).and_then(Value::as_str).map(str::to_owned);

    let mut out = Map::new();
    let mut set = |k: &str, v: Value| {
        out.insert(k.to_owned(), v);
    };
    let kind = e.kind.as_str();
    let ty = match kind {
        "agent.spawn" => {
            set("status", json!("queued"));
            "subagent.spawned"
        }
        "agent.start" => {
            set("status", json!("running"));
            "subagent.status"
        }
        "agent.status" => {
            // The protocol lets an agent say only `blocked` or `running`.
            set("status", json!(field("status")?));
            if let Some(r) = field("reason") {
                set("statusReason", json!(r));
            }
            "subagent.status"
        }
        "agent.input" => "subagent.input",
        "agent.stop" => {
            let status = field("status")?;
            let ty = match status.as_str() {
                "completed" => "subagent.completed",
                "failed" | "cancelled" => "subagent.failed",
                _ => return None,
            };
            native(&mut set, &status, field("reason"));
            set("status", json!(status));
            ty
        }
        "agent.close" => {
            set("status", json!("closed"));
            "subagent.closed"
        }
        "agent.resume" => {
            set("status", json!("queued"));
            set("statusReason", json!("resume"));
            "subagent.status"
        }
        "agent.sweep" => {
            let status = field("status")?;
            native(&mut set, &format!("stopping/{status}"), field("reason"));
            set("status", json!("running"));
            set("phase", json!("stopping"));
            "subagent.status"
        }
        "agent.protocol.error" => "runtime.error",
        "agent.protocol.unknown" => "runtime.warning",
        k if JOB_KINDS.contains(&k) => {
            for (from, to) in [("job", "jobId"), ("item", "jobItemId")] {
                if let Some(v) = field(from).filter(|v| !v.is_empty()) {
                    set(to, json!(v));
                }
            }
            k
        }
        _ => return None,
    };
    set("type", json!(ty));
    set("eventId", json!(format!("{}-{}", e.tenant.as_str(), e.seq)));
    set("timestamp", json!(rfc3339_utc_ms(e.ts_ms)));
    set("sequence", json!(e.seq));
    set("sessionId", json!(e.session.as_str()));
    set("subagentId", json!(e.agent.as_str()));
    if let Some(r) = &e.run {
        set("runId", json!(r.as_str()));
    }
    set("payload", payload);
    // `type` first, then the ids, then the rest: the order people read them in
    // (serde_json keeps insertion order in this workspace).
    let mut ordered = Map::new();
    for k in [
        "type",
        "eventId",
        "timestamp",
        "sequence",
        "sessionId",
        "subagentId",
        "runId",
        "jobId",
        "jobItemId",
        "status",
        "statusReason",
        "phase",
        "nativeStatus",
        "payload",
    ] {
        if let Some(v) = out.remove(k) {
            ordered.insert(k.to_owned(), v);
        }
    }
    Some(Value::Object(ordered))
}

/// `nativeStatus` (brood's words, `status/reason`) and `statusReason`.
fn native(set: &mut impl FnMut(&str, Value), status: &str, reason: Option<String>) {
    match reason {
        Some(r) => {
            set("nativeStatus", json!(format!("{status}/{r}")));
            set("statusReason", json!(r));
        }
        None => set("nativeStatus", json!(status)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use brood_core::{AgentName, RunId, SessionName, TenantId};

    fn event(kind: &str, payload: Value) -> Event {
        Event {
            tenant: TenantId::for_uid(7),
            seq: 7,
            ts_ms: 1_700_000_000_123,
            agent: AgentName::new("a").unwrap(),
            run: Some(RunId::v7(1_700_000_000_123, 1, 2)),
            session: SessionName::default_session(),
            kind: kind.to_owned(),
            payload: payload.to_string(),
        }
    }

    #[test]
    fn stops_map_to_the_terminal_events() {
        let ok = to_agentruntime(&event(
            "agent.stop",
            json!({"type": "agent.stop", "agent": "a", "status": "completed", "reason": null}),
        ))
        .unwrap();
        assert_eq!(ok["type"], "subagent.completed");
        assert_eq!(ok["status"], "completed");
        assert_eq!(ok["nativeStatus"], "completed");
        assert!(ok.get("statusReason").is_none());
        assert_eq!(ok["eventId"], "user-7-7");
        assert_eq!(ok["sequence"], 7);
        assert_eq!(ok["subagentId"], "a");
        assert_eq!(ok["runId"], RunId::v7(1_700_000_000_123, 1, 2).as_str());
        assert_eq!(ok["timestamp"], "2023-11-14T22:13:20.123Z");
        assert_eq!(ok["payload"]["type"], "agent.stop");

        let c = to_agentruntime(&event(
            "agent.stop",
            json!({"type": "agent.stop", "agent": "a", "status": "cancelled", "reason": "user"}),
        ))
        .unwrap();
        assert_eq!(c["type"], "subagent.failed");
        assert_eq!(c["status"], "cancelled");
        assert_eq!(c["statusReason"], "user");
        assert_eq!(c["nativeStatus"], "cancelled/user");
    }

    #[test]
    fn the_parents_view_and_unknown_kinds_have_no_counterpart() {
        for kind in [
            "agent.child.spawn",
            "agent.child.stop",
            "agent.child.cancel",
            "agent.child.refused",
            "something.else",
        ] {
            assert!(to_agentruntime(&event(kind, json!({"type": kind}))).is_none());
        }
    }

    #[test]
    fn job_events_keep_their_names_and_ids() {
        let j = to_agentruntime(&event(
            "job.item.failed",
            json!({"type": "job.item.failed", "job": "j1", "item": "3"}),
        ))
        .unwrap();
        assert_eq!(j["type"], "job.item.failed");
        assert_eq!(j["jobId"], "j1");
        assert_eq!(j["jobItemId"], "3");
    }

    #[test]
    fn formats_parse() {
        assert_eq!(EventFormat::parse("brood"), Some(EventFormat::Brood));
        assert_eq!(
            EventFormat::parse("agentruntime"),
            Some(EventFormat::AgentRuntime)
        );
        assert_eq!(EventFormat::parse("AgentRuntime"), None);
    }
}
