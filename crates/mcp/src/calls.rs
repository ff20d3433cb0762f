//! Each tool as calls of the HTTP API (docs/api.md): arguments checked and
//! turned into paths and bodies, answers read into their `brood_api` types
//! and passed back as those types' JSON, refusals (`brood_api::ErrorBody`)
//! as [`ToolError`]s with the API's code.

use std::time::{Duration, Instant};

use brood_api::{Agent, AgentList, ErrorBody, JobView};
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::params;
use crate::{Backend, Owner, ToolError, Tools, WAIT_DEFAULT_S, WAIT_MAX_S};

/// Statuses after which an agent does nothing more until resumed.
const FINISHED: [&str; 4] = ["completed", "failed", "cancelled", "closed"];

fn parse<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::new("BadRequest", format!("{tool}: arguments: {e}")))
}

/// A typed answer as a tool's structured result: the JSON the API sent.
fn out<T: Serialize>(v: &T) -> Result<Value, ToolError> {
    serde_json::to_value(v).map_err(|e| {
        ToolError::new(
            "Internal",
            format!("writing the answer as JSON failed: {e}"),
        )
    })
}

/// A name or id as one path segment: SPEC 1's name characters only, so an
/// argument can never reach another route (`a/cancel`, `..`, `?x`).
pub(crate) fn seg<'a>(what: &str, s: &'a str) -> Result<&'a str, ToolError> {
    let ok = !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    if ok {
        Ok(s)
    } else {
        Err(ToolError::new("NotFound", format!("no {what} named {s:?}")))
    }
}

/// A query value, percent-encoded.
fn q(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~' | b'*') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `brood agent` and brood's hidden test agent speak brood's protocol; any
/// other program is run as a plain `exec` one (as the CLI's `auto` does).
fn protocol_for(argv: &[String], brood: &str) -> &'static str {
    let prog = argv.first().map(String::as_str).unwrap_or_default();
    let is_brood = prog == brood || prog.rsplit('/').next() == Some("brood");
    let sub = argv.get(1).map(String::as_str);
    if is_brood && matches!(sub, Some("agent" | "test-agent")) {
        "brood"
    } else {
        "exec"
    }
}

impl<B: Backend> Tools<B> {
    pub(crate) async fn dispatch(
        &self,
        tool: &str,
        args: Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        match tool {
            "spawn" => self.spawn(parse(tool, args)?, ctx).await,
            "send" => {
                let p: params::Send = parse(tool, args)?;
                let path = format!("/api/agents/{}/input", seg("agent", &p.agent)?);
                let sent: brood_api::InputReply = self
                    .typed(ctx, "POST", &path, Some(json!({"text": p.text})))
                    .await?;
                out(&sent)
            }
            "wait" => self.wait(parse(tool, args)?, ctx).await,
            "cancel" | "close" => {
                let p: params::Agent = parse(tool, args)?;
                let path = format!("/api/agents/{}/{tool}", seg("agent", &p.agent)?);
                let a: Agent = self.typed(ctx, "POST", &path, Some(json!({}))).await?;
                out(&a)
            }
            "resume" => {
                let p: params::Resume = parse(tool, args)?;
                let path = format!("/api/agents/{}/resume", seg("agent", &p.agent)?);
                let body = match p.text {
                    Some(t) => json!({ "text": t }),
                    None => json!({}),
                };
                let a: Agent = self.typed(ctx, "POST", &path, Some(body)).await?;
                out(&a)
            }
            "list" => {
                let p: params::List = parse(tool, args)?;
                let parent = match p.parent {
                    Some(p) => Some(p),
                    None => self.owner(ctx).await?.map(|o| o.name),
                };
                let mut path = format!("/api/agents?all={}", p.all.unwrap_or(false));
                if let Some(p) = parent {
                    path.push_str(&format!("&parent={}", seg("agent", &p)?));
                }
                let l: AgentList = self.typed(ctx, "GET", &path, None).await?;
                out(&l)
            }
            "tree" => {
                let p: params::Tree = parse(tool, args)?;
                let root = match p.root {
                    Some(r) => Some(r),
                    None => self.owner(ctx).await?.map(|o| o.name),
                };
                let path = match root {
                    Some(r) => format!("/api/tree?root={}", seg("agent", &r)?),
                    None => "/api/tree".to_owned(),
                };
                let t: brood_api::Trees = self.typed(ctx, "GET", &path, None).await?;
                out(&t)
            }
            "show" => self.show(parse(tool, args)?, ctx).await,
            "events" => self.events(parse(tool, args)?, ctx).await,
            "job_create" => self.job_create(parse(tool, args)?, ctx).await,
            "job_start" | "job_cancel" => {
                let p: params::Job = parse(tool, args)?;
                let verb = tool.trim_start_matches("job_");
                let path = format!("/api/jobs/{}/{verb}", seg("job", &p.id)?);
                let job: JobView = self.typed(ctx, "POST", &path, Some(json!({}))).await?;
                out(&job)
            }
            "job_show" => {
                let p: params::JobShow = parse(tool, args)?;
                let Some(id) = p.id else {
                    let jobs: brood_api::JobList =
                        self.typed(ctx, "GET", "/api/jobs", None).await?;
                    return out(&jobs);
                };
                let id = seg("job", &id)?;
                let job: JobView = self
                    .typed(ctx, "GET", &format!("/api/jobs/{id}"), None)
                    .await?;
                if !p.items.unwrap_or(false) && p.status.is_none() {
                    return Ok(json!({ "job": job }));
                }
                let mut path = format!("/api/jobs/{id}/items");
                if let Some(s) = p.status {
                    path.push_str(&format!("?status={}", q(&s)));
                }
                let items: brood_api::ItemList = self.typed(ctx, "GET", &path, None).await?;
                Ok(json!({"job": job, "items": items.items}))
            }
            "job_export" => {
                let p: params::JobExport = parse(tool, args)?;
                let format = p.format.unwrap_or_else(|| "jsonl".to_owned());
                if !matches!(format.as_str(), "jsonl" | "csv") {
                    return Err(ToolError::new(
                        "BadRequest",
                        format!("job_export: format must be jsonl or csv, not {format:?}"),
                    ));
                }
                let path = format!("/api/jobs/{}/export?format={format}", seg("job", &p.id)?);
                let body = self.api(ctx, "GET", &path, None).await?;
                // One item is a JSON object, parsed whole; more are JSON lines.
                let text = match body {
                    Value::String(t) => t,
                    Value::Null => String::new(),
                    v => v.to_string(),
                };
                if format == "csv" {
                    return Ok(json!({"format": format, "text": text}));
                }
                let items: Vec<Value> = text
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                Ok(json!({"format": format, "items": items}))
            }
            "job_replay" => {
                let p: params::JobReplay = parse(tool, args)?;
                let path = format!("/api/jobs/{}/replay", seg("job", &p.id)?);
                let mut body = json!({});
                if let Some(n) = p.new_id {
                    body["id"] = json!(n);
                }
                if let Some(f) = p.failed_only {
                    body["failed_only"] = json!(f);
                }
                if let Some(s) = p.start {
                    body["start"] = json!(s);
                }
                let job: JobView = self.typed(ctx, "POST", &path, Some(body)).await?;
                out(&job)
            }
            "job_retry" => {
                let p: params::JobRetry = parse(tool, args)?;
                let id = seg("job", &p.id)?;
                let path = match p.item {
                    Some(i) => format!("/api/jobs/{id}/items/{}/retry", seg("item", &i)?),
                    None => format!("/api/jobs/{id}/retry"),
                };
                let r: brood_api::RetryReply =
                    self.typed(ctx, "POST", &path, Some(json!({}))).await?;
                out(&r)
            }
            other => Err(ToolError::new(
                "NotFound",
                format!("no tool named {other:?}"),
            )),
        }
    }

    async fn owner(&self, ctx: &RequestContext<RoleServer>) -> Result<Option<Owner>, ToolError> {
        self.backend.owner(ctx).await
    }

    /// One API call; an error answer becomes a [`ToolError`] with its code.
    pub(crate) async fn api(
        &self,
        ctx: &RequestContext<RoleServer>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ToolError> {
        let a = self
            .backend
            .call(ctx, method, path, body)
            .await
            .map_err(|e| ToolError::new("Unavailable", e))?;
        if (200..300).contains(&a.status) {
            return Ok(a.body);
        }
        Err(match serde_json::from_value::<ErrorBody>(a.body.clone()) {
            Ok(e) => ToolError::new(&e.error.code, e.error.message),
            Err(_) => ToolError::new("Internal", format!("HTTP {}: {}", a.status, a.body)),
        })
    }

    /// [`Self::api`] for a JSON answer, read into its `brood_api` type `T`.
    async fn typed<T: DeserializeOwned>(
        &self,
        ctx: &RequestContext<RoleServer>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, ToolError> {
        let v = self.api(ctx, method, path, body).await?;
        serde_json::from_value(v).map_err(|e| {
            ToolError::new(
                "Internal",
                format!("{method} {path}: the answer is not what the API documents: {e}"),
            )
        })
    }

    async fn spawn(
        &self,
        p: params::Spawn,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        let (argv, protocol) = match p.argv {
            Some(argv) => {
                if argv.is_empty() {
                    return Err(ToolError::new("BadRequest", "spawn: argv is empty"));
                }
                if p.kind.is_some() || p.model.is_some() {
                    return Err(ToolError::new(
                        "BadRequest",
                        "spawn: `type` and `model` are for `brood agent`; give them or `argv`, not both",
                    ));
                }
                let proto = match p.protocol.as_deref() {
                    Some(x @ ("brood" | "exec")) => x,
                    Some(x) => {
                        return Err(ToolError::new(
                            "BadRequest",
                            format!("spawn: protocol must be brood or exec, not {x:?}"),
                        ));
                    }
                    None => protocol_for(&argv, &self.brood),
                };
                (argv, proto)
            }
            None => {
                let mut argv = vec![self.brood.clone(), "agent".to_owned()];
                argv.extend(self.agent_args.iter().cloned());
                if let Some(t) = p.kind {
                    argv.extend(["--type".to_owned(), t]);
                }
                if let Some(m) = p.model {
                    argv.extend(["--model".to_owned(), m]);
                }
                (argv, "brood")
            }
        };
        let mut body = json!({"argv": argv, "protocol": protocol, "task": p.task});
        let parent = match p.parent {
            Some(parent) => Some(parent),
            None => self
                .owner(ctx)
                .await?
                .filter(|o| o.as_parent)
                .map(|o| o.name),
        };
        for (k, v) in [
            ("parent", parent),
            ("customer", p.customer),
            ("name", p.name),
        ] {
            if let Some(v) = v {
                body[k] = json!(v);
            }
        }
        if let Some(c) = p.capabilities {
            body["policy"] = Value::Object(c);
        }
        let a: Agent = self.typed(ctx, "POST", "/api/agents", Some(body)).await?;
        out(&a)
    }

    async fn wait(
        &self,
        p: params::Wait,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        let t = p.timeout_s.unwrap_or(WAIT_DEFAULT_S);
        if !(t.is_finite() && t >= 0.0) {
            return Err(ToolError::new(
                "BadRequest",
                format!("wait: timeout_s must be a non-negative number of seconds, not {t}"),
            ));
        }
        let deadline = Instant::now() + Duration::from_secs_f64(t.min(WAIT_MAX_S));
        let owner = self.owner(ctx).await?;
        let names: Vec<String> = match p.agents {
            Some(v) if !v.is_empty() => v,
            _ => {
                let path = match &owner {
                    Some(o) => format!("/api/agents?parent={}", seg("agent", &o.name)?),
                    None => "/api/agents".to_owned(),
                };
                let l: AgentList = self.typed(ctx, "GET", &path, None).await?;
                l.agents.into_iter().map(|a| a.name).collect()
            }
        };
        let mut agents = Vec::new();
        let mut timed_out = false;
        for n in &names {
            // Once the time ran out, the rest are only looked at (a wait of 0).
            let left = deadline.saturating_duration_since(Instant::now());
            let path = format!("/api/agents/{}/wait", seg("agent", n)?);
            let w: brood_api::WaitReply = self
                .typed(
                    ctx,
                    "POST",
                    &path,
                    Some(json!({"timeout_s": left.as_secs_f64()})),
                )
                .await?;
            timed_out |= w.timed_out;
            agents.extend(w.agents);
        }
        // What is still running: the session's whole subtree when it has
        // one, else what was waited for.
        let still_running = match &owner {
            Some(o) => {
                let path = format!("/api/agents/{}/descendants", seg("agent", &o.name)?);
                let d: AgentList = self.typed(ctx, "GET", &path, None).await?;
                live_names(&d.agents)
            }
            None => {
                // What was waited for, and below it.
                let mut live = live_names(&agents);
                for n in live.clone() {
                    let path = format!("/api/agents/{}/descendants", seg("agent", &n)?);
                    let d: AgentList = self.typed(ctx, "GET", &path, None).await?;
                    live.extend(live_names(&d.agents));
                }
                live
            }
        };
        Ok(json!({"agents": agents, "timed_out": timed_out, "still_running": still_running}))
    }

    pub(crate) async fn show(
        &self,
        p: params::Agent,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        let name = seg("agent", &p.agent)?;
        let detail: brood_api::AgentDetail = self
            .typed(ctx, "GET", &format!("/api/agents/{name}"), None)
            .await?;
        let parent = detail.agent.parent.clone();
        let mut v = out(&detail)?;
        v["refs"] = match (&self.home, parent) {
            (Some(home), Some(parent)) => {
                // The parent's channel to it, in the ctx tree (SPEC 4); a
                // child handed back refs only with a result.
                let f = home
                    .join("agent")
                    .join(seg("agent", &parent)?)
                    .join("session/default/context/child")
                    .join(name)
                    .join("refs.jsonl");
                let text = std::fs::read_to_string(f).unwrap_or_default();
                Value::Array(
                    text.lines()
                        .filter_map(|l| serde_json::from_str(l).ok())
                        .collect(),
                )
            }
            _ => json!([]),
        };
        Ok(v)
    }

    async fn events(
        &self,
        p: params::Events,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        let limit = p.limit.unwrap_or(100).clamp(1, 1000);
        let mut path = "/api/events?follow=false".to_owned();
        let subtree = match p.agent {
            Some(a) => Some(a),
            None => self.owner(ctx).await?.map(|o| o.name),
        };
        if let Some(s) = subtree {
            path.push_str(&format!("&subtree={}", seg("agent", &s)?));
        }
        if let Some(a) = p.after {
            path.push_str(&format!("&after={a}"));
        }
        if let Some(t) = p.types {
            path.push_str(&format!("&type={}", q(&t)));
        }
        let text = self.api(ctx, "GET", &path, None).await?;
        let text = text.as_str().unwrap_or_default();
        // An event stream: each event's data is a `brood_api::Event`; what
        // is not one (a `resync` says only that the stream fell behind) is
        // left out.
        let mut events: Vec<brood_api::Event> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim_start()).ok())
            .collect();
        events.truncate(limit);
        let next_after = events.last().map(|e| e.sequence);
        Ok(json!({"events": events, "next_after": next_after}))
    }

    async fn job_create(
        &self,
        p: params::JobCreate,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Value, ToolError> {
        let owner = match p.owner {
            Some(o) => Some(o),
            None => self
                .owner(ctx)
                .await?
                .filter(|o| o.as_parent)
                .map(|o| o.name),
        };
        let mut body = json!({"instruction": p.instruction, "input": p.input});
        for (k, v) in [
            ("owner", owner.map(Value::from)),
            ("id", p.id.map(Value::from)),
            ("input_format", p.input_format.map(Value::from)),
            ("id_column", p.id_column.map(Value::from)),
            ("output_schema", p.output_schema.map(Value::Object)),
            ("worker", p.worker.map(Value::Object)),
            ("concurrency", p.concurrency.map(Value::from)),
            ("max_attempts", p.max_attempts.map(Value::from)),
            ("item_timeout_s", p.item_timeout_s.map(Value::from)),
            ("max_runtime_s", p.max_runtime_s.map(Value::from)),
        ] {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        let job: JobView = self.typed(ctx, "POST", "/api/jobs", Some(body)).await?;
        if !p.start.unwrap_or(false) {
            return out(&job);
        }
        let path = format!("/api/jobs/{}/start", seg("job", &job.id)?);
        let started: JobView = self.typed(ctx, "POST", &path, Some(json!({}))).await?;
        out(&started)
    }
}

fn live_names(agents: &[Agent]) -> Vec<String> {
    agents
        .iter()
        .filter(|a| !FINISHED.contains(&a.status.as_str()))
        .map(|a| a.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_cannot_reach_another_route() {
        assert!(seg("agent", "a-1.b+c_d").is_ok());
        for bad in ["a/cancel", "..", "a?x", "", "a b", "a%2F"] {
            assert_eq!(seg("agent", bad).unwrap_err().code, "NotFound", "{bad}");
        }
        assert_eq!(q("agent.stop,agent.child.*"), "agent.stop%2Cagent.child.*");
    }

    #[test]
    fn programs_other_than_brood_agents_run_as_exec() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            protocol_for(&v(&["/x/brood", "agent"]), "/y/brood"),
            "brood"
        );
        assert_eq!(
            protocol_for(&v(&["/y/brood", "test-agent"]), "/y/brood"),
            "brood"
        );
        assert_eq!(protocol_for(&v(&["sh", "-c", "echo"]), "/y/brood"), "exec");
    }
}
