//! The attenuation check of SPEC 5: a child never holds more than its parent.
//!
//! [`check`] compares a child's effective policy with its parent's and the
//! parent's live state ([`ParentView`]: budget left, creates used, deadline,
//! now). It runs the checks in a fixed order, stops at the first failure and
//! reports it as a [`Refusal`] with its own [`Code`]; the message names the field
//! and the value that went too far. [`derive`](fn@derive) builds the child's
//! policy from its request the way the runtime should, so that a child that asks
//! for nothing specific is admitted whenever its parent may create at all.
//!
//! # Order
//!
//! The order is part of the contract: a child failing several checks is refused
//! with the code of the earliest. SPEC 5 gives the order of the checks that have
//! codes; the fields SPEC 5 lists without a code of their own (`env`,
//! `secrets`, `resources`, `timeout_s`, and brood's `on_restart` and
//! `model_rate`) are reported as `PolicyExpansion` and run right
//! after the rules, so that all `PolicyExpansion` checks are together and the
//! codes appear in the order [`Code`] declares them.
//!
//! | # | field | code | a child's value must be |
//! | --- | --- | --- | --- |
//! | 1 | `uid`, `gid` | `IdentityExpansion` | equal to the parent's |
//! | 2 | `groups` | `GroupExpansion` | a subset |
//! | 3 | `rules` | `PolicyExpansion` | each covered by one parent rule ([`Rule::covers`](crate::policy::Rule::covers)) |
//! | 4 | `env` | `PolicyExpansion` | a subset, names and values |
//! | 4a | `secrets` | `PolicyExpansion` | a subset of the names (issue 25: the values are the parent's) |
//! | 5 | `resources` | `PolicyExpansion` | each limit no higher (`None` is no limit) |
//! | 5a | `model_rate` | `PolicyExpansion` | each limit no higher (`None` is no limit) |
//! | 6 | `timeout_s` | `PolicyExpansion` | ending by the parent's deadline, and no longer than the parent's own `timeout_s` |
//! | 6a | `on_restart` | `PolicyExpansion` | `cancel`, or `resume` only under a parent holding `resume` |
//! | 7 | `tools` | `ToolExpansion` | a subset (`None`, every tool, only under `None`) |
//! | 8 | `files` | `FileExpansion` | at every path, a mode no higher |
//! | 9 | `mounts` | `MountExpansion` | each entry the parent's entry at the same target, narrowed |
//! | 10 | `network` | `NetworkExpansion` | no wider (`none < connect(S) < all`, `S` a subset) |
//! | 11 | `models` | `ModelExpansion` | a subset (`None`, any model, only under `None`) |
//! | 12 | `path` | `ToolPathExpansion` | the parent's tiers with some removed, order kept |
//! | 13 | `window` | `WindowUnknown`, `WindowExpansion` | see below |
//! | 14 | `cost_limit` | `BudgetExceeded` | see below |
//! | 15 | `depth_limit` | `DepthLimit` | less than the parent's (any under `None`) |
//! | 16 | `create_limit` | `CreateLimit` | the parent has creates left, and the child's is at most that many |
//!
//! Name, parent, lifecycle (before) and quotas, cycles and name collisions
//! (after) are the runtime's checks around this one.
//!
//! # Decisions
//!
//! - **window.** SPEC 5: "at most the parent's effective window; creation fails
//!   closed when either bound is unknown". Both known: the child's must be no
//!   larger (`WindowExpansion`). Exactly one known: `WindowUnknown`, since the
//!   child's bound cannot be shown to lie within the parent's. Neither known:
//!   admitted, because the child then claims nothing about a window (it is left
//!   to whatever model it runs), and refusing would make every child of an
//!   operator's root (whose window is unknown) impossible.
//! - **cost_limit.** A child that names a limit reserves it, so the limit must be
//!   at most the parent's remaining budget ([`ParentView::budget_remaining`]) and
//!   at most the parent's own `cost_limit` (so a caller that forgets to pass the
//!   remaining budget still cannot hand out more than the parent has). A child
//!   without a limit of its own (`None`) is admitted: it reserves nothing and
//!   spends from its parent's budget, which is safe because spend rolls up
//!   (SPEC 9), so the parent's limit bounds it. Refusing `None` under a limited
//!   parent would refuse every child that simply inherits its policy.
//! - **create_limit.** "Remaining creates" are the parent's `create_limit` less
//!   the children it has already created, counting this one as not yet created.
//! - **timeout_s.** A child with no timeout under a parent with a deadline or a
//!   timeout is refused: an unlimited run could outlast the parent's.
//! - **env.** Values are compared but never shown in a refusal: they are often
//!   secrets.

use std::fmt;

use crate::code::Code;
use crate::policy::{Policy, PolicyRequest, effective};

mod fields;
use fields::*;

/// What the check needs to know about the parent at the moment of creation.
#[derive(Debug, Clone, Copy)]
pub struct ParentView<'a> {
    /// The parent's effective policy.
    pub policy: &'a Policy,
    /// Dollars neither spent nor reserved; `None` is unlimited.
    pub budget_remaining: Option<f64>,
    /// Children the parent has created so far (not counting this one).
    pub creates_used: u32,
    /// When the parent's current run must end, in Unix seconds; `None` is none.
    pub deadline_unix_s: Option<u64>,
    /// The time of the check, in Unix seconds (the caller owns the clock).
    pub now_unix_s: u64,
}

/// A refused creation: the code programs match on and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Refusal {}

fn refuse(code: Code, message: String) -> Result<(), Refusal> {
    Err(Refusal { code, message })
}

/// The child's policy as the runtime should derive it: [`effective`], and then,
/// for the two fields that depend on the parent's live state and that the
/// request leaves out, what the parent has left: `create_limit` becomes the
/// parent's remaining creates, and `timeout_s` is cut to the time left before
/// the parent's deadline (at least 1 s, so a parent past its deadline is
/// refused by [`check`] rather than given a meaningless 0). Fields the request
/// gives are kept as asked, for [`check`] to judge.
pub fn derive(parent: &ParentView<'_>, req: &PolicyRequest) -> Policy {
    let mut child = effective(parent.policy, req);
    if req.create_limit.is_none()
        && let Some(n) = parent.policy.create_limit
    {
        child.create_limit = Some(n.saturating_sub(parent.creates_used));
    }
    if req.timeout_s.is_none()
        && let Some(deadline) = parent.deadline_unix_s
    {
        let left = deadline.saturating_sub(parent.now_unix_s).max(1);
        child.timeout_s = Some(child.timeout_s.map_or(left, |t| t.min(left)));
    }
    child
}

/// Checks that `child` (a normalised effective policy) is within the parent, in
/// the order of the module docs; the first failure is the answer.
pub fn check(parent: &ParentView<'_>, child: &Policy) -> Result<(), Refusal> {
    let p = parent.policy;
    identity(p, child)?;
    groups(p, child)?;
    rules(p, child)?;
    env(p, child)?;
    secrets(p, child)?;
    resources(p, child)?;
    model_rate(p, child)?;
    timeout(parent, child)?;
    on_restart(p, child)?;
    tools(p, child)?;
    files(p, child)?;
    mounts(p, child)?;
    network(p, child)?;
    models(p, child)?;
    path(p, child)?;
    window(p, child)?;
    budget(parent, child)?;
    depth(p, child)?;
    create_limit(parent, child)
}

#[cfg(test)]
mod tests;
