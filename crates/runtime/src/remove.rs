//! Removing finished trees (issue 25): `brood rm`, `brood prune`, `DELETE
//! /api/agents/{name}` and `POST /api/prune`, and what a removal leaves to
//! do once the store has committed it.
//!
//! A removal is the store's first, in one transaction ([`brood_store::Removal`]):
//! the records go whole or not at all, so a name is free exactly when
//! nothing of its tree is left in the store. Then, after the commit, the
//! files the records stood for: the agents' objects, shims and sockets
//! (`ctx/agent/<name>…`), their sessions (`ctx/home/<uid>/agent/<name>/`),
//! the channel from a parent that stays, the blobs no record names any
//! more, and the cgroups their runs were in, if any was left. A crash
//! between the two leaves files no record accounts for, which `brood
//! fsck` and the start-up rebuild remove ([`crate::rebuild`]).
//!
//! Who may remove: the operator any tree; an agent only within its own
//! subtree, which never holds a whole tree (docs/decisions/removal.md
//! "Removing trees is the operator's"). The supervisor's dispatcher runs removals when one
//! serves the root (`supervisor::remove`); without one, the CLI calls these
//! functions on the store itself.

use std::path::{Path, PathBuf};

use brood_core::{AgentName, Code, TenantId};
use brood_store::{Agent, FinishedTree, Removed, Store};

use crate::api::{ApiError, Caller};
use crate::paths::Paths;

/// The most trees one prune removes; the rest are for the next one.
pub const PRUNE_MAX: u32 = 10_000;

/// The agent `name` as the root of a tree a caller may remove: it exists,
/// it is a root, and the caller is the operator (an agent may act only on
/// its own descendants, and a root is nobody's).
pub fn removable_root(
    store: &dyn Store,
    tenant: &TenantId,
    caller: &Caller,
    name: &AgentName,
) -> Result<Agent, ApiError> {
    let a = store
        .agent(tenant, name)
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::new(Code::NotFound, format!("no agent named {name}")))?;
    if let Caller::Agent(me) = caller {
        return Err(ApiError::new(
            Code::Forbidden,
            format!(
                "agent {me} may not remove the tree of {root}: a tree is removed whole, by the \
                 operator (an agent's own subtree never holds a whole tree)",
                root = a.root
            ),
        ));
    }
    if a.parent.is_some() {
        return Err(ApiError::new(
            Code::BadRequest,
            format!(
                "{name} is not a root: it belongs to the tree of {root}, which is removed whole \
                 (brood rm {root})",
                root = a.root
            ),
        ));
    }
    Ok(a)
}

/// Pruning is the operator's: an agent's own subtree holds no whole tree.
pub fn may_prune(caller: &Caller) -> Result<(), ApiError> {
    match caller {
        Caller::User { .. } => Ok(()),
        Caller::Agent(me) => Err(ApiError::new(
            Code::Forbidden,
            format!(
                "agent {me} may not prune: pruning removes whole trees, which is the operator's"
            ),
        )),
    }
}

/// The trees a prune with `older_than_ms` removes at `now_ms`.
pub fn prune_candidates(
    store: &dyn Store,
    tenant: &TenantId,
    older_than_ms: i64,
    now_ms: i64,
) -> Result<Vec<FinishedTree>, ApiError> {
    store
        .finished_trees(tenant, now_ms.saturating_sub(older_than_ms), PRUNE_MAX)
        .map_err(ApiError::from)
}

/// Every path of the ctx tree that stood for what `removed` took: each
/// agent's object, shim and socket, its sessions, and the channel from a
/// parent that stays (a removed parent's sessions hold its children's).
pub fn ctx_paths(paths: &Paths, removed: &Removed) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for a in &removed.agents {
        out.push(paths.agent_dir(&a.name));
        out.push(paths.shim(&a.name));
        out.push(paths.agent_socket(&a.name));
        out.push(paths.home().join("agent").join(a.name.as_str()));
    }
    for c in &removed.channels {
        out.push(paths.channel_dir(&c.parent, &c.parent_session, &c.child));
    }
    out
}

/// Removes `path`, a file or a directory with everything in it; a symlink
/// is removed itself, never followed (remove_dir_all does not follow the
/// links it meets either). Already gone is fine.
pub fn remove_path(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The blob store's files of `removed`'s blobs, which no record names any
/// more. A name that is not a SHA-256 in lowercase hex is skipped: it
/// cannot be a file the blob store wrote.
pub fn blob_paths(paths: &Paths, removed: &Removed) -> Vec<PathBuf> {
    removed
        .blobs
        .iter()
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .map(|h| crate::channel::blob_path(&paths.blobs(), h))
        .collect()
}

/// What a removal left on disk, removed now (no supervisor serves the
/// root: the CLI's own removal). Failures are warned about and the rest is
/// still removed; `brood fsck` removes what is left.
pub fn remove_files(paths: &Paths, removed: &Removed) -> usize {
    let mut failed = 0;
    for p in ctx_paths(paths, removed)
        .into_iter()
        .chain(blob_paths(paths, removed))
    {
        if let Err(e) = remove_path(&p) {
            tracing::warn!(path = %p.display(), error = %e, "removing a removed agent's file");
            failed += 1;
        }
    }
    failed
}

/// A tree as removal answers it: its root, its agents, and its last end.
pub fn removed_tree(
    root: &AgentName,
    agents: usize,
    last_end_ms: Option<i64>,
) -> brood_api::RemovedTree {
    brood_api::RemovedTree {
        root: root.to_string(),
        agents: agents as u64,
        last_end_ms,
    }
}

/// Removes the tree of root `name` without a supervisor (the CLI's own,
/// when no daemon serves the root).
pub fn remove_tree_here(
    store: &dyn Store,
    tenant: &TenantId,
    paths: &Paths,
    caller: &Caller,
    name: &AgentName,
) -> Result<brood_api::RemovedTree, ApiError> {
    removable_root(store, tenant, caller, name)?;
    let removed = store.remove_tree(tenant, name).map_err(ApiError::from)?;
    remove_files(paths, &removed);
    let last = removed.agents.iter().map(|a| a.updated_ms).max();
    Ok(removed_tree(name, removed.agents.len(), last))
}

/// A prune without a supervisor: every finished tree older than
/// `older_than_ms`, removed one at a time (each in its own transaction),
/// or only listed when `dry_run`. A tree that changed since it was listed
/// (resumed meanwhile) is skipped, named in `skipped`.
pub fn prune_here(
    store: &dyn Store,
    tenant: &TenantId,
    paths: &Paths,
    older_than_ms: i64,
    dry_run: bool,
    now_ms: i64,
) -> Result<brood_api::PruneReply, ApiError> {
    let mut reply = brood_api::PruneReply {
        dry_run,
        removed: Vec::new(),
        skipped: Vec::new(),
    };
    for t in prune_candidates(store, tenant, older_than_ms, now_ms)? {
        if dry_run {
            reply.removed.push(removed_tree(
                &t.root,
                t.agents as usize,
                Some(t.last_end_ms),
            ));
            continue;
        }
        match store.remove_tree(tenant, &t.root) {
            Ok(removed) => {
                remove_files(paths, &removed);
                reply.removed.push(removed_tree(
                    &t.root,
                    removed.agents.len(),
                    Some(t.last_end_ms),
                ));
            }
            Err(e) => reply.skipped.push(brood_api::SkippedTree {
                root: t.root.to_string(),
                reason: ApiError::from(e).message,
            }),
        }
    }
    Ok(reply)
}

/// The ctx tree's entries that stand for an agent, found by [`scan`]: each
/// with the name of the agent it stands for.
#[derive(Debug, Default)]
pub struct Scanned {
    entries: Vec<(AgentName, PathBuf)>,
}

/// Every entry of the ctx tree named after an agent: objects and shims
/// (`ctx/agent/<name>.d`, `ctx/agent/<name>`), sessions
/// (`ctx/home/<uid>/agent/<name>/`) and channels (`…/context/child/<name>/`).
/// Sockets are a live supervisor's to remove (`agent_socket::remove_stale`).
/// Taken before the store's agents are read, so an entry made for an agent
/// admitted meanwhile is never mistaken for a leftover: its record was
/// committed before its files were made.
pub fn scan(paths: &Paths) -> Scanned {
    let mut out = Scanned::default();
    let names = |dir: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (file, path) in names(&paths.ctx().join("agent")) {
        let name = file.strip_suffix(".d").unwrap_or(&file);
        if file.ends_with(".sock") {
            continue;
        }
        if let Ok(n) = AgentName::new(name) {
            out.entries.push((n, path));
        }
    }
    for (file, home) in names(&paths.home().join("agent")) {
        let Ok(n) = AgentName::new(&file) else {
            continue;
        };
        // The sessions before the channels in them: a session removed takes
        // its channels with it.
        out.entries.push((n, home.clone()));
        for (_, session) in names(&home.join("session")) {
            for (child, path) in names(&session.join("context").join("child")) {
                if let Ok(c) = AgentName::new(&child) {
                    out.entries.push((c, path));
                }
            }
        }
    }
    out
}

/// Removes what [`scan`] found of agents the store does not hold (their
/// tree was removed, and its files were not yet when the process doing it
/// stopped): `brood fsck` and the start-up rebuild. How many entries went.
pub fn remove_unrecorded(scanned: Scanned, known: &std::collections::HashSet<&AgentName>) -> usize {
    let mut removed = 0;
    for (name, path) in scanned.entries {
        // Known, or gone with a directory removed before it.
        if known.contains(&name) || std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        match remove_path(&path) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "removing a removed agent's leftover")
            }
        }
    }
    removed
}
