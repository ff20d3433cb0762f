//! Group commit of admissions, for both stores: requesters queue, first come
//! first served, and the thread whose turn it is runs what is queued (up to a
//! store's maximum) as one transaction, each admission in a savepoint of its
//! own so that it still succeeds or fails alone. Many requesters then share
//! one commit, which is what an admission waits on longest (SQLite's WAL
//! write, PostgreSQL's WAL flush, the latter with the tenant's lock held).
//!
//! What a group is run as is the store's (`run`); this module only queues,
//! hands the lead from one requester to the next, and answers every
//! requester, even when the leader panics.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use brood_core::Quotas;

use crate::types::{Agent, NewAgent, NewEvent, Result, StoreError};

/// One admission waiting for a group commit. The request is owned because the
/// thread that runs it (the group's leader) may be another requester's.
pub(crate) struct Ticket {
    pub(crate) new: NewAgent,
    pub(crate) quotas: Option<Quotas>,
    pub(crate) events: Vec<NewEvent>,
    state: Mutex<TicketState>,
    wake: Condvar,
}

// One per ticket, inside its `Arc`, moved only when answered: boxing the answer
// would cost an allocation per admission to save nothing.
#[allow(clippy::large_enum_variant)]
enum TicketState {
    Waiting,
    /// The previous leader handed this ticket's thread the next group.
    Lead,
    Done(Result<Agent>),
}

/// The queue of admissions in front of a store's writer.
pub(crate) struct Groups {
    queue: Mutex<Queue>,
    /// The most admissions one group takes: enough for a burst of requesters
    /// to share one commit, few enough that the first of them does not wait
    /// long for the last.
    max: usize,
    /// Whether a group holds one tenant's admissions only. PostgreSQL locks
    /// each tenant it admits in; one tenant per group means a group never
    /// holds two tenants' locks, so two nodes' groups cannot deadlock.
    one_tenant: bool,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Arc<Ticket>>,
    /// A thread is running a group now; new tickets wait for it to hand over.
    leading: bool,
}

impl Groups {
    pub(crate) fn new(max: usize, one_tenant: bool) -> Groups {
        Groups {
            queue: Mutex::new(Queue::default()),
            max: max.max(1),
            one_tenant,
        }
    }

    /// Queues the admission and either leads the next group (the queue was
    /// idle, or the previous leader handed over) or waits for a leader to run
    /// it. `run` runs a group: one answer per ticket of its final
    /// `tickets()`, in order, each given only once the group has committed
    /// (or failed). `lost` makes the error of an
    /// admission nobody answered (the leader panicked) from its message.
    pub(crate) fn admit(
        &self,
        new: &NewAgent,
        quotas: Option<&Quotas>,
        events: &[NewEvent],
        mut run: impl FnMut(&mut Group<'_>) -> Vec<Result<Agent>>,
        lost: &dyn Fn(String) -> StoreError,
    ) -> Result<Agent> {
        let me = ticket(new, quotas, events);
        let lead = self.enqueue(std::slice::from_ref(&me));
        self.settle(&me, lead, &mut run, lost)
    }

    /// [`Groups::admit`] for many admissions of one caller at once: all are
    /// queued together, so a group taken after that holds as many of them as
    /// it may (one commit for a batch that arrived together), then each is
    /// waited for (or led) in turn. One answer per admission, in order.
    pub(crate) fn admit_all(
        &self,
        batch: &[(&NewAgent, &[NewEvent])],
        quotas: Option<&Quotas>,
        mut run: impl FnMut(&mut Group<'_>) -> Vec<Result<Agent>>,
        lost: &dyn Fn(String) -> StoreError,
    ) -> Vec<Result<Agent>> {
        let mine: Vec<Arc<Ticket>> = batch
            .iter()
            .map(|(new, events)| ticket(new, quotas, events))
            .collect();
        let mut lead = self.enqueue(&mine);
        let mut answers = Vec::with_capacity(mine.len());
        for t in &mine {
            answers.push(self.settle(t, lead, &mut run, lost));
            // Only the first ticket can have been given the lead by `enqueue`;
            // a later one hears of it from the leader before it (`Lead`).
            lead = false;
        }
        answers
    }

    /// Queues `tickets` in order; whether the caller leads (the queue was idle).
    fn enqueue(&self, tickets: &[Arc<Ticket>]) -> bool {
        let mut q = lock(&self.queue);
        q.waiting.extend(tickets.iter().cloned());
        !tickets.is_empty() && !std::mem::replace(&mut q.leading, true)
    }

    /// `me`'s answer: given by a leader, or made by leading its group
    /// (when `lead`, or when a leader hands over to it).
    fn settle(
        &self,
        me: &Arc<Ticket>,
        lead: bool,
        run: &mut dyn FnMut(&mut Group<'_>) -> Vec<Result<Agent>>,
        lost: &dyn Fn(String) -> StoreError,
    ) -> Result<Agent> {
        if !lead {
            let mut state = lock(&me.state);
            loop {
                match std::mem::replace(&mut *state, TicketState::Waiting) {
                    TicketState::Done(answer) => return answer,
                    TicketState::Lead => break,
                    TicketState::Waiting => {
                        state = me.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                    }
                }
            }
        }
        // This ticket is the oldest waiting one, so the group taken now holds it.
        let mut group = Group {
            groups: self,
            tickets: Vec::new(),
            lost,
        };
        group.take_more();
        let answers = run(&mut group);
        for (t, answer) in group.tickets.iter().zip(answers) {
            if Arc::ptr_eq(t, me) {
                *lock(&t.state) = TicketState::Done(answer);
            } else {
                answer_ticket(t, answer);
            }
        }
        drop(std::mem::take(&mut group.tickets));
        drop(group);
        match std::mem::replace(&mut *lock(&me.state), TicketState::Waiting) {
            TicketState::Done(answer) => answer,
            // Only if `run` gave fewer answers than tickets: say so rather
            // than panic.
            TicketState::Waiting | TicketState::Lead => Err(lost(format!(
                "admission of agent {} led its group commit but got no answer",
                me.new.name
            ))),
        }
    }
}

fn ticket(new: &NewAgent, quotas: Option<&Quotas>, events: &[NewEvent]) -> Arc<Ticket> {
    Arc::new(Ticket {
        new: new.clone(),
        quotas: quotas.copied(),
        events: events.to_vec(),
        state: Mutex::new(TicketState::Waiting),
        wake: Condvar::new(),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these mutexes is never left half-updated by a panic (each
    // update is one assignment), so a poisoned lock is as good as a clean one.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn answer_ticket(t: &Ticket, answer: Result<Agent>) {
    *lock(&t.state) = TicketState::Done(answer);
    t.wake.notify_one();
}

/// The group a leader took off the queue. Dropping it, however the leader left
/// (even by a panic), answers any ticket still unanswered and hands the queue to
/// the oldest waiting ticket, so no requester waits forever.
pub(crate) struct Group<'a> {
    groups: &'a Groups,
    tickets: Vec<Arc<Ticket>>,
    lost: &'a dyn Fn(String) -> StoreError,
}

impl Group<'_> {
    /// The admissions of the group, in arrival order.
    pub(crate) fn tickets(&self) -> &[Arc<Ticket>] {
        &self.tickets
    }

    /// Adds what was queued since, up to the maximum: first the oldest ticket
    /// and those after it, then (a store that waited for a lock before it
    /// ran the group) those that queued meanwhile. With one tenant a group,
    /// only the first ticket's tenant's.
    pub(crate) fn take_more(&mut self) {
        let max = self.groups.max;
        let mut q = lock(&self.groups.queue);
        if !self.groups.one_tenant {
            let n = q.waiting.len().min(max.saturating_sub(self.tickets.len()));
            self.tickets.extend(q.waiting.drain(..n));
            return;
        }
        let Some(tenant) = self
            .tickets
            .first()
            .or(q.waiting.front())
            .map(|t| t.new.tenant.clone())
        else {
            return;
        };
        let mut rest = VecDeque::with_capacity(q.waiting.len());
        for t in q.waiting.drain(..) {
            if self.tickets.len() < max && t.new.tenant == tenant {
                self.tickets.push(t);
            } else {
                rest.push_back(t);
            }
        }
        q.waiting = rest;
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        for t in &self.tickets {
            let mut state = lock(&t.state);
            if !matches!(*state, TicketState::Done(_)) {
                *state = TicketState::Done(Err((self.lost)(format!(
                    "admission of agent {} was not run: the thread leading its \
                     group commit panicked",
                    t.new.name
                ))));
                t.wake.notify_one();
            }
        }
        let mut q = lock(&self.groups.queue);
        match q.waiting.front() {
            Some(next) => {
                *lock(&next.state) = TicketState::Lead;
                next.wake.notify_one();
            }
            None => q.leading = false,
        }
    }
}
