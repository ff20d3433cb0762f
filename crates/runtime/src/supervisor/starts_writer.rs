//! Starts off the loop (issue 27 item 2): the starts the spawner answered
//! are taken up on the loop (`Launcher::begins`), then handed to the
//! store's start writer, a thread of its own, which records them (with
//! whatever other starts wait for it, one transaction, `Store::start_runs`)
//! while the loop goes on; its answer comes back as [`Cmd::StartsRecorded`],
//! and what follows each start (the IO task, the projection, the first
//! words, the creator's answer) is done then, as before.
//!
//! On PostgreSQL a start's transaction is several round trips; on the loop
//! they held every other command behind them (in a one-node run the loop
//! waited on the store about as often as it waited for a command). While a
//! start is in flight its process runs, but the loop knows no pid for it and
//! reads nothing it says (its IO task begins once the start is recorded).
//! What could meet it meanwhile is kept apart, as for the ends in flight
//! (`ends_writer`): a verb naming it (send, cancel, close, resume) is held
//! until the start is recorded, then handled; a stop that covers it leaves
//! it out and is made for it once its start is recorded (`Live::
//! stop_after_start`), or, when the store refused the start (another node
//! ended it meanwhile), what started is killed as any refused start is.

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use brood_core::{AgentName, TenantId};
use brood_store::{Agent, StartItem, Store, StoreError};
use tokio::sync::mpsc;

use super::Cmd;
use super::in_flight::InFlight;
use super::launch::Starting;

/// A test's hook, called with each start recorded before its answer goes
/// (`Hooks::start_recorded`).
type Hook = Arc<dyn Fn(&AgentName) + Send + Sync>;

/// The most starts the writer records in one transaction.
const MAX_TOGETHER: usize = 256;

struct Job {
    id: u64,
    items: Vec<StartItem>,
}

/// The writer's answer for a job: each start's record or refusal, in order.
pub(crate) struct StartsRecorded {
    pub(super) id: u64,
    pub(super) results: Vec<Result<Agent, StoreError>>,
}

pub(super) struct StartsWriter {
    to_writer: std_mpsc::Sender<Job>,
    /// The starts in flight, and the commands held for their agents.
    pub(super) flight: InFlight<Starting>,
}

impl StartsWriter {
    /// The part, with its writer thread on `store` for `tenant`; the answers
    /// go to the loop through `loop_tx`. The thread ends with the part.
    pub(super) fn start(
        store: Arc<dyn Store>,
        tenant: TenantId,
        hook: Option<Hook>,
        loop_tx: mpsc::UnboundedSender<Cmd>,
    ) -> std::io::Result<StartsWriter> {
        let (to_writer, jobs) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("brood-start".into())
            .spawn(move || writer(store.as_ref(), &tenant, hook.as_ref(), &jobs, &loop_tx))?;
        Ok(StartsWriter {
            to_writer,
            flight: InFlight::new(Starting::name),
        })
    }

    /// Hands taken-up starts to the writer, each recorded as supervisor
    /// `me`; on a writer that is gone (it cannot be while the part lives)
    /// they come back, to be recorded on the loop.
    pub(super) fn hand_over(
        &mut self,
        starts: Vec<Starting>,
        me: &str,
    ) -> Result<(), Vec<Starting>> {
        let id = self.flight.next_id();
        let items = starts.iter().map(|s| s.item(me)).collect();
        if self.to_writer.send(Job { id, items }).is_err() {
            return Err(starts);
        }
        self.flight.enter(id, starts);
        Ok(())
    }
}

/// The writer: takes a job and every job already waiting behind it, up to
/// [`MAX_TOGETHER`] starts, records them in one transaction (each refused
/// alone when its record says so), answers each job.
fn writer(
    store: &dyn Store,
    tenant: &TenantId,
    hook: Option<&Hook>,
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
        let items: Vec<StartItem> = together
            .iter()
            .flat_map(|j| j.items.iter().cloned())
            .collect();
        let mut results = store.start_runs(tenant, &items).into_iter();
        if let Some(h) = hook {
            items.iter().for_each(|it| h(&it.name));
        }
        for j in together {
            let mut mine: Vec<Result<Agent, StoreError>> =
                results.by_ref().take(j.items.len()).collect();
            // `start_runs` answers every item; one it did not is not taken
            // for started.
            while mine.len() < j.items.len() {
                mine.push(Err(StoreError::Refused {
                    code: brood_core::Code::Internal,
                    message: "the store gave no answer for this start".into(),
                }));
            }
            let answer = StartsRecorded {
                id: j.id,
                results: mine,
            };
            if loop_tx.send(Cmd::StartsRecorded(Box::new(answer))).is_err() {
                return;
            }
        }
    }
}
