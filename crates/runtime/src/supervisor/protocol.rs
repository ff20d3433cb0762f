//! What an agent's process says (SPEC 7): protocol messages, usage and budgets,
//! status changes, stderr, and its exit, which ends the run (or waits for the
//! collection of its result).

use super::{
    AgentEv, Cmd, Dispatcher, EXEC_OUT_MAX, STDERR_TAIL, answer, ev, exit_code, handle, now_ms,
    outcome_of,
};
use crate::api::Caller;
use crate::objects::project_agent;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::FailReason;
use brood_core::RunId;
use brood_core::SessionName;
use brood_core::Status;
use brood_core::Terminal;
use brood_proto::FromAgent;
use serde_json::json;

impl Dispatcher {
    /// New spend of `delta` dollars by `name`: it rolls up through every live
    /// ancestor, and the highest agent whose subtree reached its `cost_limit`
    /// is stopped with `budget_exceeded`, its subtree with it (SPEC 9). Returns
    /// whom it stopped.
    pub(super) fn add_spend(&mut self, name: &AgentName, delta: f64) -> Option<AgentName> {
        if delta <= 0.0 || !delta.is_finite() {
            return None;
        }
        let mut over: Option<AgentName> = None;
        let mut cur = Some(name.clone());
        let mut hops = 0;
        while let Some(n) = cur {
            let Some(l) = self.agents.live.get_mut(&n) else {
                break;
            };
            l.subtree_usd += delta;
            if let Some(limit) = l.policy.cost_limit
                && l.subtree_usd >= limit
                && l.stopping.is_none()
            {
                over = Some(n.clone());
            }
            cur = l.parent.clone();
            hops += 1;
            if hops > 10_000 {
                break;
            }
        }
        let top = over?;
        self.stop_for_budget(&top);
        Some(top)
    }

    /// Stops `top` with `budget_exceeded` and its subtree with it.
    pub(super) fn stop_for_budget(&mut self, top: &AgentName) {
        let top = top.clone();
        let spent = self
            .agents
            .live
            .get(&top)
            .map(|l| l.subtree_usd)
            .unwrap_or_default();
        let limit = self
            .agents
            .live
            .get(&top)
            .and_then(|l| l.policy.cost_limit)
            .unwrap_or_default();
        tracing::info!(agent = %top, spent, limit, "budget exceeded; stopping the subtree");
        if let Some(l) = self.agents.live.get_mut(&top) {
            l.budget_note = Some(format!(
                "budget exceeded: the subtree spent ${spent:.4} of its cost_limit ${limit:.4}"
            ));
        }
        self.stop_subtree(&top, Terminal::Failed(FailReason::BudgetExceeded));
    }

    pub(super) fn on_agent(&mut self, name: AgentName, run: RunId, e: AgentEv) {
        let Some(l) = self.agents.live.get_mut(&name) else {
            return;
        };
        if l.run != run {
            return;
        }
        match e {
            AgentEv::Msg(m) => self.on_msg(&name, &run, m),
            AgentEv::Unknown(t) => {
                tracing::info!(agent = %name, r#type = %t, "unknown protocol message type ignored");
                let session = l.session.clone();
                self.records.append_events(&[ev(
                    &name,
                    Some(&run),
                    &session,
                    AgentEvent::ProtocolUnknown {
                        agent: name.clone(),
                        message_type: t,
                    },
                )]);
            }
            AgentEv::Bad(err) => {
                if l.protocol_error.is_some() || l.stopping.is_some() {
                    return;
                }
                l.protocol_error = Some(err.to_string());
                let session = l.session.clone();
                tracing::warn!(agent = %name, error = %err, "protocol error");
                self.records.append_events(&[ev(
                    &name,
                    Some(&run),
                    &session,
                    AgentEvent::ProtocolError {
                        agent: name.clone(),
                        line: Some(err.line),
                        error: err.to_string(),
                    },
                )]);
                self.stop_subtree(&name, Terminal::Failed(FailReason::ProtocolError));
            }
            AgentEv::ExecOut(b) => {
                let room = EXEC_OUT_MAX.saturating_sub(l.exec_out.len());
                l.exec_out.extend_from_slice(&b[..b.len().min(room)]);
            }
            AgentEv::Stderr(s) => {
                l.stderr_tail.push_str(&s);
                if l.stderr_tail.len() > STDERR_TAIL {
                    let mut cut = l.stderr_tail.len() - STDERR_TAIL;
                    while !l.stderr_tail.is_char_boundary(cut) {
                        cut += 1;
                    }
                    l.stderr_tail.drain(..cut);
                }
                let line =
                    json!({"ts": now_ms(), "run": run.as_str(), "stream": "stderr", "text": s});
                self.records.projection.append(
                    self.host.paths.agent_dir(&name).join("log"),
                    format!("{line}\n"),
                );
            }
            AgentEv::Exited { status } => {
                l.exit = Some(status);
                l.stdin = None;
                // Its run is over: nothing more of it reaches a model.
                l.gateway = None;
                if l.stopping.is_some() {
                    // The stop in flight records the outcome, in post-order.
                    return;
                }
                let (outcome, result, mut detail) = outcome_of(l, status);
                // A file past RLIMIT_FSIZE: the kernel's SIGXFSZ, for the
                // policy's disk_max (issue 24).
                if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGXFSZ {
                    let w = format!(
                        "killed by SIGXFSZ: a file it wrote reached the policy's disk_max ({} bytes)",
                        crate::enforce::file_size_max(
                            &l.policy,
                            self.host.cfg.resource_defaults.disk_max
                        )
                    );
                    detail = Some(match detail {
                        Some(d) => format!("{w}; {d}"),
                        None => w,
                    });
                }
                // A kill by the kernel for a limit of the policy says which limit
                // (read before the group is removed).
                if libc::WIFSIGNALED(status)
                    && let (Some(cg), Some(g)) = (&self.launcher.cgroups, &l.group)
                {
                    let why = if cg.oom_killed(g) {
                        Some(format!(
                            "killed by the OOM killer: the policy's memory_max ({} bytes) was reached",
                            l.policy.resources.memory_max.unwrap_or_default()
                        ))
                    } else {
                        None
                    };
                    if let Some(w) = why {
                        detail = Some(match detail {
                            Some(d) => format!("{w}; {d}"),
                            None => w,
                        });
                    }
                }
                let code = exit_code(status);
                if result.is_some() {
                    // What it handed back is checked and kept off the dispatcher
                    // (hashes, copies); the end is recorded when that comes back.
                    self.harvest(name, run, outcome, code, result, detail);
                } else {
                    self.finish(&name, outcome, code, result, detail, None);
                }
            }
        }
    }

    pub(super) fn on_msg(&mut self, name: &AgentName, run: &RunId, m: FromAgent) {
        let Some(l) = self.agents.live.get_mut(name) else {
            return;
        };
        let session = l.session.clone();
        match m {
            FromAgent::Ready => {
                l.ready = true;
                let reply = l.spawn_reply.take();
                let news = l.ready_news.take();
                self.tell_ready(name, news);
                self.sock_ready(name);
                if let Some((reply, true)) = reply {
                    let r = self
                        .records
                        .agent(name)
                        .map(|a| agent_view(&self.records.store, &a));
                    answer(reply, r);
                }
            }
            FromAgent::Chunk { delta } => {
                // Kept until the turn's whole message: a child that only
                // streams (the seed's sub-agent protocol) has its words
                // recorded at its `done` or the end of its turn.
                if l.unsaid.len() + delta.len() <= MAX_UNSAID {
                    l.unsaid.push_str(&delta);
                }
                self.sockets.chunk(name, run, &delta)
            }
            FromAgent::Pong | FromAgent::Unknown => {}
            FromAgent::Message { role, content } => {
                if crate::objects::is_agent_message(&role) {
                    // The whole message the chunks were streaming.
                    l.unsaid.clear();
                    l.said_this_turn = true;
                }
                self.record_message(name, run, &session, &role, content);
            }
            FromAgent::Usage {
                tokens_in,
                tokens_out,
                cost_usd,
            } => self.on_usage(name, run, tokens_in, tokens_out, cost_usd),
            FromAgent::Status { status, reason } => {
                let to = match status.as_str() {
                    "blocked" => Status::Blocked,
                    "running" => Status::Running,
                    _ => return,
                };
                let event = ev(
                    name,
                    Some(run),
                    &session,
                    AgentEvent::Status {
                        agent: name.clone(),
                        status: status.clone(),
                        reason: reason.clone(),
                    },
                );
                if to == Status::Blocked {
                    // The turn is over: what it streamed without a message is
                    // its message.
                    self.say_unsaid(name, run, &session, None);
                }
                match self.records.store.set_status(
                    &self.records.tenant,
                    name,
                    to,
                    reason.as_deref(),
                    now_ms(),
                    &[event],
                ) {
                    Ok(a) => project_agent(
                        &self.records.projection,
                        &self.host.paths,
                        &a,
                        self.agents.live.get(name).and_then(|l| l.pid),
                    ),
                    Err(e) => tracing::info!(agent = %name, error = %e, "status change ignored"),
                }
                // A turn ends on the agent's word even when the record did not
                // change (`blocked` twice in a row is no transition).
                self.sock_status(name, run, to);
            }
            FromAgent::Request { id, op, args } => {
                let sup = self.handle();
                let agent = name.clone();
                tokio::spawn(async move {
                    let caller = Caller::Agent(agent.clone());
                    let r = handle(&sup, &caller, &op, &args).await;
                    let _ = sup.tx.send(Cmd::AgentReply(agent, id, r));
                });
            }
            FromAgent::Done { result } => {
                if l.done.is_none() && l.error.is_none() {
                    // The final figures count like a last `usage` (SPEC 7).
                    let (ti, to, c) = (result.tokens_in, result.tokens_out, result.cost_usd);
                    let response = result.response.clone();
                    l.done = Some(result);
                    self.say_unsaid(name, run, &session, Some(response));
                    if ti > 0 || to > 0 || c > 0.0 {
                        self.on_usage(name, run, ti, to, c);
                    }
                }
            }
            FromAgent::Error { error } => {
                if l.done.is_none() && l.error.is_none() {
                    l.error = Some(error);
                }
            }
        }
    }

    /// A run's cumulative usage (SPEC 7): recorded, then rolled up the tree and
    /// checked against every budget above it. Spend only grows: a report lower
    /// than an earlier one keeps the earlier dollars, and a report below what
    /// the model gateway metered keeps brood's count (issue 31).
    pub(super) fn on_usage(
        &mut self,
        name: &AgentName,
        run: &RunId,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
    ) {
        let Some(l) = self.agents.live.get_mut(name) else {
            return;
        };
        if cost_usd.is_finite() {
            l.reported_usd = l.reported_usd.max(cost_usd);
        }
        l.reported_in = l.reported_in.max(tokens_in);
        l.reported_out = l.reported_out.max(tokens_out);
        self.settle_usage(name, run);
    }
}

/// At most this much streamed text is kept for the transcript until the
/// turn's message (a protocol line is at most 1 MiB).
const MAX_UNSAID: usize = 1 << 20;

impl Dispatcher {
    /// Records one message of the agent's session: the store, then the
    /// projection's `messages.jsonl` (and `latest.md` for the agent's own),
    /// then the followers of its socket.
    fn record_message(
        &mut self,
        name: &AgentName,
        run: &RunId,
        session: &SessionName,
        role: &str,
        content: String,
    ) {
        match self.records.store.append_message(
            &self.records.tenant,
            name,
            session,
            run,
            role,
            &content,
            now_ms(),
        ) {
            Ok(m) => {
                let dir = self.host.paths.session_dir(name, session);
                self.records
                    .projection
                    .append(dir.join("messages.jsonl"), crate::objects::message_line(&m));
                if crate::objects::is_agent_message(role) {
                    self.records
                        .projection
                        .write(dir.join("latest.md"), content);
                }
                self.sockets.message(name, &m);
            }
            Err(e) => tracing::error!(agent = %name, error = %e, "recording a message failed"),
        }
    }

    /// What the agent streamed in this turn without sending it as a whole
    /// message becomes the assistant's message (issue 25 item 8): at its
    /// `done`, the response it gives (or, when that is empty, what it
    /// streamed), once, so a `done` that repeats its chunks is one message.
    fn say_unsaid(
        &mut self,
        name: &AgentName,
        run: &RunId,
        session: &SessionName,
        response: Option<String>,
    ) {
        let Some(l) = self.agents.live.get_mut(name) else {
            return;
        };
        let streamed = std::mem::take(&mut l.unsaid);
        let said = std::mem::take(&mut l.said_this_turn);
        if said {
            // It sent its words whole: the response repeats them.
            return;
        }
        let content = match response {
            Some(r) if !r.is_empty() => r,
            _ if !streamed.is_empty() => streamed,
            _ => return,
        };
        self.record_message(name, run, session, "assistant", content);
    }
}
