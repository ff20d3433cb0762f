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
//!
//! Beside the object, `agent/<name>` is its shim ([`shim`]): an executable
//! script that runs `brood shim <name>` on the agent's socket (SPEC 3, 8).

use std::path::{Path, PathBuf};

use brood_core::AgentName;
use brood_core::policy::Policy;
use brood_store::Agent;
use serde_json::Value;

use crate::paths::Paths;
use crate::projection::Projection;

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
        ("policy", policy_text(policy)),
    ]
}

/// The `policy` control file, which is also the agent's `$BROOD_POLICY`:
/// the policy as every surface shows it, `env` values hidden (issue 25). The
/// agent has its values in its environment; the file is `0644`, readable
/// by the tree's owner and by whatever reads the ctx tree later.
pub fn policy_text(policy: &Policy) -> String {
    format!("{:#}\n", brood_proto::policy::shown(policy))
}

/// The program a shim runs: `<bin_dir>/brood` when the supervisor knows where
/// its binary is (`Config::bin_dir`), else `brood` from `PATH`. The live
/// projection and `rebuild` both call this, so they write the same shim.
pub fn shim_program(bin_dir: Option<&Path>) -> String {
    match bin_dir {
        Some(d) => d.join("brood").to_string_lossy().into_owned(),
        None => "brood".to_owned(),
    }
}

/// The agent's shim, `ctx/agent/<name>` (SPEC 3: "running it sends its
/// arguments to the agent as input"), written with mode 0755. It execs
/// `brood --root <root> shim <name> -- "$@"`, which talks to the per-agent
/// socket (SPEC 8). Rendered from the root, the binary and the name alone.
pub fn shim(root: &Path, program: &str, name: &AgentName) -> String {
    format!(
        "#!/bin/sh\n# brood: sends its arguments to agent {name} as input, through {name}.sock (SPEC 3, 8).\nexec {} --root {} shim {} -- \"$@\"\n",
        sh_quote(program),
        sh_quote(&root.to_string_lossy()),
        sh_quote(name.as_str()),
    )
}

/// One word for `sh`: single-quoted, a `'` written as `'\''`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The agent's `meta.json`: its record's facts, plus what its newest run's
/// `agent.start` event recorded of its containment and sandbox (what was
/// enforced), so a rebuild from the store writes the same object.
pub fn agent_meta(a: &Agent, start: Option<&Value>) -> String {
    let mut m = serde_json::Map::new();
    m.insert("supervisor".into(), a.supervisor.clone().into());
    m.insert("protocol".into(), a.protocol.as_str().into());
    m.insert("created_ms".into(), a.created_ms.into());
    if let Some(p) = start {
        for k in ["containment", "sandbox"] {
            if let Some(v) = p.get(k) {
                m.insert(k.into(), v.clone());
            }
        }
    }
    format!("{}\n", Value::Object(m))
}

/// SPEC 3 `life temp`: once its run ended the object is gone (its record,
/// session and the parent's channel stay). The spec is stored as compact JSON,
/// so a substring test answers without parsing it on every status change.
pub fn object_removed(a: &Agent) -> bool {
    a.status.is_finished() && a.spec.contains("\"life\":\"temp\"")
}

/// The `latest.md` rule: the newest message the agent itself sent (input sent
/// to it, role `user`, does not count).
pub fn is_agent_message(role: &str) -> bool {
    role != "user"
}

/// One line of a session's `messages.jsonl`: exactly what the store keeps of a
/// message, so the file can always be rebuilt.
pub fn message_line(m: &brood_store::Message) -> String {
    format!(
        "{}\n",
        serde_json::json!({"seq": m.seq, "ts": m.ts_ms, "run": m.run.as_str(), "role": m.role, "content": m.content})
    )
}

/// The effective policy recorded in an agent's spec at admission (complete, so
/// the operator's policy fills nothing in practice).
pub fn policy_of(spec: &Value, operator: &Policy) -> Result<Policy, String> {
    let v = spec
        .get("policy")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    let req = brood_proto::policy::from_value(&v).map_err(|e| e.to_string())?;
    Ok(brood_core::policy::effective(operator, &req))
}

/// A channel's `result.md` (SPEC 4: never a NUL byte).
pub fn result_text(r: &str) -> String {
    r.replace('\0', "")
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

/// Writes an agent's status into its control files, session `state` and its
/// parent's channel `status`: the one place the ABI mapping reaches the disk.
pub(crate) fn project_agent(proj: &Projection, paths: &Paths, a: &Agent, pid: Option<i32>) {
    // A finished temp agent's object is gone (or going): only its session.
    for (path, text) in status_files(paths, a, pid, !object_removed(a)) {
        proj.write(path, text);
    }
}

/// The files that follow an agent's status: `status` and `pid` in its object
/// (when `object`), `state` and `updated_at` in its session.
pub(crate) fn status_files(
    paths: &Paths,
    a: &Agent,
    pid: Option<i32>,
    object: bool,
) -> Vec<(PathBuf, String)> {
    let abi = a.status.abi();
    let mut v = Vec::with_capacity(4);
    if object {
        let dir = paths.agent_dir(&a.name);
        v.push((dir.join("status"), format!("{}\n", abi.process.as_str())));
        v.push((
            dir.join("pid"),
            match pid {
                Some(p) if a.status.is_live() => format!("{p}\n"),
                _ => "\n".to_owned(),
            },
        ));
    }
    let sdir = paths.session_dir(&a.name, &a.session);
    v.push((sdir.join("state"), format!("{}\n", abi.session.as_str())));
    v.push((sdir.join("updated_at"), format!("{}\n", a.updated_ms)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_quotes_every_word_for_sh() {
        let name = AgentName::new("c1").unwrap();
        let text = shim(Path::new("/tmp/it's here"), "/opt/b r/brood", &name);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("#!/bin/sh"));
        assert_eq!(
            text.lines().last(),
            Some(r#"exec '/opt/b r/brood' --root '/tmp/it'\''s here' shim 'c1' -- "$@""#)
        );
        assert!(text.ends_with('\n'));
        assert_eq!(shim_program(None), "brood");
        assert_eq!(shim_program(Some(Path::new("/x/bin"))), "/x/bin/brood");
    }
}
