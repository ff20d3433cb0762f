//! The OpenAPI 3.1 document of the API, generated from the handlers'
//! annotations and `brood_api`'s types (utoipa), served at
//! `/api/openapi.json`.

use axum::response::IntoResponse;
use serde_json::Value;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response};
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
        crate::ui::session::logout, crate::mcp::session,
    ),
    components(schemas(brood_api::Event)),
    modifiers(&Bearer, &Shared),
    security(("bearer" = [])),
    tags(
        (name = "agents", description = "Create agents and act on them."),
        (name = "sessions", description = "The tree as sessions, as the seed's harness shows it."),
        (name = "events", description = "The event log as server-sent events."),
        (name = "jobs", description = "Batch jobs: one instruction over many items, run by worker agents (SPEC 10)."),
        (name = "service", description = "Health, metrics, the nodes sharing the store, and this document."),
        (name = "mcp", description = "The root a stdio `brood mcp` session holds for as long as it is connected (docs/mcp.md); the MCP tools themselves are at `/mcp` (streamable HTTP, not described here)."),
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

/// The answers any route may give, declared once in `components/responses`
/// and referred to from every operation that can give them (unless the
/// operation declares that status itself, with words of its own):
///  - 401 and 403 from authentication, on every route but the open ones
///    (`/healthz`, which declares `security: []`);
///  - 400 and 413 on every route that reads a body (the body must be a JSON
///    object of its schema, or nothing where it is optional);
///  - 400 and 422 on every route that takes an `Idempotency-Key`;
///  - 500 when the store fails, anywhere.
struct Shared;

/// The routes anyone may call on the TCP listener without the token.
const OPEN: &[&str] = &["/healthz"];

const UNAUTHORIZED: &str = "Unauthorized";
const FORBIDDEN: &str = "Forbidden";
const BAD_REQUEST: &str = "BadRequest";
const TOO_LARGE: &str = "TooLarge";
const KEY_REUSED: &str = "IdempotencyKeyReused";
const INTERNAL: &str = "Internal";

fn error_response(description: &str) -> Response {
    Response::builder()
        .description(description)
        .content(
            "application/json",
            Content::new(Some(Ref::from_schema_name("ErrorBody"))),
        )
        .build()
}

impl Modify for Shared {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        for (name, description) in [
            (
                UNAUTHORIZED,
                "The TCP listener without the bearer token, or with a wrong one.",
            ),
            (
                FORBIDDEN,
                "Refused: the caller may not do this (an agent outside its own subtree, the operator's token presented from inside an agent, a process the runtime cannot place).",
            ),
            (
                BAD_REQUEST,
                "Malformed: a body that is not a JSON object of the request's schema (the failing field named), a bad parameter, or an Idempotency-Key that is not 1 to 255 visible ASCII characters.",
            ),
            (TOO_LARGE, "The body is over 1 MiB."),
            (
                KEY_REUSED,
                "The Idempotency-Key was used for another request (another route or body).",
            ),
            (
                INTERNAL,
                "The store failed; the details are in the supervisor's log.",
            ),
        ] {
            c.responses
                .insert(name.to_owned(), error_response(description).into());
        }
        for (path, item) in doc.paths.paths.iter_mut() {
            let open = OPEN.contains(&path.as_str());
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.delete,
                &mut item.put,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let mut shared = vec![("403", FORBIDDEN), ("500", INTERNAL)];
                if open {
                    op.security = Some(Vec::new());
                } else {
                    shared.push(("401", UNAUTHORIZED));
                }
                if op.request_body.is_some() {
                    shared.extend([("400", BAD_REQUEST), ("413", TOO_LARGE)]);
                }
                let mut keyed = false;
                for p in op.parameters.iter_mut().flatten() {
                    if p.parameter_in == ParameterIn::Header && p.name == "Idempotency-Key" {
                        keyed = true;
                        // As `idempotency::once` takes it.
                        p.schema = Some(
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .min_length(Some(1))
                                .max_length(Some(255))
                                .pattern(Some("^[!-~]+$"))
                                .into(),
                        );
                    }
                }
                if keyed {
                    shared.extend([("400", BAD_REQUEST), ("422", KEY_REUSED)]);
                }
                for r in op.responses.responses.values_mut() {
                    if let RefOr::T(r) = r {
                        for (kind, content) in r.content.iter_mut() {
                            if kind.as_str() == "text/event-stream" {
                                content.schema = content.schema.take().map(sse_event);
                            }
                        }
                    }
                }
                for (status, name) in shared {
                    op.responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| Ref::from_response_name(name).into());
                }
            }
        }
    }
}

/// One server-sent event of a stream whose `data` is `data` as JSON (OpenAPI
/// 3.1 describes a `text/event-stream` by its events): the event's fields
/// as a client reads them, `data` a string holding the JSON document.
fn sse_event(data: RefOr<Schema>) -> RefOr<Schema> {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let content_schema = serde_json::to_value(&data).unwrap_or_default();
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(
            "One event: `data` is a JSON document of the schema in its `contentSchema`.",
        ))
        .property(
            "event",
            string().description(Some(
                "The event's type (`message` when the server names none).",
            )),
        )
        .property(
            "id",
            string().description(Some("The event's id, for `Last-Event-ID`.")),
        )
        .property(
            "data",
            string()
                .content_media_type("application/json")
                .extensions(Some(Extensions::from_iter([(
                    "contentSchema",
                    content_schema,
                )]))),
        )
        .required("data")
        .into()
}

/// The schemas written as JSON (`brood_api::policy`: utoipa's types hold
/// no `propertyNames`): the policy's, and the fields that hold a policy or
/// a map of variables, each keeping the description its type gave it.
fn add_json_schemas(doc: &mut Value) {
    use brood_api::policy;
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        schemas.insert(policy::SCHEMA_NAME.to_owned(), policy::json());
        schemas.insert("AgentRuntimeEvent".to_owned(), agentruntime_event());
    }
    // `/api/events?format=agentruntime` sends the draft standard's events.
    if let Some(data) = doc.pointer_mut(
        "/paths/~1api~1events/get/responses/200/content/text~1event-stream/schema/properties/data/contentSchema",
    ) {
        *data = serde_json::json!({"anyOf": [
            {"$ref": "#/components/schemas/Event"},
            {"$ref": "#/components/schemas/AgentRuntimeEvent"},
        ]});
    }
    let fields = [
        ("SpawnBody", "policy", policy::field()),
        ("WorkerBody", "policy", policy::field()),
        ("SessionBody", "policy", policy::field()),
        ("SpawnBody", "env", policy::nullable(policy::env())),
        (
            "SpawnBody",
            "secrets",
            policy::nullable(policy::secret_values()),
        ),
        (
            "ResumeBody",
            "secrets",
            policy::nullable(policy::secret_values()),
        ),
        (
            "SessionBody",
            "secrets",
            policy::nullable(policy::secret_values()),
        ),
        ("Placement", "labels", policy::labels()),
        // Required of the operator (whom the document describes), so never `null`.
        (
            "JobBody",
            "owner",
            serde_json::json!({"type": "string", "pattern": policy::NAME}),
        ),
        ("SpawnBody", "argv", argv()),
        ("WorkerBody", "argv", policy::nullable(argv())),
        ("SpawnBody", "task", no_nul(true)),
        ("JobBody", "instruction", no_nul(false)),
        (
            "JobBody",
            "input",
            serde_json::json!({"oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "object"}},
            ]}),
        ),
    ];
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            for op in item
                .as_object_mut()
                .into_iter()
                .flat_map(|o| o.values_mut())
            {
                for p in op
                    .get_mut("parameters")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    parameter(path, p);
                }
            }
        }
    }
    // utoipa writes an optional body (`Option<T>`) as `T` or `null`; the
    // server takes no body, or an object, never `null`: the body is
    // optional by `required: false`, and its schema is `T`.
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for op in paths.values_mut().filter_map(Value::as_object_mut) {
            for o in op.values_mut() {
                let Some(content) = o
                    .pointer_mut("/requestBody/content")
                    .and_then(Value::as_object_mut)
                else {
                    continue;
                };
                for media in content.values_mut() {
                    let Some(one_of) = media.pointer("/schema/oneOf").and_then(Value::as_array)
                    else {
                        continue;
                    };
                    let not_null: Vec<&Value> = one_of
                        .iter()
                        .filter(|s| s.get("type") != Some(&Value::from("null")))
                        .collect();
                    if let [only] = not_null[..] {
                        media["schema"] = only.clone();
                    }
                }
            }
        }
    }
    for (schema, field, mut with) in fields {
        let at = format!("/components/schemas/{schema}/properties/{field}");
        if let Some(old) = doc.pointer_mut(&at) {
            if let (Some(d), Some(w)) = (old.get("description"), with.as_object_mut()) {
                w.insert("description".to_owned(), d.clone());
            }
            *old = with;
        }
    }
}

/// A parameter as the server reads it. A query or header value is never
/// `null` (utoipa writes an `Option<String>` as a string or `null`); a path's
/// names and ids have their patterns (one that cannot exist is simply not
/// found, 404).
fn parameter(path: &str, p: &mut Value) {
    if let Some(t) = p.pointer_mut("/schema/type")
        && let Some(kinds) = t.as_array()
        && let [one] = kinds
            .iter()
            .filter(|k| k.as_str() != Some("null"))
            .collect::<Vec<_>>()[..]
    {
        *t = one.clone();
    }
    if p.get("in").and_then(Value::as_str) != Some("path") {
        return;
    }
    let pattern = match p.get("name").and_then(Value::as_str) {
        Some("name") => brood_api::policy::NAME,
        Some("id") if path.starts_with("/api/sessions/") => brood_api::policy::NAME,
        Some("id") => "^[A-Za-z0-9][A-Za-z0-9_-]{0,51}$",
        Some("item") => "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,64}$",
        Some("sha256") => "^[0-9a-f]{64}$",
        _ => return,
    };
    if let Some(schema) = p.get_mut("schema").and_then(Value::as_object_mut) {
        schema.insert("pattern".to_owned(), Value::from(pattern));
    }
}

/// An event as `brood_runtime::agentruntime::to_agentruntime` writes it
/// (the Agent Runtime draft standard's form).
fn agentruntime_event() -> Value {
    let string = serde_json::json!({"type": "string"});
    serde_json::json!({
        "type": "object",
        "description": "An event in the Agent Runtime draft standard's form (`format=agentruntime`): brood's kinds mapped to the standard's (`subagent.spawned`, `subagent.status`, `subagent.completed`, …, the job events as they are), brood's own payload kept.",
        "required": ["type", "eventId", "timestamp", "sequence", "sessionId", "subagentId", "payload"],
        "properties": {
            "type": string, "eventId": string,
            "timestamp": {"type": "string", "description": "RFC 3339, UTC, milliseconds."},
            "sequence": {"type": "integer"},
            "sessionId": string, "subagentId": string, "runId": string,
            "jobId": string, "jobItemId": string,
            "status": string, "statusReason": string, "phase": string, "nativeStatus": string,
            "payload": {"description": "brood's own payload of the event."},
        }
    })
}

/// A program and its arguments as `check_argv` takes them: the program an
/// absolute path or a bare name, no NUL byte anywhere.
fn argv() -> Value {
    serde_json::json!({
        "type": "array",
        "minItems": 1,
        "prefixItems": [{"type": "string", "pattern": "^(/[^\\u0000]*|[^/\\u0000]+)$"}],
        "items": {"type": "string", "pattern": "^[^\\u0000]*$"},
    })
}

/// A string without a NUL byte (`nullable`: or `null`).
fn no_nul(nullable: bool) -> Value {
    let s = serde_json::json!({"type": "string", "pattern": "^[^\\u0000]*$"});
    if nullable {
        brood_api::policy::nullable(s)
    } else {
        s
    }
}

/// `GET /api/openapi.json`: the document, served.
#[utoipa::path(
    get, path = "/api/openapi.json", tag = "service",
    responses((status = 200, description = "This API's OpenAPI 3.1 document.", content_type = "application/json", body = Object))
)]
pub(crate) async fn openapi() -> axum::response::Response {
    let mut r = document().into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The document as JSON.
pub fn document() -> String {
    let written = serde_json::to_value(Doc::openapi()).and_then(|mut doc| {
        add_json_schemas(&mut doc);
        serde_json::to_string_pretty(&doc)
    });
    written.unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document could not be written: {e}\"}}")
    })
}

/// The document as utoipa builds it (for tests and tools); [`document`]
/// adds the policy's schema to it.
pub fn spec() -> utoipa::openapi::OpenApi {
    Doc::openapi()
}
