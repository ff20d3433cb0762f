//! The verbs on live agents (SPEC 4, 11): send, wait, cancel, close, resume,
//! each authorised against the caller first.
//!
//! What a verb does here is lent [`Env`] (the records, who this supervisor
//! is, the live set, the waiters, the queue for a slot); what belongs to
//! other flows (an input routed to another node, a stop, another node told
//! of a close, the queue served) `route::verbs` does around it.

use super::agents::Agents;
use super::host::Host;
use super::queue::Queue;
use super::records::Records;
use super::waiters::Waiters;
use super::{Cmd, Live, Pending, Reply, answer, ev, new_run_id, now_ms, stored_policy};
use crate::api::ApiError;
use crate::api::Caller;
use crate::api::internal;
use crate::objects::project_agent;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Code;
use brood_core::Status;
use brood_proto::ToAgent;
use brood_store::Protocol;
use serde_json::Value;
use std::time::Duration;

/// What a verb reads and writes of the rest of the supervisor.
pub(super) struct Env<'a> {
    pub(super) records: &'a Records,
    pub(super) host: &'a Host,
    pub(super) agents: &'a mut Agents,
    pub(super) waiters: &'a mut Waiters,
    /// The queue for a slot, where a resumed run goes.
    pub(super) waiting: &'a mut Queue,
}

impl Env<'_> {
    /// An input for a live agent of this supervisor, recorded and written
    /// to its stdin.
    pub(super) fn deliver_input(
        &mut self,
        name: &AgentName,
        from: &str,
        text: &str,
    ) -> Result<brood_api::InputReply, ApiError> {
        let a = self.records.agent(name)?;
        let Some(l) = self.agents.live.get(name) else {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} is {}; it takes no input (resume it instead)",
                    a.status.api_word()
                ),
            ));
        };
        if l.protocol != Protocol::Brood || l.stopping.is_some() || l.stdin.is_none() {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} cannot take input now ({}, protocol {})",
                    a.status.api_word(),
                    l.protocol.as_str()
                ),
            ));
        }
        let from = from.to_owned();
        let run = l.run.clone();
        let session = l.session.clone();
        let m = self
            .records
            .store
            .append_message(
                &self.records.tenant,
                name,
                &session,
                &run,
                "user",
                text,
                now_ms(),
            )
            .map_err(internal)?;
        let id = format!("in-{}", m.seq);
        let dir = self.host.paths.session_dir(name, &session);
        self.records
            .projection
            .append(dir.join("messages.jsonl"), crate::objects::message_line(&m));
        self.records.append_events(&[ev(
            name,
            Some(&run),
            &session,
            AgentEvent::Input {
                agent: name.clone(),
                id: id.clone(),
                from: from.clone(),
            },
        )]);
        self.agents.to_agent(
            name,
            &ToAgent::Input {
                id: id.clone(),
                from,
                text: text.to_owned(),
            },
        );
        Ok(brood_api::InputReply { id, node: None })
    }

    pub(super) fn on_wait(
        &mut self,
        caller: &Caller,
        names: Vec<AgentName>,
        timeout: Option<Duration>,
        reply: Reply<brood_api::WaitReply>,
        id: u64,
    ) {
        if let Err(e) = self.agents.tool_granted(caller, "wait") {
            return answer(reply, Err(e));
        }
        for n in &names {
            match self
                .records
                .agent(n)
                .and_then(|a| self.records.authorize(caller, &a))
            {
                Ok(()) => {}
                Err(e) => return answer(reply, Err(e)),
            }
        }
        let all_done = names.iter().all(|n| {
            self.records
                .store
                .agent(&self.records.tenant, n)
                .ok()
                .flatten()
                .is_some_and(|a| a.status.is_finished())
                && !self.agents.live.contains_key(n)
        });
        if all_done {
            return answer(reply, self.wait_result(&names, false));
        }
        self.waiters.add(id, names, reply);
        if let Some(t) = timeout {
            let tx = self.host.tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(t).await;
                let _ = tx.send(Cmd::WaitTimeout(id));
            });
        }
    }

    pub(super) fn wait_result(
        &self,
        names: &[AgentName],
        timed_out: bool,
    ) -> Result<brood_api::WaitReply, ApiError> {
        let mut agents = Vec::new();
        for n in names {
            let a = self.records.agent(n)?;
            agents.push(agent_view(&self.records.store, &a));
        }
        Ok(brood_api::WaitReply { agents, timed_out })
    }

    /// Closes a finished agent: its record, event and object here; the
    /// record as closed (a closed one as it is, `Err` naming why not).
    pub(super) fn on_close(
        &mut self,
        caller: &Caller,
        name: &AgentName,
    ) -> Result<Closed, ApiError> {
        self.agents.tool_granted(caller, "close")?;
        let a = self.records.agent(name)?;
        self.records.authorize(caller, &a)?;
        let Status::Ended(t) = a.status else {
            if matches!(a.status, Status::Closed(_)) {
                return Ok(Closed::Already(Box::new(agent_view(
                    &self.records.store,
                    &a,
                ))));
            }
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} is {}; only a finished agent can be closed (cancel it first)",
                    a.status.api_word()
                ),
            ));
        };
        let ev1 = ev(
            name,
            Some(&a.run),
            &a.session,
            AgentEvent::Close {
                agent: name.clone(),
            },
        );
        let a = self
            .records
            .store
            .set_status(
                &self.records.tenant,
                name,
                Status::Closed(t),
                None,
                now_ms(),
                std::slice::from_ref(&ev1),
            )
            .map_err(internal)?;
        self.records.project_events(&[ev1]);
        project_agent(&self.records.projection, &self.host.paths, &a, None);
        Ok(Closed::Now(Box::new(a)))
    }

    /// A finished agent resumed (SPEC 4): checked, its new run recorded
    /// with its input, and (its parent running here, or a root) its live
    /// entry made and queued for a slot: `true`; `false` when it runs
    /// again on its parent's node, which claims it.
    pub(super) fn resume(
        &mut self,
        caller: &Caller,
        name: &AgentName,
        text: Option<String>,
        given: brood_api::Secrets,
    ) -> Result<bool, ApiError> {
        self.agents.tool_granted(caller, "resume")?;
        let a = self.records.agent(name)?;
        // SPEC 9: a resume that would make the requester its own ancestor.
        if let Caller::Agent(me) = caller
            && self
                .records
                .store
                .is_ancestor_or_self(&self.records.tenant, name, me)
                .map_err(internal)?
        {
            return Err(ApiError::new(
                Code::Cycle,
                format!("agent {me} cannot resume {name}: it is {me} or one of its ancestors"),
            ));
        }
        self.records.authorize(caller, &a)?;
        if !a.status.is_finished() {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {name} is {}; only a finished agent can be resumed",
                    a.status.api_word()
                ),
            ));
        }
        // A child runs again on its parent's node: here, or (in a
        // cluster) the node that runs the parent, which claims it.
        let mut placed: Option<String> = None;
        let parent_live = match &a.parent {
            Some(p) => match self.agents.live.get(p).filter(|l| l.stopping.is_none()) {
                Some(l) => Some((l.group.clone(), l.session.clone())),
                None => {
                    let pa = crate::supervisor::admission::remote_parent(p, &self.admission())
                        .ok()
                        .filter(|_| self.host.cfg.node.is_some())
                        .ok_or_else(|| {
                            ApiError::new(Code::ParentMismatch, format!("parent {p} of {name} is not running; an owned child cannot outlive its parent"))
                        })?;
                    let host = brood_store::placed_for(&pa.supervisor).unwrap_or(&pa.supervisor);
                    placed = Some(brood_store::placed_on(host));
                    None
                }
            },
            None => None,
        };
        // The policy is the one admitted; the secrets' values are given
        // again (a root) or the parent's (a child), checked before
        // anything is recorded.
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let policy = stored_policy(
            &spec,
            &crate::supervisor::admission::operator_policy(self.host),
        )?;
        let secrets = self.agents.resumed_secrets(&a, &policy, &given)?;
        let run = new_run_id();
        let events = [ev(
            name,
            Some(&run),
            &a.session,
            AgentEvent::Resume {
                agent: name.clone(),
                run: run.clone(),
            },
        )];
        let quotas = crate::supervisor::admission::tenant_quotas(&self.admission())?;
        let a = self
            .records
            .store
            .resume_within(
                &self.records.tenant,
                name,
                &run,
                placed.as_ref().unwrap_or(&self.host.me),
                now_ms(),
                &quotas,
                &events,
            )
            .map_err(internal)?;
        self.records.project_events(&events);
        if let Some(t) = &text {
            let m = self
                .records
                .store
                .append_message(
                    &self.records.tenant,
                    name,
                    &a.session,
                    &run,
                    "user",
                    t,
                    now_ms(),
                )
                .map_err(internal)?;
            self.records.projection.append(
                self.host
                    .paths
                    .session_dir(name, &a.session)
                    .join("messages.jsonl"),
                crate::objects::message_line(&m),
            );
        }
        if placed.is_some() {
            // Its parent's node claims it (this write's news wakes it)
            // and starts the new run with the input just recorded.
            return Ok(false);
        }
        project_agent(&self.records.projection, &self.host.paths, &a, None);
        let (argv, cwd) = super::cluster::stored_launch(&spec);
        // A `temp` agent's object was removed when its last run ended.
        let adir = self.host.paths.agent_dir(name);
        for (file, text) in crate::objects::control_files(&a, &policy, &spec) {
            self.records.projection.write(adir.join(file), text);
        }
        self.records
            .project_shim(self.host.cfg.bin_dir.as_deref(), name);
        let parent_pair = a
            .parent
            .clone()
            .zip(parent_live.as_ref().map(|(_, s)| s.clone()));
        // The record as the resume left it: its run is the new one.
        let mut live = Live::of_record(&a, &spec, parent_pair, policy, text.clone());
        live.secrets = secrets;
        // Its budget covers what it and its subtree spent in earlier runs too.
        live.subtree_usd = self
            .records
            .store
            .spend(&self.records.tenant, name)
            .map(|s| s.subtree.cost_usd)
            .map_err(internal)?;
        let group_parent = parent_live.and_then(|(g, _)| g);
        live.pending = Some(Pending {
            argv,
            cwd,
            group_parent,
            admitted: None,
        });
        self.agents.live.insert(name.clone(), Box::new(live));
        self.waiting.push(name.clone());
        Ok(true)
    }

    /// What admission's reads of the tenant and a parent elsewhere are
    /// lent (neither reads the veil).
    fn admission(&self) -> crate::supervisor::admission::Env<'_> {
        crate::supervisor::admission::Env {
            host: self.host,
            records: self.records,
            agents: self.agents,
            veil: None,
        }
    }
}

/// What a close did.
pub(super) enum Closed {
    /// It was closed already: as it is.
    Already(Box<brood_api::Agent>),
    /// Closed now: its record as written.
    Now(Box<brood_store::Agent>),
}
