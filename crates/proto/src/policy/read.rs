//! Reading a policy document's values, field by field, at the boundary:
//! each reader takes a JSON value and the field's path, and refuses a
//! wrong one with a [`PolicyError`] naming that path and the value.

use std::collections::{BTreeMap, BTreeSet};

use brood_core::policy::{
    AbsPath, FileRule, Mode, ModelRate, MountEntry, MountOpts, Network, OnRestart, PolicyError,
    Resources, Rule,
};
use serde_json::{Map, Value};

/// How a JSON value's kind is named in errors.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn wrong(field: &str, want: &str, v: &Value) -> PolicyError {
    PolicyError::new(field, format!("{v}: must be {want}, not {}", kind(v)))
}

pub(super) fn object<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, PolicyError> {
    v.as_object().ok_or_else(|| wrong(field, "an object", v))
}

pub(super) fn array<'a>(field: &str, v: &'a Value) -> Result<&'a Vec<Value>, PolicyError> {
    v.as_array().ok_or_else(|| wrong(field, "an array", v))
}

pub(super) fn string<'a>(field: &str, v: &'a Value) -> Result<&'a str, PolicyError> {
    v.as_str().ok_or_else(|| wrong(field, "a string", v))
}

/// Refuses keys of `obj` outside `known`, naming the first as `field.key`.
pub(super) fn only_keys(
    field: &str,
    obj: &Map<String, Value>,
    known: &[&str],
) -> Result<(), PolicyError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(PolicyError::new(
            format!("{field}.{}", k.escape_debug()),
            format!("not a field here (the fields are {})", known.join(" ")),
        )),
        None => Ok(()),
    }
}

pub(super) fn required<'a>(
    field: &str,
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<&'a Value, PolicyError> {
    match obj.get(key) {
        Some(v) if !v.is_null() => Ok(v),
        _ => Err(PolicyError::new(format!("{field}.{key}"), "missing")),
    }
}

pub(super) fn whole(field: &str, v: &Value) -> Result<u64, PolicyError> {
    match v {
        // `3.0` is as whole as `3` (a JSON Schema `integer`, as the API's
        // document says a policy's numbers are).
        Value::Number(n) => n
            .as_u64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 18_446_744_073_709_551_616.0)
                    .map(|f| f as u64)
            })
            .ok_or_else(|| {
                PolicyError::new(field, format!("{n}: must be a whole number, at least 0"))
            }),
        _ => Err(wrong(field, "a whole number", v)),
    }
}

pub(super) fn whole32(field: &str, v: &Value) -> Result<u32, PolicyError> {
    let n = whole(field, v)?;
    u32::try_from(n)
        .map_err(|_| PolicyError::new(field, format!("{n}: must be at most {}", u32::MAX)))
}

pub(super) fn dollars(field: &str, v: &Value) -> Result<f64, PolicyError> {
    match v.as_f64() {
        Some(d) if d.is_finite() && d >= 0.0 => Ok(d),
        Some(d) => Err(PolicyError::new(
            field,
            format!("{d}: must be a number of dollars, at least 0"),
        )),
        None => Err(wrong(field, "a number of dollars", v)),
    }
}

pub(super) fn words(field: &str, v: &Value) -> Result<BTreeSet<String>, PolicyError> {
    let mut out = BTreeSet::new();
    for (i, x) in array(field, v)?.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let s = string(&f, x)?;
        brood_core::policy::check_word(&f, s)?;
        out.insert(s.to_owned());
    }
    Ok(out)
}

pub(super) fn files(v: &Value) -> Result<Vec<FileRule>, PolicyError> {
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

pub(super) fn mounts(v: &Value) -> Result<Vec<MountEntry>, PolicyError> {
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

pub(super) fn mount_object(f: &str, o: &Map<String, Value>) -> Result<MountEntry, PolicyError> {
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

pub(super) fn on_restart(v: &Value) -> Result<OnRestart, PolicyError> {
    let s = string("on_restart", v)?;
    OnRestart::parse(s).ok_or_else(|| {
        PolicyError::new(
            "on_restart",
            format!("{s:?}: must be \"cancel\" or \"resume\""),
        )
    })
}

pub(super) fn network(v: &Value) -> Result<Network, PolicyError> {
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

pub(super) fn resources(v: &Value) -> Result<Resources, PolicyError> {
    let o = object("resources", v)?;
    only_keys(
        "resources",
        o,
        &["memory_max", "pids_max", "cpu_weight", "disk_max"],
    )?;
    let mut r = Resources::default();
    for (k, x) in o {
        if x.is_null() {
            continue;
        }
        let f = format!("resources.{k}");
        match k.as_str() {
            "memory_max" => r.memory_max = Some(bytes(&f, x)?),
            "disk_max" => r.disk_max = Some(bytes(&f, x)?),
            "pids_max" => r.pids_max = Some(whole(&f, x)?),
            _ => r.cpu_weight = Some(whole(&f, x)?),
        }
    }
    Ok(r)
}

/// `model_rate`: `{requests_per_minute, tokens_per_minute}`, each a whole
/// number or left out (issue 31).
pub(super) fn model_rate(v: &Value) -> Result<ModelRate, PolicyError> {
    let o = object("model_rate", v)?;
    only_keys(
        "model_rate",
        o,
        &["requests_per_minute", "tokens_per_minute"],
    )?;
    let mut r = ModelRate::default();
    for (k, x) in o {
        if x.is_null() {
            continue;
        }
        let f = format!("model_rate.{k}");
        match k.as_str() {
            "requests_per_minute" => r.requests_per_minute = Some(whole(&f, x)?),
            _ => r.tokens_per_minute = Some(whole(&f, x)?),
        }
    }
    Ok(r)
}

/// Bytes as a number or as digits with a `K M G T` suffix (either case),
/// powers of 1024 as cgroups read them.
pub(super) fn bytes(field: &str, v: &Value) -> Result<u64, PolicyError> {
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

pub(super) fn groups(v: &Value) -> Result<BTreeSet<u32>, PolicyError> {
    array("groups", v)?
        .iter()
        .enumerate()
        .map(|(i, x)| whole32(&format!("groups[{i}]"), x))
        .collect()
}

pub(super) fn env(v: &Value) -> Result<BTreeMap<String, String>, PolicyError> {
    // Neither the document nor a value is echoed: values are often secrets.
    let Value::Object(o) = v else {
        return Err(PolicyError::new(
            "env",
            format!(
                "must be an object of names to values, not {} (not shown)",
                kind(v)
            ),
        ));
    };
    o.iter()
        .map(|(k, x)| {
            let f = format!("env.{}", k.escape_debug());
            match x {
                Value::String(s) => Ok((k.clone(), s.clone())),
                // What a shown policy holds in place of a value (issue 25).
                Value::Null => Err(PolicyError::new(
                    f,
                    "null: values are hidden where a policy is shown (brood show, the API, \
                     the policy file); give the value itself, or name the variable in secrets",
                )),
                _ => Err(PolicyError::new(
                    f,
                    format!("must be a string, not {}", kind(x)),
                )),
            }
        })
        .collect()
}

/// `secrets`: names only (issue 25). A document that puts values here (an
/// object of names to values, say) is refused without echoing any of it.
pub(super) fn secrets(v: &Value) -> Result<BTreeSet<String>, PolicyError> {
    let Value::Array(a) = v else {
        return Err(PolicyError::new(
            "secrets",
            format!(
                "must be an array of variable names, not {} (not shown); their values are \
                 given apart from the policy (`--secret NAME`, or the request's `secrets`)",
                kind(v)
            ),
        ));
    };
    let mut out = BTreeSet::new();
    for (i, x) in a.iter().enumerate() {
        let f = format!("secrets[{i}]");
        let Value::String(s) = x else {
            return Err(PolicyError::new(
                f,
                format!("must be a variable name (a string), not {}", kind(x)),
            ));
        };
        // The name itself is checked with the policy (`normalise`).
        out.insert(s.clone());
    }
    Ok(out)
}

pub(super) fn path(v: &Value) -> Result<Vec<String>, PolicyError> {
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

pub(super) fn rules(v: &Value) -> Result<Vec<Rule>, PolicyError> {
    array("rules", v)?
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let f = format!("rules[{i}]");
            Rule::parse(&f, string(&f, x)?)
        })
        .collect()
}
