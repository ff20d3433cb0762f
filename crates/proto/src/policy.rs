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
//! | `resources` | `{memory_max, pids_max, cpu_weight}`, each optional; `memory_max` is bytes or a string of digits with `K`, `M`, `G` or `T` (powers of 1024, as cgroups read them) |
//! | `groups` | array of group ids |
//! | `env` | object of string values |
//! | `path` | `"a:b:c"` or an array of tiers |
//! | `rules` | array of `allow <subject> <class>:<name> <perm>` strings |
//!
//! An unknown field is refused (a misspelt `tols` must not silently grant every
//! tool by inheritance). A field whose value is `null` counts as left out.
//! A whole number written as a float (`10.0`) is refused: counts are counts.
//!
//! # Writing
//!
//! [`to_json`] writes every field of a policy except those that are `None`
//! (unlimited, or an unknown window), which are left out. Read back and derived
//! from a parent holding the same or no limits in those fields (an operator, or
//! the policy itself), it gives the same policy.

use std::collections::{BTreeMap, BTreeSet};

use brood_core::policy::{
    AbsPath, FileRule, Mode, MountEntry, MountOpts, Network, Policy, PolicyError, PolicyRequest,
    Resources, Rule,
};
use serde_json::{Map, Number, Value};

/// The field name used for errors about the document as a whole.
const DOCUMENT: &str = "(document)";

const FIELDS: &str = "tools files mounts network cost_limit window depth_limit create_limit \
                      timeout_s resources uid gid groups env models path rules";

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
            "uid" => req.uid = Some(whole32(f, val)?),
            "gid" => req.gid = Some(whole32(f, val)?),
            "groups" => req.groups = Some(groups(val)?),
            "env" => req.env = Some(env(val)?),
            "models" => req.models = Some(words(f, val)?),
            "path" => req.path = Some(path(val)?),
            "rules" => req.rules = Some(rules(val)?),
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
    ] {
        if let Some(v) = v {
            r.insert(k.into(), v.into());
        }
    }
    if !r.is_empty() {
        m.insert("resources".into(), Value::Object(r));
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
    if let Some(models) = &p.models {
        m.insert("models".into(), strings(&mut models.iter()));
    }
    m.insert("path".into(), strings(&mut p.path.iter()));
    m.insert(
        "rules".into(),
        Value::Array(p.rules.iter().map(|r| r.to_text().into()).collect()),
    );
    Value::Object(m)
}

/// How a JSON value's kind is named in errors.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(field: &str, want: &str, v: &Value) -> PolicyError {
    PolicyError::new(field, format!("{v}: must be {want}, not {}", kind(v)))
}

fn object<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, PolicyError> {
    v.as_object().ok_or_else(|| wrong(field, "an object", v))
}

fn array<'a>(field: &str, v: &'a Value) -> Result<&'a Vec<Value>, PolicyError> {
    v.as_array().ok_or_else(|| wrong(field, "an array", v))
}

fn string<'a>(field: &str, v: &'a Value) -> Result<&'a str, PolicyError> {
    v.as_str().ok_or_else(|| wrong(field, "a string", v))
}

/// Refuses keys of `obj` outside `known`, naming the first as `field.key`.
fn only_keys(field: &str, obj: &Map<String, Value>, known: &[&str]) -> Result<(), PolicyError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(PolicyError::new(
            format!("{field}.{}", k.escape_debug()),
            format!("not a field here (the fields are {})", known.join(" ")),
        )),
        None => Ok(()),
    }
}

fn required<'a>(
    field: &str,
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<&'a Value, PolicyError> {
    match obj.get(key) {
        Some(v) if !v.is_null() => Ok(v),
        _ => Err(PolicyError::new(format!("{field}.{key}"), "missing")),
    }
}

fn whole(field: &str, v: &Value) -> Result<u64, PolicyError> {
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(|| {
            PolicyError::new(field, format!("{n}: must be a whole number, at least 0"))
        }),
        _ => Err(wrong(field, "a whole number", v)),
    }
}

fn whole32(field: &str, v: &Value) -> Result<u32, PolicyError> {
    let n = whole(field, v)?;
    u32::try_from(n)
        .map_err(|_| PolicyError::new(field, format!("{n}: must be at most {}", u32::MAX)))
}

fn dollars(field: &str, v: &Value) -> Result<f64, PolicyError> {
    match v.as_f64() {
        Some(d) if d.is_finite() && d >= 0.0 => Ok(d),
        Some(d) => Err(PolicyError::new(
            field,
            format!("{d}: must be a number of dollars, at least 0"),
        )),
        None => Err(wrong(field, "a number of dollars", v)),
    }
}

fn words(field: &str, v: &Value) -> Result<BTreeSet<String>, PolicyError> {
    let mut out = BTreeSet::new();
    for (i, x) in array(field, v)?.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let s = string(&f, x)?;
        brood_core::policy::check_word(&f, s)?;
        out.insert(s.to_owned());
    }
    Ok(out)
}

fn files(v: &Value) -> Result<Vec<FileRule>, PolicyError> {
    let mut out = Vec::new();
    for (i, x) in array("files", v)?.iter().enumerate() {
        let f = format!("files[{i}]");
        let o = object(&f, x)?;
        only_keys(&f, o, &["path", "mode"])?;
        let path_field = format!("{f}.path");
        let path = AbsPath::new(&path_field, string(&path_field, required(&f, o, "path")?)?)?;
        let mode_field = format!("{f}.mode");
        let mode = Mode::parse(&mode_field, string(&mode_field, required(&f, o, "mode")?)?)?;
        out.push(FileRule { path, mode });
    }
    Ok(out)
}

fn mounts(v: &Value) -> Result<Vec<MountEntry>, PolicyError> {
    let mut out = Vec::new();
    for (i, x) in array("mounts", v)?.iter().enumerate() {
        let f = format!("mounts[{i}]");
        let entry = match x {
            Value::String(line) => MountEntry::parse_line(&f, line)?,
            Value::Object(o) => mount_object(&f, o)?,
            _ => return Err(wrong(&f, "a mount line or an object", x)),
        };
        out.push(entry);
    }
    Ok(out)
}

fn mount_object(f: &str, o: &Map<String, Value>) -> Result<MountEntry, PolicyError> {
    only_keys(f, o, &["source", "target", "mode", "options"])?;
    let source_field = format!("{f}.source");
    let source = AbsPath::new(
        &source_field,
        string(&source_field, required(f, o, "source")?)?,
    )?;
    let target_field = format!("{f}.target");
    let target = AbsPath::new(
        &target_field,
        string(&target_field, required(f, o, "target")?)?,
    )?;
    let mode_field = format!("{f}.mode");
    let rw = match string(&mode_field, required(f, o, "mode")?)? {
        "ro" => false,
        "rw" => true,
        other => {
            return Err(PolicyError::new(
                mode_field,
                format!("{other:?}: must be ro or rw"),
            ));
        }
    };
    let opts_field = format!("{f}.options");
    let opts = match o.get("options") {
        None | Some(Value::Null) => MountOpts::default(),
        Some(v) => {
            let words = array(&opts_field, v)?
                .iter()
                .enumerate()
                .map(|(j, w)| string(&format!("{opts_field}[{j}]"), w))
                .collect::<Result<Vec<_>, _>>()?;
            MountOpts::from_words(&opts_field, words)?
        }
    };
    Ok(MountEntry {
        source,
        target,
        rw,
        opts,
    })
}

fn network(v: &Value) -> Result<Network, PolicyError> {
    match v {
        Value::String(s) if s == "none" => Ok(Network::None),
        Value::String(s) if s == "all" => Ok(Network::All),
        Value::Object(o) => {
            only_keys("network", o, &["connect"])?;
            let ports = required("network", o, "connect")?;
            let mut out = BTreeSet::new();
            for (i, x) in array("network.connect", ports)?.iter().enumerate() {
                let f = format!("network.connect[{i}]");
                let n = whole(&f, x)?;
                match u16::try_from(n) {
                    Ok(port) if port != 0 => {
                        out.insert(port);
                    }
                    _ => {
                        return Err(PolicyError::new(
                            f,
                            format!("{n}: must be a port, 1 to 65535"),
                        ));
                    }
                }
            }
            Ok(Network::Connect(out))
        }
        _ => Err(PolicyError::new(
            "network",
            format!("{v}: must be \"none\", \"all\" or {{\"connect\": [ports]}}"),
        )),
    }
}

fn resources(v: &Value) -> Result<Resources, PolicyError> {
    let o = object("resources", v)?;
    only_keys("resources", o, &["memory_max", "pids_max", "cpu_weight"])?;
    let mut r = Resources::default();
    for (k, x) in o {
        if x.is_null() {
            continue;
        }
        let f = format!("resources.{k}");
        match k.as_str() {
            "memory_max" => r.memory_max = Some(bytes(&f, x)?),
            "pids_max" => r.pids_max = Some(whole(&f, x)?),
            _ => r.cpu_weight = Some(whole(&f, x)?),
        }
    }
    Ok(r)
}

/// Bytes as a number or as digits with a `K M G T` suffix (either case),
/// powers of 1024 as cgroups read them.
fn bytes(field: &str, v: &Value) -> Result<u64, PolicyError> {
    let Value::String(s) = v else {
        return whole(field, v);
    };
    let bad = || {
        PolicyError::new(
            field,
            format!(
                "{s:?}: must be a number of bytes, or digits with K, M, G or T (powers of 1024)"
            ),
        )
    };
    let (digits, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(bad()),
            };
            (&s[..i], shift)
        }
        _ => (s.as_str(), 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let too_large = || PolicyError::new(field, format!("{s:?}: too large"));
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    n.checked_mul(1u64 << shift).ok_or_else(too_large)
}

fn groups(v: &Value) -> Result<BTreeSet<u32>, PolicyError> {
    array("groups", v)?
        .iter()
        .enumerate()
        .map(|(i, x)| whole32(&format!("groups[{i}]"), x))
        .collect()
}

fn env(v: &Value) -> Result<BTreeMap<String, String>, PolicyError> {
    object("env", v)?
        .iter()
        .map(|(k, x)| {
            let f = format!("env.{}", k.escape_debug());
            // Values are not echoed: they are often secrets.
            match x {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(PolicyError::new(
                    f,
                    format!("must be a string, not {}", kind(x)),
                )),
            }
        })
        .collect()
}

fn path(v: &Value) -> Result<Vec<String>, PolicyError> {
    match v {
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        Value::String(s) => Ok(s.split(':').map(str::to_owned).collect()),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| string(&format!("path[{i}]"), x).map(str::to_owned))
            .collect(),
        _ => Err(wrong("path", "\"a:b:c\" or an array of tiers", v)),
    }
}

fn rules(v: &Value) -> Result<Vec<Rule>, PolicyError> {
    array("rules", v)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let f = format!("rules[{i}]");
            Rule::parse(&f, string(&f, x)?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use brood_core::policy::effective;

    fn ap(s: &str) -> AbsPath {
        AbsPath::new("test", s).unwrap()
    }

    fn names(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Every field, as the JSON test document gives it.
    fn expected() -> PolicyRequest {
        PolicyRequest {
            tools: Some(names(&["file_read", "shell"])),
            files: Some(vec![
                FileRule {
                    path: ap("/"),
                    mode: Mode::Ro,
                },
                FileRule {
                    path: ap("/secret"),
                    mode: Mode::Hidden,
                },
                FileRule {
                    path: ap("/work"),
                    mode: Mode::Rw,
                },
            ]),
            mounts: Some(vec![
                MountEntry::parse_line("m", "/src\t/dst\tro\tbind,nosuid").unwrap(),
                MountEntry::parse_line("m", "/home\t/home\trw\trbind,nodev,noexec").unwrap(),
                MountEntry::parse_line("m", "/tmp\t/tmp\trw\t-").unwrap(),
            ]),
            network: Some(Network::Connect([443, 80].into())),
            cost_limit: Some(2.5),
            window: Some(128_000),
            depth_limit: Some(2),
            create_limit: Some(4),
            timeout_s: Some(600),
            resources: Resources {
                memory_max: Some(256 << 20),
                pids_max: Some(64),
                cpu_weight: Some(50),
            },
            uid: Some(1000),
            gid: Some(1000),
            groups: Some([27, 1000].into()),
            env: Some(
                [("LANG", "C.UTF-8"), ("TOKEN", "x=y")]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
            models: Some(names(&["gpt-x", "local"])),
            path: Some(vec!["proj".into(), "user".into(), "sys".into()]),
            rules: Some(vec![
                Rule::parse("r", "allow agent:rev shared:notes read").unwrap(),
                Rule::parse("r", "allow self tool:shell use").unwrap(),
            ]),
        }
    }

    const JSON: &str = r#"{
        "tools": ["shell", "file_read"],
        "files": [{"path": "/work/", "mode": "rw"}, {"path": "/", "mode": "ro"},
                  {"path": "//secret", "mode": "hidden"}],
        "mounts": ["/src\t/dst\tro\tbind,nosuid",
                   {"source": "/home", "target": "/home", "mode": "rw",
                    "options": ["rbind", "nodev", "noexec"]},
                   {"source": "/tmp", "target": "/tmp", "mode": "rw"}],
        "network": {"connect": [443, 80]},
        "cost_limit": 2.5,
        "window": 128000,
        "depth_limit": 2,
        "create_limit": 4,
        "timeout_s": 600,
        "resources": {"memory_max": "256M", "pids_max": 64, "cpu_weight": 50},
        "uid": 1000,
        "gid": 1000,
        "groups": [1000, 27],
        "env": {"LANG": "C.UTF-8", "TOKEN": "x=y"},
        "models": ["local", "gpt-x"],
        "path": "proj:user:sys",
        "rules": ["allow self tool:shell use", "allow agent:rev shared:notes read"]
    }"#;

    const TOML: &str = r#"
        tools = ["shell", "file_read"]
        files = [
            { path = "/work/", mode = "rw" },
            { path = "/", mode = "ro" },
            { path = "//secret", mode = "hidden" },
        ]
        mounts = [
            "/src	/dst	ro	bind,nosuid",
            { source = "/home", target = "/home", mode = "rw", options = ["rbind", "nodev", "noexec"] },
            { source = "/tmp", target = "/tmp", mode = "rw" },
        ]
        network = { connect = [443, 80] }
        cost_limit = 2.5
        window = 128000
        depth_limit = 2
        create_limit = 4
        timeout_s = 600
        uid = 1000
        gid = 1000
        groups = [1000, 27]
        models = ["local", "gpt-x"]
        path = ["proj", "user", "sys"]
        rules = ["allow self tool:shell use", "allow agent:rev shared:notes read"]

        [resources]
        memory_max = "256m"
        pids_max = 64
        cpu_weight = 50

        [env]
        LANG = "C.UTF-8"
        TOKEN = "x=y"
    "#;

    #[test]
    fn every_field_is_read_from_json() {
        assert_eq!(parse_json(JSON).unwrap(), expected());
    }

    #[test]
    fn every_field_is_read_from_toml() {
        assert_eq!(parse_toml(TOML).unwrap(), expected());
    }

    #[test]
    fn a_document_may_give_some_fields_only() {
        assert_eq!(parse_json("{}").unwrap(), PolicyRequest::default());
        assert_eq!(parse_toml("").unwrap(), PolicyRequest::default());
        let r = parse_json(r#"{"network": "none", "tools": null, "path": ""}"#).unwrap();
        assert_eq!(
            r,
            PolicyRequest {
                network: Some(Network::None),
                path: Some(vec![]),
                ..PolicyRequest::default()
            }
        );
        assert_eq!(
            parse_json(r#"{"network": "all"}"#).unwrap().network,
            Some(Network::All)
        );
        let r = parse_json(r#"{"resources": {"pids_max": 5}}"#).unwrap();
        assert_eq!(
            r.resources,
            Resources {
                pids_max: Some(5),
                ..Resources::default()
            }
        );
    }

    #[test]
    fn memory_sizes_are_bytes_or_suffixed_digits() {
        for (text, want) in [
            (r#"1024"#, 1024),
            (r#""1024""#, 1024),
            (r#""1K""#, 1 << 10),
            (r#""256M""#, 256 << 20),
            (r#""1G""#, 1 << 30),
            (r#""2t""#, 2 << 40),
        ] {
            let doc = format!(r#"{{"resources": {{"memory_max": {text}}}}}"#);
            assert_eq!(
                parse_json(&doc).unwrap().resources.memory_max,
                Some(want),
                "{text}"
            );
        }
    }

    #[test]
    fn every_bad_value_is_refused_naming_its_field() {
        for (doc, field, says) in [
            (r#"[]"#, DOCUMENT, "must be an object"),
            (r#"{"tols": []}"#, "tols", "not a policy field"),
            (r#"{"tools": "shell"}"#, "tools", "must be an array"),
            (r#"{"tools": ["a", "b c"]}"#, "tools[1]", "whitespace"),
            (r#"{"tools": ["a", 1]}"#, "tools[1]", "must be a string"),
            (
                r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a/../b", "mode": "ro"}]}"#,
                "files[1].path",
                r#""/a/../b": ".." is not allowed"#,
            ),
            (
                r#"{"files": [{"path": "a", "mode": "ro"}]}"#,
                "files[0].path",
                "absolute",
            ),
            (
                r#"{"files": [{"path": "/a/./b", "mode": "ro"}]}"#,
                "files[0].path",
                r#""." is not allowed"#,
            ),
            (
                r#"{"files": [{"path": "/a\u0000", "mode": "ro"}]}"#,
                "files[0].path",
                "control characters",
            ),
            (
                r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a", "mode": "write"}]}"#,
                "files[1].mode",
                r#""write": must be hidden, ro or rw"#,
            ),
            (r#"{"files": [{"path": "/a"}]}"#, "files[0].mode", "missing"),
            (r#"{"files": [{"mode": "ro"}]}"#, "files[0].path", "missing"),
            (
                r#"{"files": [{"path": "/a", "mode": "ro", "deep": true}]}"#,
                "files[0].deep",
                "not a field here",
            ),
            (
                r#"{"files": [{"path": "/a", "mode": "ro"}, {"path": "/a/", "mode": "rw"}]}"#,
                "files[1].path",
                "files[0] already has a rule",
            ),
            (r#"{"files": ["/a"]}"#, "files[0]", "must be an object"),
            (
                r#"{"mounts": ["/a/../etc\t/etc\tro\t-"]}"#,
                "mounts[0].source",
                r#"".." is not allowed"#,
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/x/../etc", "mode": "ro"}]}"#,
                "mounts[0].target",
                r#"".." is not allowed"#,
            ),
            (
                r#"{"mounts": ["/a /b ro -"]}"#,
                "mounts[0]",
                "tab-separated",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "rx"}]}"#,
                "mounts[0].mode",
                "must be ro or rw",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b"}]}"#,
                "mounts[0].mode",
                "missing",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": ["bind", "rbind"]}]}"#,
                "mounts[0].options",
                "exclude each other",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": ["nosuid", "nosuid"]}]}"#,
                "mounts[0].options",
                "given twice",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "options": [1]}]}"#,
                "mounts[0].options[0]",
                "must be a string",
            ),
            (
                r#"{"mounts": [{"source": "/a", "target": "/b", "mode": "ro", "flags": []}]}"#,
                "mounts[0].flags",
                "not a field here",
            ),
            (
                r#"{"mounts": ["/a\t/b\tro\t-", "/c\t/b\tro\t-"]}"#,
                "mounts[1].target",
                "already mounts",
            ),
            (
                r#"{"mounts": [3]}"#,
                "mounts[0]",
                "must be a mount line or an object",
            ),
            (
                r#"{"network": "some"}"#,
                "network",
                "must be \"none\", \"all\"",
            ),
            (
                r#"{"network": {"connect": [80, 70000]}}"#,
                "network.connect[1]",
                "70000: must be a port",
            ),
            (
                r#"{"network": {"connect": [0]}}"#,
                "network.connect[0]",
                "must be a port",
            ),
            (
                r#"{"network": {"connect": ["80"]}}"#,
                "network.connect[0]",
                "must be a whole number",
            ),
            (
                r#"{"network": {"bind": [80]}}"#,
                "network.bind",
                "not a field here",
            ),
            (r#"{"network": {}}"#, "network.connect", "missing"),
            (
                r#"{"cost_limit": -1}"#,
                "cost_limit",
                "-1: must be a number of dollars",
            ),
            (
                r#"{"cost_limit": "5"}"#,
                "cost_limit",
                "must be a number of dollars, not a string",
            ),
            (
                r#"{"window": 1.5}"#,
                "window",
                "1.5: must be a whole number",
            ),
            (r#"{"window": 0}"#, "window", "at least 1"),
            (r#"{"window": 10.0}"#, "window", "must be a whole number"),
            (
                r#"{"depth_limit": -1}"#,
                "depth_limit",
                "must be a whole number",
            ),
            (
                r#"{"depth_limit": 4294967296}"#,
                "depth_limit",
                "must be at most 4294967295",
            ),
            (r#"{"create_limit": true}"#, "create_limit", "not a boolean"),
            (r#"{"timeout_s": 0}"#, "timeout_s", "at least 1"),
            (
                r#"{"resources": {"memory_max": "256MB"}}"#,
                "resources.memory_max",
                "digits with K, M, G or T",
            ),
            (
                r#"{"resources": {"memory_max": "M"}}"#,
                "resources.memory_max",
                "digits with",
            ),
            (
                r#"{"resources": {"memory_max": "-1"}}"#,
                "resources.memory_max",
                "digits with",
            ),
            (
                r#"{"resources": {"memory_max": "99999999999T"}}"#,
                "resources.memory_max",
                "too large",
            ),
            (
                r#"{"resources": {"memory_max": 0}}"#,
                "resources.memory_max",
                "at least 1",
            ),
            (
                r#"{"resources": {"pids_max": "many"}}"#,
                "resources.pids_max",
                "must be a whole number",
            ),
            (
                r#"{"resources": {"cpu_weight": 0}}"#,
                "resources.cpu_weight",
                "from 1 to 10000",
            ),
            (
                r#"{"resources": {"io_max": 1}}"#,
                "resources.io_max",
                "not a field here",
            ),
            (r#"{"resources": []}"#, "resources", "must be an object"),
            (r#"{"uid": "root"}"#, "uid", "must be a whole number"),
            (r#"{"gid": -5}"#, "gid", "must be a whole number"),
            (
                r#"{"groups": [1, "wheel"]}"#,
                "groups[1]",
                "must be a whole number",
            ),
            (
                r#"{"env": {"A": 1}}"#,
                "env.A",
                "must be a string, not a number",
            ),
            (
                r#"{"env": {"A=B": "1"}}"#,
                "env",
                r#""A=B": a name must not contain "=""#,
            ),
            (r#"{"env": {"": "1"}}"#, "env", "must not be empty"),
            (r#"{"env": {"A": "x\u0000y"}}"#, "env.A", "NUL or newline"),
            (r#"{"env": ["A=1"]}"#, "env", "must be an object"),
            (r#"{"models": [""]}"#, "models[0]", "must not be empty"),
            (r#"{"path": "a::b"}"#, "path[1]", "must not be empty"),
            (
                r#"{"path": ["a", "a"]}"#,
                "path[1]",
                "already given at path[0]",
            ),
            (r#"{"path": ["a:b"]}"#, "path[0]", "must not contain \":\""),
            (r#"{"path": 3}"#, "path", "\"a:b:c\" or an array"),
            (
                r#"{"rules": ["allow self tool:x use", "allow self tool:x read"]}"#,
                "rules[1]",
                "not a permission of class tool",
            ),
            (
                r#"{"rules": ["permit self tool:x use"]}"#,
                "rules[0]",
                "must start with \"allow\"",
            ),
            (
                r#"{"rules": "allow self tool:x use"}"#,
                "rules",
                "must be an array",
            ),
        ] {
            let e = parse_json(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.message.contains(says), "{doc}: want {says:?} in {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("policy field {field}: "))
            );
        }
        let e = parse_json("{").unwrap_err();
        assert_eq!(e.field, DOCUMENT);
        assert!(e.message.starts_with("not JSON"), "{e}");
    }

    #[test]
    fn toml_values_json_lacks_are_refused_naming_the_field() {
        for (doc, field, says) in [
            ("window = 1979-05-27", "window", "a date is not a value"),
            ("cost_limit = nan", "cost_limit", "finite"),
            (
                "[resources]\nmemory_max = inf",
                "resources.memory_max",
                "finite",
            ),
            (
                "files = [{ path = \"/a/../b\", mode = \"ro\" }]",
                "files[0].path",
                "\"..\" is not allowed",
            ),
            (
                "mounts = [\"/a\\t/b/..\\tro\\t-\"]",
                "mounts[0].target",
                "\"..\" is not allowed",
            ),
            ("tols = []", "tols", "not a policy field"),
        ] {
            let e = parse_toml(doc).unwrap_err();
            assert_eq!(e.field, field, "{doc}: {e}");
            assert!(e.message.contains(says), "{doc}: {e}");
        }
        let e = parse_toml("window = \n").unwrap_err();
        assert_eq!(e.field, DOCUMENT);
        assert!(
            e.message.starts_with("not TOML") && e.message.contains("line 1"),
            "{e}"
        );
    }

    /// A policy with a value in every field.
    fn full() -> Policy {
        let op = Policy::operator(1000, 1000, [27, 1000].into());
        effective(&op, &expected())
    }

    #[test]
    fn to_json_round_trips_through_parse_and_effective() {
        for p in [
            Policy::operator(0, 0, BTreeSet::new()),
            Policy::operator(1000, 100, [4, 24].into()),
            full(),
            Policy {
                network: Network::All,
                cost_limit: Some(0.1),
                depth_limit: Some(0),
                resources: Resources {
                    cpu_weight: Some(7),
                    ..Resources::default()
                },
                ..full()
            },
            Policy {
                tools: Some(BTreeSet::new()),
                models: Some(BTreeSet::new()),
                network: Network::None,
                ..full()
            },
        ] {
            let p = p.normalise().unwrap();
            let json = to_json(&p);
            let text = serde_json::to_string_pretty(&json).unwrap();
            let req = parse_json(&text).unwrap();
            let op = Policy::operator(p.uid, p.gid, p.groups.clone());
            assert_eq!(effective(&op, &req), p, "{text}");
            assert_eq!(effective(&p, &req), p, "{text}");
        }
    }

    #[test]
    fn to_json_spells_the_fields_as_spec_5_does() {
        let json = to_json(&full());
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys.join(" "),
            FIELDS.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        assert_eq!(json["network"], serde_json::json!({"connect": [80, 443]}));
        assert_eq!(json["mounts"][0], "/src\t/dst\tro\tbind,nosuid");
        assert_eq!(
            json["files"][0],
            serde_json::json!({"path": "/", "mode": "ro"})
        );
        let op = to_json(&Policy::operator(0, 0, BTreeSet::new()));
        for absent in [
            "tools",
            "cost_limit",
            "window",
            "depth_limit",
            "models",
            "resources",
        ] {
            assert!(op.get(absent).is_none(), "{absent}");
        }
        assert_eq!(op["network"], "all");
    }
}
