//! Placement across the nodes of a cluster (issue 15, docs/many-nodes.md).
//! An agent runs on its parent's node unless its request names labels; then
//! on the live node whose labels include them with the most free capacity.
//! The node a request reaches admits it (the quotas are the store's, exact
//! from any node) and records it `queued` for its host, as
//! `brood_store::placed_on(host)`; the host claims it (`claim_placed`: `FOR
//! UPDATE SKIP LOCKED` on PostgreSQL), when the admitting node's news wakes
//! it or at its next tick, projects it and starts it as if it had admitted
//! it itself (the claim is this part's; the hosting, a live entry made and
//! queued for a slot, is the loop's: `route::cluster`). What a lost node
//! queued, and what it ran that resumes, is placed again on live nodes
//! (`moved`).

use std::collections::BTreeMap;

use brood_core::{AgentName, Code, FailReason, Status, Terminal};
use brood_store::{Agent, Node, placed_for};
use serde_json::Value;

use super::{Cluster, Env, NodeFollow};
use crate::api::{ApiError, internal};

/// Claimed at most this many at a time (the rest at the next look).
const CLAIM_BATCH: u32 = 64;

impl Cluster {
    /// Where a new agent runs: `None` here, `Some(node)` on another node.
    /// Labels choose among the live nodes; without them a child goes where
    /// its parent runs (`parent`: the parent's record when it does not run
    /// here).
    pub(in crate::supervisor) fn place(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        remote_parent: Option<&Agent>,
        env: &Env,
    ) -> Result<Option<String>, ApiError> {
        if let Some(labels) = labels {
            if self.node.is_none() {
                return Err(ApiError::new(
                    Code::BadRequest,
                    "placement: this supervisor is not a node of a cluster (start it with `brood serve` on a shared store)",
                ));
            }
            let nodes = self.live_nodes(env).map_err(internal)?;
            let host = choose(&nodes, labels, &self.me).ok_or_else(|| {
                ApiError::new(
                    Code::Unavailable,
                    format!(
                        "placement: no live node has the labels {} and free capacity",
                        serde_json::to_string(labels).unwrap_or_default()
                    ),
                )
            })?;
            return Ok((host != self.me).then_some(host));
        }
        let Some(parent) = remote_parent else {
            return Ok(None);
        };
        if self.node.is_none() {
            return Ok(None);
        }
        // The parent's node, when it is a live node of the cluster (an
        // unclaimed parent's future node too); otherwise here, as before.
        let host = placed_for(&parent.supervisor).unwrap_or(&parent.supervisor);
        let live = self.live_nodes(env).map_err(internal)?;
        Ok((host != self.me && live.iter().any(|n| n.id == host)).then(|| host.to_owned()))
    }

    /// The registered nodes whose heartbeat is within the expiry, on the
    /// store's clock (as `declare_lost_nodes` judges it: issue 28).
    pub(super) fn live_nodes(&self, env: &Env) -> Result<Vec<Node>, brood_store::StoreError> {
        let expiry = self.node.as_ref().map_or(i64::MAX, |n| {
            i64::try_from(n.expiry.as_millis()).unwrap_or(i64::MAX)
        });
        Ok(env
            .store
            .nodes()?
            .into_iter()
            .filter(|n| n.heartbeat_age_ms <= expiry)
            .collect())
    }

    /// The agents other nodes placed here, claimed, to be hosted (or, when
    /// their stop was recorded before the claim, ended: nothing runs for
    /// them). Each tick and whenever another node's news arrives.
    pub(super) fn claim(&self, env: &Env) -> Vec<NodeFollow> {
        if self.node.is_none() {
            return Vec::new();
        }
        let claimed = match env.store.claim_placed(env.tenant, &self.me, CLAIM_BATCH) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "claiming the agents placed on this node");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        // A full batch may have more behind it (a lost node's agents moved
        // here at once): the next batch is claimed as the next command, so
        // the loop answers others in between rather than waiting a tick.
        if claimed.len() == CLAIM_BATCH as usize {
            out.push(NodeFollow::ClaimMore);
        }
        for a in claimed {
            if let Status::Stopping(outcome) = a.status {
                out.push(NodeFollow::EndWithoutProcess {
                    agent: a,
                    outcome,
                    detail: "its stop was recorded before its node claimed it".into(),
                });
                continue;
            }
            out.push(NodeFollow::Host(a));
        }
        out
    }

    /// A claimed agent whose hosting failed on a store call (`why`): not
    /// ended for it (issue 28: an error is never a fact), hosted again at
    /// the next tick ([`Self::host_again`]). Its record stays this node's
    /// and queued meanwhile, which the check of records without agents
    /// leaves alone.
    pub(in crate::supervisor) fn host_later(
        &mut self,
        name: AgentName,
        why: &brood_store::StoreError,
    ) {
        tracing::warn!(agent = %name, error = %why, "hosting an agent placed on this node: the store failed; trying again at the next tick");
        self.to_host.insert(name);
    }

    /// The claimed agents whose hosting failed on a store call, each from
    /// its record read now: hosted if still queued here, ended if its stop
    /// was recorded meanwhile, forgotten if it is no longer this node's
    /// (moved, ended); kept for the next tick if the read fails too.
    pub(super) fn host_again(&mut self, env: &Env) -> Vec<NodeFollow> {
        let mut out = Vec::new();
        for name in std::mem::take(&mut self.to_host) {
            match env.store.agent(env.tenant, &name) {
                Ok(Some(a)) if a.supervisor == self.me && a.status == Status::Queued => {
                    out.push(NodeFollow::Host(a));
                }
                Ok(Some(a)) if a.supervisor == self.me => {
                    if let Status::Stopping(outcome) = a.status {
                        out.push(NodeFollow::EndWithoutProcess {
                            agent: a,
                            outcome,
                            detail: "its stop was recorded before its node could host it".into(),
                        });
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "reading an agent this node could not host yet");
                    self.to_host.insert(name);
                }
            }
        }
        out
    }

    /// A claimed agent this node could not host (`why`): ended lost, since
    /// the node it was placed on could not start it.
    pub(in crate::supervisor) fn not_hosted(
        &self,
        name: &AgentName,
        why: &ApiError,
        env: &Env,
    ) -> Vec<NodeFollow> {
        tracing::error!(agent = %name, error = %why.message, "starting an agent placed on this node");
        let a = match env.store.agent(env.tenant, name) {
            Ok(Some(a)) => a,
            _ => return Vec::new(),
        };
        vec![NodeFollow::EndWithoutProcess {
            agent: a,
            outcome: Terminal::Failed(FailReason::Lost),
            detail: format!(
                "the node it was placed on could not start it: {}",
                why.message
            ),
        }]
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
pub(in crate::supervisor) fn stored_launch(spec: &Value) -> (Vec<String>, Option<String>) {
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
