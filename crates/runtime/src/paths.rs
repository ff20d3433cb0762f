//! Where things live under `$BROOD_ROOT` (SPEC 3): the one place that knows the
//! layout of the ctx tree, so no other module builds a path by hand.

use std::path::{Path, PathBuf};

use brood_core::{AgentName, SessionName};

#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
    uid: u32,
    /// The store's file: `$BROOD_ROOT/brood.db` unless `--store` names another
    /// (several supervisors with roots of their own sharing one store).
    db: PathBuf,
}

impl Paths {
    pub fn new(root: PathBuf, uid: u32) -> Paths {
        let db = root.join("brood.db");
        Paths { root, uid, db }
    }

    /// The same layout with the store elsewhere.
    pub fn with_db(mut self, db: Option<PathBuf>) -> Paths {
        if let Some(d) = db {
            self.db = d;
        }
        self
    }

    pub fn db(&self) -> PathBuf {
        self.db.clone()
    }

    /// Whether the store is a PostgreSQL server (`--store postgres://…`),
    /// not a file under the root.
    pub fn db_is_postgres(&self) -> bool {
        brood_store::is_postgres_url(&self.db.to_string_lossy())
    }

    /// The lock whose holder runs the sweepers (SPEC 9): next to the store, so
    /// every supervisor sharing the store contends for the same one.
    pub fn sweeper_lock(&self) -> PathBuf {
        if self.db_is_postgres() {
            // No file beside a server: the lock is this root's (one node's;
            // across nodes the lease's epoch fences, issue 15).
            return self.root.join("brood.sweeper.lock");
        }
        let mut name = self.db.file_name().unwrap_or_default().to_os_string();
        name.push(".sweeper.lock");
        self.db.with_file_name(name)
    }
    pub fn socket(&self) -> PathBuf {
        self.root.join("brood.sock")
    }
    pub fn ctx(&self) -> PathBuf {
        self.root.join("ctx")
    }
    pub fn home(&self) -> PathBuf {
        self.ctx().join("home").join(self.uid.to_string())
    }
    /// `ctx/agent/<name>`: the executable shim (SPEC 3) that sends its
    /// arguments to the agent as input.
    pub fn shim(&self, name: &AgentName) -> PathBuf {
        self.ctx().join("agent").join(name.as_str())
    }
    /// `ctx/agent/<name>.sock`: the per-agent socket (SPEC 8), present only
    /// while the agent can take input.
    pub fn agent_socket(&self, name: &AgentName) -> PathBuf {
        self.ctx().join("agent").join(format!("{name}.sock"))
    }
    /// `ctx/agent/<name>.d/`
    pub fn agent_dir(&self, name: &AgentName) -> PathBuf {
        self.ctx().join("agent").join(format!("{name}.d"))
    }
    /// `ctx/home/<uid>/agent/<name>/session/<s>/`
    pub fn session_dir(&self, name: &AgentName, session: &SessionName) -> PathBuf {
        self.home()
            .join("agent")
            .join(name.as_str())
            .join("session")
            .join(session.as_str())
    }
    /// The parent's channel to one child: `<parent session>/context/child/<child>/`.
    pub fn channel_dir(
        &self,
        parent: &AgentName,
        parent_session: &SessionName,
        child: &AgentName,
    ) -> PathBuf {
        self.session_dir(parent, parent_session)
            .join("context")
            .join("child")
            .join(child.as_str())
    }
    /// The content-addressed blob store of artifacts (SPEC 4).
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    pub fn policy_file(&self, name: &AgentName) -> PathBuf {
        self.agent_dir(name).join("policy")
    }
}

/// A stable short id of a root directory, used to name the supervisor's cgroups so
/// two roots on one host never touch each other's groups.
pub fn instance_key(root: &Path) -> String {
    // FNV-1a: tiny, stable across releases (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in root.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", (h >> 32) as u32 ^ h as u32)
}
