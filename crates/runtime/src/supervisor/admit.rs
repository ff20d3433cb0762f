//! Admission (SPEC 5, 9): who may create what under whom. The request is read,
//! the child's effective policy derived from its parent's and checked (attenuation),
//! brood's machinery refused, the customer checked, and the store's admission
//! transaction counts the quotas; a refusal leaves an event in the would-be
//! parent's log and a count in `/metrics`.

use super::{
    Dispatcher, Live, Pending, Reply, answer, deadline_unix_s, ev, new_run_id, now_ms, now_unix_s,
    rand_u32, stored_policy,
};
use crate::api::ApiError;
use crate::api::Caller;
use crate::api::SpawnRequest;
use crate::api::internal;
use crate::api::not_found;
use crate::hosts::host_alive;
use crate::hosts::registered_nodes;
use crate::objects::project_agent;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::Iso;
use brood_core::Life;
use brood_core::ParentView;
use brood_core::RunId;
use brood_core::SessionName;
use brood_core::Status;
use brood_core::policy::Policy;
use brood_core::policy::PolicyRequest;
use brood_launch::cgroup::Group;
use brood_store::Agent;
use brood_store::NewAgent;
use brood_store::NewEvent;
use serde_json::Value;
use serde_json::json;
use std::path::PathBuf;

impl Dispatcher {
    /// The quotas that apply to this supervisor's tenant now.
    pub(super) fn tenant_quotas(&self) -> Result<brood_core::quota::Quotas, ApiError> {
        let own = self
            .records
            .store
            .tenant_quotas(&self.records.tenant)
            .map_err(internal)?;
        Ok(self.host.cfg.quotas.effective(Some(&own)))
    }

    /// A parent live on another supervisor sharing the store (SPEC 15: an agent
    /// runs on one supervisor, its children may run on another): it must be
    /// running or blocked, and its host alive. Anything else is the same
    /// `ParentMismatch` a parent with no live process here gets.
    pub(super) fn remote_parent(&self, p: &AgentName) -> Result<Agent, ApiError> {
        let a = self
            .records
            .store
            .agent(&self.records.tenant, p)
            .map_err(internal)?;
        match a {
            Some(a)
                if matches!(a.status, Status::Running | Status::Blocked)
                    && a.supervisor != self.host.me
                    && host_alive(
                        &a.supervisor,
                        &registered_nodes(self.records.store.as_ref()).map_err(internal)?,
                    ) =>
            {
                Ok(a)
            }
            _ => Err(ApiError::new(
                Code::ParentMismatch,
                format!("parent {p} has no live process here or on another live supervisor"),
            )),
        }
    }

    /// A remote parent's effective policy, budget left, creates used and
    /// deadline, read from the store (what its host keeps in memory).
    pub(super) fn remote_parent_view(
        &self,
        pa: &Agent,
    ) -> Result<(Policy, Option<f64>, u32, Option<u64>), ApiError> {
        let spec: Value = serde_json::from_str(&pa.spec).unwrap_or(Value::Null);
        let policy = stored_policy(&spec, &self.operator_policy())?;
        let children = self
            .records
            .store
            .children(&self.records.tenant, &pa.name)
            .map_err(internal)?;
        let run = self
            .records
            .store
            .run(&self.records.tenant, &pa.run)
            .map_err(internal)?;
        let creates_used = children
            .iter()
            .filter(|c| run.as_ref().is_some_and(|r| c.created_ms >= r.created_ms))
            .count() as u32;
        let budget = match policy.cost_limit {
            None => None,
            Some(limit) => {
                let spent = self
                    .records
                    .store
                    .spend(&self.records.tenant, &pa.name)
                    .map_err(internal)?;
                let mut held = 0.0;
                for c in children.iter().filter(|c| !c.status.is_finished()) {
                    let cspec: Value = serde_json::from_str(&c.spec).unwrap_or(Value::Null);
                    if let Some(cl) = cspec["policy"]["cost_limit"].as_f64() {
                        let cs = self
                            .records
                            .store
                            .spend(&self.records.tenant, &c.name)
                            .map_err(internal)?;
                        held += (cl - cs.subtree.cost_usd).max(0.0);
                    }
                }
                Some((limit - spent.subtree.cost_usd - held).max(0.0))
            }
        };
        let deadline = match (policy.timeout_s, run.and_then(|r| r.started_ms)) {
            (Some(t), Some(started)) => Some(deadline_unix_s(started, t)),
            _ => None,
        };
        Ok((policy, budget, creates_used, deadline))
    }

    /// What is left of a live agent's budget for a new child (SPEC 9): its limit,
    /// less what its subtree has spent, less what its live children with limits
    /// of their own have reserved and not yet spent. A child's unspent reservation
    /// returns when it ends, simply because it is no longer live here; what it did
    /// spend stays in `subtree_usd`. `None` when the agent has no limit.
    pub(super) fn budget_remaining(&self, name: &AgentName, l: &Live) -> Option<f64> {
        let limit = l.policy.cost_limit?;
        let held: f64 = self
            .agents
            .live
            .values()
            .filter(|c| c.parent.as_ref() == Some(name))
            .filter_map(|c| c.policy.cost_limit.map(|cl| (cl - c.subtree_usd).max(0.0)))
            .sum();
        Some((limit - l.subtree_usd - held).max(0.0))
    }

    /// What a root holds (SPEC 5 defaults): everything the operator holds.
    pub(super) fn operator_policy(&self) -> Policy {
        Policy::operator(self.host.uid, self.host.gid, self.host.groups.clone())
    }

    /// `policy` with the platform's `disk_max` where neither it nor an
    /// ancestor set one (issue 24 item 6): every agent's writes are bounded,
    /// and its children inherit the bound like any other limit. Filled in
    /// before the attenuation check, which a parent without one (recorded
    /// before there was a default) then passes.
    fn with_disk_default(&self, mut policy: Policy) -> Policy {
        if policy.resources.disk_max.is_none() {
            policy.resources.disk_max = Some(self.host.cfg.resource_defaults.disk_max);
        }
        policy
    }

    /// The effective policy of a new agent, or the refusal naming the first check
    /// it fails (SPEC 5's order). A root is checked against the operator, a child
    /// against its parent's effective policy and live state.
    pub(super) fn child_policy(
        &self,
        parent: Option<&AgentName>,
        remote: Option<&Agent>,
        req: &SpawnRequest,
    ) -> Result<Policy, ApiError> {
        let mut preq = match &req.policy {
            Some(v) => brood_proto::policy::from_value(v)
                .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?,
            None => PolicyRequest::default(),
        };
        // The spawn request's `env` is the policy's `env` given inline.
        if !req.env.is_empty() {
            let mut env = preq.env.take().unwrap_or_default();
            env.extend(req.env.iter().cloned());
            preq.env = Some(env);
        }
        // The names of the secret values it gives join the policy's secrets
        // (issue 25); where the values come from is `admitted_secrets`'s.
        if !req.secrets.is_empty() {
            let mut names = preq.secrets.take().unwrap_or_default();
            names.extend(req.secrets.names().map(str::to_owned));
            preq.secrets = Some(names);
        }
        if !req.env.is_empty() || !req.secrets.is_empty() {
            // Checked again as a whole: a name given both ways is refused.
            preq = preq
                .normalise()
                .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?;
        }
        let now = now_unix_s();
        if let Some(pa) = remote {
            // A parent hosted by another supervisor: its effective policy and live
            // state come from the store, where that supervisor recorded them.
            let (policy, budget_remaining, creates_used, deadline) = self.remote_parent_view(pa)?;
            let view = ParentView {
                policy: &policy,
                budget_remaining,
                creates_used,
                deadline_unix_s: deadline,
                now_unix_s: now,
            };
            let child = self.with_disk_default(brood_core::attenuation::derive(&view, &preq));
            brood_core::attenuation::check(&view, &child)
                .map_err(|r| ApiError::new(r.code, r.message))?;
            return Ok(child);
        }
        match parent.and_then(|p| self.agents.live.get(p).map(|l| (p, l))) {
            Some((p, l)) => {
                let view = ParentView {
                    policy: &l.policy,
                    budget_remaining: self.budget_remaining(p, l),
                    creates_used: l.creates_used,
                    deadline_unix_s: l.deadline_unix_s,
                    now_unix_s: now,
                };
                let child = self.with_disk_default(brood_core::attenuation::derive(&view, &preq));
                brood_core::attenuation::check(&view, &child)
                    .map_err(|r| ApiError::new(r.code, r.message))?;
                Ok(child)
            }
            None => {
                // The operator is the source of a root's environment, mount table,
                // tool tiers and rules: whatever it gives a root, it holds.
                let mut op = self.operator_policy();
                if let Some(env) = &preq.env {
                    op.env = env.clone();
                }
                if let Some(s) = &preq.secrets {
                    op.secrets = s.clone();
                }
                if let Some(m) = &preq.mounts {
                    op.mounts = m.clone();
                }
                if let Some(p) = &preq.path {
                    op.path = p.clone();
                }
                if let Some(r) = &preq.rules {
                    op.rules = r.clone();
                }
                // Resuming after a restart is the operator's to give a
                // root: a root is resumed by asking for it.
                if let Some(o) = preq.on_restart {
                    op.on_restart = o;
                }
                let view = ParentView {
                    policy: &op,
                    budget_remaining: None,
                    creates_used: 0,
                    deadline_unix_s: None,
                    now_unix_s: now,
                };
                let root = self.with_disk_default(brood_core::policy::effective(&op, &preq));
                brood_core::attenuation::check(&view, &root)
                    .map_err(|r| ApiError::new(r.code, r.message))?;
                Ok(root)
            }
        }
    }

    pub(super) fn on_spawn(
        &mut self,
        caller: Caller,
        req: SpawnRequest,
        reply: Reply<brood_api::Agent>,
    ) {
        let parent = match &caller {
            Caller::Agent(me) => Some(me.clone()),
            Caller::User { .. } => req.parent.clone(),
        };
        let requested = req.name.as_ref().map(|n| n.to_string());
        let caller_trace = req.traceparent;
        if self.agents.tool_granted(&caller, "create").is_ok()
            && let Some(child) = self.created_before(&caller, &req)
        {
            return answer(reply, Ok(child));
        }
        let admitted = self
            .agents
            .tool_granted(&caller, "create")
            .and_then(|()| self.admit(&caller, req));
        match admitted {
            Ok(admitted) => self.answer_spawn(admitted, reply),
            Err(e) => {
                self.note_refusal(
                    parent.as_ref(),
                    requested.as_deref(),
                    caller_trace.as_ref(),
                    &e,
                );
                answer(reply, Err(e));
            }
        }
    }

    /// The answer to an admitted creation's caller, now or when it is due.
    pub(super) fn answer_spawn(
        &mut self,
        admitted: Option<(AgentName, bool)>,
        reply: Reply<brood_api::Agent>,
    ) {
        let Some((name, await_ready)) = admitted else {
            return;
        };
        match self.agents.live.get_mut(&name) {
            // Launching, or (with `--ready`) waiting for a slot: the
            // launch answers (at `ready` for `--ready`).
            Some(l) if l.pending.is_none() || await_ready => {
                l.spawn_reply = Some((reply, await_ready))
            }
            // Placed on another node: that node tells when it is ready.
            None if await_ready => self.wait_ready_elsewhere(name, reply),
            // Waiting for a slot, or placed on another node: say so now
            // rather than hold the caller.
            _ => {
                let r = self
                    .records
                    .agent(&name)
                    .map(|a| agent_view(&self.records.store, &a));
                answer(reply, r);
            }
        }
    }

    /// A refused creation leaves nothing behind but this: an event in the would-be
    /// parent's `events.jsonl` (SPEC 5), when that parent exists, and its
    /// `create_agent` span, an error naming the code (issue 30): under the
    /// parent's run, or under the caller's span (`caller_trace`) for a root.
    pub(super) fn note_refusal(
        &self,
        parent: Option<&AgentName>,
        requested: Option<&str>,
        caller_trace: Option<&brood_otel::TraceContext>,
        e: &ApiError,
    ) {
        let quota = match e.code {
            Code::QuotaDepth => Some("max_depth"),
            Code::QuotaFanout => Some("max_fanout"),
            Code::QuotaTreeSize => Some("max_tree_size"),
            Code::CreateLimit => Some("create_limit"),
            Code::BudgetExceeded => Some("budget"),
            _ => None,
        };
        if let Some(q) = quota {
            self.host.metrics.quota_denial(q);
        }
        self.host.metrics.refusal(e.code);
        let refusal_span = |placed: crate::trace::Placed| {
            let s = crate::trace::create_span(
                placed,
                None,
                requested,
                &self.host.me,
                super::now_ms(),
                Some((e.code.as_str(), &e.message)),
            );
            self.host.tracer.emit(match parent {
                Some(p) => s.attr("brood.parent", p.to_string()),
                None => s,
            });
        };
        let Some(p) = parent else {
            tracing::info!(code = %e.code, message = %e.message, "root creation refused");
            if self.host.tracer.on() {
                refusal_span(crate::trace::Placed {
                    trace: caller_trace.map_or_else(brood_otel::random_trace_id, |c| c.trace),
                    parent: caller_trace.map(|c| c.span),
                });
            }
            return;
        };
        let Ok(Some(pa)) = self.records.store.agent(&self.records.tenant, p) else {
            return;
        };
        if self.host.tracer.on()
            && let Some(t) = crate::trace::Placed::of_agent(&pa)
        {
            // Under the caller's span when it is of the tree's trace, else
            // under the parent's run (a foreign one is what was refused).
            let placed = crate::trace::place(Some((t, &pa.run)), caller_trace, &pa.run)
                .or_else(|_| crate::trace::place(Some((t, &pa.run)), None, &pa.run));
            if let Ok(placed) = placed {
                refusal_span(placed);
            }
        }
        self.records.append_events(&[ev(
            p,
            Some(&pa.run),
            &pa.session,
            AgentEvent::ChildRefused {
                parent: p.clone(),
                child: requested.map(str::to_owned),
                code: e.code,
                message: e.message.clone(),
            },
        )]);
    }

    /// Admission (SPEC 5/9): decide ([`Self::decide`]: name, parent, lifecycle,
    /// policy, reserved paths, root, customer), then record (the store's
    /// transaction with the quotas, the projection, the queue for a slot).
    /// Returns the new agent's name and whether the caller waits for `ready`.
    pub(super) fn admit(
        &mut self,
        caller: &Caller,
        req: SpawnRequest,
    ) -> Result<Option<(AgentName, bool)>, ApiError> {
        let d = self.decide(caller, &req)?;
        // The tenant's overrides are read each time.
        let quotas = self.tenant_quotas()?;
        self.launcher.max_concurrent = quotas.max_concurrent;
        let agent = self
            .records
            .store
            .admit_with_quotas(&d.new, &quotas, &d.events)
            .map_err(internal)?;
        let admitted = self.record_admission(d, req, agent)?;
        self.pump_queue();
        Ok(admitted)
    }

    /// Everything admission decides before anything is written: who the
    /// parent is, the child's effective policy (attenuation), the refusals
    /// in SPEC 5's order, the record and the events to write. Reads the
    /// dispatcher's state and the store, writes nothing.
    pub(super) fn decide(&self, caller: &Caller, req: &SpawnRequest) -> Result<Decision, ApiError> {
        let parent = match (caller, &req.parent) {
            (Caller::Agent(me), None) => Some(me.clone()),
            (Caller::Agent(me), Some(p)) if p == me => Some(me.clone()),
            (Caller::Agent(me), Some(p)) => {
                return Err(ApiError::new(
                    Code::ParentMismatch,
                    format!(
                        "agent {me} asked to create a child of {p}; an agent creates only its own children"
                    ),
                ));
            }
            (Caller::User { .. }, p) => p.clone(),
        };
        let name = match req.name.clone() {
            Some(n) => n,
            None => AgentName::generate("agent", rand_u32()),
        };
        let mut remote: Option<Agent> = None;
        let parent_live = match &parent {
            Some(p) if !self.agents.live.contains_key(p) => {
                let a = self.remote_parent(p)?;
                let session = a.session.clone();
                remote = Some(a);
                Some((None, session))
            }
            Some(p) => {
                let l = self.agents.live.get(p).ok_or_else(|| {
                    ApiError::new(
                        Code::ParentMismatch,
                        format!("parent {p} has no live process here"),
                    )
                })?;
                if l.stopping.is_some() {
                    return Err(ApiError::new(
                        Code::ParentMismatch,
                        format!("parent {p} is stopping; it can admit no new child"),
                    ));
                }
                Some((l.group.clone(), l.session.clone()))
            }
            None => None,
        };
        // SPEC 5's order: name, parent (above), lifecycle, then the policy checks.
        if req.life == Life::Detached {
            return Err(ApiError::new(
                Code::UnsupportedLifecycle,
                "life \"detached\" needs a tenant grant; none grants it here",
            ));
        }
        let policy = self.child_policy(parent.as_ref(), remote.as_ref(), req)?;
        // Brood's own machinery is never granted, whoever asks (issue 11).
        if let Some(v) = &self.launcher.veil {
            v.check(&policy)
                .map_err(|m| ApiError::new(Code::ReservedPath, m))?;
        }
        if let Some(r) = &req.root {
            if req.iso != Iso::Ns {
                return Err(ApiError::new(Code::BadRequest, "root is only for iso = ns"));
            }
            // The new `/` must be something the agent may read at all.
            let p = brood_core::policy::AbsPath::new("root", r)
                .map_err(|e| ApiError::new(Code::BadRequest, e.to_string()))?;
            if policy.mode_at(&p) == brood_core::policy::Mode::Hidden {
                return Err(ApiError::new(
                    Code::FileExpansion,
                    format!("root {r} is hidden by the agent's policy"),
                ));
            }
        }
        if let Some(c) = &req.customer {
            // The tree first, so a refused customer's chain (another tree's
            // agents) is never walked nor named; its own customer is a cycle.
            if c != &name {
                self.check_customer_tree(parent.as_ref(), c)?;
            }
            self.check_customer(&name, c)?;
        }
        // Another node runs it when its labels say so or its parent runs
        // there (placement); it is admitted here all the same.
        let host = match self.place(req.placement.as_ref(), remote.as_ref())? {
            Some(node) => brood_store::placed_on(&node),
            None => self.host.me.clone(),
        };
        let secrets =
            self.admitted_secrets(&policy, parent.as_ref(), remote.as_ref(), &host, req)?;
        let run = new_run_id();
        // The parent's session and run at creation, and who asked: recorded so
        // the `parent` and `owner` files can always be rebuilt from the store.
        let (parent_session, parent_run) = match (&parent, &remote) {
            (Some(_), Some(pa)) => (Some(pa.session.to_string()), Some(pa.run.to_string())),
            (Some(p), None) => (
                self.agents.live.get(p).map(|l| l.session.to_string()),
                self.agents.live.get(p).map(|l| l.run.to_string()),
            ),
            (None, _) => (None, None),
        };
        let trace = self.place_in_trace(parent.as_ref(), remote.as_ref(), req, &run)?;
        let owner = match caller {
            Caller::Agent(me) => format!("agent:{me}"),
            Caller::User { uid } => format!("user:{uid}"),
        };
        let spec = json!({
            "argv": req.argv,
            "task": req.task,
            "cwd": req.cwd,
            "owner": owner,
            "label": req.label,
            "parent_session": parent_session,
            "parent_run": parent_run,
            "life": req.life.as_str(),
            "iso": req.iso.as_str(),
            "root": req.root,
            // Recorded with the agent, so `brood show` tells a weaker sandbox.
            "allow_weaker_sandbox": self.host.cfg.allow_weaker_sandbox,
            "policy": brood_proto::policy::to_json(&policy),
            // Kept so a lost node's queue is placed again by the same labels.
            "placement": req.placement,
            // A `--ready` spawn placed on another node: the node to tell
            // when it is ready (routed.rs), whichever node hosts it.
            "ready_news": (req.await_ready && host != self.host.me).then(|| self.host.me.clone()),
            // Its place in its tree's trace (issue 30, `crate::trace`).
            "trace": trace.to_json(),
        });
        let now = now_ms();
        let mut events = vec![ev(
            &name,
            Some(&run),
            &req.session,
            AgentEvent::Spawn {
                agent: name.clone(),
                parent: parent.clone(),
                run: run.clone(),
            },
        )];
        if let (Some(p), Some((_, psess))) = (&parent, &parent_live) {
            events.push(ev(
                p,
                None,
                psess,
                AgentEvent::ChildSpawn {
                    parent: p.clone(),
                    child: name.clone(),
                },
            ));
        }
        let new = NewAgent {
            tenant: self.records.tenant.clone(),
            name: name.clone(),
            parent: parent.clone(),
            customer: req.customer.clone(),
            session: req.session.clone(),
            protocol: req.protocol,
            spec: spec.to_string(),
            handoff: req.task.clone(),
            supervisor: host,
            run: run.clone(),
            now_ms: now,
        };
        Ok(Decision {
            parent_live,
            policy,
            secrets,
            spec,
            new,
            events,
        })
    }

    /// Where a new agent goes in the traces (`crate::trace::place`): under
    /// its parent's current run, read from the live entry or the record.
    fn place_in_trace(
        &self,
        parent: Option<&AgentName>,
        remote: Option<&Agent>,
        req: &SpawnRequest,
        run: &RunId,
    ) -> Result<crate::trace::Placed, ApiError> {
        let of_parent = match (parent, remote) {
            (Some(_), Some(pa)) => crate::trace::Placed::of_agent(pa).map(|t| (t, pa.run.clone())),
            (Some(p), None) => self.agents.live.get(p).and_then(|l| {
                let t = l.trace.or_else(|| {
                    let a = self.records.store.agent(&self.records.tenant, p).ok()??;
                    crate::trace::Placed::of_agent(&a)
                })?;
                Some((t, l.run.clone()))
            }),
            (None, _) => None,
        };
        crate::trace::place(
            of_parent.as_ref().map(|(t, r)| (*t, r)),
            req.traceparent.as_ref(),
            run,
        )
        .map_err(|m| ApiError::new(Code::BadRequest, m))
    }

    /// What follows a decided admission the store has recorded (`agent`,
    /// its transaction counted the quotas, so they hold under any
    /// concurrency): the projection, the live entry, the queue for a slot.
    /// The caller serves the queue ([`Self::pump_queue`]) before it
    /// answers, once for a batch, so a burst takes its slots in one call.
    pub(super) fn record_admission(
        &mut self,
        d: Decision,
        req: SpawnRequest,
        agent: Agent,
    ) -> Result<Option<(AgentName, bool)>, ApiError> {
        let Decision {
            parent_live,
            policy,
            secrets,
            spec,
            new,
            events,
        } = d;
        let (name, parent, run) = (new.name.clone(), new.parent.clone(), new.run.clone());
        self.records.project_events(&events);
        let trace = crate::trace::Placed::of_spec(&spec);
        if let Some(t) = trace
            && self.host.tracer.on()
        {
            let s = crate::trace::create_span(
                t,
                Some(&name),
                None,
                &self.host.me,
                agent.created_ms,
                None,
            );
            self.host
                .tracer
                .emit(crate::trace::admitted_attrs(s, &agent));
        }
        if brood_store::placed_for(&agent.supervisor).is_some() {
            // Admitted here for another node to run: that node claims it
            // (this write's news wakes it), projects it and starts it.
            return Ok(Some((name, req.await_ready)));
        }
        self.project_admitted(
            &agent,
            &policy,
            &spec,
            parent_live.as_ref().map(|(_, s)| s),
            policy.uid,
        );

        let group_parent = parent_live.as_ref().and_then(|(g, _)| g.clone());
        if let Some(pl) = parent.as_ref().and_then(|p| self.agents.live.get_mut(p)) {
            pl.creates_used += 1;
        }
        let parent_pair = parent.clone().zip(parent_live.map(|(_, s)| s));
        let mut live = Live::new(
            run.clone(),
            req.session.clone(),
            parent_pair,
            req.protocol,
            policy,
            None,
        );
        live.secrets = secrets;
        live.trace = trace;
        live.iso_ns = req.iso == Iso::Ns;
        live.ns_root = req.root.as_ref().map(PathBuf::from);
        live.pending = Some(Pending {
            admitted: Some(agent.clone()),
            argv: req.argv.clone(),
            cwd: req.cwd.clone(),
            group_parent,
        });
        self.agents.live.insert(name.clone(), Box::new(live));
        self.launcher.waiting.push(name.clone());
        Ok(Some((name, req.await_ready)))
    }

    /// An admitted agent's files in the ctx tree, from its record and spec:
    /// its session, control files, shim, log and `meta.json`, and its
    /// parent's channel to it (`agent`, `session`, `handoff.md`, `artifact/`
    /// owned by `uid`) when the parent's session is known.
    pub(super) fn project_admitted(
        &self,
        agent: &Agent,
        policy: &Policy,
        spec: &Value,
        parent_session: Option<&SessionName>,
        uid: u32,
    ) {
        let name = &agent.name;
        // The session and the parent's channel exist from admission on.
        let sdir = self.host.paths.session_dir(name, &agent.session);
        self.records.projection.mkdirs(sdir.join("context"));
        self.records
            .projection
            .write(sdir.join("created_at"), format!("{}\n", agent.created_ms));
        self.records
            .projection
            .append(sdir.join("messages.jsonl"), Vec::new());
        self.records
            .projection
            .append(sdir.join("events.jsonl"), Vec::new());
        // Empty until the agent sends a message of its own.
        self.records
            .projection
            .append(sdir.join("latest.md"), Vec::new());
        self.records.projection.write(
            sdir.join("cwd"),
            format!("{}\n", spec["cwd"].as_str().unwrap_or("")),
        );
        self.records
            .projection
            .write(sdir.join("meta.json"), crate::objects::session_meta(agent));
        let adir = self.host.paths.agent_dir(name);
        for (file, text) in crate::objects::control_files(agent, policy, spec) {
            self.records.projection.write(adir.join(file), text);
        }
        self.records
            .project_shim(self.host.cfg.bin_dir.as_deref(), name);
        self.records.projection.append(adir.join("log"), Vec::new());
        self.records.projection.write(
            adir.join("meta.json"),
            crate::objects::agent_meta(agent, None),
        );
        if let (Some(p), Some(psess)) = (&agent.parent, parent_session) {
            let cdir = self.host.paths.channel_dir(p, psess, name);
            self.records
                .projection
                .write(cdir.join("agent"), format!("{name}\n"));
            self.records
                .projection
                .write(cdir.join("session"), format!("{}\n", agent.session));
            self.records.projection.write(
                cdir.join("handoff.md"),
                spec["task"].as_str().unwrap_or("").to_owned(),
            );
            self.records
                .projection
                .artifact_dir(cdir.join("artifact"), uid);
        }
        project_agent(&self.records.projection, &self.host.paths, agent, None);
        self.records.project_channel(&self.agents, agent, None);
    }

    /// A customer lies in the new agent's own tree: the same root as its
    /// parent (issue 24). Without it an agent could name another tree's agent
    /// and have its child's result, whatever it says, delivered on that
    /// agent's stdin. A root has no tree yet, so it names no customer. A
    /// customer that does not exist is left to the store's admission.
    pub(super) fn check_customer_tree(
        &self,
        parent: Option<&AgentName>,
        customer: &AgentName,
    ) -> Result<(), ApiError> {
        let Some(p) = parent else {
            return Err(ApiError::new(
                Code::Forbidden,
                format!(
                    "customer {customer}: a root agent has no tree to name a customer in; \
                     a customer must lie in the new agent's own tree"
                ),
            ));
        };
        let Some(c) = self
            .records
            .store
            .agent(&self.records.tenant, customer)
            .map_err(internal)?
        else {
            return Ok(());
        };
        let root = match self
            .records
            .store
            .agent(&self.records.tenant, p)
            .map_err(internal)?
        {
            Some(pa) => pa.root,
            None => return Err(not_found(p)),
        };
        if c.root != root {
            return Err(ApiError::new(
                Code::Forbidden,
                format!(
                    "customer {customer} is outside the tree of the parent {p} (root {root}); \
                     a customer must lie in the new agent's own tree"
                ),
            ));
        }
        Ok(())
    }

    /// SPEC 9 cycles, for a customer: the new agent `name` naming `customer` must
    /// not close a loop of "who receives whose result". Walks the customer chain
    /// from `customer` (each agent's customer, or its parent when it has none);
    /// meeting `name` again, or any agent twice, is a `Cycle`. A customer that
    /// does not exist is left to the store's admission, which refuses it.
    pub(super) fn check_customer(
        &self,
        name: &AgentName,
        customer: &AgentName,
    ) -> Result<(), ApiError> {
        let mut chain = vec![customer.clone()];
        let mut cur = Some(customer.clone());
        while let Some(c) = cur {
            if &c == name {
                let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
                return Err(ApiError::new(
                    Code::Cycle,
                    format!(
                        "agent {name} cannot receive its own result: customer chain {name} -> {}",
                        path.join(" -> ")
                    ),
                ));
            }
            let Some(a) = self
                .records
                .store
                .agent(&self.records.tenant, &c)
                .map_err(internal)?
            else {
                return Ok(());
            };
            cur = a.customer.or(a.parent);
            if let Some(n) = &cur {
                if chain.contains(n) {
                    let path: Vec<&str> = chain.iter().map(AgentName::as_str).collect();
                    return Err(ApiError::new(
                        Code::Cycle,
                        format!("customer chain loops: {} -> {n}", path.join(" -> ")),
                    ));
                }
                chain.push(n.clone());
            }
            if chain.len() > 10_000 {
                return Err(ApiError::new(
                    Code::Cycle,
                    "customer chain longer than 10000",
                ));
            }
        }
        Ok(())
    }
}

/// What admission decided, ready to record.
pub(super) struct Decision {
    /// The parent's group (when it runs here) and session.
    parent_live: Option<(Option<Group>, SessionName)>,
    policy: Policy,
    /// The values of its policy's secrets (never recorded).
    secrets: brood_api::Secrets,
    spec: Value,
    /// The record to write: name, parent, run and time among it.
    pub(super) new: NewAgent,
    pub(super) events: Vec<NewEvent>,
}
