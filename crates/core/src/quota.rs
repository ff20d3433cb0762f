//! Quotas of agent trees (SPEC 9): the four limits, their defaults and ceilings,
//! and how a tenant's own values combine with the platform's configuration.
//!
//! The platform configuration (`$BROOD_ROOT/config.toml`, read by the runtime)
//! gives defaults and ceilings; a tenant may override any limit, and whatever it
//! asks for is clamped to the ceilings. The store enforces the resulting
//! [`Quotas`] inside the admission transaction; this module only computes them.
//!
//! The keys are spelled exactly as in SPEC 9's table (`max_depth`, `max_fanout`,
//! `max_tree_size`, `max_concurrent`), because they appear verbatim in the
//! configuration file, in `brood quota set TENANT KEY VALUE` and in the store.

use std::fmt;

use crate::policy::ModelRate;

/// Why a quota key or configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaError {
    /// The key is not one of [`Quotas::KEYS`]. `within` says where it was met
    /// (`"defaults"`, `"ceilings"`) when it came from a configuration.
    UnknownKey {
        key: String,
        within: Option<&'static str>,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::UnknownKey { key, within } => {
                write!(f, "unknown quota key {key:?}")?;
                if let Some(within) = within {
                    write!(f, " in the {within}")?;
                }
                write!(f, " (the keys are {})", Quotas::KEYS.join(", "))
            }
        }
    }
}

impl std::error::Error for QuotaError {}

fn unknown(key: &str) -> QuotaError {
    QuotaError::UnknownKey {
        key: key.to_owned(),
        within: None,
    }
}

/// The four limits of SPEC 9, as they apply to one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quotas {
    /// Deepest allowed agent: a child's depth (the parent's + 1; a root is 0) must
    /// be at most this.
    pub max_depth: u32,
    /// Unfinished children one parent may have at once.
    pub max_fanout: u32,
    /// Agents ever created in one tree (finished or not, the root included).
    pub max_tree_size: u32,
    /// Agents of the tenant holding a process at once; the others wait `queued`.
    pub max_concurrent: u32,
}

impl Quotas {
    /// Every key, in SPEC 9's order (the order `quota show` lists them in).
    pub const KEYS: [&'static str; 4] =
        ["max_depth", "max_fanout", "max_tree_size", "max_concurrent"];

    /// SPEC 9's defaults.
    pub const DEFAULTS: Quotas = Quotas {
        max_depth: 3,
        max_fanout: 8,
        max_tree_size: 64,
        max_concurrent: 16,
    };

    /// SPEC 9's ceilings.
    pub const CEILINGS: Quotas = Quotas {
        max_depth: 32,
        max_fanout: 1024,
        max_tree_size: 100_000,
        max_concurrent: 4096,
    };

    /// Each limit lowered to its ceiling when above it.
    pub fn clamp(self, ceilings: &Quotas) -> Quotas {
        Quotas {
            max_depth: self.max_depth.min(ceilings.max_depth),
            max_fanout: self.max_fanout.min(ceilings.max_fanout),
            max_tree_size: self.max_tree_size.min(ceilings.max_tree_size),
            max_concurrent: self.max_concurrent.min(ceilings.max_concurrent),
        }
    }

    /// The limit named `key`, `None` for an unknown key.
    pub fn get(&self, key: &str) -> Option<u32> {
        match key {
            "max_depth" => Some(self.max_depth),
            "max_fanout" => Some(self.max_fanout),
            "max_tree_size" => Some(self.max_tree_size),
            "max_concurrent" => Some(self.max_concurrent),
            _ => None,
        }
    }

    /// Sets the limit named `key`; an unknown key is an error naming it, and
    /// changes nothing.
    pub fn set(&mut self, key: &str, v: u32) -> Result<(), QuotaError> {
        let slot = match key {
            "max_depth" => &mut self.max_depth,
            "max_fanout" => &mut self.max_fanout,
            "max_tree_size" => &mut self.max_tree_size,
            "max_concurrent" => &mut self.max_concurrent,
            _ => return Err(unknown(key)),
        };
        *slot = v;
        Ok(())
    }

    /// `(key, value)` for every limit, in [`Quotas::KEYS`] order.
    pub fn pairs(&self) -> [(&'static str, u32); 4] {
        [
            ("max_depth", self.max_depth),
            ("max_fanout", self.max_fanout),
            ("max_tree_size", self.max_tree_size),
            ("max_concurrent", self.max_concurrent),
        ]
    }
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas::DEFAULTS
    }
}

/// A tenant's own values; `None` means "the platform default".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TenantQuotas {
    pub max_depth: Option<u32>,
    pub max_fanout: Option<u32>,
    pub max_tree_size: Option<u32>,
    pub max_concurrent: Option<u32>,
}

impl TenantQuotas {
    /// The override named `key` (`Ok(None)` when the tenant has none); an unknown
    /// key is an error naming it.
    pub fn get(&self, key: &str) -> Result<Option<u32>, QuotaError> {
        match key {
            "max_depth" => Ok(self.max_depth),
            "max_fanout" => Ok(self.max_fanout),
            "max_tree_size" => Ok(self.max_tree_size),
            "max_concurrent" => Ok(self.max_concurrent),
            _ => Err(unknown(key)),
        }
    }

    /// Sets the override named `key`; an unknown key is an error naming it, and
    /// changes nothing.
    pub fn set(&mut self, key: &str, v: u32) -> Result<(), QuotaError> {
        let slot = match key {
            "max_depth" => &mut self.max_depth,
            "max_fanout" => &mut self.max_fanout,
            "max_tree_size" => &mut self.max_tree_size,
            "max_concurrent" => &mut self.max_concurrent,
            _ => return Err(unknown(key)),
        };
        *slot = Some(v);
        Ok(())
    }

    /// `(key, override)` for every limit, in [`Quotas::KEYS`] order.
    pub fn pairs(&self) -> [(&'static str, Option<u32>); 4] {
        [
            ("max_depth", self.max_depth),
            ("max_fanout", self.max_fanout),
            ("max_tree_size", self.max_tree_size),
            ("max_concurrent", self.max_concurrent),
        ]
    }

    /// True when the tenant overrides nothing.
    pub fn is_empty(&self) -> bool {
        *self == TenantQuotas::default()
    }
}

/// The platform's quota configuration: what a tenant gets when it asks for
/// nothing (`defaults`), and the most it may ask for (`ceilings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuotaConfig {
    pub defaults: Quotas,
    pub ceilings: Quotas,
    /// `[quotas.models]`: each tenant's model calls a minute through the
    /// gateway (issue 31), all its agents' together, counted by each node
    /// for the calls it forwards (docs/models.md "Rate limits"); `None`
    /// is no limit. The same for every tenant: a tenant has no override
    /// of its own (`brood quota set` sets SPEC 9's four).
    pub models: ModelRate,
}

impl Default for QuotaConfig {
    /// SPEC 9's table.
    fn default() -> QuotaConfig {
        QuotaConfig {
            defaults: Quotas::DEFAULTS,
            ceilings: Quotas::CEILINGS,
            models: ModelRate::default(),
        }
    }
}

impl QuotaConfig {
    /// A configuration whose defaults are clamped to its ceilings, so a default
    /// never grants more than a tenant could ask for.
    pub fn new(defaults: Quotas, ceilings: Quotas) -> QuotaConfig {
        QuotaConfig {
            defaults: defaults.clamp(&ceilings),
            ceilings,
            models: ModelRate::default(),
        }
    }

    /// Builds the configuration from `(key, value)` pairs as a configuration file
    /// gives them: SPEC 9's table, with each pair replacing one entry (a later
    /// pair for the same key wins), then the defaults clamped to the ceilings.
    /// An unknown key is an error naming it and the list it was in.
    pub fn from_pairs(
        defaults: &[(&str, u32)],
        ceilings: &[(&str, u32)],
    ) -> Result<QuotaConfig, QuotaError> {
        let apply = |base: Quotas, pairs: &[(&str, u32)], within: &'static str| {
            let mut q = base;
            for &(key, v) in pairs {
                q.set(key, v).map_err(|_| QuotaError::UnknownKey {
                    key: key.to_owned(),
                    within: Some(within),
                })?;
            }
            Ok::<Quotas, QuotaError>(q)
        };
        let ceilings = apply(Quotas::CEILINGS, ceilings, "ceilings")?;
        let defaults = apply(Quotas::DEFAULTS, defaults, "defaults")?;
        Ok(QuotaConfig::new(defaults, ceilings))
    }

    /// The limits that apply to a tenant: its own value where it has one, the
    /// platform default elsewhere, every one clamped to the ceilings (a tenant may
    /// lower a limit freely but never raise it past the platform's ceiling).
    pub fn effective(&self, tenant_override: Option<&TenantQuotas>) -> Quotas {
        let o = tenant_override.copied().unwrap_or_default();
        let d = &self.defaults;
        Quotas {
            max_depth: o.max_depth.unwrap_or(d.max_depth),
            max_fanout: o.max_fanout.unwrap_or(d.max_fanout),
            max_tree_size: o.max_tree_size.unwrap_or(d.max_tree_size),
            max_concurrent: o.max_concurrent.unwrap_or(d.max_concurrent),
        }
        .clamp(&self.ceilings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_ceilings_are_spec_9s_table() {
        let table = [
            ("max_depth", 3, 32),
            ("max_fanout", 8, 1024),
            ("max_tree_size", 64, 100_000),
            ("max_concurrent", 16, 4096),
        ];
        for (key, default, ceiling) in table {
            assert_eq!(Quotas::DEFAULTS.get(key), Some(default), "{key}");
            assert_eq!(Quotas::CEILINGS.get(key), Some(ceiling), "{key}");
        }
        assert_eq!(Quotas::KEYS, table.map(|(k, _, _)| k));
        assert_eq!(Quotas::default(), Quotas::DEFAULTS);
        let c = QuotaConfig::default();
        assert_eq!(
            (c.defaults, c.ceilings),
            (Quotas::DEFAULTS, Quotas::CEILINGS)
        );
        assert_eq!(QuotaConfig::from_pairs(&[], &[]), Ok(c));
        assert_eq!(c.effective(None), Quotas::DEFAULTS);
    }

    #[test]
    fn get_and_set_use_exactly_the_spec_keys() {
        let mut q = Quotas::DEFAULTS;
        for (i, key) in Quotas::KEYS.iter().enumerate() {
            let v = 100 + u32::try_from(i).unwrap_or(0);
            q.set(key, v).unwrap();
            assert_eq!(q.get(key), Some(v));
        }
        assert_eq!(q.pairs().map(|(k, _)| k), Quotas::KEYS);
        let mut t = TenantQuotas::default();
        assert!(t.is_empty());
        t.set("max_fanout", 2).unwrap();
        assert_eq!(t.get("max_fanout"), Ok(Some(2)));
        assert_eq!(t.get("max_depth"), Ok(None));
        assert!(!t.is_empty());
    }

    #[test]
    fn unknown_keys_are_refused_by_name_and_change_nothing() {
        for key in ["depth", "MAX_DEPTH", "max_depth ", "", "max-fanout"] {
            let mut q = Quotas::DEFAULTS;
            let err = q.set(key, 1).unwrap_err();
            assert_eq!(q, Quotas::DEFAULTS);
            assert_eq!(q.get(key), None);
            let shown = err.to_string();
            assert!(shown.contains(&format!("{key:?}")), "{shown}");
            assert!(shown.contains("max_tree_size"), "{shown}");
            let mut t = TenantQuotas::default();
            assert_eq!(t.set(key, 1), Err(err.clone()));
            assert_eq!(t.get(key), Err(err));
            assert!(t.is_empty());
        }
        let err = QuotaConfig::from_pairs(&[("max_depht", 4)], &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown quota key \"max_depht\" in the defaults \
             (the keys are max_depth, max_fanout, max_tree_size, max_concurrent)"
        );
        let err = QuotaConfig::from_pairs(&[], &[("fanout", 4)]).unwrap_err();
        assert!(
            err.to_string().contains("\"fanout\" in the ceilings"),
            "{err}"
        );
    }

    #[test]
    fn clamp_lowers_only_what_is_above_the_ceiling() {
        let q = Quotas {
            max_depth: 40,
            max_fanout: 2,
            max_tree_size: 100_001,
            max_concurrent: 4096,
        };
        assert_eq!(
            q.clamp(&Quotas::CEILINGS),
            Quotas {
                max_depth: 32,
                max_fanout: 2,
                max_tree_size: 100_000,
                max_concurrent: 4096,
            }
        );
        assert_eq!(Quotas::DEFAULTS.clamp(&Quotas::CEILINGS), Quotas::DEFAULTS);
    }

    #[test]
    fn configured_defaults_are_clamped_to_configured_ceilings() {
        let c = QuotaConfig::from_pairs(
            &[("max_depth", 10), ("max_fanout", 500)],
            &[("max_fanout", 100), ("max_depth", 64)],
        )
        .unwrap();
        assert_eq!(c.ceilings.max_fanout, 100);
        assert_eq!(c.ceilings.max_depth, 64);
        assert_eq!(c.defaults.max_depth, 10);
        // Asked for 500, but the platform allows at most 100.
        assert_eq!(c.defaults.max_fanout, 100);
        assert_eq!(c.defaults.max_tree_size, 64);
        // A later pair for the same key wins.
        let c = QuotaConfig::from_pairs(&[("max_depth", 1), ("max_depth", 2)], &[]).unwrap();
        assert_eq!(c.defaults.max_depth, 2);
    }

    #[test]
    fn tenant_overrides_apply_clamped_and_fall_back_to_defaults() {
        let c = QuotaConfig::default();
        let t = TenantQuotas {
            max_depth: Some(1),
            max_fanout: Some(5000),
            max_tree_size: None,
            max_concurrent: Some(u32::MAX),
        };
        assert_eq!(
            c.effective(Some(&t)),
            Quotas {
                max_depth: 1,
                max_fanout: 1024,
                max_tree_size: 64,
                max_concurrent: 4096,
            }
        );
        assert_eq!(c.effective(Some(&TenantQuotas::default())), c.defaults);
        // Defaults set by hand above the ceilings are clamped too.
        let c = QuotaConfig {
            defaults: Quotas {
                max_depth: 99,
                ..Quotas::DEFAULTS
            },
            ceilings: Quotas::CEILINGS,
            models: ModelRate::default(),
        };
        assert_eq!(c.effective(None).max_depth, 32);
    }
}
