//! A recorded end projected into the ctx tree, then told: the metrics and
//! the run's span, the parent and a customer running here (the context
//! pack, SPEC 4), a pending spawn reply, and the waits it completes. What
//! another node runs hears of it through the store, which the loop does
//! between [`Ends::tell`] and [`Ends::answer`].

use brood_core::{AgentName, Status};
use brood_proto::ToAgent;
use brood_store::Agent;
use serde_json::json;

use super::{Ends, Env};
use crate::objects::project_agent;
use crate::shown::agent_view;
use crate::supervisor::agents::Agents;
use crate::supervisor::answer;

impl Ends {
    /// An end's files: the agent object, its parent's channel (status,
    /// `result.md`, the refs), and an object removed with its last run.
    pub(in crate::supervisor) fn project(
        &self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
        env: &Env<'_>,
    ) {
        project_agent(&env.records.projection, env.paths, agent, None);
        env.records.project_channel(env.agents, agent, result);
        if let (Some(h), Some(dir)) = (h, env.records.channel_dir_of(env.agents, agent)) {
            env.records
                .projection
                .write(dir.join("refs.jsonl"), h.output.refs.clone());
        }
        if crate::objects::object_removed(agent) {
            env.records
                .projection
                .remove_dir(env.paths.agent_dir(&agent.name));
            env.records
                .projection
                .remove_dir(env.paths.shim(&agent.name));
        }
    }

    /// The first of what tells of an end: its metrics, its span and log
    /// line, and its parent and a customer running here. Called only after
    /// the projection writes of the change are queued, so whoever is told
    /// and then flushes sees the files.
    pub(in crate::supervisor) fn tell(
        &self,
        agent: &Agent,
        result: Option<&str>,
        h: Option<&crate::channel::Harvest>,
        env: &mut Env<'_>,
    ) {
        if let Status::Ended(t) = agent.status {
            let took = env
                .agents
                .live
                .get(&agent.name)
                .map(|l| l.admitted.elapsed());
            env.metrics.invocation(t.word(), took);
            // Its `invoke_agent` span, built from its records off the loop.
            env.tracer.run_ended(&agent.tenant, agent);
            let trace = env
                .agents
                .live
                .get(&agent.name)
                .and_then(|l| l.trace)
                .or_else(|| crate::trace::Placed::of_agent(agent));
            crate::trace::log_span(&agent.name, &agent.run, trace).in_scope(|| {
                tracing::info!(status = %agent.status.encode(), "run ended");
            });
        }
        // The parent hears of its child's end, and so does the customer when it
        // is someone else (SPEC 7 `child`; SPEC 9: the customer takes the result).
        let told = agent.parent.iter().chain(
            agent
                .customer
                .iter()
                .filter(|c| Some(*c) != agent.parent.as_ref()),
        );
        let told: Vec<AgentName> = told.cloned().collect();
        for p in &told {
            tell_parent(p, agent, result, h, env.agents);
        }
    }

    /// The last of what tells of an end: a pending spawn reply answered,
    /// and the ids of the waits it completes, for the loop to answer.
    pub(in crate::supervisor) fn answer(&self, agent: &Agent, env: &mut Env<'_>) -> Vec<u64> {
        if let Some(l) = env.agents.live.get_mut(&agent.name)
            && let Some((reply, _)) = l.spawn_reply.take()
        {
            answer(reply, Ok(agent_view(&env.records.store, agent)));
        }
        env.waiters
            .done_with(&agent.name, |n| finished_in_store(n, env))
    }
}

/// The protocol's `child` event for `p` (a parent or customer that runs
/// here): the context pack (SPEC 4), the result, the refs' summaries and
/// the artifacts they name; never the child's transcript.
pub(in crate::supervisor) fn tell_parent(
    p: &AgentName,
    agent: &Agent,
    result: Option<&str>,
    h: Option<&crate::channel::Harvest>,
    agents: &Agents,
) {
    let pack = crate::channel::pack(result, h);
    let event = json!({"status": agent.status.api_word(), "reason": agent.status.reason(), "result": result, "refs": pack["refs"], "artifacts": pack["artifacts"]});
    agents.to_agent(
        p,
        &ToAgent::Child {
            child: agent.name.to_string(),
            event,
        },
    );
}

/// Whether the store holds `n` finished.
fn finished_in_store(n: &AgentName, env: &Env<'_>) -> bool {
    env.records
        .store
        .agent(&env.records.tenant, n)
        .ok()
        .flatten()
        .is_some_and(|a| a.status.is_finished())
}
