//! Resource limits ([`Cgroups::set_limits`], SPEC 5 `resources`), per
//! controller wherever this host has it: in the v2 group (controllers enabled
//! top down, the supervisor and each agent's own processes moved into leaves)
//! or in the v1 mirrors of a hybrid or v1 host. See the module docs of
//! `crate::cgroup`.

use super::{
    CgroupError, Cgroups, Group, GroupPath, Kind, any_in_subtree, exists, io_err, join_rel,
    local_pids, open_procs, parent_pid, write_file,
};
use std::fs;
use std::fs::File;
use std::io;
use std::path::Path;
use std::path::PathBuf;

/// The controllers brood limits, in the order limits are applied and reported.
pub(super) const LIMIT_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

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
pub(super) enum Place {
    /// In the v2 group itself.
    V2,
    /// In the v1 grouping hierarchy itself (pure v1 grouping with `pids`).
    Grouping,
    /// In a v1 hierarchy next to the grouping one: the base's mirror there.
    V1(PathBuf),
    /// Nowhere on this host.
    Missing,
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
    pub(super) fn limits_in_v2(&self) -> bool {
        self.places.iter().any(|(_, p)| *p == Place::V2)
    }

    /// The directory holding `controller`'s files for `g`, and whether it is v2.
    pub(super) fn limit_dir(&self, g: &Group, controller: &str) -> Option<(PathBuf, bool)> {
        match &self.places.iter().find(|(c, _)| *c == controller)?.1 {
            Place::V2 => Some((g.dir.clone(), true)),
            Place::Grouping => Some((g.dir.clone(), false)),
            Place::V1(mirror) => Some((join_rel(mirror, &g.rel), false)),
            Place::Missing => None,
        }
    }

    /// The v1 mirror directories of the group at `rel`, one per hierarchy.
    pub(super) fn mirror_dirs(&self, rel: &GroupPath) -> Vec<PathBuf> {
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

    pub(super) fn missing_why(&self, controller: &str) -> String {
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
    pub(super) fn own_v2_dir(&self) -> Option<&Path> {
        (self.kind == Kind::V2)
            .then(|| self.base.parent()?.parent())
            .flatten()
    }

    /// Enables `controllers` in the `cgroup.subtree_control` of every group from
    /// our own down to `g`'s parent, top first (a controller can be enabled only
    /// where the parent has it enabled). Already-enabled ones cost one read.
    pub(super) fn enable_v2(
        &self,
        g: &Group,
        controllers: &[&'static str],
    ) -> Result<(), CgroupError> {
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
    pub(super) fn leave_own_group(&self, own: &Path, wanted: &str) -> Result<(), CgroupError> {
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
pub(super) fn supervisor_leaf(instance: &str) -> String {
    format!("brood-{instance}.supervisor")
}

/// EBUSY from a cgroupfs write: for `cgroup.subtree_control`, processes inside.
pub(super) fn is_busy(e: &CgroupError) -> bool {
    matches!(e, CgroupError::Io { source, .. } if source.raw_os_error() == Some(libc::EBUSY))
}

/// What `brood doctor` prints for a limit controller and its place.
pub(super) fn place_label(controller: &str, place: &Place) -> &'static str {
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
pub(super) fn write_v1_limit(dir: &Path, controller: &str, value: u64) -> Result<(), CgroupError> {
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
pub(super) fn write_v2_limit(dir: &Path, controller: &str, value: u64) -> Result<(), CgroupError> {
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

/// The value of `key` in a flat-keyed file (`key value` lines, cgroup-v2.rst
/// "Interface Files"), or of a single-value file when `key` is empty.
pub(super) fn read_counter(path: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    if key.is_empty() {
        return text.trim().parse().ok();
    }
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
