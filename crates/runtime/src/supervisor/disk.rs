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
//! the sum over the one directory a child hands back through. Its writable
//! paths outside the channel are bounded per file only (docs/security.md,
//! "Disk").

use std::path::PathBuf;

use brood_core::{AgentName, FailReason, RunId, Terminal};

use super::{Cmd, Dispatcher};

/// One running agent's `artifact/` found over its limit: why, in words
/// naming the limit.
pub(crate) struct DiskOver {
    name: AgentName,
    run: RunId,
    why: String,
}

impl Dispatcher {
    /// Starts a measure of every running agent's `artifact/`, unless the
    /// last one has not answered yet (a tick never queues a second walk).
    pub(super) fn watch_disk(&mut self) {
        if self.sweep.disk_busy {
            return;
        }
        let default = self.cfg.resource_defaults.disk_max;
        let targets: Vec<(AgentName, RunId, PathBuf, u64)> = self
            .live
            .iter()
            .filter(|(_, l)| l.pid.is_some() && l.stopping.is_none())
            .filter_map(|(n, l)| {
                let dir = l.channel_dir(&self.paths, n)?;
                let limit = crate::enforce::file_size_max(&l.policy, default);
                Some((n.clone(), l.run.clone(), dir, limit))
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        self.sweep.disk_busy = true;
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let over: Vec<DiskOver> = targets
                .into_iter()
                .filter_map(|(name, run, dir, limit)| {
                    crate::channel::usage::check(&dir, limit)
                        .err()
                        .map(|o| DiskOver {
                            name,
                            run,
                            why: o.0,
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
            let Some(l) = self.live.get_mut(&o.name) else {
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
            .filter_map(|(n, _)| self.live.get(n)?.channel_dir(&self.paths, n))
            .map(|channel| ToClear {
                channel,
                set_aside: None,
            })
            .collect()
    }

    /// The `artifact/` of `name`'s run, which ended without a result, set
    /// aside now (one rename) for removal once its group is empty.
    pub(super) fn set_aside_artifacts(&self, name: &AgentName) -> Option<ToClear> {
        let l = self.live.get(name)?;
        let channel = l.channel_dir(&self.paths, name)?;
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
