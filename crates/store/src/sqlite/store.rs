//! The store's contract implemented on SQLite, concern by concern (the
//! sweepers' part is in `sweeps`).

use super::txn::On;
use super::{
    I_TENANT_QUOTA, Q_AGENTS_ALL, Q_AGENTS_UNFINISHED, Q_CHANNEL, Q_EVENTS, Q_EVENTS_OF_AGENT,
    Q_LAST_EVENT_SEQ, Q_MESSAGES, Q_RUN, Q_RUNS, Q_STOPPING_OF, Q_SUPERVISORS_WITH_UNFINISHED,
    Q_TENANT_QUOTAS, Q_TENANT_RUNS, Q_TENANTS, SqliteStore, agent_at, append_events_tx,
    channel_from, collect, event_from, load_agent, message_from, parse_name, run_from,
};
use crate::contract::Admission;
use crate::contract::Records;
use crate::contract::Recovery;
use crate::contract::Runs;
use crate::contract::Transcripts;
use crate::types::Agent;
use crate::types::Channel;
use crate::types::EndItem;
use crate::types::Event;
use crate::types::Message;
use crate::types::NewAgent;
use crate::types::NewEvent;
use crate::types::Result;
use crate::types::Run;
use crate::types::RunEnd;
use crate::types::Spend;
use crate::{admission, records, runs};
use brood_core::AgentName;
use brood_core::Quotas;
use brood_core::RunId;
use brood_core::SessionName;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::TenantQuotas;
use brood_core::Terminal;

impl Admission for SqliteStore {
    fn admit(&self, new: &NewAgent, events: &[NewEvent]) -> Result<Agent> {
        self.admit_grouped(new, None, events)
    }

    fn admit_with_quotas(
        &self,
        new: &NewAgent,
        quotas: &Quotas,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.admit_grouped(new, Some(quotas), events)
    }

    fn tenant_quotas(&self, tenant: &TenantId) -> Result<TenantQuotas> {
        self.read(|conn| {
            let rows = collect(conn, Q_TENANT_QUOTAS, [tenant.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            Ok(admission::tenant_quotas(tenant, rows)?)
        })
    }

    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        admission::check_quota_key(tenant, key, value)?;
        self.write(|tx| {
            tx.prepare_cached(I_TENANT_QUOTA)?
                .execute((tenant.as_str(), key, i64::from(value)))?;
            Ok(())
        })
    }

    fn is_ancestor_or_self(
        &self,
        tenant: &TenantId,
        candidate: &AgentName,
        agent: &AgentName,
    ) -> Result<bool> {
        self.read(|conn| admission::is_ancestor_or_self(&On(conn), tenant, candidate, agent))
    }
}

impl Runs for SqliteStore {
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
        self.write(|tx| runs::start_run(&On(tx), tenant, name, run, pid, cgroup, now_ms, events))
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
        self.write(|tx| runs::set_status(&On(tx), tenant, name, to, detail, now_ms, events))
    }

    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        self.write(|tx| runs::mark_stopping(&On(tx), tenant, names, outcome, now_ms))
    }

    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| runs::end_run(&On(tx), tenant, name, run, end, events))
    }

    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        self.write(|tx| runs::end_runs(&On(tx), tenant, items))
    }

    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        self.write(|tx| runs::record_usage(&On(tx), tenant, run, tokens_in, tokens_out, cost_usd))
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
        self.write(|tx| runs::resume(&On(tx), tenant, name, run, supervisor, now_ms, None, events))
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
        self.write(|tx| runs::resume(&On(tx), tenant, name, run, supervisor, now_ms, q, events))
    }
}

impl Transcripts for SqliteStore {
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
        self.write(|tx| {
            records::append_message(&On(tx), tenant, agent, session, run, role, content, now_ms)
        })
    }

    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>> {
        self.write(|tx| append_events_tx(tx, tenant, events, now_ms))
    }

    fn messages(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
    ) -> Result<Vec<Message>> {
        self.read(|conn| {
            collect(
                conn,
                Q_MESSAGES,
                (tenant.as_str(), agent.as_str(), session.as_str()),
                message_from,
            )
        })
    }

    fn last_event_seq(&self, tenant: &TenantId) -> Result<i64> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(Q_LAST_EVENT_SEQ)?
                .query_row([tenant.as_str()], |r| r.get(0))?)
        })
    }

    fn events(
        &self,
        tenant: &TenantId,
        after: i64,
        agent: Option<&AgentName>,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.read(|conn| match agent {
            None => collect(
                conn,
                Q_EVENTS,
                (tenant.as_str(), after, i64::from(limit)),
                event_from,
            ),
            Some(a) => collect(
                conn,
                Q_EVENTS_OF_AGENT,
                (tenant.as_str(), after, i64::from(limit), a.as_str()),
                event_from,
            ),
        })
    }
}

impl Records for SqliteStore {
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>> {
        self.read(|conn| load_agent(conn, tenant, name))
    }

    fn run(&self, tenant: &TenantId, run: &RunId) -> Result<Option<Run>> {
        self.read(|conn| {
            Ok(
                collect(conn, Q_RUN, (tenant.as_str(), run.as_str()), run_from)?
                    .into_iter()
                    .next(),
            )
        })
    }

    fn runs(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Run>> {
        self.read(|conn| collect(conn, Q_RUNS, (tenant.as_str(), name.as_str()), run_from))
    }

    fn tenant_runs(&self, tenant: &TenantId) -> Result<Vec<Run>> {
        self.read(|conn| collect(conn, Q_TENANT_RUNS, [tenant.as_str()], run_from))
    }

    fn agents(&self, tenant: &TenantId, all: bool) -> Result<Vec<Agent>> {
        let sql = if all {
            Q_AGENTS_ALL
        } else {
            Q_AGENTS_UNFINISHED
        };
        self.read(|conn| collect(conn, sql, [tenant.as_str()], |r| agent_at(r, 0)))
    }

    fn children(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.read(|conn| records::children(&On(conn), tenant, name))
    }

    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.read(|conn| records::descendants_post_order(&On(conn), tenant, name))
    }

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Result<Option<Channel>> {
        self.read(|conn| {
            Ok(collect(
                conn,
                Q_CHANNEL,
                (tenant.as_str(), parent.as_str(), child.as_str()),
                channel_from,
            )?
            .into_iter()
            .next())
        })
    }

    fn spend(&self, tenant: &TenantId, name: &AgentName) -> Result<Spend> {
        self.read(|conn| records::spend(&On(conn), tenant, name))
    }
}

impl Recovery for SqliteStore {
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>> {
        self.read(|conn| records::unfinished_of(&On(conn), supervisors))
    }

    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_STOPPING_OF, [supervisor], |r| agent_at(r, 0)))
    }

    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.write(|tx| runs::recover(&On(tx), dead, false, now_ms))
    }

    fn recover_lost(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.write(|tx| runs::recover(&On(tx), dead, true, now_ms))
    }

    fn supervisors_with_unfinished(&self) -> Result<Vec<String>> {
        self.read(|conn| {
            collect(conn, Q_SUPERVISORS_WITH_UNFINISHED, [], |r| {
                Ok(r.get::<_, String>(0)?)
            })
        })
    }

    fn tenants(&self) -> Result<Vec<TenantId>> {
        self.read(|conn| {
            collect(conn, Q_TENANTS, [], |r| {
                parse_name("tenants.id", r.get(0)?, TenantId::new)
            })
        })
    }
}
