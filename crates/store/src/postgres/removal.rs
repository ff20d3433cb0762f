//! [`Removal`] on PostgreSQL: the shared removal (`crate::removal`) in one
//! transaction under the tenant's advisory lock, so a resume or an
//! admission on any node waits for it and then sees the tree whole or gone.

use brood_core::{AgentName, TenantId};
use tokio_postgres::types::ToSql;

use super::rows::{agent_from, channel_from, collect, narrow, parse_name};
use super::steps::{append_events_tx, load_agent};
use super::{Db, Fail, PgStore, Tx};
use crate::contract::Removal;
use crate::jobs::load_job;
use crate::removal::{Q_FINISHED_TREES, RemovalDb, remove_job, remove_subtree};
use crate::sqlite::sql::{Q_CHANNEL, Q_CHILDREN};
use crate::types::{Agent, Channel, FinishedTree, Job, NewEvent, Removed, RemovedJob, Result};

/// The shared removal's reads and writes on a transaction.
struct On<'a, 'd>(&'a Db<'d>);

fn params<'p>(values: &'p [&'p str]) -> Vec<&'p (dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

impl RemovalDb for On<'_, '_> {
    type Err = Fail;

    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Tx<Option<Agent>> {
        load_agent(self.0, tenant, name)
    }

    fn children(&self, tenant: &TenantId, name: &AgentName) -> Tx<Vec<Agent>> {
        collect(
            self.0,
            Q_CHILDREN,
            &[&tenant.as_str(), &name.as_str()],
            agent_from,
        )
    }

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Tx<Option<Channel>> {
        self.0
            .query_opt(
                Q_CHANNEL,
                &[&tenant.as_str(), &parent.as_str(), &child.as_str()],
            )?
            .map(|r| channel_from(&r))
            .transpose()
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Tx<Option<Job>> {
        load_job(self.0, tenant, id)
    }

    fn rows(&self, sql: &str, values: &[&str]) -> Tx<Vec<Vec<Option<String>>>> {
        let p = params(values);
        let mut out = Vec::new();
        for r in self.0.query(sql, &p)? {
            out.push(
                (0..r.len())
                    .map(|i| r.try_get::<_, Option<String>>(i))
                    .collect::<std::result::Result<Vec<_>, _>>()?,
            );
        }
        Ok(out)
    }

    fn exec(&self, sql: &str, values: &[&str]) -> Tx<u64> {
        let p = params(values);
        self.0.exec(sql, &p)
    }

    fn append_events(&self, tenant: &TenantId, events: &[NewEvent], now_ms: i64) -> Tx<()> {
        append_events_tx(self.0, tenant, events, now_ms).map(|_| ())
    }
}

impl Removal for PgStore {
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed> {
        self.write(tenant.as_str(), |db| remove_subtree(&On(db), tenant, top))
    }

    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>> {
        self.read(|db| {
            collect(
                db,
                Q_FINISHED_TREES,
                &[&tenant.as_str(), &ended_before_ms, &i64::from(limit)],
                |r| {
                    Ok(FinishedTree {
                        root: parse_name("agents.root", r.try_get(0)?, AgentName::new)?,
                        agents: narrow(r, 1, "the count of a tree's agents")?,
                        last_end_ms: r.try_get(2)?,
                    })
                },
            )
        })
    }

    fn remove_job(
        &self,
        tenant: &TenantId,
        id: &str,
        now_ms: i64,
        events: &[NewEvent],
    ) -> Result<RemovedJob> {
        self.write(tenant.as_str(), |db| {
            remove_job(&On(db), tenant, id, events, now_ms)
        })
    }
}
