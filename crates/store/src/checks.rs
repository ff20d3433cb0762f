//! What both stores check and build the same way, whatever their SQL: a
//! status move through the one transition function, the current run, JSON
//! that must be one object, the `agent.stop` event, events as numbered,
//! artifacts' encoding.
//! Each store's transactions call these and turn the error into their own.

use brood_core::{Code, RunId, Status, TenantId, Terminal};

use crate::types::{Agent, Artifact, Event, NewEvent, StoreError};

type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn refused(code: Code, message: String) -> StoreError {
    StoreError::Refused { code, message }
}

/// Checks a move with the one transition function, naming the agent on refusal.
pub(crate) fn check_move(agent: &Agent, to: Status) -> Result<Status> {
    agent
        .status
        .transition(to)
        .map_err(|source| StoreError::Transition {
            name: agent.name.to_string(),
            source,
        })
}

/// Refuses a call that names a run other than the agent's newest one: that run is
/// over, and acting on it would overwrite the newer run's record.
pub(crate) fn check_current_run(agent: &Agent, run: &RunId) -> Result<()> {
    if agent.run == *run {
        Ok(())
    } else {
        Err(refused(
            Code::Conflict,
            format!(
                "run {run} is not the current run of agent {} (the current one is {})",
                agent.name, agent.run
            ),
        ))
    }
}

/// Text stored as JSON must be one JSON object; an event payload is also a line of
/// `events.jsonl`, so it must not contain a newline either.
pub(crate) fn check_json_object(
    what: impl FnOnce() -> String,
    text: &str,
    one_line: bool,
) -> Result<()> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.is_object() && !(one_line && text.contains('\n')) => Ok(()),
        Ok(_) if one_line => Err(refused(
            Code::BadRequest,
            format!("{} must be a one-line JSON object", what()),
        )),
        Ok(_) => Err(refused(
            Code::BadRequest,
            format!("{} must be a JSON object", what()),
        )),
        Err(e) => Err(refused(
            Code::BadRequest,
            format!("{} is not JSON: {e}", what()),
        )),
    }
}

/// `events` as appended to `tenant`'s log, numbered from `next`, each at its time.
pub(crate) fn numbered(tenant: &TenantId, next: i64, events: &[(&NewEvent, i64)]) -> Vec<Event> {
    events
        .iter()
        .zip(next..)
        .map(|(&(e, ts_ms), seq)| Event {
            tenant: tenant.clone(),
            seq,
            ts_ms,
            agent: e.agent.clone(),
            run: e.run.clone(),
            session: e.session.clone(),
            kind: e.kind.clone(),
            payload: e.payload.clone(),
        })
        .collect()
}

pub(crate) fn check_events<'a>(events: impl IntoIterator<Item = &'a NewEvent>) -> Result<()> {
    for e in events {
        check_json_object(
            || format!("payload of event {} of agent {}", e.kind, e.agent),
            &e.payload,
            true,
        )?;
    }
    Ok(())
}

/// The `agent.stop` event line of SPEC 6 step 5, with the reason when there is one.
pub(crate) fn stop_event(agent: &Agent, outcome: Terminal) -> NewEvent {
    let mut payload = serde_json::Map::new();
    payload.insert("type".into(), "agent.stop".into());
    payload.insert("agent".into(), agent.name.as_str().into());
    payload.insert("status".into(), outcome.word().into());
    if let Some(reason) = outcome.reason() {
        payload.insert("reason".into(), reason.into());
    }
    NewEvent {
        agent: agent.name.clone(),
        run: Some(agent.run.clone()),
        session: agent.session.clone(),
        kind: "agent.stop".to_owned(),
        payload: serde_json::Value::Object(payload).to_string(),
    }
}

pub(crate) fn to_sql_count(n: u64) -> i64 {
    // No run reaches 2^63 tokens; saturating keeps the call infallible.
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `channels.artifacts`: a JSON array of `{"name","sha256","size"}`.
pub(crate) fn encode_artifacts(a: &[Artifact]) -> String {
    serde_json::Value::Array(
        a.iter()
            .map(|a| serde_json::json!({"name": a.name, "sha256": a.sha256, "size": a.size}))
            .collect(),
    )
    .to_string()
}

pub(crate) fn decode_artifacts(text: &str) -> Result<Vec<Artifact>> {
    let bad = || StoreError::Corrupt {
        what: "channels.artifacts",
        value: text.to_owned(),
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|_| bad())?;
    let items = v.as_array().ok_or_else(bad)?;
    items
        .iter()
        .map(|a| {
            Ok(Artifact {
                name: a["name"].as_str().ok_or_else(bad)?.to_owned(),
                sha256: a["sha256"].as_str().ok_or_else(bad)?.to_owned(),
                size: a["size"].as_u64().ok_or_else(bad)?,
            })
        })
        .collect()
}
