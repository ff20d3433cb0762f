//! [`Removal`] on SQLite: the shared removal (`crate::removal`) inside one
//! `BEGIN IMMEDIATE` transaction, so a resume or an admission on another
//! connection waits for it and then sees the tree whole or gone.

use brood_core::{AgentName, TenantId};
use rusqlite::{Connection, Transaction};

use super::rows::{agent_at, channel_from, collect, parse_name};
use super::sql::{Q_CHANNEL, Q_CHILDREN};
use super::steps::{append_events_tx, load_agent};
use super::{Fail, SqliteStore, Tx};
use crate::contract::Removal;
use crate::jobs::load_job;
use crate::removal::{Q_FINISHED_TREES, RemovalDb, remove_job, remove_subtree};
use crate::types::{Agent, Channel, FinishedTree, Job, NewEvent, Removed, RemovedJob, Result};

/// The shared removal's reads and writes on a transaction.
struct On<'a, 'c>(&'a Transaction<'c>);

impl On<'_, '_> {
    fn conn(&self) -> &Connection {
        self.0
    }
}

impl RemovalDb for On<'_, '_> {
    type Err = Fail;

    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Tx<Option<Agent>> {
        load_agent(self.conn(), tenant, name)
    }

    fn children(&self, tenant: &TenantId, name: &AgentName) -> Tx<Vec<Agent>> {
        collect(
            self.conn(),
            Q_CHILDREN,
            (tenant.as_str(), name.as_str()),
            |r| agent_at(r, 0),
        )
    }

    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Tx<Option<Channel>> {
        Ok(collect(
            self.conn(),
            Q_CHANNEL,
            (tenant.as_str(), parent.as_str(), child.as_str()),
            channel_from,
        )?
        .into_iter()
        .next())
    }

    fn job(&self, tenant: &TenantId, id: &str) -> Tx<Option<Job>> {
        load_job(self.conn(), tenant, id)
    }

    fn rows(&self, sql: &str, params: &[&str]) -> Tx<Vec<Vec<Option<String>>>> {
        let mut stmt = self.conn().prepare_cached(sql)?;
        let n = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(params.iter()))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(
                (0..n)
                    .map(|i| r.get::<_, Option<String>>(i))
                    .collect::<rusqlite::Result<Vec<_>>>()?,
            );
        }
        Ok(out)
    }

    fn exec(&self, sql: &str, params: &[&str]) -> Tx<u64> {
        let n = self
            .conn()
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(params.iter()))?;
        Ok(n as u64)
    }

    fn append_events(&self, tenant: &TenantId, events: &[NewEvent], now_ms: i64) -> Tx<()> {
        append_events_tx(self.0, tenant, events, now_ms).map(|_| ())
    }
}

impl Removal for SqliteStore {
    fn remove_tree(&self, tenant: &TenantId, top: &AgentName) -> Result<Removed> {
        self.write(|tx| remove_subtree(&On(tx), tenant, top))
    }

    fn finished_trees(
        &self,
        tenant: &TenantId,
        ended_before_ms: i64,
        limit: u32,
    ) -> Result<Vec<FinishedTree>> {
        self.read(|conn| {
            collect(
                conn,
                Q_FINISHED_TREES,
                (tenant.as_str(), ended_before_ms, limit),
                |r| {
                    Ok(FinishedTree {
                        root: parse_name("agents.root", r.get(0)?, AgentName::new)?,
                        agents: r.get(1)?,
                        last_end_ms: r.get(2)?,
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
        self.write(|tx| remove_job(&On(tx), tenant, id, events, now_ms))
    }
}
