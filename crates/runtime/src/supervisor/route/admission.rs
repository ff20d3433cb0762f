//! Routing for admission ([`crate::supervisor::admission`], its state in
//! [`crate::supervisor::admitting`]): the entry points the rest of the
//! supervisor calls to create agents, decide, record, answer or note a
//! refusal, each lending the part what it reads ([`Env`]) and doing, in
//! order, what belongs to another flow: where the agent runs
//! (`Dispatcher::place`), its secret values (`admitted_secrets`), a child
//! created in an earlier run (`created_before`), the live entry entered
//! and queued, the queue served (`pump_queue`), the caller answered.

use brood_core::policy::Policy;
use brood_core::{AgentName, SessionName};
use brood_store::Agent;
use serde_json::Value;

use crate::api::{ApiError, Caller, SpawnRequest, internal};
use crate::shown::agent_view;
use crate::supervisor::admission::{self, Decision, Env, Recorded, Spawn};
use crate::supervisor::admitting::{Admitted, Admitting};
use crate::supervisor::{Dispatcher, Reply, answer};

impl Dispatcher {
    /// What admission is lent: who this supervisor is, the records, the
    /// live set, the veil.
    fn admission_env(&self) -> Env<'_> {
        Env {
            host: &self.host,
            records: &self.records,
            agents: &self.agents,
            veil: self.launcher.veil.as_ref(),
        }
    }

    /// The quotas that apply to this supervisor's tenant now.
    pub(in crate::supervisor) fn tenant_quotas(
        &self,
    ) -> Result<brood_core::quota::Quotas, ApiError> {
        admission::tenant_quotas(&self.admission_env())
    }

    /// What a root holds (SPEC 5 defaults): everything the operator holds.
    pub(in crate::supervisor) fn operator_policy(&self) -> Policy {
        admission::operator_policy(&self.host)
    }

    /// An admitted agent's files in the ctx tree
    /// (`admission::project_admitted`).
    pub(in crate::supervisor) fn project_admitted(
        &self,
        agent: &Agent,
        policy: &Policy,
        spec: &Value,
        parent_session: Option<&SessionName>,
        uid: u32,
    ) {
        admission::project_admitted(
            agent,
            policy,
            spec,
            parent_session,
            uid,
            &self.admission_env(),
        );
    }

    /// What a refused creation leaves (`admission::note_refusal`).
    pub(in crate::supervisor) fn note_refusal(
        &self,
        parent: Option<&AgentName>,
        requested: Option<&str>,
        caller_trace: Option<&brood_otel::TraceContext>,
        e: &ApiError,
    ) {
        admission::note_refusal(parent, requested, caller_trace, e, &self.admission_env());
    }

    /// Everything admission decides before anything is written
    /// (`admission::check`), then where it runs and its secret values,
    /// then the record and events (`admission::decision`). Writes nothing.
    pub(in crate::supervisor) fn decide(
        &self,
        caller: &Caller,
        req: &SpawnRequest,
    ) -> Result<Decision, ApiError> {
        let env = self.admission_env();
        let checked = admission::check(caller, req, &env)?;
        // Another node runs it when its labels say so or its parent runs
        // there (placement); it is admitted here all the same.
        let host = match self.place(req.placement.as_ref(), checked.remote.as_ref())? {
            Some(node) => brood_store::placed_on(&node),
            None => self.host.me.clone(),
        };
        let secrets = self.agents.admitted_secrets(
            &self.host.me,
            &checked.policy,
            checked.parent.as_ref(),
            checked.remote.as_ref(),
            &host,
            req,
        )?;
        admission::decision(checked, host, secrets, caller, req, &env)
    }

    /// Admission (SPEC 5/9): decide ([`Self::decide`]: name, parent, lifecycle,
    /// policy, reserved paths, root, customer), then record (the store's
    /// transaction with the quotas, the projection, the queue for a slot).
    /// Returns the new agent's name and whether the caller waits for `ready`.
    pub(in crate::supervisor) fn admit(
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

    /// What follows a decided admission the store has recorded (`agent`,
    /// its transaction counted the quotas, so they hold under any
    /// concurrency): the projection, the live entry, the queue for a slot.
    /// The caller serves the queue ([`Self::pump_queue`]) before it
    /// answers, once for a batch, so a burst takes its slots in one call.
    pub(in crate::supervisor) fn record_admission(
        &mut self,
        d: Decision,
        req: SpawnRequest,
        agent: Agent,
    ) -> Result<Option<(AgentName, bool)>, ApiError> {
        match admission::record(d, req, agent, &self.admission_env()) {
            Recorded::Elsewhere { name, await_ready } => Ok(Some((name, await_ready))),
            Recorded::Here {
                name,
                parent,
                live,
                await_ready,
            } => {
                if let Some(pl) = parent.as_ref().and_then(|p| self.agents.live.get_mut(p)) {
                    pl.creates_used += 1;
                }
                self.agents.live.insert(name.clone(), live);
                self.launcher.waiting.push(name.clone());
                Ok(Some((name, await_ready)))
            }
        }
    }

    /// A creation taken alone (`Cmd::Spawn` while shutting down): admitted
    /// on the loop and answered.
    pub(in crate::supervisor) fn on_spawn(
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
            Err(e) => self.refuse(
                parent.as_ref(),
                requested.as_deref(),
                caller_trace.as_ref(),
                e,
                reply,
            ),
        }
    }

    /// The answer to an admitted creation's caller, now or when it is due.
    pub(in crate::supervisor) fn answer_spawn(
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

    /// Admits a batch (see [`admission::joins`]): decided one by one,
    /// recorded by the store together, followed up in arrival order. A
    /// user's roots go off the loop (`admitting`): recorded by the store's
    /// writer while the loop goes on, followed up when its answer comes
    /// ([`Self::on_admitted`]). A creation naming one in flight waits for it.
    pub(in crate::supervisor) fn on_spawns(&mut self, batch: Vec<Spawn>) {
        let mut decided = Vec::with_capacity(batch.len());
        let mut off_loop = Vec::new();
        for s in batch {
            if self.admitting.must_wait(&s) {
                self.admitting.defer(s);
                continue;
            }
            // A parent whose start is being recorded admits once it is
            // (`starts_writer`): its record says `queued` until then.
            if s.parent()
                .is_some_and(|p| self.starts_writer.flight.contains(p))
            {
                let Spawn { caller, req, reply } = s;
                self.starts_writer
                    .flight
                    .hold(crate::supervisor::Cmd::Spawn(caller, Box::new(req), reply));
                continue;
            }
            if self.agents.tool_granted(&s.caller, "create").is_ok()
                && let Some(child) = self.created_before(&s.caller, &s.req)
            {
                answer(s.reply, Ok(child));
                continue;
            }
            let d = self
                .agents
                .tool_granted(&s.caller, "create")
                .and_then(|()| self.decide(&s.caller, &s.req));
            match d {
                Ok(d) if Admitting::may_take(&s) => off_loop.push((s, d)),
                Ok(d) => decided.push((s, d)),
                Err(e) => self.refuse_spawn(s, e),
            }
        }
        if decided.is_empty() && off_loop.is_empty() {
            return;
        }
        // Roots go to the admission writer, which reads the tenant's
        // quotas itself, off the loop.
        if !off_loop.is_empty()
            && let Err((batch, e)) = self.admitting.hand_over(off_loop)
        {
            for (s, _) in batch {
                self.refuse_spawn(s, e.clone());
            }
        }
        if decided.is_empty() {
            return;
        }
        // The tenant's overrides, read once for the batch.
        let quotas = match self.tenant_quotas() {
            Ok(q) => q,
            Err(e) => {
                for (s, _) in decided {
                    self.refuse_spawn(s, e.clone());
                }
                return;
            }
        };
        self.launcher.max_concurrent = quotas.max_concurrent;
        tracing::debug!(n = decided.len(), "admitting creations together");
        let records: Vec<_> = decided
            .iter()
            .map(|(_, d)| (&d.new, d.events.as_slice()))
            .collect();
        let recorded = self.records.store.admit_all_with_quotas(&records, &quotas);
        self.follow_admissions(decided, recorded);
    }

    /// The writer's answer for a batch handed over: followed up as on the
    /// loop, then the creations that waited for it are decided again. While
    /// shutting down, what was admitted is stopped at once (the shutdown
    /// stopped every tree before it landed), and what waited is decided
    /// one at a time as any creation then is.
    pub(in crate::supervisor) fn on_admitted(&mut self, a: Admitted, shutting_down: bool) {
        let batch = self.admitting.landed(a.id);
        if let Some(m) = a.max_concurrent {
            self.launcher.max_concurrent = m;
        }
        let names: Vec<AgentName> = batch.iter().map(|(_, d)| d.new.name.clone()).collect();
        self.follow_admissions(batch, a.results);
        if shutting_down {
            for n in names {
                if self.agents.live.contains_key(&n) {
                    self.stop_subtree(
                        &n,
                        brood_core::Terminal::Cancelled(brood_core::CancelReason::User),
                    );
                }
            }
        }
        let waiting = self.admitting.take_deferred();
        if shutting_down {
            for s in waiting {
                self.on_spawn(s.caller, s.req, s.reply);
            }
        } else if !waiting.is_empty() {
            self.on_spawns(waiting);
        }
    }

    /// What follows admissions the store has answered: each recorded one
    /// projected, made live and queued, each caller answered, in order.
    fn follow_admissions(
        &mut self,
        decided: Vec<(Spawn, Decision)>,
        recorded: Vec<Result<Agent, brood_store::StoreError>>,
    ) {
        let mut recorded = recorded.into_iter();
        let mut answers = Vec::with_capacity(decided.len());
        for (s, d) in decided {
            let parent = s.parent().cloned();
            let requested = s.req.name.as_ref().map(|n| n.to_string());
            let caller_trace = s.req.traceparent;
            let r = match recorded.next() {
                Some(r) => r.map_err(internal),
                None => Err(ApiError::new(
                    brood_core::Code::Internal,
                    format!(
                        "the store gave no answer for the admission of {}",
                        d.new.name
                    ),
                )),
            };
            let rr = r.and_then(|agent| self.record_admission(d, s.req, agent));
            match rr {
                Ok(admitted) => answers.push((admitted, s.reply)),
                Err(e) => self.refuse(
                    parent.as_ref(),
                    requested.as_deref(),
                    caller_trace.as_ref(),
                    e,
                    s.reply,
                ),
            }
        }
        // The queue served once for the lot (its slots taken in one call),
        // then each caller answered as the launch left it.
        self.pump_queue();
        for (admitted, reply) in answers {
            self.answer_spawn(admitted, reply);
        }
    }

    /// A creation refused before anything was written.
    fn refuse_spawn(&mut self, s: Spawn, e: ApiError) {
        let requested = s.req.name.as_ref().map(|n| n.to_string());
        let parent = s.parent().cloned();
        self.refuse(
            parent.as_ref(),
            requested.as_deref(),
            s.req.traceparent.as_ref(),
            e,
            s.reply,
        );
    }

    /// A refusal noted (`note_refusal`), then answered.
    fn refuse(
        &self,
        parent: Option<&AgentName>,
        requested: Option<&str>,
        caller_trace: Option<&brood_otel::TraceContext>,
        e: ApiError,
        reply: Reply<brood_api::Agent>,
    ) {
        self.note_refusal(parent, requested, caller_trace, &e);
        answer(reply, Err(e));
    }
}
