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
//! ```
//! Every key is optional; a missing file means SPEC 9's table. An unknown table or
//! key is an error naming it, so a typo never silently changes nothing.

use std::path::Path;

use brood_core::quota::QuotaConfig;

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
    let shown = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(QuotaConfig::default()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: shown,
                source,
            });
        }
    };
    parse(&text).map_err(|message| ConfigError::Invalid {
        path: shown,
        message,
    })
}

/// Parses the text of a configuration file.
pub fn parse(text: &str) -> Result<QuotaConfig, String> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut defaults = Vec::new();
    let mut ceilings = Vec::new();
    for (k, v) in &doc {
        if k != "quotas" {
            return Err(format!(
                "unknown table or key {k:?} (expected [quotas.defaults] or [quotas.ceilings])"
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
    QuotaConfig::from_pairs(&d, &c).map_err(|e| e.to_string())
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
}
