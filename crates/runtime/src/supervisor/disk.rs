//! Disk as a resource (issue 24 item 6), the supervisor's part: each
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
use std::sync::Arc;

use brood_core::{AgentName, RunId, Terminal};
use brood_launch::cgroup::{Cgroups, Group};
use tokio::sync::mpsc;

use super::Cmd;
use super::agents::Agents;
use crate::paths::Paths;

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

/// A part of the supervisor: the measure of its running agents' disk, one
/// pass at a time.
#[derive(Default)]
pub(super) struct DiskWatch {
    /// A measure is under way (its answer is a `Cmd::DiskChecked`).
    busy: bool,
}

impl DiskWatch {
    /// Starts a measure of every running agent's `artifact/` (and what its
    /// processes wrote) on a blocking thread, answered on `tx`, unless the
    /// last one has not answered yet (a tick never queues a second walk).
    /// `default`: the `disk_max` of a policy that names none.
    pub(super) fn start(
        &mut self,
        agents: &Agents,
        paths: &Paths,
        default: u64,
        cgroups: Option<Arc<Cgroups>>,
        tx: &mpsc::UnboundedSender<Cmd>,
    ) {
        if self.busy {
            return;
        }
        let targets: Vec<Target> = agents
            .live
            .iter()
            .filter(|(_, l)| l.pid.is_some() && l.stopping.is_none())
            .map(|(n, l)| Target {
                name: n.clone(),
                run: l.run.clone(),
                channel: l.channel_dir(paths, n),
                group: l.group.clone(),
                limit: crate::enforce::file_size_max(&l.policy, default),
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        self.busy = true;
        let tx = tx.clone();
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

    /// The answer of [`DiskWatch::start`]: the agents to stop
    /// `failed (budget_exceeded)` with their subtrees, each still on the run
    /// that was measured and not already stopping (its budget note says why).
    pub(super) fn checked(&mut self, over: Vec<DiskOver>, agents: &mut Agents) -> Vec<AgentName> {
        self.busy = false;
        let mut stop = Vec::new();
        for o in over {
            let Some(l) = agents.live.get_mut(&o.name) else {
                continue;
            };
            if l.run != o.run || l.stopping.is_some() || l.pid.is_none() {
                continue;
            }
            tracing::info!(agent = %o.name, why = %o.why, "over its disk_max; stopping the subtree");
            l.budget_note = Some(format!("disk: {}", o.why));
            stop.push(o.name);
        }
        stop
    }
}

/// The `artifact/` directories of the stopped targets this supervisor
/// hosts: they record no result, so what they wrote there goes.
pub(super) fn channels_of(
    agents: &Agents,
    paths: &Paths,
    targets: &[(AgentName, Terminal)],
) -> Vec<ToClear> {
    targets
        .iter()
        .filter_map(|(n, _)| agents.live.get(n)?.channel_dir(paths, n))
        .map(|channel| ToClear {
            channel,
            set_aside: None,
        })
        .collect()
}

/// The `artifact/` of `name`'s run, which ended without a result, set
/// aside now (one rename) for removal once its group is empty.
pub(super) fn set_aside_artifacts(
    agents: &Agents,
    paths: &Paths,
    name: &AgentName,
) -> Option<ToClear> {
    let l = agents.live.get(name)?;
    let channel = l.channel_dir(paths, name)?;
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
