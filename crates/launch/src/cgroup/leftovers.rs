//! Start-up hygiene (SPEC 6, "Supervisor death"; issue 28 item 2): the
//! groups that dead supervisor incarnations left behind.
//!
//! A supervisor killed by SIGKILL cannot remove its groups; its processes die
//! with it (or with the keeper), but the `s<pid>-<starttime>` groups stay.
//! Whether an incarnation is dead is told first by its liveness mark
//! (`cgroup::alive`), a lock its process holds for its whole life, which
//! reads the same from every PID namespace: held, alive; free, dead. An
//! incarnation without a mark (one from before marks, or whose user has no
//! place for them) is judged by its pid and start time in this process's
//! PID namespace, which is sound only where that is its own: for this
//! root's incarnations and for `brood doctor`, run from the host's PID
//! namespace; another root's start leaves an unmarked one alone (its
//! supervisor may live in another PID namespace, a node under `unshare`,
//! where its pid says nothing here, and even an empty group of it is its
//! live base).
//!
//! So every start ([`Cgroups::reap_host`]) kills and removes its own root's
//! dead incarnations and removes every other root's that are dead by their
//! mark and empty; `brood doctor` lists every root's dead ones
//! ([`dead_on_host`]) and `--fix` removes them, killing what is inside; a
//! benchmark removes its own ([`remove_own`]). A dead incarnation's mark
//! goes with its groups, and a mark left without a group (a crash between
//! the two) at the next look.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::alive::{self, Mark, Taken};
use super::{
    CgroupError, Cgroups, Detected, EMPTY_TIMEOUT, GroupPath, Kind, exists, grouping, instance_dir,
    io_err, parse_incarnation, pids_under, start_time,
};

/// What [`Cgroups::reap_leftovers`] cleaned up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// `s<pid>-<starttime>` groups of dead incarnations that were removed.
    pub groups: usize,
    /// Processes that were still in them and were killed.
    pub pids_killed: Vec<i32>,
    /// Liveness marks of dead incarnations whose groups were already gone.
    pub marks: usize,
}

/// What [`Cgroups::reap_host`] cleaned up, instance by instance.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HostLeftovers {
    /// Per instance (`brood-<instance>`), what was removed.
    pub reaped: BTreeMap<String, Leftovers>,
    /// Dead incarnations of other instances that still hold processes, left
    /// alone: the group and its processes.
    pub busy: Vec<(PathBuf, Vec<i32>)>,
    /// `brood-<instance>` directories of other instances removed because
    /// nothing was left in them.
    pub instance_dirs_removed: usize,
}

impl HostLeftovers {
    /// Groups removed, over every instance.
    pub fn groups(&self) -> usize {
        self.reaped.values().map(|l| l.groups).sum()
    }
}

/// How a dead incarnation's group is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Kill what is in it, then remove it.
    Kill,
    /// Remove it only when no process is in it.
    EmptyOnly,
}

/// How an incarnation without a liveness mark is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unmarked {
    /// By its pid and start time, in this process's PID namespace.
    ByPid,
    /// Not at all: it is left alone.
    Left,
}

/// An incarnation judged.
#[derive(Debug)]
enum Verdict {
    Alive,
    /// Dead; with the lock of its mark, now ours, when it has one.
    Dead(Option<Taken>),
}

impl Cgroups {
    /// Start-up hygiene (SPEC 6, "Supervisor death"): under `brood-<instance>/`,
    /// every `s<pid>-<starttime>` group whose liveness mark is free, or which
    /// has no mark and whose process is not alive with that start time,
    /// belongs to a dead incarnation: kill its subtree, wait until empty,
    /// remove it, its v1 limit mirrors (also when only a mirror was left) and
    /// its mark. Directories of another shape are not ours and are left
    /// alone. Every leftover is tried; the first error is returned after that.
    pub fn reap_leftovers(det: &Detected, instance: &str) -> Result<Leftovers, CgroupError> {
        let (kind, own) = grouping(det)?;
        let how = (Mode::Kill, Unmarked::ByPid);
        reap_instance(det, kind, &own, instance, how, &mut Vec::new())
    }

    /// What every start does (issue 28 item 2): [`Cgroups::reap_leftovers`]
    /// for `own` (this supervisor's instance, if any), and for every other
    /// `brood-<instance>` on this host, whatever root it serves, its
    /// incarnations that are dead by their mark are removed when empty (one
    /// still holding processes is named in `busy`); unmarked ones are left.
    /// With `kill_others` (the operator's `brood doctor --fix`, from the
    /// host's PID namespace) every instance is treated as `own`: dead by the
    /// mark or, unmarked, by the pid, and killed and removed. Another
    /// instance's directories left empty are removed (a starting supervisor
    /// re-makes its own, see [`Cgroups::open`]). Every instance is tried; the
    /// first error is returned after that.
    pub fn reap_host(
        det: &Detected,
        own: Option<&str>,
        kill_others: bool,
    ) -> Result<HostLeftovers, CgroupError> {
        let (kind, own_dir) = grouping(det)?;
        let mut out = HostLeftovers::default();
        let mut first_err = None;
        for instance in all_instances(det, kind, &own_dir)? {
            let ours = own == Some(instance.as_str());
            let how = if ours || kill_others {
                (Mode::Kill, Unmarked::ByPid)
            } else {
                (Mode::EmptyOnly, Unmarked::Left)
            };
            match reap_instance(det, kind, &own_dir, &instance, how, &mut out.busy) {
                Ok(l) => {
                    if l.groups > 0 || l.marks > 0 {
                        out.reaped.insert(instance.clone(), l);
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            }
            if !ours && remove_instance_if_empty(det, kind, &own_dir, &instance) {
                out.instance_dirs_removed += 1;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// Kills and removes every group this process made, under every instance,
/// and their liveness marks (a benchmark interrupted by SIGINT or SIGTERM
/// cleans up after its in-process supervisors with this); then the instance
/// directories it leaves empty. How many incarnation groups were removed.
pub fn remove_own(det: &Detected) -> Result<usize, CgroupError> {
    let (kind, own) = grouping(det)?;
    // SAFETY: getpid(2) has no preconditions.
    let pid = unsafe { libc::getpid() };
    let Some(start) = start_time(pid)? else {
        return Ok(0);
    };
    let me = format!("s{pid}-{start}");
    let marks = det.marks.as_deref();
    let mut removed = 0;
    let mut first_err = None;
    for instance in all_instances(det, kind, &own)? {
        if incarnations(det, kind, &own, &instance)?.contains(&me) {
            let ours = Cgroups::assemble(
                det,
                kind,
                &instance,
                instance_dir(&own, &instance)?.join(&me),
            );
            if let Err(e) = ours.kill_and_remove(&ours.group(&GroupPath::default()), EMPTY_TIMEOUT)
            {
                first_err.get_or_insert(e);
                continue;
            }
            removed += 1;
        }
        if let Some(m) = marks {
            alive::release(&alive::mark_path(m, &instance, &me));
        }
        remove_instance_if_empty(det, kind, &own, &instance);
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

/// The groups of dead incarnations on this host, every instance's, without
/// touching them (what `brood doctor` reports and `--fix` removes): dead by
/// their liveness mark, or, unmarked, by their pid in this process's PID
/// namespace (the host's, for the operator's `brood doctor`).
pub fn dead_on_host(det: &Detected) -> Result<Vec<PathBuf>, CgroupError> {
    let (kind, own) = grouping(det)?;
    let mut out = Vec::new();
    for instance in instances(det, kind, &own)? {
        for name in incarnations(det, kind, &own, &instance)? {
            // The lock of a dead one's mark is let go at once.
            if let Verdict::Dead(_) = judge(det, &instance, &name, Unmarked::ByPid)? {
                out.push(instance_dir(&own, &instance)?.join(name));
            }
        }
    }
    Ok(out)
}

/// Whether incarnation `name` of `instance` is dead: by its mark, or
/// without one as `unmarked` says. A name not of the `s<pid>-<starttime>`
/// shape is not an incarnation, and never dead.
fn judge(
    det: &Detected,
    instance: &str,
    name: &str,
    unmarked: Unmarked,
) -> Result<Verdict, CgroupError> {
    let Some((pid, start)) = parse_incarnation(name) else {
        return Ok(Verdict::Alive);
    };
    Ok(match alive::look(det.marks.as_deref(), instance, name) {
        Mark::Held => Verdict::Alive,
        Mark::Free(taken) => Verdict::Dead(Some(taken)),
        Mark::None if unmarked == Unmarked::Left => Verdict::Alive,
        Mark::None if start_time(pid)? == Some(start) => Verdict::Alive,
        Mark::None => Verdict::Dead(None),
    })
}

/// The directories holding `brood-<instance>` directories: our own in the
/// grouping hierarchy, and its mirror in each v1 hierarchy that carries
/// limits (found from a probe incarnation's mirror paths: `<own v1>/brood-x/s1-1`).
fn parents(det: &Detected, kind: Kind, own: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let probe_dir = instance_dir(own, "x")?.join("s1-1");
    let probe = Cgroups::assemble(det, kind, "x", probe_dir);
    let mut out = vec![own.to_path_buf()];
    for m in probe.mirror_dirs(&GroupPath::default()) {
        if let Some(p) = m.parent().and_then(Path::parent) {
            out.push(p.to_path_buf());
        }
    }
    out.dedup();
    Ok(out)
}

/// Every instance with a directory in any hierarchy: `brood-<instance>` names
/// that are valid instance keys (so `brood-<instance>.supervisor` leaves and
/// anything not brood's are skipped).
fn instances(det: &Detected, kind: Kind, own: &Path) -> Result<BTreeSet<String>, CgroupError> {
    let mut out = BTreeSet::new();
    for parent in parents(det, kind, own)? {
        let entries = match fs::read_dir(&parent) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read dir", &parent, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err("read dir", &parent, e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if let Some(instance) = name.strip_prefix("brood-")
                && instance_dir(own, instance).is_ok()
                && entry.file_type().is_ok_and(|t| t.is_dir())
            {
                out.insert(instance.to_owned());
            }
        }
    }
    Ok(out)
}

/// Removes an instance's directories once nothing is in them: the
/// grouping hierarchy's first (a live incarnation keeps it non-empty, and
/// `rmdir` refuses it), then the v1 mirrors' and the directory of its
/// liveness marks. Whether any was there and removed.
fn remove_instance_if_empty(det: &Detected, kind: Kind, own: &Path, instance: &str) -> bool {
    let Ok(dir) = instance_dir(own, instance) else {
        return false;
    };
    let mut removed = match fs::remove_dir(&dir) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        // Not empty, or busy: in use.
        Err(_) => return false,
    };
    let probe = Cgroups::assemble(det, kind, instance, dir.join("s1-1"));
    for m in probe.mirror_dirs(&GroupPath::default()) {
        if let Some(inst) = m.parent() {
            // A mirror still holding a group is left for its owner.
            removed |= fs::remove_dir(inst).is_ok();
        }
    }
    // A supervisor starting makes its mark before its group: a mark left
    // keeps the directory.
    removed |= alive::remove_instance_if_empty(det.marks.as_deref(), instance);
    removed
}

/// Every instance on this host: with a directory in any hierarchy, or with
/// liveness marks (all its groups may be gone).
fn all_instances(det: &Detected, kind: Kind, own: &Path) -> Result<BTreeSet<String>, CgroupError> {
    let mut all = instances(det, kind, own)?;
    for instance in alive::instances(det.marks.as_deref())? {
        if instance_dir(own, &instance).is_ok() {
            all.insert(instance);
        }
    }
    Ok(all)
}

/// The `s<pid>-<starttime>` names under an instance's directories, in the
/// grouping hierarchy and in the limit mirrors (a mirror may be all a dead
/// incarnation left).
fn incarnations(
    det: &Detected,
    kind: Kind,
    own: &Path,
    instance: &str,
) -> Result<BTreeSet<String>, CgroupError> {
    let dir = instance_dir(own, instance)?;
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
    Ok(names)
}

/// One instance's dead incarnations (see [`Cgroups::reap_leftovers`]),
/// judged as `how` says; in [`Mode::EmptyOnly`], one that still holds a
/// process is left and named in `busy`. Then the marks of dead
/// incarnations that have no group any more.
fn reap_instance(
    det: &Detected,
    kind: Kind,
    own: &Path,
    instance: &str,
    (mode, unmarked): (Mode, Unmarked),
    busy: &mut Vec<(PathBuf, Vec<i32>)>,
) -> Result<Leftovers, CgroupError> {
    let dir = instance_dir(own, instance)?;
    let names = incarnations(det, kind, own, instance)?;
    let mut out = Leftovers::default();
    let mut first_err = None;
    for name in &names {
        let result = judge(det, instance, name, unmarked).and_then(|verdict| {
            let Verdict::Dead(mark) = verdict else {
                return Ok(());
            };
            let dead = Cgroups::assemble(det, kind, instance, dir.join(name));
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
            if mode == Mode::EmptyOnly && !pids.is_empty() {
                // Its mark stays, free, for whoever removes it.
                busy.push((all.dir.clone(), pids));
                return Ok(());
            }
            dead.kill_and_remove(&all, EMPTY_TIMEOUT)?;
            out.groups += 1;
            out.pids_killed.extend(pids);
            if let Some(mark) = mark {
                mark.remove();
            }
            Ok(())
        });
        if let Err(e) = result {
            first_err.get_or_insert(e);
        }
    }
    // Marks whose groups were gone already (a looker or a benchmark stopped
    // between the two). A free one is a dead incarnation's: one starting
    // holds its mark before it makes its group, so no group can appear
    // while we hold the lock; looked at once more to be sure.
    for name in alive::marked(det.marks.as_deref(), instance)? {
        if names.contains(&name) {
            continue;
        }
        if let Mark::Free(mark) = alive::look(det.marks.as_deref(), instance, &name) {
            match incarnations(det, kind, own, instance) {
                Ok(now) if !now.contains(&name) => {
                    mark.remove();
                    out.marks += 1;
                }
                Ok(_) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
