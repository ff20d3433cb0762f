//! A group emptied off the dispatcher: a stop's (reported back as
//! `Cmd::StopDone`), or the group of a run that ended, removed with what it
//! left in its channel.

use std::time::Duration;

use brood_launch::cgroup::Cgroups;
use brood_launch::cgroup::Group;

use super::Stops;
use crate::supervisor::Cmd;
use crate::supervisor::disk::{ToClear, clear_channels};

/// SIGTERM (when `term`) to every process of the group's subtree, up to `grace`
/// for them to go, then `cgroup.kill`, confirm empty, remove.
pub(in crate::supervisor) async fn empty_group(
    cg: &Cgroups,
    g: &Group,
    grace: Duration,
    term: bool,
) -> Result<(), String> {
    if !g.dir.exists() {
        // Already removed (with its parent's group, or by the supervisor's shutdown).
        return Ok(());
    }
    if term {
        cg.signal(g, libc::SIGTERM).map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + grace;
        let mut step = Duration::from_millis(1);
        while cg.is_populated(g).map_err(|e| e.to_string())? {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(step).await;
            step = (step * 2).min(Duration::from_millis(2));
        }
    }
    if cg.is_populated(g).map_err(|e| e.to_string())? {
        cg.kill(g).map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut step = Duration::from_micros(200);
        while cg.is_populated(g).map_err(|e| e.to_string())? {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{} still populated 5 s after cgroup.kill",
                    g.dir.display()
                ));
            }
            tokio::time::sleep(step).await;
            step = (step * 2).min(Duration::from_millis(2));
        }
    }
    cg.remove(g).map_err(|e| e.to_string())
}

impl Stops {
    /// Removes `group` (its run has ended), then (the group empty) the
    /// `artifact/` of `clear`, a channel whose run recorded no result, and
    /// tells the loop the run's slot is free (`slot`, `Cmd::Emptied`).
    /// Without cgroups it is emptied at once: the run's process has exited,
    /// and that weaker mode cannot see the rest
    /// (docs/decisions/containment.md "Nothing of a refused or stopped
    /// result is left behind").
    pub(in crate::supervisor) fn remove_group(
        &self,
        group: Option<Group>,
        clear: Option<ToClear>,
        slot: bool,
    ) {
        let tx = self.tx.clone();
        let emptied = move || {
            if slot {
                let _ = tx.send(Cmd::Emptied(1));
            }
        };
        let (Some(g), Some(cg)) = (group, self.cgroups.clone()) else {
            if let Some(dir) = clear {
                tokio::spawn(clear_channels(vec![dir]));
            }
            emptied();
            return;
        };
        let grace = self.grace;
        tokio::spawn(async move {
            match empty_group(&cg, &g, grace, false).await {
                Ok(()) => clear_channels(clear.into_iter().collect()).await,
                // Not emptied: what it left stays for `brood fsck`, which
                // runs once nothing of it lives. Its slot is given back
                // all the same: a group `cgroup.kill` cannot empty in 5 s
                // holds processes the kernel cannot end (in D state), and
                // a slot kept for them would be lost for good.
                Err(e) => {
                    tracing::error!(group = %g.dir.display(), error = %e, "removing a cgroup failed")
                }
            }
            emptied();
        });
    }

    /// Empties a stop's group (SIGTERM first when `term`, then the grace,
    /// `cgroup.kill`, confirmed empty, removed) after `delay`, off the
    /// dispatcher, then the `artifact/` of `clear`, and reports `StopDone`
    /// with the outcome: by the time the ends are recorded, nothing the
    /// stopped runs wrote there is left.
    pub(super) fn empty(
        &self,
        id: u64,
        group: Option<Group>,
        pgids: Vec<i32>,
        term: bool,
        delay: Duration,
        clear: Vec<ToClear>,
    ) {
        let cg = self.cgroups.clone();
        let tx = self.tx.clone();
        let grace = self.grace;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let t_sig = std::time::Instant::now();
            let mut emptied: Result<(), String> = Ok(());
            match (cg, group) {
                (Some(cg), Some(g)) => {
                    if let Err(e) = empty_group(&cg, &g, grace, term).await {
                        tracing::error!(group = %g.dir.display(), error = %e, "emptying a cgroup failed");
                        emptied = Err(e);
                    }
                }
                _ => {
                    // Without cgroups: process groups only (weaker; see doctor).
                    for p in &pgids {
                        // SAFETY: signalling a process group we created.
                        unsafe { libc::killpg(*p, libc::SIGTERM) };
                    }
                    // The grace ends early once every group is gone (signal 0
                    // probes without sending).
                    // SAFETY (both closures' calls): as above.
                    let any_left = || pgids.iter().any(|p| unsafe { libc::killpg(*p, 0) } == 0);
                    let deadline = tokio::time::Instant::now() + grace;
                    while any_left() && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    for p in &pgids {
                        // SAFETY: as above.
                        unsafe { libc::killpg(*p, libc::SIGKILL) };
                    }
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                    while any_left() && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if any_left() {
                        // A member may be a zombie not yet reaped by whoever
                        // adopted it: warn, as this weaker mode can only.
                        tracing::warn!(
                            ?pgids,
                            "process groups still have members 5 s after SIGKILL"
                        );
                    }
                }
            }
            tracing::debug!(
                elapsed_us = t_sig.elapsed().as_micros() as u64,
                "stop: group emptied"
            );
            if emptied.is_ok() {
                clear_channels(clear).await;
            }
            let _ = tx.send(Cmd::StopDone(id, emptied));
        });
    }
}
