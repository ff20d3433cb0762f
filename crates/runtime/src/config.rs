//! The platform configuration file, `$BROOD_ROOT/config.toml` (or `--config`).
//!
//! ```toml
//! [quotas.defaults]      # what a tenant gets when it asks for nothing (SPEC 9)
//! max_depth = 3
//! max_fanout = 8
//! max_tree_size = 64
//! max_concurrent = 16
//!
//! [quotas.ceilings]      # the most a tenant's own values may reach
//! max_concurrent = 4096
//!
//! [quotas.models]        # each tenant's model calls through the gateway, on
//! requests_per_minute = 600     # each node (issue 31, docs/models.md); none: no limit
//! tokens_per_minute = 2000000
//!
//! [limits]               # the work one request or caller may cause (issue 24)
//! items_per_job = 100000        # 413 beyond
//! jobs_per_tenant = 1000        # unfinished jobs at once; 429 beyond
//! items_per_tenant = 1000000    # items in unfinished jobs; 429 beyond
//! agents_per_second = 500       # creations per caller, sustained
//! agents_burst = 2000           # ... and at once; 429 with Retry-After beyond
//!
//! [resources]            # what an agent gets when neither its policy nor an ancestor's says
//! disk_max = "1G"               # bytes it may write (issue 24), as a policy writes them
//!
//! [models.openai]        # the model gateway's providers, keys and prices (issue 31,
//! base_url = "https://api.openai.com"   # docs/models.md; crate::models)
//! key_env = "OPENAI_API_KEY"
//! [models.prices]
//! "gpt-4o-mini" = { input = 0.15, output = 0.6 }
//! ```
//! Every key is optional; a missing file means SPEC 9's table,
//! [`Limits::default`] and [`ResourceDefaults::default`]. An unknown table or
//! key is an error naming it, so a typo never silently changes nothing.

use std::path::Path;

use brood_core::quota::QuotaConfig;

use crate::limits::Limits;

/// Everything the configuration file sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Platform {
    pub quotas: QuotaConfig,
    pub limits: Limits,
    pub resources: ResourceDefaults,
    /// `[models]`: the gateway's providers and prices (issue 31).
    pub models: crate::models::ModelsConfig,
}

/// `[resources]`: the limits an agent gets when neither its policy nor any
/// ancestor's sets them (issue 24 item 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDefaults {
    /// `resources.disk_max` in bytes: the largest file an agent may write
    /// and the most its channel's `artifact/` may hold. There is no "off":
    /// an operator who wants more gives a root a larger `disk_max` or raises
    /// this (up to 2^63−1).
    pub disk_max: u64,
}

/// 1 GiB: the size past which collection already refused a child's
/// artifacts (`channel::MAX_ARTIFACT_BYTES`), so no run that could hand
/// something back before is cut short by the default; far above what an
/// agent's source files, logs and reports take; and small enough that the
/// default tree (64 agents, `quotas.defaults.max_tree_size`) cannot fill a
/// disk of ordinary size through one file each.
pub const DEFAULT_DISK_MAX: u64 = 1 << 30;

impl Default for ResourceDefaults {
    fn default() -> ResourceDefaults {
        ResourceDefaults {
            disk_max: DEFAULT_DISK_MAX,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Reads the quota configuration; a missing file is the defaults.
pub fn load(path: &Path) -> Result<QuotaConfig, ConfigError> {
    load_platform(path).map(|p| p.quotas)
}

/// Reads the whole configuration; a missing file is the defaults.
pub fn load_platform(path: &Path) -> Result<Platform, ConfigError> {
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Platform::default()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: shown,
                source,
            });
        }
    };
    parse_platform(&text).map_err(|message| ConfigError::Invalid {
        path: shown,
        message,
    })
}

/// Parses the text of a configuration file: its quotas.
pub fn parse(text: &str) -> Result<QuotaConfig, String> {
    parse_platform(text).map(|p| p.quotas)
}

/// Parses the text of a configuration file.
pub fn parse_platform(text: &str) -> Result<Platform, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut defaults = Vec::new();
    let mut ceilings = Vec::new();
    let mut limits = Limits::default();
    let mut resources = ResourceDefaults::default();
    let mut models = crate::models::ModelsConfig::default();
    let mut tenant_rate = brood_core::policy::ModelRate::default();
    for (k, v) in &doc {
        if k == "models" {
            models = crate::models::ModelsConfig::parse(v)?;
            continue;
        }
        if k == "limits" {
            limits = parse_limits(v)?;
            continue;
        }
        if k == "resources" {
            resources = parse_resources(v)?;
            continue;
        }
        if k != "quotas" {
            return Err(format!(
                "unknown table or key {k:?} (expected [quotas.defaults], [quotas.ceilings], \
                 [limits], [resources] or [models])"
            ));
        }
        let t = v.as_table().ok_or("quotas must be a table")?;
        for (which, tv) in t {
            let target = match which.as_str() {
                "defaults" => &mut defaults,
                "ceilings" => &mut ceilings,
                "models" => {
                    tenant_rate = parse_tenant_rate(tv)?;
                    continue;
                }
                other => {
                    return Err(format!(
                        "unknown table quotas.{other} (expected defaults, ceilings or models)"
                    ));
                }
            };
            let t = tv
                .as_table()
                .ok_or_else(|| format!("quotas.{which} must be a table"))?;
            for (key, val) in t {
                let n = val
                    .as_integer()
                    .filter(|n| (0..=i64::from(u32::MAX)).contains(n))
                    .ok_or_else(|| {
                        format!("quotas.{which}.{key} must be a non-negative integer")
                    })?;
                target.push((key.clone(), n as u32));
            }
        }
    }
    let d: Vec<(&str, u32)> = defaults.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let c: Vec<(&str, u32)> = ceilings.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let mut quotas = QuotaConfig::from_pairs(&d, &c).map_err(|e| e.to_string())?;
    quotas.models = tenant_rate;
    Ok(Platform {
        quotas,
        limits,
        resources,
        models,
    })
}

/// `[quotas.models]`: `requests_per_minute` and `tokens_per_minute`, each
/// a whole number from 1 to 2^63−1 as a policy's `model_rate` holds them
/// (checked by the policy's own check), or left out for no limit.
fn parse_tenant_rate(v: &toml::Value) -> Result<brood_core::policy::ModelRate, String> {
    let t = v.as_table().ok_or("quotas.models must be a table")?;
    let mut r = brood_core::policy::ModelRate::default();
    for (key, val) in t {
        let n = val
            .as_integer()
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("quotas.models.{key} must be a whole number of at least 1"))?;
        match key.as_str() {
            "requests_per_minute" => r.requests_per_minute = Some(n),
            "tokens_per_minute" => r.tokens_per_minute = Some(n),
            other => {
                return Err(format!(
                    "unknown key quotas.models.{other} (expected requests_per_minute or \
                     tokens_per_minute)"
                ));
            }
        }
    }
    Ok(r)
}

/// `[resources]`: `disk_max`, bytes as a policy writes them (a whole
/// number, or digits with `K M G T`), from 1 to 2^63−1, checked as a
/// policy's `resources.disk_max` is.
fn parse_resources(v: &toml::Value) -> Result<ResourceDefaults, String> {
    let t = v.as_table().ok_or("resources must be a table")?;
    let mut r = ResourceDefaults::default();
    for (key, val) in t {
        match key.as_str() {
            "disk_max" => {
                let field = "resources.disk_max";
                let json = match val {
                    toml::Value::Integer(i) => serde_json::Value::from(*i),
                    toml::Value::String(s) => serde_json::Value::from(s.as_str()),
                    other => {
                        return Err(format!(
                            "{field} must be a number of bytes or digits with K, M, G or T, not {}",
                            other.type_str()
                        ));
                    }
                };
                let said =
                    |e: brood_core::policy::PolicyError| format!("{}: {}", e.field, e.message);
                let n = brood_proto::policy::read_bytes(field, &json).map_err(said)?;
                // The policy's own range check, so the default is a value a
                // policy could hold.
                brood_core::policy::PolicyRequest {
                    resources: brood_core::policy::Resources {
                        disk_max: Some(n),
                        ..Default::default()
                    },
                    ..Default::default()
                }
                .normalise()
                .map_err(said)?;
                r.disk_max = n;
            }
            other => {
                return Err(format!("unknown key resources.{other} (expected disk_max)"));
            }
        }
    }
    Ok(r)
}

/// `[limits]`: each key a whole number of at least 1 (`agents_per_second`
/// may be a fraction), so no limit can be switched off by a 0.
fn parse_limits(v: &toml::Value) -> Result<Limits, String> {
    let t = v.as_table().ok_or("limits must be a table")?;
    let mut l = Limits::default();
    for (key, val) in t {
        let whole = |max: i64| {
            val.as_integer()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| format!("limits.{key} must be a whole number from 1 to {max}"))
        };
        match key.as_str() {
            "items_per_job" => l.items_per_job = whole(i64::from(u32::MAX))? as u32,
            "jobs_per_tenant" => l.jobs_per_tenant = whole(i64::from(u32::MAX))? as u32,
            "items_per_tenant" => l.items_per_tenant = whole(i64::MAX)? as u64,
            "agents_burst" => l.agents_burst = whole(i64::from(u32::MAX))? as u32,
            "agents_per_second" => {
                let n = val
                    .as_float()
                    .or_else(|| val.as_integer().map(|i| i as f64))
                    .filter(|n| n.is_finite() && *n > 0.0)
                    .ok_or("limits.agents_per_second must be a number above 0")?;
                l.agents_per_second = n;
            }
            other => {
                return Err(format!(
                    "unknown key limits.{other} (expected items_per_job, jobs_per_tenant, \
                     items_per_tenant, agents_per_second or agents_burst)"
                ));
            }
        }
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_ceilings_and_refusals() {
        let c = parse("").unwrap();
        assert_eq!(c, QuotaConfig::default());
        let c = parse("[quotas.defaults]\nmax_fanout = 2\n[quotas.ceilings]\nmax_fanout = 4\n")
            .unwrap();
        assert_eq!(c.defaults.max_fanout, 2);
        assert_eq!(c.ceilings.max_fanout, 4);
        // A default above its ceiling is clamped.
        let c = parse("[quotas.defaults]\nmax_depth = 50\n").unwrap();
        assert_eq!(c.defaults.max_depth, 32);
        assert!(
            parse("[quotas.defaults]\nmax_fanot = 2\n")
                .unwrap_err()
                .contains("max_fanot")
        );
        assert!(parse("[quota]\n").unwrap_err().contains("quota"));
        assert!(
            parse("[quotas.defaults]\nmax_depth = -1\n")
                .unwrap_err()
                .contains("max_depth")
        );
    }

    #[test]
    fn a_tenant_s_model_rate_is_read_from_quotas_models() {
        assert_eq!(
            parse("").unwrap().models,
            brood_core::policy::ModelRate::default()
        );
        let c =
            parse("[quotas.models]\nrequests_per_minute = 5\ntokens_per_minute = 9000\n").unwrap();
        assert_eq!(c.models.requests_per_minute, Some(5));
        assert_eq!(c.models.tokens_per_minute, Some(9000));
        let c = parse("[quotas.models]\ntokens_per_minute = 1\n").unwrap();
        assert_eq!(c.models.requests_per_minute, None);
        for (bad, says) in [
            (
                "[quotas.models]\nrequests_per_minute = 0\n",
                "quotas.models.requests_per_minute must be a whole number of at least 1",
            ),
            (
                "[quotas.models]\ntokens_per_minute = -3\n",
                "quotas.models.tokens_per_minute must be",
            ),
            (
                "[quotas.models]\ntokens_per_minute = \"many\"\n",
                "quotas.models.tokens_per_minute must be",
            ),
            (
                "[quotas.models]\nrequests_a_minute = 3\n",
                "unknown key quotas.models.requests_a_minute",
            ),
            ("[quotas]\nmodels = 3\n", "quotas.models must be a table"),
            ("[quotas.modles]\n", "unknown table quotas.modles"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_disk_default_is_a_gib_and_is_read_as_a_policy_writes_bytes() {
        let p = parse_platform("").unwrap();
        assert_eq!(p.resources.disk_max, 1 << 30);
        for (text, want) in [
            ("[resources]\ndisk_max = 4096\n", 4096),
            ("[resources]\ndisk_max = \"10G\"\n", 10 << 30),
            ("[resources]\ndisk_max = \"512m\"\n", 512 << 20),
        ] {
            assert_eq!(
                parse_platform(text).unwrap().resources.disk_max,
                want,
                "{text}"
            );
        }
        for (bad, says) in [
            (
                "[resources]\ndisk_max = 0\n",
                "resources.disk_max: 0: must be at least 1 byte",
            ),
            (
                "[resources]\ndisk_max = -1\n",
                "resources.disk_max: -1: must be a whole number",
            ),
            (
                "[resources]\ndisk_max = \"1Q\"\n",
                "resources.disk_max: \"1Q\"",
            ),
            (
                "[resources]\ndisk_max = 1.5\n",
                "resources.disk_max must be a number of bytes",
            ),
            (
                "[resources]\ndisk_max = 9223372036854775807\n[resources.x]\n",
                "unknown key resources.x",
            ),
            (
                "[resources]\ndisk_mx = 5\n",
                "unknown key resources.disk_mx",
            ),
            ("[resource]\n", "[resources]"),
        ] {
            let e = parse_platform(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // The largest a policy may hold is taken.
        assert_eq!(
            parse_platform("[resources]\ndisk_max = 9223372036854775807\n")
                .unwrap()
                .resources
                .disk_max,
            i64::MAX as u64
        );
    }

    #[test]
    fn limits_are_read_and_refused_by_name() {
        assert_eq!(parse_platform("").unwrap().limits, Limits::default());
        let p = parse_platform(
            "[limits]\nitems_per_job = 10\nagents_per_second = 0.5\nagents_burst = 2\n",
        )
        .unwrap();
        assert_eq!(p.limits.items_per_job, 10);
        assert_eq!(p.limits.agents_per_second, 0.5);
        assert_eq!(p.limits.agents_burst, 2);
        assert_eq!(p.limits.jobs_per_tenant, Limits::default().jobs_per_tenant);
        for bad in [
            "[limits]\nitems_per_job = 0\n",
            "[limits]\nitems_per_jobs = 5\n",
            "[limits]\nagents_per_second = 0\n",
            "[limits]\njobs_per_tenant = \"x\"\n",
        ] {
            let e = parse_platform(bad).unwrap_err();
            assert!(e.contains("limits."), "{bad}: {e}");
        }
    }
}
