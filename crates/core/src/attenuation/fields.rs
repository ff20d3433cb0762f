//! Each field's check of [`super::check`], in the order of the module docs
//! of [`super`]: the child's value against the parent's, a [`Refusal`] with
//! the field's code and a message naming the field and the value.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use super::{ParentView, Refusal, refuse};
use crate::code::Code;
use crate::policy::{Network, Policy};

pub(super) fn identity(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    for (field, child, parent) in [("uid", c.uid, p.uid), ("gid", c.gid, p.gid)] {
        if child != parent {
            return refuse(
                Code::IdentityExpansion,
                format!("{field}: {child} differs from the parent's {parent}"),
            );
        }
    }
    Ok(())
}

pub(super) fn groups(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    match c.groups.difference(&p.groups).next() {
        Some(g) => refuse(
            Code::GroupExpansion,
            format!("groups: {g} is not one of the parent's groups"),
        ),
        None => Ok(()),
    }
}

pub(super) fn rules(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    for (i, r) in c.rules.iter().enumerate() {
        if !p.rules.iter().any(|q| q.covers(r)) {
            return refuse(
                Code::PolicyExpansion,
                format!(
                    "rules[{i}]: {:?} is not covered by any rule of the parent",
                    r.to_text()
                ),
            );
        }
    }
    Ok(())
}

pub(super) fn env(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    for (k, v) in &c.env {
        match p.env.get(k) {
            None => {
                return refuse(
                    Code::PolicyExpansion,
                    format!("env.{k}: the parent does not pass {k}"),
                );
            }
            Some(pv) if pv != v => {
                return refuse(
                    Code::PolicyExpansion,
                    format!("env.{k}: the value differs from the parent's (values are not shown)"),
                );
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A child passes on only secrets its parent holds (their values are the
/// parent's, copied at launch); the names are compared, there are no values
/// in a policy to compare.
pub(super) fn secrets(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    match c.secrets.iter().find(|k| !p.secrets.contains(*k)) {
        Some(k) => refuse(
            Code::PolicyExpansion,
            format!("secrets.{k}: the parent holds no secret {k}"),
        ),
        None => Ok(()),
    }
}

/// A limit where `None` is "no limit": the child's must be no higher.
pub(super) fn no_higher(
    field: &str,
    child: Option<u64>,
    parent: Option<u64>,
) -> Result<(), Refusal> {
    match (child, parent) {
        (None, Some(p)) => refuse(
            Code::PolicyExpansion,
            format!("{field}: no limit, but the parent's is {p}"),
        ),
        (Some(c), Some(p)) if c > p => refuse(
            Code::PolicyExpansion,
            format!("{field}: {c} is more than the parent's {p}"),
        ),
        _ => Ok(()),
    }
}

pub(super) fn resources(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    let (pr, cr) = (&p.resources, &c.resources);
    no_higher("resources.memory_max", cr.memory_max, pr.memory_max)?;
    no_higher("resources.pids_max", cr.pids_max, pr.pids_max)?;
    no_higher("resources.cpu_weight", cr.cpu_weight, pr.cpu_weight)?;
    no_higher("resources.disk_max", cr.disk_max, pr.disk_max)
}

/// Each model rate limit no higher than the parent's (issue 31): a child
/// that asks for nothing inherits its parent's limits ([`crate::policy::effective`]),
/// so a limited parent never has an unlimited child.
pub(super) fn model_rate(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    let (pr, cr) = (&p.model_rate, &c.model_rate);
    no_higher(
        "model_rate.requests_per_minute",
        cr.requests_per_minute,
        pr.requests_per_minute,
    )?;
    no_higher(
        "model_rate.tokens_per_minute",
        cr.tokens_per_minute,
        pr.tokens_per_minute,
    )
}

pub(super) fn timeout(parent: &ParentView<'_>, c: &Policy) -> Result<(), Refusal> {
    if let Some(deadline) = parent.deadline_unix_s {
        let left = deadline.saturating_sub(parent.now_unix_s);
        match c.timeout_s {
            None => {
                return refuse(
                    Code::PolicyExpansion,
                    format!(
                        "timeout_s: none, but the parent's run must end in {left} s \
                         (at {deadline})"
                    ),
                );
            }
            Some(t) if parent.now_unix_s.saturating_add(t) > deadline => {
                return refuse(
                    Code::PolicyExpansion,
                    format!(
                        "timeout_s: {t} would end after the parent's run, which must end \
                         in {left} s (at {deadline})"
                    ),
                );
            }
            Some(_) => {}
        }
    }
    match (c.timeout_s, parent.policy.timeout_s) {
        (None, Some(p)) => refuse(
            Code::PolicyExpansion,
            format!("timeout_s: none, but the parent's is {p}"),
        ),
        (Some(t), Some(p)) if t > p => refuse(
            Code::PolicyExpansion,
            format!("timeout_s: {t} is longer than the parent's {p}"),
        ),
        _ => Ok(()),
    }
}

/// `tools` and `models` share their shape: a set where `None` is "all".
pub(super) fn named_subset(
    code: Code,
    field: &str,
    child: &Option<BTreeSet<String>>,
    parent: &Option<BTreeSet<String>>,
) -> Result<(), Refusal> {
    match (child, parent) {
        (_, None) => Ok(()),
        (None, Some(p)) => refuse(
            code,
            format!(
                "{field}: all (no list), but the parent holds only [{}]",
                p.iter().cloned().collect::<Vec<_>>().join(" ")
            ),
        ),
        (Some(c), Some(p)) => match c.difference(p).next() {
            Some(extra) => refuse(
                code,
                format!("{field}: {extra:?} is not granted to the parent"),
            ),
            None => Ok(()),
        },
    }
}

pub(super) fn tools(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    named_subset(Code::ToolExpansion, "tools", &c.tools, &p.tools)
}

pub(super) fn models(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    named_subset(Code::ModelExpansion, "models", &c.models, &p.models)
}

/// Compares modes only at the rule paths of both policies. That covers every
/// path: for a path `x`, let `q` be the deepest rule path of either policy that
/// is `x` or an ancestor of it. Ancestors of `x` form a chain, so every rule
/// path (of either policy) over `x` is also over `q`, and every rule path over
/// `q` is over `x`; hence each policy's deepest rule over `x` is its deepest
/// rule over `q`, and `mode_at(x) == mode_at(q)` for both. If there is no such
/// `q`, both modes at `x` are hidden, which is never an expansion. So the mode
/// is piecewise constant with boundaries at rule paths, and comparing at those
/// paths compares everywhere.
pub(super) fn files(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    for path in c.files.iter().chain(&p.files).map(|r| &r.path) {
        let (cm, pm) = (c.mode_at(path), p.mode_at(path));
        if cm > pm {
            return refuse(
                Code::FileExpansion,
                format!(
                    "files: {:?} would be {cm} for the child, the parent has it {pm}",
                    path.as_str()
                ),
            );
        }
    }
    Ok(())
}

/// Each child entry must narrow the parent's entry at the same target (targets
/// are unique in a normalised table): same source, `rw` only where the parent
/// is `rw`, the parent's `nosuid nodev noexec` kept, `rbind` only where the
/// parent has `rbind` (a child may turn `rbind` into `bind`, or add flags).
/// Entries the child leaves out are hidden from it.
pub(super) fn mounts(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    for (i, m) in c.mounts.iter().enumerate() {
        let target = m.target.as_str();
        let fail = |why: String| refuse(Code::MountExpansion, format!("mounts[{i}]: {why}"));
        let Some(pm) = p.mounts.iter().find(|pm| pm.target == m.target) else {
            return fail(format!("the parent mounts nothing at {target:?}"));
        };
        if pm.source != m.source {
            return fail(format!(
                "source {:?} at {target:?} differs from the parent's {:?}",
                m.source.as_str(),
                pm.source.as_str()
            ));
        }
        if m.rw && !pm.rw {
            return fail(format!(
                "rw at {target:?}, but the parent's entry there is ro"
            ));
        }
        for (opt, parent_has, child_has) in [
            ("nosuid", pm.opts.nosuid, m.opts.nosuid),
            ("nodev", pm.opts.nodev, m.opts.nodev),
            ("noexec", pm.opts.noexec, m.opts.noexec),
        ] {
            if parent_has && !child_has {
                return fail(format!(
                    "drops {opt} at {target:?}, which the parent's entry has"
                ));
            }
        }
        if m.opts.rbind && !pm.opts.rbind {
            return fail(format!(
                "rbind at {target:?} widens the parent's non-recursive entry"
            ));
        }
    }
    Ok(())
}

pub(super) fn describe(n: &Network) -> String {
    match n {
        Network::None => "none".to_owned(),
        Network::All => "all".to_owned(),
        Network::Connect(ports) => format!(
            "connect [{}]",
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

pub(super) fn network(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    if c.network.is_within(&p.network) {
        return Ok(());
    }
    if let (Network::Connect(cs), Network::Connect(ps)) = (&c.network, &p.network)
        && let Some(port) = cs.difference(ps).next()
    {
        return refuse(
            Code::NetworkExpansion,
            format!(
                "network.connect: port {port} is not allowed to the parent ({})",
                describe(&p.network)
            ),
        );
    }
    refuse(
        Code::NetworkExpansion,
        format!(
            "network: {} is wider than the parent's {}",
            describe(&c.network),
            describe(&p.network)
        ),
    )
}

/// The child's tiers must be a subsequence of the parent's: matched greedily,
/// each tier after the previous match.
pub(super) fn path(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    let mut rest = p.path.iter();
    for (i, tier) in c.path.iter().enumerate() {
        if !rest.any(|t| t == tier) {
            let parent = p.path.join(":");
            let why = if p.path.contains(tier) {
                "is out of the parent's order"
            } else {
                "is not one of the parent's tiers"
            };
            return refuse(
                Code::ToolPathExpansion,
                format!("path[{i}]: {tier:?} {why} ({parent:?})"),
            );
        }
    }
    Ok(())
}

pub(super) fn window(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    match (c.window, p.window) {
        (None, None) => Ok(()),
        (Some(cw), Some(pw)) if cw > pw => refuse(
            Code::WindowExpansion,
            format!("window: {cw} tokens is more than the parent's {pw}"),
        ),
        (Some(_), Some(_)) => Ok(()),
        (Some(cw), None) => refuse(
            Code::WindowUnknown,
            format!("window: {cw} tokens asked, but the parent's window is unknown"),
        ),
        (None, Some(pw)) => refuse(
            Code::WindowUnknown,
            format!("window: unknown, but the parent's is {pw} tokens"),
        ),
    }
}

pub(super) fn budget(parent: &ParentView<'_>, c: &Policy) -> Result<(), Refusal> {
    let Some(cost) = c.cost_limit else {
        return Ok(());
    };
    // Written with `partial_cmp` so that a NaN on either side refuses.
    let fits = |cap: f64| {
        matches!(
            cost.partial_cmp(&cap),
            Some(Ordering::Less | Ordering::Equal)
        )
    };
    if let Some(left) = parent.budget_remaining
        && !fits(left)
    {
        return refuse(
            Code::BudgetExceeded,
            format!("cost_limit: {cost} is more than the parent's remaining budget {left}"),
        );
    }
    if let Some(limit) = parent.policy.cost_limit
        && !fits(limit)
    {
        return refuse(
            Code::BudgetExceeded,
            format!("cost_limit: {cost} is more than the parent's own limit {limit}"),
        );
    }
    Ok(())
}

pub(super) fn depth(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    match (c.depth_limit, p.depth_limit) {
        (_, None) => Ok(()),
        (_, Some(0)) => refuse(
            Code::DepthLimit,
            "depth_limit: the parent's is 0, so it may have no children".to_owned(),
        ),
        (None, Some(d)) => refuse(
            Code::DepthLimit,
            format!("depth_limit: unlimited, but must be less than the parent's {d}"),
        ),
        (Some(cd), Some(d)) if cd >= d => refuse(
            Code::DepthLimit,
            format!("depth_limit: {cd} must be less than the parent's {d}"),
        ),
        (Some(_), Some(_)) => Ok(()),
    }
}

pub(super) fn create_limit(parent: &ParentView<'_>, c: &Policy) -> Result<(), Refusal> {
    let Some(n) = parent.policy.create_limit else {
        return Ok(());
    };
    let used = parent.creates_used;
    if used >= n {
        return refuse(
            Code::CreateLimit,
            format!("create_limit: the parent has already created {used} of its {n} children"),
        );
    }
    let left = n - used;
    match c.create_limit {
        None => refuse(
            Code::CreateLimit,
            format!("create_limit: unlimited, but the parent has {left} creates left"),
        ),
        Some(k) if k > left => refuse(
            Code::CreateLimit,
            format!("create_limit: {k} is more than the parent's {left} creates left"),
        ),
        Some(_) => Ok(()),
    }
}

/// `resume` is a right: a child is resumed only under a resumed parent, so
/// a child asking for it under a parent that is cancelled at a restart asks
/// for something it could never get (and for more than its parent holds).
pub(super) fn on_restart(p: &Policy, c: &Policy) -> Result<(), Refusal> {
    if c.on_restart.is_within(p.on_restart) {
        return Ok(());
    }
    refuse(
        Code::PolicyExpansion,
        format!(
            "on_restart: {}, but the parent's is {} (a child is resumed only under a parent that is)",
            c.on_restart.as_str(),
            p.on_restart.as_str()
        ),
    )
}
