//! PostgreSQL: Transcripts, Records, Recovery, Idempotency (being ported from the SQLite store).

#![allow(unused_variables)]

use super::PgStore;
use crate::contract::*;
use crate::types::*;
use brood_core::{AgentName, Quotas, RunId, SessionName, Status, TenantId, TenantQuotas, Terminal};

fn pending(what: &str) -> StoreError {
    StoreError::PostgresSetup {
        target: String::new(),
        message: format!("{what}: not ported yet"),
    }
}

impl Transcripts for PgStore {
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
    ) -> Result<Message> {
        Err(pending("append_message"))
    }
    #[allow(clippy::too_many_arguments)]
    fn append_events(
        &self,
        tenant: &TenantId,
        events: &[NewEvent],
        now_ms: i64,
    ) -> Result<Vec<Event>> {
        Err(pending("append_events"))
    }
    #[allow(clippy::too_many_arguments)]
    fn messages(
        &self,
        tenant: &TenantId,
        agent: &AgentName,
        session: &SessionName,
    ) -> Result<Vec<Message>> {
        Err(pending("messages"))
    }
    #[allow(clippy::too_many_arguments)]
    fn events(
        &self,
        tenant: &TenantId,
        after: i64,
        agent: Option<&AgentName>,
        limit: u32,
    ) -> Result<Vec<Event>> {
        Err(pending("events"))
    }
    #[allow(clippy::too_many_arguments)]
    fn last_event_seq(&self, tenant: &TenantId) -> Result<i64> {
        Err(pending("last_event_seq"))
    }
}

impl Records for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Agent>> {
        Err(pending("agent"))
    }
    #[allow(clippy::too_many_arguments)]
    fn run(&self, tenant: &TenantId, run: &RunId) -> Result<Option<Run>> {
        Err(pending("run"))
    }
    #[allow(clippy::too_many_arguments)]
    fn runs(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Run>> {
        Err(pending("runs"))
    }
    #[allow(clippy::too_many_arguments)]
    fn agents(&self, tenant: &TenantId, all: bool) -> Result<Vec<Agent>> {
        Err(pending("agents"))
    }
    #[allow(clippy::too_many_arguments)]
    fn children(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        Err(pending("children"))
    }
    #[allow(clippy::too_many_arguments)]
    fn descendants_post_order(&self, tenant: &TenantId, name: &AgentName) -> Result<Vec<Agent>> {
        Err(pending("descendants_post_order"))
    }
    #[allow(clippy::too_many_arguments)]
    fn channel(
        &self,
        tenant: &TenantId,
        parent: &AgentName,
        child: &AgentName,
    ) -> Result<Option<Channel>> {
        Err(pending("channel"))
    }
    #[allow(clippy::too_many_arguments)]
    fn spend(&self, tenant: &TenantId, name: &AgentName) -> Result<Spend> {
        Err(pending("spend"))
    }
}

impl Recovery for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn unfinished_of(&self, supervisors: &[String]) -> Result<Vec<Agent>> {
        Err(pending("unfinished_of"))
    }
    #[allow(clippy::too_many_arguments)]
    fn stopping_of(&self, supervisor: &str) -> Result<Vec<Agent>> {
        Err(pending("stopping_of"))
    }
    #[allow(clippy::too_many_arguments)]
    fn recover(&self, dead: &[String], now_ms: i64) -> Result<Vec<Agent>> {
        Err(pending("recover"))
    }
    #[allow(clippy::too_many_arguments)]
    fn supervisors_with_unfinished(&self) -> Result<Vec<String>> {
        Err(pending("supervisors_with_unfinished"))
    }
    #[allow(clippy::too_many_arguments)]
    fn tenants(&self) -> Result<Vec<TenantId>> {
        Err(pending("tenants"))
    }
}

impl Idempotency for PgStore {
    #[allow(clippy::too_many_arguments)]
    fn idempotent_reply(
        &self,
        tenant: &TenantId,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<IdempotentReply>> {
        Err(pending("idempotent_reply"))
    }
    #[allow(clippy::too_many_arguments)]
    fn keep_idempotent_reply(
        &self,
        reply: &IdempotentReply,
        now_ms: i64,
    ) -> Result<IdempotentReply> {
        Err(pending("keep_idempotent_reply"))
    }
}
