//! What moves when a node of the cluster is lost (issue 29 item 4,
//! docs/reliability.md "A node lost").
//!
//! Declaring a node lost ([`Cluster::declare_lost`]), by any node that
//! sees its heartbeat expire or, on one machine, its process gone (the
//! orphan sweeper), plans what moves ([`Cluster::placing_for`]) and hands
//! it to the store's one transaction (`Store::recover_lost_placing`): its
//! queued agents are placed again on live nodes as they are; its agents that
//! ran and whose policy says `on_restart: resume` (and that need no secret
//! value, and are not a job's workers: as at a restart, `restart::resumes`)
//! end `failed (lost)` and start again as a new queued run placed on a live
//! node, their session's history kept in the store and their children's
//! artifacts in the shared blobs; the rest end `failed (lost)` as before, told
//! as any end is (their files, their parent, the waiters).
//! A node is chosen as for a new agent (`placement::choose`): the labels its
//! request named and free capacity; a child without labels goes where its
//! parent runs (its parent's new node when the parent moves too). Parents
//! come first, and a child moves only under a parent that moves or lives.
//!
//! The node that takes a moved agent claims it like any placed agent
//! (`placement`, hosted by `route::cluster`'s `host_claimed`); a moved
//! child whose parent is claimed on the same node waits for its parent's
//! process (its group is made in the parent's), and the children the loss
//! ended are told to the moved parent once it runs, as after a restart
//! ([`Cluster::moved_run`]).
//!
//! The lost node may only have been paused (SIGSTOP) and come back: its
//! start of a moved agent is refused by the store (the record names another
//! host), its end of the old run is refused (the record's run is another),
//! and before it acts on anything once its last heartbeat is older than
//! half its expiry it heartbeats first ([`Cluster::fence_if_stale`]);
//! finding itself declared lost, it lets go of the moved agents' processes
//! without writing a record ([`Cluster::let_go_moved`]): the records
//! are the new runs', not its.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brood_core::{FailReason, Status, Terminal};
use brood_store::{Agent, Node, Placing, Resuming, StoreError, placed_for, placed_on};
use serde_json::Value;

use super::{Cluster, Env, Next, NodeFollow, then};
use crate::supervisor::restart;
use crate::supervisor::sweep::LEASE;
use crate::supervisor::{new_run_id, now_ms};

/// When this node's heartbeat last went through, and when one was last
/// tried out of turn (a store that fails is not asked again at every
/// command).
#[derive(Default)]
pub(super) struct Beat {
    pub(super) ok: Option<Instant>,
    tried: Option<Instant>,
}

impl Cluster {
    /// Declares node `id` lost: what moves is planned and, in one store
    /// transaction, placed on live nodes while the rest ends lost; then
    /// the lease's lock it may hold is broken and its record goes. A plan
    /// that cannot be read declares nothing: the next tick tries again.
    pub(in crate::supervisor) fn declare_lost(&self, id: &str, env: &Env) -> Vec<NodeFollow> {
        let placing = match self.placing_for(id, env) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(node = id, error = %e, "planning what moves off a lost node");
                return Vec::new();
            }
        };
        let dead = [id.to_owned(), placed_on(id)];
        let mut out = Vec::new();
        match env.store.recover_lost_placing(&dead, &placing, now_ms()) {
            Ok(r) => {
                tracing::warn!(
                    node = id,
                    ended = r.agents.len() - r.resumed.len(),
                    resumed = r.resumed.len(),
                    placed_again = r.replaced.len(),
                    "a node was lost: its queue and its resumable agents moved to live nodes, the rest lost"
                );
                // What ended is told as any end is: its files, its parent
                // (here or through the store), the waiters.
                out.extend(
                    r.agents
                        .into_iter()
                        .filter(|a| a.tenant == *env.tenant && a.status.is_finished())
                        .map(NodeFollow::Ended),
                );
            }
            Err(e) => {
                tracing::error!(node = id, error = %e, "ending a lost node's agents");
                return Vec::new();
            }
        }
        out.push(then(Next::LetGoOfNode(id.to_owned())));
        out
    }

    /// A lost node's ends told: the lease's lock it may hold is broken, its
    /// record goes, and what moved here is claimed.
    pub(super) fn let_go_of_node(&self, id: &str, env: &Env) -> Vec<NodeFollow> {
        let held_lease = env
            .store
            .lease(LEASE)
            .ok()
            .flatten()
            .is_some_and(|f| f.holder == id);
        if held_lease {
            match env.store.break_lease_lock(LEASE) {
                Ok(true) => tracing::warn!(node = id, "broke the lost node's sweeper lease lock"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "breaking a lost node's lease lock"),
            }
        }
        if let Err(e) = env.store.leave_node(id) {
            tracing::warn!(node = id, error = %e, "removing a lost node's record");
        }
        // Ours to claim now, if any came here.
        self.claim(env)
    }

    /// What moves off lost node `lost` (module docs), parents first: each
    /// queued agent of this tenant, and each that ran whose policy resumes
    /// it, with the live node that takes it. One that no live node can take
    /// is left out (it ends lost), and so is a child whose parent ran on the
    /// lost node and does not move.
    fn placing_for(&self, lost: &str, env: &Env) -> Result<Vec<Placing>, StoreError> {
        let mut agents: Vec<Agent> = env
            .store
            .unfinished_of(&[lost.to_owned(), placed_on(lost)])?
            .into_iter()
            .filter(|a| a.tenant == *env.tenant)
            .collect();
        if agents.is_empty() {
            return Ok(Vec::new());
        }
        agents.sort_by(|a, b| (a.depth, &a.name).cmp(&(b.depth, &b.name)));
        let mut nodes: Vec<Node> = self
            .live_nodes(env)?
            .into_iter()
            .filter(|n| n.id != lost)
            .collect();
        let jobs = env.store.jobs(env.tenant)?;
        let operator = env.operator();
        let mut out: Vec<Placing> = Vec::new();
        for a in &agents {
            let queued = a.status == Status::Queued;
            let resumes = matches!(a.status, Status::Running | Status::Blocked)
                && restart::resumes(a, &jobs, &operator);
            if !queued && !resumes {
                continue;
            }
            let parent_on_lost = a
                .parent
                .as_ref()
                .is_some_and(|p| agents.iter().any(|x| x.name == *p));
            let parent_to = a
                .parent
                .as_ref()
                .and_then(|p| out.iter().find(|x| x.agent.name == *p))
                .map(|x| x.to.clone());
            if parent_on_lost && parent_to.is_none() {
                continue;
            }
            let Some(to) = self.node_for(a, parent_to, &nodes, env)? else {
                tracing::warn!(agent = %a.name, node = lost, "no live node can take an agent of a lost node; it ends lost");
                continue;
            };
            if let Some(n) = nodes.iter_mut().find(|n| n.id == to) {
                n.live_agents += 1;
            }
            let (run, events) = if queued {
                (a.run.clone(), Vec::new())
            } else {
                let run = new_run_id();
                let events = vec![restart::resume_event(a, &run)];
                (run, events)
            };
            out.push(Placing {
                agent: Resuming {
                    tenant: a.tenant.clone(),
                    name: a.name.clone(),
                    run,
                    events,
                },
                to,
            });
        }
        Ok(out)
    }

    /// The live node for `a`, as for a new agent: the labels its request
    /// named; without them its parent's node (`parent_to` when the parent
    /// moves too), else the live node with the most free capacity.
    fn node_for(
        &self,
        a: &Agent,
        parent_to: Option<String>,
        nodes: &[Node],
        env: &Env,
    ) -> Result<Option<String>, StoreError> {
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let labels: BTreeMap<String, String> =
            serde_json::from_value(spec["placement"].clone()).unwrap_or_default();
        if !labels.is_empty() {
            return Ok(super::placement::choose(nodes, &labels, &self.me));
        }
        if parent_to.is_some() {
            return Ok(parent_to);
        }
        if let Some(p) = &a.parent
            && let Some(pa) = env.store.agent(env.tenant, p)?
        {
            let host = placed_for(&pa.supervisor).unwrap_or(&pa.supervisor);
            if nodes.iter().any(|n| n.id == host) {
                return Ok(Some(host.to_owned()));
            }
        }
        Ok(super::placement::choose(nodes, &BTreeMap::new(), &self.me))
    }

    /// A claimed agent: whether its run is one a node's loss (or any resume)
    /// started again (`None` when not), and, if so, its children that loss
    /// ended lost, to be told to it once it runs (as after a restart). The
    /// loss writes their ends and the new run in one transaction, at one
    /// time: a child ended at the new run's creation was ended by it.
    pub(in crate::supervisor) fn moved_run(
        &self,
        a: &Agent,
        env: &Env,
    ) -> Result<Option<Vec<Agent>>, brood_store::StoreError> {
        // A failed read is not "no earlier run" nor "no child ended": the
        // hosting fails and is tried again (issue 28).
        let Some(run) = env.store.run(env.tenant, &a.run)? else {
            return Ok(None);
        };
        if run.seq <= 1 {
            return Ok(None);
        }
        let lost = Status::Ended(Terminal::Failed(FailReason::Lost));
        let kids = env.store.children(env.tenant, &a.name)?;
        Ok(Some(
            kids.into_iter()
                .filter(|k| k.status == lost && k.updated_ms == run.created_ms)
                .collect(),
        ))
    }

    /// Before any command: a node whose last heartbeat went through longer
    /// ago than half its expiry (it was paused, or cut off) may have been
    /// declared lost meanwhile; it heartbeats first, and finding its record
    /// gone lets go of what moved away and stops what ended, before it acts
    /// for any agent.
    pub(in crate::supervisor) fn fence_if_stale(&mut self, env: &Env) -> Vec<NodeFollow> {
        let Some(expiry) = self.node.as_ref().map(|n| n.expiry) else {
            return Vec::new();
        };
        let Some(ok) = self.beat.ok else {
            return Vec::new();
        };
        let stale = ok.elapsed() > expiry / 2;
        let tried_lately = self
            .beat
            .tried
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
        if stale && !tried_lately {
            self.beat.tried = Some(Instant::now());
            return self.heartbeat(env);
        }
        Vec::new()
    }

    /// The live agents whose record moved to another node (another run, or
    /// another host) while this node was declared lost: their processes are
    /// to be killed and their entries dropped, and nothing is written, since
    /// the record is the new run's.
    pub(super) fn let_go_moved(&mut self, env: &Env) -> Vec<NodeFollow> {
        let me = &self.me;
        let mut moved = Vec::new();
        for (n, l) in &env.agents.live {
            match env.store.agent(env.tenant, n) {
                Ok(Some(a)) => {
                    if !a.status.is_finished() && (a.run != l.run || a.supervisor != *me) {
                        moved.push(n.clone());
                    }
                }
                Ok(None) => {}
                // Not "it did not move": it may run on another node now.
                // Looked at again at the next tick (`Cluster::recheck`).
                Err(e) => {
                    tracing::warn!(agent = %n, error = %e, "reading a live agent's record after this node was declared lost; looking again at the next tick");
                    self.unchecked.insert(n.clone());
                }
            }
        }
        if moved.is_empty() {
            return Vec::new();
        }
        tracing::warn!(
            agents = moved.len(),
            "this node was declared lost; letting go of the agents that moved to other nodes"
        );
        moved.into_iter().map(NodeFollow::LetGo).collect()
    }
}
