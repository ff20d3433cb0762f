//! What an agent says (SPEC 7): its protocol messages recorded and relayed
//! to its socket's followers, what it streamed said at its turn's end, its
//! usage, and the budgets above it its spend rolls up to (SPEC 9).

use brood_core::{AgentEvent, AgentName, RunId, SessionName, Status};
use brood_proto::FromAgent;

use super::{Env, Relay, RelayFollow};
use crate::objects::project_agent;
use crate::supervisor::{ev, now_ms};

/// At most this much streamed text is kept for the transcript until the
/// turn's message (a protocol line is at most 1 MiB).
const MAX_UNSAID: usize = 1 << 20;

impl Relay {
    pub(super) fn on_msg(
        &mut self,
        name: &AgentName,
        run: &RunId,
        m: FromAgent,
        env: &mut Env<'_>,
    ) -> Option<RelayFollow> {
        let l = env.agents.live.get_mut(name)?;
        let session = l.session.clone();
        match m {
            FromAgent::Ready => {
                l.ready = true;
                let reply = l.spawn_reply.take();
                let news = l.ready_news.take();
                Some(RelayFollow::Ready { news, reply })
            }
            FromAgent::Chunk { delta } => {
                // Kept until the turn's whole message: a child that only
                // streams (the seed's sub-agent protocol) has its words
                // recorded at its `done` or the end of its turn.
                if l.unsaid.len() + delta.len() <= MAX_UNSAID {
                    l.unsaid.push_str(&delta);
                }
                env.sockets.chunk(name, run, &delta);
                None
            }
            FromAgent::Pong | FromAgent::Unknown => None,
            FromAgent::Message { role, content } => {
                if crate::objects::is_agent_message(&role) {
                    // The whole message the chunks were streaming.
                    l.unsaid.clear();
                    l.said_this_turn = true;
                }
                record_message(name, run, &session, &role, content, env);
                None
            }
            FromAgent::Usage {
                tokens_in,
                tokens_out,
                cost_usd,
            } => self.on_usage(name, tokens_in, tokens_out, cost_usd, env),
            FromAgent::Status { status, reason } => {
                let to = match status.as_str() {
                    "blocked" => Status::Blocked,
                    "running" => Status::Running,
                    _ => return None,
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
                    say_unsaid(name, run, &session, None, env);
                }
                match env.records.store.set_status(
                    &env.records.tenant,
                    name,
                    to,
                    reason.as_deref(),
                    now_ms(),
                    &[event],
                ) {
                    Ok(a) => project_agent(
                        &env.records.projection,
                        env.paths,
                        &a,
                        env.agents.live.get(name).and_then(|l| l.pid),
                    ),
                    Err(e) => tracing::info!(agent = %name, error = %e, "status change ignored"),
                }
                // A turn ends on the agent's word even when the record did not
                // change (`blocked` twice in a row is no transition).
                Some(RelayFollow::SockStatus(to))
            }
            FromAgent::Request { id, op, args } => Some(RelayFollow::Request { id, op, args }),
            FromAgent::Done { result } => {
                if l.done.is_none() && l.error.is_none() {
                    // The final figures count like a last `usage` (SPEC 7).
                    let (ti, to, c) = (result.tokens_in, result.tokens_out, result.cost_usd);
                    let response = result.response.clone();
                    l.done = Some(result);
                    say_unsaid(name, run, &session, Some(response), env);
                    if ti > 0 || to > 0 || c > 0.0 {
                        return self.on_usage(name, ti, to, c, env);
                    }
                }
                None
            }
            FromAgent::Error { error } => {
                if l.done.is_none() && l.error.is_none() {
                    l.error = Some(error);
                }
                None
            }
        }
    }

    /// A run's cumulative usage (SPEC 7): kept, then settled with what the
    /// model gateway metered ([`RelayFollow::SettleUsage`]), recorded and
    /// rolled up the tree and checked against every budget above it. Spend
    /// only grows: a report lower than an earlier one keeps the earlier
    /// dollars, and a report below what the model gateway metered keeps
    /// brood's count (issue 31).
    fn on_usage(
        &mut self,
        name: &AgentName,
        tokens_in: u64,
        tokens_out: u64,
        cost_usd: f64,
        env: &mut Env<'_>,
    ) -> Option<RelayFollow> {
        let l = env.agents.live.get_mut(name)?;
        if cost_usd.is_finite() {
            l.reported_usd = l.reported_usd.max(cost_usd);
        }
        l.reported_in = l.reported_in.max(tokens_in);
        l.reported_out = l.reported_out.max(tokens_out);
        Some(RelayFollow::SettleUsage)
    }

    /// New spend of `delta` dollars by `name`: it rolls up through every live
    /// ancestor; the highest agent whose subtree reached its `cost_limit`,
    /// to stop with `budget_exceeded`, its subtree with it (SPEC 9).
    pub(in crate::supervisor) fn add_spend(
        &mut self,
        name: &AgentName,
        delta: f64,
        env: &mut Env<'_>,
    ) -> Option<AgentName> {
        if delta <= 0.0 || !delta.is_finite() {
            return None;
        }
        let mut over: Option<AgentName> = None;
        let mut cur = Some(name.clone());
        let mut hops = 0;
        while let Some(n) = cur {
            let Some(l) = env.agents.live.get_mut(&n) else {
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
        over
    }

    /// `top`'s budget stopped it: what its record's detail says.
    pub(in crate::supervisor) fn over_budget(&mut self, top: &AgentName, env: &mut Env<'_>) {
        let spent = env
            .agents
            .live
            .get(top)
            .map(|l| l.subtree_usd)
            .unwrap_or_default();
        let limit = env
            .agents
            .live
            .get(top)
            .and_then(|l| l.policy.cost_limit)
            .unwrap_or_default();
        tracing::info!(agent = %top, spent, limit, "budget exceeded; stopping the subtree");
        if let Some(l) = env.agents.live.get_mut(top) {
            l.budget_note = Some(format!(
                "budget exceeded: the subtree spent ${spent:.4} of its cost_limit ${limit:.4}"
            ));
        }
    }
}

/// Records one message of the agent's session: the store, then the
/// projection's `messages.jsonl` (and `latest.md` for the agent's own),
/// then the followers of its socket.
fn record_message(
    name: &AgentName,
    run: &RunId,
    session: &SessionName,
    role: &str,
    content: String,
    env: &mut Env<'_>,
) {
    match env.records.store.append_message(
        &env.records.tenant,
        name,
        session,
        run,
        role,
        &content,
        now_ms(),
    ) {
        Ok(m) => {
            let dir = env.paths.session_dir(name, session);
            env.records
                .projection
                .append(dir.join("messages.jsonl"), crate::objects::message_line(&m));
            if crate::objects::is_agent_message(role) {
                env.records.projection.write(dir.join("latest.md"), content);
            }
            env.sockets.message(name, &m);
        }
        Err(e) => tracing::error!(agent = %name, error = %e, "recording a message failed"),
    }
}

/// What the agent streamed in this turn without sending it as a whole
/// message becomes the assistant's message (issue 25 item 8): at its
/// `done`, the response it gives (or, when that is empty, what it
/// streamed), once, so a `done` that repeats its chunks is one message.
fn say_unsaid(
    name: &AgentName,
    run: &RunId,
    session: &SessionName,
    response: Option<String>,
    env: &mut Env<'_>,
) {
    let Some(l) = env.agents.live.get_mut(name) else {
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
    record_message(name, run, session, "assistant", content, env);
}
