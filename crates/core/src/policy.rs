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
//! - `resources` inherits each of its three limits separately;
//! - `create_limit` and `timeout_s` are inherited verbatim here, and narrowed to
//!   what the parent has left by [`crate::attenuation::derive`], which needs the
//!   parent's live state (creates used, deadline) that a policy does not hold.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::name::AgentName;

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

/// How much of a path an agent may touch. Ordered: `Hidden < Ro < Rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nothing: not even its existence may be learned.
    Hidden,
    /// Read and list.
    Ro,
    /// Everything.
    Rw,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Hidden, Mode::Ro, Mode::Rw];

    pub fn parse(field: &str, s: &str) -> Result<Mode, PolicyError> {
        match s {
            "hidden" => Ok(Mode::Hidden),
            "ro" => Ok(Mode::Ro),
            "rw" => Ok(Mode::Rw),
            _ => Err(PolicyError::new(
                field,
                format!("{s:?}: must be hidden, ro or rw"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Hidden => "hidden",
            Mode::Ro => "ro",
            Mode::Rw => "rw",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The longest path accepted, in bytes: Linux's `PATH_MAX` less its NUL.
const MAX_PATH: usize = 4095;

/// A normalised absolute path: starts with `/`, no empty, `.` or `..`
/// components, no trailing `/` (except the root itself), no control characters.
///
/// `.` and `..` are refused rather than resolved: a policy is compared
/// component-wise with other policies and handed to the kernel, and a path that
/// means something other than it says is how a sandbox is escaped. Control
/// characters are refused because paths are written one per line (and tab
/// separated) in the ctx tree's control files.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbsPath(String);

impl AbsPath {
    /// Checks and normalises `s`; `field` names where it came from in errors.
    /// Repeated slashes collapse and a trailing slash is dropped, since neither
    /// changes which file is meant.
    pub fn new(field: &str, s: &str) -> Result<AbsPath, PolicyError> {
        let err = |rule: &str| PolicyError::new(field, format!("{s:?}: {rule}"));
        if !s.starts_with('/') {
            return Err(err("must be an absolute path (start with \"/\")"));
        }
        if s.chars().any(char::is_control) {
            return Err(err("control characters are not allowed"));
        }
        let mut out = String::with_capacity(s.len());
        for c in s.split('/').filter(|c| !c.is_empty()) {
            match c {
                "." => return Err(err("\".\" is not allowed")),
                ".." => return Err(err("\"..\" is not allowed")),
                _ => {
                    out.push('/');
                    out.push_str(c);
                }
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        if out.len() > MAX_PATH {
            return Err(err("must be at most 4095 bytes"));
        }
        Ok(AbsPath(out))
    }

    /// `/`.
    pub fn root() -> AbsPath {
        AbsPath("/".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components, outermost first; none for `/`.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// How many components the path has: 0 for `/`.
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// Whether `self` is `ancestor` or lies below it, comparing whole
    /// components (so `/ab` is not within `/a`). Everything is within `/`.
    pub fn is_within(&self, ancestor: &AbsPath) -> bool {
        ancestor.0 == "/"
            || (self.0.starts_with(&ancestor.0)
                && matches!(self.0.as_bytes().get(ancestor.0.len()), None | Some(b'/')))
    }

    /// The path one component up; `None` for `/`.
    pub fn parent(&self) -> Option<AbsPath> {
        if self.0 == "/" {
            return None;
        }
        match self.0.rfind('/') {
            Some(0) | None => Some(AbsPath::root()),
            Some(i) => Some(AbsPath(self.0[..i].to_owned())),
        }
    }
}

impl fmt::Display for AbsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AbsPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// One `files` rule: `mode` applies at `path` and below, until a deeper rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileRule {
    pub path: AbsPath,
    pub mode: Mode,
}

/// The options of a mount table entry (SPEC 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MountOpts {
    pub bind: bool,
    pub rbind: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl MountOpts {
    /// The option words, in the order [`MountOpts::words`] writes them.
    pub const WORDS: [&'static str; 5] = ["bind", "rbind", "nosuid", "nodev", "noexec"];

    /// Reads option words (without the `-` that stands for none): each from
    /// [`MountOpts::WORDS`], none repeated, not both `bind` and `rbind`.
    pub fn from_words<'a>(
        field: &str,
        words: impl IntoIterator<Item = &'a str>,
    ) -> Result<MountOpts, PolicyError> {
        let mut opts = MountOpts::default();
        for w in words {
            let flag = match w {
                "bind" => &mut opts.bind,
                "rbind" => &mut opts.rbind,
                "nosuid" => &mut opts.nosuid,
                "nodev" => &mut opts.nodev,
                "noexec" => &mut opts.noexec,
                _ => {
                    return Err(PolicyError::new(
                        field,
                        format!("{w:?} is not a mount option (bind rbind nosuid nodev noexec)"),
                    ));
                }
            };
            if *flag {
                return Err(PolicyError::new(field, format!("{w:?} is given twice")));
            }
            *flag = true;
        }
        if opts.bind && opts.rbind {
            return Err(PolicyError::new(
                field,
                "\"bind\" and \"rbind\" exclude each other",
            ));
        }
        Ok(opts)
    }

    /// The set options in canonical order.
    pub fn words(&self) -> Vec<&'static str> {
        let flags = [self.bind, self.rbind, self.nosuid, self.nodev, self.noexec];
        MountOpts::WORDS
            .iter()
            .zip(flags)
            .filter(|(_, on)| *on)
            .map(|(w, _)| *w)
            .collect()
    }
}

/// One line of the mount table (SPEC 3): bind `source` at `target`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MountEntry {
    pub source: AbsPath,
    pub target: AbsPath,
    /// `rw` when true, `ro` when false.
    pub rw: bool,
    pub opts: MountOpts,
}

impl MountEntry {
    /// Reads `source<TAB>target<TAB>ro|rw<TAB>options`, options a comma list or
    /// `-`. Errors name `field` and, where it helps, the part
    /// (`{field}.source`, `.target`, `.mode`, `.options`).
    pub fn parse_line(field: &str, line: &str) -> Result<MountEntry, PolicyError> {
        let parts: Vec<&str> = line.split('\t').collect();
        let [source, target, mode, options] = parts.as_slice() else {
            return Err(PolicyError::new(
                field,
                format!(
                    "{line:?}: must be source<TAB>target<TAB>ro|rw<TAB>options, \
                     found {} tab-separated fields",
                    parts.len()
                ),
            ));
        };
        let source = AbsPath::new(&format!("{field}.source"), source)?;
        let target = AbsPath::new(&format!("{field}.target"), target)?;
        let rw = match *mode {
            "ro" => false,
            "rw" => true,
            other => {
                return Err(PolicyError::new(
                    format!("{field}.mode"),
                    format!("{other:?}: must be ro or rw"),
                ));
            }
        };
        let opts = match *options {
            "-" => MountOpts::default(),
            "" => {
                return Err(PolicyError::new(
                    format!("{field}.options"),
                    "\"\": write - for no options",
                ));
            }
            list => MountOpts::from_words(&format!("{field}.options"), list.split(','))?,
        };
        Ok(MountEntry {
            source,
            target,
            rw,
            opts,
        })
    }

    /// The SPEC 3 line, options in canonical order; `parse_line` reads it back.
    pub fn to_line(&self) -> String {
        let words = self.opts.words();
        let options = if words.is_empty() {
            "-".to_owned()
        } else {
            words.join(",")
        };
        format!(
            "{}\t{}\t{}\t{}",
            self.source,
            self.target,
            if self.rw { "rw" } else { "ro" },
            options
        )
    }
}

/// Outbound network access. Ordered by width: `None < Connect(S) < All`, and
/// `Connect(S) <= Connect(T)` when `S` is a subset of `T`. `None` also gets an
/// empty network namespace under `iso = ns`, so it is narrower than
/// `Connect` with no ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Network {
    None,
    /// TCP connect to these ports only.
    Connect(BTreeSet<u16>),
    All,
}

impl Network {
    /// Whether `self` is no wider than `parent`.
    pub fn is_within(&self, parent: &Network) -> bool {
        match (self, parent) {
            (Network::None, _) | (_, Network::All) => true,
            (Network::Connect(c), Network::Connect(p)) => c.is_subset(p),
            _ => false,
        }
    }
}

/// Cgroup limits; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    /// Bytes (`memory.max`).
    pub memory_max: Option<u64>,
    /// Processes and threads (`pids.max`).
    pub pids_max: Option<u64>,
    /// Relative CPU share, 1 to 10000 (`cpu.weight`).
    pub cpu_weight: Option<u64>,
}

/// The classes of a [`Rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleClass {
    Tool,
    Model,
    Shared,
    Session,
    Mount,
    Agent,
    Network,
}

impl RuleClass {
    pub const ALL: [RuleClass; 7] = [
        RuleClass::Tool,
        RuleClass::Model,
        RuleClass::Shared,
        RuleClass::Session,
        RuleClass::Mount,
        RuleClass::Agent,
        RuleClass::Network,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RuleClass::Tool => "tool",
            RuleClass::Model => "model",
            RuleClass::Shared => "shared",
            RuleClass::Session => "session",
            RuleClass::Mount => "mount",
            RuleClass::Agent => "agent",
            RuleClass::Network => "network",
        }
    }

    pub fn parse(s: &str) -> Option<RuleClass> {
        RuleClass::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The permissions a rule of this class may grant (the table in the module
    /// docs).
    pub fn perms(self) -> &'static [&'static str] {
        match self {
            RuleClass::Tool | RuleClass::Model => &["use"],
            RuleClass::Shared | RuleClass::Session | RuleClass::Mount => &["read", "write"],
            RuleClass::Agent => &["create", "send", "wait", "close", "resume", "cancel"],
            RuleClass::Network => &["connect", "bind"],
        }
    }
}

impl fmt::Display for RuleClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule, `allow <subject> <class>:<name> <perm>` (grammar in the module
/// docs). The fields are public for matching; [`Policy::normalise`] re-checks
/// rules built by hand.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// `self`, `agent:<name>` or `*`.
    pub subject: String,
    pub class: RuleClass,
    /// The object's name within its class, or `*` for all of them.
    pub name: String,
    pub perm: String,
}

impl Rule {
    pub fn parse(field: &str, s: &str) -> Result<Rule, PolicyError> {
        let err = |rule: String| PolicyError::new(field, format!("{s:?}: {rule}"));
        if s.chars().any(char::is_control) {
            return Err(err("control characters are not allowed".into()));
        }
        let words: Vec<&str> = s.split_whitespace().collect();
        let [allow, subject, object, perm] = words.as_slice() else {
            return Err(err(
                "must be `allow <subject> <class>:<name> <perm>` (four words)".into(),
            ));
        };
        if *allow != "allow" {
            return Err(err(format!(
                "must start with \"allow\" (the only kind of rule), not {allow:?}"
            )));
        }
        if let Some(agent) = subject.strip_prefix("agent:") {
            if let Err(e) = AgentName::new(agent) {
                return Err(err(format!("subject {subject:?}: {}", e.rule)));
            }
        } else if *subject != "self" && *subject != "*" {
            return Err(err(format!(
                "subject {subject:?} must be self, agent:<name> or *"
            )));
        }
        let Some((class, name)) = object.split_once(':') else {
            return Err(err(format!("{object:?} must be <class>:<name>")));
        };
        let Some(class) = RuleClass::parse(class) else {
            return Err(err(format!(
                "class {class:?} must be one of tool model shared session mount agent network"
            )));
        };
        if name.is_empty() {
            return Err(err(format!("{object:?}: the name must not be empty")));
        }
        if !class.perms().contains(perm) {
            return Err(err(format!(
                "{perm:?} is not a permission of class {class} ({})",
                class.perms().join(" ")
            )));
        }
        Ok(Rule {
            subject: (*subject).to_owned(),
            class,
            name: name.to_owned(),
            perm: (*perm).to_owned(),
        })
    }

    /// The canonical text; [`Rule::parse`] reads it back.
    pub fn to_text(&self) -> String {
        format!(
            "allow {} {}:{} {}",
            self.subject, self.class, self.name, self.perm
        )
    }

    /// Whether `self` (a parent's rule) covers `other` (a child's): same class,
    /// same permission, and `self`'s subject and name each either equal
    /// `other`'s or are `*`. So `allow * tool:* use` covers every `tool … use`
    /// rule, but a child's `*` is covered only by a parent's `*`. Subjects are
    /// compared as written: `self` in the parent's rule means the parent, in the
    /// child's the child, and a child holds only what its parent held, so the
    /// parent's `self` grant covers the child's.
    pub fn covers(&self, other: &Rule) -> bool {
        self.class == other.class
            && self.perm == other.perm
            && (self.subject == "*" || self.subject == other.subject)
            && (self.name == "*" || self.name == other.name)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

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
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: BTreeSet<u32>,
    /// Variables passed in, after brood's own (SPEC 5).
    pub env: BTreeMap<String, String>,
    /// Models it may use; `None` is any.
    pub models: Option<BTreeSet<String>>,
    /// Ordered tool tiers (`a:b:c` split).
    pub path: Vec<String>,
    pub rules: Vec<Rule>,
}

impl Policy {
    /// What the operator holds (SPEC 5's default root): every tool, `/`
    /// read-write (the kernel still applies the operator's own permissions),
    /// network `all`, no limits, window unknown, no mounts (the host's own
    /// view), an empty `env` and `path`, no rules. The runtime fills in what its
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
            uid,
            gid,
            groups,
            env: BTreeMap::new(),
            models: None,
            path: Vec::new(),
            rules: Vec::new(),
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
        check_env(&self.env)?;
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
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Option<BTreeSet<u32>>,
    /// Replaces the parent's environment as a whole when given.
    pub env: Option<BTreeMap<String, String>>,
    pub models: Option<BTreeSet<String>>,
    pub path: Option<Vec<String>>,
    pub rules: Option<Vec<Rule>>,
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
        if let Some(env) = &self.env {
            check_env(env)?;
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
        },
        uid: req.uid.unwrap_or(parent.uid),
        gid: req.gid.unwrap_or(parent.gid),
        groups: req.groups.clone().unwrap_or_else(|| parent.groups.clone()),
        env: req.env.clone().unwrap_or_else(|| parent.env.clone()),
        models: req.models.clone().or_else(|| parent.models.clone()),
        path: req.path.clone().unwrap_or_else(|| parent.path.clone()),
        rules: req.rules.clone().unwrap_or_else(|| parent.rules.clone()),
    }
}

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

fn check_words(field: &str, set: &BTreeSet<String>) -> Result<(), PolicyError> {
    set.iter().try_for_each(|s| check_word(field, s))
}

/// Refuses two rules for one path (which would make the deepest rule
/// ambiguous), naming both by their index as given; then sorts by path.
fn normalise_files(mut files: Vec<FileRule>) -> Result<Vec<FileRule>, PolicyError> {
    let mut seen: BTreeMap<&AbsPath, usize> = BTreeMap::new();
    for (i, r) in files.iter().enumerate() {
        if let Some(first) = seen.insert(&r.path, i) {
            return Err(PolicyError::new(
                format!("files[{i}].path"),
                format!("{:?}: files[{first}] already has a rule for it", r.path.0),
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
fn check_mounts(mounts: &[MountEntry]) -> Result<(), PolicyError> {
    for (j, later) in mounts.iter().enumerate() {
        for (i, earlier) in mounts[..j].iter().enumerate() {
            if later.target == earlier.target {
                return Err(PolicyError::new(
                    format!("mounts[{j}].target"),
                    format!(
                        "{:?}: mounts[{i}] already mounts at this target",
                        later.target.0
                    ),
                ));
            }
            if earlier.target.is_within(&later.target) {
                return Err(PolicyError::new(
                    format!("mounts[{j}].target"),
                    format!(
                        "{:?}: would cover mounts[{i}] at {:?}; list it before mounts[{i}]",
                        later.target.0, earlier.target.0
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_network(network: &Network) -> Result<(), PolicyError> {
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

fn check_cost_limit(cost: Option<f64>) -> Result<(), PolicyError> {
    match cost {
        Some(c) if !(c.is_finite() && c >= 0.0) => Err(PolicyError::new(
            "cost_limit",
            format!("{c}: must be a finite number of dollars, at least 0"),
        )),
        _ => Ok(()),
    }
}

fn check_window(window: Option<u64>) -> Result<(), PolicyError> {
    if window == Some(0) {
        return Err(PolicyError::new("window", "0: must be at least 1 token"));
    }
    Ok(())
}

fn check_timeout(timeout: Option<u64>) -> Result<(), PolicyError> {
    if timeout == Some(0) {
        return Err(PolicyError::new(
            "timeout_s",
            "0: must be at least 1 second (leave it out for no timeout)",
        ));
    }
    Ok(())
}

/// cgroup v2 `cpu.weight` accepts 1 to 10000.
const CPU_WEIGHT_MAX: u64 = 10_000;

fn check_resources(r: &Resources) -> Result<(), PolicyError> {
    // A limit of 0 memory or 0 processes could never start the agent; say so
    // now rather than as a confusing failure at launch.
    if r.memory_max == Some(0) {
        return Err(PolicyError::new(
            "resources.memory_max",
            "0: must be at least 1 byte (leave it out for no limit)",
        ));
    }
    if r.pids_max == Some(0) {
        return Err(PolicyError::new(
            "resources.pids_max",
            "0: must be at least 1 (leave it out for no limit)",
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
    Ok(())
}

/// Names must be usable in `KEY=VALUE` lines and in `execve`'s environment: not
/// empty, no `=`, no whitespace or control characters (NUL included). Values
/// may hold anything but NUL (which `execve` cannot carry) and newline (which
/// would split the `env` control file's line).
fn check_env(env: &BTreeMap<String, String>) -> Result<(), PolicyError> {
    for (k, v) in env {
        if k.is_empty() {
            return Err(PolicyError::new("env", "\"\": a name must not be empty"));
        }
        if k.contains('=') || k.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(PolicyError::new(
                "env",
                format!("{k:?}: a name must not contain \"=\", whitespace or control characters"),
            ));
        }
        // The runtime sets these itself; one given here would be dropped at
        // launch, so it is refused where the mistake is made.
        if k.starts_with("BROOD_") || k.starts_with("CTX_") {
            return Err(PolicyError::new(
                format!("env.{k}"),
                "BROOD_* and CTX_* are set by the runtime (the agent's identity); choose another name",
            ));
        }
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

/// A tier of `path` is a word that may not hold `:` (the separator of the
/// `a:b:c` form); a tier may appear once.
fn check_path(path: &[String]) -> Result<(), PolicyError> {
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
fn normalise_rules(mut rules: Vec<Rule>) -> Result<Vec<Rule>, PolicyError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> AbsPath {
        AbsPath::new("test", s).unwrap()
    }

    #[test]
    fn paths_are_normalised() {
        for (input, want) in [
            ("/", "/"),
            ("//", "/"),
            ("/a", "/a"),
            ("/a/", "/a"),
            ("//a//b///", "/a/b"),
            ("/a/.../b", "/a/.../b"),
            ("/a/.b/c.", "/a/.b/c."),
        ] {
            assert_eq!(p(input).as_str(), want, "{input:?}");
        }
    }

    #[test]
    fn bad_paths_are_refused_naming_the_field_and_value() {
        let e = AbsPath::new("files[2].path", "/a/../b").unwrap_err();
        assert_eq!(e.field, "files[2].path");
        assert_eq!(
            e.to_string(),
            r#"policy field files[2].path: "/a/../b": ".." is not allowed"#
        );
        for (bad, rule) in [
            ("", "must be an absolute path"),
            ("a/b", "must be an absolute path"),
            ("/a/./b", "\".\" is not allowed"),
            ("/.", "\".\" is not allowed"),
            ("/..", "\"..\" is not allowed"),
            ("/a\0b", "control characters"),
            ("/a\nb", "control characters"),
            ("/a\tb", "control characters"),
            ("/a\u{7f}", "control characters"),
        ] {
            let e = AbsPath::new("f", bad).unwrap_err();
            assert!(e.message.contains(rule), "{bad:?}: {e}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATH));
        assert!(AbsPath::new("f", &long).is_err());
    }

    #[test]
    fn within_compares_whole_components() {
        assert!(p("/a/b").is_within(&p("/a")));
        assert!(p("/a").is_within(&p("/a")));
        assert!(p("/a").is_within(&p("/")));
        assert!(p("/").is_within(&p("/")));
        assert!(!p("/ab").is_within(&p("/a")));
        assert!(!p("/a").is_within(&p("/a/b")));
        assert!(!p("/").is_within(&p("/a")));
        assert_eq!(p("/a/b").parent(), Some(p("/a")));
        assert_eq!(p("/a").parent(), Some(p("/")));
        assert_eq!(p("/").parent(), None);
        assert_eq!(p("/a/b").components().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(p("/").depth(), 0);
    }

    #[test]
    fn the_deepest_rule_decides_and_no_rule_is_hidden() {
        let mut pol = Policy::operator(0, 0, BTreeSet::new());
        pol.files = vec![
            FileRule {
                path: p("/a/b"),
                mode: Mode::Hidden,
            },
            FileRule {
                path: p("/a"),
                mode: Mode::Ro,
            },
            FileRule {
                path: p("/a/b/c"),
                mode: Mode::Rw,
            },
        ];
        assert_eq!(pol.mode_at(&p("/")), Mode::Hidden);
        assert_eq!(pol.mode_at(&p("/x")), Mode::Hidden);
        assert_eq!(pol.mode_at(&p("/a")), Mode::Ro);
        assert_eq!(pol.mode_at(&p("/ab")), Mode::Hidden);
        assert_eq!(pol.mode_at(&p("/a/x")), Mode::Ro);
        assert_eq!(pol.mode_at(&p("/a/b")), Mode::Hidden);
        assert_eq!(pol.mode_at(&p("/a/b/x")), Mode::Hidden);
        assert_eq!(pol.mode_at(&p("/a/b/c/d")), Mode::Rw);
        assert!(Mode::Hidden < Mode::Ro && Mode::Ro < Mode::Rw);
        assert_eq!(Mode::parse("m", "ro").unwrap(), Mode::Ro);
        assert_eq!(
            Mode::parse("files[1].mode", "RO").unwrap_err().to_string(),
            r#"policy field files[1].mode: "RO": must be hidden, ro or rw"#
        );
    }

    #[test]
    fn mount_lines_round_trip() {
        for line in [
            "/src\t/dst\tro\t-",
            "/\t/\trw\trbind,nosuid,nodev,noexec",
            "/a\t/b\tro\tbind,noexec",
        ] {
            let m = MountEntry::parse_line("mounts[0]", line).unwrap();
            assert_eq!(m.to_line(), line);
        }
        let m = MountEntry::parse_line("m", "/a//\t/b/\tro\tnoexec,bind").unwrap();
        assert_eq!(m.to_line(), "/a\t/b\tro\tbind,noexec");
    }

    #[test]
    fn bad_mount_lines_are_refused_naming_the_part() {
        for (line, field, rule) in [
            ("/a\t/b\tro", "mounts[3]", "found 3 tab-separated fields"),
            ("/a /b ro -", "mounts[3]", "found 1 tab-separated fields"),
            ("/a\t/b\tro\t-\t-", "mounts[3]", "found 5"),
            (
                "/a/../x\t/b\tro\t-",
                "mounts[3].source",
                "\"..\" is not allowed",
            ),
            ("/a\tb\tro\t-", "mounts[3].target", "absolute"),
            (
                "/a\t/b/.\tro\t-",
                "mounts[3].target",
                "\".\" is not allowed",
            ),
            ("/a\t/b\tRW\t-", "mounts[3].mode", "must be ro or rw"),
            (
                "/a\t/b\tro\t",
                "mounts[3].options",
                "write - for no options",
            ),
            ("/a\t/b\tro\tbind,bind", "mounts[3].options", "given twice"),
            (
                "/a\t/b\tro\tbind,rbind",
                "mounts[3].options",
                "exclude each other",
            ),
            (
                "/a\t/b\tro\tsuid",
                "mounts[3].options",
                "not a mount option",
            ),
            (
                "/a\t/b\tro\t-,bind",
                "mounts[3].options",
                "not a mount option",
            ),
            (
                "/a\t/b\tro\tbind,",
                "mounts[3].options",
                "not a mount option",
            ),
        ] {
            let e = MountEntry::parse_line("mounts[3]", line).unwrap_err();
            assert_eq!(e.field, field, "{line:?}: {e}");
            assert!(e.message.contains(rule), "{line:?}: {e}");
        }
    }

    #[test]
    fn rules_follow_the_grammar() {
        for text in [
            "allow self tool:shell use",
            "allow * model:* use",
            "allow agent:rev-1 shared:notes write",
            "allow self session:default read",
            "allow self mount:/work read",
            "allow self agent:* resume",
            "allow self network:443 connect",
            "allow self network:8080 bind",
        ] {
            let r = Rule::parse("rules[0]", text).unwrap();
            assert_eq!(r.to_text(), text);
        }
        let r = Rule::parse("r", "  allow   self  tool:a:b   use ").unwrap();
        assert_eq!(r.name, "a:b");
        assert_eq!(r.to_text(), "allow self tool:a:b use");
        for (bad, rule) in [
            ("", "four words"),
            ("allow self tool:x", "four words"),
            ("deny self tool:x use", "must start with \"allow\""),
            ("allow me tool:x use", "must be self, agent:<name> or *"),
            (
                "allow agent:../x tool:x use",
                "must start with a letter or digit",
            ),
            ("allow self tool use", "must be <class>:<name>"),
            ("allow self file:x read", "class \"file\""),
            ("allow self tool: use", "must not be empty"),
            (
                "allow self tool:x read",
                "not a permission of class tool (use)",
            ),
            (
                "allow self agent:x spawn",
                "not a permission of class agent",
            ),
            ("allow self tool:x\0 use", "control characters"),
        ] {
            let e = Rule::parse("rules[4]", bad).unwrap_err();
            assert_eq!(e.field, "rules[4]");
            assert!(e.message.contains(rule), "{bad:?}: {e}");
        }
    }

    #[test]
    fn coverage_is_class_perm_and_subject_and_name_equal_or_star() {
        let r = |s: &str| Rule::parse("r", s).unwrap();
        let child = r("allow self tool:shell use");
        assert!(r("allow self tool:shell use").covers(&child));
        assert!(r("allow self tool:* use").covers(&child));
        assert!(r("allow * tool:shell use").covers(&child));
        assert!(r("allow * tool:* use").covers(&child));
        assert!(!r("allow agent:a tool:shell use").covers(&child));
        assert!(!r("allow self model:shell use").covers(&child));
        assert!(!r("allow self tool:sh use").covers(&child));
        assert!(!r("allow self shared:x read").covers(&r("allow self shared:x write")));
        assert!(!r("allow self tool:shell use").covers(&r("allow self tool:* use")));
        assert!(!r("allow self tool:shell use").covers(&r("allow * tool:shell use")));
    }

    fn fr(path: &str, mode: Mode) -> FileRule {
        FileRule {
            path: p(path),
            mode,
        }
    }

    #[test]
    fn normalise_sorts_and_refuses_what_types_allow() {
        let mut pol = Policy::operator(0, 0, BTreeSet::new());
        pol.files = vec![fr("/b", Mode::Ro), fr("/a", Mode::Rw)];
        let r = |s: &str| Rule::parse("r", s).unwrap();
        pol.rules = vec![
            r("allow self tool:b use"),
            r("allow self tool:a use"),
            r("allow self tool:b use"),
        ];
        let n = pol.clone().normalise().unwrap();
        assert_eq!(n.files, vec![fr("/a", Mode::Rw), fr("/b", Mode::Ro)]);
        assert_eq!(n.rules.len(), 2);
        assert_eq!(n.clone().normalise().unwrap(), n);

        let base = Policy::operator(0, 0, BTreeSet::new());
        let m = |line: &str| MountEntry::parse_line("m", line).unwrap();
        let cases: Vec<(Policy, &str, &str)> = vec![
            (
                Policy {
                    files: vec![fr("/a", Mode::Ro), fr("/b", Mode::Ro), fr("/a/", Mode::Rw)],
                    ..base.clone()
                },
                "files[2].path",
                "files[0] already has a rule",
            ),
            (
                Policy {
                    mounts: vec![m("/a\t/x\tro\t-"), m("/b\t/x\tro\t-")],
                    ..base.clone()
                },
                "mounts[1].target",
                "mounts[0] already mounts",
            ),
            (
                Policy {
                    mounts: vec![m("/a\t/x/y\tro\t-"), m("/b\t/x\tro\t-")],
                    ..base.clone()
                },
                "mounts[1].target",
                "would cover mounts[0]",
            ),
            (
                Policy {
                    network: Network::Connect([0, 80].into()),
                    ..base.clone()
                },
                "network.connect",
                "not a port",
            ),
            (
                Policy {
                    cost_limit: Some(-1.0),
                    ..base.clone()
                },
                "cost_limit",
                "-1: must be",
            ),
            (
                Policy {
                    cost_limit: Some(f64::NAN),
                    ..base.clone()
                },
                "cost_limit",
                "NaN: must be",
            ),
            (
                Policy {
                    cost_limit: Some(f64::INFINITY),
                    ..base.clone()
                },
                "cost_limit",
                "inf: must be",
            ),
            (
                Policy {
                    window: Some(0),
                    ..base.clone()
                },
                "window",
                "at least 1",
            ),
            (
                Policy {
                    timeout_s: Some(0),
                    ..base.clone()
                },
                "timeout_s",
                "at least 1",
            ),
            (
                Policy {
                    resources: Resources {
                        memory_max: Some(0),
                        ..Resources::default()
                    },
                    ..base.clone()
                },
                "resources.memory_max",
                "at least 1",
            ),
            (
                Policy {
                    resources: Resources {
                        pids_max: Some(0),
                        ..Resources::default()
                    },
                    ..base.clone()
                },
                "resources.pids_max",
                "at least 1",
            ),
            (
                Policy {
                    resources: Resources {
                        cpu_weight: Some(10_001),
                        ..Resources::default()
                    },
                    ..base.clone()
                },
                "resources.cpu_weight",
                "10001: must be from 1 to 10000",
            ),
            (
                Policy {
                    env: [("".into(), "v".into())].into(),
                    ..base.clone()
                },
                "env",
                "must not be empty",
            ),
            (
                Policy {
                    env: [("A=B".into(), "v".into())].into(),
                    ..base.clone()
                },
                "env",
                "\"A=B\": a name must not contain \"=\"",
            ),
            (
                Policy {
                    env: [("A\0".into(), "v".into())].into(),
                    ..base.clone()
                },
                "env",
                "must not contain",
            ),
            (
                Policy {
                    env: [("A".into(), "v\0".into())].into(),
                    ..base.clone()
                },
                "env.A",
                "NUL or newline",
            ),
            (
                Policy {
                    env: [("BROOD_KEY".into(), "v".into())].into(),
                    ..base.clone()
                },
                "env.BROOD_KEY",
                "set by the runtime",
            ),
            (
                Policy {
                    tools: Some(["a b".to_owned()].into()),
                    ..base.clone()
                },
                "tools",
                "\"a b\": a name must not contain whitespace",
            ),
            (
                Policy {
                    tools: Some(["".to_owned()].into()),
                    ..base.clone()
                },
                "tools",
                "must not be empty",
            ),
            (
                Policy {
                    models: Some(["gpt\t4".to_owned()].into()),
                    ..base.clone()
                },
                "models",
                "whitespace",
            ),
            (
                Policy {
                    path: vec!["a".into(), "b:c".into()],
                    ..base.clone()
                },
                "path[1]",
                "must not contain \":\"",
            ),
            (
                Policy {
                    path: vec!["a".into(), "b".into(), "a".into()],
                    ..base.clone()
                },
                "path[2]",
                "already given at path[0]",
            ),
            (
                Policy {
                    path: vec!["".into()],
                    ..base.clone()
                },
                "path[0]",
                "must not be empty",
            ),
            (
                Policy {
                    rules: vec![Rule {
                        subject: "self".into(),
                        class: RuleClass::Tool,
                        name: "a b".into(),
                        perm: "use".into(),
                    }],
                    ..base.clone()
                },
                "rules[0]",
                "four words",
            ),
            (
                Policy {
                    rules: vec![Rule {
                        subject: "self".into(),
                        class: RuleClass::Tool,
                        name: "a".into(),
                        perm: "read".into(),
                    }],
                    ..base.clone()
                },
                "rules[0]",
                "not a permission",
            ),
        ];
        for (pol, field, rule) in cases {
            let e = pol.clone().normalise().unwrap_err();
            assert_eq!(e.field, field, "{pol:?}: {e}");
            assert!(e.message.contains(rule), "{e}");
        }
    }

    #[test]
    fn effective_inherits_what_the_request_leaves_out() {
        let mut parent = Policy::operator(1000, 1000, [1000, 27].into());
        parent.tools = Some(["a".to_owned(), "b".to_owned()].into());
        parent.depth_limit = Some(3);
        parent.create_limit = Some(5);
        parent.cost_limit = Some(10.0);
        parent.window = Some(100_000);
        parent.timeout_s = Some(600);
        parent.resources = Resources {
            memory_max: Some(1 << 30),
            pids_max: Some(100),
            cpu_weight: Some(100),
        };
        parent.env = [("A".to_owned(), "1".to_owned())].into();

        let child = effective(&parent, &PolicyRequest::default());
        assert_eq!(child.depth_limit, Some(2));
        assert_eq!(
            child.cost_limit, None,
            "no reservation: shares the parent's budget"
        );
        assert_eq!(
            Policy {
                depth_limit: parent.depth_limit,
                cost_limit: parent.cost_limit,
                ..child
            },
            parent,
            "everything else is inherited unchanged"
        );

        let req = PolicyRequest {
            tools: Some(["a".to_owned()].into()),
            files: Some(vec![]),
            depth_limit: Some(0),
            cost_limit: Some(1.5),
            resources: Resources {
                pids_max: Some(10),
                ..Resources::default()
            },
            ..PolicyRequest::default()
        };
        let child = effective(&parent, &req);
        assert_eq!(child.tools, Some(["a".to_owned()].into()));
        assert!(child.files.is_empty());
        assert_eq!(child.depth_limit, Some(0));
        assert_eq!(child.cost_limit, Some(1.5));
        assert_eq!(
            child.resources,
            Resources {
                memory_max: Some(1 << 30),
                pids_max: Some(10),
                cpu_weight: Some(100),
            }
        );

        let op = Policy::operator(0, 0, BTreeSet::new());
        assert_eq!(effective(&op, &PolicyRequest::default()), op);
        let zero = Policy {
            depth_limit: Some(0),
            ..op
        };
        assert_eq!(
            effective(&zero, &PolicyRequest::default()).depth_limit,
            Some(0)
        );
    }

    #[test]
    fn a_request_is_normalised_like_a_policy() {
        let req = PolicyRequest {
            files: Some(vec![fr("/b", Mode::Ro), fr("/a", Mode::Ro)]),
            ..PolicyRequest::default()
        }
        .normalise()
        .unwrap();
        assert_eq!(
            req.files,
            Some(vec![fr("/a", Mode::Ro), fr("/b", Mode::Ro)])
        );
        let e = PolicyRequest {
            cost_limit: Some(-0.5),
            ..PolicyRequest::default()
        }
        .normalise()
        .unwrap_err();
        assert_eq!(e.field, "cost_limit");
    }

    proptest! {
        #[test]
        fn normalised_paths_are_clean_and_stable(s in "[/a.\\n\\t\\x00-]{0,16}") {
            if let Ok(p) = AbsPath::new("f", &s) {
                let again = AbsPath::new("f", p.as_str()).unwrap();
                prop_assert_eq!(&again, &p);
                prop_assert!(p.as_str().starts_with('/'));
                prop_assert!(!p.as_str().chars().any(char::is_control));
                prop_assert!(!p.as_str().contains("//"));
                prop_assert!(p.as_str() == "/" || !p.as_str().ends_with('/'));
                prop_assert!(p.components().all(|c| c != "." && c != ".." && !c.is_empty()));
                prop_assert!(p.is_within(&p));
                if let Some(parent) = p.parent() {
                    prop_assert!(p.is_within(&parent));
                    prop_assert_eq!(parent.depth() + 1, p.depth());
                }
            }
        }

        #[test]
        fn clean_components_with_extra_slashes_are_accepted(
            comps in proptest::collection::vec("[a-z.]{1,4}", 0..5),
            slashes in proptest::collection::vec(1usize..3, 5),
            trailing in any::<bool>(),
        ) {
            let mut s = String::new();
            for (c, n) in comps.iter().zip(&slashes) {
                s.push_str(&"/".repeat(*n));
                s.push_str(c);
            }
            if trailing || s.is_empty() {
                s.push('/');
            }
            let clean = comps.iter().all(|c| c != "." && c != "..");
            match AbsPath::new("f", &s) {
                Ok(p) => {
                    prop_assert!(clean);
                    prop_assert_eq!(p.components().collect::<Vec<_>>(), comps.iter().map(String::as_str).collect::<Vec<_>>());
                }
                Err(e) => {
                    prop_assert!(!clean);
                    prop_assert!(e.message.contains("is not allowed"));
                }
            }
        }

        #[test]
        fn any_string_is_either_a_rule_that_reads_back_or_refused(s in "[a-z:* ]{0,30}") {
            if let Ok(r) = Rule::parse("r", &s) {
                prop_assert_eq!(Rule::parse("r", &r.to_text()).unwrap(), r);
            }
        }
    }
}
