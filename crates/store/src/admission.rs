//! Admission's decisions (SPEC 5, 9), written once for both stores: the
//! refusals in their fixed order (the parent, the name, the customer, the
//! quotas, `create_limit`, the budget, the events' agents) and the agent an
//! admission records, over [`AdmitFacts`], what the store knows when it
//! decides. SQLite decides each admission on the transaction as it goes
//! ([`Live`]); PostgreSQL decides a group on what it read for the whole
//! group at once, plus what the group admitted before (`postgres::admit`).
//! How the admitted rows are written is each store's own.
//!
//! Also here, the rest of the `Admission` contract that is logic rather
//! than plumbing: a tenant's quota rows read back, the key of a quota to
//! set, and the walk up the parents.

use std::borrow::Cow;

use brood_core::{AgentName, Code, Quotas, Status, TenantId, TenantQuotas};

use crate::checks::refused;
use crate::checks::{check_events, check_json_object};
use crate::db::{Db, MAX_WALK_DEPTH, Value, not_found};
use crate::types::{Agent, NewAgent, NewEvent, StoreError};

// A subtree's spend: the walk of the descendants (edges' primary key, level
// guard), then every run of each agent met, plus its own. The types are
// spelt out for PostgreSQL, which does not infer a column's type from the
// recursive term and sums BIGINTs as NUMERIC; SQLite reads the casts as the
// integers and text they already are.
pub(crate) const Q_SUBTREE_USAGE: &str = concat!(
    "WITH RECURSIVE walk(name, level) AS (",
    " SELECT CAST(?2 AS TEXT), CAST(0 AS BIGINT)",
    " UNION",
    " SELECT edges.child, walk.level + 1 FROM walk CROSS JOIN edges",
    "  WHERE edges.tenant = ?1 AND edges.parent = walk.name AND walk.level < ?3",
    "),",
    " plan(name) AS (SELECT DISTINCT name FROM walk)",
    " SELECT CAST(COALESCE(SUM(runs.tokens_in), 0) AS BIGINT),",
    "  CAST(COALESCE(SUM(runs.tokens_out), 0) AS BIGINT),",
    "  COALESCE(SUM(runs.cost_usd), 0.0)",
    " FROM plan CROSS JOIN runs WHERE runs.tenant = ?1 AND runs.agent = plan.name"
);

/// What an admission is decided on. Every count is as the store would hold
/// it had each admission before this one been written alone.
pub(crate) trait AdmitFacts {
    type Err: From<StoreError>;
    /// The agent `name` (the parent), if it exists.
    fn agent(
        &self,
        tenant: &TenantId,
        name: &AgentName,
    ) -> Result<Option<Cow<'_, Agent>>, Self::Err>;
    fn exists(&self, tenant: &TenantId, name: &AgentName) -> Result<bool, Self::Err>;
    /// `p`'s unfinished children.
    fn fanout(&self, p: &Agent) -> Result<i64, Self::Err>;
    /// The agents of `p`'s tree, every one ever created, the root included.
    fn tree_size(&self, p: &Agent) -> Result<i64, Self::Err>;
    /// The children `p`'s current run has created.
    fn created_in_run(&self, p: &Agent) -> Result<i64, Self::Err>;
    /// What `p`'s unfinished children reserve of its budget: each one's
    /// `cost_limit` less what its subtree has spent.
    fn held(&self, p: &Agent) -> Result<f64, Self::Err>;
    /// What `name`'s subtree has spent.
    fn subtree_cost(&self, tenant: &TenantId, name: &AgentName) -> Result<f64, Self::Err>;
}

/// The facts of a store that decides inside its transaction as it goes
/// (SQLite): every fact is a read on that transaction, which sees the
/// admissions before it and holds the write lock to the commit.
pub(crate) struct Live<'a, D>(pub &'a D);

impl<D: Db> AdmitFacts for Live<'_, D> {
    type Err = D::Err;

    fn agent(&self, tenant: &TenantId, name: &AgentName) -> Result<Option<Cow<'_, Agent>>, D::Err> {
        Ok(self.0.agent(tenant, name)?.map(Cow::Owned))
    }

    fn exists(&self, tenant: &TenantId, name: &AgentName) -> Result<bool, D::Err> {
        self.0.exists(tenant, name)
    }

    fn fanout(&self, p: &Agent) -> Result<i64, D::Err> {
        fanout(self.0, &p.tenant, &p.name)
    }

    fn tree_size(&self, p: &Agent) -> Result<i64, D::Err> {
        self.0.int(
            D::SQL.tree_size,
            &[Value::from(p.tenant.as_str()), Value::from(p.root.as_str())],
        )
    }

    fn created_in_run(&self, p: &Agent) -> Result<i64, D::Err> {
        created_in_run(self.0, p)
    }

    fn held(&self, p: &Agent) -> Result<f64, D::Err> {
        held(self.0, p)
    }

    fn subtree_cost(&self, tenant: &TenantId, name: &AgentName) -> Result<f64, D::Err> {
        subtree_cost(self.0, tenant, name.as_str())
    }
}

/// A parent's unfinished children, read on `db`.
pub(crate) fn fanout<D: Db>(db: &D, tenant: &TenantId, parent: &AgentName) -> Result<i64, D::Err> {
    db.int(
        D::SQL.fanout,
        &[Value::from(tenant.as_str()), Value::from(parent.as_str())],
    )
}

/// The children `p`'s current run has created (read through
/// `agents_by_parent`, from the run's creation on), read on `db`.
pub(crate) fn created_in_run<D: Db>(db: &D, p: &Agent) -> Result<i64, D::Err> {
    let since = db.int(D::SQL.run_created, &[Value::from(p.run.as_str())])?;
    db.int(
        D::SQL.created_since,
        &[
            Value::from(p.tenant.as_str()),
            Value::from(p.name.as_str()),
            Value::from(since),
        ],
    )
}

/// What a subtree has spent, read on `db`.
pub(crate) fn subtree_cost<D: Db>(db: &D, tenant: &TenantId, name: &str) -> Result<f64, D::Err> {
    Ok(db
        .usage(
            Q_SUBTREE_USAGE,
            &[
                Value::from(tenant.as_str()),
                Value::from(name),
                Value::from(MAX_WALK_DEPTH),
            ],
        )?
        .cost_usd)
}

/// What `p`'s unfinished children with a `cost_limit` hold of its budget,
/// read on `db`.
pub(crate) fn held<D: Db>(db: &D, p: &Agent) -> Result<f64, D::Err> {
    let kids = db.pairs(
        D::SQL.unfinished_children_specs,
        &[Value::from(p.tenant.as_str()), Value::from(p.name.as_str())],
    )?;
    let mut held = 0.0;
    for (kid, spec) in kids {
        if let Some(cl) = cost_limit_of(&spec) {
            held += (cl - subtree_cost(db, &p.tenant, &kid)?).max(0.0);
        }
    }
    Ok(held)
}

/// An admission decided: the agent it records, and its parent as the
/// decision found it (whose session the parent's channel names).
pub(crate) struct Admitted<'f> {
    pub agent: Agent,
    pub parent: Option<Cow<'f, Agent>>,
}

/// One admission's verdict on `facts`, with the quota checks when `quotas`
/// is given (`admit_with_quotas`) and without them (`admit`), so the two
/// never disagree on anything but the quotas. The refusals come in a fixed
/// order, so a request wrong in several ways always gets the same answer.
/// What it would record, when admitted; nothing is written here.
pub(crate) fn decide<'f, F: AdmitFacts>(
    facts: &'f F,
    new: &NewAgent,
    quotas: Option<&Quotas>,
    events: &[NewEvent],
) -> Result<Admitted<'f>, F::Err> {
    let t = &new.tenant;
    check_json_object(|| format!("spec of agent {}", new.name), &new.spec, false)?;
    let parent = match &new.parent {
        None => None,
        Some(p) => {
            let Some(pa) = facts.agent(t, p)? else {
                return Err(refused(
                    Code::ParentMismatch,
                    format!("parent {p} does not exist in tenant {t}"),
                )
                .into());
            };
            // A stopping parent is live but dying: a child admitted now would be
            // missed by the cascade already planned (SPEC 6 step 1).
            if !pa.status.is_live() || matches!(pa.status, Status::Stopping(_)) {
                return Err(refused(
                    Code::ParentMismatch,
                    format!(
                        "parent {p} is {}: children are admitted only under a running or blocked parent",
                        pa.status.encode()
                    ),
                )
                .into());
            }
            Some(pa)
        }
    };
    if facts.exists(t, &new.name)? {
        return Err(refused(
            Code::NameTaken,
            format!("agent name {} is taken in tenant {t}", new.name),
        )
        .into());
    }
    if let Some(c) = &new.customer
        && !facts.exists(t, c)?
    {
        return Err(refused(
            Code::ParentMismatch,
            format!("customer {c} does not exist in tenant {t}"),
        )
        .into());
    }
    if let Some(q) = quotas {
        check_quotas(facts, new, parent.as_deref(), q)?;
    }
    check_events(events)?;
    // Events name the new agent or its parent (known to exist by now); any
    // other must exist too. The foreign key would refuse it as well, with a
    // message that names nothing.
    for e in events {
        if e.agent != new.name
            && Some(&e.agent) != new.parent.as_ref()
            && !facts.exists(t, &e.agent)?
        {
            return Err(not_found(t, &e.agent).into());
        }
    }
    let (root, depth) = match &parent {
        Some(p) => (p.root.clone(), p.depth + 1),
        None => (new.name.clone(), 0),
    };
    let agent = Agent {
        tenant: t.clone(),
        name: new.name.clone(),
        parent: new.parent.clone(),
        customer: new.customer.clone(),
        root,
        depth,
        session: new.session.clone(),
        protocol: new.protocol,
        spec: new.spec.clone(),
        status: Status::Queued,
        detail: None,
        run: new.run.clone(),
        supervisor: new.supervisor.clone(),
        created_ms: new.now_ms,
        updated_ms: new.now_ms,
    };
    Ok(Admitted { agent, parent })
}

/// The quota checks of SPEC 9, in the order documented on
/// `Store::admit_with_quotas`: depth, fanout, tree size, then
/// `create_limit` and the budget. A count is read only when its check is
/// reached.
fn check_quotas<F: AdmitFacts>(
    facts: &F,
    new: &NewAgent,
    parent: Option<&Agent>,
    q: &Quotas,
) -> Result<(), F::Err> {
    let t = &new.tenant;
    let name = &new.name;
    let Some(p) = parent else {
        // A root starts its own tree: depth 0 and no siblings, so only the tree
        // size applies, and its tree would hold just the root.
        if q.max_tree_size == 0 {
            return Err(refused(
                Code::QuotaTreeSize,
                format!(
                    "tree size quota: root {name} would start a tree of 1 agent \
                     in tenant {t}, and max_tree_size is 0"
                ),
            )
            .into());
        }
        return Ok(());
    };
    let depth = u64::from(p.depth) + 1;
    if depth > u64::from(q.max_depth) {
        return Err(refused(
            Code::QuotaDepth,
            format!(
                "depth quota: {name} would be at depth {depth} under {} (depth {}) \
                 in tenant {t}, and max_depth is {}",
                p.name, p.depth, q.max_depth
            ),
        )
        .into());
    }
    let fanout = facts.fanout(p)?;
    if fanout >= i64::from(q.max_fanout) {
        return Err(refused(
            Code::QuotaFanout,
            format!(
                "fanout quota: parent {} in tenant {t} already has {fanout} unfinished \
                 children, and max_fanout is {}",
                p.name, q.max_fanout
            ),
        )
        .into());
    }
    let size = facts.tree_size(p)?;
    if size >= i64::from(q.max_tree_size) {
        return Err(refused(
            Code::QuotaTreeSize,
            format!(
                "tree size quota: the tree of root {} in tenant {t} already holds {size} \
                 agents (every one ever created under it, finished or not, the root \
                 included), and max_tree_size is {}",
                p.root, q.max_tree_size
            ),
        )
        .into());
    }
    check_create_limit(facts, p)?;
    check_budget(facts, new, p)
}

/// The `policy.create_limit` recorded in a spec, if any.
fn create_limit_of(spec: &str) -> Option<u64> {
    // Most specs name no limit: skip the parse then.
    if !spec.contains("\"create_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("create_limit")?
        .as_u64()
}

/// The `policy.cost_limit` recorded in a spec, if any.
pub(crate) fn cost_limit_of(spec: &str) -> Option<f64> {
    if !spec.contains("\"cost_limit\"") {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()?
        .get("policy")?
        .get("cost_limit")?
        .as_f64()
}

/// SPEC 5's `create_limit`, inside the admission transaction: the children the
/// parent's current run has created so far must be fewer than its limit. The
/// supervisor checks the same from memory first; this makes it exact when
/// supervisors sharing the store admit children of one parent at once.
fn check_create_limit<F: AdmitFacts>(facts: &F, p: &Agent) -> Result<(), F::Err> {
    let Some(limit) = create_limit_of(&p.spec) else {
        return Ok(());
    };
    let used = facts.created_in_run(p)?;
    // A count is never negative; were it, it would be below any limit.
    if u64::try_from(used).is_ok_and(|u| u >= limit) {
        return Err(refused(
            Code::CreateLimit,
            format!(
                "create_limit: the parent {} has already created {used} of its {limit} children \
                 in this run (counted in the store, across every supervisor)",
                p.name
            ),
        )
        .into());
    }
    Ok(())
}

/// The budget of SPEC 9, inside the admission transaction: a child naming a
/// `cost_limit` reserves it from what its parent has left — the parent's limit,
/// less its subtree's spend, less what its unfinished children with limits have
/// reserved and not spent. The supervisor checks the same from memory first;
/// this makes it exact when supervisors sharing the store admit children of one
/// parent at once.
fn check_budget<F: AdmitFacts>(facts: &F, new: &NewAgent, p: &Agent) -> Result<(), F::Err> {
    let (Some(want), Some(limit)) = (cost_limit_of(&new.spec), cost_limit_of(&p.spec)) else {
        return Ok(());
    };
    let spent = facts.subtree_cost(&p.tenant, &p.name)?;
    let held = facts.held(p)?;
    let left = (limit - spent - held).max(0.0);
    if want > left + 1e-9 {
        return Err(refused(
            Code::BudgetExceeded,
            format!(
                "cost_limit: {want} is more than the parent's remaining budget {left} \
                 ({} has {limit}, its subtree spent {spent}, its live children hold {held})",
                p.name
            ),
        )
        .into());
    }
    Ok(())
}

/// A tenant's quota overrides from their rows (key, value).
pub(crate) fn tenant_quotas(
    tenant: &TenantId,
    rows: impl IntoIterator<Item = (String, i64)>,
) -> Result<TenantQuotas, StoreError> {
    let mut out = TenantQuotas::default();
    for (key, value) in rows {
        let corrupt = |what| StoreError::Corrupt {
            what,
            value: format!("tenant {tenant}: {key} = {value}"),
        };
        let v = u32::try_from(value).map_err(|_| corrupt("tenant_quotas.value"))?;
        out.set(&key, v).map_err(|_| corrupt("tenant_quotas.key"))?;
    }
    Ok(out)
}

/// Refuses a quota key not in the one list of keys (brood-core's), before
/// any transaction, so the refusal names it instead of quoting the
/// schema's CHECK.
pub(crate) fn check_quota_key(tenant: &TenantId, key: &str, value: u32) -> Result<(), StoreError> {
    TenantQuotas::default().set(key, value).map_err(|e| {
        refused(
            Code::BadRequest,
            format!("cannot set a quota of tenant {tenant}: {e}"),
        )
    })
}

/// `Admission::is_ancestor_or_self`, read on `db`.
pub(crate) fn is_ancestor_or_self<D: Db>(
    db: &D,
    tenant: &TenantId,
    candidate: &AgentName,
    agent: &AgentName,
) -> Result<bool, D::Err> {
    let [met, found, level] = db.ints(
        D::SQL.ancestor_or_self,
        &[
            Value::from(tenant.as_str()),
            Value::from(candidate.as_str()),
            Value::from(agent.as_str()),
            Value::from(MAX_WALK_DEPTH),
        ],
    )?;
    if met == 0 {
        return Err(not_found(tenant, agent).into());
    }
    if found != 0 {
        return Ok(true);
    }
    // A real chain of parents ends at a root long before the guard; only
    // a loop climbs that far. Answering `false` would let a cycle through.
    if level >= MAX_WALK_DEPTH {
        return Err(StoreError::Corrupt {
            what: "agents.parent",
            value: format!(
                "the parents above {tenant}/{agent} loop \
                 (the walk up reached level {level})"
            ),
        }
        .into());
    }
    Ok(false)
}
