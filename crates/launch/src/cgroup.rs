//! Cgroups: create, kill, confirm empty and remove the groups that hold each
//! agent's whole process tree.
//!
//! A process group is escaped by `setsid`; a cgroup is not, so the cgroup is what
//! brood kills (SPEC 6, "Parent death"). One interface covers three layouts
//! ([`detect`] tells them apart from the mount table):
//!
//! * **V2** (cgroup2 at `/sys/fs/cgroup`) and **Hybrid** (cgroup2 at
//!   `/sys/fs/cgroup/unified` next to v1 controllers): groups live in v2 and are
//!   killed with `cgroup.kill`, which takes the whole subtree including processes
//!   forked during the kill (Documentation/admin-guide/cgroup-v2.rst, "Core
//!   Interface Files").
//! * **V1** only: groups live in the freezer hierarchy (or pids when there is no
//!   freezer) and are killed by freezing, SIGKILLing every process and thawing,
//!   until empty (Documentation/admin-guide/cgroup-v1/freezer-subsystem.rst).
//!
//! Every group is `<hierarchy>/<our own cgroup>/brood-<instance>/s<pid>-<starttime>/<rel>`:
//! under our own cgroup, never at a hierarchy root (we may only own a delegated
//! subtree, and on this host processes start in a v1 cgroup of their own), with one
//! directory per supervisor incarnation, so the next start can tell which groups an
//! earlier, dead incarnation left behind and kill them ([`Cgroups::reap_leftovers`],
//! SPEC 6 "Supervisor death").
//!
//! **Limits** ([`Cgroups::set_limits`], SPEC 5 `resources`) go, per controller,
//! wherever this host has that controller:
//!
//! * in v2 (`memory.max`, `pids.max`, `cpu.weight`) when our own v2 group offers
//!   it. The controller is then enabled in the `cgroup.subtree_control` of every
//!   group from our own down to the agent's parent. cgroup v2 forbids processes in
//!   a group that hands controllers to its children ("No Internal Process
//!   Constraint", cgroup-v2.rst), so on such a host the supervisor first moves
//!   itself (and its direct children, such as the PID-namespace keeper) into the
//!   leaf `<own>/brood-<instance>.supervisor`, and each agent's own processes live
//!   in the leaf [`PROCESS_LEAF`] of its group ([`Cgroups::procs_file`]), so an
//!   agent's group can later hand controllers to its child agents' groups.
//! * in v1 otherwise (this host: cgroup2 has only `hugetlb`), in a *mirror*: the
//!   same relative path under our own cgroup of the `memory`, `pids` and `cpu`
//!   hierarchies ([`Cgroups::v1_mirror`]). The child joins those groups too, by
//!   writing `0` into the `cgroup.procs` files [`LimitHandles`] holds. Mirrors are
//!   removed with the group, deepest first, after the v2 group is empty.
//!
//! Only the controllers that can limit are enabled or mirrored; nothing else is
//! touched.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How many times `rmdir` is retried on `EBUSY`: the kernel can report a group
/// busy for a moment after its last process exited (youki retries too). With the
/// doubling pause below this waits about 200 ms in all.
const RMDIR_RETRIES: u32 = 10;
/// How long a v1 kill keeps freezing and killing before it gives up.
const V1_KILL_DEADLINE: Duration = Duration::from_secs(5);
/// How long one v1 round waits for `FROZEN`, and then for the group to empty.
const V1_FREEZE_WAIT: Duration = Duration::from_millis(100);
const V1_ROUND_WAIT: Duration = Duration::from_millis(50);
/// How long [`Cgroups::destroy`] and [`Cgroups::reap_leftovers`] wait for a killed
/// group to empty.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);

/// v1 controllers we recognise in mount options (cgroups(7)); anything else in
/// the options is a mount flag or a named hierarchy (`name=systemd`).
const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];
/// Prefixes of kernel interface files (`cgroup.*` and `<controller>.*`, v1 and v2).
/// A child group may not take such a name: it would collide with a file that
/// appears once a controller is enabled (cgroup-v2.rst, "Avoid Name Collisions").
const RESERVED_PREFIXES: &[&str] = &[
    "blkio",
    "cgroup",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "dmem",
    "freezer",
    "hugetlb",
    "io",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];
/// v1 interface files without a dot (cgroup-v1/cgroups.rst).
const RESERVED_NAMES: &[&str] = &["tasks", "notify_on_release", "release_agent"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no usable cgroup hierarchy: {0}")]
    NoCgroupFs(String),
    #[error(
        "{0:?} is not a usable cgroup name: 1 to 80 of A-Z a-z 0-9 . _ + -, not . or .., \
         and not a kernel interface file name (cgroup.*, <controller>.*, tasks)"
    )]
    BadComponent(String),
    #[error("{0:?} is not a usable brood instance name: 1 to 64 of a-z 0-9 -")]
    BadInstance(String),
    #[error("{} still holds processes {pids:?}", path.display())]
    NotEmpty { path: PathBuf, pids: Vec<i32> },
    #[error("kill({pid}, {sig}) for a process of {}: {source}", path.display())]
    Signal {
        path: PathBuf,
        pid: i32,
        sig: i32,
        #[source]
        source: io::Error,
    },
    #[error("{}: {what}", path.display())]
    Malformed { path: PathBuf, what: String },
    #[error("the {controller} controller is not available on this host: {why}")]
    Unsupported {
        controller: &'static str,
        why: String,
    },
    #[error("{what} = {value} is out of range ({range})")]
    BadLimit {
        what: &'static str,
        value: u64,
        range: &'static str,
    },
    #[error(
        "cannot enable {controllers} in {}: it holds processes {pids:?}, and cgroup v2 \
         lets no group that hands controllers to child groups hold processes \
         (cgroup-v2.rst \"No Internal Process Constraint\"); run brood in a cgroup of \
         its own (systemd Delegate=yes)",
        path.display()
    )]
    InternalProcess {
        path: PathBuf,
        controllers: String,
        pids: Vec<i32>,
    },
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The controllers brood limits, in the order limits are applied and reported.
const LIMIT_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// On a host whose limits go through cgroup v2, the leaf below each agent's group
/// that holds the agent's own processes, so the group itself stays free to hand
/// controllers to its child agents' groups (cgroup-v2.rst "No Internal Process
/// Constraint"). Group names refuse `@` ([`GroupPath::child`]), so no group can
/// take this name.
pub const PROCESS_LEAF: &str = "@self";

/// The resource limits of one agent (SPEC 5 `resources`). `None` leaves a
/// controller's default (no limit, or the default weight).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory the agent's whole tree may use (RAM, and swap too: the
    /// limit is also written as the memory+swap limit, so no agent swaps).
    pub memory_max: Option<u64>,
    /// Processes (and threads) the agent's whole tree may hold at once.
    pub pids_max: Option<u64>,
    /// CPU weight, 1..=10000 with 100 the default (cgroup v2 `cpu.weight`
    /// semantics; converted to v1 `cpu.shares` where only v1 has the controller).
    pub cpu_weight: Option<u64>,
}

impl Limits {
    fn get(&self, controller: &str) -> Option<u64> {
        match controller {
            "memory" => self.memory_max,
            "pids" => self.pids_max,
            "cpu" => self.cpu_weight,
            _ => None,
        }
    }
}

/// What the launcher needs from [`Cgroups::set_limits`] in the child.
#[derive(Debug, Default)]
pub struct LimitHandles {
    /// `cgroup.procs` of the agent's v1 limit groups (empty where limits are in v2),
    /// opened `O_WRONLY | O_CLOEXEC`. Between clone and exec the child writes `0`
    /// into each, after joining its v2 group, so it is limited before it execs.
    pub procs_files: Vec<File>,
}

/// v2 `cpu.weight` (1..=10000, default 100) to v1 `cpu.shares` (2..=262144,
/// default 1024): the same proportion of the default (kernel
/// Documentation/scheduler/sched-design-CFS.rst; cgroup-v2.rst "cpu.weight").
pub fn weight_to_shares(weight: u64) -> u64 {
    (weight.saturating_mul(1024) / 100).clamp(2, 262_144)
}

/// Where one limit controller lives for this incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// In the v2 group itself.
    V2,
    /// In the v1 grouping hierarchy itself (pure v1 grouping with `pids`).
    Grouping,
    /// In a v1 hierarchy next to the grouping one: the base's mirror there.
    V1(PathBuf),
    /// Nowhere on this host.
    Missing,
}

/// Which cgroup hierarchies this host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only cgroup v2 (`/sys/fs/cgroup` is cgroup2).
    V2,
    /// cgroup v2 for grouping next to v1 controller hierarchies.
    Hybrid,
    /// Only v1 controller hierarchies.
    V1,
    /// No cgroup filesystem is mounted.
    Unavailable,
}

/// What [`detect`] found. Paths are under the `fs_root` given to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub layout: Layout,
    pub v2_mount: Option<PathBuf>,
    /// v1 controller -> its mount point (co-mounted controllers share one).
    pub v1_mounts: BTreeMap<String, PathBuf>,
    /// Our own v2 cgroup (`/proc/self/cgroup` line `0::`), relative to the v2
    /// mount: when only a subtree is mounted (a container without a cgroup
    /// namespace) the mount's root is taken off; `None` when we are outside it.
    pub own_v2: Option<String>,
    /// v1 hierarchy (controller list such as `cpu,cpuacct` split into each
    /// controller, or `name=systemd`) -> our cgroup there, as for `own_v2`.
    pub own_v1: BTreeMap<String, String>,
    /// What our own v2 group's `cgroup.controllers` offers (none enabled by us).
    pub v2_controllers: Vec<String>,
}

/// One line of the mount table that is a cgroup filesystem.
struct Mount {
    dir: PathBuf,
    /// Which directory of the hierarchy is mounted there (`/` unless a subtree).
    root: String,
    fstype: String,
    opts: String,
}

/// Finds the cgroup hierarchies and our place in them, from
/// `fs_root/proc/self/mountinfo` (proc(5); `mounts` when there is no mountinfo)
/// and `fs_root/proc/self/cgroup` (cgroups(7), `/proc/[pid]/cgroup`).
/// `fs_root` is `/` in production and a directory of fake files in tests.
pub fn detect(fs_root: &Path) -> Result<Detected, CgroupError> {
    let proc_self = fs_root.join("proc/self");
    let mounts = read_mounts(fs_root, &proc_self)?;
    let cgroup_file = proc_self.join("cgroup");
    // A kernel without cgroups has no /proc/self/cgroup: that is "unavailable",
    // not an error.
    let own = match fs::read_to_string(&cgroup_file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("read", &cgroup_file, e)),
    };

    let mut v2: Option<&Mount> = None;
    let mut v1: BTreeMap<String, &Mount> = BTreeMap::new();
    for m in &mounts {
        if m.fstype == "cgroup2" && v2.is_none() {
            v2 = Some(m);
        } else if m.fstype == "cgroup" {
            for opt in m.opts.split(',') {
                if V1_CONTROLLERS.contains(&opt) {
                    v1.entry(opt.to_owned()).or_insert(m);
                }
            }
        }
    }

    let mut own_v2 = None;
    let mut own_v1 = BTreeMap::new();
    for line in own.lines() {
        // "hierarchy-ID:controller-list:cgroup-path"; the path may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            own_v2 = v2.and_then(|m| relative_to(path, &m.root)).map(|p| {
                // A supervisor that moved into its leaf to enable v2 limits
                // (Cgroups::set_limits) still owns the group above it.
                match p.rsplit_once('/') {
                    Some((up, leaf))
                        if leaf.starts_with("brood-") && leaf.ends_with(".supervisor") =>
                    {
                        if up.is_empty() {
                            "/".to_owned()
                        } else {
                            up.to_owned()
                        }
                    }
                    _ => p,
                }
            });
        } else {
            for c in ctrls.split(',') {
                let root = v1.get(c).map_or("/", |m| m.root.as_str());
                if let Some(p) = relative_to(path, root) {
                    own_v1.insert(c.to_owned(), p);
                }
            }
        }
    }

    let v2_mount = v2.map(|m| m.dir.clone());
    let v2_controllers = match (&v2_mount, &own_v2) {
        (Some(mount), Some(own)) => {
            fs::read_to_string(join_own(mount, own).join("cgroup.controllers"))
                .map(|t| t.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let v1_mounts: BTreeMap<String, PathBuf> =
        v1.into_iter().map(|(c, m)| (c, m.dir.clone())).collect();
    let layout = match (v2_mount.is_some(), v1_mounts.is_empty()) {
        (true, true) => Layout::V2,
        (true, false) => Layout::Hybrid,
        (false, false) => Layout::V1,
        (false, true) => Layout::Unavailable,
    };
    Ok(Detected {
        layout,
        v2_mount,
        v1_mounts,
        own_v2,
        own_v1,
        v2_controllers,
    })
}

fn read_mounts(fs_root: &Path, proc_self: &Path) -> Result<Vec<Mount>, CgroupError> {
    let info = proc_self.join("mountinfo");
    let (text, is_info) = match fs::read_to_string(&info) {
        Ok(t) => (t, true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mounts = proc_self.join("mounts");
            let t = fs::read_to_string(&mounts).map_err(|e| io_err("read", &mounts, e))?;
            (t, false)
        }
        Err(e) => return Err(io_err("read", &info, e)),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // mountinfo: id parent dev root mountpoint opts [optional...] - fstype source superopts
        // mounts:    source mountpoint fstype opts freq passno
        let (root, point, fstype, opts) = if is_info {
            let Some(sep) = f.iter().position(|x| *x == "-") else {
                continue;
            };
            match (f.get(3), f.get(4), f.get(sep + 1), f.get(sep + 3)) {
                (Some(r), Some(p), Some(t), Some(o)) => (unescape(r), *p, *t, *o),
                _ => continue,
            }
        } else {
            match (f.get(1), f.get(2), f.get(3)) {
                (Some(p), Some(t), Some(o)) => (b"/".to_vec(), *p, *t, *o),
                _ => continue,
            }
        };
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let point = PathBuf::from(OsString::from_vec(unescape(point)));
        out.push(Mount {
            dir: fs_root.join(point.strip_prefix("/").unwrap_or(&point)),
            root: String::from_utf8_lossy(&root).into_owned(),
            fstype: fstype.to_owned(),
            opts: opts.to_owned(),
        });
    }
    Ok(out)
}

/// Undoes the octal escapes (`\040` for a space) of the mount table (proc(5)).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |acc, c| acc.wrapping_mul(8) + (c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// `path` (from /proc/self/cgroup) relative to a mount whose root is `root`.
fn relative_to(path: &str, root: &str) -> Option<String> {
    if root == "/" {
        return Some(path.to_owned());
    }
    match path.strip_prefix(root)? {
        "" => Some("/".to_owned()),
        rest if rest.starts_with('/') => Some(rest.to_owned()),
        _ => None,
    }
}

/// `mount` joined with an own-cgroup path such as `/` or `/a/b`.
fn join_own(mount: &Path, own: &str) -> PathBuf {
    match own.trim_start_matches('/') {
        "" => mount.to_path_buf(),
        rel => mount.join(rel),
    }
}

/// A group's path below the base: `/`-separated validated components; empty is
/// the base itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupPath(String);

impl GroupPath {
    /// `&[]` is the base itself.
    pub fn new(components: &[&str]) -> Result<GroupPath, CgroupError> {
        components
            .iter()
            .try_fold(GroupPath::default(), |p, c| p.child(c))
    }

    pub fn child(&self, comp: &str) -> Result<GroupPath, CgroupError> {
        check_component(comp)?;
        Ok(GroupPath(if self.0.is_empty() {
            comp.to_owned()
        } else {
            format!("{}/{comp}", self.0)
        }))
    }

    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl fmt::Display for GroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "." } else { &self.0 })
    }
}

/// Components become directory names in cgroupfs, so they are checked here, once.
fn check_component(c: &str) -> Result<(), CgroupError> {
    let chars_ok = (1..=80).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    let reserved = c == "."
        || c == ".."
        || RESERVED_NAMES.contains(&c)
        || c.split_once('.')
            .is_some_and(|(prefix, _)| RESERVED_PREFIXES.contains(&prefix));
    if chars_ok && !reserved {
        Ok(())
    } else {
        Err(CgroupError::BadComponent(c.to_owned()))
    }
}

/// A group: its path below the base and its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub rel: GroupPath,
    pub dir: PathBuf,
}

/// What [`Cgroups::reap_leftovers`] cleaned up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// `s<pid>-<starttime>` groups of dead incarnations that were removed.
    pub groups: usize,
    /// Processes that were still in them and were killed.
    pub pids_killed: Vec<i32>,
}

/// Which hierarchy holds the groups, and so how they are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    V2,
    V1Freezer,
    V1Pids,
}

impl Kind {
    /// The v1 controller whose hierarchy groups processes.
    fn v1_controller(self) -> Option<&'static str> {
        match self {
            Kind::V2 => None,
            Kind::V1Freezer => Some("freezer"),
            Kind::V1Pids => Some("pids"),
        }
    }
}

/// The groups of one supervisor incarnation.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
    kind: Kind,
    base: PathBuf,
    /// Per v1 controller, the directory that mirrors `base` in that hierarchy.
    /// [`Cgroups::set_limits`] creates it (for the limit controllers) on first use.
    v1_mirror: BTreeMap<String, PathBuf>,
    /// Where each of [`LIMIT_CONTROLLERS`] is, in that order.
    places: [(&'static str, Place); 3],
    /// The instance name, for the supervisor's own leaf on v2-limit hosts.
    instance: String,
}

impl Cgroups {
    /// Creates (`mkdir -p`) `<own cgroup>/brood-<instance>/s<pid>-<starttime>` in the
    /// grouping hierarchy and returns the handle to it.
    pub fn open(det: &Detected, instance: &str) -> Result<Cgroups, CgroupError> {
        // SAFETY: getpid(2) has no preconditions.
        let pid = unsafe { libc::getpid() };
        let start = start_time(pid)?.ok_or_else(|| CgroupError::Malformed {
            path: PathBuf::from(format!("/proc/{pid}/stat")),
            what: "our own process looks dead".to_owned(),
        })?;
        let (kind, base) = base_dir(det, instance, &format!("s{pid}-{start}"))?;
        fs::create_dir_all(&base).map_err(|e| io_err("mkdir -p", &base, e))?;
        if kind == Kind::V2 {
            // cgroup.kill exists in every non-root v2 group since Linux 5.14; without
            // it a tree could not be killed atomically, so refuse rather than pretend.
            let kill = base.join("cgroup.kill");
            if !kill.exists() {
                return Err(CgroupError::NoCgroupFs(format!(
                    "{} is missing (cgroup.kill needs Linux 5.14)",
                    kill.display()
                )));
            }
        }
        Ok(Cgroups::assemble(det, kind, instance, base))
    }

    /// The handle for the incarnation at `base`, with its mirrors and the place of
    /// each limit controller worked out; no IO.
    fn assemble(det: &Detected, kind: Kind, instance: &str, base: PathBuf) -> Cgroups {
        let v1_mirror = v1_mirror(det, kind, instance, &base);
        let places = LIMIT_CONTROLLERS.map(|c| {
            let place = if kind == Kind::V2 && det.v2_controllers.iter().any(|x| x == c) {
                Place::V2
            } else if kind.v1_controller() == Some(c) {
                Place::Grouping
            } else if let Some(m) = v1_mirror.get(c) {
                Place::V1(m.clone())
            } else {
                Place::Missing
            };
            (c, place)
        });
        Cgroups {
            layout: det.layout,
            kind,
            base,
            v1_mirror,
            places,
            instance: instance.to_owned(),
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The grouping directory of this incarnation; every group is below it.
    pub fn base(&self) -> &Path {
        &self.base
    }

    pub fn kill_mechanism(&self) -> &'static str {
        match self.kind {
            Kind::V2 => "cgroup.kill",
            Kind::V1Freezer => "freezer+SIGKILL",
            Kind::V1Pids => "pids.max=0+SIGKILL",
        }
    }

    /// Per v1 controller, the directory that mirrors the base in that hierarchy
    /// (Hybrid and V1 layouts; empty on V2). [`Cgroups::set_limits`] creates the
    /// ones of the limit controllers when it first needs them.
    pub fn v1_mirror(&self) -> &BTreeMap<String, PathBuf> {
        &self.v1_mirror
    }

    /// `mkdir` of one group; its parent must exist, and an existing group is an
    /// error (two agents must never share a group).
    pub fn create(&self, rel: &GroupPath) -> Result<Group, CgroupError> {
        let g = self.group(rel);
        fs::create_dir(&g.dir).map_err(|e| io_err("mkdir", &g.dir, e))?;
        Ok(g)
    }

    /// A handle to a group that already exists; no IO.
    pub fn group(&self, rel: &GroupPath) -> Group {
        let dir = if rel.0.is_empty() {
            self.base.clone()
        } else {
            self.base.join(rel.as_path())
        };
        Group {
            rel: rel.clone(),
            dir,
        }
    }

    /// The group's `cgroup.procs`, open for writing, for the launcher: the child
    /// writes `0` into it between clone and exec, which moves the writer itself
    /// (cgroup-v2.rst "cgroup.procs"; v1 accepts `0` the same way), so no
    /// instruction of the agent runs outside its group.
    ///
    /// Where limits go through v2 the file is that of the group's
    /// [`PROCESS_LEAF`] (created here), so the group can still hand controllers to
    /// child groups; the leaf is inside the group, so kill, wait and remove treat
    /// it as part of it.
    pub fn procs_file(&self, g: &Group) -> Result<File, CgroupError> {
        let dir = if self.limits_in_v2() {
            let leaf = g.dir.join(PROCESS_LEAF);
            match fs::create_dir(&leaf) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("mkdir", &leaf, e)),
            }
            leaf
        } else {
            g.dir.clone()
        };
        let path = dir.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            // std already opens with O_CLOEXEC; said explicitly because an agent
            // must never inherit a way to move processes between groups.
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io_err("open", &path, e))
    }

    /// Every process in the group and in every group below it, sorted.
    pub fn pids(&self, g: &Group) -> Result<Vec<i32>, CgroupError> {
        pids_under(&g.dir)
    }

    /// Sends `sig` (kill(2)) to every process of the group's subtree; returns how
    /// many it reached. A process that exited meanwhile (`ESRCH`) is not an error.
    pub fn signal(&self, g: &Group, sig: i32) -> Result<usize, CgroupError> {
        let mut reached = 0;
        for pid in self.pids(g)? {
            // SAFETY: kill(2) with plain integers; pids_under never yields pid <= 0,
            // which would address process groups instead.
            if unsafe { libc::kill(pid, sig) } == 0 {
                reached += 1;
                continue;
            }
            let source = io::Error::last_os_error();
            if source.raw_os_error() != Some(libc::ESRCH) {
                return Err(CgroupError::Signal {
                    path: g.dir.clone(),
                    pid,
                    sig,
                    source,
                });
            }
        }
        Ok(reached)
    }

    /// Kills every process of the group's subtree, including processes forked
    /// while the kill runs. On v2 this returns once the kernel has the order; use
    /// [`Cgroups::wait_empty`] to see it done. On v1 it freezes (or sets `pids.max`
    /// to 0, which stays), SIGKILLs and thaws until the subtree is empty, for up
    /// to 5 s.
    pub fn kill(&self, g: &Group) -> Result<(), CgroupError> {
        match self.kind {
            // cgroup-v2.rst "cgroup.kill": writing 1 SIGKILLs the subtree.
            Kind::V2 => write_file(&g.dir.join("cgroup.kill"), "1"),
            Kind::V1Freezer => self.kill_v1(g),
            Kind::V1Pids => {
                // cgroup-v1/pids.rst: the limit is hierarchical, so 0 at the top of
                // the subtree makes every fork(2) in it fail while we kill.
                write_file(&g.dir.join("pids.max"), "0")?;
                self.kill_v1(g)
            }
        }
    }

    /// v1 has no cgroup.kill: stop the subtree from forking (frozen, or pids.max 0),
    /// SIGKILL whatever is listed, thaw so the signals are acted on, and repeat
    /// until nothing is left.
    fn kill_v1(&self, g: &Group) -> Result<(), CgroupError> {
        let deadline = Instant::now() + V1_KILL_DEADLINE;
        let freeze = self.kind == Kind::V1Freezer;
        loop {
            if !self.is_populated(g)? {
                return Ok(());
            }
            let killed = if freeze {
                self.freeze_v1(g)
                    .and_then(|()| self.signal(g, libc::SIGKILL))
            } else {
                self.signal(g, libc::SIGKILL)
            };
            if freeze {
                // Thaw even when freezing or signalling failed: a group must not be
                // left frozen, and the SIGKILLs act only once it is thawed.
                write_file(&g.dir.join("freezer.state"), "THAWED")?;
            }
            killed?;
            if self.wait_empty(g, V1_ROUND_WAIT)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::NotEmpty {
                    path: g.dir.clone(),
                    pids: self.pids(g)?,
                });
            }
        }
    }

    /// freezer-subsystem.rst: freezing a group freezes its descendants too, and the
    /// state reads `FREEZING` until every task has stopped. If that takes too long
    /// (a task in uninterruptible sleep) we kill what we see; the loop comes back.
    fn freeze_v1(&self, g: &Group) -> Result<(), CgroupError> {
        let state = g.dir.join("freezer.state");
        write_file(&state, "FROZEN")?;
        let deadline = Instant::now() + V1_FREEZE_WAIT;
        while Instant::now() < deadline {
            let now = fs::read_to_string(&state).map_err(|e| io_err("read", &state, e))?;
            if now.trim() == "FROZEN" {
                break;
            }
            sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Whether any process is in the group's subtree: v2 `cgroup.events`
    /// `populated` (cgroup-v2.rst), v1 any pid in a `cgroup.procs`.
    pub fn is_populated(&self, g: &Group) -> Result<bool, CgroupError> {
        if self.kind != Kind::V2 {
            return Ok(!self.pids(g)?.is_empty());
        }
        let path = g.dir.join("cgroup.events");
        let text = fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))?;
        text.lines()
            .find_map(|l| l.strip_prefix("populated "))
            .map(|v| v.trim() == "1")
            .ok_or(CgroupError::Malformed {
                path,
                what: "no \"populated\" line".to_owned(),
            })
    }

    /// Polls until the subtree is empty; `true` if it emptied within `timeout`.
    /// Every millisecond at first (a kill usually finishes in a few), then backing
    /// off to every 10 ms.
    pub fn wait_empty(&self, g: &Group, timeout: Duration) -> Result<bool, CgroupError> {
        let deadline = Instant::now() + timeout;
        let mut step = Duration::from_millis(1);
        for polls in 0u32.. {
            if !self.is_populated(g)? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            sleep(step.min(deadline - now));
            if polls >= 10 {
                step = (step * 2).min(Duration::from_millis(10));
            }
        }
        Ok(false)
    }

    /// Removes the group and every group below it, deepest first, then its v1
    /// limit mirrors the same way. A group that is already gone is fine; one that
    /// still holds processes is [`CgroupError::NotEmpty`].
    pub fn remove(&self, g: &Group) -> Result<(), CgroupError> {
        if exists(&g.dir)? {
            remove_tree(&g.dir)?;
        }
        for dir in self.mirror_dirs(&g.rel) {
            if exists(&dir)? {
                remove_tree(&dir)?;
            }
        }
        Ok(())
    }

    /// Kill, wait until empty, remove; then the v1 limit mirrors. A group that
    /// does not exist is fine (its mirrors are still removed: an earlier removal
    /// may have stopped between the two).
    pub fn kill_and_remove(&self, g: &Group, timeout: Duration) -> Result<(), CgroupError> {
        if exists(&g.dir)? {
            self.kill(g)?;
            if !self.wait_empty(g, timeout)? {
                return Err(CgroupError::NotEmpty {
                    path: g.dir.clone(),
                    pids: self.pids(g)?,
                });
            }
            remove_tree(&g.dir)?;
        }
        for dir in self.mirror_dirs(&g.rel) {
            if exists(&dir)? {
                // Once the v2 group is empty its mirrors are too, unless a process
                // left its v2 group by itself: it still belongs to this agent.
                kill_v1_leftovers(&dir, timeout)?;
                remove_tree(&dir)?;
            }
        }
        Ok(())
    }

    /// Start-up hygiene (SPEC 6, "Supervisor death"): under `brood-<instance>/`,
    /// every `s<pid>-<starttime>` group whose process is not alive with that start
    /// time belongs to a dead incarnation: kill its subtree, wait until empty,
    /// remove it, and its v1 limit mirrors (also when only a mirror was left).
    /// Directories of another shape are not ours and are left alone. Every
    /// leftover is tried; the first error is returned after that.
    pub fn reap_leftovers(det: &Detected, instance: &str) -> Result<Leftovers, CgroupError> {
        let (kind, own) = grouping(det)?;
        let dir = instance_dir(&own, instance)?;
        // The instance directories of the limit mirrors, from a probe incarnation.
        let probe = Cgroups::assemble(det, kind, instance, dir.join("s1-1"));
        let mut names = BTreeSet::new();
        for inst in std::iter::once(dir.clone()).chain(
            probe
                .mirror_dirs(&GroupPath::default())
                .iter()
                .filter_map(|m| m.parent().map(Path::to_path_buf)),
        ) {
            let entries = match fs::read_dir(&inst) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("read dir", &inst, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_err("read dir", &inst, e))?;
                if let Some(name) = entry.file_name().to_str()
                    && parse_incarnation(name).is_some()
                {
                    names.insert(name.to_owned());
                }
            }
        }
        let mut out = Leftovers::default();
        let mut first_err = None;
        for name in names {
            let Some((pid, start)) = parse_incarnation(&name) else {
                continue;
            };
            let result = start_time(pid).and_then(|alive| {
                if alive == Some(start) {
                    return Ok(());
                }
                let dead = Cgroups::assemble(det, kind, instance, dir.join(&name));
                let all = dead.group(&GroupPath::default());
                let mut pids = if exists(&all.dir)? {
                    dead.pids(&all)?
                } else {
                    Vec::new()
                };
                for m in dead.mirror_dirs(&all.rel) {
                    if exists(&m)? {
                        pids.extend(pids_under(&m)?);
                    }
                }
                pids.sort_unstable();
                pids.dedup();
                dead.kill_and_remove(&all, EMPTY_TIMEOUT)?;
                out.groups += 1;
                out.pids_killed.extend(pids);
                Ok(())
            });
            if let Err(e) = result {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// On clean shutdown: kill and remove everything of this incarnation. The
    /// `brood-<instance>` directory stays: another incarnation may be starting in it.
    pub fn destroy(&self) -> Result<(), CgroupError> {
        self.kill_and_remove(&self.group(&GroupPath::default()), EMPTY_TIMEOUT)
    }

    /// After [`Cgroups::destroy`]: removes this instance's `brood-<instance>`
    /// directories, in v2 and in every v1 mirror, when no other incarnation is
    /// using them (`rmdir` refuses a non-empty group, which is then left alone).
    pub fn remove_instance_dirs(&self) {
        let bases = std::iter::once(&self.base).chain(self.v1_mirror.values());
        for base in bases {
            if let Some(dir) = base.parent() {
                let _ = fs::remove_dir(dir);
            }
        }
    }

    /// The directory of the group a process is in, given the text of its
    /// `/proc/<pid>/cgroup`, when that group is this incarnation's base or below
    /// it. Matched on the `brood-<instance>/s<pid>-<starttime>` part of the path,
    /// so it holds however the hierarchy is mounted.
    pub fn path_of_process_line(&self, text: &str) -> Option<PathBuf> {
        let path = text.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            let ours = match self.kind.v1_controller() {
                None => id == "0" && ctrls.is_empty(),
                Some(c) => ctrls.split(',').any(|x| x == c),
            };
            ours.then_some(path)
        })?;
        let inst = self.base.parent()?.file_name()?.to_str()?;
        let me = self.base.file_name()?.to_str()?;
        let marker = format!("/{inst}/{me}");
        let rest = &path[path.find(&marker)? + marker.len()..];
        // An agent's own processes may sit in its group's leaf (v2 limits).
        let rest = rest
            .strip_suffix(PROCESS_LEAF)
            .and_then(|r| r.strip_suffix('/'))
            .unwrap_or(rest);
        if rest.is_empty() {
            return Some(self.base.clone());
        }
        // "/brood-x/s1-2a" is another incarnation, not a group below "/brood-x/s1-2".
        rest.strip_prefix('/').map(|rel| self.base.join(rel))
    }
}

/// Resource limits (SPEC 5 `resources`); see the module docs for where each goes.
impl Cgroups {
    /// Applies `l` to the agent's group `g` (which must exist) and returns the v1
    /// `cgroup.procs` files the child must also join.
    ///
    /// * v2 controllers: enabled in `cgroup.subtree_control` from our own group
    ///   down to `g`'s parent (moving the supervisor into its leaf first, see the
    ///   module docs), then `memory.max` (and `memory.swap.max` = 0 where swap is
    ///   accounted), `pids.max`, `cpu.weight` in `g` (cgroup-v2.rst "Controllers").
    /// * v1 controllers: the mirror of `g` is created (`mkdir -p`) in every v1
    ///   limit hierarchy the host has, **whether or not that limit is set**, and
    ///   returned for the child to join: an agent's v1 place then always mirrors its
    ///   v2 place, so an ancestor's v1 limit binds every descendant agent as v2
    ///   limits would (v1 limits are hierarchical too). Written there:
    ///   `memory.limit_in_bytes` and, where swap is accounted,
    ///   `memory.memsw.limit_in_bytes` with the same value, so the limit cannot be
    ///   dodged by swapping (cgroup-v1/memory.rst 2.5, 5.1); `pids.max`
    ///   (cgroup-v1/pids.rst); `cpu.shares` from [`weight_to_shares`]
    ///   (scheduler/sched-design-CFS.rst).
    ///
    /// So the launcher should call this for **every** agent group, with
    /// `Limits::default()` when the policy sets none. A limit whose controller
    /// the host lacks is [`CgroupError::Unsupported`], naming it. On an error,
    /// what was made so far goes with the group ([`Cgroups::remove`]).
    pub fn set_limits(&self, g: &Group, l: &Limits) -> Result<LimitHandles, CgroupError> {
        if let Some(w) = l.cpu_weight
            && !(1..=10_000).contains(&w)
        {
            return Err(CgroupError::BadLimit {
                what: "cpu_weight",
                value: w,
                range: "1..=10000",
            });
        }
        let mut handles = LimitHandles::default();
        let mut joined: Vec<PathBuf> = Vec::new();
        let mut in_v2 = Vec::new();
        for (controller, place) in &self.places {
            let value = l.get(controller);
            let dir = match place {
                Place::Missing => match value {
                    Some(_) => {
                        return Err(CgroupError::Unsupported {
                            controller,
                            why: self.missing_why(controller),
                        });
                    }
                    None => continue,
                },
                Place::V2 => {
                    if value.is_some() {
                        in_v2.push(*controller);
                    }
                    continue;
                }
                Place::Grouping => g.dir.clone(),
                Place::V1(mirror) => {
                    let dir = join_rel(mirror, &g.rel);
                    fs::create_dir_all(&dir).map_err(|e| io_err("mkdir -p", &dir, e))?;
                    // Co-mounted controllers (cpu,cpuacct) share one directory.
                    if !joined.contains(&dir) {
                        handles.procs_files.push(open_procs(&dir)?);
                        joined.push(dir.clone());
                    }
                    dir
                }
            };
            if let Some(v) = value {
                write_v1_limit(&dir, controller, v)?;
            }
        }
        if !in_v2.is_empty() {
            self.enable_v2(g, &in_v2)?;
            for controller in in_v2 {
                if let Some(v) = l.get(controller) {
                    write_v2_limit(&g.dir, controller, v)?;
                }
            }
        }
        Ok(handles)
    }

    /// For `brood doctor`: each limit controller, where this host has it (v1 or
    /// v2, and through which file), and whether it is there at all.
    pub fn limits_supported(&self) -> Vec<(&'static str, bool)> {
        self.places
            .iter()
            .map(|(c, p)| (place_label(c, p), *p != Place::Missing))
            .collect()
    }

    /// Whether the kernel OOM-killed a process of the group's tree because of a
    /// memory limit (v2 `memory.events` `oom_kill`, cgroup-v2.rst; v1
    /// `memory.oom_control` `oom_kill`, counted since Linux 4.13, or on older
    /// kernels `memory.failcnt`, which counts hits of the limit, not kills).
    /// Read before the group is removed; `false` when nothing can be read.
    pub fn oom_killed(&self, g: &Group) -> bool {
        let Some((top, v2)) = self.limit_dir(g, "memory") else {
            return false;
        };
        any_in_subtree(&top, |d| {
            if v2 {
                return read_counter(&d.join("memory.events"), "oom_kill").is_some_and(|n| n > 0);
            }
            match read_counter(&d.join("memory.oom_control"), "oom_kill") {
                Some(n) => n > 0,
                None => read_counter(&d.join("memory.failcnt"), "").is_some_and(|n| n > 0),
            }
        })
    }

    /// Whether a fork(2) or clone(2) in the group's tree was refused because a
    /// `pids.max` was reached (`pids.events` `max`, in v2 (cgroup-v2.rst "PID")
    /// and in v1 since Linux 4.3 (cgroup-v1/pids.rst)). `false` when nothing can
    /// be read.
    pub fn pids_limited(&self, g: &Group) -> bool {
        let Some((top, _)) = self.limit_dir(g, "pids") else {
            return false;
        };
        any_in_subtree(&top, |d| {
            read_counter(&d.join("pids.events"), "max").is_some_and(|n| n > 0)
        })
    }

    /// Whether some limit controller is in v2 here (so agents' processes live in
    /// [`PROCESS_LEAF`]).
    fn limits_in_v2(&self) -> bool {
        self.places.iter().any(|(_, p)| *p == Place::V2)
    }

    /// The directory holding `controller`'s files for `g`, and whether it is v2.
    fn limit_dir(&self, g: &Group, controller: &str) -> Option<(PathBuf, bool)> {
        match &self.places.iter().find(|(c, _)| *c == controller)?.1 {
            Place::V2 => Some((g.dir.clone(), true)),
            Place::Grouping => Some((g.dir.clone(), false)),
            Place::V1(mirror) => Some((join_rel(mirror, &g.rel), false)),
            Place::Missing => None,
        }
    }

    /// The v1 mirror directories of the group at `rel`, one per hierarchy.
    fn mirror_dirs(&self, rel: &GroupPath) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for (_, place) in &self.places {
            if let Place::V1(mirror) = place {
                let dir = join_rel(mirror, rel);
                if !out.contains(&dir) {
                    out.push(dir);
                }
            }
        }
        out
    }

    fn missing_why(&self, controller: &str) -> String {
        match self.kind {
            Kind::V2 => format!(
                "our own cgroup v2 group does not offer it (cgroup.controllers of {}) and \
                 no cgroup v1 {controller} hierarchy is mounted",
                self.own_v2_dir()
                    .map_or_else(|| "?".to_owned(), |d| d.display().to_string())
            ),
            Kind::V1Freezer | Kind::V1Pids => {
                format!("no cgroup v1 {controller} hierarchy is mounted (or we are outside it)")
            }
        }
    }

    /// Our own v2 group: the base is `<own>/brood-<instance>/s<pid>-<start>`.
    fn own_v2_dir(&self) -> Option<&Path> {
        (self.kind == Kind::V2)
            .then(|| self.base.parent()?.parent())
            .flatten()
    }

    /// Enables `controllers` in the `cgroup.subtree_control` of every group from
    /// our own down to `g`'s parent, top first (a controller can be enabled only
    /// where the parent has it enabled). Already-enabled ones cost one read.
    fn enable_v2(&self, g: &Group, controllers: &[&'static str]) -> Result<(), CgroupError> {
        let own = self.own_v2_dir().ok_or_else(|| CgroupError::Malformed {
            path: self.base.clone(),
            what: "no v2 group of our own above the base".to_owned(),
        })?;
        let mut chain: Vec<&Path> = g
            .dir
            .ancestors()
            .skip(1)
            .take_while(|d| d.starts_with(own))
            .collect();
        chain.reverse();
        let wanted = controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        for dir in chain {
            let sc = dir.join("cgroup.subtree_control");
            let now = fs::read_to_string(&sc).map_err(|e| io_err("read", &sc, e))?;
            let on: Vec<&str> = now.split_whitespace().collect();
            if controllers.iter().all(|c| on.contains(c)) {
                continue;
            }
            let mut written = write_file(&sc, &wanted);
            // EBUSY: processes inside. Only our own group's may be moved (ours);
            // the root group never answers EBUSY (it is exempt).
            if dir == own && written.as_ref().is_err_and(is_busy) {
                self.leave_own_group(own, &wanted)?;
                written = write_file(&sc, &wanted);
            }
            match written {
                Ok(()) => {}
                Err(e) if is_busy(&e) => {
                    return Err(CgroupError::InternalProcess {
                        path: dir.to_path_buf(),
                        controllers: wanted,
                        pids: local_pids(dir).unwrap_or_default(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Before our own group may hand controllers to its children it must hold no
    /// process (cgroup-v2.rst "No Internal Process Constraint"; the root group is
    /// exempt). We move ourselves and our direct children (the PID-namespace
    /// keeper) into the leaf `<own>/brood-<instance>.supervisor`, which [`detect`]
    /// sees through. Anyone else in our group is not ours to move: an error.
    fn leave_own_group(&self, own: &Path, wanted: &str) -> Result<(), CgroupError> {
        let pids = local_pids(own)?;
        if pids.is_empty() {
            return Ok(());
        }
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let (ours, others): (Vec<i32>, Vec<i32>) = pids
            .into_iter()
            .partition(|p| *p == me || parent_pid(*p) == Some(me));
        if !others.is_empty() {
            return Err(CgroupError::InternalProcess {
                path: own.to_path_buf(),
                controllers: wanted.to_owned(),
                pids: others,
            });
        }
        let leaf = own.join(supervisor_leaf(&self.instance));
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("mkdir", &leaf, e)),
        }
        let procs = leaf.join("cgroup.procs");
        for pid in ours {
            match write_file(&procs, &pid.to_string()) {
                Ok(()) => {}
                // A child that exited meanwhile.
                Err(CgroupError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The leaf of our own v2 group the supervisor moves into (see
/// [`Cgroups::set_limits`]). The `.` keeps it apart from every `brood-<instance>`
/// directory (instance names have no dot).
fn supervisor_leaf(instance: &str) -> String {
    format!("brood-{instance}.supervisor")
}

/// EBUSY from a cgroupfs write: for `cgroup.subtree_control`, processes inside.
fn is_busy(e: &CgroupError) -> bool {
    matches!(e, CgroupError::Io { source, .. } if source.raw_os_error() == Some(libc::EBUSY))
}

/// What `brood doctor` prints for a limit controller and its place.
fn place_label(controller: &str, place: &Place) -> &'static str {
    match (controller, place) {
        ("memory", Place::V2) => "memory: cgroup v2 memory.max",
        ("memory", Place::V1(_) | Place::Grouping) => {
            "memory: cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes)"
        }
        ("memory", Place::Missing) => "memory: no controller on this host",
        ("pids", Place::V2) => "pids: cgroup v2 pids.max",
        ("pids", Place::V1(_) | Place::Grouping) => "pids: cgroup v1 pids.max",
        ("pids", Place::Missing) => "pids: no controller on this host",
        ("cpu", Place::V2) => "cpu: cgroup v2 cpu.weight",
        ("cpu", Place::V1(_) | Place::Grouping) => "cpu: cgroup v1 cpu.shares",
        ("cpu", Place::Missing) => "cpu: no controller on this host",
        _ => "unknown controller",
    }
}

/// One limit into a v1 directory (or the v1 grouping directory).
fn write_v1_limit(dir: &Path, controller: &str, value: u64) -> Result<(), CgroupError> {
    match controller {
        "memory" => {
            let limit = dir.join("memory.limit_in_bytes");
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            // memsw only exists with swap accounting; when it does, the kernel keeps
            // memsw >= limit at every step (cgroup-v1/memory.rst 2.5), so lower the
            // limit first and raise memsw first.
            if !exists(&memsw)? {
                return write_file(&limit, &value.to_string());
            }
            let now = read_counter(&limit, "").unwrap_or(u64::MAX);
            if value <= now {
                write_file(&limit, &value.to_string())?;
                write_file(&memsw, &value.to_string())
            } else {
                write_file(&memsw, &value.to_string())?;
                write_file(&limit, &value.to_string())
            }
        }
        "pids" => write_file(&dir.join("pids.max"), &value.to_string()),
        "cpu" => write_file(
            &dir.join("cpu.shares"),
            &weight_to_shares(value).to_string(),
        ),
        _ => Ok(()),
    }
}

/// One limit into a v2 group.
fn write_v2_limit(dir: &Path, controller: &str, value: u64) -> Result<(), CgroupError> {
    match controller {
        "memory" => {
            write_file(&dir.join("memory.max"), &value.to_string())?;
            // As in v1: the limit covers swap too (memory.swap.max exists only
            // where swap is accounted).
            let swap = dir.join("memory.swap.max");
            if exists(&swap)? {
                write_file(&swap, "0")?;
            }
            Ok(())
        }
        "pids" => write_file(&dir.join("pids.max"), &value.to_string()),
        "cpu" => write_file(&dir.join("cpu.weight"), &value.to_string()),
        _ => Ok(()),
    }
}

/// `mirror` joined with a group path (empty: the mirror itself).
fn join_rel(mirror: &Path, rel: &GroupPath) -> PathBuf {
    if rel.0.is_empty() {
        mirror.to_path_buf()
    } else {
        mirror.join(rel.as_path())
    }
}

/// `dir/cgroup.procs`, opened for writing and never inherited (see `procs_file`).
fn open_procs(dir: &Path) -> Result<File, CgroupError> {
    let path = dir.join("cgroup.procs");
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| io_err("open", &path, e))
}

/// The value of `key` in a flat-keyed file (`key value` lines, cgroup-v2.rst
/// "Interface Files"), or of a single-value file when `key` is empty.
fn read_counter(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    if key.is_empty() {
        return text.trim().parse().ok();
    }
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Whether `pred` holds for some group of `top`'s subtree (`false` if unreadable).
fn any_in_subtree(top: &Path, pred: impl Fn(&Path) -> bool) -> bool {
    subtree(top).is_ok_and(|dirs| dirs.iter().any(|d| pred(d)))
}

/// The processes of exactly one group (not of the groups below it).
fn local_pids(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let text = fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|p| *p > 0)
        .collect())
}

/// Field 4 (ppid) of `/proc/<pid>/stat` (proc(5)).
fn parent_pid(pid: i32) -> Option<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The group `top` and every group below it, deepest first.
fn remove_tree(top: &Path) -> Result<(), CgroupError> {
    // subtree() lists every group after its parent, so reversed it is deepest first.
    for dir in subtree(top)?.iter().rev() {
        rmdir_retrying(dir)?;
    }
    Ok(())
}

/// SIGKILLs whatever is still in a v1 mirror subtree and waits for it to empty
/// (v1 has no cgroup.kill; a process listed there is already outside its v2 group,
/// so nothing else will kill it).
fn kill_v1_leftovers(top: &Path, timeout: Duration) -> Result<(), CgroupError> {
    let deadline = Instant::now() + timeout;
    loop {
        let pids = pids_under(top)?;
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CgroupError::NotEmpty {
                path: top.to_path_buf(),
                pids,
            });
        }
        for pid in pids {
            // SAFETY: kill(2) with a pid > 0 (pids_under never yields others); ESRCH
            // (already gone) is fine.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        sleep(Duration::from_millis(1));
    }
}

/// The hierarchy that groups processes, and our own directory in it.
fn grouping(det: &Detected) -> Result<(Kind, PathBuf), CgroupError> {
    match det.layout {
        Layout::V2 | Layout::Hybrid => {
            let mount = det
                .v2_mount
                .as_ref()
                .ok_or_else(|| CgroupError::NoCgroupFs("cgroup2 is not mounted".to_owned()))?;
            Ok((
                Kind::V2,
                own_dir(mount, det.own_v2.as_deref(), "cgroup v2 (0::)")?,
            ))
        }
        Layout::V1 => {
            for (kind, ctrl) in [(Kind::V1Freezer, "freezer"), (Kind::V1Pids, "pids")] {
                if let Some(mount) = det.v1_mounts.get(ctrl) {
                    let own = det.own_v1.get(ctrl).map(String::as_str);
                    return Ok((kind, own_dir(mount, own, ctrl)?));
                }
            }
            Err(CgroupError::NoCgroupFs(
                "cgroup v1 without a freezer or pids hierarchy cannot kill a tree".to_owned(),
            ))
        }
        Layout::Unavailable => Err(CgroupError::NoCgroupFs(
            "no cgroup or cgroup2 filesystem is mounted".to_owned(),
        )),
    }
}

fn own_dir(mount: &Path, own: Option<&str>, what: &str) -> Result<PathBuf, CgroupError> {
    let own = own.ok_or_else(|| {
        CgroupError::NoCgroupFs(format!(
            "cannot place our own {what} cgroup inside the mounted hierarchy"
        ))
    })?;
    // A path outside our cgroup namespace reads "/../.." (cgroup_namespaces(7)).
    if !own.starts_with('/') || own.split('/').any(|c| c == "..") {
        return Err(CgroupError::NoCgroupFs(format!(
            "our {what} cgroup {own:?} is outside what we can see"
        )));
    }
    Ok(join_own(mount, own))
}

fn instance_dir(own: &Path, instance: &str) -> Result<PathBuf, CgroupError> {
    let ok = (1..=64).contains(&instance.len())
        && instance
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(CgroupError::BadInstance(instance.to_owned()));
    }
    Ok(own.join(format!("brood-{instance}")))
}

/// The base directory of an incarnation named `incarnation` (`s<pid>-<starttime>`).
fn base_dir(
    det: &Detected,
    instance: &str,
    incarnation: &str,
) -> Result<(Kind, PathBuf), CgroupError> {
    let (kind, own) = grouping(det)?;
    Ok((kind, instance_dir(&own, instance)?.join(incarnation)))
}

fn v1_mirror(det: &Detected, kind: Kind, instance: &str, base: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let Some(incarnation) = base.file_name() else {
        return out;
    };
    for (ctrl, mount) in &det.v1_mounts {
        if kind.v1_controller() == Some(ctrl.as_str()) {
            continue;
        }
        if let Ok(dir) = own_dir(mount, det.own_v1.get(ctrl).map(String::as_str), ctrl)
            .and_then(|own| instance_dir(&own, instance))
        {
            out.insert(ctrl.clone(), dir.join(incarnation));
        }
    }
    out
}

/// `s<pid>-<starttime>` -> (pid, starttime).
fn parse_incarnation(name: &str) -> Option<(i32, u64)> {
    let (pid, start) = name.strip_prefix('s')?.split_once('-')?;
    Some((pid.parse().ok().filter(|p| *p > 0)?, start.parse().ok()?))
}

/// Start time of a live process (proc(5) `/proc/<pid>/stat` field 22, in clock
/// ticks since boot): with the pid it names one process for the life of the
/// system. `None` when there is no such process or it is a zombie.
fn start_time(pid: i32) -> Result<Option<u64>, CgroupError> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(None);
        }
        Err(e) => return Err(io_err("read", &path, e)),
    };
    parse_stat_start(&text).ok_or(CgroupError::Malformed {
        path,
        what: "no state and start time after the command name".to_owned(),
    })
}

/// Field 2 (the command) is in parentheses and may itself hold spaces and ')',
/// so fields are counted from the last ')': field 3 (state) comes first, field 22
/// nineteen places later.
fn parse_stat_start(text: &str) -> Option<Option<u64>> {
    let after = &text[text.rfind(')')? + 1..];
    let mut f = after.split_whitespace();
    let state = f.next()?;
    let start: u64 = f.nth(18)?.parse().ok()?;
    Some((state != "Z" && state != "X").then_some(start))
}

fn exists(path: &Path) -> Result<bool, CgroupError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("stat", path, e)),
    }
}

/// The group `top` and every group below it, each after its parent. Child groups
/// are the subdirectories (interface files are plain files). A child that vanishes
/// while we look (someone removed it) is skipped.
fn subtree(top: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let mut out = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if dir != top && vanished(&e) => continue,
            Err(e) => return Err(io_err("read dir", &dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err("read dir", &dir, e))?;
            let ty = entry
                .file_type()
                .map_err(|e| io_err("stat", &entry.path(), e))?;
            if ty.is_dir() {
                stack.push(entry.path());
            }
        }
        out.push(dir);
    }
    Ok(out)
}

/// Every process in `top`'s subtree, from each group's `cgroup.procs` (which may
/// repeat a pid in v1, hence the set).
fn pids_under(top: &Path) -> Result<Vec<i32>, CgroupError> {
    let mut pids = BTreeSet::new();
    for dir in subtree(top)? {
        let path = dir.join("cgroup.procs");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if dir != top && vanished(&e) => continue,
            Err(e) => return Err(io_err("read", &path, e)),
        };
        for line in text.lines() {
            let pid: i32 = line.trim().parse().map_err(|_| CgroupError::Malformed {
                path: path.clone(),
                what: format!("{line:?} is not a pid"),
            })?;
            // A process outside our PID namespace is listed as 0 (pid_namespaces(7));
            // it is not ours to signal, and kill(0, ..) would hit our own group.
            if pid > 0 {
                pids.insert(pid);
            }
        }
    }
    Ok(pids.into_iter().collect())
}

/// A group being removed answers ENOENT, or ENODEV for files still open.
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// rmdir(2) of one group, retried on EBUSY: the last process may have exited a
/// moment before the kernel lets the group go (LINUX-NOTES "Containment").
fn rmdir_retrying(dir: &Path) -> Result<(), CgroupError> {
    let mut pause = Duration::from_millis(1);
    let mut attempt = 0;
    loop {
        let e = match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => e,
        };
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(io_err("rmdir", dir, e));
        }
        if attempt >= RMDIR_RETRIES {
            // Say why when we can: processes still inside.
            let pids = pids_under(dir).unwrap_or_default();
            if pids.is_empty() {
                return Err(io_err("rmdir", dir, e));
            }
            return Err(CgroupError::NotEmpty {
                path: dir.to_path_buf(),
                pids,
            });
        }
        attempt += 1;
        sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// One write(2) of a control value; cgroupfs takes each write as one command.
fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| io_err("write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root with the given proc files (`None` leaves a file out).
    fn fake_root(
        mountinfo: Option<&str>,
        mounts: Option<&str>,
        cgroup: Option<&str>,
    ) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let proc_self = root.path().join("proc/self");
        fs::create_dir_all(&proc_self).unwrap();
        for (name, text) in [
            ("mountinfo", mountinfo),
            ("mounts", mounts),
            ("cgroup", cgroup),
        ] {
            if let Some(t) = text {
                fs::write(proc_self.join(name), t).unwrap();
            }
        }
        root
    }

    const V2_MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:23 / /proc rw,nosuid shared:12 - proc proc rw
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V2_CGROUP: &str = "0::/system.slice/brood.service\n";

    /// This host's lines, as of writing.
    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/848a6f3298eb01edf96d80a4995e6130
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

    /// A classic v1 host, given as /proc/self/mounts only (no mountinfo).
    const V1_MOUNTS: &str = "\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,nodev,noexec,relatime,freezer 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0
";
    const V1_CGROUP: &str = "\
5:pids:/system.slice/brood.service
4:freezer:/
3:cpu,cpuacct:/system.slice/brood.service
1:name=systemd:/system.slice/brood.service
";

    #[test]
    fn detects_pure_v2() {
        let root = fake_root(Some(V2_MOUNTINFO), None, Some(V2_CGROUP));
        let own = root.path().join("sys/fs/cgroup/system.slice/brood.service");
        fs::create_dir_all(&own).unwrap();
        fs::write(own.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        let d = detect(root.path()).unwrap();
        assert_eq!(d.layout, Layout::V2);
        assert_eq!(d.v2_mount, Some(root.path().join("sys/fs/cgroup")));
        assert!(d.v1_mounts.is_empty());
        assert_eq!(d.own_v2.as_deref(), Some("/system.slice/brood.service"));
        assert_eq!(d.v2_controllers, ["cpu", "io", "memory", "pids"]);
    }

    #[test]
    fn detects_this_hosts_hybrid_layout() {
        let root = fake_root(Some(HYBRID_MOUNTINFO), None, Some(HYBRID_CGROUP));
        let unified = root.path().join("sys/fs/cgroup/unified");
        fs::create_dir_all(&unified).unwrap();
        fs::write(unified.join("cgroup.controllers"), "hugetlb\n").unwrap();
        let d = detect(root.path()).unwrap();
        assert_eq!(d.layout, Layout::Hybrid);
        assert_eq!(d.v2_mount, Some(unified));
        assert_eq!(d.own_v2.as_deref(), Some("/"));
        assert_eq!(d.v2_controllers, ["hugetlb"]);
        let ctrls: Vec<&str> = d.v1_mounts.keys().map(String::as_str).collect();
        assert_eq!(
            ctrls,
            [
                "blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"
            ],
            "named hierarchies (name=systemd) are not controllers"
        );
        assert_eq!(
            d.v1_mounts["freezer"],
            root.path().join("sys/fs/cgroup/freezer")
        );
        assert_eq!(
            d.own_v1["memory"],
            "/process_api/848a6f3298eb01edf96d80a4995e6130"
        );
        assert_eq!(d.own_v1["freezer"], "/");
    }

    #[test]
    fn detects_pure_v1_from_proc_mounts() {
        let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
        let d = detect(root.path()).unwrap();
        assert_eq!(d.layout, Layout::V1);
        assert_eq!(d.v2_mount, None);
        assert_eq!(d.own_v2, None);
        let comounted = root.path().join("sys/fs/cgroup/cpu,cpuacct");
        assert_eq!(d.v1_mounts["cpu"], comounted);
        assert_eq!(d.v1_mounts["cpuacct"], comounted);
        assert_eq!(d.own_v1["cpuacct"], "/system.slice/brood.service");
        assert_eq!(d.own_v1["freezer"], "/");
    }

    #[test]
    fn detects_no_cgroups() {
        let mounts = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n25 22 0:23 / /proc rw - proc proc rw\n";
        let root = fake_root(Some(mounts), None, None);
        let d = detect(root.path()).unwrap();
        assert_eq!(d.layout, Layout::Unavailable);
        assert!(d.v1_mounts.is_empty() && d.own_v1.is_empty() && d.own_v2.is_none());
        let err = Cgroups::open(&d, "x").unwrap_err();
        assert!(matches!(err, CgroupError::NoCgroupFs(_)), "{err}");
    }

    #[test]
    fn detect_without_proc_is_an_error_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        let err = detect(root.path()).unwrap_err().to_string();
        assert!(err.contains("proc/self/mounts"), "{err}");
    }

    #[test]
    fn a_mounted_subtree_is_taken_off_our_own_path() {
        // A container without a cgroup namespace sees its own subtree mounted at
        // /sys/fs/cgroup and its full path in /proc/self/cgroup.
        let mi = "30 24 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let root = fake_root(Some(mi), None, Some("0::/docker/abc/x\n"));
        assert_eq!(detect(root.path()).unwrap().own_v2.as_deref(), Some("/x"));
        let root = fake_root(Some(mi), None, Some("0::/docker/abcdef\n"));
        assert_eq!(detect(root.path()).unwrap().own_v2, None);
    }

    #[test]
    fn mount_points_are_unescaped() {
        let mi = "30 24 0:26 / /srv/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
        let root = fake_root(Some(mi), None, Some("0::/\n"));
        let d = detect(root.path()).unwrap();
        assert_eq!(d.v2_mount, Some(root.path().join("srv/my cgroups")));
    }

    #[test]
    fn group_paths_accept_agent_names_and_refuse_everything_else() {
        let p = GroupPath::new(&["user-0", "coder-1a2b3c4d", "A.b_c+d-e"]).unwrap();
        assert_eq!(p.to_string(), "user-0/coder-1a2b3c4d/A.b_c+d-e");
        assert_eq!(p.as_path(), Path::new("user-0/coder-1a2b3c4d/A.b_c+d-e"));
        assert_eq!(
            p.child("x").unwrap().to_string(),
            "user-0/coder-1a2b3c4d/A.b_c+d-e/x"
        );
        assert_eq!(GroupPath::new(&[]).unwrap().to_string(), ".");
        assert!(GroupPath::new(&[&"a".repeat(80)]).is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "tab\t",
            "é",
            "a\0",
            &"a".repeat(81),
            "cgroup.procs",
            "cgroup.kill",
            "memory.max",
            "pids.max",
            "cpu.weight",
            "freezer.state",
            "tasks",
            "release_agent",
            "notify_on_release",
        ] {
            match GroupPath::new(&["ok", bad]) {
                Err(CgroupError::BadComponent(c)) => assert_eq!(c, bad),
                other => panic!("{bad:?} was accepted: {other:?}"),
            }
        }
        // A dot is fine where it does not follow a controller name.
        assert!(GroupPath::new(&["agent.v2", "cpux.y", ".hidden"]).is_ok());
    }

    fn detected(mountinfo: &str, cgroup: &str) -> (tempfile::TempDir, Detected) {
        let root = fake_root(Some(mountinfo), None, Some(cgroup));
        let d = detect(root.path()).unwrap();
        (root, d)
    }

    #[test]
    fn base_is_under_our_own_cgroup_and_the_instance_never_at_a_root() {
        let (root, d) = detected(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        let (kind, base) = base_dir(&d, "a1-b2", "s42-7").unwrap();
        assert_eq!(kind, Kind::V2);
        assert_eq!(
            base,
            root.path().join("sys/fs/cgroup/unified/brood-a1-b2/s42-7")
        );

        let (root, d) = detected(V2_MOUNTINFO, V2_CGROUP);
        let (_, base) = base_dir(&d, "x", "s42-7").unwrap();
        assert_eq!(
            base,
            root.path()
                .join("sys/fs/cgroup/system.slice/brood.service/brood-x/s42-7")
        );

        let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
        let mut d = detect(root.path()).unwrap();
        let (kind, base) = base_dir(&d, "x", "s42-7").unwrap();
        assert_eq!(kind, Kind::V1Freezer);
        assert_eq!(
            base,
            root.path().join("sys/fs/cgroup/freezer/brood-x/s42-7")
        );
        d.v1_mounts.remove("freezer");
        let (kind, base) = base_dir(&d, "x", "s42-7").unwrap();
        assert_eq!(kind, Kind::V1Pids);
        assert_eq!(
            base,
            root.path()
                .join("sys/fs/cgroup/pids/system.slice/brood.service/brood-x/s42-7")
        );
        d.v1_mounts.remove("pids");
        assert!(matches!(
            base_dir(&d, "x", "s1-1"),
            Err(CgroupError::NoCgroupFs(_))
        ));
    }

    #[test]
    fn instance_names_and_foreign_paths_are_refused() {
        let (_root, d) = detected(HYBRID_MOUNTINFO, HYBRID_CGROUP);
        for bad in ["", "A", "a_b", "a/b", "..", &"a".repeat(65)] {
            assert!(
                matches!(base_dir(&d, bad, "s1-1"), Err(CgroupError::BadInstance(_))),
                "{bad:?}"
            );
        }
        let (_root, d) = detected(V2_MOUNTINFO, "0::/../../elsewhere\n");
        let err = base_dir(&d, "x", "s1-1").unwrap_err().to_string();
        assert!(err.contains("outside"), "{err}");
    }

    #[test]
    fn open_on_a_fake_v1_tree_makes_the_base_and_names_mirrors() {
        let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
        let d = detect(root.path()).unwrap();
        let cg = Cgroups::open(&d, "t").unwrap();
        assert!(cg.base().is_dir());
        assert_eq!(cg.layout(), Layout::V1);
        assert_eq!(cg.kill_mechanism(), "freezer+SIGKILL");
        let me = cg.base().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(parse_incarnation(&me).is_some(), "{me}");
        let mirrors: Vec<&str> = cg.v1_mirror().keys().map(String::as_str).collect();
        assert_eq!(mirrors, ["cpu", "cpuacct", "pids"]);
        assert_eq!(
            cg.v1_mirror()["pids"],
            root.path()
                .join("sys/fs/cgroup/pids/system.slice/brood.service/brood-t")
                .join(&me)
        );

        let a = GroupPath::new(&["a"]).unwrap();
        let g = cg.create(&a).unwrap();
        assert_eq!(g.dir, cg.base().join("a"));
        let err = cg.create(&a).unwrap_err();
        assert!(err.to_string().contains(&*g.dir.to_string_lossy()), "{err}");
        let orphan = GroupPath::new(&["missing", "b"]).unwrap();
        assert!(matches!(
            cg.create(&orphan),
            Err(CgroupError::Io { op: "mkdir", .. })
        ));
        cg.create(&a.child("b").unwrap()).unwrap();
        cg.remove(&g).unwrap();
        assert!(!g.dir.exists());
        cg.remove(&g).unwrap();

        let line = format!("4:freezer:/brood-t/{me}/a/b\n0::/\n");
        assert_eq!(cg.path_of_process_line(&line), Some(cg.base().join("a/b")));
        let line = format!("4:freezer:/brood-t/{me}\n");
        assert_eq!(
            cg.path_of_process_line(&line),
            Some(cg.base().to_path_buf())
        );
        let line = format!("4:freezer:/brood-t/{me}0/a\n");
        assert_eq!(cg.path_of_process_line(&line), None);
        assert_eq!(cg.path_of_process_line("4:freezer:/\n"), None);
    }

    #[test]
    fn incarnation_names_and_stat_start_times_parse() {
        assert_eq!(parse_incarnation("s999999-1"), Some((999_999, 1)));
        for bad in ["s-1", "s1-", "x1-1", "s0-1", "s1-1-1", "s1_1", "tenant"] {
            assert_eq!(parse_incarnation(bad), None, "{bad}");
        }
        let stat = |comm: &str, state: &str| {
            format!(
                "123 ({comm}) {state} 1 123 123 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                 987654 1000 100 18446744073709551615\n"
            )
        };
        assert_eq!(parse_stat_start(&stat("sleep", "S")), Some(Some(987_654)));
        assert_eq!(parse_stat_start(&stat("a) (b c", "R")), Some(Some(987_654)));
        assert_eq!(parse_stat_start(&stat("x", "Z")), Some(None));
        assert_eq!(parse_stat_start("123 (x) S 1"), None);
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        assert!(matches!(start_time(me), Ok(Some(_))));
    }

    /// A fake pure-v2 host whose own group offers `controllers`, with the
    /// interface files the limits code writes (plain files: nothing enforces
    /// anything here, the real kernel is in tests/limits_real.rs).
    fn fake_v2(controllers: &str) -> (tempfile::TempDir, Detected, PathBuf) {
        let root = fake_root(Some(V2_MOUNTINFO), None, Some(V2_CGROUP));
        let own = root.path().join("sys/fs/cgroup/system.slice/brood.service");
        fs::create_dir_all(&own).unwrap();
        fs::write(own.join("cgroup.controllers"), controllers).unwrap();
        let d = detect(root.path()).unwrap();
        (root, d, own)
    }

    /// Makes `dir` look like a fresh v2 group.
    fn fake_group(dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        for f in [
            "cgroup.subtree_control",
            "cgroup.procs",
            "memory.max",
            "pids.max",
            "cpu.weight",
        ] {
            fs::write(dir.join(f), "").unwrap();
        }
    }

    #[test]
    fn v2_limits_enable_controllers_top_down_and_write_the_v2_files() {
        let (_root, d, own) = fake_v2("cpu io memory pids\n");
        let base = own.join("brood-x/s1-1");
        let cg = Cgroups::assemble(&d, Kind::V2, "x", base.clone());
        assert!(cg.v1_mirror().is_empty());
        assert_eq!(
            cg.limits_supported(),
            [
                ("memory: cgroup v2 memory.max", true),
                ("pids: cgroup v2 pids.max", true),
                ("cpu: cgroup v2 cpu.weight", true)
            ]
        );
        for dir in [&own, &own.join("brood-x"), &base, &base.join("t")] {
            fake_group(dir);
        }
        let g = cg.group(&GroupPath::new(&["t", "a"]).unwrap());
        fake_group(&g.dir);
        let l = Limits {
            memory_max: Some(32 << 20),
            pids_max: Some(8),
            cpu_weight: Some(250),
        };
        let h = cg.set_limits(&g, &l).unwrap();
        assert!(h.procs_files.is_empty(), "v2 needs no extra group to join");
        for dir in [&own, &own.join("brood-x"), &base, &base.join("t")] {
            let sc = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap();
            assert_eq!(sc, "+memory +pids +cpu", "{}", dir.display());
        }
        assert_eq!(
            fs::read_to_string(g.dir.join("cgroup.subtree_control")).unwrap(),
            "",
            "the agent's own group must stay free to hold its leaf"
        );
        let read = |f: &str| fs::read_to_string(g.dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), "33554432");
        assert_eq!(read("pids.max"), "8");
        assert_eq!(read("cpu.weight"), "250");

        // Only the pids limit: only pids is asked for (already on: no write).
        fs::write(own.join("cgroup.subtree_control"), "memory pids cpu\n").unwrap();
        cg.set_limits(
            &g,
            &Limits {
                pids_max: Some(3),
                ..Limits::default()
            },
        )
        .unwrap();
        assert_eq!(
            fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(),
            "memory pids cpu\n"
        );
        assert_eq!(read("pids.max"), "3");

        // The agent's processes go to its leaf, which maps back to the group.
        fake_group(&g.dir.join(PROCESS_LEAF));
        cg.procs_file(&g).unwrap();
        let line = "0::/system.slice/brood.service/brood-x/s1-1/t/a/@self\n";
        assert_eq!(cg.path_of_process_line(line), Some(g.dir.clone()));
    }

    #[test]
    fn a_v2_limit_the_host_lacks_is_refused_naming_the_controller() {
        let (_root, d, own) = fake_v2("memory\n");
        let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
        assert_eq!(
            cg.limits_supported()[1],
            ("pids: no controller on this host", false)
        );
        let g = cg.group(&GroupPath::new(&["a"]).unwrap());
        let err = cg
            .set_limits(
                &g,
                &Limits {
                    pids_max: Some(8),
                    ..Limits::default()
                },
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Unsupported {
                    controller: "pids",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("pids controller"), "{err}");
        // No limit asked for: nothing to do, whatever the host has.
        cg.set_limits(&g, &Limits::default()).unwrap();
    }

    #[test]
    fn cpu_weight_out_of_range_is_refused_and_converts_to_shares() {
        let (_root, d, own) = fake_v2("cpu\n");
        let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
        let g = cg.group(&GroupPath::new(&["a"]).unwrap());
        for w in [0, 10_001] {
            let err = cg
                .set_limits(
                    &g,
                    &Limits {
                        cpu_weight: Some(w),
                        ..Limits::default()
                    },
                )
                .unwrap_err();
            assert!(err.to_string().contains("cpu_weight"), "{err}");
        }
        assert_eq!(weight_to_shares(100), 1024, "the defaults match");
        assert_eq!(weight_to_shares(1), 10);
        assert_eq!(weight_to_shares(250), 2560);
        assert_eq!(weight_to_shares(10_000), 102_400);
        assert_eq!(weight_to_shares(0), 2, "clamped to the v1 minimum");
        assert_eq!(
            weight_to_shares(u64::MAX),
            262_144,
            "clamped to the v1 maximum"
        );
    }

    #[test]
    fn the_supervisor_moves_itself_and_its_children_only_and_detect_sees_through_its_leaf() {
        let (root, d, own) = fake_v2("memory\n");
        let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let leaf = own.join("brood-x.supervisor");
        fake_group(&leaf);
        fs::write(own.join("cgroup.procs"), format!("{me}\n")).unwrap();
        cg.leave_own_group(&own, "+memory").unwrap();
        assert_eq!(
            fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
            me.to_string()
        );

        // pid 1 is not our child: not ours to move.
        fs::write(own.join("cgroup.procs"), format!("{me}\n1\n")).unwrap();
        match cg.leave_own_group(&own, "+memory") {
            Err(CgroupError::InternalProcess { path, pids, .. }) => {
                assert_eq!(path, own);
                assert_eq!(pids, [1]);
            }
            other => panic!("{other:?}"),
        }

        fs::write(
            root.path().join("proc/self/cgroup"),
            "0::/system.slice/brood.service/brood-x.supervisor\n",
        )
        .unwrap();
        let again = detect(root.path()).unwrap();
        assert_eq!(again.own_v2.as_deref(), Some("/system.slice/brood.service"));
        let top = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let r2 = fake_root(Some(top), None, Some("0::/brood-y.supervisor\n"));
        assert_eq!(detect(r2.path()).unwrap().own_v2.as_deref(), Some("/"));
    }

    #[test]
    fn counters_read_flat_keyed_and_single_value_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        fs::write(&f, "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n").unwrap();
        assert_eq!(read_counter(&f, "oom_kill"), Some(1));
        assert_eq!(read_counter(&f, "oom"), Some(1));
        assert_eq!(read_counter(&f, "max"), Some(12));
        assert_eq!(read_counter(&f, "nope"), None);
        fs::write(&f, "9223372036854771712\n").unwrap();
        assert_eq!(read_counter(&f, ""), Some(9_223_372_036_854_771_712));
        assert_eq!(read_counter(&dir.path().join("missing"), ""), None);
    }
}
