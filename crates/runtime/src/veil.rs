//! What this supervisor keeps out of every agent's reach (issue 11), and the
//! refusal of a policy that names it: the launcher's veil
//! (`brood_launch::veil`) is worked out here from the host's mount table and
//! the layout of `$BROOD_ROOT`, once at start; each launch prepares it afresh
//! (a few `lstat`s), so a control socket bound later is still bound back.
//!
//! Reserved: every cgroup hierarchy; the supervisors' liveness marks
//! (`/run/brood/incarnations`: one that could unlink and remake a live
//! supervisor's mark would have it taken for dead); `$BROOD_ROOT` except
//! `ctx/` (the ABI agents read), the control socket (agents call the API
//! through it, as themselves) and the `iso = ns` mount point; the store's
//! file, its WAL, shared memory and journal, and the sweeper lock, wherever
//! they are.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use brood_core::policy::Policy;
use brood_launch::veil::{self, MountLine, PreparedVeil, VeilError, VeilNamespace, VeilSpec};

use crate::paths::Paths;

/// Entries of `$BROOD_ROOT` agents keep seeing.
const KEEP: [&str; 3] = ["ctx", "brood.sock", "ns"];

#[derive(Debug, Clone)]
pub struct Veil {
    mounts: Vec<MountLine>,
    spec: VeilSpec,
    /// `$BROOD_ROOT/ctx`, the one part of the root a policy may name.
    ctx: PathBuf,
    /// The directory of the supervisors' liveness marks, covered with the
    /// cgroup hierarchies when it exists (the supervisor's cgroups made it
    /// before the veil is worked out).
    marks: Option<PathBuf>,
}

impl Veil {
    /// Reads the mount table and works out what to hide. `root` and the store
    /// path are made canonical (a mount follows symlinks; a rule is compared
    /// by path).
    /// `secrets` are more files to cover wherever they are (the model
    /// providers' key files).
    pub fn new(paths: &Paths, secrets: &[PathBuf]) -> Result<Veil, String> {
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
        let mounts = veil::parse_mountinfo(&table);
        let root = canonical_planned(&paths.root)?;
        let db = canonical_file(&paths.db());
        let mut files = Vec::new();
        // A PostgreSQL store has no file here to hide (its server must not
        // be reachable from agents: docs/decisions/store.md "Agents must
        // not reach the server").
        let suffixes: &[&str] = if paths.db_is_postgres() {
            &[]
        } else {
            &["", "-wal", "-shm", "-journal"]
        };
        for suffix in suffixes {
            let mut name = db.as_os_str().to_os_string();
            name.push(suffix);
            files.push(PathBuf::from(name));
        }
        files.push(canonical_file(&paths.sweeper_lock()));
        files.extend(secrets.iter().map(|p| canonical_file(p)));
        let marks = brood_launch::cgroup::detect(Path::new("/"))
            .ok()
            .and_then(|d| d.marks)
            .and_then(|m| std::fs::canonicalize(m).ok());
        let mut covers = veil::cgroup_covers(&mounts);
        covers.extend(marks.clone());
        let spec = VeilSpec {
            covers,
            root: root.clone(),
            keep: KEEP.iter().map(OsString::from).collect(),
            files,
            // Agents see their own processes only (issue 24).
            proc: Some(PathBuf::from("/proc")),
        };
        Ok(Veil {
            mounts,
            ctx: root.join("ctx"),
            spec,
            marks,
        })
    }

    /// What one launch needs: the spec checked against the current layout.
    pub fn prepare(&self) -> Result<Arc<PreparedVeil>, VeilError> {
        veil::prepare_with(&self.spec, &self.mounts).map(Arc::new)
    }

    /// A policy that names brood's machinery, refused with the reason
    /// (`Code::ReservedPath`): a file rule at or inside a reserved path, a
    /// mount whose source is one, or a plain (non-recursive) bind of a
    /// directory above `$BROOD_ROOT` or an outside store file, which would show
    /// them from beneath the veil (an `rbind` takes the veil's covers along).
    pub fn check(&self, policy: &Policy) -> Result<(), String> {
        for r in &policy.files {
            let p = Path::new(r.path.as_str());
            if let Some(what) = self.reserved(p) {
                return Err(format!(
                    "files: {} names {what}, which no agent may be granted",
                    p.display()
                ));
            }
        }
        for m in &policy.mounts {
            let src = Path::new(m.source.as_str());
            if let Some(what) = self.reserved(src) {
                return Err(format!(
                    "mounts: the source {} names {what}, which no agent may be granted",
                    src.display()
                ));
            }
            if !m.opts.rbind {
                let below = std::iter::once(&self.spec.root)
                    .chain(
                        self.spec
                            .files
                            .iter()
                            .filter(|f| !f.starts_with(&self.spec.root)),
                    )
                    .chain(&self.marks)
                    .find(|x| x.starts_with(src) && x.as_path() != src);
                if let Some(x) = below {
                    return Err(format!(
                        "mounts: a plain bind of {} would show {} from beneath the veil; \
                         use rbind (the veil's covers come along) or bind a directory beside it",
                        src.display(),
                        x.display()
                    ));
                }
            }
        }
        Ok(())
    }

    /// What of brood's machinery `p` (a canonical path) is, if any.
    pub fn reserved(&self, p: &Path) -> Option<String> {
        if let Some(m) = self.marks.as_ref().filter(|m| p.starts_with(m)) {
            return Some(format!("the supervisors' liveness marks {}", m.display()));
        }
        if let Some(c) = self.spec.covers.iter().find(|c| p.starts_with(c)) {
            return Some(format!("the cgroup hierarchy {}", c.display()));
        }
        if let Some(f) = self.spec.files.iter().find(|f| p == f.as_path()) {
            return Some(format!("the store's file {}", f.display()));
        }
        if p.starts_with(&self.spec.root) && !p.starts_with(&self.ctx) {
            return Some(format!(
                "brood's root {} (only its ctx/ may be named)",
                self.spec.root.display()
            ));
        }
        None
    }

    /// What is hidden, for `brood doctor`.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .spec
            .covers
            .iter()
            .map(|c| {
                if Some(c) == self.marks.as_ref() {
                    format!("{} (the supervisors' liveness marks)", c.display())
                } else {
                    format!("{} (cgroup hierarchies)", c.display())
                }
            })
            .collect();
        out.push(format!(
            "{} (brood's root; ctx/, brood.sock and ns/ bound back)",
            self.spec.root.display()
        ));
        for f in self
            .spec
            .files
            .iter()
            .filter(|f| !f.starts_with(&self.spec.root))
        {
            out.push(format!("{} (store file outside the root)", f.display()));
        }
        out
    }
}

/// The veiled namespace agents join, shared by the launches: made on the
/// spawner's thread, whose children land in the keeper's PID namespace, so
/// that the namespace's own `/proc` numbers processes as the agents do; and
/// made again when what the veil hides changed or the keeper (and with it
/// the PID namespace) was replaced.
#[derive(Clone, Default)]
pub struct VeilCache(Arc<std::sync::Mutex<Option<Made>>>);

/// A namespace made, with the key of what it was made for.
type Made = (u64, Arc<VeilNamespace>);

impl VeilCache {
    /// The namespace for `veil` as things stand; call it on the spawner's
    /// thread.
    pub fn get(&self, veil: &Veil) -> Result<Arc<VeilNamespace>, String> {
        let prepared = veil.prepare().map_err(|e| e.to_string())?;
        // The PID namespace this thread's children are born in (proc(5)
        // /proc/thread-self/ns/pid_for_children).
        let pidns = std::fs::read_link("/proc/thread-self/ns/pid_for_children")
            .map(|l| l.to_string_lossy().into_owned())
            .unwrap_or_default();
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            prepared.signature().hash(&mut h);
            pidns.hash(&mut h);
            h.finish()
        };
        let mut made = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((k, ns)) = made.as_ref()
            && *k == key
        {
            return Ok(ns.clone());
        }
        let ns = Arc::new(veil::make_namespace(&prepared).map_err(|e| e.to_string())?);
        *made = Some((key, ns.clone()));
        Ok(ns)
    }
}

/// `p` made canonical as far as it exists, the rest kept as written: a
/// root not made yet (`brood doctor` on a fresh root) is veiled where the
/// supervisor will make it.
fn canonical_planned(p: &Path) -> Result<PathBuf, String> {
    for there in p.ancestors() {
        if let Ok(c) = std::fs::canonicalize(there) {
            let rest = p.strip_prefix(there).unwrap_or(Path::new(""));
            return Ok(if rest.as_os_str().is_empty() {
                c
            } else {
                c.join(rest)
            });
        }
    }
    Err(format!("resolving {}: no part of it exists", p.display()))
}

/// A store file's canonical path: its directory resolved, the name kept (the
/// file itself may not exist yet).
fn canonical_file(p: &Path) -> PathBuf {
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}
