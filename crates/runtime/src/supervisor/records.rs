//! The store and what follows each write of it: the ctx projection that
//! mirrors the records as files, and what folds another node's news into
//! one look (`Heard`; event streams are woken by the store's own bell). Every record the
//! dispatcher makes goes through this part (SPEC 4: committed before anyone
//! can observe it), and so does what it writes into the ctx tree (SPEC 3) as
//! agents change: the parent's channel to them, their events.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use brood_core::{AgentName, Code, TenantId};
use brood_store::{Agent, Changed, NewEvent, Store};

use super::agents::Agents;
use super::now_ms;
use crate::api::{ApiError, Caller, internal, not_found};
use crate::paths::Paths;
use crate::projection::Projection;

pub(super) struct Records {
    pub(super) store: Arc<dyn Store>,
    pub(super) tenant: TenantId,
    /// Where the ctx tree is (the host's `paths`, shared).
    pub(super) paths: Paths,
    pub(super) projection: Projection,
    /// The other nodes' news the loop has not looked at yet.
    pub(super) heard: Arc<Heard>,
    /// Notes for another node's inbox whose post failed ([`Self::post_or_keep`]),
    /// posted again at each tick ([`Self::post_kept`]).
    pub(super) unsent: std::sync::Mutex<Vec<Unsent>>,
}

/// A note for another node's inbox not posted yet: what `post_input` takes.
pub(super) struct Unsent {
    agent: AgentName,
    host: String,
    sender: &'static str,
    text: String,
}

/// The other nodes' news not looked at yet: whether a `Cmd::News` is
/// queued, so news arriving faster than the loop looks costs one look, not
/// a queue of them; and what all of it said changed, so the look goes only
/// where the news concerns this node.
#[derive(Default)]
pub(super) struct Heard {
    queued: AtomicBool,
    changed: AtomicU8,
}

impl Heard {
    /// News that `what` changed: whether a `Cmd::News` must be sent (none
    /// is queued yet).
    pub(super) fn heard(&self, what: Changed) -> bool {
        self.changed.fetch_or(what.bits(), Ordering::SeqCst);
        !self.queued.swap(true, Ordering::SeqCst)
    }

    /// The `Cmd::News` is being handled: what the news since the last one
    /// said changed. News heard from here on queues another.
    pub(super) fn take(&self) -> Changed {
        self.queued.store(false, Ordering::SeqCst);
        Changed::from_bits(self.changed.swap(0, Ordering::SeqCst))
    }
}

impl Records {
    /// Posts a note for `agent` to `host`'s inbox (the news of an end, a
    /// close, a ready spawn); one whose post fails is kept and posted again
    /// at the next tick (issue 28: a failed write is not "told"). A note
    /// posted twice (its acknowledgement lost) is harmless: each is heard
    /// once by what it concerns.
    pub(super) fn post_or_keep(
        &self,
        agent: &AgentName,
        host: &str,
        sender: &'static str,
        text: &str,
    ) {
        let note = Unsent {
            agent: agent.clone(),
            host: host.to_owned(),
            sender,
            text: text.to_owned(),
        };
        if !self.post(&note) {
            self.unsent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(note);
        }
    }

    /// The notes kept by [`Self::post_or_keep`], posted again; those that
    /// fail again wait for the next tick.
    pub(super) fn post_kept(&self) {
        let kept = std::mem::take(
            &mut *self
                .unsent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let still: Vec<Unsent> = kept.into_iter().filter(|n| !self.post(n)).collect();
        if !still.is_empty() {
            self.unsent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(still);
        }
    }

    fn post(&self, n: &Unsent) -> bool {
        match self
            .store
            .post_input(&self.tenant, &n.agent, &n.host, n.sender, &n.text, now_ms())
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(agent = %n.agent, host = %n.host, note = n.sender, error = %e, "posting a note to another node; posting it again at the next tick");
                false
            }
        }
    }

    /// The agent's record, or 404 naming it.
    pub(super) fn agent(&self, name: &AgentName) -> Result<Agent, ApiError> {
        self.store
            .agent(&self.tenant, name)
            .map_err(internal)?
            .ok_or_else(|| not_found(name))
    }

    /// An agent may act on its own descendants only; a user on anything.
    pub(super) fn authorize(&self, caller: &Caller, target: &Agent) -> Result<(), ApiError> {
        let Caller::Agent(me) = caller else {
            return Ok(());
        };
        let mut cur = target.parent.clone();
        let mut hops = 0;
        while let Some(p) = cur {
            if &p == me {
                return Ok(());
            }
            hops += 1;
            if hops > 10_000 {
                break;
            }
            cur = self
                .store
                .agent(&self.tenant, &p)
                .map_err(internal)?
                .and_then(|a| a.parent);
        }
        Err(ApiError::new(
            Code::Forbidden,
            format!(
                "agent {me} may act only on its own descendants, not on {}",
                target.name
            ),
        ))
    }

    /// Where `a`'s parent reads it: the channel in the parent's session.
    pub(super) fn channel_dir_of(&self, agents: &Agents, a: &Agent) -> Option<PathBuf> {
        let p = a.parent.as_ref()?;
        // The parent's session is known while either side is live; the store is
        // asked only otherwise (this runs for every agent of a large stop).
        let known = agents
            .live
            .get(&a.name)
            .and_then(|l| l.parent_session.clone())
            .or_else(|| agents.live.get(p).map(|pl| pl.session.clone()));
        let psess = match known {
            Some(s) => s,
            None => self
                .store
                .agent(&self.tenant, p)
                .ok()
                .flatten()
                .map(|pa| pa.session)?,
        };
        Some(self.paths.channel_dir(p, &psess, &a.name))
    }

    /// Channel `status` (and `result.md` once terminal) in the parent's session.
    pub(super) fn project_channel(&self, agents: &Agents, a: &Agent, result: Option<&str>) {
        let Some(dir) = self.channel_dir_of(agents, a) else {
            return;
        };
        self.projection.write(
            dir.join("status"),
            format!("{}\n", a.status.abi().channel.as_str()),
        );
        if a.status.is_finished()
            && let Some(r) = result
        {
            // SPEC 4: result.md never holds a NUL byte.
            self.projection
                .write(dir.join("result.md"), crate::objects::result_text(r));
        }
    }

    /// Writes the agent's shim (SPEC 3 `agent/<name>`), with the renderer the
    /// rebuild uses; `bin_dir` is where the `brood` it calls is.
    pub(super) fn project_shim(&self, bin_dir: Option<&std::path::Path>, name: &AgentName) {
        let program = crate::objects::shim_program(bin_dir);
        self.projection.write_exec(
            self.paths.shim(name),
            crate::objects::shim(&self.paths.root, &program, name),
        );
    }

    /// Events already in the store, appended to their sessions' `events.jsonl`.
    pub(super) fn project_events(&self, events: &[NewEvent]) {
        for e in events {
            let dir = self.paths.session_dir(&e.agent, &e.session);
            let mut line = e.payload.clone().into_bytes();
            line.push(b'\n');
            self.projection.append(dir.join("events.jsonl"), line);
        }
    }

    /// Events appended to the store, then projected; a failure is logged.
    pub(super) fn append_events(&self, events: &[NewEvent]) {
        match self.store.append_events(&self.tenant, events, now_ms()) {
            Ok(_) => self.project_events(events),
            Err(e) => tracing::error!(error = %e, "appending events failed"),
        }
    }
}
