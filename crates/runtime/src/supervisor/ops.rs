//! The verbs by name (SPEC 11): the child protocol's `request` ops and the
//! control socket's requests both land in [`handle`], so an agent and a
//! person get exactly the same behaviour and the same error codes.

use std::time::Duration;

use brood_core::{AgentName, Code};
use serde_json::{Value, json};

use super::{Supervisor, now_ms, to_json};
use crate::api::{ApiError, Caller, SpawnRequest, bad};

fn name_arg(args: &Value, key: &str) -> Result<AgentName, ApiError> {
    let s = args
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("missing string argument {key:?}")))?;
    AgentName::new(s).map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))
}

fn str_arg(args: &Value, key: &str) -> Result<String, ApiError> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| bad(format!("missing string argument {key:?}")))
}

fn opt_name_arg(args: &Value, key: &str) -> Result<Option<AgentName>, ApiError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => AgentName::new(s)
            .map(Some)
            .map_err(|e| ApiError::new(Code::InvalidName, e.to_string())),
        Some(_) => Err(bad(format!("argument {key:?} must be a string"))),
    }
}

fn names_arg(args: &Value) -> Result<Vec<AgentName>, ApiError> {
    if let Some(Value::Array(a)) = args.get("names") {
        a.iter()
            .map(|v| {
                let s = v.as_str().ok_or_else(|| bad("names must be strings"))?;
                AgentName::new(s).map_err(|e| ApiError::new(Code::InvalidName, e.to_string()))
            })
            .collect()
    } else {
        Ok(vec![name_arg(args, "name")?])
    }
}

/// `f` on a blocking thread: work that reads or writes much (a job's items)
/// holds no async thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "a blocking task did not finish");
        Err(ApiError::new(
            Code::Internal,
            "the request failed (see the supervisor's log)",
        ))
    })
}

/// Serves one verb. `op` names are the protocol's (`spawn send wait close cancel
/// resume list`) plus the control socket's read verbs (`show tree events ping`).
/// A JSON surface: each answer is the verb's typed `brood_api` answer as JSON.
pub async fn handle(
    sup: &Supervisor,
    caller: &Caller,
    op: &str,
    args: &Value,
) -> Result<Value, ApiError> {
    match op {
        "spawn" => match SpawnRequest::from_json(args) {
            Ok(req) => sup.spawn(caller.clone(), req).await.map(|v| to_json(&v)),
            Err(e) => {
                let parent = match caller {
                    Caller::Agent(me) => Some(me.clone()),
                    Caller::User { .. } => args
                        .get("parent")
                        .and_then(Value::as_str)
                        .and_then(|p| AgentName::new(p).ok()),
                };
                let requested = args.get("name").and_then(Value::as_str).map(str::to_owned);
                sup.refused(parent, requested, e.clone());
                Err(e)
            }
        },
        "send" => {
            let name = name_arg(args, "name")?;
            let text = args
                .get("text")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("missing string argument \"text\""))?;
            sup.send(caller.clone(), name, text.to_owned())
                .await
                .map(|v| to_json(&v))
        }
        "wait" => {
            let names = names_arg(args)?;
            let timeout = match args.get("timeout_s") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    let s = v
                        .as_f64()
                        .filter(|s| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| bad("timeout_s must be a non-negative number"))?;
                    Some(Duration::from_secs_f64(s))
                }
            };
            let r = sup.wait(caller.clone(), names, timeout).await;
            // Whoever waited may read result.md next: let the files catch up first.
            sup.flush().await;
            r.map(|v| to_json(&v))
        }
        "cancel" => sup
            .cancel(caller.clone(), name_arg(args, "name")?)
            .await
            .map(|v| to_json(&v)),
        "close" => sup
            .close(caller.clone(), name_arg(args, "name")?)
            .await
            .map(|v| to_json(&v)),
        "resume" => {
            let text = args.get("text").and_then(Value::as_str).map(str::to_owned);
            sup.resume(caller.clone(), name_arg(args, "name")?, text)
                .await
                .map(|v| to_json(&v))
        }
        "list" => {
            let all = args.get("all").and_then(Value::as_bool).unwrap_or(false);
            let parent = match opt_name_arg(args, "parent")? {
                Some(p) => Some(p),
                None => match caller {
                    Caller::Agent(me) => Some(me.clone()),
                    Caller::User { .. } => None,
                },
            };
            sup.view().list(parent, all).map(|v| to_json(&v))
        }
        "show" => sup
            .view()
            .show(&name_arg(args, "name")?)
            .map(|v| to_json(&v)),
        "tree" => sup
            .view()
            .tree(opt_name_arg(args, "name")?.as_ref())
            .map(|v| to_json(&v)),
        "ping" => Ok(json!({"pong": true})),
        // SPEC 10's protocol ops: an agent creates its own jobs and reads them.
        "job.create" => {
            let body: brood_api::JobBody = brood_api::parse_value(args.clone()).map_err(bad)?;
            // The input read and every item written on a blocking thread
            // (issue 24), as over HTTP.
            let (sup, caller) = (sup.clone(), caller.clone());
            blocking(move || {
                let store = sup.store().as_ref();
                let job = crate::jobs::create_at(
                    store,
                    sup.tenant(),
                    &caller,
                    body,
                    now_ms(),
                    sup.intake(),
                )?;
                crate::jobs::view(store, &job).map(|v| to_json(&v))
            })
            .await
        }
        "job.get" => {
            let id = args
                .get("job")
                .or_else(|| args.get("id"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("missing string argument \"job\""))?;
            let store = sup.store().as_ref();
            let job = crate::jobs::get(store, sup.tenant(), caller, id)?;
            crate::jobs::view(store, &job).map(|v| to_json(&v))
        }
        "job.report" => sup
            .job_report(caller.clone(), args.clone())
            .await
            .map(|v| to_json(&v)),
        "job.start" => sup
            .job_start(caller.clone(), str_arg(args, "job")?)
            .await
            .map(|v| to_json(&v)),
        "job.cancel" => sup
            .job_cancel(caller.clone(), str_arg(args, "job")?)
            .await
            .map(|v| to_json(&v)),
        "job.assign" => {
            let worker = opt_name_arg(args, "worker")?;
            let (job, item) = (str_arg(args, "job")?, str_arg(args, "item")?);
            sup.job_assign(caller.clone(), job, item, worker)
                .await
                .map(|v| to_json(&v))
        }
        "job.retry" => {
            let item = args.get("item").and_then(Value::as_str).map(str::to_owned);
            sup.job_retry(caller.clone(), str_arg(args, "job")?, item)
                .await
                .map(|v| to_json(&v))
        }
        "job.list" => {
            let store = sup.store().as_ref();
            crate::jobs::list(store, sup.tenant(), caller).map(|v| to_json(&v))
        }
        "job.items" => {
            let store = sup.store().as_ref();
            let job = crate::jobs::get(store, sup.tenant(), caller, &str_arg(args, "job")?)?;
            let status = args.get("status").and_then(Value::as_str);
            crate::jobs::items(store, &job, status).map(|v| to_json(&v))
        }
        "job.export" => {
            let store = sup.store().as_ref();
            let job = crate::jobs::get(store, sup.tenant(), caller, &str_arg(args, "job")?)?;
            let format = args
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or("jsonl");
            crate::jobs::export_text(store, &job, format)
                .map(|text| json!({"format": format, "text": text}))
        }
        "job.replay" => {
            let id = str_arg(args, "job")?;
            let mut rest = args.clone();
            if let Some(m) = rest.as_object_mut() {
                m.remove("job");
            }
            let body: brood_api::ReplayBody = brood_api::parse_value(rest).map_err(bad)?;
            let job = {
                let (sup, caller, body) = (sup.clone(), caller.clone(), body.clone());
                blocking(move || {
                    crate::jobs::replay_at(
                        sup.store().as_ref(),
                        sup.tenant(),
                        &caller,
                        &id,
                        &body,
                        now_ms(),
                        sup.intake(),
                    )
                })
                .await?
            };
            if body.start == Some(true) {
                return sup
                    .job_start(caller.clone(), job.id)
                    .await
                    .map(|v| to_json(&v));
            }
            crate::jobs::view(sup.store().as_ref(), &job).map(|v| to_json(&v))
        }
        other if other.starts_with("job.") => Err(ApiError::new(
            Code::NotImplemented,
            format!("op {other:?}: running jobs is not available in this version of brood"),
        )),
        other => Err(bad(format!("unknown op {other:?}"))),
    }
}
