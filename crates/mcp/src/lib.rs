//! brood's tools for MCP clients (issue 16, docs/mcp.md): `spawn send wait
//! cancel close resume list tree show events` and the job tools, each with a
//! JSON Schema for its input and a structured result, served with the
//! official Rust SDK (rmcp). Every tool is one or a few calls of the HTTP API
//! (docs/api.md) through a [`Backend`]: `brood mcp` (stdio) calls the
//! daemon's socket like the CLI, the daemon's `/mcp` calls its own router on
//! behalf of the authenticated caller. So the API decides everything: who may
//! act on what, attenuation, quotas; a refusal comes back as a tool error
//! (`isError`) carrying the API's `ErrorBody` and naming its code.
//!
//! **Invariant:** no tool blocks for long: `spawn` answers once the child is
//! admitted, `wait` is bounded ([`WAIT_MAX_S`]), `events` reads without
//! following. **Invariant:** nothing here writes to stdout; the stdio
//! transport owns it.

mod calls;
pub mod params;
mod tasks;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CustomRequest, CustomResult, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

/// The longest one `wait` call waits, and its default: many clients give up
/// on a tool call after 60 s.
pub const WAIT_MAX_S: f64 = 50.0;
pub const WAIT_DEFAULT_S: f64 = 20.0;

/// An API answer: its status and body (JSON, or the text as a string when
/// it is not JSON, as an event stream is not).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// Who the session's calls are for when they name nobody.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    /// The agent whose subtree the session works in (`list`, `tree`, `wait`
    /// and `events` default to it).
    pub name: String,
    /// Whether `spawn` names it as the parent: yes for a session root the
    /// operator's session made; no when the caller *is* that agent (the API
    /// makes an agent's creations its own children).
    pub as_parent: bool,
}

/// How the tools reach the API.
pub trait Backend: std::marker::Send + Sync + 'static {
    /// One API call on behalf of the caller of this MCP request.
    fn call(
        &self,
        ctx: &RequestContext<RoleServer>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> impl Future<Output = Result<Answer, String>> + std::marker::Send;

    /// The agent this session works for, made on first need (a stdio
    /// session's own root); `None`: the caller as the API sees it.
    fn owner(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<Option<Owner>, ToolError>> + std::marker::Send;
}

/// A tool that did not do what was asked: the API's code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError {
    pub code: String,
    pub message: String,
}

impl ToolError {
    pub fn new(code: &str, message: impl Into<String>) -> ToolError {
        ToolError {
            code: code.to_owned(),
            message: message.into(),
        }
    }

    /// `isError` with the API's `ErrorBody` as the structured content and
    /// "Code: message" as the text a model reads.
    fn result(&self) -> CallToolResult {
        let body =
            json!({"error": {"code": self.code, "reason": self.code, "message": self.message}});
        let mut r = CallToolResult::structured_error(body);
        r.content = vec![ContentBlock::text(format!(
            "{}: {}",
            self.code, self.message
        ))];
        r
    }
}

/// The MCP server: brood's tools over a [`Backend`].
pub struct Tools<B> {
    backend: Arc<B>,
    /// The `brood` binary, for `spawn` without `argv` (`brood agent`).
    brood: String,
    /// `$BROOD_ROOT/ctx/home/<uid>`, where the channels' `refs.jsonl` are
    /// (`show`); `None`: refs are not shown.
    home: Option<PathBuf>,
    /// Flags every `brood agent` child gets first (`--config FILE`).
    agent_args: Vec<String>,
}

impl<B> Clone for Tools<B> {
    fn clone(&self) -> Self {
        Tools {
            backend: self.backend.clone(),
            brood: self.brood.clone(),
            home: self.home.clone(),
            agent_args: self.agent_args.clone(),
        }
    }
}

impl<B: Backend> Tools<B> {
    pub fn new(backend: Arc<B>, brood: String, home: Option<PathBuf>) -> Tools<B> {
        Tools {
            backend,
            brood,
            home,
            agent_args: Vec::new(),
        }
    }

    /// Flags given to every `brood agent` child before its own.
    pub fn with_agent_args(mut self, args: Vec<String>) -> Tools<B> {
        self.agent_args = args;
        self
    }
}

impl<B: Backend> ServerHandler for Tools<B> {
    fn get_info(&self) -> ServerConfig {
        // The tasks extension: a client that declares it gets a task
        // handle from `spawn` (`tasks`).
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("brood", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "brood runs sandboxed, budgeted child agents owned by this session: \
                 `spawn` starts one and returns its name at once, `wait` (bounded) \
                 returns results, `cancel` stops a subtree. A `brood mcp` (stdio) \
                 session's children die when the session ends; over HTTP (`/mcp`) \
                 a child lives until it ends, is cancelled or its parent ends.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(params::tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        params::tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if self.get_tool(&name).is_none() {
            return Err(ErrorData::invalid_params(
                format!("no tool named {name:?}"),
                None,
            ));
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let as_task = name == "spawn" && tasks::wanted(&context);
        let r = match self.dispatch(&name, args, &context).await {
            Ok(v) if as_task => match tasks::created(&v) {
                Ok(t) => return Ok(CallToolResponse::Task(t)),
                Err(e) => e.result(),
            },
            Ok(v) => CallToolResult::structured(v),
            Err(e) => {
                tracing::debug!(tool = %name, code = %e.code, message = %e.message, "tool refused");
                e.result()
            }
        };
        Ok(r.into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.task(&request.task_id, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.task_cancel(&request.task_id, &context).await
    }

    /// `tasks/result`, which this SDK does not know: a method of its own.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method != "tasks/result" {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("no method {:?}", request.method),
                None,
            ));
        }
        let task_id = request
            .params
            .as_ref()
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorData::invalid_params("tasks/result: taskId is missing", None))?
            .to_owned();
        self.task_result(&task_id, &context)
            .await
            .map(CustomResult::new)
    }
}

/// A client's name as the start of an agent name: `[a-zA-Z0-9._+-]`, the
/// rest turned into `-`, starting with a letter or digit, at most 40
/// characters; `mcp` when nothing is left.
pub fn sanitise(client: &str) -> String {
    let s: String = client
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let s = s.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let s: String = s.chars().take(40).collect();
    let s = s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if s.is_empty() {
        "mcp".to_owned()
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_names_become_agent_names() {
        assert_eq!(sanitise("Claude Code"), "claude-code");
        assert_eq!(sanitise("  ..opencode/1.0 "), "opencode-1.0");
        assert_eq!(sanitise("日本"), "mcp");
        assert_eq!(sanitise(""), "mcp");
        assert_eq!(sanitise(&"x".repeat(90)).len(), 40);
    }

    #[test]
    fn every_tool_has_an_object_schema() {
        let tools = params::tools();
        assert_eq!(tools.len(), 17);
        for t in tools {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
            assert!(t.output_schema.is_some(), "{}", t.name);
        }
    }
}
