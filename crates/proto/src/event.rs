//! The JSON form of [`AgentEvent`] (SPEC 3 `events.jsonl`): `type` first, then
//! the fields in a fixed order, `null` for a reason that does not apply.

use brood_core::AgentEvent;
use serde_json::{Value, json};

/// The payload recorded for `e`.
pub fn payload(e: &AgentEvent) -> Value {
    let t = e.kind();
    match e {
        AgentEvent::Spawn { agent, parent, run } => {
            json!({"type": t, "agent": agent.as_str(), "parent": parent.as_ref().map(|p| p.as_str()), "run": run.as_str()})
        }
        AgentEvent::ChildSpawn { parent, child } => {
            json!({"type": t, "parent": parent.as_str(), "child": child.as_str()})
        }
        AgentEvent::ChildRefused {
            parent,
            child,
            code,
            message,
        } => {
            json!({"type": t, "parent": parent.as_str(), "child": child, "code": code.as_str(), "message": message})
        }
        AgentEvent::Start { agent, run, pid } => {
            json!({"type": t, "agent": agent.as_str(), "run": run.as_str(), "pid": pid})
        }
        AgentEvent::Input { agent, id, from } => {
            json!({"type": t, "agent": agent.as_str(), "id": id, "from": from})
        }
        AgentEvent::Status {
            agent,
            status,
            reason,
        } => json!({"type": t, "agent": agent.as_str(), "status": status, "reason": reason}),
        AgentEvent::ProtocolUnknown {
            agent,
            message_type,
        } => json!({"type": t, "agent": agent.as_str(), "message_type": message_type}),
        AgentEvent::ProtocolError { agent, line, error } => match line {
            Some(line) => {
                json!({"type": t, "agent": agent.as_str(), "line": line, "error": error})
            }
            None => json!({"type": t, "agent": agent.as_str(), "error": error}),
        },
        AgentEvent::Stop {
            agent,
            outcome,
            swept,
        } => {
            let mut v = json!({"type": t, "agent": agent.as_str(), "status": outcome.word(), "reason": outcome.reason()});
            if let Some((sweeper, detail)) = swept {
                v["sweeper"] = (*sweeper).into();
                v["detail"] = detail.as_str().into();
            }
            v
        }
        AgentEvent::ChildStop {
            parent,
            child,
            outcome,
        } => {
            json!({"type": t, "parent": parent.as_str(), "child": child.as_str(), "status": outcome.word(), "reason": outcome.reason()})
        }
        AgentEvent::ChildCancel {
            parent,
            child,
            reason,
        } => {
            json!({"type": t, "parent": parent.as_str(), "child": child.as_str(), "reason": reason.as_str()})
        }
        AgentEvent::Sweep {
            agent,
            sweeper,
            outcome,
            detail,
        } => {
            json!({"type": t, "agent": agent.as_str(), "sweeper": sweeper, "status": outcome.word(), "reason": outcome.reason(), "detail": detail})
        }
        AgentEvent::Close { agent } => json!({"type": t, "agent": agent.as_str()}),
        AgentEvent::ModelCall(c) => {
            json!({"type": t, "agent": c.agent.as_str(), "run": c.run.as_str(), "model": c.model,
                "endpoint": c.endpoint, "stream": c.stream, "request_bytes": c.request_bytes,
                "messages": c.messages, "tokens_in": c.tokens_in,
                "tokens_out": c.tokens_out, "cost_usd": c.cost_usd, "estimated": c.estimated,
                "latency_ms": c.latency_ms, "status": c.status, "outcome": c.outcome,
                "detail": c.detail})
        }
        AgentEvent::Resume { agent, run } => {
            json!({"type": t, "agent": agent.as_str(), "run": run.as_str()})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood_core::{AgentName, CancelReason, Terminal};

    fn n(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    #[test]
    fn payloads_keep_their_field_order_and_nulls() {
        let stop = AgentEvent::Stop {
            agent: n("a"),
            outcome: Terminal::Completed,
            swept: None,
        };
        assert_eq!(
            payload(&stop).to_string(),
            r#"{"type":"agent.stop","agent":"a","status":"completed","reason":null}"#
        );
        let cancel = AgentEvent::ChildCancel {
            parent: n("p"),
            child: n("c"),
            reason: CancelReason::ParentDead,
        };
        assert_eq!(
            payload(&cancel).to_string(),
            r#"{"type":"agent.child.cancel","parent":"p","child":"c","reason":"parent_dead"}"#
        );
        let err = AgentEvent::ProtocolError {
            agent: n("a"),
            line: None,
            error: "result refused".into(),
        };
        assert_eq!(
            payload(&err).to_string(),
            r#"{"type":"agent.protocol.error","agent":"a","error":"result refused"}"#
        );
    }
}
