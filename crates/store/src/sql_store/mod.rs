//! The whole contract, written once for every store given as a
//! [`SqlStore`]: each method is a shared body (`admission`, `runs`,
//! `records`, `jobs`, `sweeps`, `nodes`, `shares`, `blobs`, `removal`,
//! `idempotency`) or one of the store's statements, run on a connection or
//! in a transaction the store opens. A store gives only how it reads, how
//! it writes (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's tenant lock, and
//! whether the other nodes hear of it), how it admits (its group commit),
//! and the few parts only PostgreSQL has (a lease's session lock, the news
//! of other nodes' writes). Here `Admission`, `Runs`, `Transcripts`,
//! `Records` and `Recovery`; the other traits each in a module of their
//! own below.

use brood_core::{
    AgentName, Code, Quotas, RunId, SessionName, Status, TenantId, TenantQuotas, Terminal,
};

use crate::contract::{Admission, Records, Recovery, Runs, Transcripts};
use crate::db::{Db, Value};
use crate::group::{Group, Groups};
use crate::types::{
    Agent, Channel, EndItem, Event, LeaseLock, Message, NewAgent, NewEvent, Result, Run, RunEnd,
    Spend, StartItem, StoreError,
};
use crate::{admission, records, runs};

mod blobs;
mod idempotency;
mod jobs;
mod nodes;
mod removal;
mod shares;
mod sweeps;

/// A store the shared contract runs on: how it runs a body. Every write is
/// one transaction (or, for [`SqlStore::writing_one`], one statement) that
/// commits before the method returns.
pub(crate) trait SqlStore {
    type Err: From<StoreError>;
    type Db<'c>: Db<Err = Self::Err>;

    /// Runs `f` on a connection (reads that need no transaction).
    fn reading<T>(
        &self,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// Runs `f` in a transaction that reads and then writes in `tenant`,
    /// holding what keeps its reads true until the commit; the other nodes
    /// hear of it.
    fn writing<T>(
        &self,
        tenant: &TenantId,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// Runs `f` in a transaction that locks no tenant first: a write with
    /// no read before it, or a body that locks what it needs (recovery);
    /// the other nodes hear of it.
    fn writing_any<T>(
        &self,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// [`SqlStore::writing_any`] without telling the other nodes: the
    /// caller calls [`SqlStore::announce`] when the write changed what they
    /// would look at (a claim or a take that found nothing is no news, and
    /// a blob's chunk never is: the news that names the blob is).
    fn writing_quiet<T>(
        &self,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// Runs `f` in a transaction that holds `tenant`'s concurrency slots
    /// (on PostgreSQL a lock of their own, apart from the tenant's, so that
    /// starts and ends never queue behind admissions), not announced: the
    /// news of a start or an end is its record's.
    fn writing_slots<T>(
        &self,
        tenant: &TenantId,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// Runs `f`, one statement, committed on its own where the store can
    /// do without a transaction around it, and not announced (a heartbeat
    /// every tick is no news to the other nodes).
    fn writing_one<T>(
        &self,
        f: impl Fn(&Self::Db<'_>) -> std::result::Result<T, Self::Err>,
    ) -> Result<T>;

    /// Tells the other nodes that this one wrote (after a
    /// [`SqlStore::writing_quiet`] that changed something).
    fn announce(&self);

    /// Rung once events appended through this store have committed
    /// (`crate::bell`).
    fn bell(&self) -> &crate::bell::Bell;

    /// The admissions queued for their group commit (`crate::group`).
    fn admissions(&self) -> &Groups;

    /// Commits a group of admissions, each decided by `admission::decide`,
    /// in one transaction: one answer per ticket of its final `tickets()`,
    /// in order (see `Groups::admit`).
    fn commit_group(&self, group: &mut Group<'_>) -> Vec<Result<Agent>>;

    /// The error of an admission whose group was lost, naming the store.
    fn admission_lost(&self, message: String) -> StoreError;

    /// `Sweeps::lease_lock`: a store shared by nodes locks a lease for its
    /// holder's session; one file's store leaves it to the runtime's lock
    /// on a file beside it.
    fn lease_lock(&self, name: &str) -> Result<LeaseLock> {
        let _ = name;
        Ok(LeaseLock::NotShared)
    }

    /// `Sweeps::break_lease_lock`.
    fn break_lease_lock(&self, name: &str) -> Result<bool> {
        let _ = name;
        Ok(false)
    }

    /// `Nodes::hear`: a store that other nodes write to tells this one.
    fn hear(
        &self,
        me: &str,
        on_news: std::sync::Arc<dyn Fn(crate::Changed) + Send + Sync>,
    ) -> Result<()> {
        let _ = (me, on_news);
        Ok(())
    }
}

/// Admission through the store's group commit: the requesters queue, and
/// the one whose turn it is commits what is queued.
fn admit_grouped<S: SqlStore>(
    store: &S,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Result<Agent> {
    let lost = |message: String| store.admission_lost(message);
    store
        .admissions()
        .admit(new, quotas, events, |g| store.commit_group(g), &lost)
}

fn text(s: &str) -> Value<'_> {
    Value::from(s)
}

impl<S: SqlStore> Admission for S {
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent> {
        admit_grouped(self, new, None, events)
    }

    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        admit_grouped(self, new, Some(quotas), events)
    }

    fn admit_all_with_quotas(
        &self,
        batch: &[(&NewAgent, &[NewEvent])],
        quotas: &Quotas,
    ) -> Vec<Result<Agent>> {
        let lost = |message: String| self.admission_lost(message);
        self.admissions()
            .admit_all(batch, Some(quotas), |g| self.commit_group(g), &lost)
    }

    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas> {
        self.reading(|db| {
            let rows = db.named_ints(S::Db::SQL.tenant_quotas, &[text(tenant.as_str())])?;
            Ok(admission::tenant_quotas(tenant, rows)?)
        })
    }

    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        admission::check_quota_key(tenant, key, value)?;
        // One upsert, no read before it: no tenant lock needed.
        self.writing_any(|db| {
            let params = [
                text(tenant.as_str()),
                text(key),
                Value::from(i64::from(value)),
            ];
            db.exec(S::Db::SQL.set_tenant_quota, &params)?;
            Ok(())
        })
    }

    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool> {
        self.reading(|db| admission::is_ancestor_or_self(db, tenant, candidate, agent))
    }
}

impl<S: SqlStore> Runs for S {
    fn start_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        pid: i32,
        cgroup: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.writing(tenant, |db| {
            runs::start_run(db, tenant, name, run, pid, cgroup, now_ms, events, None)
        })
    }

    fn start_one(&self, tenant: &TenantId, it: &StartItem) -> Result<Agent> {
        self.writing(tenant, |db| runs::start_item(db, tenant, it))
    }

    fn start_runs(&self, tenant: &TenantId, items: &[StartItem]) -> Vec<Result<Agent>> {
        match self.writing(tenant, |db| runs::start_runs(db, tenant, items)) {
            Ok(answers) => answers,
            // One start cannot fail alone here, so the lot did: each runs
            // alone, so that a failure is its own. Not when the lot's fate
            // is unknown (its COMMIT unanswered): it may have been recorded.
            Err(e) if items.len() > 1 && !matches!(e, StoreError::PostgresInDoubt { .. }) => {
                crate::contract::start_each(self, tenant, items)
            }
            Err(e) => {
                let message = e.to_string();
                let mut out = vec![Err(e)];
                out.extend(items.iter().skip(1).map(|it| {
                    Err(StoreError::Refused {
                        code: Code::Internal,
                        message: format!(
                            "the start of {} was recorded with others: {message}",
                            it.name
                        ),
                    })
                }));
                out
            }
        }
    }

    fn set_status(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        to: Status,
        detail: Option<&str>,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.writing(tenant, |db| {
            runs::set_status(db, tenant, name, to, detail, now_ms, events)
        })
    }

    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        self.writing(tenant, |db| {
            runs::mark_stopping(db, tenant, names, outcome, now_ms)
        })
    }

    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.writing(tenant, |db| {
            runs::end_run(db, tenant, name, run, end, events)
        })
    }

    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        self.writing(tenant, |db| runs::end_runs(db, tenant, items))
    }

    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        // One update, no read before it: no tenant lock needed.
        self.writing_any(|db| runs::record_usage(db, tenant, run, tokens_in, tokens_out, cost_usd))
    }

    fn resume(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.writing(tenant, |db| {
            runs::resume(db, tenant, name, run, supervisor, now_ms, None, events)
        })
    }

    fn resume_within(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        supervisor: &str,
        now_ms: i64,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        let q = Some(quotas);
        self.writing(tenant, |db| {
            runs::resume(db, tenant, name, run, supervisor, now_ms, q, events)
        })
    }
}

impl<S: SqlStore> Transcripts for S {
    fn append_message(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
        run: &RunId,
        role: &str,
        content: &str,
        now_ms: i64,
    ) -> Result<Message> {
        self.writing(tenant, |db| {
            records::append_message(db, tenant, agent, session, run, role, content, now_ms)
        })
    }

    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>> {
        self.writing(tenant, |db| db.append_events(tenant, events, now_ms))
    }

    fn messages(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
    ) -> Result<Vec<Message>> {
        let params = [
            text(tenant.as_str()),
            text(agent.as_str()),
            text(session.as_str()),
        ];
        self.reading(|db| db.messages(S::Db::SQL.messages, &params))
    }

    fn events(
        &self,
        tenant: &TenantId,
        after: i64,
        agent: Option<&AgentName>,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let (t, after, limit) = (
            text(tenant.as_str()),
            Value::from(after),
            Value::from(limit),
        );
        self.reading(|db| match agent {
            None => db.events(S::Db::SQL.events, &[t, after, limit]),
            Some(a) => db.events(
                S::Db::SQL.events_of_agent,
                &[t, after, limit, text(a.as_str())],
            ),
        })
    }

    fn last_event_seq(&self, tenant: &TenantId) -> Result<i64> {
        self.reading(|db| db.int(S::Db::SQL.last_event_seq, &[text(tenant.as_str())]))
    }

    fn appended(&self) -> tokio::sync::watch::Receiver<u64> {
        self.bell().subscribe()
    }
}

impl<S: SqlStore> Records for S {
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>> {
        self.reading(|db| db.agent(tenant, name))
    }

    fn run(&self, tenant: &TenantId, run: &RunId) -> Result<Option<Run>> {
        let params = [text(tenant.as_str()), text(run.as_str())];
        self.reading(|db| Ok(db.runs(S::Db::SQL.run, &params)?.into_iter().next()))
    }

    fn runs(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Run>> {
        let params = [text(tenant.as_str()), text(name.as_str())];
        self.reading(|db| db.runs(S::Db::SQL.runs, &params))
    }

    fn tenant_runs(&self, tenant: &TenantId) -> Result<Vec<Run>> {
        self.reading(|db| db.runs(S::Db::SQL.tenant_runs, &[text(tenant.as_str())]))
    }

    fn current_runs(
        &self,
        tenant: &TenantId,
        parent: Option<&AgentName>,
        all: bool,
    ) -> Result<Vec<Run>> {
        let t = text(tenant.as_str());
        self.reading(|db| match parent {
            Some(p) => db.runs(S::Db::SQL.current_runs_of_children, &[t, text(p.as_str())]),
            None if all => db.runs(S::Db::SQL.current_runs_all, &[t]),
            None => db.runs(S::Db::SQL.current_runs_unfinished, &[t]),
        })
    }

    fn agents(&self, tenant: &TenantId, all: bool) -> Result<Vec<Agent>> {
        self.reading(|db| {
            let sql = if all {
                S::Db::SQL.agents_all
            } else {
                S::Db::SQL.agents_unfinished
            };
            db.agents(sql, &[text(tenant.as_str())])
        })
    }

    fn children(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.reading(|db| records::children(db, tenant, name))
    }

    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.reading(|db| records::descendants_post_order(db, tenant, name))
    }

    fn unfinished_below(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
    ) -> Result<std::collections::HashSet<AgentName>> {
        self.reading(|db| records::unfinished_below(db, tenant, names))
    }

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Result<Option<Channel>> {
        let params = [
            text(tenant.as_str()),
            text(parent.as_str()),
            text(child.as_str()),
        ];
        self.reading(|db| Ok(db.channels(S::Db::SQL.channel, &params)?.into_iter().next()))
    }

    fn spend(&self, tenant: &TenantId, name: &AgentName) -> Result<Spend> {
        self.reading(|db| records::spend(db, tenant, name))
    }
}

impl<S: SqlStore> Recovery for S {
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>> {
        self.reading(|db| records::unfinished_of(db, supervisors))
    }

    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>> {
        self.reading(|db| db.agents(S::Db::SQL.stopping_of, &[text(supervisor)]))
    }

    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        // Across tenants, so without one tenant's lock: `runs::recover` takes
        // the lock of every tenant it ends agents in, where tenants are locked.
        self.writing_any(|db| runs::recover(db, dead, false, now_ms))
    }

    fn recover_resuming(
        &self,
        dead: &[String],
        resume: &[crate::types::Resuming],
        supervisor: &str,
        now_ms: i64,
    ) -> Result<crate::types::Recovered> {
        self.writing_any(|db| runs::recover_resuming(db, dead, resume, supervisor, now_ms))
    }

    fn recover_lost(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.writing_any(|db| runs::recover(db, dead, true, now_ms))
    }

    fn recover_lost_placing(
        &self,
        dead: &[String],
        placing: &[crate::types::Placing],
        now_ms: i64,
    ) -> Result<crate::types::Recovered> {
        self.writing_any(|db| runs::recover_lost_placing(db, dead, placing, now_ms))
    }

    fn supervisors_with_unfinished(&self) -> Result<Vec<String>> {
        self.reading(|db| db.texts(S::Db::SQL.supervisors_with_unfinished, &[]))
    }

    fn tenants(&self) -> Result<Vec<TenantId>> {
        self.reading(|db| {
            db.texts(S::Db::SQL.tenants, &[])?
                .into_iter()
                .map(|t| {
                    TenantId::new(&t).map_err(|_| {
                        StoreError::Corrupt {
                            what: "tenants.id",
                            value: t,
                        }
                        .into()
                    })
                })
                .collect()
        })
    }
}
