//! Read-only views of the store: agents, their details and trees, and the
//! seed's sessions, as `brood_api`'s types.
//!
//! They read the store directly, so they work with or without a running
//! supervisor (SPEC 12: read-only commands fall back to the store), and the
//! supervisor's own answers are built by the same code.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use brood_api as api;
use brood_core::{AgentName, Code, RunId, TenantId};
use brood_store::prelude::*;
use brood_store::{Agent, Node, Run, StoreError};
use serde_json::{Value, json};

use crate::api::ApiError;
use crate::api::{internal, not_found};
use crate::hosts::{host_alive, registered_nodes};
use crate::shown::{agent_view, agent_view_of, run_view};

/// Deeper than this, trees are cut (a tree is at most `max_depth` deep, 64 by
/// default; this only bounds the recursion).
const TREE_DEPTH: usize = 64;

#[derive(Clone)]
pub struct View {
    store: Arc<dyn Store>,
    tenant: TenantId,
    /// Set for a reader with no supervisor answering ([`View::open`]): each
    /// unfinished agent's supervisor is asked whether it still runs it,
    /// with the registered nodes read once, at the first need (`None`
    /// inside when they could not be read: then no supervisor is shown gone).
    hosts: Option<Arc<OnceLock<Option<Vec<Node>>>>>,
}

impl View {
    pub fn new(store: Arc<dyn Store>, tenant: TenantId) -> View {
        View {
            store,
            tenant,
            hosts: None,
        }
    }

    /// Opens a store read-only (a root's `brood.db`, or the file `--store`
    /// names), for the caller's own tenant.
    pub fn open(db: &Path) -> Result<View, StoreError> {
        let store = brood_store::open_read_only(&db.to_string_lossy())?;
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let mut v = View::new(store, TenantId::for_uid(uid));
        // No supervisor answered the reader: a record that says running may
        // be one whose supervisor died (issue 25: `brood ps` after a SIGKILL).
        v.hosts = Some(Arc::new(OnceLock::new()));
        Ok(v)
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

    /// The agents (live ones unless `all`), or `parent`'s children (live ones
    /// unless `all`), in start order.
    pub fn list(&self, parent: Option<AgentName>, all: bool) -> Result<api::AgentList, ApiError> {
        let agents = match &parent {
            Some(p) => {
                self.agent(p)?;
                self.store.children(&self.tenant, p)
            }
            None => self.store.agents(&self.tenant, all),
        }
        .map_err(internal)?;
        // Their runs in one read, not one an agent (a round trip each on
        // PostgreSQL); a run not among them (a resume began one since) is
        // read alone.
        let mut runs = self.current_runs(parent.as_ref(), all)?;
        let agents = agents
            .iter()
            .filter(|a| all || parent.is_none() || !a.status.is_finished())
            .map(|a| self.agent_view_with(a, &mut runs))
            .collect();
        Ok(api::AgentList { agents })
    }

    /// [`Records::current_runs`] by run id.
    fn current_runs(
        &self,
        parent: Option<&AgentName>,
        all: bool,
    ) -> Result<HashMap<RunId, Run>, ApiError> {
        Ok(self
            .store
            .current_runs(&self.tenant, parent, all)
            .map_err(internal)?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect())
    }

    /// Every descendant of `name`, parents before children, siblings in start order.
    pub fn descendants(&self, name: &AgentName) -> Result<api::AgentList, ApiError> {
        self.agent(name)?;
        let mut agents = Vec::new();
        self.pre_order(name, 0, &mut agents)?;
        Ok(api::AgentList { agents })
    }

    fn pre_order(
        &self,
        name: &AgentName,
        depth: usize,
        out: &mut Vec<api::Agent>,
    ) -> Result<(), ApiError> {
        if depth >= TREE_DEPTH {
            return Ok(());
        }
        let kids = self.store.children(&self.tenant, name).map_err(internal)?;
        let mut runs = self.current_runs(Some(name), true)?;
        for k in kids {
            out.push(self.agent_view_with(&k, &mut runs));
            self.pre_order(&k.name, depth + 1, out)?;
        }
        Ok(())
    }

    pub fn show(&self, name: &AgentName) -> Result<api::AgentDetail, ApiError> {
        let a = self.agent(name)?;
        // The effective policy and lifecycle recorded at admission (SPEC 5).
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let mut policy = spec.get("policy").cloned().unwrap_or(json!({}));
        // The names of `env` and `secrets`, never a value (issue 25).
        brood_proto::policy::hide_env(&mut policy);
        let word = |k: &str, default: &str| {
            spec.get(k)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let runs = self.store.runs(&self.tenant, name).map_err(internal)?;
        let on_restart = policy
            .get("on_restart")
            .and_then(Value::as_str)
            .unwrap_or("cancel")
            .to_owned();
        Ok(api::AgentDetail {
            agent: self.agent_view(&a),
            cost_limit: policy.get("cost_limit").and_then(Value::as_f64),
            policy,
            life: word("life", "owned"),
            iso: word("iso", "none"),
            allow_weaker_sandbox: spec
                .get("allow_weaker_sandbox")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            on_restart,
            spend: self.spend(name)?,
            runs: runs.iter().map(run_view).collect(),
        })
    }

    /// The tree under `name`, or every root's tree.
    pub fn tree(&self, name: Option<&AgentName>) -> Result<api::Trees, ApiError> {
        let mut trees = Vec::new();
        for r in self.roots(name)? {
            trees.push(self.subtree(&r, 0)?);
        }
        Ok(api::Trees { trees })
    }

    fn roots(&self, name: Option<&AgentName>) -> Result<Vec<Agent>, ApiError> {
        Ok(match name {
            Some(n) => vec![self.agent(n)?],
            None => self
                .store
                .agents(&self.tenant, true)
                .map_err(internal)?
                .into_iter()
                .filter(|a| a.parent.is_none())
                .collect(),
        })
    }

    /// Own and subtree spend (SPEC 9), tokens and dollars: the per-child
    /// breakdown `tree` and `show` print.
    fn spend(&self, name: &AgentName) -> Result<api::Spend, ApiError> {
        let s = self.store.spend(&self.tenant, name).map_err(internal)?;
        let u = |u: &brood_store::Usage| api::Usage {
            tokens_in: u.tokens_in,
            tokens_out: u.tokens_out,
            cost_usd: u.cost_usd,
        };
        Ok(api::Spend {
            own: u(&s.own),
            subtree: u(&s.subtree),
        })
    }

    fn subtree(&self, a: &Agent, depth: usize) -> Result<api::TreeNode, ApiError> {
        let mut children = Vec::new();
        if depth < TREE_DEPTH {
            for c in self
                .store
                .children(&self.tenant, &a.name)
                .map_err(internal)?
            {
                children.push(self.subtree(&c, depth + 1)?);
            }
        }
        Ok(api::TreeNode {
            agent: self.agent_view(a),
            spend: self.spend(&a.name)?,
            children,
        })
    }

    pub fn agent_view(&self, a: &Agent) -> api::Agent {
        self.shown(a, agent_view(&self.store, a))
    }

    /// [`Self::agent_view`] with its run taken from `runs` (read together
    /// for a listing), or read alone when it is not there.
    fn agent_view_with(&self, a: &Agent, runs: &mut HashMap<RunId, Run>) -> api::Agent {
        match runs.remove(&a.run) {
            Some(run) => self.shown(a, agent_view_of(a, Some(run))),
            None => self.agent_view(a),
        }
    }

    /// What the view adds to a record's rendering: whether its supervisor is gone.
    fn shown(&self, a: &Agent, mut v: api::Agent) -> api::Agent {
        if let Some(nodes) = &self.hosts
            && !a.status.is_finished()
            && let Some(nodes) = nodes.get_or_init(|| registered_nodes(&*self.store).ok())
            && !host_alive(&a.supervisor, nodes)
        {
            v.supervisor_gone = true;
            // The pid it had is shown only while such a process exists (an
            // agent may outlive a supervisor without a PID namespace).
            v.pid = v.pid.filter(|p| process_lives(*p));
        }
        v
    }

    // Sessions, as the seed's harness exposes them: one per agent, its id the
    // agent's name, its parent session the parent's.

    fn session_id(id: &str) -> Result<AgentName, ApiError> {
        AgentName::new(id)
            .map_err(|_| ApiError::new(Code::NotFound, format!("no session with id {id:?}")))
    }

    fn session_of(&self, id: &str) -> Result<Agent, ApiError> {
        let name = View::session_id(id)?;
        self.store
            .agent(&self.tenant, &name)
            .map_err(internal)?
            .ok_or_else(|| ApiError::new(Code::NotFound, format!("no session with id {id}")))
    }

    pub fn session(&self, id: &str) -> Result<api::Session, ApiError> {
        Ok(session_view(&self.session_of(id)?))
    }

    /// A session's children in start order; 404 for an unknown session.
    pub fn session_children(&self, id: &str) -> Result<api::SessionList, ApiError> {
        let a = self.session_of(id)?;
        let kids = self
            .store
            .children(&self.tenant, &a.name)
            .map_err(internal)?;
        Ok(api::SessionList {
            sessions: kids.iter().map(session_view).collect(),
        })
    }

    pub fn session_parent(&self, id: &str) -> Result<api::ParentReply, ApiError> {
        let a = self.session_of(id)?;
        let parent = match &a.parent {
            Some(p) => Some(session_view(&self.agent(p)?)),
            None => None,
        };
        Ok(api::ParentReply { parent })
    }

    /// Every root's session tree, or the one under `root`.
    pub fn session_tree(&self, root: Option<&AgentName>) -> Result<api::SessionTrees, ApiError> {
        let mut trees = Vec::new();
        for r in self.roots(root)? {
            trees.push(self.session_node(&r, 0)?);
        }
        Ok(api::SessionTrees { trees })
    }

    fn session_node(&self, a: &Agent, depth: usize) -> Result<api::SessionNode, ApiError> {
        let mut children = Vec::new();
        if depth < TREE_DEPTH {
            for c in self
                .store
                .children(&self.tenant, &a.name)
                .map_err(internal)?
            {
                children.push(self.session_node(&c, depth + 1)?);
            }
        }
        Ok(api::SessionNode {
            session: session_view(a),
            children,
        })
    }
}

fn session_view(a: &Agent) -> api::Session {
    api::Session {
        id: a.name.to_string(),
        agent: a.name.to_string(),
        session: a.session.to_string(),
        parent_session_id: a.parent.as_ref().map(|p| p.to_string()),
        status: a.status.api_word().to_owned(),
        reason: a.status.reason().map(str::to_owned),
        created_ms: a.created_ms,
        updated_ms: a.updated_ms,
    }
}

/// Whether process `pid` of this machine runs: it exists and is not a
/// zombie waiting to be reaped.
fn process_lives(pid: i64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state is the first field after the ")" that ends the command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}
