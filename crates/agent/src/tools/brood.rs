//! `create`, `send`, `wait`, `close`, `resume`: carried out by the
//! supervisor as protocol requests, so attenuation, quotas and budgets hold
//! for them as for any request. A refusal comes back to the model as a tool
//! error naming its code, so it can ask for less.

use serde_json::{Map, Value, json};

use super::cap;
use crate::io::{Halt, Io};
use crate::settings::Settings;

/// SPEC 13's capabilities, and `env` and `secrets` (brood's additions): the
/// variables the child's policy passes, so a parent can keep a key from a
/// child that does not need it. Each is checked against the parent's at
/// admission.
const CAPABILITIES: [&str; 8] = [
    "tools",
    "cost_limit",
    "files",
    "network",
    "create_limit",
    "depth_limit",
    "env",
    "secrets",
];

pub fn run(name: &str, args: &Value, settings: &Settings, io: &mut Io) -> Result<String, Halt> {
    let (op, req) = match build(name, args, settings) {
        Ok(x) => x,
        Err(e) => return Ok(format!("error: {name}: {e}")),
    };
    Ok(match io.request(op, req)? {
        Ok(v) => cap(describe(name, &v)),
        Err(e) => format!(
            "error: {name} refused: {}: {} (ask for less, or another way)",
            e.code, e.message
        ),
    })
}

fn string(args: &Value, key: &str) -> Result<String, String> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("missing argument {key:?} (a string)"))
}

/// The request for the supervisor.
pub(super) fn build(
    name: &str,
    args: &Value,
    settings: &Settings,
) -> Result<(&'static str, Value), String> {
    Ok(match name {
        "create" => {
            let task = string(args, "task")?;
            let ty = args
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("general");
            if crate::settings::type_named(ty).is_none() {
                return Err(format!(
                    "unknown type {ty:?}; use explore, general, plan, code or research"
                ));
            }
            let mut policy = Map::new();
            if let Some(c) = args.get("capabilities").filter(|c| !c.is_null()) {
                let obj = c.as_object().ok_or("capabilities must be an object")?;
                for (k, v) in obj {
                    if !CAPABILITIES.contains(&k.as_str()) {
                        return Err(format!(
                            "unknown capability {k:?}; they are {}",
                            CAPABILITIES.join(", ")
                        ));
                    }
                    policy.insert(k.clone(), v.clone());
                }
            }
            let mut req = json!({
                "argv": child_argv(ty, settings),
                "protocol": "brood",
                "task": task,
                "policy": Value::Object(policy),
            });
            for k in ["customer", "name"] {
                if let Some(v) = args.get(k).and_then(Value::as_str) {
                    req[k] = json!(v);
                }
            }
            if let Some(p) = args.get("placement").filter(|p| !p.is_null()) {
                let labels = p
                    .as_object()
                    .filter(|o| o.values().all(Value::is_string))
                    .ok_or("placement must be an object of label names to values")?;
                req["placement"] = json!({"labels": labels});
            }
            ("spawn", req)
        }
        "send" => (
            "send",
            json!({"name": string(args, "name")?, "text": string(args, "text")?}),
        ),
        "wait" => {
            let names: Vec<String> = match args.get("names") {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|n| n.as_str().map(str::to_owned).ok_or("names must be strings"))
                    .collect::<Result<_, _>>()?,
                Some(Value::String(s)) => vec![s.clone()],
                _ => match args.get("name").and_then(Value::as_str) {
                    Some(n) => vec![n.to_owned()],
                    None => {
                        return Err("missing argument \"names\" (the children to wait for)".into());
                    }
                },
            };
            let mut req = json!({"names": names});
            if let Some(t) = args.get("timeout_s").filter(|t| !t.is_null()) {
                req["timeout_s"] = t.clone();
            }
            ("wait", req)
        }
        "close" => ("close", json!({"name": string(args, "name")?})),
        "resume" => {
            let mut req = json!({"name": string(args, "name")?});
            if let Some(t) = args.get("text").and_then(Value::as_str) {
                req["text"] = json!(t);
            }
            ("resume", req)
        }
        other => return Err(format!("no such tool {other:?}")),
    })
}

/// The child: another `brood agent` of type `ty`, reaching the same model
/// unless its type's settings say otherwise (SPEC 13's precedence, decided
/// again in the child).
fn child_argv(ty: &str, s: &Settings) -> Vec<String> {
    let exe = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "brood".into());
    let mut argv = vec![exe, "agent".into(), "--type".into(), ty.into()];
    let r = &s.request;
    let mut flag = |f: &str, v: Option<String>| {
        if let Some(v) = v {
            argv.push(f.into());
            argv.push(v);
        }
    };
    flag("--provider", r.provider.clone());
    flag("--model", r.model.clone());
    flag("--base-url", r.base_url.clone());
    flag("--key-env", r.key_env.clone());
    // A relative path was given from this agent's working directory; the
    // child starts elsewhere (brood starts an agent's children at `/`), so it
    // gets the path made absolute here.
    let path = |p: &std::path::PathBuf| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.clone())
            .to_string_lossy()
            .into_owned()
    };
    flag("--script", r.script.as_ref().map(path));
    flag("--config", s.config_file.as_ref().map(path));
    argv
}

/// What the model reads back.
fn describe(name: &str, v: &Value) -> String {
    let line = |a: &Value| {
        let mut s = format!(
            "{}: {}",
            a["name"].as_str().unwrap_or("?"),
            a["status"].as_str().unwrap_or("?")
        );
        if let Some(r) = a["reason"].as_str() {
            s.push_str(&format!(" ({r})"));
        }
        if let Some(r) = a["result"].as_str() {
            s.push_str(&format!("\nresult:\n{r}"));
        }
        s
    };
    match name {
        "create" => format!(
            "created {} ({}); wait for it to get its result",
            v["name"].as_str().unwrap_or("?"),
            v["status"].as_str().unwrap_or("?")
        ),
        "send" => format!("sent ({})", v["id"].as_str().unwrap_or("?")),
        "wait" => {
            let mut out: Vec<String> = v["agents"]
                .as_array()
                .into_iter()
                .flatten()
                .map(line)
                .collect();
            if v["timed_out"] == true {
                out.push("(the time ran out before every one finished)".into());
            }
            out.join("\n\n")
        }
        _ => line(v),
    }
}
