//! What the dispatcher writes into the ctx tree (SPEC 3) as agents change:
//! their status files, their parent's channel to them, their events; and
//! events appended to the store and projected in one call.

use super::{Dispatcher, now_ms};
use brood_store::Agent;
use brood_store::NewEvent;
use std::path::PathBuf;

impl Dispatcher {
    pub(super) fn channel_dir_of(&self, a: &Agent) -> Option<PathBuf> {
        let p = a.parent.as_ref()?;
        // The parent's session is known while either side is live; the store is
        // asked only otherwise (this runs for every agent of a large stop).
        let known = self
            .agents
            .live
            .get(&a.name)
            .and_then(|l| l.parent_session.clone())
            .or_else(|| self.agents.live.get(p).map(|pl| pl.session.clone()));
        let psess = match known {
            Some(s) => s,
            None => self
                .records
                .store
                .agent(&self.records.tenant, p)
                .ok()
                .flatten()
                .map(|pa| pa.session)?,
        };
        Some(self.host.paths.channel_dir(p, &psess, &a.name))
    }

    /// Channel `status` (and `result.md` once terminal) in the parent's session.
    pub(super) fn project_channel(&self, a: &Agent, result: Option<&str>) {
        let Some(dir) = self.channel_dir_of(a) else {
            return;
        };
        self.records.projection.write(
            dir.join("status"),
            format!("{}\n", a.status.abi().channel.as_str()),
        );
        if a.status.is_finished()
            && let Some(r) = result
        {
            // SPEC 4: result.md never holds a NUL byte.
            self.records
                .projection
                .write(dir.join("result.md"), crate::objects::result_text(r));
        }
    }

    pub(super) fn project_events(&self, events: &[NewEvent]) {
        for e in events {
            let dir = self.host.paths.session_dir(&e.agent, &e.session);
            let mut line = e.payload.clone().into_bytes();
            line.push(b'\n');
            self.records
                .projection
                .append(dir.join("events.jsonl"), line);
        }
    }

    pub(super) fn append_events(&self, events: &[NewEvent]) {
        match self
            .records
            .store
            .append_events(&self.records.tenant, events, now_ms())
        {
            Ok(_) => self.project_events(events),
            Err(e) => tracing::error!(error = %e, "appending events failed"),
        }
    }
}
