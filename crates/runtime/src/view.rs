//! Read-only views of the store: `ps`, `tree`, `show` as JSON.
//!
//! They read the store directly, so they work with or without a running
//! supervisor (SPEC 12: read-only commands fall back to the store), and the
//! supervisor's own answers are built by the same code.

use std::path::Path;
use std::sync::Arc;

use brood_core::{AgentName, TenantId};
use brood_store::prelude::*;
use brood_store::{Agent, SqliteStore, StoreError};
use serde_json::{Value, json};

use crate::api::{ApiError, ApiResult};
use crate::supervisor::{agent_json, internal, not_found, run_json};

#[derive(Clone)]
pub struct View {
    store: Arc<dyn Store>,
    tenant: TenantId,
}

impl View {
    pub fn new(store: Arc<dyn Store>, tenant: TenantId) -> View {
        View { store, tenant }
    }

    /// Opens a store read-only (a root's `brood.db`, or the file `--store`
    /// names), for the caller's own tenant.
    pub fn open(db: &Path) -> Result<View, StoreError> {
        let store = SqliteStore::open_read_only(db)?;
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        Ok(View::new(Arc::new(store), TenantId::for_uid(uid)))
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn agent(&self, name: &AgentName) -> Result<Agent, ApiError> {
        self.store
            .agent(&self.tenant, name)
            .map_err(internal)?
            .ok_or_else(|| not_found(name))
    }

    pub fn list(&self, parent: Option<AgentName>, all: bool) -> ApiResult {
        let agents = match &parent {
            Some(p) => self.store.children(&self.tenant, p),
            None => self.store.agents(&self.tenant, all),
        }
        .map_err(internal)?;
        let rows: Vec<Value> = agents
            .iter()
            .filter(|a| all || parent.is_none() || !a.status.is_finished())
            .map(|a| self.agent_json(a))
            .collect();
        Ok(json!({"agents": rows}))
    }

    pub fn show(&self, name: &AgentName) -> ApiResult {
        let a = self
            .store
            .agent(&self.tenant, name)
            .map_err(internal)?
            .ok_or_else(|| not_found(name))?;
        let mut v = self.agent_json(&a);
        // The effective policy and lifecycle recorded at admission (SPEC 5).
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        v["policy"] = spec.get("policy").cloned().unwrap_or(Value::Null);
        v["life"] = spec.get("life").cloned().unwrap_or_else(|| json!("owned"));
        v["iso"] = spec.get("iso").cloned().unwrap_or_else(|| json!("none"));
        v["allow_weaker_sandbox"] = spec
            .get("allow_weaker_sandbox")
            .cloned()
            .unwrap_or(json!(false));
        v["spend"] = self.spend_json(name)?;
        v["cost_limit"] = v["policy"]
            .get("cost_limit")
            .cloned()
            .unwrap_or(Value::Null);
        let runs = self.store.runs(&self.tenant, name).map_err(internal)?;
        v["runs"] = Value::Array(runs.iter().map(run_json).collect());
        Ok(v)
    }

    /// The tree under `name`, or every root's tree.
    pub fn tree(&self, name: Option<&AgentName>) -> ApiResult {
        let roots: Vec<Agent> = match name {
            Some(n) => vec![
                self.store
                    .agent(&self.tenant, n)
                    .map_err(internal)?
                    .ok_or_else(|| not_found(n))?,
            ],
            None => self
                .store
                .agents(&self.tenant, true)
                .map_err(internal)?
                .into_iter()
                .filter(|a| a.parent.is_none())
                .collect(),
        };
        let mut out = Vec::new();
        for r in roots {
            out.push(self.subtree_json(&r, 0)?);
        }
        Ok(json!({"trees": out}))
    }

    /// Own and subtree spend (SPEC 9), tokens and dollars: the per-child
    /// breakdown `tree` and `show` print.
    fn spend_json(&self, name: &AgentName) -> ApiResult {
        let s = self.store.spend(&self.tenant, name).map_err(internal)?;
        let u = |u: &brood_store::Usage| json!({"tokens_in": u.tokens_in, "tokens_out": u.tokens_out, "cost_usd": u.cost_usd});
        Ok(json!({"own": u(&s.own), "subtree": u(&s.subtree)}))
    }

    fn subtree_json(&self, a: &Agent, depth: usize) -> ApiResult {
        let mut v = self.agent_json(a);
        v["spend"] = self.spend_json(&a.name)?;
        let mut kids = Vec::new();
        if depth < 64 {
            for c in self
                .store
                .children(&self.tenant, &a.name)
                .map_err(internal)?
            {
                kids.push(self.subtree_json(&c, depth + 1)?);
            }
        }
        v["children"] = Value::Array(kids);
        Ok(v)
    }

    pub fn agent_json(&self, a: &Agent) -> Value {
        agent_json(&self.store, a)
    }
}
