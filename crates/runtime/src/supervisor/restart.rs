//! Resume on restart (issue 29, SPEC 6 "Supervisor death"): what a start
//! does with the agents a dead incarnation ran whose policy says
//! `on_restart: resume`, and what a resumed run gets when it asks again for
//! what its earlier run already did.
//!
//! At start ([`plan`]), before anything runs: the dead incarnations' agents
//! of this tenant that were queued, running or blocked, whose policy says
//! `resume`, that need no secret value (values live in memory only, and
//! died with the incarnation) and that are not a job's workers (their
//! attempts fail and the job gives the items to new workers), parents before
//! children, a child only under a parent that is resumed. The store's
//! recovery ends every agent of the dead incarnations and, in the same
//! transaction, starts those again as new `queued` runs (`Store::
//! recover_resuming`), so nothing is ever `running` without a process and a
//! crash in between leaves either all of it or none.
//!
//! Then the loop takes them up ([`Dispatcher::take_up_resumed`]) as a resume
//! does: a live entry each, roots to the queue for a slot, children held
//! until their parent's process has started (a child's group is made in its
//! parent's), then queued ([`Dispatcher::release_resumed`]). A child the
//! restart ended instead (its policy says `cancel`, it is a job's worker, it
//! needs a secret) is told to its resumed parent once that one runs, as any
//! child's end is (SPEC 7 `child`). A resumed child whose start fails ends
//! like any run, and its parent hears of it the same way.
//!
//! Nothing done twice ([`Dispatcher::created_before`]): a run that asks for
//! a child by a name its agent already gave a child in an earlier run gets
//! that child (its status, and its result once it has one), neither a
//! second child nor `NameTaken`.

use super::agents::Agents;
use super::queue::Queue;
use super::records::Records;
use super::{Live, Pending, ev, new_run_id, stored_policy};
use crate::api::Caller;
use crate::api::SpawnRequest;
use crate::objects::project_agent;
use crate::paths::Paths;
use crate::shown::agent_view;
use brood_core::AgentEvent;
use brood_core::AgentName;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::policy::OnRestart;
use brood_core::policy::Policy;
use brood_store::Agent;
use brood_store::Job;
use brood_store::Resuming;
use brood_store::Store;
use brood_store::StoreError;
use serde_json::Value;

/// What the start resumed, for the loop to take up.
#[derive(Default)]
pub(super) struct Restart {
    /// Resumed at start, parents first: taken up when the loop begins.
    resumed: Vec<Agent>,
    /// Resumed children waiting for their parent's process: (parent, child).
    held: Vec<(AgentName, AgentName)>,
    /// Children the restart ended, told to their resumed parent once it
    /// runs: (parent, the child as recorded).
    ended: Vec<(AgentName, Agent)>,
}

impl Restart {
    /// What it holds for agents (`held`).
    pub(super) fn held(&self) -> usize {
        self.resumed.len() + self.held.len() + self.ended.len()
    }

    /// A child (resumed, or moved off a lost node) held until `parent`'s
    /// process has started.
    pub(super) fn hold(&mut self, parent: AgentName, child: AgentName) {
        self.held.push((parent, child));
    }

    /// A child's end told to `parent` once it runs.
    pub(super) fn tell_later(&mut self, parent: AgentName, child: Agent) {
        self.ended.push((parent, child));
    }

    /// What the start's recovery did: `agents` as they are afterwards,
    /// `resumed` those it started again, parents first.
    pub(super) fn new(
        agents: Vec<Agent>,
        resumed: &[(TenantId, AgentName)],
        tenant: &TenantId,
    ) -> Restart {
        let is_resumed = |a: &Agent| resumed.iter().any(|(t, n)| *t == a.tenant && *n == a.name);
        let mut r = Restart::default();
        for (t, n) in resumed.iter().filter(|(t, _)| t == tenant) {
            if let Some(a) = agents.iter().find(|a| a.tenant == *t && a.name == *n) {
                r.resumed.push(a.clone());
            }
        }
        for a in agents {
            if is_resumed(&a) || a.tenant != *tenant {
                continue;
            }
            if let Some(p) = a.parent.clone()
                && resumed.iter().any(|(t, n)| *t == a.tenant && *n == p)
            {
                r.ended.push((p, a));
            }
        }
        r
    }
}

/// The agents of the `dead` incarnations a start resumes (module docs),
/// parents before children, each with its new run and its `agent.resume`.
pub(super) fn plan(
    store: &dyn Store,
    tenant: &TenantId,
    dead: &[String],
    operator: &Policy,
) -> Result<Vec<Resuming>, StoreError> {
    let mut unfinished = store.unfinished_of(dead)?;
    let jobs = store.jobs(tenant)?;
    unfinished.sort_by(|a, b| (a.depth, &a.name).cmp(&(b.depth, &b.name)));
    let mut out: Vec<Resuming> = Vec::new();
    for a in &unfinished {
        let under_resumed = a
            .parent
            .as_ref()
            .is_none_or(|p| out.iter().any(|r| r.name == *p));
        if !under_resumed || !resumable(a, tenant, &jobs, operator) {
            continue;
        }
        let run = new_run_id();
        let events = vec![resume_event(a, &run)];
        out.push(Resuming {
            tenant: a.tenant.clone(),
            name: a.name.clone(),
            run,
            events,
        });
    }
    Ok(out)
}

/// Whether a dead incarnation's agent is started again (module docs).
fn resumable(a: &Agent, tenant: &TenantId, jobs: &[Job], operator: &Policy) -> bool {
    if a.tenant != *tenant
        || !matches!(a.status, Status::Queued | Status::Running | Status::Blocked)
        || brood_store::placed_for(&a.supervisor).is_some()
    {
        return false;
    }
    resumes(a, jobs, operator)
}

/// Whether an agent's record says it is started again when its supervisor
/// goes (at a restart, or its node lost): its policy says `resume`, it
/// needs no secret value (values live in memory only, and died with the
/// supervisor) and it is not a job's worker (its attempt fails, and the job
/// gives the item to a new worker).
pub(super) fn resumes(a: &Agent, jobs: &[Job], operator: &Policy) -> bool {
    let worker = jobs.iter().any(|j| {
        a.parent.as_ref() == Some(&j.owner) && brood_store::is_job_worker(&j.id, a.name.as_str())
    });
    if worker {
        return false;
    }
    let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
    match crate::objects::policy_of(&spec, operator) {
        Ok(p) => p.on_restart == OnRestart::Resume && p.secrets.is_empty(),
        Err(e) => {
            tracing::error!(agent = %a.name, error = %e, "a stored policy does not read back; the agent is not resumed");
            false
        }
    }
}

/// What taking up a resumed agent reads and writes of the rest of the
/// supervisor.
pub(super) struct Env<'a> {
    pub(super) records: &'a Records,
    pub(super) paths: &'a Paths,
    /// Where its shim goes (`Config::bin_dir`).
    pub(super) bin_dir: Option<&'a std::path::Path>,
    /// What a root holds: its stored policy is read against it.
    pub(super) operator: &'a Policy,
    pub(super) agents: &'a mut Agents,
    /// The queue for a slot, where a resumed root goes.
    pub(super) waiting: &'a mut Queue,
}

impl Restart {
    /// The agents the start resumed, taken up as a resume takes one up
    /// (`on_resume`): roots queued for a slot, children held for their
    /// parent. Called once, before the loop's first command.
    pub(super) fn take_up_resumed(&mut self, env: &mut Env<'_>) {
        for a in std::mem::take(&mut self.resumed) {
            if let Err(e) = self.take_up(&a, env) {
                // Its stored policy read back when the start chose it, so
                // this is a store that changed under it: said, and left
                // for the orphan sweeper.
                tracing::error!(agent = %a.name, error = %e.message, "taking up an agent resumed at start");
            }
        }
        tracing::info!(held = self.held.len(), "agents resumed at start taken up");
    }

    fn take_up(&mut self, a: &Agent, env: &mut Env<'_>) -> Result<(), crate::api::ApiError> {
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let policy = stored_policy(&spec, env.operator)?;
        project_agent(&env.records.projection, env.paths, a, None);
        let adir = env.paths.agent_dir(&a.name);
        for (file, text) in crate::objects::control_files(a, &policy, &spec) {
            env.records.projection.write(adir.join(file), text);
        }
        env.records.project_shim(env.bin_dir, &a.name);
        let parent_pair = match &a.parent {
            Some(p) => match env.agents.live.get(p) {
                Some(l) => Some((p.clone(), l.session.clone())),
                None => {
                    return Err(crate::api::ApiError::new(
                        brood_core::Code::ParentMismatch,
                        format!("parent {p} of {} was not taken up", a.name),
                    ));
                }
            },
            None => None,
        };
        let (argv, cwd) = super::cluster::stored_launch(&spec);
        // Its instruction is its task again: the history holds the rest.
        let mut live = Live::of_record(a, &spec, parent_pair, policy, None);
        // Its budget covers what it and its subtree spent in earlier runs.
        live.subtree_usd = env
            .records
            .store
            .spend(&env.records.tenant, &a.name)
            .map(|s| s.subtree.cost_usd)
            .map_err(crate::api::internal)?;
        live.pending = Some(Pending {
            argv,
            cwd,
            group_parent: None,
            admitted: None,
        });
        env.agents.live.insert(a.name.clone(), Box::new(live));
        match &a.parent {
            Some(p) => self.held.push((p.clone(), a.name.clone())),
            None => env.waiting.push(a.name.clone()),
        }
        Ok(())
    }

    /// After each command: resumed children whose parent's process has
    /// started go to the queue, in its group. Returns the children the
    /// restart ended whose parent now runs, to be told to it (parent, the
    /// child as recorded). A parent that stopped or ended first takes its
    /// held children with it (its stop is planned from the store, where
    /// they are its queued children).
    pub(super) fn release_resumed(
        &mut self,
        agents: &mut Agents,
        waiting: &mut Queue,
    ) -> Vec<(AgentName, Agent)> {
        if self.held.is_empty() && self.ended.is_empty() {
            return Vec::new();
        }
        for (p, c) in std::mem::take(&mut self.held) {
            let Some(pl) = agents.live.get(&p).filter(|l| l.stopping.is_none()) else {
                continue;
            };
            if pl.pid.is_none() {
                self.held.push((p, c));
                continue;
            }
            let group = pl.group.clone();
            if let Some(pending) = agents
                .live
                .get_mut(&c)
                .filter(|l| l.stopping.is_none())
                .and_then(|l| l.pending.as_mut())
            {
                pending.group_parent = group;
                waiting.push(c);
            }
        }
        let mut tell = Vec::new();
        for (p, child) in std::mem::take(&mut self.ended) {
            let Some(pl) = agents.live.get(&p).filter(|l| l.stopping.is_none()) else {
                continue;
            };
            if pl.pid.is_none() {
                self.ended.push((p, child));
                continue;
            }
            tell.push((p, child));
        }
        tell
    }
}

/// The child `caller` asks for by a name it already gave a child of its
/// own in an earlier run (a resumed run repeating its plan): that child
/// as it is now, rather than a second one or `NameTaken`. `None` for
/// every other request, which admission decides as ever; a first run
/// asking twice for one name is still refused `NameTaken`, since that
/// is a mistake worth telling (docs/lifecycle.md "Nothing done twice").
pub(super) fn created_before(
    records: &Records,
    agents: &Agents,
    caller: &Caller,
    req: &SpawnRequest,
) -> Option<brood_api::Agent> {
    let Caller::Agent(me) = caller else {
        return None;
    };
    let name = req.name.as_ref()?;
    if req.parent.as_ref().is_some_and(|p| p != me) {
        return None;
    }
    let run = &agents.live.get(me)?.run;
    let child = records
        .store
        .agent(&records.tenant, name)
        .ok()
        .flatten()
        .filter(|c| c.parent.as_ref() == Some(me))?;
    let started = records
        .store
        .run(&records.tenant, run)
        .ok()
        .flatten()?
        .created_ms;
    if child.created_ms >= started {
        return None;
    }
    tracing::info!(parent = %me, child = %name, "a resumed run asked again for a child of an earlier run; given that child");
    Some(agent_view(&records.store, &child))
}

/// The `agent.resume` event of `a`'s new run `run` (a restart's, a lost
/// node's move).
pub(super) fn resume_event(
    a: &brood_store::Agent,
    run: &brood_core::RunId,
) -> brood_store::NewEvent {
    ev(
        &a.name,
        Some(run),
        &a.session,
        AgentEvent::Resume {
            agent: a.name.clone(),
            run: run.clone(),
        },
    )
}
