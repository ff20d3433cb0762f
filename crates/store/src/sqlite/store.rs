//! The store's contract implemented on SQLite, concern by concern (the
//! sweepers' part is in `sweeps`).

use super::{
    I_MESSAGE, I_TENANT_QUOTA, MAX_WALK_DEPTH, Q_AGENTS_ALL, Q_AGENTS_UNFINISHED,
    Q_ANCESTOR_OR_SELF, Q_CHANNEL, Q_CHILDREN, Q_DESCENDANTS, Q_EVENTS, Q_EVENTS_OF_AGENT,
    Q_LAST_EVENT_SEQ, Q_LAST_MESSAGE_SEQ, Q_MESSAGES, Q_OWN_USAGE, Q_RUN, Q_RUN_OF_AGENT, Q_RUNS,
    Q_STOPPING_OF, Q_SUBTREE_USAGE, Q_SUPERVISORS_WITH_UNFINISHED, Q_TENANT_QUOTAS, Q_TENANT_RUNS,
    Q_TENANTS, Q_UNFINISHED_OF, SqliteStore, U_RUN_STARTED, U_RUN_USAGE, U_STATUS, U_STATUS_DETAIL,
    agent_at, agent_exists, append_events_tx, channel_from, check_current_run, check_move, collect,
    corrupt, end_run_tx, event_from, load_agent, mark_stopping_tx, message_from, must_agent,
    not_found, parse_name, recover_tx, refused, resume_tx, run_from, to_sql_count, usage_row,
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
use crate::types::StoreError;
use brood_core::AgentName;
use brood_core::Code;
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
            let mut out = TenantQuotas::default();
            for (key, value) in rows {
                let shown = || format!("tenant {tenant}: {key} = {value}");
                let v =
                    u32::try_from(value).map_err(|_| corrupt("tenant_quotas.value", shown()))?;
                out.set(&key, v)
                    .map_err(|_| corrupt("tenant_quotas.key", shown()))?;
            }
            Ok(out)
        })
    }

    fn set_tenant_quota(&self, tenant: &TenantId, key: &str, value: u32) -> Result<()> {
        // The key is checked before the transaction, with the one list of keys
        // (brood-core's), so the refusal names it instead of quoting SQLite's CHECK.
        if let Err(e) = TenantQuotas::default().set(key, value) {
            return Err(StoreError::Refused {
                code: Code::BadRequest,
                message: format!("cannot set a quota of tenant {tenant}: {e}"),
            });
        }
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
        self.read(|conn| {
            let (met, found, level): (i64, bool, i64) =
                conn.prepare_cached(Q_ANCESTOR_OR_SELF)?.query_row(
                    (
                        tenant.as_str(),
                        candidate.as_str(),
                        agent.as_str(),
                        MAX_WALK_DEPTH,
                    ),
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?;
            if met == 0 {
                return Err(not_found(tenant, agent));
            }
            if found {
                return Ok(true);
            }
            // A real chain of parents ends at a root long before the guard; only
            // a loop climbs that far. Answering `false` would let a cycle through.
            if level >= MAX_WALK_DEPTH {
                return Err(corrupt(
                    "agents.parent",
                    format!(
                        "the parents above {tenant}/{agent} loop \
                         (the walk up reached level {level})"
                    ),
                ));
            }
            Ok(false)
        })
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
        self.write(|tx| {
            let agent = must_agent(tx, tenant, name)?;
            let to = check_move(&agent, Status::Running)?;
            check_current_run(&agent, run)?;
            tx.prepare_cached(U_STATUS)?.execute((
                tenant.as_str(),
                name.as_str(),
                to.encode(),
                now_ms,
            ))?;
            tx.prepare_cached(U_RUN_STARTED)?.execute((
                tenant.as_str(),
                run.as_str(),
                pid,
                cgroup,
                now_ms,
            ))?;
            append_events_tx(tx, tenant, events, now_ms)?;
            must_agent(tx, tenant, name)
        })
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
        self.write(|tx| {
            let agent = must_agent(tx, tenant, name)?;
            let to = check_move(&agent, to)?;
            // Legal moves that need more than a status write have their own
            // methods; doing them here would leave the run record behind.
            let other = match (agent.status, to) {
                (_, Status::Ended(_)) => Some("end_run (the run's record must end too)"),
                (_, Status::Queued) => Some("resume (a new run is needed)"),
                (Status::Queued, Status::Running) => {
                    Some("start_run (the run's pid and cgroup are needed)")
                }
                _ => None,
            };
            if let Some(method) = other {
                return Err(refused(
                    Code::BadRequest,
                    format!(
                        "agent {name}: {} -> {} goes through {method}, not set_status",
                        agent.status.encode(),
                        to.encode()
                    ),
                ));
            }
            tx.prepare_cached(U_STATUS_DETAIL)?.execute((
                tenant.as_str(),
                name.as_str(),
                to.encode(),
                detail,
                now_ms,
            ))?;
            append_events_tx(tx, tenant, events, now_ms)?;
            must_agent(tx, tenant, name)
        })
    }

    fn mark_stopping(
        &self,
        tenant: &TenantId,
        names: &[AgentName],
        outcome: Terminal,
        now_ms: i64,
    ) -> Result<Vec<Agent>> {
        self.write(|tx| mark_stopping_tx(tx, tenant, names, outcome, now_ms))
    }

    fn end_run(
        &self,
        tenant: &TenantId,
        name: &AgentName,
        run: &RunId,
        end: &RunEnd,
        events: &[NewEvent],
    ) -> Result<Agent> {
        self.write(|tx| end_run_tx(tx, tenant, name, run, end, events))
    }

    fn end_runs(&self, tenant: &TenantId, items: &[EndItem]) -> Result<Vec<Agent>> {
        self.write(|tx| {
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                match &it.end {
                    Some(end) => {
                        out.push(end_run_tx(tx, tenant, &it.name, &it.run, end, &it.events)?)
                    }
                    None => {
                        append_events_tx(tx, tenant, &it.events, it.now_ms)?;
                        out.push(must_agent(tx, tenant, &it.name)?);
                    }
                }
            }
            Ok(out)
        })
    }

    fn record_usage(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) -> Result<()> {
        self.write(|tx| {
            let changed = tx.prepare_cached(U_RUN_USAGE)?.execute((
                tenant.as_str(),
                run.as_str(),
                to_sql_count(tokens_in),
                to_sql_count(tokens_out),
                cost_usd,
            ))?;
            if changed == 0 {
                return Err(refused(
                    Code::NotFound,
                    format!("run {run} does not exist in tenant {tenant}"),
                ));
            }
            Ok(())
        })
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
        self.write(|tx| resume_tx(tx, tenant, name, run, supervisor, now_ms, None, events))
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
        self.write(|tx| {
            resume_tx(
                tx,
                tenant,
                name,
                run,
                supervisor,
                now_ms,
                Some(quotas),
                events,
            )
        })
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
            if !agent_exists(tx, tenant, agent)? {
                return Err(not_found(tenant, agent));
            }
            let ours: bool = tx
                .prepare_cached(Q_RUN_OF_AGENT)?
                .query_row((tenant.as_str(), agent.as_str(), run.as_str()), |r| {
                    r.get(0)
                })?;
            if !ours {
                return Err(refused(
                    Code::Conflict,
                    format!("run {run} is not a run of agent {agent} in tenant {tenant}"),
                ));
            }
            let seq = 1 + tx
                .prepare_cached(Q_LAST_MESSAGE_SEQ)?
                .query_row((tenant.as_str(), agent.as_str(), session.as_str()), |r| {
                    r.get::<_, i64>(0)
                })?;
            tx.prepare_cached(I_MESSAGE)?.execute((
                tenant.as_str(),
                agent.as_str(),
                session.as_str(),
                seq,
                run.as_str(),
                role,
                content,
                now_ms,
            ))?;
            Ok(Message {
                tenant: tenant.clone(),
                agent: agent.clone(),
                session: session.clone(),
                seq,
                run: run.clone(),
                role: role.to_owned(),
                content: content.to_owned(),
                ts_ms: now_ms,
            })
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
        self.read(|conn| {
            // An unknown agent is an error, not an empty family: a plan built on a
            // misspelt name must not look like "no children".
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            collect(conn, Q_CHILDREN, (tenant.as_str(), name.as_str()), |r| {
                agent_at(r, 0)
            })
        })
    }

    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        self.read(|conn| {
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            let mut stmt = conn.prepare_cached(Q_DESCENDANTS)?;
            let mut rows = stmt.query((tenant.as_str(), name.as_str(), MAX_WALK_DEPTH))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let found: String = row.get(0)?;
                let level: i64 = row.get(1)?;
                // A planning error changes nothing (SPEC 6 step 2): refuse the plan
                // rather than hand out an order that cannot be right.
                if level >= MAX_WALK_DEPTH || found == name.as_str() {
                    return Err(corrupt(
                        "edges",
                        format!(
                            "the edges under {tenant}/{name} have a cycle \
                             ({found} is reached again at level {level})"
                        ),
                    ));
                }
                if row.get::<_, Option<String>>(2)?.is_none() {
                    return Err(corrupt(
                        "edges",
                        format!("edge to {tenant}/{found}, which has no agent row"),
                    ));
                }
                out.push(agent_at(row, 2)?);
            }
            Ok(out)
        })
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
        self.read(|conn| {
            if !agent_exists(conn, tenant, name)? {
                return Err(not_found(tenant, name));
            }
            let own = conn
                .prepare_cached(Q_OWN_USAGE)?
                .query_row((tenant.as_str(), name.as_str()), usage_row)?;
            let subtree = conn
                .prepare_cached(Q_SUBTREE_USAGE)?
                .query_row((tenant.as_str(), name.as_str(), MAX_WALK_DEPTH), usage_row)?;
            Ok(Spend { own, subtree })
        })
    }
}

impl Recovery for SqliteStore {
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>> {
        self.read(|conn| {
            let mut out = Vec::new();
            for (i, s) in supervisors.iter().enumerate() {
                // A supervisor named twice is listed once.
                if supervisors[..i].contains(s) {
                    continue;
                }
                out.extend(collect(conn, Q_UNFINISHED_OF, [s.as_str()], |r| {
                    agent_at(r, 0)
                })?);
            }
            Ok(out)
        })
    }

    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>> {
        self.read(|conn| collect(conn, Q_STOPPING_OF, [supervisor], |r| agent_at(r, 0)))
    }

    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.write(|tx| recover_tx(tx, dead, false, now_ms))
    }

    fn recover_lost(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        self.write(|tx| recover_tx(tx, dead, true, now_ms))
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
