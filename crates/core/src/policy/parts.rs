//! The building blocks of a policy: file modes and absolute paths, mount
//! lines, the network grant, resource limits, rules.

use std::collections::BTreeSet;
use std::fmt;

use super::PolicyError;
use crate::name::AgentName;

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
pub(super) const MAX_PATH: usize = 4095;

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

/// What a supervisor's start does with the agent when the incarnation that
/// ran it died (SPEC 6 "Supervisor death", issue 29). `Cancel` is the
/// default. `Resume` is a right, like a tool: a child may hold it only when
/// its parent does, since a child is resumed only under a parent that is
/// (a cancelled parent's children are cancelled with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnRestart {
    /// Ended `cancelled (runtime_restart)`.
    #[default]
    Cancel,
    /// Started again as a new run on its session, with its history.
    Resume,
}

impl OnRestart {
    pub fn as_str(self) -> &'static str {
        match self {
            OnRestart::Cancel => "cancel",
            OnRestart::Resume => "resume",
        }
    }

    /// `cancel` or `resume`; anything else is `None`.
    pub fn parse(s: &str) -> Option<OnRestart> {
        match s {
            "cancel" => Some(OnRestart::Cancel),
            "resume" => Some(OnRestart::Resume),
            _ => None,
        }
    }

    /// Whether a child holding `self` asks no more than `parent` holds.
    pub fn is_within(self, parent: OnRestart) -> bool {
        self == OnRestart::Cancel || parent == OnRestart::Resume
    }
}

/// Resource limits; `None` is no limit (for `disk_max`, the platform's
/// default applies: the runtime fills it in at admission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    /// Bytes (`memory.max`).
    pub memory_max: Option<u64>,
    /// Processes and threads (`pids.max`).
    pub pids_max: Option<u64>,
    /// Relative CPU share, 1 to 10000 (`cpu.weight`).
    pub cpu_weight: Option<u64>,
    /// Bytes the agent may write: the size of any one file it writes
    /// (`RLIMIT_FSIZE`), and the total it hands back in its channel's
    /// `artifact/` (issue 24).
    pub disk_max: Option<u64>,
}

/// Limits on the agent's model calls through brood's gateway (issue 31,
/// docs/models.md "Rate limits"); `None` is no limit of its own. Each is
/// counted over a one-minute window of the agent's own calls: a child's
/// calls count against its own limits, not its parent's (the tenant's
/// limit, `quotas.models`, bounds them all together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModelRate {
    /// Calls sent a minute.
    pub requests_per_minute: Option<u64>,
    /// Tokens (input and output, as brood metered them) a minute.
    pub tokens_per_minute: Option<u64>,
}

impl ModelRate {
    /// True when neither is limited.
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none() && self.tokens_per_minute.is_none()
    }
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
