//! What the types alone cannot refuse: each field of a policy checked and
//! normalised once (`Policy::normalise`), every refusal naming the field.

use std::collections::{BTreeMap, BTreeSet};

use super::{AbsPath, FileRule, ModelRate, MountEntry, Network, PolicyError, Resources, Rule};

/// A tool or model name (`field` is `tools` or `models`, or an indexed element
/// of one): non-empty, without whitespace or control characters, since names
/// are written space- and line-separated in control files and rules.
pub fn check_word(field: &str, s: &str) -> Result<(), PolicyError> {
    if s.is_empty() {
        return Err(PolicyError::new(field, "\"\": a name must not be empty"));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(PolicyError::new(
            field,
            format!("{s:?}: a name must not contain whitespace or control characters"),
        ));
    }
    Ok(())
}

pub(super) fn check_words(field: &str, set: &BTreeSet<String>) -> Result<(), PolicyError> {
    set.iter().try_for_each(|s| check_word(field, s))
}

/// Refuses two rules for one path (which would make the deepest rule
/// ambiguous), naming both by their index as given; then sorts by path.
pub(super) fn normalise_files(mut files: Vec<FileRule>) -> Result<Vec<FileRule>, PolicyError> {
    let mut seen: BTreeMap<&AbsPath, usize> = BTreeMap::new();
    for (i, r) in files.iter().enumerate() {
        if let Some(first) = seen.insert(&r.path, i) {
            return Err(PolicyError::new(
                format!("files[{i}].path"),
                format!(
                    "{:?}: files[{first}] already has a rule for it",
                    r.path.as_str()
                ),
            ));
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Refuses a mount whose target is the target of an earlier entry or an
/// ancestor of one. Such an entry would be mounted over the earlier one and hide
/// it, which would make "leaving an entry out hides it" false: a child dropping
/// the covering entry would reveal the covered one, which its parent could not
/// see. With no entry covering another, the order of entries does not change
/// what is visible, so a child's table is compared with its parent's as a set.
pub(super) fn check_mounts(mounts: &[MountEntry]) -> Result<(), PolicyError> {
    for (j, later) in mounts.iter().enumerate() {
        for (i, earlier) in mounts[..j].iter().enumerate() {
            if later.target == earlier.target {
                return Err(PolicyError::new(
                    format!("mounts[{j}].target"),
                    format!(
                        "{:?}: mounts[{i}] already mounts at this target",
                        later.target.as_str()
                    ),
                ));
            }
            if earlier.target.is_within(&later.target) {
                return Err(PolicyError::new(
                    format!("mounts[{j}].target"),
                    format!(
                        "{:?}: would cover mounts[{i}] at {:?}; list it before mounts[{i}]",
                        later.target.as_str(),
                        earlier.target.as_str()
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn check_network(network: &Network) -> Result<(), PolicyError> {
    if let Network::Connect(ports) = network
        && ports.contains(&0)
    {
        return Err(PolicyError::new(
            "network.connect",
            "0: not a port (use 1 to 65535)",
        ));
    }
    Ok(())
}

pub(super) fn check_cost_limit(cost: Option<f64>) -> Result<(), PolicyError> {
    match cost {
        Some(c) if !(c.is_finite() && c >= 0.0) => Err(PolicyError::new(
            "cost_limit",
            format!("{c}: must be a finite number of dollars, at least 0"),
        )),
        _ => Ok(()),
    }
}

/// The largest whole number a policy holds: the store's integer columns are
/// signed 64-bit (SQLite's INTEGER, PostgreSQL's BIGINT), and a larger number
/// in an agent's spec would be read back as a float (issue 24).
pub const WHOLE_MAX: u64 = i64::MAX as u64;

/// The longest `timeout_s`: ten years. A run's deadline is its start in
/// milliseconds plus `1000 * timeout_s`, computed in the store's signed
/// 64-bit integers; this keeps it far inside them (issue 24).
pub const TIMEOUT_MAX: u64 = 10 * 365 * 24 * 3600;

/// The largest `pids_max`: the kernel's `PID_MAX_LIMIT` (2^22); `pids.max`
/// refuses more, so a larger limit could only fail at launch.
pub const PIDS_MAX: u64 = 1 << 22;

pub(super) fn check_window(window: Option<u64>) -> Result<(), PolicyError> {
    match window {
        Some(0) => Err(PolicyError::new("window", "0: must be at least 1 token")),
        Some(w) if w > WHOLE_MAX => Err(PolicyError::new(
            "window",
            format!("{w}: must be at most {WHOLE_MAX}"),
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_timeout(timeout: Option<u64>) -> Result<(), PolicyError> {
    match timeout {
        Some(0) => Err(PolicyError::new(
            "timeout_s",
            "0: must be at least 1 second (leave it out for no timeout)",
        )),
        Some(t) if t > TIMEOUT_MAX => Err(PolicyError::new(
            "timeout_s",
            format!("{t}: must be at most {TIMEOUT_MAX} (ten years; leave it out for no timeout)"),
        )),
        _ => Ok(()),
    }
}

/// `(uid_t) -1` and `(gid_t) -1` mean "leave unchanged" to `setresuid(2)`
/// and `setresgid(2)`, and `setgroups(2)` refuses them: as an agent's
/// identity they would keep the supervisor's, or fail at launch.
pub(super) fn check_ids(
    uid: Option<u32>,
    gid: Option<u32>,
    groups: Option<&BTreeSet<u32>>,
) -> Result<(), PolicyError> {
    let none = u32::MAX;
    if uid == Some(none) {
        return Err(PolicyError::new(
            "uid",
            format!("{none}: (uid_t) -1 is not a user id"),
        ));
    }
    if gid == Some(none) {
        return Err(PolicyError::new(
            "gid",
            format!("{none}: (gid_t) -1 is not a group id"),
        ));
    }
    if groups.is_some_and(|g| g.contains(&none)) {
        return Err(PolicyError::new(
            "groups",
            format!("{none}: (gid_t) -1 is not a group id"),
        ));
    }
    Ok(())
}

/// cgroup v2 `cpu.weight` accepts 1 to 10000.
const CPU_WEIGHT_MAX: u64 = 10_000;

pub(super) fn check_resources(r: &Resources) -> Result<(), PolicyError> {
    // A limit of 0 memory or 0 processes could never start the agent; say so
    // now rather than as a confusing failure at launch.
    if r.memory_max == Some(0) {
        return Err(PolicyError::new(
            "resources.memory_max",
            "0: must be at least 1 byte (leave it out for no limit)",
        ));
    }
    if let Some(m) = r.memory_max
        && m > WHOLE_MAX
    {
        return Err(PolicyError::new(
            "resources.memory_max",
            format!("{m}: must be at most {WHOLE_MAX} bytes"),
        ));
    }
    if r.pids_max == Some(0) {
        return Err(PolicyError::new(
            "resources.pids_max",
            "0: must be at least 1 (leave it out for no limit)",
        ));
    }
    if let Some(p) = r.pids_max
        && p > PIDS_MAX
    {
        return Err(PolicyError::new(
            "resources.pids_max",
            format!("{p}: must be at most {PIDS_MAX} (the kernel's PID_MAX_LIMIT)"),
        ));
    }
    if let Some(w) = r.cpu_weight
        && !(1..=CPU_WEIGHT_MAX).contains(&w)
    {
        return Err(PolicyError::new(
            "resources.cpu_weight",
            format!("{w}: must be from 1 to {CPU_WEIGHT_MAX}"),
        ));
    }
    // A limit of 0 bytes could not even let the agent write its first line
    // of a file; there is no "no limit" either (the platform's default
    // applies when none is given), so the range is 1 to WHOLE_MAX.
    if r.disk_max == Some(0) {
        return Err(PolicyError::new(
            "resources.disk_max",
            "0: must be at least 1 byte (leave it out for the platform's default)",
        ));
    }
    if let Some(d) = r.disk_max
        && d > WHOLE_MAX
    {
        return Err(PolicyError::new(
            "resources.disk_max",
            format!("{d}: must be at most {WHOLE_MAX} bytes"),
        ));
    }
    Ok(())
}

/// A model rate limit is at least 1 (a limit of 0 would refuse every call:
/// `models: []` says that) and at most [`WHOLE_MAX`], the store's 64 bits.
pub(super) fn check_model_rate(r: &ModelRate) -> Result<(), PolicyError> {
    for (field, v) in [
        ("model_rate.requests_per_minute", r.requests_per_minute),
        ("model_rate.tokens_per_minute", r.tokens_per_minute),
    ] {
        match v {
            Some(0) => {
                return Err(PolicyError::new(
                    field,
                    "0: must be at least 1 (leave it out for no limit; `models: []` grants no model)",
                ));
            }
            Some(n) if n > WHOLE_MAX => {
                return Err(PolicyError::new(
                    field,
                    format!("{n}: must be at most {WHOLE_MAX}"),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A variable's name (of `env` or `secrets`; `field` names where it was
/// given): usable in `KEY=VALUE` lines and in `execve`'s environment, so not
/// empty, no `=`, no whitespace or control characters (NUL included), and not
/// one of the runtime's own (`BROOD_*`, `CTX_*`), which would be dropped at
/// launch, so it is refused where the mistake is made.
pub fn check_var_name(field: &str, k: &str) -> Result<(), PolicyError> {
    if k.is_empty() {
        return Err(PolicyError::new(field, "\"\": a name must not be empty"));
    }
    if k.contains('=') || k.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(PolicyError::new(
            field,
            format!("{k:?}: a name must not contain \"=\", whitespace or control characters"),
        ));
    }
    if k.starts_with("BROOD_") || k.starts_with("CTX_") {
        return Err(PolicyError::new(
            format!("{field}.{k}"),
            "BROOD_* and CTX_* are set by the runtime (the agent's identity); choose another name",
        ));
    }
    Ok(())
}

/// Names as [`check_var_name`] says. Values may hold anything but NUL (which
/// `execve` cannot carry) and newline (which would split the `env` control
/// file's line).
pub(super) fn check_env(env: &BTreeMap<String, String>) -> Result<(), PolicyError> {
    for (k, v) in env {
        check_var_name("env", k)?;
        if v.contains('\0') || v.contains('\n') {
            // The value itself is not echoed: environment values are often secrets.
            return Err(PolicyError::new(
                format!("env.{k}"),
                "the value must not contain NUL or newline",
            ));
        }
    }
    Ok(())
}

/// A secret is named like a variable of `env`, and one name is passed one
/// way: a name both in `env` (a value in the policy) and in `secrets` (a
/// value from the caller) would leave the agent's value to an order nobody
/// wrote down.
pub(super) fn check_secrets(
    secrets: &BTreeSet<String>,
    env: Option<&BTreeMap<String, String>>,
) -> Result<(), PolicyError> {
    for k in secrets {
        check_var_name("secrets", k)?;
        if env.is_some_and(|e| e.contains_key(k)) {
            return Err(PolicyError::new(
                format!("secrets.{k}"),
                format!(
                    "{k} is also in env; pass a variable one way: its value in env, or its name in secrets"
                ),
            ));
        }
    }
    Ok(())
}

/// A secret's value as the caller gives it (`field` names it): anything but
/// NUL, which `execve` cannot carry. A newline is allowed (a PEM key has
/// them): a secret's value is never written to a line of any file. The value
/// itself is never echoed.
pub fn check_secret_value(field: &str, v: &str) -> Result<(), PolicyError> {
    if v.contains('\0') {
        return Err(PolicyError::new(
            field,
            "the value must not contain a NUL byte (the value is not shown)",
        ));
    }
    Ok(())
}

/// A tier of `path` is a word that may not hold `:` (the separator of the
/// `a:b:c` form); a tier may appear once.
pub(super) fn check_path(path: &[String]) -> Result<(), PolicyError> {
    for (i, tier) in path.iter().enumerate() {
        let field = format!("path[{i}]");
        check_word(&field, tier)?;
        if tier.contains(':') {
            return Err(PolicyError::new(
                field,
                format!("{tier:?}: a tier must not contain \":\""),
            ));
        }
        if let Some(first) = path[..i].iter().position(|t| t == tier) {
            return Err(PolicyError::new(
                field,
                format!("{tier:?}: already given at path[{first}]"),
            ));
        }
    }
    Ok(())
}

/// Re-checks rules (their fields are public, so one may have been built by
/// hand) by reading back their text, then sorts them and drops repeats.
pub(super) fn normalise_rules(mut rules: Vec<Rule>) -> Result<Vec<Rule>, PolicyError> {
    for (i, r) in rules.iter().enumerate() {
        let field = format!("rules[{i}]");
        let text = r.to_text();
        if Rule::parse(&field, &text)? != *r {
            return Err(PolicyError::new(
                field,
                format!("{text:?}: does not read back as the same rule"),
            ));
        }
    }
    rules.sort();
    rules.dedup();
    Ok(rules)
}
