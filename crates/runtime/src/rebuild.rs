//! `brood fsck`: the whole ctx projection rebuilt from the store (SPEC 3: the
//! store is the truth, the tree can always be rebuilt). The supervisor runs the
//! same at start-up.
//!
//! Every file is rendered by the functions the live projection uses
//! (`objects`, `supervisor::status_files`), and written atomically (temp file,
//! rename, never through a symlink), so a rebuilt tree equals the one the
//! supervisor wrote, file for file, with one exception: an agent's `log` (its
//! stderr, not kept in the store) is left as it is, and created empty if
//! missing. A finished `temp` agent has no object (nor shim) to rebuild.
//!
//! A finished child's `artifact/` holds what its channel records and nothing
//! else (issue 24 item 6): whatever a refused, stopped or crashed run left
//! there (or set aside beside it, `.artifact.<run>`), and whatever the
//! recorded ones were replaced by, is removed
//! (`channel::clear`, never following a link) before the recorded artifacts
//! are written from their blobs. A running child's is its own to write and is
//! left alone. Temp files of blobs that a dead supervisor was writing are
//! removed from the blob store.
//!
//! What stands for an agent the store no longer holds (its object, shim,
//! sessions, its parent's channel to it) is removed: a removal (issue 25)
//! that stopped between its commit and its files left it.
//!
//! Per-agent sockets (`agent/<name>.sock`, SPEC 8) are not files of the store:
//! a live supervisor binds them. A socket nobody answers on is a leftover of a
//! dead supervisor, and the rebuild removes it; one that answers is left alone.

use std::path::{Path, PathBuf};

use brood_core::TenantId;
use brood_core::policy::Policy;
use brood_store::{Agent, Store, StoreError};
use serde_json::Value;

use crate::objects;
use crate::paths::Paths;
use crate::projection::write_atomic;

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agent {agent}: its stored policy does not read back: {message}")]
    Policy { agent: String, message: String },
    #[error("a thread rebuilding agents panicked")]
    Panicked,
}

/// Threads a rebuild reads the store and writes files on: enough to keep
/// round trips to a distant PostgreSQL overlapping, no more than its pool
/// has connections (8 by default).
const REBUILDERS: usize = 8;

/// What a rebuild wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    pub agents: usize,
    pub files: usize,
    /// Artifacts whose bytes are neither in this node's blob store nor in
    /// the shared store (a child another node ran that did not share them):
    /// left out of `artifact/`.
    pub artifacts_elsewhere: usize,
    /// Entries removed from finished children's `artifact/` that no record
    /// accounts for (a refused or never recorded result's leftovers).
    pub leftovers_removed: u64,
    /// Temp files of blobs a dead supervisor was writing, removed.
    pub blob_temps_removed: usize,
    /// Objects, sessions and channels of agents the store no longer holds
    /// (a removal stopped between its commit and its files), removed.
    pub unrecorded_removed: usize,
}

struct Out {
    nonce: u64,
    files: usize,
    elsewhere: usize,
    leftovers: u64,
    owner: Option<u32>,
}

impl Out {
    /// Nothing written yet, for the same owner.
    fn empty(&self) -> Out {
        Out {
            nonce: 0,
            files: 0,
            elsewhere: 0,
            leftovers: 0,
            owner: self.owner,
        }
    }

    fn put(&mut self, path: PathBuf, bytes: impl AsRef<[u8]>) -> Result<(), RebuildError> {
        self.nonce += 1;
        self.files += 1;
        write_atomic(&path, bytes.as_ref(), self.nonce, self.owner)
            .map_err(|source| RebuildError::Io { path, source })
    }

    /// [`Out::put`] of a file's bytes, streamed (an artifact of up to 1 GiB).
    fn copy(&mut self, path: PathBuf, src: &mut std::fs::File) -> Result<(), RebuildError> {
        self.nonce += 1;
        self.files += 1;
        crate::projection::copy_atomic(&path, src, self.nonce, self.owner)
            .map_err(|source| RebuildError::Io { path, source })
    }

    fn dir(&mut self, path: &Path) -> Result<(), RebuildError> {
        crate::projection::make_dirs(path, self.owner).map_err(|source| RebuildError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Creates an empty file if there is none (never truncates, never follows a
    /// symlink).
    fn touch(&mut self, path: PathBuf) -> Result<(), RebuildError> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(d) = path.parent() {
            self.dir(d)?;
        }
        let owner = self.owner;
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .and_then(|f| match owner {
                Some(u) => std::os::unix::fs::fchown(&f, Some(u), Some(u)),
                None => Ok(()),
            })
            .map_err(|source| RebuildError::Io { path, source })
    }
}

/// Rebuilds every agent object, session and channel of `tenant` under `paths`.
/// `bin_dir` is where the `brood` binary is, for the shims (see
/// [`objects::shim_program`]); give the supervisor's `Config::bin_dir`.
pub fn rebuild(
    store: &dyn Store,
    tenant: &TenantId,
    paths: &Paths,
    operator: &Policy,
    bin_dir: Option<&Path>,
) -> Result<Rebuilt, RebuildError> {
    let mut out = Out {
        nonce: 0,
        files: 0,
        elsewhere: 0,
        leftovers: 0,
        owner: crate::projection::ctx_owner(),
    };
    crate::agent_socket::remove_stale(&paths.ctx().join("agent"));
    let blobs = paths.blobs();
    let blob_temps_removed =
        crate::channel::remove_stale_temps(&blobs).map_err(|source| RebuildError::Io {
            path: blobs.join("sha256"),
            source,
        })?;
    // What stands for agents on disk, looked at before their records are.
    let scanned = crate::remove::scan(paths);
    let agents = store.agents(tenant, true)?;
    let program = objects::shim_program(bin_dir);
    // Agents are rebuilt on a few threads at once. Each agent costs a few
    // store reads (its events, run, messages, channel), and on PostgreSQL
    // each is a round trip: a node restarted behind a slow network took 48 s
    // for 211 agents one at a time, and served nothing meanwhile (issue 28's
    // campaign). What one agent writes is its own (its object, sessions and
    // its parent's channel to it), so the threads share no file; each has a
    // range of temp-file nonces of its own.
    let threads = REBUILDERS.min(agents.len()).max(1);
    let per = agents.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Out, RebuildError>> = std::thread::scope(|s| {
        let workers: Vec<_> = agents
            .chunks(per)
            .enumerate()
            .map(|(i, chunk)| {
                let program = &program;
                let mut mine = Out {
                    nonce: (i as u64) << 40,
                    ..out.empty()
                };
                s.spawn(move || {
                    for a in chunk {
                        agent(store, paths, operator, a, program, &mut mine)?;
                    }
                    Ok(mine)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(RebuildError::Panicked)))
            .collect()
    });
    for part in parts {
        let part = part?;
        out.files += part.files;
        out.elsewhere += part.elsewhere;
        out.leftovers += part.leftovers;
    }
    let known: std::collections::HashSet<&brood_core::AgentName> =
        agents.iter().map(|a| &a.name).collect();
    let unrecorded_removed = crate::remove::remove_unrecorded(scanned, &known);
    Ok(Rebuilt {
        agents: agents.len(),
        files: out.files,
        artifacts_elsewhere: out.elsewhere,
        leftovers_removed: out.leftovers,
        blob_temps_removed,
        unrecorded_removed,
    })
}

fn agent(
    store: &dyn Store,
    paths: &Paths,
    operator: &Policy,
    a: &Agent,
    program: &str,
    out: &mut Out,
) -> Result<(), RebuildError> {
    let spec: Value = serde_json::from_str(&a.spec).unwrap_or(Value::Null);
    let policy = objects::policy_of(&spec, operator).map_err(|message| RebuildError::Policy {
        agent: a.name.to_string(),
        message,
    })?;
    let events = all_events(store, a)?;
    let run = store.run(&a.tenant, &a.run)?;

    // The object, unless a finished temp agent's (removed after its run).
    let temp_gone = objects::object_removed(a);
    if !temp_gone {
        let dir = paths.agent_dir(&a.name);
        for (file, text) in objects::control_files(a, &policy, &spec) {
            out.put(dir.join(file), text)?;
        }
        let start = events
            .iter()
            .rev()
            .find(|e| e.kind == "agent.start")
            .and_then(|e| serde_json::from_str::<Value>(&e.payload).ok());
        out.put(
            dir.join("meta.json"),
            objects::agent_meta(a, start.as_ref()),
        )?;
        out.touch(dir.join("log"))?;
        out.nonce += 1;
        out.files += 1;
        let shim = paths.shim(&a.name);
        crate::projection::write_atomic_exec(
            &shim,
            objects::shim(&paths.root, program, &a.name).as_bytes(),
            out.nonce,
            out.owner,
        )
        .map_err(|source| RebuildError::Io { path: shim, source })?;
    }
    let pid = run.as_ref().and_then(|r| r.pid);
    for (path, text) in crate::objects::status_files(paths, a, pid, !temp_gone) {
        out.put(path, text)?;
    }

    // The session.
    let sdir = paths.session_dir(&a.name, &a.session);
    out.dir(&sdir.join("context"))?;
    out.put(sdir.join("created_at"), format!("{}\n", a.created_ms))?;
    out.put(
        sdir.join("cwd"),
        format!("{}\n", spec["cwd"].as_str().unwrap_or("")),
    )?;
    out.put(sdir.join("meta.json"), objects::session_meta(a))?;
    let messages = store.messages(&a.tenant, &a.name, &a.session)?;
    let text: String = messages.iter().map(objects::message_line).collect();
    out.put(sdir.join("messages.jsonl"), text)?;
    let latest = messages
        .iter()
        .rev()
        .find(|m| objects::is_agent_message(&m.role))
        .map(|m| m.content.as_bytes())
        .unwrap_or_default();
    out.put(sdir.join("latest.md"), latest)?;
    let text: String = events
        .iter()
        .filter(|e| e.session == a.session)
        .map(|e| format!("{}\n", e.payload))
        .collect();
    out.put(sdir.join("events.jsonl"), text)?;

    // The parent's channel to it.
    if let Some(p) = &a.parent
        && let Some(ch) = store.channel(&a.tenant, p, &a.name)?
    {
        let cdir = paths.channel_dir(p, &ch.parent_session, &a.name);
        out.put(cdir.join("agent"), format!("{}\n", a.name))?;
        out.put(cdir.join("session"), format!("{}\n", ch.child_session))?;
        out.put(cdir.join("handoff.md"), ch.handoff.as_bytes())?;
        out.put(
            cdir.join("status"),
            format!("{}\n", a.status.abi().channel.as_str()),
        )?;
        if a.status.is_finished()
            && let Some(r) = &ch.result
        {
            out.put(cdir.join("result.md"), objects::result_text(r))?;
        }
        if let Some(refs) = &ch.refs {
            out.put(cdir.join("refs.jsonl"), refs)?;
        }
        // artifact/: the child's to write while it runs; its files come back
        // from the blob store they were taken into when the result was recorded.
        let adir = cdir.join("artifact");
        crate::projection::make_dir(&adir, policy.uid).map_err(|source| RebuildError::Io {
            path: adir.clone(),
            source,
        })?;
        if a.status.is_finished() {
            let keep = ch.artifacts.iter().map(|a| a.name.clone()).collect();
            let cleared =
                crate::channel::clear::clear(&cdir, &keep).map_err(|source| RebuildError::Io {
                    path: adir.clone(),
                    source,
                })?;
            out.leftovers += cleared.entries;
            // What a run without a result left set aside, had its
            // supervisor no time to remove it. Best effort: a live
            // supervisor may be removing the same directory now.
            for name in crate::channel::clear::set_aside_in(&cdir) {
                match crate::channel::clear::remove_set_aside(&cdir, &name) {
                    Ok(c) => out.leftovers += c.entries,
                    Err(e) => {
                        tracing::warn!(channel = %cdir.display(), error = %e, "removing a set-aside artifact/")
                    }
                }
            }
        }
        for art in &ch.artifacts {
            // A child another node ran: its bytes come from the shared store
            // when its node put them there (issue 15); otherwise they are on
            // that node's disk only, and the rest of the tree is still this
            // node's to rebuild.
            match crate::channel::shared::fetch_blob(store, &a.tenant, &paths.blobs(), &art.sha256)
            {
                Ok(true) => {}
                Ok(false) => {
                    out.elsewhere += 1;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(agent = %a.name, artifact = %art.name, error = %e, "fetching an artifact's bytes from the store");
                    out.elsewhere += 1;
                    continue;
                }
            }
            let blob = crate::channel::blob_path(&paths.blobs(), &art.sha256);
            let mut src = std::fs::File::open(&blob).map_err(|source| RebuildError::Io {
                path: blob.clone(),
                source,
            })?;
            out.copy(adir.join(&art.name), &mut src)?;
        }
    }
    Ok(())
}

/// Events read a round trip.
const PAGE: u32 = 1000;

/// Every event recorded in `a`'s log, in sequence order.
fn all_events(store: &dyn Store, a: &Agent) -> Result<Vec<brood_store::Event>, StoreError> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events(&a.tenant, after, Some(&a.name), PAGE)?;
        let Some(last) = page.last() else {
            return Ok(all);
        };
        after = last.seq;
        let more = page.len() == PAGE as usize;
        all.extend(page);
        // A short page is the last: no round trip for an empty one.
        if !more {
            return Ok(all);
        }
    }
}
