//! The store's contract, by concern: what the supervisor codes against, what
//! both backends implement (once for both, in `sql_store`), and what
//! `brood-store-conformance` checks. Every mutating method runs in one
//! transaction and either does all of what it says or nothing; events it
//! names are appended in the same transaction, so the event log never
//! disagrees with the records.

use brood_core::{AgentName, Quotas, RunId, SessionName, Status, TenantId, TenantQuotas, Terminal};

use crate::types::*;

/// Admission of new agents with their quotas, and the tenants' quota overrides and the cycle check it needs (SPEC 5, 9).
pub trait Admission {
    /// Admission of a new agent (a root when `parent` is `None`): in one
    /// `BEGIN IMMEDIATE` transaction, refuse with `NameTaken` if the name exists in
    /// the tenant, with `ParentMismatch` if the parent is missing, not live, or
    /// stopping; else insert the agent (`queued`), its first run, the parent-child
    /// edge, the parent's channel (`pending`, with the handoff) and the events
    /// `agent.spawn` (in the child's log) and `agent.child.spawn` (in the parent's).
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent>;

    /// Admission with quotas (SPEC 9): exactly [`Store::admit`], plus the quota
    /// checks inside the same `BEGIN IMMEDIATE` transaction, after `admit`'s own
    /// refusals and before anything is written, so concurrent admissions (threads,
    /// or supervisors sharing the file) are counted one after another and the
    /// limits hold exactly. `quotas` are the tenant's effective limits
    /// (`QuotaConfig::effective`); `max_concurrent` is not checked here (a
    /// creation past it waits `queued` for a slot, it is not refused).
    ///
    /// The order of the refusals, each with the code given and a message naming
    /// the limit and the count it met:
    /// 1. `admit`'s own, in its order: `BadRequest` (spec not a JSON object),
    ///    `ParentMismatch` (parent), `NameTaken`, `ParentMismatch` (customer);
    /// 2. `QuotaDepth`: the parent's depth + 1 > `max_depth`;
    /// 3. `QuotaFanout`: the parent already has `max_fanout` or more unfinished
    ///    (queued, running, blocked, stopping) children;
    /// 4. `QuotaTreeSize`: the tree already holds `max_tree_size` or more agents,
    ///    counting every agent ever created under its root, finished or not, and
    ///    the root itself;
    /// 5. `CreateLimit`: the parent's recorded policy has `create_limit` n and
    ///    its current run has already created n children (every child created
    ///    since the run's record was made, whichever supervisor admitted it);
    /// 6. `BudgetExceeded`: the child's `cost_limit` is more than its parent's
    ///    budget left.
    ///
    /// A root skips depth and fanout; its tree would hold 1 agent, so it is
    /// refused only when `max_tree_size` is 0. The counts read indexes only, no
    /// table rows: the partial index of unfinished agents on (tenant, parent,
    /// status), and the (tenant, root) index.
    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent>;

    /// [`Admission::admit_with_quotas`] for admissions that arrived
    /// together: each checked and answered as if it came alone, in order,
    /// recorded with as few commits as the store can (a group commit takes
    /// the lot, up to its maximum). One answer per admission, in order.
    fn admit_all_with_quotas(
        &self,
        batch: &[(&NewAgent, &[NewEvent])],
        quotas: &Quotas,
    ) -> Vec<Result<Agent>> {
        batch
            .iter()
            .map(|(new, events)| self.admit_with_quotas(new, quotas, events))
            .collect()
    }

    /// The tenant's quota overrides; every field `None` when it has none (also
    /// for a tenant the store has never seen). Values are as they were set, not
    /// clamped: clamping to the platform's ceilings is `QuotaConfig::effective`.
    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas>;

    /// Sets one quota override of the tenant, durably (replacing an earlier value
    /// of the same key). `key` is one of `Quotas::KEYS`; any other is refused with
    /// `BadRequest` naming it, and nothing is written. The tenant need not have
    /// agents yet.
    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()>;

    /// The cycle check of SPEC 9 for resume and customer: true when `candidate`
    /// is `agent` itself or one of its ancestors (the walk up the parents, through
    /// the primary key, guarded in depth). An unknown `agent` is `NotFound` (a
    /// misspelt name must not read as "no cycle"); an unknown `candidate` is
    /// simply not an ancestor. A parent chain that loops (corruption) is
    /// `Corrupt`.
    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool>;
}

/// A run's life: start, status changes, the intent of a stop, its end (alone or a whole stop's in post-order), usage, and resume.
pub trait Runs {
    /// The process started: `queued` → `running`, the run gets its pid and cgroup.
    /// Refused with `StoreError::Transition` when the agent is no longer queued
    /// (cancelled meanwhile): the caller must then kill what it started.
    // Kept flat so the supervisor's calls read like the SPEC's verbs; an
    // argument struct (like `RunEnd`) would be the next step if more are added.
    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        pid: i32,
        cgroup: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent>;

    /// [`Runs::start_run`] of one [`StartItem`], its `supervisor` checked
    /// in the same transaction where the store can.
    fn start_one(&self, tenant: &TenantId, it: &StartItem) -> Result<Agent> {
        self.start_run(
            tenant, &it.name, &it.run, it.pid, &it.cgroup, it.now_ms, &it.events,
        )
    }

    /// [`Runs::start_run`] for starts that arrived together, in one
    /// transaction where the store can: each checked and answered as if
    /// alone (a refused one writes nothing and refuses only itself), in
    /// order. One answer per item.
    fn start_runs(&self, tenant: &TenantId, items: &[StartItem]) -> Vec<Result<Agent>> {
        start_each(self, tenant, items)
    }

    /// Any other status change, checked by `Status::transition`; `detail` replaces
    /// the agent's detail text. When `to` ends the run, use `end_run` instead.
    fn set_status(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        to: Status,
        detail: Option<&str>,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent>;

    /// Records the intent to stop a whole subtree in one transaction: every named
    /// agent that is live or queued moves to `Stopping(outcome)` (queued ones go
    /// straight to `Ended(outcome)`); finished ones are left alone. Returns the
    /// agents as they are after the change, in the order given.
    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>>;

    /// The run ended: the agent moves to `Ended(end.outcome)` (from running,
    /// blocked, queued, or from `Stopping` with the same outcome — a stopping agent
    /// keeps the outcome recorded with the intent, whatever `end` says), the run
    /// records exit code, result, end time; the parent's channel takes the result.
    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent>;

    /// Many ends in one transaction (the records of a stop, written in the order
    /// given: post-order). An item with `end: None` only appends its events (its
    /// run had already ended, e.g. a queued agent ended by `mark_stopping`).
    /// All or nothing.
    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>>;

    /// Cumulative usage of a run (SPEC 7 `usage`): replaces the run's counters.
    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()>;

    /// Resume: a finished (ended or closed) agent gets a new run on the same
    /// session and goes back to `queued`. Refused with `Conflict` otherwise.
    fn resume(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent>;

    /// [`Runs::resume`] as a verb (SPEC 4: "after admission again"): also
    /// refused with `QuotaFanout` when the parent already has `max_fanout`
    /// unfinished children, counted in the same transaction. (Depth and tree
    /// size do not change: the agent is already in its tree.) Recovery after
    /// a restart uses `resume`, which puts back what was there.
    #[allow(clippy::too_many_arguments)]
    fn resume_within(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent>;
}

/// What is said and what happens: a session's messages and the event log.
pub trait Transcripts {
    /// Appends a whole message to the agent's session transcript; returns it with
    /// its position.
    // Kept flat so the supervisor's calls read like the SPEC's verbs; an
    // argument struct (like `RunEnd`) would be the next step if more are added.
    #[allow(clippy::too_many_arguments)]
    fn append_message(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
        run: &RunId,
        role: &str,
        content: &str,
        now_ms: i64,
    ) -> Result<Message>;

    /// Appends events outside any other change; returns them with their sequence.
    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>>;

    fn messages(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
    ) -> Result<Vec<Message>>;

    /// Events with `seq > after`, optionally of one agent, at most `limit`.
    fn events(
        &self,
        tenant: &TenantId,
        after: i64,
        agent: Option<&AgentName>,
        limit: u32,
    ) -> Result<Vec<Event>>;

    /// The sequence number of the tenant's last event (0 when it has none):
    /// where a reader that wants only what comes next starts.
    fn last_event_seq(&self, tenant: &TenantId) -> Result<i64>;

    /// A counter that changes once events appended through this store have
    /// committed (any tenant's), and, on a store other nodes share, when
    /// another node announces a write (`Nodes::hear`): a reader of the log
    /// waits on it instead of polling, then reads what follows its last
    /// event. It says only "look" (a change may bring nothing new), and it
    /// does not see writers outside this process that share no news (another
    /// process on the same SQLite file): a reader still looks now and then.
    fn appended(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// Each start recorded alone, in order: `Runs::start_runs` where a store has
/// nothing better, and a store's fallback when its one transaction failed.
pub(crate) fn start_each<S: Runs + ?Sized>(
    store: &S,
    tenant: &TenantId,
    items: &[StartItem],
) -> Vec<Result<Agent>> {
    items.iter().map(|it| store.start_one(tenant, it)).collect()
}

/// Reads of the records: agents, runs, the tree, channels and spend.
pub trait Records {
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>>;

    fn run(&self, tenant: &TenantId, run: &RunId) -> Result<Option<Run>>;

    fn runs(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Run>>;

    /// Every run of every agent of the tenant, each agent's in order: one
    /// read for a whole listing's usage (the web UI's tree), where a read an
    /// agent would be a round trip each on a networked store.
    fn tenant_runs(&self, tenant: &TenantId) -> Result<Vec<Run>>;

    /// The current run of each agent [`Records::agents`] (no `parent`) or
    /// [`Records::children`] (of `parent`) lists, in one read: what a
    /// listing shows of its agents' runs (pid, result, usage), where a read
    /// an agent would be a round trip each on a networked store. No order.
    fn current_runs(
        &self,
        tenant: &TenantId,
        parent: Option<&AgentName>,
        all: bool,
    ) -> Result<Vec<Run>>;

    /// All agents of the tenant (`all`), or only unfinished ones; by creation order.
    fn agents(&self, tenant: &TenantId, all: bool) -> Result<Vec<Agent>>;

    /// Direct children, in creation order (indexed; no scan).
    fn children(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>>;

    /// Every descendant, deepest first (post-order: each agent after all of its own
    /// descendants), found with an indexed recursive query and guarded against
    /// cycles, so it is the parent-death plan.
    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>>;

    /// Of `names`, those with an unfinished descendant, or whose
    /// descendants cannot be read whole (an edge without an agent, a
    /// cycle): the agents whose end leaves a stop to plan
    /// ([`Records::descendants_post_order`] plans it). One statement for
    /// the lot, so the ends recorded together ask once; a name not in the
    /// store has no descendant.
    fn unfinished_below(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
    ) -> Result<std::collections::HashSet<AgentName>>;

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Result<Option<Channel>>;

    /// An agent's spend, own and subtree (indexed walk over its edges). An
    /// unknown agent is `NotFound`.
    fn spend(&self, tenant: &TenantId, name: &AgentName) -> Result<Spend>;
}

/// What a supervisor's start needs: its unfinished and stopping agents, the dead incarnations' agents ended, the tenants.
pub trait Recovery {
    /// Agents not finished whose hosting supervisor is one of `supervisors`.
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>>;

    /// The agents hosted by `supervisor` whose stop is recorded (`stopping`):
    /// [`Store::unfinished_of`] narrowed, read by every supervisor each tick.
    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>>;

    /// Start-up recovery (SPEC 6 "Supervisor death"): every unfinished agent hosted
    /// by one of the `dead` supervisors ends in one transaction: a `Stopping(t)`
    /// agent ends with `t` (its recorded intent is carried out), every other one
    /// with `Cancelled(RuntimeRestart)`; each gets an `agent.stop` event. Returns
    /// the agents as they are afterwards.
    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>>;

    /// [`Recovery::recover`], and in the same transaction the agents of
    /// `resume` that it ended `cancelled (runtime_restart)` started again
    /// (issue 29: their policy says `on_restart: resume`), in the order
    /// given (parents first), each a new run `queued` on `supervisor` as a
    /// resume makes it, a child only when its parent was resumed. Nothing
    /// runs without a process: a resumed agent waits `queued` for its
    /// launch like any other.
    fn recover_resuming(
        &self,
        dead: &[String],
        resume: &[crate::types::Resuming],
        supervisor: &str,
        now_ms: i64,
    ) -> Result<crate::types::Recovered>;

    /// A node the others declared dead (its heartbeat expired, issue 15): as
    /// [`Recovery::recover`], but every agent it ran that was not stopping
    /// ends `Failed(Lost)`: its processes died with it, or are fenced off.
    fn recover_lost(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>>;

    /// [`Recovery::recover_lost`] with what moves on a node's loss (issue 29
    /// item 4), in the same transaction: each of `placing` (parents first)
    /// that is still queued on a `dead` host is placed again on its `to` as
    /// it is; each that the recovery ends `failed (lost)` is started again
    /// as its new run (`queued`, `placed_on(to)`, its session's history
    /// kept) when its parent was resumed before it or is unfinished. The
    /// rest ends as `recover_lost` ends it. `Recovered::agents` holds every
    /// agent the recovery ended (a resumed one as it is afterwards),
    /// `resumed` and `replaced` the names moved.
    fn recover_lost_placing(
        &self,
        dead: &[String],
        placing: &[crate::types::Placing],
        now_ms: i64,
    ) -> Result<crate::types::Recovered>;

    /// Distinct supervisor ids that host unfinished agents.
    fn supervisors_with_unfinished(&self) -> Result<Vec<String>>;

    fn tenants(&self) -> Result<Vec<TenantId>>;
}

/// The sweepers (SPEC 9): the fenced lease, the overdue and orphaned agents, and the fenced writes that stop and end them.
pub trait Sweeps {
    /// Takes the lease `name` for `holder` (the caller holds the operating-system
    /// lock that makes it exclusive) and returns the new epoch: one more than any
    /// epoch the lease had before, so an earlier holder's fence no longer matches.
    fn acquire_lease(&self, name: &str, holder: &str, now_ms: i64) -> Result<Fence>;

    /// Tries to take the lock that makes one holder of lease `name` exclusive
    /// among every process sharing this store, without waiting.
    fn lease_lock(&self, name: &str) -> Result<LeaseLock> {
        let _ = name;
        Ok(LeaseLock::NotShared)
    }

    /// Ends the session holding lease `name`'s lock, if one does (its node was
    /// declared lost while its connection stays open, e.g. a paused process):
    /// the lock is free again, and the epoch fence keeps the old holder's
    /// writes out. `false` when no session held it.
    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        let _ = name;
        Ok(false)
    }

    /// Who holds the lease `name` now, if anyone ever took it.
    fn lease(&self, name: &str) -> Result<Option<Fence>>;

    /// The timeouts sweeper's read (every tenant): unfinished, not yet stopping
    /// agents whose current run's deadline is at or before `now_ms`, at most
    /// `limit`, most overdue first.
    fn overdue(&self, now_ms: i64, limit: u32) -> Result<Vec<Agent>>;

    /// The orphans sweeper's read (every tenant): unfinished, not yet stopping
    /// agents whose parent is finished or missing, at most `limit`.
    fn orphans(&self, limit: u32) -> Result<Vec<Agent>>;

    /// A sweeper's stop: [`Store::mark_stopping`] of `names`, plus `events`,
    /// refused with `Conflict` (and nothing written) unless `fence` still holds.
    fn sweep_stop(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Vec<Agent>>;

    /// A sweeper's end of a run whose process is gone: the agent ends with
    /// `end` (its current run) whatever its live status, plus `events`; refused
    /// with `Conflict` unless `fence` still holds. Its unfinished descendants are
    /// the caller's next `sweep_stop`.
    fn sweep_end(
        &self,
        fence: &Fence,
        tenant: &TenantId,
        name: &AgentName,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent>;
}

/// The API's idempotency keys (SPEC 11): a mutation's first answer, kept
/// until it expires, so a retry after a lost reply or a restart is answered
/// without doing the mutation twice.
pub trait Idempotency {
    /// The answer kept under `caller`'s `key` in `tenant`, unless it
    /// expired before `now_ms`. Keys are per caller: another caller's `key`
    /// is never found.
    fn idempotent_reply(
        &self,
        tenant: &TenantId,
        caller: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<IdempotentReply>>;

    /// Keeps `reply` unless an unexpired answer is already kept under its
    /// caller's key,
    /// in one transaction that also forgets the tenant's expired keys; returns
    /// whichever answer is kept (the first one wins a race).
    fn keep_idempotent_reply(
        &self,
        reply: &IdempotentReply,
        now_ms: i64,
    ) -> Result<IdempotentReply>;
}

/// Jobs (SPEC 10): jobs, their items and every attempt, each status change
/// through `JobStatus::transition` / `ItemStatus::transition`. Job events are
/// in the owner's log (the `events` given with each call).
pub trait Jobs {
    /// Creates a job and all its items (`pending`) in one transaction.
    /// Refused, with nothing written: `NotFound` when the owner does not
    /// exist, `Conflict` when the job id is taken, `BadRequest` when two items
    /// share an id, an input is not a JSON object, or there is no item.
    fn create_job(&self, job: &NewJob, items: &[NewItem], events: &[NewEvent]) -> Result<Job>;

    fn job(&self, tenant: &TenantId, id: &str) -> Result<Option<Job>>;

    /// The tenant's jobs, oldest first.
    fn jobs(&self, tenant: &TenantId) -> Result<Vec<Job>>;

    /// A job's status change (start, complete, fail, cancel), with its events.
    fn set_job_status(
        &self,
        tenant: &TenantId,
        id: &str,
        to: brood_core::JobStatus,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Job>;

    /// A job's items in input order, of one status when given.
    fn job_items(
        &self,
        tenant: &TenantId,
        job: &str,
        status: Option<brood_core::ItemStatus>,
    ) -> Result<Vec<JobItem>>;

    /// The first `pending` item (in input order) whose backoff is over at
    /// `now_ms`: what a job assigns next. Reads the status index, not the job.
    fn next_pending_item(
        &self,
        tenant: &TenantId,
        job: &str,
        now_ms: i64,
    ) -> Result<Option<JobItem>>;

    /// How many items are in each status (every status listed, zeros too).
    fn item_counts(
        &self,
        tenant: &TenantId,
        job: &str,
    ) -> Result<Vec<(brood_core::ItemStatus, u32)>>;

    /// Starts the next attempt at a `pending` item whose backoff is over:
    /// the item is `running`, assigned to `worker`, and a new attempt row
    /// (number `attempts + 1`) is added. `Conflict` otherwise (not pending,
    /// backoff not over, the job not running).
    #[allow(clippy::too_many_arguments)]
    fn start_attempt(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        worker: &AgentName,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Attempt>;

    /// Records the result of attempt `attempt` by `worker`: accepted only
    /// when that attempt is the item's current one, still running, and
    /// `worker` is its worker (the fencing token); then the item is
    /// `completed` with its one result. `Conflict` otherwise, nothing written.
    #[allow(clippy::too_many_arguments)]
    fn report_result(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        attempt: u32,
        worker: &AgentName,
        result: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem>;

    /// Fails the current attempt (its worker exited without reporting, timed
    /// out, or reported an invalid result) with `error`: the item goes back to
    /// `pending` after a backoff while attempts remain (`max_attempts`), else
    /// `failed`. `Conflict` when `attempt` is not the current running one.
    #[allow(clippy::too_many_arguments)]
    fn fail_attempt(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        attempt: u32,
        error: &str,
        max_attempts: u32,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem>;

    /// A `failed` item back to `pending` (its attempts kept; the next one
    /// continues the count). `Conflict` for an item in another status.
    fn retry_item(
        &self,
        tenant: &TenantId,
        job: &str,
        item: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<JobItem>;

    /// Every attempt at an item, in order.
    fn attempts(&self, tenant: &TenantId, job: &str, item: &str) -> Result<Vec<Attempt>>;
}

/// The nodes sharing the store (issue 15): each registers itself when it
/// starts, heartbeats on its tick and leaves when it stops; any node lists
/// them with their load.
///
/// Node expiry is judged on the store's clock (issue 28): registrations and
/// heartbeats take no time from the caller, the store writes its own, and
/// [`Nodes::nodes`] gives each heartbeat's age on that same clock. A node's
/// own clock, which may be off by more than the expiry on another machine,
/// never enters the judgement.
pub trait Nodes {
    /// Records `node` (again, if it was: its registration is replaced), its
    /// start and heartbeat the store's time now.
    fn register_node(&self, node: &NewNode) -> Result<Node>;

    /// The node is alive at the store's time now. `NotFound` for a node
    /// never registered (or that left).
    fn heartbeat_node(&self, id: &str) -> Result<()>;

    /// A node that stopped cleanly: its record goes (its agents' records
    /// stay; they were ended by its shutdown).
    fn leave_node(&self, id: &str) -> Result<()>;

    /// Every registered node, by id, with the unfinished agents each runs
    /// and its heartbeat's age on the store's clock at this read.
    fn nodes(&self) -> Result<Vec<Node>>;

    /// The agents another node admitted in `tenant` for `node` to run,
    /// still unclaimed (their host recorded as [`crate::placed_on`]`(node)`),
    /// claimed: their host becomes `node`, in one transaction, and no other
    /// claim gets them (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so claims never
    /// wait for each other). Queued ones, and ones whose stop was recorded
    /// before the claim (which the claimer ends, with no process to stop);
    /// at most `limit`, oldest first. Nothing is written for an agent that
    /// is not unclaimed any more.
    fn claim_placed(&self, tenant: &TenantId, node: &str, limit: u32) -> Result<Vec<Agent>>;

    /// Moves `name`, still `queued` for node `from` (claimed or not), to
    /// wait for node `to` to claim it (the re-placement of a lost node's
    /// queue). False, and nothing written, when it is not queued there.
    fn replace_queued(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        from: &str,
        to: &str,
    ) -> Result<bool>;

    /// An input for `agent`, which node `host` runs, from `sender`: kept
    /// until the host takes it.
    fn post_input(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        host: &str,
        sender: &str,
        text: &str,
        now_ms: i64,
    ) -> Result<()>;

    /// The inputs posted for agents `host` runs in `tenant`, taken (gone
    /// from the store once returned, so each is delivered once), in the
    /// order they were posted; at most `limit`.
    fn take_inputs(&self, tenant: &TenantId, host: &str, limit: u32) -> Result<Vec<Inbound>>;

    /// Live news between the nodes sharing the store: from this call on,
    /// each write committed through this store is announced to the other
    /// nodes as `me` (soon and coalesced), and `on_news` is called (on a
    /// thread of the store's; it must not block) when another node
    /// announces one, and whenever news may have been missed (the listening
    /// connection made again), with what the other node's writes changed
    /// ([`crate::Changed`]: `ALL` when it may have been anything). A
    /// notification says only where to look: the store stays the truth, so
    /// a lost one costs latency, never correctness. A store no other node
    /// reaches hears nothing (the default).
    fn hear(
        &self,
        me: &str,
        on_news: std::sync::Arc<dyn Fn(crate::Changed) + Send + Sync>,
    ) -> Result<()> {
        let _ = (me, on_news);
        Ok(())
    }
}

/// The bytes of artifacts, shared between the nodes (issue 15): a child's
/// artifacts are taken into its node's blob store; a parent on another node
/// reads them through this one. A blob is named by its SHA-256 (lowercase
/// hex) within a tenant and kept in chunks of at most [`BLOB_CHUNK`] bytes,
/// each written in a transaction of its own, so a large blob never holds the
/// store's writer for long. The store does not hash: the reader checks the
/// bytes against the name.
pub trait Blobs {
    /// Keeps the `size` bytes `src` gives as blob `sha256` of `tenant`. The
    /// blob is readable only once every chunk is written (its head row is
    /// written last), so a writer that dies midway leaves nothing readable,
    /// and a later put finishes it. A blob already kept is not read again.
    /// `src` ending before `size` bytes is an error naming the blob.
    fn put_blob(
        &self,
        tenant: &TenantId,
        sha256: &str,
        size: u64,
        src: &mut dyn std::io::Read,
    ) -> Result<()>;

    /// Writes blob `sha256` of `tenant` to `dst`, chunk by chunk (at most
    /// one chunk in memory). False, and nothing written, when the store
    /// does not hold it whole.
    fn get_blob(
        &self,
        tenant: &TenantId,
        sha256: &str,
        dst: &mut dyn std::io::Write,
    ) -> Result<bool>;
}

/// The tenant's concurrency slots (SPEC 9) counted in the store, for nodes
/// that share no Redis (issue 15): one share a holder (a supervisor's id),
/// the slots its started agents hold; the count is their sum. Each call is
/// one transaction, exact under any concurrency: on PostgreSQL under an
/// advisory lock of the tenant's slots (not the tenant's own, which
/// admissions take).
pub trait SlotShares {
    /// Takes a slot for `holder` if the tenant's shares sum to less than
    /// `max`; false, and nothing written, otherwise.
    fn slot_acquire(&self, tenant: &TenantId, holder: &str, max: u32) -> Result<bool>;

    /// Gives `holder`'s slot back, never below 0 (a share at 0 is removed).
    fn slot_release(&self, tenant: &TenantId, holder: &str) -> Result<()>;

    /// Takes up to `want` slots for `holder` at once, as many as leave the
    /// tenant's shares at or under `max` (one transaction, so a node
    /// starting a burst pays one commit, not one each); how many it took.
    fn slot_acquire_up_to(
        &self,
        tenant: &TenantId,
        holder: &str,
        max: u32,
        want: u32,
    ) -> Result<u32>;

    /// Gives `n` of `holder`'s slots back at once, never below 0.
    fn slot_release_n(&self, tenant: &TenantId, holder: &str, n: u32) -> Result<()>;

    /// Sets `holder`'s share to `actual` (0 removes it); its old value.
    fn slot_repair(&self, tenant: &TenantId, holder: &str, actual: u64) -> Result<u64>;

    /// Every share of the tenant, by holder.
    fn slot_shares(&self, tenant: &TenantId) -> Result<Vec<(String, u64)>>;

    /// Removes the shares of `holders` (supervisors that are gone); the
    /// slots they held.
    fn slot_forget(&self, tenant: &TenantId, holders: &[String]) -> Result<u64>;
}

/// Removing what has finished (issue 25): a tree (or a subtree) whose every
/// agent has ended, and a job that is not running, with everything the store
/// holds of them, so their names are free again. SPEC 1's "history is never
/// lost" holds until the operator removes it: nothing is removed but on
/// request, and a removal is all or nothing.
pub trait Removal {
    /// Removes `top` and every agent under it (found through the agents'
    /// `parent`), in one transaction: their messages, events, runs,
    /// channels (the one from `top`'s parent too), edges, inbox rows, the
    /// jobs they own (with the jobs' items and attempts), the blobs only
    /// their channels named, and the agents. Refused, with nothing written:
    /// `NotFound` for an unknown `top`; `Conflict` naming the agent and its
    /// status when one of them has not finished (SPEC 6: ended or closed),
    /// naming the job when one they own is pending or running, and naming
    /// the agent when one outside the subtree has a removed agent as its
    /// customer.
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed>;

    /// The tenant's trees whose every agent has finished, that own no job
    /// pending or running, and whose last end ([`FinishedTree::last_end_ms`])
    /// is before `ended_before_ms`: oldest first, at most `limit`. Reads every
    /// agent of the tenant (a batch for `brood prune`, not a hot path).
    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>>;

    /// Removes job `id` (pending, completed, failed or cancelled) with its
    /// items and attempts, and its own workers' subtrees as
    /// [`Removal::remove_tree`] removes them, plus `events` (in its owner's
    /// log), in one transaction. Refused, with nothing written: `NotFound`
    /// for an unknown job; `Conflict` for a running one (naming its status),
    /// and as `remove_tree` for a worker's subtree.
    fn remove_job(
        &self,
        tenant: &TenantId,
        id: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<RemovedJob>;
}

/// The most bytes of a blob one row (and one transaction) holds.
pub const BLOB_CHUNK: usize = 1 << 20;

/// The store's whole contract: every concern, shared across threads. Every mutating method runs in one transaction and either
/// does all of what it says or nothing; events it names are appended in the same
/// transaction, so the event log never disagrees with the records.
pub trait Store:
    Admission
    + Runs
    + Transcripts
    + Records
    + Recovery
    + Sweeps
    + Idempotency
    + Jobs
    + Nodes
    + Blobs
    + SlotShares
    + Removal
    + Send
    + Sync
{
}

impl<
    T: Admission
        + Runs
        + Transcripts
        + Records
        + Recovery
        + Sweeps
        + Idempotency
        + Jobs
        + Nodes
        + Blobs
        + SlotShares
        + Removal
        + Send
        + Sync,
> Store for T
{
}
