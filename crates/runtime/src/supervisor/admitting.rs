//! Admissions off the loop (issue 27 item 2): the loop decides a creation
//! (reads only), hands the record to the store's writer and goes on; the
//! writer records what it was handed, together with whatever else is
//! waiting for it (one group commit for the lot, `Store::
//! admit_all_with_quotas`), and its answer comes back to the loop as
//! [`Cmd::Admitted`], where what follows an admission (the projection, the
//! live entry, the queue for a slot, the answer) is done as before. The
//! tenant's quotas they are admitted under are read by the writer too, once
//! for what it records together, and their `max_concurrent` comes back with
//! the answer for the loop's slots.
//!
//! Only creations that nothing else can see while they are in flight go
//! this way: roots (no parent, no customer) asked by a user. Until their
//! record is committed no agent of a tree can name them, and no cascade can
//! reach them. What could still meet one in flight is kept apart:
//! - a creation naming an agent in flight (as its parent, or asking for
//!   its name) waits here until that one's answer is in ([`Admitting::
//!   defer`]), then is decided as if it had just come;
//! - a verb naming it (send, cancel, close, resume, wait) is answered
//!   `Conflict`, to ask again once the creation is answered
//!   ([`Admitting::check_settled`]);
//! - the checks that end a record of this node no live agent accounts for
//!   (the orphan sweeper, `end_records_without_agents`) skip it;
//! - a shutdown waits for every answer, then stops what was admitted.
//!
//! Children are admitted on the loop as before: their decisions read the
//! parent's live state (its budget, its `create_limit`, whether it is
//! stopping), which an admission in flight would leave stale.
//!
//! [`Admitting`] is the state of the admission part: what it decides
//! (`supervisor::admission`) holds none of its own, and its entry points
//! (`supervisor::route::admission`) hand batches to it and take its
//! answers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc as std_mpsc;

use brood_core::quota::QuotaConfig;
use brood_core::{AgentName, TenantId};
use brood_store::{Agent, NewAgent, NewEvent, Store, StoreError};
use std::sync::Arc;
use tokio::sync::mpsc;

use super::Cmd;
use super::admission::{Decision, Spawn};
use crate::api::ApiError;
use brood_core::Code;

/// The most admissions the writer records in one call: its group commit's
/// size, so the first of a burst does not wait long for the last.
const MAX_TOGETHER: usize = 256;

/// One hand-over to the writer: the records of a batch decided together.
struct Job {
    id: u64,
    records: Vec<(NewAgent, Vec<NewEvent>)>,
}

/// The writer's answer: one result per record of the job, in order, and
/// the tenant's `max_concurrent` read with them (`None` when the quotas
/// could not be read, and nothing was admitted).
pub(crate) struct Admitted {
    pub(super) id: u64,
    pub(super) results: Vec<Result<Agent, StoreError>>,
    pub(super) max_concurrent: Option<u32>,
}

pub(super) struct Admitting {
    to_writer: std_mpsc::Sender<Job>,
    next_id: u64,
    /// The batches handed over and not yet answered, by job.
    in_flight: HashMap<u64, Vec<(Spawn, Decision)>>,
    /// The names of the agents in flight (each also in `in_flight`).
    names: HashSet<AgentName>,
    /// Creations that named an agent in flight, in arrival order.
    deferred: VecDeque<Spawn>,
}

impl Admitting {
    /// What it holds for agents (`held`): batches in flight, their names,
    /// the creations deferred.
    pub(super) fn held(&self) -> usize {
        self.in_flight.len() + self.names.len() + self.deferred.len()
    }

    /// The part, with its writer thread on `store`; the writer's answers go
    /// to the loop through `loop_tx`. The thread ends when the part is
    /// dropped (its channel closes).
    pub(super) fn start(
        store: Arc<dyn Store>,
        tenant: TenantId,
        quotas: QuotaConfig,
        loop_tx: mpsc::UnboundedSender<Cmd>,
    ) -> std::io::Result<Admitting> {
        let (to_writer, jobs) = std_mpsc::channel::<Job>();
        let under = Under { tenant, quotas };
        std::thread::Builder::new()
            .name("brood-admit".into())
            .spawn(move || writer(store.as_ref(), &under, &jobs, &loop_tx))?;
        Ok(Admitting {
            to_writer,
            next_id: 0,
            in_flight: HashMap::new(),
            names: HashSet::new(),
            deferred: VecDeque::new(),
        })
    }

    /// Whether `s` may go off the loop at all (module docs): a user's root.
    pub(super) fn may_take(s: &Spawn) -> bool {
        s.parent().is_none() && s.req.customer.is_none()
    }

    /// Whether `s` must wait: it names an agent in flight (as its parent,
    /// or as its own name), or a creation already waiting does (so the
    /// waiting ones keep their order).
    pub(super) fn must_wait(&self, s: &Spawn) -> bool {
        if self.in_flight.is_empty() && self.deferred.is_empty() {
            return false;
        }
        let named = |n: Option<&AgentName>| n.is_some_and(|n| self.names.contains(n));
        if named(s.parent()) || named(s.req.name.as_ref()) {
            return true;
        }
        self.deferred.iter().any(|d| {
            let (p, n) = (d.parent(), d.req.name.as_ref());
            let same = |a: Option<&AgentName>, b: Option<&AgentName>| a.is_some() && a == b;
            same(s.parent(), p)
                || same(s.parent(), n)
                || same(s.req.name.as_ref(), p)
                || same(s.req.name.as_ref(), n)
        })
    }

    pub(super) fn defer(&mut self, s: Spawn) {
        self.deferred.push_back(s);
    }

    /// The creations that waited, to be decided again (those still naming
    /// an agent in flight wait again).
    pub(super) fn take_deferred(&mut self) -> Vec<Spawn> {
        self.deferred.drain(..).collect()
    }

    /// Hands a decided batch to the writer. On a writer that is gone (it
    /// cannot be, while the part lives), the batch comes back to be
    /// answered with the error.
    pub(super) fn hand_over(
        &mut self,
        decided: Vec<(Spawn, Decision)>,
    ) -> Result<(), (Vec<(Spawn, Decision)>, ApiError)> {
        self.next_id += 1;
        let id = self.next_id;
        let records = decided
            .iter()
            .map(|(_, d)| (d.new.clone(), d.events.clone()))
            .collect();
        if self.to_writer.send(Job { id, records }).is_err() {
            let e = ApiError::new(Code::Internal, "the store's admission writer is gone");
            return Err((decided, e));
        }
        for (_, d) in &decided {
            self.names.insert(d.new.name.clone());
        }
        self.in_flight.insert(id, decided);
        Ok(())
    }

    /// The batch an answer is for, no longer in flight.
    pub(super) fn landed(&mut self, id: u64) -> Vec<(Spawn, Decision)> {
        let batch = self.in_flight.remove(&id).unwrap_or_default();
        for (_, d) in &batch {
            self.names.remove(&d.new.name);
        }
        batch
    }

    /// Whether an admission of `name` is in flight.
    pub(super) fn in_flight(&self, name: &AgentName) -> bool {
        self.names.contains(name)
    }

    /// Nothing in flight and nothing waiting.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.deferred.is_empty()
    }

    /// A verb naming `name` is refused while its creation is in flight: the
    /// agent has no record to act on yet as far as this node is concerned.
    pub(super) fn check_settled(&self, name: &AgentName) -> Result<(), ApiError> {
        if self.in_flight(name) {
            return Err(ApiError::new(
                Code::Conflict,
                format!("agent {name} is being admitted; ask again once its creation is answered"),
            )
            .retry_after(1));
        }
        Ok(())
    }
}

/// What the writer admits under: the tenant whose quotas it reads, and the
/// platform's defaults and ceilings they are taken within.
struct Under {
    tenant: TenantId,
    quotas: QuotaConfig,
}

/// The writer: takes a job, and every job already waiting behind it up to
/// [`MAX_TOGETHER`] records, reads the tenant's quotas, records them in one
/// call, and answers each.
fn writer(
    store: &dyn Store,
    under: &Under,
    jobs: &std_mpsc::Receiver<Job>,
    loop_tx: &mpsc::UnboundedSender<Cmd>,
) {
    while let Ok(first) = jobs.recv() {
        let mut together = vec![first];
        let mut n = together[0].records.len();
        while n < MAX_TOGETHER
            && let Ok(j) = jobs.try_recv()
        {
            n += j.records.len();
            together.push(j);
        }
        // The tenant's overrides, read for each group: a change applies
        // from the next one on. Unread, nothing of the group is admitted.
        let quotas = store
            .tenant_quotas(&under.tenant)
            .map(|own| under.quotas.effective(Some(&own)));
        let batch: Vec<(&NewAgent, &[NewEvent])> = together
            .iter()
            .flat_map(|j| j.records.iter().map(|(a, e)| (a, e.as_slice())))
            .collect();
        tracing::debug!(
            n = batch.len(),
            jobs = together.len(),
            "recording admissions together"
        );
        let (mut results, max_concurrent) = match &quotas {
            Ok(q) => (
                store.admit_all_with_quotas(&batch, q).into_iter(),
                Some(q.max_concurrent),
            ),
            Err(e) => {
                // Each creation told what the read met: a store away is
                // asked again later (503), anything else is the store's.
                let message = format!("reading the tenant's quotas: {e}");
                let unread = |_| {
                    Err(if e.is_unavailable() {
                        StoreError::PostgresUnreachable {
                            target: "the store".into(),
                            message: message.clone(),
                        }
                    } else {
                        StoreError::Refused {
                            code: Code::Internal,
                            message: message.clone(),
                        }
                    })
                };
                let all: Vec<_> = batch.iter().map(unread).collect();
                (all.into_iter(), None)
            }
        };
        for j in together {
            let mine: Vec<_> = results.by_ref().take(j.records.len()).collect();
            if loop_tx
                .send(Cmd::Admitted(Box::new(Admitted {
                    id: j.id,
                    results: mine,
                    max_concurrent,
                })))
                .is_err()
            {
                // The loop is gone: nothing is left to answer.
                return;
            }
        }
    }
}
