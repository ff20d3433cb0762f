//! Collecting what a run that ended with a result hands back (SPEC 4; issue
//! 11): its descendants are stopped and its group emptied first, then refs
//! and artifacts are read by `crate::channel` on a thread of their own,
//! confined as the child, within [`COLLECT_LIMIT`]; the run's end is recorded
//! when the answer comes back.

use super::{EndFollow, Ends, Env, Finish};
use crate::supervisor::{Cmd, ev};
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::CancelReason;
use brood_core::FailReason;
use brood_core::RunId;
use brood_core::Terminal;
use brood_core::policy::Policy;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How a run that handed something back ended, carried through its
/// collection to the record.
pub(crate) struct RunEnding {
    pub(in crate::supervisor) name: AgentName,
    pub(in crate::supervisor) run: RunId,
    pub(in crate::supervisor) outcome: Terminal,
    pub(in crate::supervisor) exit_code: Option<i32>,
    pub(in crate::supervisor) result: Option<String>,
    pub(in crate::supervisor) detail: Option<String>,
}

/// A run's end with its harvest (refs checked, artifacts taken) or why not.
pub(crate) struct Harvested {
    ending: RunEnding,
    harvest: Result<crate::channel::Harvest, crate::channel::Refused>,
}

/// A run that ended with a result, waiting for its group to be empty before
/// what it handed back is read.
pub(crate) struct Collect {
    pub(in crate::supervisor) ending: RunEnding,
    refs: Vec<Value>,
    channel: Option<PathBuf>,
    policy: Policy,
    /// The child's sandbox, prepared again on the collector's thread, and
    /// its ids: what the collector is confined with.
    sandbox: Option<KeptSandbox>,
    ids: Option<brood_launch::confine::FsIds>,
    /// On a node of a cluster (issue 15): the artifacts' bytes go into the
    /// shared store before the end is recorded.
    share: bool,
}

/// How long reading what a run handed back may take (refs hashed, artifacts
/// copied, each at most 1 GiB): past it the run fails, naming the limit.
pub(in crate::supervisor) const COLLECT_LIMIT: Duration = Duration::from_secs(60);

/// How many times a child's artifacts are offered to the store, backing off
/// from 0.5 s to 8 s between tries (about 15 s in all).
const SHARE_TRIES: u32 = 6;

impl Ends {
    /// Checks the refs of a run that ended with a result and takes its
    /// artifacts into the blob store; the end is recorded once the answer
    /// comes back ([`Self::harvested`]). Nothing the child wrote is read
    /// while anything it started lives: its descendants are stopped (they
    /// die with it anyway, SPEC 6) and its group is killed and emptied
    /// first, then the files are read on a thread of their own, within
    /// [`COLLECT_LIMIT`] ([`Self::collect`]). `None` when its agent is not
    /// live here.
    pub(in crate::supervisor) fn harvest(
        &self,
        ending: RunEnding,
        env: &Env<'_>,
    ) -> Option<EndFollow> {
        let l = env.agents.live.get(&ending.name)?;
        let refs = l.done.as_ref().map(|d| d.refs.clone()).unwrap_or_default();
        let channel = l.channel_dir(env.paths, &ending.name);
        // On a node of a cluster, every child's artifacts go to the store,
        // its parent's node or not: any node serves a finished agent's
        // artifacts (the UI's download, `brood fsck` elsewhere). Shared only
        // for a parent on another node, they were lost to every other node
        // (issue 28's fault campaign read them back from each).
        let share = self.share && l.parent.is_some();
        if refs.is_empty() && channel.is_none() {
            // A root that names no refs: nothing to check or take, no thread.
            let nothing = Some(crate::channel::Harvest::default());
            return Some(EndFollow::Finish(Box::new(Finish {
                ending,
                harvest: nothing,
            })));
        }
        // The child's own identity, when it is not the supervisor's (today
        // agents run as the supervisor's uid, without capabilities).
        let ids = (l.policy.uid != self.uid || l.policy.gid != self.gid).then(|| {
            brood_launch::confine::FsIds {
                uid: l.policy.uid,
                gid: l.policy.gid,
                groups: l.policy.groups.iter().copied().collect(),
            }
        });
        let group = l.group.clone();
        let collect = Collect {
            refs,
            channel,
            policy: l.policy.clone(),
            sandbox: l.sandbox.clone(),
            ids,
            share,
            ending,
        };
        let name = &collect.ending.name;
        let targets: Vec<(AgentName, Terminal)> = match env
            .records
            .store
            .descendants_post_order(&env.records.tenant, name)
        {
            Ok(plan) => plan
                .into_iter()
                .filter(|a| !a.status.is_finished())
                .map(|a| (a.name, Terminal::Cancelled(CancelReason::ParentDead)))
                .collect(),
            Err(e) => {
                tracing::error!(agent = %name, error = %e, "planning the stop before collecting a result failed");
                Vec::new()
            }
        };
        Some(EndFollow::StopThenCollect {
            targets,
            group,
            collect: Box::new(collect),
        })
    }

    /// Reads what a run handed back (its group is empty by now) on a thread
    /// of its own, within [`COLLECT_LIMIT`]; whatever happens, the answer
    /// comes back as `Cmd::Harvested`, so the run never stays `running`.
    pub(in crate::supervisor) fn collect(&self, c: Collect, env: &Env<'_>) {
        let blobs = env.paths.blobs();
        let tx = self.tx.clone();
        let (store, tenant) = (env.records.store.clone(), env.records.tenant.clone());
        tokio::spawn(async move {
            let Collect {
                ending,
                refs,
                channel,
                policy,
                sandbox,
                ids,
                share,
            } = c;
            let shared_blobs = blobs.clone();
            // Set once the time limit passes: the collector then keeps
            // nothing of what it finds (no blob, no artifact), since the run
            // has ended without it.
            let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let harvest = {
                let (done_tx, done_rx) = tokio::sync::oneshot::channel();
                let flag = abandoned.clone();
                let started = std::thread::Builder::new()
                    .name("brood-collect".into())
                    .spawn(move || {
                        let confinement = match confinement(sandbox, ids) {
                            Ok(c) => c,
                            Err(refused) => {
                                let _ = done_tx.send(Err(refused));
                                return;
                            }
                        };
                        let h = crate::channel::harvest(&crate::channel::Input {
                            refs: &refs,
                            channel: channel.as_deref(),
                            policy: &policy,
                            blobs: &blobs,
                            confinement,
                            abandoned: &flag,
                        });
                        let _ = done_tx.send(h);
                    });
                match started {
                    Err(e) => Err(crate::channel::Refused(format!(
                        "not collected: starting the collector: {e}"
                    ))),
                    Ok(_) => match tokio::time::timeout(COLLECT_LIMIT, done_rx).await {
                        Ok(Ok(h)) => h,
                        Ok(Err(_)) => Err(crate::channel::Refused(
                            "not collected: the collector failed without an answer".into(),
                        )),
                        // The thread is left to end on its own (every read
                        // it makes is bounded), keeping nothing; the run
                        // ends now.
                        Err(_) => {
                            abandoned.store(true, std::sync::atomic::Ordering::Release);
                            Err(crate::channel::Refused(format!(
                                "not collected within {} s",
                                COLLECT_LIMIT.as_secs()
                            )))
                        }
                    },
                }
            };
            if share
                && let Ok(h) = &harvest
                && !h.output.artifacts.is_empty()
            {
                let artifacts = h.output.artifacts.clone();
                let name = ending.name.clone();
                // Off the runtime's workers: up to 1 GiB to the store. A
                // failure leaves the bytes on this node's disk only: the
                // parent's node counts them as elsewhere (`brood fsck`).
                // A store away for a moment is waited out, backing off: the
                // end is recorded once the store is back anyway, and bytes
                // not shared are lost to every other node (issue 28's
                // campaign). Past `SHARE_TRIES` they stay on this disk.
                let mut shared = Err(String::new());
                for attempt in 0..SHARE_TRIES {
                    if attempt > 0 {
                        tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
                    }
                    let (store, tenant, blobs, artifacts) = (
                        store.clone(),
                        tenant.clone(),
                        shared_blobs.clone(),
                        artifacts.clone(),
                    );
                    shared = tokio::task::spawn_blocking(move || {
                        crate::channel::shared::share(store.as_ref(), &tenant, &blobs, &artifacts)
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
                    if shared.is_ok() {
                        break;
                    }
                }
                if let Err(e) = shared {
                    tracing::warn!(agent = %name, error = %e, "sharing artifacts with the parent's node");
                }
            }
            let _ = tx.send(Cmd::Harvested(Box::new(Harvested { ending, harvest })));
        });
    }

    /// A collection's answer: the end to record, with what the run handed
    /// back, or failed `protocol_error` when its result was refused. `None`
    /// when a stop that came meanwhile records this run's end itself.
    pub(in crate::supervisor) fn harvested(
        &self,
        harvested: Harvested,
        env: &Env<'_>,
    ) -> Option<EndFollow> {
        let Harvested { ending: h, harvest } = harvested;
        let l = env.agents.live.get(&h.name)?;
        // A stop that came meanwhile records this run's end itself.
        if l.run != h.run || l.stopping.is_some() {
            return None;
        }
        match harvest {
            Ok(out) => Some(EndFollow::Finish(Box::new(Finish {
                ending: h,
                harvest: Some(out),
            }))),
            Err(refused) => {
                // SPEC 4: a bad line rejects the whole result.
                let session = l.session.clone();
                tracing::warn!(agent = %h.name, error = %refused, "result refused");
                env.records.append_events(&[ev(
                    &h.name,
                    Some(&h.run),
                    &session,
                    AgentEvent::ProtocolError {
                        agent: h.name.clone(),
                        line: None,
                        error: format!("result refused: {refused}"),
                    },
                )]);
                let ending = RunEnding {
                    outcome: Terminal::Failed(FailReason::ProtocolError),
                    result: None,
                    detail: Some(format!("result refused: {refused}")),
                    ..h
                };
                Some(EndFollow::Finish(Box::new(Finish {
                    ending,
                    harvest: None,
                })))
            }
        }
    }
}

/// An agent's sandbox as its launch specified it, with the identity (device
/// and inode) of every path a rule named then: what the result collector is
/// confined with once the agent has ended. The prepared ruleset is not kept
/// while the agent lives, since it is a descriptor and the daemon holds as
/// few as it can a live agent (`brood bench memory`).
#[derive(Clone)]
pub(crate) struct KeptSandbox {
    spec: brood_launch::sandbox::SandboxSpec,
    fs: Vec<Option<(u64, u64)>>,
    exec: Vec<Option<(u64, u64)>>,
}

impl KeptSandbox {
    /// Taken where the launch prepares the same spec, before the child runs.
    pub(crate) fn new(spec: brood_launch::sandbox::SandboxSpec) -> KeptSandbox {
        KeptSandbox {
            fs: spec.fs.iter().map(|(p, _)| identity(p)).collect(),
            exec: spec.exec.iter().map(|p| identity(p)).collect(),
            spec,
        }
    }

    /// The ruleset again, with only the rules whose path is still what it
    /// was at the launch. A path the agent removed, or replaced (by a
    /// symlink to elsewhere, say), is left out: a rule then would grant
    /// nothing, or what the child never had. Leaving a rule out only takes
    /// rights away. The agent's group is empty by now, so it cannot swap a
    /// path between this look and the preparation.
    fn prepare(self) -> Result<brood_launch::sandbox::Prepared, String> {
        brood_launch::sandbox::prepare(&self.unchanged()).map_err(|e| e.to_string())
    }

    /// The spec with only the rules whose path is what it was at launch.
    fn unchanged(self) -> brood_launch::sandbox::SandboxSpec {
        let KeptSandbox { mut spec, fs, exec } = self;
        let mut fs_ids = fs.into_iter();
        spec.fs.retain(|(p, _)| {
            let was = fs_ids.next().flatten();
            was.is_some() && identity(p) == was
        });
        let mut exec_ids = exec.into_iter();
        spec.exec.retain(|p| {
            let was = exec_ids.next().flatten();
            was.is_some() && identity(p) == was
        });
        spec
    }
}

/// The device and inode `path` resolves to (following symlinks, as the
/// ruleset's own open does), if it exists.
fn identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// What the collector is confined with: the child's sandbox prepared again
/// ([`KeptSandbox::prepare`]) and its ids.
fn confinement(
    sandbox: Option<KeptSandbox>,
    ids: Option<brood_launch::confine::FsIds>,
) -> Result<brood_launch::confine::Confinement, crate::channel::Refused> {
    let sandbox = match sandbox {
        None => None,
        Some(kept) => Some(kept.prepare().map_err(|e| {
            crate::channel::Refused(format!(
                "not collected: preparing the agent's sandbox for the collector: {e}"
            ))
        })?),
    };
    Ok(brood_launch::confine::Confinement { sandbox, ids })
}

#[cfg(test)]
mod tests;
