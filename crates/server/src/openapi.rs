//! The OpenAPI 3.1 document of the API, generated from the handlers'
//! annotations and `brood_api`'s types (utoipa), served at
//! `/api/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::*;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "brood",
        description = "The control plane of brood, a runtime for child agents (SPEC 11). Served on $BROOD_ROOT/brood.sock (callers identified by their peer credentials) and, with `brood serve --listen`, on a loopback TCP port (bearer token in $BROOD_ROOT/token). Errors are `{\"error\":{\"code\",\"reason\",\"message\"}}`.",
        license(name = "Apache-2.0")
    ),
    paths(
        spawn, list, show, input, wait, resume, close, cancel, children, descendants, log, tree,
        remove, prune,
        session, session_children, session_parent, session_tree,
        crate::events::events,
        job_create, job_list, job_get, job_start, job_cancel, job_items, job_assign, job_retry,
        job_report, job_retry_failed, job_export, job_evidence, job_replay, job_remove,
        nodes, metrics, healthz, openapi,
        ui_tree, ui_sequence, ui_agent, ui_transcript, ui_artifact, ui_attempts,
        crate::ui::session::logout,
    ),
    components(schemas(brood_api::Event)),
    modifiers(&Bearer),
    security(("bearer" = [])),
    tags(
        (name = "agents", description = "Create agents and act on them."),
        (name = "sessions", description = "The tree as sessions, as the seed's harness shows it."),
        (name = "events", description = "The event log as server-sent events."),
        (name = "jobs", description = "Batch jobs: one instruction over many items, run by worker agents (SPEC 10)."),
        (name = "service", description = "Health, metrics, the nodes sharing the store, and this document."),
        (name = "ui", description = "The web UI's compact reads (docs/ui.md): the whole tree in one listing, an agent's objects and transcript, an item's attempts."),
    )
)]
struct Doc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "Required on the TCP listener (the token in $BROOD_ROOT/token); the Unix socket identifies callers by their credentials instead.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document as JSON.
pub fn document() -> String {
    Doc::openapi().to_pretty_json().unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document could not be written: {e}\"}}")
    })
}

/// The document as a value (for tests and tools).
pub fn spec() -> utoipa::openapi::OpenApi {
    Doc::openapi()
}
