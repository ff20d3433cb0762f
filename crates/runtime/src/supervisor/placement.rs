//! Placement across the nodes of a cluster (issue 15, docs/many-nodes.md).
//! An agent runs on its parent's node unless its request names labels; then
//! on the live node whose labels include them with the most free capacity.
//! The node a request reaches admits it (the quotas are the store's, exact
//! from any node) and records it `queued` for its host, as
//! `brood_store::placed_on(host)`; the host claims it (`claim_placed`: `FOR
//! UPDATE SKIP LOCKED` on PostgreSQL), when the admitting node's news wakes
//! it or at its next tick, projects it and starts it as if it had admitted
//! it itself. What a lost node queued, and what it ran that resumes, is
//! placed again on live nodes (`moved`).

use std::collections::BTreeMap;

use brood_store::{Node, placed_for};

use super::{Dispatcher, Live, Pending, stored_policy};
use crate::api::ApiError;
use crate::api::internal;
use brood_core::Code;
use brood_core::FailReason;
use brood_core::SessionName;
use brood_core::Status;
use brood_core::Terminal;
use brood_launch::cgroup::Group;
use brood_store::Agent;
use serde_json::Value;
use std::path::PathBuf;

/// Claimed at most this many at a time (the rest at the next look).
const CLAIM_BATCH: u32 = 64;

impl Dispatcher {
    /// Where a new agent runs: `None` here, `Some(node)` on another node.
    /// Labels choose among the live nodes; without them a child goes where
    /// its parent runs (`parent`: the parent's record when it does not run
    /// here).
    pub(super) fn place(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        remote_parent: Option<&Agent>,
    ) -> Result<Option<String>, ApiError> {
        if let Some(labels) = labels {
            if self.host.cfg.node.is_none() {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "placement: this supervisor is not a node of a cluster (start it with `brood serve` on a shared store)",
                ));
            }
            let nodes = self.live_nodes().map_err(internal)?;
            let host = choose(&nodes, labels, &self.host.me).ok_or_else(|| {
                ApiError::new(
                    Code::Unavailable,
                    format!(
                        "placement: no live node has the labels {} and free capacity",
                        serde_json::to_string(labels).unwrap_or_default()
                    ),
                )
            })?;
            return Ok((host != self.host.me).then_some(host));
        }
        let Some(parent) = remote_parent else {
            return Ok(None);
        };
        if self.host.cfg.node.is_none() {
            return Ok(None);
        }
        // The parent's node, when it is a live node of the cluster (an
        // unclaimed parent's future node too); otherwise here, as before.
        let host = placed_for(&parent.supervisor).unwrap_or(&parent.supervisor);
        let live = self.live_nodes().map_err(internal)?;
        Ok((host != self.host.me && live.iter().any(|n| n.id == host)).then(|| host.to_owned()))
    }

    /// The registered nodes whose heartbeat is within the expiry, on the
    /// store's clock (as `declare_lost_nodes` judges it: issue 28).
    pub(super) fn live_nodes(&self) -> Result<Vec<Node>, brood_store::StoreError> {
        let expiry = self.host.cfg.node.as_ref().map_or(i64::MAX, |n| {
            i64::try_from(n.expiry.as_millis()).unwrap_or(i64::MAX)
        });
        Ok(self
            .records
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.heartbeat_age_ms <= expiry)
            .collect())
    }

    /// The agents other nodes placed here, claimed and started (or, when
    /// their stop was recorded before the claim, ended: nothing runs for
    /// them). Each tick and whenever another node's news arrives.
    pub(super) fn claim_placed_agents(&mut self) {
        if self.host.cfg.node.is_none() {
            return;
        }
        let claimed =
            match self
                .records
                .store
                .claim_placed(&self.records.tenant, &self.host.me, CLAIM_BATCH)
            {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming the agents placed on this node");
                    return;
                }
            };
        // A full batch may have more behind it (a lost node's agents moved
        // here at once): the next batch is claimed as the next command, so
        // the loop answers others in between rather than waiting a tick.
        if claimed.len() == CLAIM_BATCH as usize {
            let _ = self.host.tx.send(super::Cmd::News);
        }
        for a in claimed {
            if let Status::Stopping(outcome) = a.status {
                self.end_without_process(
                    &a,
                    outcome,
                    "its stop was recorded before its node claimed it".into(),
                );
                continue;
            }
            let name = a.name.clone();
            if let Err(e) = self.host_claimed(a) {
                tracing::error!(agent = %name, error = %e.message, "starting an agent placed on this node");
                let a = match self.records.store.agent(&self.records.tenant, &name) {
                    Ok(Some(a)) => a,
                    _ => continue,
                };
                self.end_without_process(
                    &a,
                    Terminal::Failed(FailReason::Lost),
                    format!(
                        "the node it was placed on could not start it: {}",
                        e.message
                    ),
                );
            }
        }
    }

    /// A claimed agent, hosted here from its record as if admitted here: its
    /// files projected, its live entry made, queued for a slot.
    fn host_claimed(&mut self, a: Agent) -> Result<(), ApiError> {
        let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
        let policy = stored_policy(&spec, &self.operator_policy())?;
        let parent_live: Option<(Option<Group>, SessionName)> = match &a.parent {
            Some(p) => match self.agents.live.get(p) {
                Some(l) => Some((l.group.clone(), l.session.clone())),
                None => self
                    .records
                    .store
                    .agent(&self.records.tenant, p)
                    .map_err(internal)?
                    .map(|pa| (None, pa.session)),
            },
            None => None,
        };
        let (argv, cwd) = stored_launch(&spec);
        self.project_admitted(
            &a,
            &policy,
            &spec,
            parent_live.as_ref().map(|(_, s)| s),
            policy.uid,
        );
        // A run a loss moved here is no new creation of its parent's.
        let moved = self.moved_run(&a);
        if !moved && let Some(pl) = a.parent.as_ref().and_then(|p| self.agents.live.get_mut(p)) {
            pl.creates_used += 1;
        }
        let parent_pair = a
            .parent
            .clone()
            .zip(parent_live.as_ref().map(|(_, s)| s.clone()));
        // A resumed run's instruction is the input its resume recorded.
        let instruction = self
            .records
            .store
            .messages(&self.records.tenant, &a.name, &a.session)
            .map_err(internal)?
            .into_iter()
            .rev()
            .find(|m| m.run == a.run && m.role == "user")
            .map(|m| m.content);
        let secrets = self.claimed_secrets(&a, &policy);
        let mut live = Live::new(
            a.run.clone(),
            a.session.clone(),
            parent_pair,
            a.protocol,
            policy,
            instruction,
        );
        live.secrets = secrets;
        live.iso_ns = spec["iso"] == "ns";
        live.ns_root = spec["root"].as_str().map(PathBuf::from);
        live.ready_news = spec["ready_news"]
            .as_str()
            .filter(|n| *n != self.host.me)
            .map(str::to_owned);
        // Its budget covers what it and its subtree spent in earlier runs.
        live.subtree_usd = self
            .records
            .store
            .spend(&self.records.tenant, &a.name)
            .map(|s| s.subtree.cost_usd)
            .map_err(internal)?;
        live.pending = Some(Pending {
            argv,
            cwd,
            group_parent: parent_live.and_then(|(g, _)| g),
            admitted: None,
        });
        tracing::info!(agent = %a.name, "claimed an agent placed on this node");
        self.agents.live.insert(a.name.clone(), Box::new(live));
        // A child whose parent was claimed here but has no process yet
        // (both moved off a lost node) waits for it: its group is made in
        // the parent's.
        match a.parent.as_ref().filter(|p| {
            self.agents
                .live
                .get(*p)
                .is_some_and(|l| l.pid.is_none() && l.stopping.is_none())
        }) {
            Some(p) => self.restart.hold(p.clone(), a.name),
            None => self.launcher.waiting.push(a.name),
        }
        Ok(())
    }
}

/// The node for `labels`: every label matched, free capacity (a node
/// without a capacity has no limit), the most free first; `me` on a tie,
/// then the lowest id, so one request is placed the same way by any node.
pub(super) fn choose(
    nodes: &[Node],
    labels: &BTreeMap<String, String>,
    me: &str,
) -> Option<String> {
    nodes
        .iter()
        .filter(|n| {
            let have: BTreeMap<String, String> =
                serde_json::from_str(&n.labels).unwrap_or_default();
            labels.iter().all(|(k, v)| have.get(k) == Some(v))
        })
        .filter_map(|n| {
            let free = match n.capacity {
                None => u64::MAX,
                Some(c) => u64::from(c.saturating_sub(n.live_agents)),
            };
            (free > 0).then_some((free, n.id != me, &n.id))
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(b.2.cmp(a.2)))
        .map(|(_, _, id)| id.clone())
}

/// The program and working directory a record's spec says to start.
pub(super) fn stored_launch(spec: &Value) -> (Vec<String>, Option<String>) {
    let argv = spec["argv"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (argv, spec["cwd"].as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, labels: &str, capacity: Option<u32>, live: u32) -> Node {
        Node {
            id: id.into(),
            address: String::new(),
            labels: labels.into(),
            capacity,
            started_ms: 0,
            heartbeat_ms: 0,
            heartbeat_age_ms: 0,
            live_agents: live,
        }
    }

    #[test]
    fn the_most_free_node_with_every_label_is_chosen() {
        let nodes = [
            node("a", r#"{"gpu":"yes","zone":"1"}"#, Some(4), 3),
            node("b", r#"{"gpu":"yes","zone":"2"}"#, Some(4), 1),
            node("c", r#"{"zone":"2"}"#, None, 0),
            node("d", r#"{"gpu":"yes"}"#, Some(2), 2),
        ];
        let want = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert_eq!(
            choose(&nodes, &want("gpu", "yes"), "z").as_deref(),
            Some("b")
        );
        // No capacity is no limit.
        assert_eq!(
            choose(&nodes, &want("zone", "2"), "z").as_deref(),
            Some("c")
        );
        // A full node is never chosen, whatever else matches.
        assert_eq!(
            choose(&nodes[3..], &want("gpu", "yes"), "z"),
            None,
            "d is full"
        );
        assert_eq!(choose(&nodes, &want("gpu", "no"), "z"), None);
        // On a tie, here; then the lowest id.
        let tie = [node("x", "{}", Some(2), 0), node("y", "{}", Some(2), 0)];
        assert_eq!(choose(&tie, &BTreeMap::new(), "y").as_deref(), Some("y"));
        assert_eq!(choose(&tie, &BTreeMap::new(), "z").as_deref(), Some("x"));
    }
}
