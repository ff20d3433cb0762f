//! What follows a decided admission the store has recorded (its
//! transaction counted the quotas, so they hold under any concurrency):
//! the events and the agent's files projected, its `create_agent` span,
//! and the live entry that waits for a slot, handed back for the loop to
//! enter ([`Recorded`]).

use std::path::PathBuf;

use brood_core::Iso;
use brood_core::SessionName;
use brood_core::policy::Policy;
use brood_store::Agent;
use serde_json::Value;

use super::{Decision, Env, Recorded};
use crate::api::SpawnRequest;
use crate::objects::project_agent;
use crate::supervisor::{Live, Pending};

/// The projection and span of an admission `agent` the store recorded,
/// and what the loop does with it ([`Recorded`]).
pub(in crate::supervisor) fn record(
    d: Decision,
    req: SpawnRequest,
    agent: Agent,
    env: &Env<'_>,
) -> Recorded {
    let Decision {
        parent_live,
        policy,
        secrets,
        spec,
        new,
        events,
    } = d;
    let (name, parent, run) = (new.name.clone(), new.parent.clone(), new.run.clone());
    env.records.project_events(&events);
    let trace = crate::trace::Placed::of_spec(&spec);
    if let Some(t) = trace
        && env.host.tracer.on()
    {
        let s =
            crate::trace::create_span(t, Some(&name), None, &env.host.me, agent.created_ms, None);
        env.host
            .tracer
            .emit(crate::trace::admitted_attrs(s, &agent));
    }
    if brood_store::placed_for(&agent.supervisor).is_some() {
        // Admitted here for another node to run: that node claims it
        // (this write's news wakes it), projects it and starts it.
        return Recorded::Elsewhere {
            name,
            await_ready: req.await_ready,
        };
    }
    project_admitted(
        &agent,
        &policy,
        &spec,
        parent_live.as_ref().map(|(_, s)| s),
        policy.uid,
        env,
    );

    let group_parent = parent_live.as_ref().and_then(|(g, _)| g.clone());
    let parent_pair = parent.clone().zip(parent_live.map(|(_, s)| s));
    let mut live = Live::new(
        run,
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
    Recorded::Here {
        name,
        parent,
        live: Box::new(live),
        await_ready: req.await_ready,
    }
}

/// An admitted agent's files in the ctx tree, from its record and spec:
/// its session, control files, shim, log and `meta.json`, and its
/// parent's channel to it (`agent`, `session`, `handoff.md`, `artifact/`
/// owned by `uid`) when the parent's session is known.
pub(in crate::supervisor) fn project_admitted(
    agent: &Agent,
    policy: &Policy,
    spec: &Value,
    parent_session: Option<&SessionName>,
    uid: u32,
    env: &Env<'_>,
) {
    let (records, paths) = (env.records, &env.host.paths);
    let name = &agent.name;
    // The session and the parent's channel exist from admission on.
    let sdir = paths.session_dir(name, &agent.session);
    records.projection.mkdirs(sdir.join("context"));
    records
        .projection
        .write_new(sdir.join("created_at"), format!("{}\n", agent.created_ms));
    records
        .projection
        .append(sdir.join("messages.jsonl"), Vec::new());
    records
        .projection
        .append(sdir.join("events.jsonl"), Vec::new());
    // Empty until the agent sends a message of its own.
    records
        .projection
        .append(sdir.join("latest.md"), Vec::new());
    records.projection.write_new(
        sdir.join("cwd"),
        format!("{}\n", spec["cwd"].as_str().unwrap_or("")),
    );
    records
        .projection
        .write_new(sdir.join("meta.json"), crate::objects::session_meta(agent));
    let adir = paths.agent_dir(name);
    for (file, text) in crate::objects::control_files(agent, policy, spec) {
        records.projection.write_new(adir.join(file), text);
    }
    records.project_shim(env.host.cfg.bin_dir.as_deref(), name);
    records.projection.append(adir.join("log"), Vec::new());
    records.projection.write_new(
        adir.join("meta.json"),
        crate::objects::agent_meta(agent, None),
    );
    if let (Some(p), Some(psess)) = (&agent.parent, parent_session) {
        let cdir = paths.channel_dir(p, psess, name);
        records
            .projection
            .write_new(cdir.join("agent"), format!("{name}\n"));
        records
            .projection
            .write_new(cdir.join("session"), format!("{}\n", agent.session));
        records.projection.write_new(
            cdir.join("handoff.md"),
            spec["task"].as_str().unwrap_or("").to_owned(),
        );
        records.projection.artifact_dir(cdir.join("artifact"), uid);
    }
    project_agent(&records.projection, paths, agent, None);
    records.project_channel(env.agents, agent, None);
}
