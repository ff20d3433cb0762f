//! The capability policy of SPEC 5: what an agent may do, as plain validated
//! values, and how a child's effective policy is derived from its parent's and
//! its request.
//!
//! This module is the model only. Reading JSON and TOML is `brood-proto`'s job
//! (`brood_proto::policy`); comparing a child with its parent is
//! [`crate::attenuation`]'s; enforcing a policy is the launcher's. Every value
//! that reaches a [`Policy`] has been checked once, here: paths are absolute and
//! normalised ([`AbsPath`]), mount lines follow SPEC 3 ([`MountEntry`]), rules
//! follow their grammar ([`Rule`]), and [`Policy::normalise`] refuses what the
//! types alone cannot (two rules for one path, a negative budget, an environment
//! name with `=`). Every refusal is a [`PolicyError`] naming the field and the
//! value that was wrong, because a policy is written by a person or by a model
//! and both need to know what to fix.
//!
//! # Absent means unlimited
//!
//! In a [`Policy`], an `Option` field that is `None` is the top of its lattice:
//! every tool, any model, no budget of its own, unlimited depth and creates, no
//! timeout, no resource limit. `window: None` is different: it means *unknown*,
//! and the attenuation check fails closed on it (see [`crate::attenuation`]).
//!
//! # Rules
//!
//! A rule is `allow <subject> <class>:<name> <perm>`, written with single spaces
//! (any run of spaces is accepted on input):
//!
//! - `subject` is `self` (the agent holding the policy), `agent:<name>` (another
//!   agent, by a valid agent name) or `*` (anyone);
//! - `class` is one of the fixed classes below; `name` is non-empty, has no
//!   whitespace or control characters, and `*` means every name of the class;
//! - `perm` is one of the class's fixed permissions:
//!
//! | class | permissions |
//! | --- | --- |
//! | `tool` | `use` |
//! | `model` | `use` |
//! | `shared` | `read write` |
//! | `session` | `read write` |
//! | `mount` | `read write` |
//! | `agent` | `create send wait close resume cancel` |
//! | `network` | `connect bind` |
//!
//! There are only `allow` rules, so rules form a set: [`Policy::normalise`]
//! sorts them and drops repeats. When one rule covers another is defined at
//! [`Rule::covers`].
//!
//! # Deriving a child's policy
//!
//! A request ([`PolicyRequest`]) gives any subset of the fields; [`effective`]
//! fills the rest from the parent (SPEC 5: "A policy file may give only some
//! fields; the others are inherited"), field by field, except:
//!
//! - `depth_limit` left out becomes the parent's minus one (a `None` parent
//!   stays `None`; 0 stays 0, which the check then refuses);
//! - `cost_limit` left out becomes `None`: the child reserves nothing and spends
//!   from its parent's unreserved budget. This is safe because spend rolls up the
//!   tree (SPEC 9): every dollar the child spends counts against every
//!   ancestor's limit, so the child can never spend more than its parent may.
//!   Inheriting the parent's limit instead would ask for a reservation the parent
//!   can almost never make (its own spend already counts against it);
//! - `resources` inherits each of its four limits separately, and
//!   `model_rate` each of its two: a child asking for nothing holds its
//!   parent's limits (counted over its own calls);
//! - `on_restart` is inherited like any field: a child of a resumable parent
//!   is resumable unless it asks `cancel`;
//! - `create_limit` and `timeout_s` are inherited verbatim here, and narrowed to
//!   what the parent has left by [`crate::attenuation::derive`], which needs the
//!   parent's live state (creates used, deadline) that a policy does not hold.
//!
//! # Secrets
//!
//! `secrets` names variables whose values the policy does not hold (issue
//! 25): a root's come from the caller that starts it (`brood run --secret
//! NAME` reads NAME from its own environment), a child's from its parent's
//! values, never from anyone else. So a policy, and everything written from
//! one (the store, the ctx tree, the API), holds only the names. A name is
//! in `env` or in `secrets`, never both. Like `env`, a request that gives
//! `secrets` replaces the parent's list, and one that leaves it out inherits
//! it; a child's names must be a subset of its parent's
//! ([`crate::attenuation`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

mod check;
mod parts;
#[cfg(test)]
mod tests;

use check::*;
pub use check::{PIDS_MAX, TIMEOUT_MAX, WHOLE_MAX, check_secret_value, check_var_name, check_word};
pub use parts::*;

/// A field of a policy that was wrong, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The field's path, for example `files[2].path` or `resources.memory_max`.
    pub field: String,
    /// What was wrong, starting with the refused value where there is one.
    pub message: String,
}

impl PolicyError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
        PolicyError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy field {}: {}", self.field, self.message)
    }
}

impl std::error::Error for PolicyError {}

/// An agent's effective policy: every field of SPEC 5, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Tools it may use; `None` is every tool (what an operator holds).
    pub tools: Option<BTreeSet<String>>,
    /// The deepest rule over a path decides; no rule means hidden.
    pub files: Vec<FileRule>,
    /// The mount table, in the order it is applied.
    pub mounts: Vec<MountEntry>,
    pub network: Network,
    /// Dollars this agent and its subtree may spend; `None` is no limit of its
    /// own (its ancestors' limits still apply, since spend rolls up).
    pub cost_limit: Option<f64>,
    /// Context window in tokens; `None` is unknown.
    pub window: Option<u64>,
    /// Generations allowed below this agent; `None` is unlimited.
    pub depth_limit: Option<u32>,
    /// Children it may create in total; `None` is unlimited.
    pub create_limit: Option<u32>,
    /// Wall time of one run in seconds; `None` is none.
    pub timeout_s: Option<u64>,
    pub resources: Resources,
    /// Limits on its model calls (issue 31); each `None` is none of its own.
    pub model_rate: ModelRate,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: BTreeSet<u32>,
    /// Variables passed in, after brood's own (SPEC 5).
    pub env: BTreeMap<String, String>,
    /// Variables passed in whose values are not in the policy (issue 25):
    /// names only. A root's values come from its caller at launch, a
    /// child's from its parent's; the supervisor holds them in memory and
    /// writes them nowhere. See "Secrets" in the module docs.
    pub secrets: BTreeSet<String>,
    /// Models it may use; `None` is any.
    pub models: Option<BTreeSet<String>>,
    /// Ordered tool tiers (`a:b:c` split).
    pub path: Vec<String>,
    pub rules: Vec<Rule>,
    /// What a start after its supervisor died does with it (issue 29).
    pub on_restart: OnRestart,
}

impl Policy {
    /// What the operator holds (SPEC 5's default root): every tool, `/`
    /// read-write (the kernel still applies the operator's own permissions),
    /// network `all`, no limits, window unknown, no mounts (the host's own
    /// view), an empty `env` and `path`, no rules, `on_restart: cancel` (the
    /// default; a root asks `resume` by giving it, which the runtime lets it
    /// hold, as it does a root's `env`). The runtime fills in what its
    /// configuration adds (a default root policy, the environment it passes).
    pub fn operator(uid: u32, gid: u32, groups: BTreeSet<u32>) -> Policy {
        Policy {
            tools: None,
            files: vec![FileRule {
                path: AbsPath::root(),
                mode: Mode::Rw,
            }],
            mounts: Vec::new(),
            network: Network::All,
            cost_limit: None,
            window: None,
            depth_limit: None,
            create_limit: None,
            timeout_s: None,
            resources: Resources::default(),
            model_rate: ModelRate::default(),
            uid,
            gid,
            groups,
            env: BTreeMap::new(),
            secrets: BTreeSet::new(),
            models: None,
            path: Vec::new(),
            rules: Vec::new(),
            on_restart: OnRestart::Cancel,
        }
    }

    /// The mode at `p`: the mode of the deepest rule whose path is `p` or an
    /// ancestor of it; hidden when there is none. (A policy that was not
    /// normalised may have two rules for one path; the later one wins.)
    pub fn mode_at(&self, p: &AbsPath) -> Mode {
        self.files
            .iter()
            .filter(|r| p.is_within(&r.path))
            .max_by_key(|r| r.path.depth())
            .map_or(Mode::Hidden, |r| r.mode)
    }

    /// Checks every field and puts it in canonical form: file rules sorted by
    /// path, rules sorted without repeats. Refuses what the types allow but a
    /// policy must not hold (see the `check_*` functions of this module).
    pub fn normalise(self) -> Result<Policy, PolicyError> {
        if let Some(tools) = &self.tools {
            check_words("tools", tools)?;
        }
        let files = normalise_files(self.files)?;
        check_mounts(&self.mounts)?;
        check_network(&self.network)?;
        check_cost_limit(self.cost_limit)?;
        check_window(self.window)?;
        check_timeout(self.timeout_s)?;
        check_resources(&self.resources)?;
        check_model_rate(&self.model_rate)?;
        check_ids(Some(self.uid), Some(self.gid), Some(&self.groups))?;
        check_env(&self.env)?;
        check_secrets(&self.secrets, Some(&self.env))?;
        if let Some(models) = &self.models {
            check_words("models", models)?;
        }
        check_path(&self.path)?;
        let rules = normalise_rules(self.rules)?;
        Ok(Policy {
            files,
            rules,
            ..self
        })
    }
}

/// What a request gives: any subset of the fields; `None` means "inherit from
/// the parent" (see [`effective`]). There is no way to ask for "unlimited":
/// only an unlimited parent could grant it, and then inheriting gives it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PolicyRequest {
    pub tools: Option<BTreeSet<String>>,
    pub files: Option<Vec<FileRule>>,
    pub mounts: Option<Vec<MountEntry>>,
    pub network: Option<Network>,
    pub cost_limit: Option<f64>,
    pub window: Option<u64>,
    pub depth_limit: Option<u32>,
    pub create_limit: Option<u32>,
    pub timeout_s: Option<u64>,
    /// Each limit given replaces the parent's; each left out (`None`) is
    /// inherited.
    pub resources: Resources,
    /// Each limit given replaces the parent's; each left out is inherited.
    pub model_rate: ModelRate,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Option<BTreeSet<u32>>,
    /// Replaces the parent's environment as a whole when given.
    pub env: Option<BTreeMap<String, String>>,
    /// Replaces the parent's secret names as a whole when given.
    pub secrets: Option<BTreeSet<String>>,
    pub models: Option<BTreeSet<String>>,
    pub path: Option<Vec<String>>,
    pub rules: Option<Vec<Rule>>,
    pub on_restart: Option<OnRestart>,
}

impl PolicyRequest {
    /// The same checks and canonical form as [`Policy::normalise`], for the
    /// fields the request gives. A request that passes yields, with a
    /// normalised parent, a normalised effective policy.
    pub fn normalise(self) -> Result<PolicyRequest, PolicyError> {
        if let Some(tools) = &self.tools {
            check_words("tools", tools)?;
        }
        let files = self.files.map(normalise_files).transpose()?;
        if let Some(mounts) = &self.mounts {
            check_mounts(mounts)?;
        }
        if let Some(network) = &self.network {
            check_network(network)?;
        }
        check_cost_limit(self.cost_limit)?;
        check_window(self.window)?;
        check_timeout(self.timeout_s)?;
        check_resources(&self.resources)?;
        check_model_rate(&self.model_rate)?;
        check_ids(self.uid, self.gid, self.groups.as_ref())?;
        if let Some(env) = &self.env {
            check_env(env)?;
        }
        if let Some(secrets) = &self.secrets {
            check_secrets(secrets, self.env.as_ref())?;
        }
        if let Some(models) = &self.models {
            check_words("models", models)?;
        }
        if let Some(path) = &self.path {
            check_path(path)?;
        }
        let rules = self.rules.map(normalise_rules).transpose()?;
        Ok(PolicyRequest {
            files,
            rules,
            ..self
        })
    }
}

/// The policy a child gets from `parent` and its request `req` (module docs,
/// "Deriving a child's policy"). This is inheritance only; whether the result
/// is within the parent is [`crate::attenuation::check`]'s question.
pub fn effective(parent: &Policy, req: &PolicyRequest) -> Policy {
    let r = &req.resources;
    let p = &parent.resources;
    let (rr, pr) = (&req.model_rate, &parent.model_rate);
    Policy {
        tools: req.tools.clone().or_else(|| parent.tools.clone()),
        files: req.files.clone().unwrap_or_else(|| parent.files.clone()),
        mounts: req.mounts.clone().unwrap_or_else(|| parent.mounts.clone()),
        network: req
            .network
            .clone()
            .unwrap_or_else(|| parent.network.clone()),
        cost_limit: req.cost_limit,
        window: req.window.or(parent.window),
        depth_limit: req
            .depth_limit
            .or(parent.depth_limit.map(|d| d.saturating_sub(1))),
        create_limit: req.create_limit.or(parent.create_limit),
        timeout_s: req.timeout_s.or(parent.timeout_s),
        resources: Resources {
            memory_max: r.memory_max.or(p.memory_max),
            pids_max: r.pids_max.or(p.pids_max),
            cpu_weight: r.cpu_weight.or(p.cpu_weight),
            disk_max: r.disk_max.or(p.disk_max),
        },
        model_rate: ModelRate {
            requests_per_minute: rr.requests_per_minute.or(pr.requests_per_minute),
            tokens_per_minute: rr.tokens_per_minute.or(pr.tokens_per_minute),
        },
        uid: req.uid.unwrap_or(parent.uid),
        gid: req.gid.unwrap_or(parent.gid),
        groups: req.groups.clone().unwrap_or_else(|| parent.groups.clone()),
        env: req.env.clone().unwrap_or_else(|| parent.env.clone()),
        secrets: req
            .secrets
            .clone()
            .unwrap_or_else(|| parent.secrets.clone()),
        models: req.models.clone().or_else(|| parent.models.clone()),
        path: req.path.clone().unwrap_or_else(|| parent.path.clone()),
        rules: req.rules.clone().unwrap_or_else(|| parent.rules.clone()),
        on_restart: req.on_restart.unwrap_or(parent.on_restart),
    }
}
