//! The static part of an agent object (SPEC 3 `agent/<name>.d/`): every control
//! file whose value is fixed when the agent is admitted, rendered from its record
//! alone (the launch spec stored with it, which holds its effective policy), so
//! the live projection and a rebuild from the store write the same bytes.
//!
//! Formats (one value and a newline; a list one item per line; an empty value is
//! just the newline):
//! - `parent`: `agent:<name>[ session:<s>][ run:<r>]`, empty for a root;
//! - `life`: `owned` or `temp`; `owner`: who asked for it, `user:<uid>` or
//!   `agent:<name>`; `label`: the requester's free text, empty when none;
//! - `uid`, `gid`: numbers; `groups`: one gid per line;
//! - `iso`: `none` or `ns`; `root`: the new `/` under `iso = ns`, else empty;
//!   `cwd`: the working directory asked for, else empty (the supervisor's);
//! - `env`: `KEY=VALUE` lines, no expansion; `path`: one tier per line;
//! - `mount`: `source<TAB>target<TAB>ro|rw<TAB>options` lines;
//! - `model`: the model it may use when its policy allows exactly one, else
//!   empty; `window`: its context window in tokens, empty when unknown;
//! - `policy`: the effective policy, pretty JSON.
//!
//! `status`, `pid`, `log` and `meta.json` change while it runs and are written
//! by the supervisor.

use brood_core::policy::Policy;
use brood_store::Agent;
use serde_json::Value;

fn line(s: impl AsRef<str>) -> String {
    format!("{}\n", s.as_ref())
}

fn lines<I: IntoIterator<Item = String>>(items: I) -> String {
    items.into_iter().map(|s| format!("{s}\n")).collect()
}

/// The `parent` line of SPEC 3.
pub fn parent_line(a: &Agent, spec: &Value) -> String {
    let Some(p) = &a.parent else {
        return "\n".to_owned();
    };
    let mut s = format!("agent:{p}");
    if let Some(ps) = spec["parent_session"].as_str() {
        s.push_str(&format!(" session:{ps}"));
    }
    if let Some(pr) = spec["parent_run"].as_str() {
        s.push_str(&format!(" run:{pr}"));
    }
    line(s)
}

/// Every static control file of `a`, as (file name, content).
pub fn control_files(a: &Agent, policy: &Policy, spec: &Value) -> Vec<(&'static str, String)> {
    let s = |k: &str| spec[k].as_str().unwrap_or("").to_owned();
    let model = match &policy.models {
        Some(m) if m.len() == 1 => m.iter().next().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    vec![
        ("parent", parent_line(a, spec)),
        ("life", line(spec["life"].as_str().unwrap_or("owned"))),
        ("owner", line(s("owner"))),
        ("label", line(s("label"))),
        ("uid", line(policy.uid.to_string())),
        ("gid", line(policy.gid.to_string())),
        ("groups", lines(policy.groups.iter().map(u32::to_string))),
        ("iso", line(spec["iso"].as_str().unwrap_or("none"))),
        ("root", line(s("root"))),
        ("cwd", line(s("cwd"))),
        (
            "env",
            lines(policy.env.iter().map(|(k, v)| format!("{k}={v}"))),
        ),
        ("path", lines(policy.path.iter().cloned())),
        ("mount", lines(policy.mounts.iter().map(|m| m.to_line()))),
        ("model", line(model)),
        (
            "window",
            line(policy.window.map(|w| w.to_string()).unwrap_or_default()),
        ),
        (
            "policy",
            format!("{:#}\n", brood_proto::policy::to_json(policy)),
        ),
    ]
}

/// The session's `meta.json` (SPEC 3): who it belongs to and where it came from.
pub fn session_meta(a: &Agent) -> String {
    format!(
        "{}\n",
        serde_json::json!({
            "agent": a.name.as_str(),
            "session": a.session.as_str(),
            "parent": a.parent.as_ref().map(|p| p.as_str()),
            "tenant": a.tenant.as_str(),
            "created_ms": a.created_ms,
        })
    )
}
