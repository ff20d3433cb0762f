//! `/api/ui/…`: the few reads the web UI needs that the other routes do not
//! give (docs/ui.md). The tree is one compact listing: one read of the
//! tenant's agents, one indexed read of each agent's runs (for its spend),
//! the tree and the subtree sums worked out in memory; so a tree of a
//! thousand agents is one request (about 45 ms in a debug build here) and
//! never a detail per agent. An agent's objects and transcript are read
//! only when its page is open. Everything comes from the store.

use std::collections::{HashMap, HashSet};

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brood_api::{
    AgentObjects, ArtifactView, AttemptList, AttemptView, ChannelView, ErrorBody, MessageView,
    Sequence, Transcript, TreeRow, TreeRows, Usage,
};
use brood_core::{AgentName, Code};
use brood_runtime::{ApiError, Caller};
use serde::Deserialize;
use serde_json::Value;
use utoipa::IntoParams;

use super::agents::read;
use super::path_name;
use crate::error::{HttpError, answer, bad, now_ms};
use crate::state::{Api, may_see};

/// The most messages one transcript answer carries; the page asks again
/// from the last one it got.
const TRANSCRIPT_PAGE: usize = 1000;
/// Events read per store call while looking for the newest `agent.start`.
const EVENT_PAGE: u32 = 1000;

/// The badge of an agent: `brood agent --type T`'s type, else its protocol.
fn kind_of(spec: &Value, protocol: &str) -> String {
    let argv: Vec<&str> = spec["argv"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (i, w) in argv.iter().enumerate() {
        if let Some(t) = w.strip_prefix("--type=") {
            return t.to_owned();
        }
        if *w == "--type"
            && let Some(t) = argv.get(i + 1)
        {
            return (*t).to_owned();
        }
    }
    protocol.to_owned()
}

fn add(a: &mut Usage, b: &Usage) {
    a.tokens_in += b.tokens_in;
    a.tokens_out += b.tokens_out;
    a.cost_usd += b.cost_usd;
}

fn zero() -> Usage {
    Usage {
        tokens_in: 0,
        tokens_out: 0,
        cost_usd: 0.0,
    }
}

/// Every agent the caller may see, parents before children.
/// `GET /api/ui/tree`'s filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TreeQuery {
    /// Only the trees still holding an unfinished agent (default: every
    /// tree, finished ones too).
    pub live: Option<bool>,
}

fn tree_rows(api: &Api, caller: &Caller, live_only: bool) -> Result<TreeRows, ApiError> {
    let sup = api.sup();
    let (store, tenant) = (sup.store(), sup.tenant());
    // Read before the agents, so a change between the two is seen again
    // on the stream rather than missed.
    let sequence = store.last_event_seq(tenant).map_err(ApiError::from)?;
    let agents = store.agents(tenant, true).map_err(ApiError::from)?;
    let mut kids: HashMap<Option<&str>, Vec<usize>> = HashMap::new();
    for (i, a) in agents.iter().enumerate() {
        kids.entry(a.parent.as_ref().map(AgentName::as_str))
            .or_default()
            .push(i);
    }
    // An agent sees its own subtree (as every read narrows it); the
    // operator every root's.
    let mut top: Vec<usize> = match caller {
        Caller::User { .. } => kids.get(&None).cloned().unwrap_or_default(),
        Caller::Agent(me) => agents
            .iter()
            .position(|a| &a.name == me)
            .into_iter()
            .collect(),
    };
    if live_only {
        // A history of finished trees grows without end; the trees at work
        // are what a long-lived daemon's page is opened for.
        let live: HashSet<&AgentName> = agents
            .iter()
            .filter(|a| !a.status.is_finished())
            .map(|a| &a.root)
            .collect();
        top.retain(|&i| live.contains(&agents[i].root));
    }
    // Pre-order, with an explicit stack (a tree may be 64 deep).
    let mut order = Vec::with_capacity(agents.len());
    let mut stack: Vec<usize> = top.into_iter().rev().collect();
    while let Some(i) = stack.pop() {
        order.push(i);
        if let Some(k) = kids.get(&Some(agents[i].name.as_str())) {
            stack.extend(k.iter().rev());
        }
    }
    // Every run in one read, not one read an agent (a round trip each on
    // PostgreSQL).
    let all_runs = store.tenant_runs(tenant).map_err(ApiError::from)?;
    let mut runs_of: HashMap<&str, Vec<&brood_store::Run>> = HashMap::new();
    for r in &all_runs {
        runs_of.entry(r.agent.as_str()).or_default().push(r);
    }
    let mut rows = Vec::with_capacity(order.len());
    let mut at: HashMap<&str, usize> = HashMap::with_capacity(order.len());
    for &i in &order {
        let a = &agents[i];
        let runs = runs_of.get(a.name.as_str()).map_or(&[][..], Vec::as_slice);
        let mut own = zero();
        for r in runs {
            add(
                &mut own,
                &Usage {
                    tokens_in: r.tokens_in,
                    tokens_out: r.tokens_out,
                    cost_usd: r.cost_usd,
                },
            );
        }
        let current = runs.iter().find(|r| r.id == a.run);
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        at.insert(a.name.as_str(), rows.len());
        rows.push(TreeRow {
            name: a.name.to_string(),
            parent: a.parent.as_ref().map(ToString::to_string),
            kind: kind_of(&spec, a.protocol.as_str()),
            status: a.status.api_word().to_owned(),
            reason: a.status.reason().map(str::to_owned),
            detail: a.detail.clone(),
            label: spec["label"].as_str().map(str::to_owned),
            depth: a.depth,
            children: kids
                .get(&Some(a.name.as_str()))
                .map_or(0, |k| k.len() as u32),
            created_ms: a.created_ms,
            updated_ms: a.updated_ms,
            started_ms: current.and_then(|r| r.started_ms),
            ended_ms: current.and_then(|r| r.ended_ms),
            subtree: own.clone(),
            own,
        });
    }
    // Subtree sums: children come after their parent, so walking backwards
    // adds each finished subtree into its parent's.
    for j in (0..rows.len()).rev() {
        if let Some(p) = rows[j].parent.as_deref().and_then(|p| at.get(p).copied()) {
            let s = rows[j].subtree.clone();
            add(&mut rows[p].subtree, &s);
        }
    }
    Ok(TreeRows {
        agents: rows,
        sequence,
        now_ms: now_ms(),
    })
}

#[utoipa::path(
    get, path = "/api/ui/tree", tag = "ui",
    params(TreeQuery),
    responses(
        (status = 200, description = "Every agent the caller may see, parents before children, siblings in start order, each with its badge, status, running time and spend (own and subtree): the web UI's tree in one request.", body = TreeRows),
        (status = 400, description = "A malformed filter.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_tree(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<TreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let live = match query {
        Ok(Query(q)) => q.live.unwrap_or(false),
        Err(e) => return bad(format!("query: {}", e.body_text())).into_response(),
    };
    answer(StatusCode::OK, tree_rows(&api, &caller, live))
}

/// The newest `agent.start` event's payload: what the current run's launch
/// enforced, which `meta.json` shows.
fn newest_start(api: &Api, name: &AgentName) -> Result<Option<Value>, ApiError> {
    let sup = api.sup();
    let mut after = 0;
    let mut start = None;
    loop {
        let page = sup
            .store()
            .events(sup.tenant(), after, Some(name), EVENT_PAGE)
            .map_err(ApiError::from)?;
        for e in &page {
            if e.kind == "agent.start" {
                start = serde_json::from_str(&e.payload).ok();
            }
        }
        match page.last() {
            Some(e) if page.len() == EVENT_PAGE as usize => after = e.seq,
            _ => return Ok(start),
        }
    }
}

fn objects(api: &Api, name: &AgentName) -> Result<AgentObjects, ApiError> {
    let sup = api.sup();
    let a = api.view().agent(name)?;
    let meta = brood_runtime::objects::agent_meta(&a, newest_start(api, name)?.as_ref());
    let meta = serde_json::from_str(&meta).unwrap_or(Value::Null);
    let mut launch: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
    if let Some(o) = launch.as_object_mut() {
        // The policy is the detail's; of the environment only the names are
        // shown, since its values may be credentials handed to the agent.
        o.remove("policy");
        if let Some(env) = o.get_mut("env")
            && let Some(e) = env.as_object()
        {
            *env = Value::Array(e.keys().cloned().map(Value::String).collect());
        }
    }
    let channel = match &a.parent {
        None => None,
        Some(p) => sup
            .store()
            .channel(sup.tenant(), p, name)
            .map_err(ApiError::from)?
            .map(|c| ChannelView {
                handoff: c.handoff,
                result: c.result,
                status: c.status.abi().channel.as_str().to_owned(),
                refs: c.refs,
                artifacts: c
                    .artifacts
                    .into_iter()
                    .map(|f| ArtifactView {
                        name: f.name,
                        sha256: f.sha256,
                        size: f.size,
                    })
                    .collect(),
            }),
    };
    Ok(AgentObjects {
        name: a.name.to_string(),
        meta,
        launch,
        channel,
    })
}

#[utoipa::path(
    get, path = "/api/ui/agents/{name}", tag = "ui",
    params(("name" = String, Path, description = "The agent's name.")),
    responses(
        (status = 200, description = "Its `meta.json` (what the launch enforced), its launch as admitted, and the channel it handed back (handoff, result, refs, artifacts).", body = AgentObjects),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_agent(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Response {
    read(&api, &caller, &name, |n| objects(&api, n))
}

/// The name a download is offered under: the artifact's last path segment,
/// anything but letters, digits, `.`, `-` and `_` replaced (it goes into a
/// header, and the name is the agent's to choose).
fn download_name(name: &str) -> String {
    let last = name.rsplit('/').next().unwrap_or(name);
    let safe: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.trim_matches('.').is_empty() {
        "artifact".to_owned()
    } else {
        safe
    }
}

#[utoipa::path(
    get, path = "/api/ui/agents/{name}/artifacts/{sha256}", tag = "ui",
    params(("name" = String, Path, description = "The agent's name."),
           ("sha256" = String, Path, description = "The artifact's SHA-256, as its channel lists it.")),
    responses(
        (status = 200, description = "The file the agent handed back, as an attachment (never shown as a page).", content((String = "application/octet-stream"))),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent, or no such artifact in its channel.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_artifact(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((name, sha256)): Path<(String, String)>,
) -> Response {
    let found = path_name(&name).and_then(|n| {
        may_see(&api, &caller, &n)?;
        let sup = api.sup();
        let a = api.view().agent(&n)?;
        // Only a blob this agent's channel names: the hash alone opens nothing.
        let artifact = match &a.parent {
            Some(p) => sup
                .store()
                .channel(sup.tenant(), p, &n)
                .map_err(ApiError::from)?
                .and_then(|c| c.artifacts.into_iter().find(|f| f.sha256 == sha256)),
            None => None,
        };
        artifact.ok_or_else(|| {
            HttpError(ApiError::new(
                Code::NotFound,
                format!("agent {n} handed back no artifact with sha256 {sha256:?}"),
            ))
        })
    });
    let artifact = match found {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let sup = api.sup();
    let blobs = sup.paths().blobs();
    let path = brood_runtime::channel::blob_path(&blobs, &artifact.sha256);
    // Off the connection's task: the file may be large and the disk slow.
    // A child another node ran: its bytes come from the shared store.
    let read = {
        let (path, store, tenant) = (path.clone(), sup.store().clone(), sup.tenant().clone());
        let sha256 = artifact.sha256.clone();
        tokio::task::spawn_blocking(move || {
            if !brood_runtime::channel::shared::fetch_blob(
                store.as_ref(),
                &tenant,
                &blobs,
                &sha256,
            )? {
                return Ok(None);
            }
            std::fs::read(path).map(Some)
        })
        .await
    };
    let bytes = match read.map_err(std::io::Error::other).and_then(|r| r) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return HttpError(ApiError::new(
                Code::NotFound,
                format!(
                    "artifact {} of agent {name}: its bytes are on the node that ran it, which did not share them",
                    artifact.name
                ),
            ))
            .into_response();
        }
        Err(e) => {
            tracing::error!(error = %e, path = %path.display(), "reading an artifact's blob");
            return HttpError(ApiError::new(
                Code::Internal,
                "the artifact's blob could not be read (see the supervisor's log)",
            ))
            .into_response();
        }
    };
    let mut r = (StatusCode::OK, bytes).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    // A download, never a page of this origin: no sniffing, no script.
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        download_name(&artifact.name)
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// `GET /api/ui/agents/{name}/transcript`'s filter.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TranscriptQuery {
    /// Only the messages after this position (default: from the first).
    pub after: Option<i64>,
}

#[utoipa::path(
    get, path = "/api/ui/agents/{name}/transcript", tag = "ui",
    params(("name" = String, Path, description = "The agent's name."), TranscriptQuery),
    responses(
        (status = 200, description = "Its session's messages after `after`, at most 1000; ask again from the last one for more.", body = Transcript),
        (status = 400, description = "A malformed filter.", body = ErrorBody),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such agent.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_transcript(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    query: Result<Query<TranscriptQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let after = match query {
        Ok(Query(q)) => q.after.unwrap_or(0),
        Err(e) => return bad(format!("query: {}", e.body_text())).into_response(),
    };
    read(&api, &caller, &name, |n| {
        let sup = api.sup();
        let a = api.view().agent(n)?;
        let messages = sup
            .store()
            .messages(sup.tenant(), n, &a.session)
            .map_err(ApiError::from)?
            .into_iter()
            .filter(|m| m.seq > after)
            .take(TRANSCRIPT_PAGE)
            .map(|m| MessageView {
                seq: m.seq,
                ts_ms: m.ts_ms,
                run: m.run.to_string(),
                role: m.role,
                content: m.content,
            })
            .collect();
        Ok(Transcript { messages })
    })
}

#[utoipa::path(
    get, path = "/api/ui/jobs/{id}/items/{item}/attempts", tag = "ui",
    params(("id" = String, Path, description = "The job's id."),
           ("item" = String, Path, description = "The item's id.")),
    responses(
        (status = 200, description = "Every attempt at the item, oldest first (none for an item never tried).", body = AttemptList),
        (status = 403, description = "Outside the calling agent's subtree.", body = ErrorBody),
        (status = 404, description = "No such job, or no such item in it.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_attempts(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path((id, item)): Path<(String, String)>,
) -> Response {
    let sup = api.sup();
    let store = sup.store().as_ref();
    let r = brood_runtime::jobs::get(store, sup.tenant(), &caller, &id).and_then(|job| {
        let attempts = store
            .attempts(sup.tenant(), &job.id, &item)
            .map_err(ApiError::from)?;
        Ok(AttemptList {
            attempts: attempts
                .into_iter()
                .map(|a| AttemptView {
                    number: a.number,
                    worker: a.worker.map(|w| w.to_string()),
                    started_ms: a.started_ms,
                    ended_ms: a.ended_ms,
                    outcome: a.outcome.as_str().to_owned(),
                    error: a.error,
                })
                .collect(),
        })
    });
    answer(StatusCode::OK, r)
}

#[utoipa::path(
    get, path = "/api/ui/sequence", tag = "ui",
    responses(
        (status = 200, description = "The sequence of the tenant's last event: a page reads its data, then follows `/api/events?after=` it.", body = Sequence),
        (status = 403, description = "The caller is an agent: the sequence moves with every tree's events.", body = ErrorBody),
    )
)]
pub(crate) async fn ui_sequence(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
) -> Response {
    // The tenant's last sequence moves with every tree's events.
    if let Err(e) = super::operator_only(&caller, "/api/ui/sequence", "follows every tree's events")
    {
        return e.into_response();
    }
    let sup = api.sup();
    let r = sup
        .store()
        .last_event_seq(sup.tenant())
        .map(|sequence| Sequence { sequence })
        .map_err(ApiError::from);
    answer(StatusCode::OK, r)
}

#[cfg(test)]
mod tests {
    use super::{download_name, kind_of};
    use serde_json::{Value, json};

    #[test]
    fn the_badge_is_the_reference_agents_type_else_the_protocol() {
        let spec = |argv: Value| json!({ "argv": argv });
        assert_eq!(
            kind_of(&spec(json!(["brood", "agent", "--type", "code"])), "brood"),
            "code"
        );
        assert_eq!(
            kind_of(&spec(json!(["brood", "agent", "--type=explore"])), "brood"),
            "explore"
        );
        assert_eq!(kind_of(&spec(json!(["sh", "-c", "true"])), "exec"), "exec");
        assert_eq!(kind_of(&spec(json!(["x", "--type"])), "brood"), "brood");
        assert_eq!(kind_of(&Value::Null, "brood"), "brood");
    }

    #[test]
    fn a_download_is_named_safely() {
        assert_eq!(download_name("notes/a report.md"), "a_report.md");
        assert_eq!(download_name("x\"; y=\r\n"), "x___y___");
        assert_eq!(download_name(".."), "artifact");
        assert_eq!(download_name("ok-1_2.txt"), "ok-1_2.txt");
    }
}
