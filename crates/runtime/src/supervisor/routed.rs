//! What other nodes post for this one through the store (issue 15): inputs
//! for the agents it runs; the ends of their children that other nodes
//! ran, which the parent hears of here as if the child had run here (the
//! protocol's `child` event, its channel's `status`, `result.md` and
//! `refs.jsonl` in this node's ctx tree); and closes made through another
//! node of agents this node ran, shown in its ctx tree.

use super::*;

/// The sender of an inbox entry that is no input but news of a child's end:
/// its text names the child. No input's sender looks like it (`user:<uid>`
/// or an agent's name, which holds no `:`).
const CHILD_END: &str = "brood:child-end";

/// The sender of an inbox entry that tells an agent's host it was closed
/// through another node: the host's ctx tree shows it closed too.
const CLOSED: &str = "brood:closed";

impl Dispatcher {
    /// An input for an agent another node runs: posted in the store for its
    /// host, which delivers it when the news of this write reaches it.
    pub(super) fn route_input(&mut self, a: &Agent, from: &str, text: &str) -> ApiResult {
        let host = brood_store::placed_for(&a.supervisor).unwrap_or(&a.supervisor);
        let takes = a.protocol == Protocol::Brood
            && matches!(a.status, Status::Running | Status::Blocked)
            && self.cfg.node.is_some()
            && host_alive(host, &registered_nodes(self.store.as_ref()));
        if !takes {
            return Err(ApiError::new(
                Code::Conflict,
                format!(
                    "agent {} is {} on {host}; it takes no input there (resume it instead)",
                    a.name,
                    a.status.api_word()
                ),
            ));
        }
        self.store
            .post_input(&self.tenant, &a.name, host, from, text, now_ms())
            .map_err(internal)?;
        Ok(json!({"id": format!("routed-{}", a.run), "node": host}))
    }

    /// Inputs other nodes posted for agents running here, delivered.
    pub(super) fn deliver_routed_inputs(&mut self) {
        if self.cfg.node.is_none() {
            return;
        }
        let inputs = match self.store.take_inputs(&self.tenant, &self.me, 256) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "taking the inputs other nodes posted");
                return;
            }
        };
        for i in inputs {
            if i.sender == CHILD_END {
                self.on_child_end_elsewhere(&i.agent, &i.text);
                continue;
            }
            if i.sender == CLOSED {
                self.on_closed_elsewhere(&i.agent);
                continue;
            }
            if let Err(e) = self.deliver_input(&i.agent, &i.sender, &i.text) {
                tracing::warn!(agent = %i.agent, error = %e.message, "an input posted by another node was not delivered");
            }
        }
    }

    /// After a recorded end: a parent (or customer) that another node runs
    /// hears of it there, through the store.
    pub(super) fn tell_other_nodes_of_end(&mut self, agent: &Agent) {
        if self.cfg.node.is_none() {
            return;
        }
        let told: Vec<AgentName> = agent
            .parent
            .iter()
            .chain(agent.customer.iter())
            .filter(|p| !self.live.contains_key(*p))
            .cloned()
            .collect();
        for p in told {
            let Ok(Some(pa)) = self.store.agent(&self.tenant, &p) else {
                continue;
            };
            if !matches!(pa.status, Status::Running | Status::Blocked) || pa.supervisor == self.me {
                continue;
            }
            if let Err(e) = self.store.post_input(
                &self.tenant,
                &p,
                &pa.supervisor,
                CHILD_END,
                agent.name.as_str(),
                now_ms(),
            ) {
                tracing::warn!(agent = %agent.name, parent = %p, error = %e, "telling another node of a child's end");
            }
        }
    }

    /// A child another node ran ended: its parent (or customer) here hears
    /// of it as if it had run here. The artifacts' bytes stay in the child's
    /// node's blob store: the `child` event names them without content.
    fn on_child_end_elsewhere(&mut self, told: &AgentName, child: &str) {
        let Ok(child) = AgentName::new(child) else {
            tracing::warn!(agent = %told, "a child's end named no valid agent");
            return;
        };
        let a = match self.store.agent(&self.tenant, &child) {
            Ok(Some(a)) if a.status.is_finished() => a,
            _ => return,
        };
        let channel = a
            .parent
            .as_ref()
            .and_then(|p| self.store.channel(&self.tenant, p, &child).ok().flatten());
        let result = channel.as_ref().and_then(|c| c.result.clone());
        let refs = channel
            .as_ref()
            .and_then(|c| c.refs.clone())
            .unwrap_or_default();
        let artifacts = channel.map(|c| c.artifacts).unwrap_or_default();
        let h = crate::channel::Harvest {
            pack_refs: refs
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .collect(),
            pack_artifacts: artifacts
                .iter()
                .map(|x| json!({"name": x.name, "sha256": x.sha256, "size": x.size}))
                .collect(),
            output: brood_store::ChannelOutput { refs, artifacts },
        };
        if a.parent.as_ref() == Some(told) {
            self.project_channel(&a, result.as_deref());
            if let Some(dir) = self.channel_dir_of(&a) {
                self.projection
                    .write(dir.join("refs.jsonl"), h.output.refs.clone());
            }
        }
        self.tell_of_end(told, &a, result.as_deref(), Some(&h));
    }

    /// After a close through this node: the agent's host, when another node,
    /// shows it closed in its own ctx tree too (the store has it already).
    pub(super) fn tell_host_of_close(&mut self, a: &Agent) {
        if self.cfg.node.is_none() {
            return;
        }
        let host = brood_store::placed_for(&a.supervisor).unwrap_or(&a.supervisor);
        if host == self.me.as_str() || !host_alive(host, &registered_nodes(self.store.as_ref())) {
            return;
        }
        if let Err(e) = self
            .store
            .post_input(&self.tenant, &a.name, host, CLOSED, "", now_ms())
        {
            tracing::warn!(agent = %a.name, host, error = %e, "telling an agent's node of its close");
        }
    }

    /// An agent this node ran was closed through another node: its `close`
    /// event and its status files here, as the close would have written them.
    fn on_closed_elsewhere(&mut self, name: &AgentName) {
        let a = match self.store.agent(&self.tenant, name) {
            Ok(Some(a)) if matches!(a.status, Status::Closed(_)) => a,
            _ => return,
        };
        let close = ev(
            name,
            Some(&a.run),
            &a.session,
            AgentEvent::Close {
                agent: name.clone(),
            },
        );
        self.project_events(&[close]);
        project_agent(&self.projection, &self.paths, &a, None);
    }
}
