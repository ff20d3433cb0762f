//! What moves when a node of the cluster is lost (issue 29 item 4,
//! docs/reliability.md "A node lost").
//!
//! Declaring a node lost ([`Dispatcher::declare_lost`]), by any node that
//! sees its heartbeat expire or, on one machine, its process gone (the
//! orphan sweeper), plans what moves ([`Dispatcher::placing_for`]) and hands
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
//! (`placement::host_claimed`); a moved child whose parent is claimed on the
//! same node waits for its parent's process (its group is made in the
//! parent's), and the children the loss ended are told to the moved parent
//! once it runs, as after a restart ([`Dispatcher::moved_run`]).
//!
//! The lost node may only have been paused (SIGSTOP) and come back: its
//! start of a moved agent is refused by the store (the record names another
//! host), its end of the old run is refused (the record's run is another),
//! and before it acts on anything once its last heartbeat is older than
//! half its expiry it heartbeats first ([`Dispatcher::fence_if_stale`]);
//! finding itself declared lost, it lets go of the moved agents' processes
//! without writing a record ([`Dispatcher::let_go_moved`]): the records
//! are the new runs', not its.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brood_core::{AgentName, FailReason, Status, Terminal};
use brood_store::{Agent, Node, Placing, Resuming, StoreError, placed_for, placed_on};
use serde_json::Value;

use super::sweep::LEASE;
use super::{Dispatcher, new_run_id, now_ms};

/// When this node's heartbeat last went through, and when one was last
/// tried out of turn (a store that fails is not asked again at every
/// command).
#[derive(Default)]
pub(super) struct Beat {
    pub(super) ok: Option<Instant>,
    tried: Option<Instant>,
}

impl Dispatcher {
    /// Declares node `id` lost: what moves is planned and, in one store
    /// transaction, placed on live nodes while the rest ends lost; then
    /// the lease's lock it may hold is broken and its record goes. A plan
    /// that cannot be read declares nothing: the next tick tries again.
    pub(super) fn declare_lost(&mut self, id: &str) {
        let placing = match self.placing_for(id) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(node = id, error = %e, "planning what moves off a lost node");
                return;
            }
        };
        let dead = [id.to_owned(), placed_on(id)];
        match self
            .records
            .store
            .recover_lost_placing(&dead, &placing, now_ms())
        {
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
                let tenant = self.records.tenant.clone();
                for a in r
                    .agents
                    .iter()
                    .filter(|a| a.tenant == tenant && a.status.is_finished())
                {
                    self.after_end(a, None, None);
                }
            }
            Err(e) => {
                tracing::error!(node = id, error = %e, "ending a lost node's agents");
                return;
            }
        }
        let held_lease = self
            .records
            .store
            .lease(LEASE)
            .ok()
            .flatten()
            .is_some_and(|f| f.holder == id);
        if held_lease {
            match self.records.store.break_lease_lock(LEASE) {
                Ok(true) => tracing::warn!(node = id, "broke the lost node's sweeper lease lock"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "breaking a lost node's lease lock"),
            }
        }
        if let Err(e) = self.records.store.leave_node(id) {
            tracing::warn!(node = id, error = %e, "removing a lost node's record");
        }
        // Ours to claim now, if any came here.
        self.claim_placed_agents();
    }

    /// What moves off lost node `lost` (module docs), parents first: each
    /// queued agent of this tenant, and each that ran whose policy resumes
    /// it, with the live node that takes it. One that no live node can take
    /// is left out (it ends lost), and so is a child whose parent ran on the
    /// lost node and does not move.
    fn placing_for(&self, lost: &str) -> Result<Vec<Placing>, StoreError> {
        let mut agents: Vec<Agent> = self
            .records
            .store
            .unfinished_of(&[lost.to_owned(), placed_on(lost)])?
            .into_iter()
            .filter(|a| a.tenant == self.records.tenant)
            .collect();
        if agents.is_empty() {
            return Ok(Vec::new());
        }
        agents.sort_by(|a, b| (a.depth, &a.name).cmp(&(b.depth, &b.name)));
        let mut nodes: Vec<Node> = self
            .live_nodes()?
            .into_iter()
            .filter(|n| n.id != lost)
            .collect();
        let jobs = self.records.store.jobs(&self.records.tenant)?;
        let operator = self.operator_policy();
        let mut out: Vec<Placing> = Vec::new();
        for a in &agents {
            let queued = a.status == Status::Queued;
            let resumes = matches!(a.status, Status::Running | Status::Blocked)
                && super::restart::resumes(a, &jobs, &operator);
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
            let Some(to) = self.node_for(a, parent_to, &nodes)? else {
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
                let events = vec![super::restart::resume_event(a, &run)];
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
    ) -> Result<Option<String>, StoreError> {
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let labels: BTreeMap<String, String> =
            serde_json::from_value(spec["placement"].clone()).unwrap_or_default();
        if !labels.is_empty() {
            return Ok(super::placement::choose(nodes, &labels, &self.host.me));
        }
        if parent_to.is_some() {
            return Ok(parent_to);
        }
        if let Some(p) = &a.parent
            && let Some(pa) = self.records.store.agent(&self.records.tenant, p)?
        {
            let host = placed_for(&pa.supervisor).unwrap_or(&pa.supervisor);
            if nodes.iter().any(|n| n.id == host) {
                return Ok(Some(host.to_owned()));
            }
        }
        Ok(super::placement::choose(
            nodes,
            &BTreeMap::new(),
            &self.host.me,
        ))
    }

    /// A claimed agent: whether its run is one a node's loss (or any resume)
    /// started again, and, if so, its children that loss ended lost, to be
    /// told to it once it runs (as after a restart). The loss writes their
    /// ends and the new run in one transaction, at one time: a child ended
    /// at the new run's creation was ended by it.
    pub(super) fn moved_run(&mut self, a: &Agent) -> bool {
        let store = &self.records.store;
        let Ok(Some(run)) = store.run(&self.records.tenant, &a.run) else {
            return false;
        };
        if run.seq <= 1 {
            return false;
        }
        let lost = Status::Ended(Terminal::Failed(FailReason::Lost));
        match store.children(&self.records.tenant, &a.name) {
            Ok(kids) => {
                for k in kids
                    .into_iter()
                    .filter(|k| k.status == lost && k.updated_ms == run.created_ms)
                {
                    self.restart.tell_later(a.name.clone(), k);
                }
            }
            Err(e) => {
                tracing::warn!(agent = %a.name, error = %e, "reading a moved agent's children")
            }
        }
        true
    }

    /// Before any command: a node whose last heartbeat went through longer
    /// ago than half its expiry (it was paused, or cut off) may have been
    /// declared lost meanwhile; it heartbeats first, and finding its record
    /// gone lets go of what moved away and stops what ended, before it acts
    /// for any agent.
    pub(super) fn fence_if_stale(&mut self) {
        let Some(expiry) = self.host.cfg.node.as_ref().map(|n| n.expiry) else {
            return;
        };
        let Some(ok) = self.restart.beat.ok else {
            return;
        };
        let stale = ok.elapsed() > expiry / 2;
        let tried_lately = self
            .restart
            .beat
            .tried
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
        if stale && !tried_lately {
            self.restart.beat.tried = Some(Instant::now());
            self.heartbeat();
        }
    }

    /// The live agents whose record moved to another node (another run, or
    /// another host) while this node was declared lost: their processes are
    /// killed and their entries dropped, and nothing is written, since the
    /// record is the new run's.
    pub(super) fn let_go_moved(&mut self) {
        let me = self.host.me.clone();
        let moved: Vec<AgentName> = self
            .agents
            .live
            .iter()
            .filter(|(n, l)| {
                self.records
                    .store
                    .agent(&self.records.tenant, n)
                    .ok()
                    .flatten()
                    .is_some_and(|a| {
                        !a.status.is_finished() && (a.run != l.run || a.supervisor != me)
                    })
            })
            .map(|(n, _)| n.clone())
            .collect();
        if moved.is_empty() {
            return;
        }
        tracing::warn!(
            agents = moved.len(),
            "this node was declared lost; letting go of the agents that moved to other nodes"
        );
        for n in moved {
            self.let_go(&n);
        }
    }

    /// Kills `name`'s processes (its group, which holds its subtree here)
    /// and drops its entry, writing nothing.
    fn let_go(&mut self, name: &AgentName) {
        self.sockets.close(name);
        let Some(l) = self.forget(name) else {
            return;
        };
        match (l.group, self.launcher.cgroups.clone()) {
            (Some(g), Some(cg)) => {
                let grace = self.host.cfg.grace;
                tokio::spawn(async move {
                    if let Err(e) = super::stops::empty_group(&cg, &g, grace, true).await {
                        tracing::error!(group = %g.dir.display(), error = %e, "emptying a moved agent's group");
                    }
                });
            }
            _ => {
                if let Some(p) = l.pid {
                    // SAFETY: signalling a process group this supervisor made.
                    unsafe { libc::killpg(p, libc::SIGKILL) };
                }
            }
        }
    }
}
