//! Ends off the loop (issue 27 item 2): the ends of lone agents (a root
//! with no child live here) that exited together are worked out on the
//! loop, then handed to the store's end writer, a thread of its own, which
//! records them (with whatever other ends wait for it, one transaction,
//! `Store::end_runs`) while the loop goes on; its answer comes back as
//! [`Cmd::EndsRecorded`], and what follows each end (the projection, the
//! waiters, the slot, the group removed) is done then, as before.
//!
//! Only lone agents go this way: no parent hears of their end and no
//! descendant is stopped by it, so nothing else the loop does depends on
//! the record. What could still meet one in flight is kept apart: a verb
//! naming it (send, cancel, close, resume) is held here until its end is
//! recorded, then handled (a cancel finds it ended, a close closes it); a
//! stop leaves it out (it is ending already: a cancel recorded by another
//! node, a deadline, the disk watch, the shutdown's); a wait for it is
//! answered when its end is.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use brood_core::{AgentName, TenantId};
use brood_store::{Agent, EndItem, Store};
use tokio::sync::mpsc;

use super::Cmd;
use super::ends::Ending;
use super::in_flight::InFlight;

/// The most ends the writer records in one transaction.
const MAX_TOGETHER: usize = 256;

struct Job {
    id: u64,
    items: Vec<EndItem>,
}

/// The writer's answer for a job: the agents as recorded, one per end in
/// order, or `None` when the transaction failed (the loop then records
/// each end alone, as it did before, and says why each failed); and which
/// of them left an unfinished descendant (`Store::unfinished_below`, asked
/// once for all the ends recorded together), `None` when that read failed
/// or was not made: the loop then reads each one's plan itself.
pub(crate) struct EndsRecorded {
    pub(super) id: u64,
    pub(super) agents: Option<Vec<Agent>>,
    pub(super) below: Option<HashSet<AgentName>>,
}

pub(super) struct EndsWriter {
    to_writer: std_mpsc::Sender<Job>,
    /// The ends in flight, and the verbs held for their agents.
    pub(super) flight: InFlight<Ending>,
}

impl EndsWriter {
    /// The part, with its writer thread on `store` for `tenant`; the answers
    /// go to the loop through `loop_tx`. The thread ends with the part.
    pub(super) fn start(
        store: Arc<dyn Store>,
        tenant: TenantId,
        loop_tx: mpsc::UnboundedSender<Cmd>,
    ) -> std::io::Result<EndsWriter> {
        let (to_writer, jobs) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("brood-end".into())
            .spawn(move || writer(store.as_ref(), &tenant, &jobs, &loop_tx))?;
        Ok(EndsWriter {
            to_writer,
            flight: InFlight::new(|e: &Ending| &e.name),
        })
    }

    /// Hands worked-out ends to the writer; on a writer that is gone (it
    /// cannot be while the part lives) they come back, to be recorded on
    /// the loop.
    pub(super) fn hand_over(&mut self, ends: Vec<Ending>) -> Result<(), Vec<Ending>> {
        let id = self.flight.next_id();
        let items = ends.iter().map(Ending::item).collect();
        if self.to_writer.send(Job { id, items }).is_err() {
            return Err(ends);
        }
        self.flight.enter(id, ends);
        Ok(())
    }
}

/// The writer: takes a job and every job already waiting behind it, up to
/// [`MAX_TOGETHER`] ends, records them in one transaction, answers each.
fn writer(
    store: &dyn Store,
    tenant: &TenantId,
    jobs: &std_mpsc::Receiver<Job>,
    loop_tx: &mpsc::UnboundedSender<Cmd>,
) {
    while let Ok(first) = jobs.recv() {
        let mut together = vec![first];
        let mut n = together[0].items.len();
        while n < MAX_TOGETHER
            && let Ok(j) = jobs.try_recv()
        {
            n += j.items.len();
            together.push(j);
        }
        let items: Vec<EndItem> = together
            .iter()
            .flat_map(|j| j.items.iter().cloned())
            .collect();
        let mut agents = match store.end_runs(tenant, &items) {
            Ok(a) if a.len() == items.len() => Some(a.into_iter()),
            Ok(a) => {
                tracing::warn!(
                    n = items.len(),
                    recorded = a.len(),
                    "recording ends together answered short; each alone"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, n = items.len(), "recording ends together failed; each alone");
                None
            }
        };
        // What the ends leave below them, asked once for the lot and off
        // the loop, where each end's plan was a read on the loop (two
        // statements an end on PostgreSQL, most for agents with no child).
        let below = agents.is_some().then(|| {
            let names: Vec<AgentName> = items.iter().map(|it| it.name.clone()).collect();
            store
                .unfinished_below(tenant, &names)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, n = names.len(), "reading what the ended agents left below them failed; each is planned on the loop");
                })
                .ok()
        });
        let below = below.flatten();
        for j in together {
            let mine = agents
                .as_mut()
                .map(|a| a.by_ref().take(j.items.len()).collect());
            let answer = EndsRecorded {
                id: j.id,
                agents: mine,
                below: below.as_ref().map(|b| {
                    j.items
                        .iter()
                        .filter(|it| b.contains(&it.name))
                        .map(|it| it.name.clone())
                        .collect()
                }),
            };
            if loop_tx.send(Cmd::EndsRecorded(Box::new(answer))).is_err() {
                return;
            }
        }
    }
}
