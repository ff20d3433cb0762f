//! Disk as a resource (issue 24 item 6), the dispatcher's side: each
//! sweeper tick, the `artifact/` of every running agent this supervisor
//! hosts is measured against its `disk_max` (`channel::usage`, on a
//! blocking thread, one pass at a time); an agent past it is stopped
//! `failed (budget_exceeded)` with a detail naming `resources.disk_max`, its
//! subtree with it. And what a run leaves in its channel's `artifact/` when
//! it ends without a recorded result is removed once its group is empty
//! (`channel::clear`), so no stop, crash or refusal keeps bytes that no
//! record accounts for: a stopped run's before its end is recorded, a run
//! that ended by itself (its group perhaps still alive) set aside at once
//! and removed once the group is empty, so a resume never loses a byte.
//!
//! The kernel bounds each file (`RLIMIT_FSIZE`, set at launch); this bounds
//! the sum over the one directory a child hands back through, and, on the
//! same tick, everything its processes have written to disk anywhere
//! (`brood_launch::written`, the kernel's per-process write accounting): a
//! run that has written more than its `disk_max` is stopped the same way, so
//! many files each under the limit in its writable paths cannot fill the
//! disk either (docs/security.md, "Disk").

use std::path::PathBuf;

use brood_core::{AgentName, FailReason, RunId, Terminal};
use brood_launch::cgroup::{Cgroups, Group};

use super::{Cmd, Dispatcher};

/// One running agent's `artifact/` found over its limit: why, in words
/// naming the limit.
pub(crate) struct DiskOver {
    name: AgentName,
    run: RunId,
    why: String,
}

/// One running agent to measure: its channel (a child's), its group, its limit.
struct Target {
    name: AgentName,
    run: RunId,
    channel: Option<PathBuf>,
    group: Option<Group>,
    limit: u64,
}

/// Why `t`'s processes have written more than its `disk_max`, if they have.
/// Without cgroups there is no list of its processes to read, and only the
/// per-file limit and `artifact/`'s measure hold (`brood doctor` says so).
fn over_written(cgroups: Option<&Cgroups>, t: &Target) -> Option<String> {
    let (cg, group) = cgroups.zip(t.group.as_ref())?;
    let pids = match cg.own_pids(group) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(agent = %t.name, error = %e, "listing an agent's processes to measure its writes");
            return None;
        }
    };
    let written = brood_launch::written::by(&pids);
    (written > t.limit).then(|| {
        format!(
            "its processes wrote {written} bytes to disk, past resources.disk_max ({} bytes)",
            t.limit
        )
    })
}

impl Dispatcher {
    /// Starts a measure of every running agent's `artifact/`, unless the
    /// last one has not answered yet (a tick never queues a second walk).
    pub(super) fn watch_disk(&mut self) {
        if self.sweep.disk_busy {
            return;
        }
        let default = self.host.cfg.resource_defaults.disk_max;
        let targets: Vec<Target> = self
            .agents
            .live
            .iter()
            .filter(|(_, l)| l.pid.is_some() && l.stopping.is_none())
            .map(|(n, l)| Target {
                name: n.clone(),
                run: l.run.clone(),
                channel: l.channel_dir(&self.host.paths, n),
                group: l.group.clone(),
                limit: crate::enforce::file_size_max(&l.policy, default),
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        self.sweep.disk_busy = true;
        let tx = self.host.tx.clone();
        let cgroups = self.launcher.cgroups.clone();
        tokio::task::spawn_blocking(move || {
            let over: Vec<DiskOver> = targets
                .into_iter()
                .filter_map(|t| {
                    // `artifact/` first: what it holds was written too, so
                    // it is the more precise word when both are over.
                    let why = t
                        .channel
                        .as_ref()
                        .and_then(|c| crate::channel::usage::check(c, t.limit).err())
                        .map(|o| o.0)
                        .or_else(|| over_written(cgroups.as_deref(), &t))?;
                    Some(DiskOver {
                        name: t.name,
                        run: t.run,
                        why,
                    })
                })
                .collect();
            let _ = tx.send(Cmd::DiskChecked(over));
        });
    }

    /// The answer of [`Self::watch_disk`]: each agent still on the run that
    /// was measured, and not already stopping, is stopped.
    pub(super) fn on_disk_checked(&mut self, over: Vec<DiskOver>) {
        self.sweep.disk_busy = false;
        for o in over {
            let Some(l) = self.agents.live.get_mut(&o.name) else {
                continue;
            };
            if l.run != o.run || l.stopping.is_some() || l.pid.is_none() {
                continue;
            }
            tracing::info!(agent = %o.name, why = %o.why, "over its disk_max; stopping the subtree");
            l.budget_note = Some(format!("disk: {}", o.why));
            self.stop_subtree(&o.name, Terminal::Failed(FailReason::BudgetExceeded));
        }
    }

    /// The `artifact/` directories of the stopped targets this supervisor
    /// hosts: they record no result, so what they wrote there goes.
    pub(super) fn channels_of(&self, targets: &[(AgentName, Terminal)]) -> Vec<ToClear> {
        targets
            .iter()
            .filter_map(|(n, _)| self.agents.live.get(n)?.channel_dir(&self.host.paths, n))
            .map(|channel| ToClear {
                channel,
                set_aside: None,
            })
            .collect()
    }

    /// The `artifact/` of `name`'s run, which ended without a result, set
    /// aside now (one rename) for removal once its group is empty.
    pub(super) fn set_aside_artifacts(&self, name: &AgentName) -> Option<ToClear> {
        let l = self.agents.live.get(name)?;
        let channel = l.channel_dir(&self.host.paths, name)?;
        match crate::channel::clear::set_aside(&channel, l.run.as_str()) {
            Ok(Some(name)) => Some(ToClear {
                channel,
                set_aside: Some(name),
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(agent = %name, error = %e, "setting artifact/ aside; left for brood fsck");
                None
            }
        }
    }
}

/// A channel's `artifact/` to empty once a group is: in place (a stop's
/// targets, before their ends are recorded), or the directory a run's was
/// set aside as, to remove.
#[derive(Debug, Clone)]
pub(super) struct ToClear {
    channel: PathBuf,
    set_aside: Option<String>,
}

/// Empties each (the runs' groups are dead by now), on a blocking thread;
/// a failure is logged, naming the channel, and left for `brood fsck`.
pub(super) async fn clear_channels(dirs: Vec<ToClear>) {
    if dirs.is_empty() {
        return;
    }
    let done = tokio::task::spawn_blocking(move || {
        for d in dirs {
            let r = match &d.set_aside {
                None => crate::channel::clear::clear(&d.channel, &Default::default()),
                Some(name) => crate::channel::clear::remove_set_aside(&d.channel, name),
            };
            if let Err(e) = r {
                tracing::warn!(channel = %d.channel.display(), error = %e, "emptying artifact/ of a run without a result");
            }
        }
    })
    .await;
    if let Err(e) = done {
        tracing::error!(error = %e, "emptying artifact/ of runs without a result");
    }
}
