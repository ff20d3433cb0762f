//! What only cgroup v1 needs: killing by freezing, SIGKILLing and thawing
//! until empty (v1 has no `cgroup.kill`), the mirrors of each group in the v1
//! controller hierarchies that carry limits, and killing what a process left
//! in a mirror after it left its v2 group.

use super::{
    CgroupError, Cgroups, Detected, Group, Kind, instance_dir, io_err, own_dir, pids_under,
    write_file,
};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::path::PathBuf;
use std::thread::sleep;
use std::time::Duration;
use std::time::Instant;

/// How long a v1 kill keeps freezing and killing before it gives up.
pub(super) const V1_KILL_DEADLINE: Duration = Duration::from_secs(5);

/// How long one v1 round waits for `FROZEN`, and then for the group to empty.
pub(super) const V1_FREEZE_WAIT: Duration = Duration::from_millis(100);
pub(super) const V1_ROUND_WAIT: Duration = Duration::from_millis(50);

/// SIGKILLs whatever is still in a v1 mirror subtree and waits for it to empty
/// (v1 has no cgroup.kill; a process listed there is already outside its v2 group,
/// so nothing else will kill it).
pub(super) fn kill_v1_leftovers(top: &Path, timeout: Duration) -> Result<(), CgroupError> {
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

pub(super) fn v1_mirror(
    det: &Detected,
    kind: Kind,
    instance: &str,
    base: &Path,
) -> BTreeMap<String, PathBuf> {
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

impl Cgroups {
    /// v1 has no cgroup.kill: stop the subtree from forking (frozen, or pids.max 0),
    /// SIGKILL whatever is listed, thaw so the signals are acted on, and repeat
    /// until nothing is left.
    pub(super) fn kill_v1(&self, g: &Group) -> Result<(), CgroupError> {
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
    pub(super) fn freeze_v1(&self, g: &Group) -> Result<(), CgroupError> {
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
}
