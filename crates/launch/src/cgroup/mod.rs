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
//! earlier, dead incarnation left behind and kill them ([`Cgroups::reap_host`],
//! SPEC 6 "Supervisor death"). Dead is told by the incarnation's liveness mark
//! (`alive`), which [`Cgroups::open`] takes before it makes the group.
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
//!
//! The code, by hierarchy: this file is the one interface (groups, kill, empty,
//! remove, leftovers); `detect` finds the layout; `limits` places each limit
//! in v2 or in a v1 mirror; `v1` is what only v1 needs (the freezer kill, the
//! mirrors' paths, the leftovers of a mirror); `alive` the incarnations'
//! liveness marks and `leftovers` what dead ones left.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

mod alive;
mod detect;
mod leftovers;
mod limits;
mod v1;

use detect::*;
pub use detect::{Detected, Layout, detect};
pub use leftovers::{HostLeftovers, Leftovers, dead_on_host, remove_own};
use limits::*;
pub use limits::{LimitHandles, Limits, PROCESS_LEAF, weight_to_shares};
use v1::*;

/// How many times `rmdir` is retried on `EBUSY`: the kernel can report a group
/// busy for a moment after its last process exited (youki retries too). With the
/// doubling pause below this waits about 200 ms in all.
const RMDIR_RETRIES: u32 = 10;
/// How long [`Cgroups::destroy`] and [`Cgroups::reap_leftovers`] wait for a killed
/// group to empty.
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The liveness mark this process holds for the incarnation
    /// (`cgroup::alive`), or why there is none.
    mark: Result<PathBuf, String>,
}

impl Cgroups {
    /// Creates (`mkdir -p`) `<own cgroup>/brood-<instance>/s<pid>-<starttime>` in the
    /// grouping hierarchy and returns the handle to it. First it takes the
    /// incarnation's liveness mark, held until [`Cgroups::destroy`] or the
    /// end of this process; one that cannot be made is no error
    /// ([`Cgroups::mark`] says why).
    pub fn open(det: &Detected, instance: &str) -> Result<Cgroups, CgroupError> {
        // SAFETY: getpid(2) has no preconditions.
        let pid = unsafe { libc::getpid() };
        let start = start_time(pid)?.ok_or_else(|| CgroupError::Malformed {
            path: PathBuf::from(format!("/proc/{pid}/stat")),
            what: "our own process looks dead".to_owned(),
        })?;
        let name = format!("s{pid}-{start}");
        let (kind, base) = base_dir(det, instance, &name)?;
        // The mark before the group: a looker that finds the group finds it
        // held, never free (which would read as dead).
        let mark = match &det.marks {
            Some(m) => alive::hold(m, instance, &name).map_err(|e| e.to_string()),
            None => Err("this user has no place for liveness marks \
                 (no /run/user/<uid> of its own)"
                .to_owned()),
        };
        let made = make_base(kind, &base);
        if let Err(e) = made {
            if let Ok((path, true)) = &mark {
                alive::release(path);
            }
            return Err(e);
        }
        let mut c = Cgroups::assemble(det, kind, instance, base);
        c.mark = mark.map(|(path, _)| path);
        Ok(c)
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
            mark: Err("a handle on an incarnation holds no mark of it".to_owned()),
        }
    }

    /// The file of the liveness mark this process holds for its incarnation
    /// (`cgroup::alive`), or why it runs without one: then a start of
    /// another root cannot tell it alive and leaves its groups alone, and
    /// its own root's next start and `brood doctor` judge it by its pid.
    pub fn mark(&self) -> Result<&Path, &str> {
        match &self.mark {
            Ok(p) => Ok(p),
            Err(e) => Err(e),
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

    /// The group whose directory is `dir`, when that is below this
    /// incarnation's base (a directory a run of this supervisor recorded);
    /// `None` for the base itself, another incarnation's or anything else.
    pub fn group_at(&self, dir: &Path) -> Option<Group> {
        let rest = dir.strip_prefix(&self.base).ok()?;
        let comps: Vec<&str> = rest
            .components()
            .map(|c| c.as_os_str().to_str())
            .collect::<Option<_>>()?;
        if comps.is_empty() {
            return None;
        }
        let rel = GroupPath::new(&comps).ok()?;
        Some(self.group(&rel))
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

    /// The processes of the group itself, not of the groups below it (its
    /// child agents'): where [`Cgroups::procs_file`] puts them. A group
    /// being removed has none.
    pub fn own_pids(&self, g: &Group) -> Result<Vec<i32>, CgroupError> {
        let dir = if self.limits_in_v2() {
            g.dir.join(PROCESS_LEAF)
        } else {
            g.dir.clone()
        };
        let path = dir.join("cgroup.procs");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if vanished(&e) => return Ok(Vec::new()),
            Err(e) => return Err(io_err("read", &path, e)),
        };
        // A process outside our PID namespace is listed as 0; it is not ours.
        Ok(text
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter(|&p| p > 0)
            .collect())
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

    /// Whether any process is in the group's subtree: v2 `cgroup.events`
    /// `populated` (cgroup-v2.rst), v1 any pid in a `cgroup.procs`.
    pub fn is_populated(&self, g: &Group) -> Result<bool, CgroupError> {
        if self.kind != Kind::V2 {
            return Ok(!self.pids(g)?.is_empty());
        }
        let path = g.dir.join("cgroup.events");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            // Removed meanwhile (by another stop of the same agent): a group
            // that is gone holds no process.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err("read", &path, e)),
        };
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

    /// On clean shutdown: kill and remove everything of this incarnation,
    /// then its liveness mark (a group that could not be removed keeps it,
    /// held while this process lives). The `brood-<instance>` directory
    /// stays: another incarnation may be starting in it.
    pub fn destroy(&self) -> Result<(), CgroupError> {
        self.kill_and_remove(&self.group(&GroupPath::default()), EMPTY_TIMEOUT)?;
        if let Ok(path) = &self.mark {
            alive::release(path);
        }
        Ok(())
    }

    /// After [`Cgroups::destroy`]: removes this instance's `brood-<instance>`
    /// directories, in v2 and in every v1 mirror, when no other incarnation is
    /// using them (`rmdir` refuses a non-empty group, which is then left alone).
    pub fn remove_instance_dirs(&self) {
        let bases = std::iter::once(&self.base).chain(self.v1_mirror.values());
        let marks = self.mark.as_ref().ok();
        for base in bases.chain(marks) {
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

/// `mkdir -p` of an incarnation's base; on v2, checks it can be killed.
fn make_base(kind: Kind, base: &Path) -> Result<(), CgroupError> {
    // Another instance's start removes `brood-<instance>` when it finds it
    // empty (`reap_host`); made between our `mkdir`s, it is made again.
    let mut tries = 0;
    while let Err(e) = fs::create_dir_all(base) {
        tries += 1;
        if e.kind() != io::ErrorKind::NotFound || tries >= 5 {
            return Err(io_err("mkdir -p", base, e));
        }
    }
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
    Ok(())
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
mod tests;
