//! Where a run's secret values come from (issue 25, docs/security.md
//! "Secrets"). A policy's `secrets` holds names only; the values live in the
//! live entry ([`Live::secrets`]) and in the agent's environment, and are
//! written nowhere. A root's come from the caller that starts the run (its
//! creation or a resume), a child's from its parent's live values, never
//! from anyone else. A run hosted on another node of a cluster gets them
//! only when that node runs the parent too; a root's values given here stay
//! here. Every refusal names the secret and never shows a value.
//!
//! The live set's own questions ([`Agents`]): where the values live is
//! where they are read.

use brood_api::Secrets;

use brood_core::policy::Policy;
use brood_core::{AgentName, Code};
use brood_store::Agent;

use super::agents::Agents;
use crate::api::{ApiError, SpawnRequest};

fn bad(msg: String) -> ApiError {
    ApiError::new(Code::BadRequest, msg)
}

/// A resume's values that do not match the agent's policy: a well-formed
/// request that the agent, as it is, refuses (409, as a resume of an
/// unfinished agent is).
fn conflict(msg: String) -> ApiError {
    ApiError::new(Code::Conflict, msg)
}

/// What a root needs of its caller, for a refusal's hint.
fn give_again(k: &str) -> String {
    format!("`--secret {k}`, or `secrets` in the request")
}

impl Agents {
    /// The secret values a new agent starts with: for a root those its
    /// caller gave (one for every name of its policy), for a child its
    /// parent's (a child given values is refused: it gets its parent's,
    /// never new ones). `host` is the node admission chose: values given or
    /// held here cannot follow an agent placed on another node, except a
    /// child's, when that node runs its parent too (it fills them in when
    /// it claims the child).
    pub(super) fn admitted_secrets(
        &self,
        me: &str,
        policy: &Policy,
        parent: Option<&AgentName>,
        remote: Option<&Agent>,
        host: &str,
        req: &SpawnRequest,
    ) -> Result<Secrets, ApiError> {
        let here = host == me;
        let placed_away = |k: &str| {
            bad(format!(
                "placement: the agent holds secret {k}, whose value is held by the node it \
                 was given to, {}; an agent holding secrets runs there (leave out placement)",
                me
            ))
        };
        let Some(p) = parent else {
            if let Some(k) = req.secrets.missing(&policy.secrets) {
                return Err(bad(format!(
                    "secrets.{k}: no value given; a root's secret values come from whoever \
                     starts it ({})",
                    give_again(k)
                )));
            }
            if let (false, Some(k)) = (here, policy.secrets.first()) {
                return Err(placed_away(k));
            }
            return Ok(req.secrets.only(&policy.secrets));
        };
        if let Some(k) = req.secrets.names().next() {
            return Err(bad(format!(
                "secrets.{k}: a child's secret values are its parent's, never given anew; \
                 name {k} in its policy's secrets instead (a policy that leaves secrets out \
                 inherits the parent's)"
            )));
        }
        let Some(k) = policy.secrets.first() else {
            return Ok(Secrets::new());
        };
        match (remote, self.live.get(p)) {
            (None, Some(l)) => {
                let values = l.secrets.only(&policy.secrets);
                if let Some(k) = values.missing(&policy.secrets) {
                    return Err(ApiError::new(
                        Code::PolicyExpansion,
                        format!("secrets.{k}: the parent {p} holds no value of {k}"),
                    ));
                }
                if !here {
                    return Err(placed_away(k));
                }
                Ok(values)
            }
            (Some(pa), _) => {
                let parents = brood_store::placed_for(&pa.supervisor).unwrap_or(&pa.supervisor);
                if host == parents {
                    Ok(Secrets::new())
                } else {
                    Err(ApiError::new(
                        Code::PolicyExpansion,
                        format!(
                            "secrets.{k}: the parent {p} runs on {parents}, which holds its \
                             secrets' values; a child holding secrets runs on its parent's node"
                        ),
                    ))
                }
            }
            (None, None) => Err(ApiError::new(
                Code::ParentMismatch,
                format!("parent {p} has no live process here"),
            )),
        }
    }

    /// The secret values of a resumed run of `a`: a root's given again by
    /// its caller (each name of its policy, and no other: the policy does
    /// not change on resume), a child's from its parent when the parent
    /// lives here (on another node, the node that claims it fills them in).
    pub(super) fn resumed_secrets(
        &self,
        a: &Agent,
        policy: &Policy,
        given: &Secrets,
    ) -> Result<Secrets, ApiError> {
        let name = &a.name;
        let Some(p) = &a.parent else {
            if let Some(k) = given.names().find(|k| !policy.secrets.contains(*k)) {
                return Err(conflict(format!(
                    "secrets.{k}: the policy of {name} names no secret {k} (a resume keeps the policy)"
                )));
            }
            if let Some(k) = given.missing(&policy.secrets) {
                return Err(conflict(format!(
                    "secrets.{k}: the policy of {name} names secret {k}, whose value is not kept \
                     once a run ends; give it again ({})",
                    give_again(k)
                )));
            }
            return Ok(given.clone());
        };
        if let Some(k) = given.names().next() {
            return Err(conflict(format!(
                "secrets.{k}: {name} is a child: its secret values are its parent's, never given anew"
            )));
        }
        Ok(self
            .live
            .get(p)
            .map(|l| l.secrets.only(&policy.secrets))
            .unwrap_or_default())
    }

    /// The values a child placed on this node starts with: its parent's,
    /// when the parent lives here. None otherwise, and then its launch is
    /// refused naming the first secret without a value.
    pub(super) fn claimed_secrets(&self, a: &Agent, policy: &Policy) -> Secrets {
        a.parent
            .as_ref()
            .and_then(|p| self.live.get(p))
            .map(|l| l.secrets.only(&policy.secrets))
            .unwrap_or_default()
    }
}
