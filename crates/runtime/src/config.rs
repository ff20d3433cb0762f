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
//! [limits]               # the work one request or caller may cause (issue 24)
//! items_per_job = 100000        # 413 beyond
//! jobs_per_tenant = 1000        # unfinished jobs at once; 429 beyond
//! items_per_tenant = 1000000    # items in unfinished jobs; 429 beyond
//! agents_per_second = 500       # creations per caller, sustained
//! agents_burst = 2000           # ... and at once; 429 with Retry-After beyond
//! ```
//! Every key is optional; a missing file means SPEC 9's table and
//! [`Limits::default`]. An unknown table or key is an error naming it, so a
//! typo never silently changes nothing.

use std::path::Path;

use brood_core::quota::QuotaConfig;

use crate::limits::Limits;

/// Everything the configuration file sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Platform {
    pub quotas: QuotaConfig,
    pub limits: Limits,
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
    for (k, v) in &doc {
        if k == "limits" {
            limits = parse_limits(v)?;
            continue;
        }
        if k != "quotas" {
            return Err(format!(
                "unknown table or key {k:?} (expected [quotas.defaults], [quotas.ceilings] or [limits])"
            ));
        }
        let t = v.as_table().ok_or("quotas must be a table")?;
        for (which, tv) in t {
            let target = match which.as_str() {
                "defaults" => &mut defaults,
                "ceilings" => &mut ceilings,
                other => {
                    return Err(format!(
                        "unknown table quotas.{other} (expected defaults or ceilings)"
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
    let quotas = QuotaConfig::from_pairs(&d, &c).map_err(|e| e.to_string())?;
    Ok(Platform { quotas, limits })
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
