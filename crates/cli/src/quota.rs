//! `brood quota`: the quotas in force for a tenant and where each comes from;
//! a tenant's own values set in the store `--store` names.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::{Value, json};

use crate::{Exit, root_of, store_file, unsafe_uid};

#[derive(Subcommand)]
pub(crate) enum QuotaCmd {
    /// The quotas in force for a tenant (default: yours), and where each comes from.
    Show {
        /// The tenant (`user-<uid>`; default: yours).
        tenant: Option<String>,
        /// Print the quotas as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Sets a tenant's own value (clamped to the platform's ceiling when applied).
    Set {
        /// The tenant (`user-<uid>`).
        tenant: String,
        /// max_depth, max_fanout, max_tree_size or max_concurrent.
        key: String,
        /// The new value, a whole number.
        value: u32,
    },
}

/// The platform configuration's quotas: `--config`, else `$BROOD_ROOT/config.toml`.
pub(crate) fn load_config(
    config: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> Result<brood_core::quota::QuotaConfig> {
    load_platform(config, root).map(|p| p.quotas)
}

/// The whole platform configuration (quotas and `[limits]`).
pub(crate) fn load_platform(
    config: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> Result<brood_runtime::config::Platform> {
    let path = config
        .clone()
        .unwrap_or_else(|| root_of(root).join("config.toml"));
    brood_runtime::config::load_platform(&path).map_err(|e| Exit(2, e.to_string()).into())
}

pub(crate) fn quota(
    root: &Option<PathBuf>,
    config: &Option<PathBuf>,
    what: QuotaCmd,
) -> Result<i32> {
    let cfg = load_config(config, root)?;
    let db = store_file(root);
    let tenant_of = |t: Option<String>| -> Result<brood_core::TenantId> {
        match t {
            Some(t) => brood_core::TenantId::new(&t).map_err(|e| Exit(2, e.to_string()).into()),
            None => Ok(brood_core::TenantId::for_uid(unsafe_uid())),
        }
    };
    match what {
        QuotaCmd::Show { tenant, json } => {
            let tenant = tenant_of(tenant)?;
            let spec = db.to_string_lossy();
            let own = if brood_store::is_postgres_url(&spec) || db.exists() {
                brood_store::open_read_only(&spec)?.tenant_quotas(&tenant)?
            } else {
                brood_core::quota::TenantQuotas::default()
            };
            let eff = cfg.effective(Some(&own));
            let rows: Vec<Value> = eff
                .pairs()
                .iter()
                .map(|(k, v)| {
                    let own_v = own.get(k).ok().flatten();
                    json!({"key": k, "value": v, "tenant": own_v, "default": cfg.defaults.get(k), "ceiling": cfg.ceilings.get(k)})
                })
                .collect();
            // `[quotas.models]`: the same for every tenant, counted by each node.
            let rate = cfg.models;
            let models = json!({
                "requests_per_minute": rate.requests_per_minute,
                "tokens_per_minute": rate.tokens_per_minute,
            });
            if json {
                println!(
                    "{}",
                    json!({"tenant": tenant.as_str(), "quotas": rows, "models": models})
                );
            } else {
                println!("tenant {tenant}");
                println!(
                    "{:<16} {:>8} {:>8} {:>8} {:>8}",
                    "KEY", "VALUE", "TENANT", "DEFAULT", "CEILING"
                );
                for r in &rows {
                    let f = |k: &str| match &r[k] {
                        Value::Null => "-".to_owned(),
                        v => v.to_string(),
                    };
                    println!(
                        "{:<16} {:>8} {:>8} {:>8} {:>8}",
                        f("key").trim_matches('"'),
                        f("value"),
                        f("tenant"),
                        f("default"),
                        f("ceiling")
                    );
                }
                let shown = |v: Option<u64>| v.map_or("none".to_owned(), |n| n.to_string());
                println!(
                    "model calls a minute, on each node (quotas.models): requests {}, tokens {}",
                    shown(rate.requests_per_minute),
                    shown(rate.tokens_per_minute)
                );
            }
            Ok(0)
        }
        QuotaCmd::Set { tenant, key, value } => {
            let tenant = tenant_of(Some(tenant))?;
            let spec = db.to_string_lossy();
            if !brood_store::is_postgres_url(&spec)
                && let Some(dir) = db.parent()
            {
                std::fs::create_dir_all(dir)?;
            }
            let store = brood_store::open(&spec)
                .with_context(|| format!("opening the store {}", crate::store_url::shown(&db)))?;
            store
                .set_tenant_quota(&tenant, &key, value)
                .map_err(|e| Exit(2, e.to_string()))?;
            let eff = cfg.effective(Some(&store.tenant_quotas(&tenant)?));
            println!(
                "{tenant} {key} = {} (set {value})",
                eff.get(&key).unwrap_or(value)
            );
            Ok(0)
        }
    }
}
