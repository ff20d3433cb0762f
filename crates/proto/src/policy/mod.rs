//! Policies (SPEC 5) as people and programs write them: JSON, or TOML in files.
//!
//! Reading turns a document into a [`PolicyRequest`] (the fields it gives; the
//! rest is inherited, see [`brood_core::policy::effective`]); writing turns an
//! effective [`Policy`] into JSON for `brood show` and the agent's policy file.
//! The conversion is written by hand against `serde_json::Value` (serde reads
//! the raw document only; brood-core's types know nothing of serde), so every
//! refusal can name the exact field path (`files[1].mode`,
//! `resources.memory_max`, `mounts[0].source`) and the value that was wrong.
//!
//! # Fields
//!
//! | field | JSON / TOML shape |
//! | --- | --- |
//! | `tools`, `models` | array of names |
//! | `files` | array of `{path, mode}`, `mode` one of `rw ro hidden` |
//! | `mounts` | array of SPEC 3 lines (`"src\tdst\tro\tbind,nosuid"`) or of `{source, target, mode: "ro"\|"rw", options: [..]}` (`options` may be left out) |
//! | `network` | `"none"`, `"all"` or `{"connect": [ports]}` |
//! | `cost_limit` | dollars, a number ≥ 0 |
//! | `window`, `timeout_s` | whole numbers ≥ 1 |
//! | `depth_limit`, `create_limit`, `uid`, `gid` | whole numbers (32 bits) |
//! | `resources` | `{memory_max, pids_max, cpu_weight, disk_max}`, each optional; `memory_max` and `disk_max` are bytes or a string of digits with `K`, `M`, `G` or `T` (powers of 1024, as cgroups read them) |
//! | `model_rate` | `{requests_per_minute, tokens_per_minute}`, each optional, whole numbers ≥ 1 (issue 31: the agent's model calls a minute through the gateway) |
//! | `groups` | array of group ids |
//! | `env` | object of string values |
//! | `secrets` | array of variable names (their values are never in a policy: issue 25) |
//! | `path` | `"a:b:c"` or an array of tiers |
//! | `rules` | array of `allow <subject> <class>:<name> <perm>` strings |
//! | `on_restart` | `"cancel"` (the default) or `"resume"` (issue 29) |
//!
//! An unknown field is refused (a misspelt `tols` must not silently grant every
//! tool by inheritance). A field whose value is `null` counts as left out.
//! A whole number written as a float (`10.0`) is refused: counts are counts.
//!
//! # Writing
//!
//! [`to_json`] writes every field of a policy except those that are `None`
//! (unlimited, or an unknown window), which are left out; `on_restart` is
//! always written, so a shown policy says what a restart does. Read back and derived
//! from a parent holding the same or no limits in those fields (an operator, or
//! the policy itself), it gives the same policy.
//!
//! # Showing
//!
//! [`shown`] is what every surface shows (the API, `brood show`, the UI, the
//! agent's policy file): [`to_json`] with each `env` value replaced by
//! `null`, since a value there is often a credential (issue 25). Reading a
//! shown policy back refuses the `null`s, naming the variable, rather than
//! passing a wrong value. [`hide_env`] does the same to a policy document
//! already in JSON (a stored spec's).

use brood_core::policy::{Network, Policy, PolicyError, PolicyRequest};
use serde_json::{Map, Number, Value};

mod read;
use read::*;

/// The field name used for errors about the document as a whole.
const DOCUMENT: &str = "(document)";

const FIELDS: &str = "tools files mounts network cost_limit window depth_limit create_limit \
                      timeout_s resources model_rate uid gid groups env secrets models path \
                      rules on_restart";

/// Reads a JSON policy.
pub fn parse_json(text: &str) -> Result<PolicyRequest, PolicyError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| PolicyError::new(DOCUMENT, format!("not JSON: {e}")))?;
    from_value(&v)
}

/// Reads a TOML policy (a policy file).
pub fn parse_toml(text: &str) -> Result<PolicyRequest, PolicyError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let at = match e.span() {
            Some(span) => {
                let line = text
                    .get(..span.start)
                    .map_or(0, |s| s.matches('\n').count())
                    + 1;
                format!(" (line {line})")
            }
            None => String::new(),
        };
        PolicyError::new(
            DOCUMENT,
            format!("not TOML: {}{at}", e.message().trim_end()),
        )
    })?;
    let mut obj = Map::new();
    for (k, v) in &table {
        obj.insert(k.clone(), toml_to_json(k, v)?);
    }
    from_value(&Value::Object(obj))
}

/// TOML has values JSON does not (dates, non-finite floats); none of them is a
/// value of any policy field, so they are refused here, naming the field.
fn toml_to_json(field: &str, v: &toml::Value) -> Result<Value, PolicyError> {
    Ok(match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::Number((*i).into()),
        toml::Value::Float(f) => match Number::from_f64(*f) {
            Some(n) => Value::Number(n),
            None => {
                return Err(PolicyError::new(
                    field,
                    format!("{f}: must be a finite number"),
                ));
            }
        },
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => {
            return Err(PolicyError::new(
                field,
                format!("{d}: a date is not a value of any policy field"),
            ));
        }
        toml::Value::Array(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| toml_to_json(&format!("{field}[{i}]"), x))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(t) => {
            let mut obj = Map::new();
            for (k, x) in t {
                obj.insert(k.clone(), toml_to_json(&format!("{field}.{k}"), x)?);
            }
            Value::Object(obj)
        }
    })
}

/// Reads a number of bytes as a policy writes one (`resources.memory_max`,
/// `resources.disk_max`): a whole number, or digits with `K`, `M`, `G` or
/// `T` (powers of 1024). For the configuration file's defaults, so they are
/// written the way a policy writes them; `field` names the value in errors.
pub fn read_bytes(field: &str, v: &Value) -> Result<u64, PolicyError> {
    bytes(field, v)
}

/// Reads a policy already parsed as JSON (for example the `capabilities` of a
/// protocol `create` request). The result is normalised
/// ([`PolicyRequest::normalise`]).
pub fn from_value(v: &Value) -> Result<PolicyRequest, PolicyError> {
    let obj = object(DOCUMENT, v)?;
    let mut req = PolicyRequest::default();
    for (key, val) in obj {
        if val.is_null() {
            continue;
        }
        let f = key.as_str();
        match f {
            "tools" => req.tools = Some(words(f, val)?),
            "files" => req.files = Some(files(val)?),
            "mounts" => req.mounts = Some(mounts(val)?),
            "network" => req.network = Some(network(val)?),
            "cost_limit" => req.cost_limit = Some(dollars(f, val)?),
            "window" => req.window = Some(whole(f, val)?),
            "depth_limit" => req.depth_limit = Some(whole32(f, val)?),
            "create_limit" => req.create_limit = Some(whole32(f, val)?),
            "timeout_s" => req.timeout_s = Some(whole(f, val)?),
            "resources" => req.resources = resources(val)?,
            "model_rate" => req.model_rate = model_rate(val)?,
            "uid" => req.uid = Some(whole32(f, val)?),
            "gid" => req.gid = Some(whole32(f, val)?),
            "groups" => req.groups = Some(groups(val)?),
            "env" => req.env = Some(env(val)?),
            "secrets" => req.secrets = Some(secrets(val)?),
            "models" => req.models = Some(words(f, val)?),
            "path" => req.path = Some(path(val)?),
            "rules" => req.rules = Some(rules(val)?),
            "on_restart" => req.on_restart = Some(on_restart(val)?),
            _ => {
                return Err(PolicyError::new(
                    key.escape_debug().to_string(),
                    format!("not a policy field (the fields are {FIELDS})"),
                ));
            }
        }
    }
    req.normalise()
}

/// The policy as JSON, fields in SPEC 5's order (module docs, "Writing").
pub fn to_json(p: &Policy) -> Value {
    let strings = |xs: &mut dyn Iterator<Item = &String>| {
        Value::Array(xs.map(|s| Value::String(s.clone())).collect())
    };
    let mut m = Map::new();
    if let Some(tools) = &p.tools {
        m.insert("tools".into(), strings(&mut tools.iter()));
    }
    m.insert(
        "files".into(),
        Value::Array(
            p.files
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("path".into(), r.path.as_str().into());
                    o.insert("mode".into(), r.mode.as_str().into());
                    Value::Object(o)
                })
                .collect(),
        ),
    );
    m.insert(
        "mounts".into(),
        Value::Array(p.mounts.iter().map(|e| e.to_line().into()).collect()),
    );
    m.insert(
        "network".into(),
        match &p.network {
            Network::None => "none".into(),
            Network::All => "all".into(),
            Network::Connect(ports) => {
                let mut o = Map::new();
                o.insert(
                    "connect".into(),
                    Value::Array(ports.iter().map(|p| (*p).into()).collect()),
                );
                Value::Object(o)
            }
        },
    );
    if let Some(c) = p.cost_limit {
        // A normalised policy's limit is finite; a non-finite one (which JSON
        // cannot hold) is written as null rather than as a wrong number.
        m.insert(
            "cost_limit".into(),
            Number::from_f64(c).map_or(Value::Null, Value::Number),
        );
    }
    if let Some(w) = p.window {
        m.insert("window".into(), w.into());
    }
    if let Some(d) = p.depth_limit {
        m.insert("depth_limit".into(), d.into());
    }
    if let Some(c) = p.create_limit {
        m.insert("create_limit".into(), c.into());
    }
    if let Some(t) = p.timeout_s {
        m.insert("timeout_s".into(), t.into());
    }
    let mut r = Map::new();
    for (k, v) in [
        ("memory_max", p.resources.memory_max),
        ("pids_max", p.resources.pids_max),
        ("cpu_weight", p.resources.cpu_weight),
        ("disk_max", p.resources.disk_max),
    ] {
        if let Some(v) = v {
            r.insert(k.into(), v.into());
        }
    }
    if !r.is_empty() {
        m.insert("resources".into(), Value::Object(r));
    }
    let mut rate = Map::new();
    for (k, v) in [
        ("requests_per_minute", p.model_rate.requests_per_minute),
        ("tokens_per_minute", p.model_rate.tokens_per_minute),
    ] {
        if let Some(v) = v {
            rate.insert(k.into(), v.into());
        }
    }
    if !rate.is_empty() {
        m.insert("model_rate".into(), Value::Object(rate));
    }
    m.insert("uid".into(), p.uid.into());
    m.insert("gid".into(), p.gid.into());
    m.insert(
        "groups".into(),
        Value::Array(p.groups.iter().map(|g| (*g).into()).collect()),
    );
    m.insert(
        "env".into(),
        Value::Object(
            p.env
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        ),
    );
    m.insert("secrets".into(), strings(&mut p.secrets.iter()));
    if let Some(models) = &p.models {
        m.insert("models".into(), strings(&mut models.iter()));
    }
    m.insert("path".into(), strings(&mut p.path.iter()));
    m.insert(
        "rules".into(),
        Value::Array(p.rules.iter().map(|r| r.to_text().into()).collect()),
    );
    m.insert("on_restart".into(), p.on_restart.as_str().into());
    Value::Object(m)
}

/// The policy as every surface shows it (module docs, "Showing").
pub fn shown(p: &Policy) -> Value {
    let mut v = to_json(p);
    hide_env(&mut v);
    v
}

/// Replaces each value of a policy document's `env` with `null` (module
/// docs, "Showing"); anything else is left as it is.
pub fn hide_env(policy: &mut Value) {
    if let Some(env) = policy.get_mut("env").and_then(Value::as_object_mut) {
        for v in env.values_mut() {
            *v = Value::Null;
        }
    }
}

#[cfg(test)]
mod tests;
