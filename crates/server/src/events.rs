//! `GET /api/events`: the tenant's event log as server-sent events.
//!
//! One reader per server (the [`Hub`](crate::state::Hub)) follows the store:
//! it reads what was appended as soon as the store rings its bell (at the
//! commit of events written through it, and on PostgreSQL at another node's
//! news; every quarter second for any other writer) and broadcasts each
//! batch. A subscriber first subscribes, then reads what it missed from the
//! store (after its `Last-Event-ID`), then takes the broadcast, skipping
//! what it already sent: no event is lost or repeated across the seam or a
//! reconnect. A subscriber too slow for the broadcast is sent `event:
//! resync` and its stream ends; it reconnects with its `Last-Event-ID` and
//! catches up from the store.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use brood_core::{AgentName, Code};
use brood_runtime::agentruntime::EventFormat;
use brood_runtime::{ApiError, Caller};
use brood_store::Event;
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};
use utoipa::IntoParams;

use crate::error::{HttpError, bad};
use crate::state::hub::{Live, PAGE, frame_of, off_the_runtime};
use crate::state::{Api, may_see};

/// The filters of `GET /api/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventQuery {
    /// Only this agent's events.
    #[param(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub agent: Option<String>,
    /// Only the events of this agent and its descendants.
    #[param(pattern = "^(?!.*\\.(sock|d)$)[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]
    pub subtree: Option<String>,
    /// Only these types, comma-separated; `agent.*` matches a prefix.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
    /// Only this session's events.
    pub session: Option<String>,
    /// `brood` (the default) or `agentruntime` (the draft standard's events;
    /// those without a counterpart are left out).
    #[param(pattern = "^(brood|agentruntime)$")]
    pub format: Option<String>,
    /// Start after this sequence number (`Last-Event-ID` wins when both are given).
    pub after: Option<i64>,
    /// `false`: end the stream once the log is read (default `true`: follow it).
    pub follow: Option<bool>,
}

struct Filter {
    agent: Option<AgentName>,
    subtree: Option<AgentName>,
    kinds: Vec<String>,
    session: Option<String>,
    in_subtree: Membership,
}

/// Which agents are in a stream's subtree, remembered so the store is asked
/// once an agent, at most [`Membership::KEPT`] at a time: a subscriber that
/// follows the log for days sees every agent its tenant ever runs, and its
/// memory must not grow with them (issue 28). Past the bound it starts
/// over; an agent forgotten costs one store read at its next event.
#[derive(Default)]
struct Membership(HashMap<AgentName, bool>);

impl Membership {
    const KEPT: usize = 4096;

    fn of(&mut self, agent: &AgentName, ask: impl FnOnce() -> bool) -> bool {
        if let Some(&inside) = self.0.get(agent) {
            return inside;
        }
        let inside = ask();
        if self.0.len() >= Self::KEPT {
            self.0 = HashMap::new();
        }
        self.0.insert(agent.clone(), inside);
        inside
    }
}

impl Filter {
    fn matches(&mut self, api: &Api, e: &Event) -> bool {
        if self.agent.as_ref().is_some_and(|a| a != &e.agent) {
            return false;
        }
        if self
            .session
            .as_ref()
            .is_some_and(|s| s != e.session.as_str())
        {
            return false;
        }
        if !self.kinds.is_empty()
            && !self.kinds.iter().any(|k| match k.strip_suffix('*') {
                Some(prefix) => e.kind.starts_with(prefix),
                None => &e.kind == k,
            })
        {
            return false;
        }
        if let Some(root) = &self.subtree {
            let sup = api.sup();
            return self.in_subtree.of(&e.agent, || {
                sup.store()
                    .is_ancestor_or_self(sup.tenant(), root, &e.agent)
                    .unwrap_or(false)
            });
        }
        true
    }
}

/// The sequence a `Last-Event-ID` (`<tenant>-<seq>`, or a bare number) names.
fn last_seq(id: &str) -> Option<i64> {
    id.rsplit('-').next().and_then(|s| s.trim().parse().ok())
}

#[utoipa::path(
    get, path = "/api/events", tag = "events",
    params(EventQuery, ("Last-Event-ID" = Option<String>, Header, pattern = "^([ -~]*-)?[ \t]*[+]?[0-9]{1,18}[ \t]*$", description = "Resume after this event (the `id` of the last event received: what follows its last `-` is the sequence).")),
    responses(
        (status = 200, description = "`text/event-stream`: each event's `id` is its `event_id`, its `data` the event as JSON (`Event`, or the agentruntime form). `event: resync` (no id) ends a stream that fell too far behind: reconnect with `Last-Event-ID`.", content_type = "text/event-stream", body = brood_api::Event),
        (status = 400, description = "A filter is malformed.", body = brood_api::ErrorBody),
        (status = 403, description = "An agent asked for events outside its subtree.", body = brood_api::ErrorBody),
        (status = 404, description = "The agent (`agent`) or the subtree's root (`subtree`) does not exist.", body = brood_api::ErrorBody),
    )
)]
pub(crate) async fn events(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match open(&api, &caller, &headers, query) {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

fn open(
    api: &Api,
    caller: &Caller,
    headers: &HeaderMap,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, HttpError> {
    let Query(q) = query.map_err(|e| bad(format!("query: {}", e.body_text())))?;
    let name = |key: &str, v: &Option<String>| -> Result<Option<AgentName>, HttpError> {
        v.as_deref()
            .map(|s| {
                AgentName::new(s)
                    .map_err(|e| HttpError(ApiError::new(Code::InvalidName, format!("{key}: {e}"))))
            })
            .transpose()
    };
    let agent = name("agent", &q.agent)?;
    let mut subtree = name("subtree", &q.subtree)?;
    // An agent sees its own subtree's events only.
    if let Caller::Agent(me) = caller {
        match &subtree {
            Some(s) => may_see(api, caller, s)?,
            None => subtree = Some(me.clone()),
        }
        if let Some(a) = &agent {
            may_see(api, caller, a)?;
        }
    }
    // A filter naming no agent is a mistake to say, not an empty stream.
    for a in [&agent, &subtree].into_iter().flatten() {
        api.view().agent(a)?;
    }
    let format = match q.format.as_deref() {
        None => EventFormat::Brood,
        Some(f) => EventFormat::parse(f).ok_or_else(|| {
            bad(format!(
                "format: unknown event format {f:?}; use brood or agentruntime"
            ))
        })?,
    };
    let header_after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|id| last_seq(id).ok_or_else(|| bad(format!("Last-Event-ID {id:?} names no event"))))
        .transpose()?;
    let after = header_after.or(q.after).unwrap_or(0).max(0);
    let filter = Filter {
        agent,
        subtree,
        kinds: q
            .kind
            .iter()
            .flat_map(|k| k.split(','))
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .collect(),
        session: q.session,
        in_subtree: Membership::default(),
    };
    let (tx, rx) = mpsc::channel(api.0.hub.limits.connection_buffer.max(1));
    let rx_broadcast = api.0.hub.tx.subscribe();
    tokio::spawn(feed(
        api.clone(),
        filter,
        after,
        q.follow.unwrap_or(true),
        format,
        rx_broadcast,
        tx,
    ));
    Ok(sse_response(rx, api.0.hub.limits.keep_alive))
}

/// The stream of a subscriber's frames, with a `:` comment line whenever
/// `keep_alive` passes without one (it keeps the connection, and any proxy
/// on the way, open, and tells the client the server is alive).
fn sse_response(rx: mpsc::Receiver<Bytes>, keep_alive: std::time::Duration) -> Response {
    let stream = futures_util::stream::unfold(rx, move |mut rx| async move {
        let frame = match tokio::time::timeout(keep_alive, rx.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(_) => Bytes::from_static(b":\n\n"),
        };
        Some((Ok::<_, Infallible>(frame), rx))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Sends what the store holds after `*last`, up to `upto` when given, that
/// the filter passes, moving `*last` on. False when the subscriber is gone
/// or the read failed: the stream then ends, and the client resumes with its
/// `Last-Event-ID` (a failed read is never taken for "nothing more").
async fn from_store(
    api: &Api,
    filter: &mut Filter,
    last: &mut i64,
    upto: Option<i64>,
    format: EventFormat,
    tx: &mpsc::Sender<Bytes>,
) -> bool {
    let sup = api.sup().clone();
    loop {
        let (store, tenant, after, agent) = (
            sup.store().clone(),
            sup.tenant().clone(),
            *last,
            filter.agent.clone(),
        );
        let read = off_the_runtime(move || store.events(&tenant, after, agent.as_ref(), PAGE));
        let batch = match read.await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "reading the event log for a subscriber failed");
                return false;
            }
        };
        for e in &batch {
            if upto.is_some_and(|u| e.seq > u) {
                return true;
            }
            *last = e.seq;
            if filter.matches(api, e)
                && let Some(f) = frame_of(e, format)
                && tx.send(f).await.is_err()
            {
                return false;
            }
        }
        if batch.len() < PAGE as usize {
            return true;
        }
    }
}

/// Feeds one subscriber: the store after `after`, then the broadcast.
async fn feed(
    api: Api,
    mut filter: Filter,
    mut last: i64,
    follow: bool,
    format: EventFormat,
    mut live: broadcast::Receiver<Arc<Vec<Live>>>,
    tx: mpsc::Sender<Bytes>,
) {
    if !from_store(&api, &mut filter, &mut last, None, format, &tx).await {
        return;
    }
    if !follow {
        return;
    }
    // The hub's batches follow each other without a gap; only the first one
    // this subscriber takes may start past where its catch-up ended, and an
    // empty one says the hub lost the log for a while (see `Hub`): what lies
    // between comes from the store, so the stream stays gapless.
    let mut first_live = true;
    loop {
        match live.recv().await {
            Ok(batch) => {
                let gap = match batch.first().map(|l| &l.event) {
                    // The hub could not follow the log for a while.
                    None => Some(None),
                    Some(first) if std::mem::take(&mut first_live) && first.seq > last + 1 => {
                        Some(Some(first.seq - 1))
                    }
                    Some(_) => None,
                };
                if let Some(upto) = gap
                    && !from_store(&api, &mut filter, &mut last, upto, format, &tx).await
                {
                    return;
                }
                for l in batch.iter() {
                    if l.event.seq <= last {
                        continue;
                    }
                    last = l.event.seq;
                    if filter.matches(&api, &l.event)
                        && let Some(f) = l.frame(format)
                        && tx.send(f).await.is_err()
                    {
                        return;
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                let data = serde_json::json!({
                    "reason": "this subscriber fell behind the event log; reconnect with Last-Event-ID to catch up from the store",
                    "last_sequence": last,
                    "missed_batches": missed,
                });
                let frame = format!("event: resync\ndata: {data}\n\n");
                let _ = tx.send(Bytes::from(frame)).await;
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_memory_of_agents_stays_bounded_however_many_it_sees() {
        let mut m = Membership::default();
        let mut asked = 0;
        for i in 0..(Membership::KEPT * 2 + 10) {
            let a = AgentName::new(&format!("a{i}")).unwrap();
            assert!(m.of(&a, || {
                asked += 1;
                true
            }));
            assert!(m.0.len() <= Membership::KEPT, "{} remembered", m.0.len());
        }
        // Each agent seen once was asked once; one remembered is not asked again.
        assert_eq!(asked, Membership::KEPT * 2 + 10);
        let last = AgentName::new(&format!("a{}", Membership::KEPT * 2 + 9)).unwrap();
        assert!(m.of(&last, || unreachable!("remembered")));
    }
}
