//! The router: every route of SPEC 11, with [`crate::auth::authenticate`] in
//! front and JSON errors for unknown paths and methods. It sits above the
//! handlers and the OpenAPI document made from them, so neither needs the
//! other.

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};

use crate::routes::*;
use crate::state::Api;

pub(crate) fn router(api: Api) -> Router {
    Router::new()
        .route("/api/agents", post(spawn).get(list))
        .route("/api/agents/{name}", get(show).delete(remove))
        .route("/api/agents/{name}/input", post(input))
        .route("/api/agents/{name}/wait", post(wait))
        .route("/api/agents/{name}/resume", post(resume))
        .route("/api/agents/{name}/close", post(close))
        .route("/api/agents/{name}/cancel", post(cancel))
        .route("/api/agents/{name}/children", get(children))
        .route("/api/agents/{name}/descendants", get(descendants))
        .route("/api/agents/{name}/log", get(log))
        .route("/api/tree", get(tree))
        .route("/api/prune", post(prune))
        .route("/api/sessions/tree", get(session_tree))
        .route("/api/sessions/{id}", get(session))
        .route("/api/sessions/{id}/children", get(session_children))
        .route("/api/sessions/{id}/parent", get(session_parent))
        .route("/api/events", get(crate::events::events))
        .route("/api/jobs", post(job_create).get(job_list))
        .route("/api/jobs/{id}", get(job_get).delete(job_remove))
        .route("/api/jobs/{id}/start", post(job_start))
        .route("/api/jobs/{id}/cancel", post(job_cancel))
        .route("/api/jobs/{id}/items", get(job_items))
        .route("/api/jobs/{id}/retry", post(job_retry_failed))
        .route("/api/jobs/{id}/evidence", get(job_evidence))
        .route("/api/jobs/{id}/items/{item}/assign", post(job_assign))
        .route("/api/jobs/{id}/items/{item}/retry", post(job_retry))
        .route("/api/jobs/{id}/items/{item}/report", post(job_report))
        .route("/api/jobs/{id}/export", get(job_export))
        .route("/api/jobs/{id}/replay", post(job_replay))
        .route("/api/nodes", get(nodes))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/openapi.json", get(crate::openapi::openapi))
        // MCP (docs/mcp.md): the tools over streamable HTTP, and the session
        // root a stdio `brood mcp` holds for as long as it is connected.
        .route_service("/mcp", crate::mcp::service(api.clone()))
        .route("/api/mcp/session", post(crate::mcp::session))
        .route("/api/ui/tree", get(ui_tree))
        .route("/api/ui/sequence", get(ui_sequence))
        .route("/api/ui/agents/{name}", get(ui_agent))
        .route("/api/ui/agents/{name}/transcript", get(ui_transcript))
        .route("/api/ui/agents/{name}/artifacts/{sha256}", get(ui_artifact))
        .route("/api/ui/jobs/{id}/items/{item}/attempts", get(ui_attempts))
        .merge(crate::ui::pages())
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(from_fn_with_state(api.clone(), crate::auth::authenticate))
        // Outermost: authentication reads too (a token's holder).
        .layer(from_fn_with_state(
            api.clone(),
            crate::offload::off_the_workers,
        ))
        .with_state(api)
}

impl Api {
    /// The router, every route of SPEC 11, with authentication in front.
    pub fn router(&self) -> Router {
        router(self.clone())
    }
}
