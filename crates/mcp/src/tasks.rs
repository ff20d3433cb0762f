//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663, of
//! the 2026-07-28 revision; issue 30): a child agent is exactly a task.
//! When the client declares the extension, `spawn` answers a task handle
//! instead of the child's record; `tasks/get` reads the child through the
//! API and gives its status, and once it has finished its result (the
//! extension carries the result in `tasks/get`, which never blocks);
//! `tasks/cancel` cancels its subtree.
//!
//! The task's id is the child's name. brood keeps no table of tasks: each
//! `tasks/*` call is an API call of the caller that makes it, so the API's
//! rules decide who may see or cancel a task (a task of another tree is
//! "not found", as its agent is), and a client that reconnects finds its
//! tasks as long as their agents are there for it (over `/mcp`, where a
//! child outlives the connection; a stdio session's children die with it).

use brood_api::{Agent, AgentDetail};
use brood_core::time::rfc3339_utc_ms;
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, Task, TaskPayload,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use crate::{Backend, ToolError, Tools, WAIT_MAX_S, params};

/// How often a client should ask again about a task that is still working.
const POLL_INTERVAL_MS: u64 = 500;

/// Whether this request's client declared the tasks extension (in the
/// request's `_meta` on the 2026-07-28 revision, at `initialize` on the
/// older ones): only such a client may be answered a task handle.
pub(crate) fn wanted(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
}

/// A child's record as the task's base fields. The task was last updated
/// when the agent last changed.
fn base(a: &Agent) -> Task {
    Task::new(
        a.name.clone(),
        rmcp::model::TaskStatus::Working,
        rfc3339_utc_ms(a.created_ms),
        rfc3339_utc_ms(a.updated_ms.max(a.created_ms)),
    )
    .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// The handle `spawn` answers: the child just admitted, working.
pub(crate) fn created(child: &Value) -> Result<CreateTaskResult, ToolError> {
    let a: Agent = serde_json::from_value(child.clone()).map_err(|e| {
        ToolError::new(
            "Internal",
            format!("spawn: the child's record is not what the API documents: {e}"),
        )
    })?;
    let task = base(&a).with_status_message(a.status.clone());
    Ok(CreateTaskResult::new(task))
}

/// A tool result as the task's result object.
fn object(r: CallToolResult) -> Result<JsonObject, ErrorData> {
    match serde_json::to_value(r) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(other) => Err(ErrorData::internal_error(
            format!("a task's result is not a JSON object: {other}"),
            None,
        )),
        Err(e) => Err(ErrorData::internal_error(
            format!("writing a task's result failed: {e}"),
            None,
        )),
    }
}

/// The child's status as the task's: unfinished is `working` (a `blocked`
/// child waits for its parent's input, which a tool call gives, not the
/// extension's `input_required`); `completed` and `closed` are `completed`
/// with what `show` gives as the result; `failed` is `completed` with that
/// result marked `isError` (the tool call worked, the child did not: the
/// extension keeps `failed` for a JSON-RPC error); `cancelled` is
/// `cancelled`.
fn detailed(a: &Agent, shown: Value) -> Result<DetailedTask, ErrorData> {
    let mut task = base(a);
    let what = match (&a.reason, &a.detail) {
        (Some(r), Some(d)) => format!("{}: {r}: {d}", a.status),
        (Some(r), None) => format!("{}: {r}", a.status),
        _ => a.status.clone(),
    };
    task = task.with_status_message(what.clone());
    let payload = match a.status.as_str() {
        "completed" | "closed" => TaskPayload::Completed {
            result: object(CallToolResult::structured(shown))?,
        },
        "failed" => {
            let mut r = CallToolResult::structured_error(shown);
            r.content = vec![rmcp::model::ContentBlock::text(what)];
            TaskPayload::Completed { result: object(r)? }
        }
        "cancelled" => TaskPayload::Cancelled,
        _ => TaskPayload::Working,
    };
    Ok(DetailedTask::new(task, payload))
}

/// A refusal of the API as the JSON-RPC error of a `tasks/*` call: a task
/// the caller may not see is one that does not exist.
fn refused(task_id: &str, e: ToolError) -> ErrorData {
    match e.code.as_str() {
        "NotFound" | "Forbidden" => ErrorData::invalid_params(format!("no task {task_id:?}"), None),
        _ => {
            ErrorData::internal_error(format!("task {task_id:?}: {}: {}", e.code, e.message), None)
        }
    }
}

impl<B: Backend> Tools<B> {
    /// `tasks/get`: the child's status, and its result once it finished.
    pub(crate) async fn task(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let p = params::Agent {
            agent: task_id.to_owned(),
        };
        let shown = self.show(p, ctx).await.map_err(|e| refused(task_id, e))?;
        let detail: AgentDetail = serde_json::from_value(shown.clone()).map_err(|e| {
            ErrorData::internal_error(
                format!("task {task_id:?}: the agent's record is not what the API documents: {e}"),
                None,
            )
        })?;
        Ok(GetTaskResult::new(detailed(&detail.agent, shown)?))
    }

    /// `tasks/result` (the 2025-11-25 name, kept for clients that send
    /// it): waits for the task to end, at most [`WAIT_MAX_S`] (no call
    /// blocks for long), and answers the tool result `tasks/get` carries
    /// once it has ended; a task still working then is an error saying to
    /// ask again.
    pub(crate) async fn task_result(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        let name = crate::calls::seg("agent", task_id).map_err(|e| refused(task_id, e))?;
        let path = format!("/api/agents/{name}/wait");
        self.api(ctx, "POST", &path, Some(json!({"timeout_s": WAIT_MAX_S})))
            .await
            .map_err(|e| refused(task_id, e))?;
        let got = self.task(task_id, ctx).await?;
        match got.task.payload {
            TaskPayload::Completed { result } => Ok(Value::Object(result)),
            TaskPayload::Cancelled => {
                let mut r = CallToolResult::structured_error(
                    json!({"task": task_id, "status": "cancelled"}),
                );
                r.content = vec![rmcp::model::ContentBlock::text(format!(
                    "task {task_id:?} was cancelled"
                ))];
                Ok(Value::Object(object(r)?))
            }
            _ => Err(ErrorData::internal_error(
                format!("task {task_id:?} is still working after {WAIT_MAX_S} s: ask again"),
                None,
            )),
        }
    }

    /// `tasks/cancel`: the child and its whole subtree cancelled. A task
    /// already finished is left as it is (cancelling it again is no error).
    pub(crate) async fn task_cancel(
        &self,
        task_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let name = crate::calls::seg("agent", task_id).map_err(|e| refused(task_id, e))?;
        let path = format!("/api/agents/{name}/cancel");
        self.api(ctx, "POST", &path, Some(json!({})))
            .await
            .map(|_| ())
            .map_err(|e| refused(task_id, e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{detailed, refused};
    use crate::ToolError;
    use brood_api::Agent;
    use rmcp::model::TaskStatus;
    use serde_json::json;

    fn agent(status: &str) -> Agent {
        serde_json::from_value(json!({
            "name": "kid", "parent": "p", "customer": null, "status": status,
            "state": status, "reason": if status == "failed" { json!("exit_code") } else { json!(null) },
            "detail": null, "depth": 1, "session": "default", "protocol": "exec", "run": "r1",
            "pid": null, "cgroup": null, "node": "", "result": null, "exit_code": null,
            "created_ms": 1_700_000_000_000_i64, "updated_ms": 1_700_000_001_000_i64,
            "started_ms": null, "ended_ms": null, "tokens_in": null, "tokens_out": null,
            "cost_usd": null
        }))
        .unwrap()
    }

    #[test]
    fn an_agents_status_is_its_tasks() {
        let shown = json!({"name": "kid", "result": "done"});
        for (status, want) in [
            ("queued", TaskStatus::Working),
            ("running", TaskStatus::Working),
            ("blocked", TaskStatus::Working),
            ("stopping", TaskStatus::Working),
            ("completed", TaskStatus::Completed),
            ("closed", TaskStatus::Completed),
            ("failed", TaskStatus::Completed),
            ("cancelled", TaskStatus::Cancelled),
        ] {
            let t = detailed(&agent(status), shown.clone()).unwrap();
            assert_eq!(t.status(), want, "{status}");
            assert_eq!(t.task.task_id, "kid");
            assert_eq!(t.task.created_at, "2023-11-14T22:13:20.000Z");
            assert_eq!(t.task.last_updated_at, "2023-11-14T22:13:21.000Z");
        }
        let wire =
            serde_json::to_value(detailed(&agent("failed"), shown.clone()).unwrap()).unwrap();
        assert_eq!(wire["result"]["isError"], json!(true), "{wire}");
        assert_eq!(wire["statusMessage"], "failed: exit_code", "{wire}");
        let wire = serde_json::to_value(detailed(&agent("completed"), shown).unwrap()).unwrap();
        assert_eq!(
            wire["result"]["structuredContent"]["result"], "done",
            "{wire}"
        );
    }

    #[test]
    fn a_task_the_caller_may_not_see_does_not_exist() {
        let hidden = refused("x", ToolError::new("Forbidden", "not yours"));
        let missing = refused("x", ToolError::new("NotFound", "no agent"));
        assert_eq!(hidden.message, missing.message);
        assert!(!hidden.message.contains("not yours"));
    }
}
