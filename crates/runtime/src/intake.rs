//! The intake (issue 24, "checked at the door"): what a creation names on
//! the filesystem, checked before anything is recorded, so nothing admitted
//! fails later for a reason that could have been seen here. Each refusal is a `BadRequest`
//! naming the field (`cwd`, `argv[0]`, `root`, `policy.mounts[i].source`).
//!
//! What is checked, in the view the agent will have (the host's, or with
//! `iso = ns` its mount table over its root): `cwd` is an existing
//! directory the agent may enter; the program (`argv[0]`) is a regular,
//! executable file, found, for a bare name, in the `PATH` the agent will
//! get (its environment's, else the supervisor's, as the launcher looks it
//! up), on a filesystem that allows exec; `root` is a directory; each mount
//! source exists. Neither the directory nor the program may lie under what
//! the veil hides from every agent (`$BROOD_ROOT` but its `ctx/`, the
//! cgroup hierarchies, the store's files): the agent would not find them. The agent's permissions are its policy's uid, gid and
//! groups read against the mode bits, without capabilities (agents have
//! none): an ACL granting more is not read, and a script's interpreter is
//! not looked for, since that would mean opening the file the caller named.
//!
//! Only metadata is read (`stat`, `statvfs`): nothing a caller names is ever
//! opened, so a FIFO or a device named here is seen for what it is and never
//! blocks. The checks run on a blocking thread, never on the dispatcher or
//! a connection's task. The pure checks (NUL bytes, an empty argv, a
//! relative cwd, a relative program path) are `SpawnRequest::from_body`'s.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use brood_core::policy::{AbsPath, MountEntry, Policy, PolicyRequest};
use brood_core::{AgentName, Code, Iso, TenantId};
use brood_store::Store;
use serde_json::Value;

use crate::api::{ApiError, Caller, SpawnRequest};
use crate::limits::{Limits, Rates};
use crate::veil::Veil;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::new(Code::BadRequest, m)
}

/// The intake's state: the limits, the callers' rates, and what an agent's
/// environment starts from.
#[derive(Debug)]
pub struct Intake {
    limits: Limits,
    rates: Rates,
    /// The `PATH` an agent gets when its environment sets none.
    base_path: String,
    /// What the operator holds (a root's policy is derived from it).
    operator: Policy,
    /// What every agent's mount namespace hides (a root supervisor's).
    veil: Option<Veil>,
}

/// Who the new agent will be, as far as the filesystem is concerned.
struct Agent<'a> {
    uid: u32,
    gid: u32,
    groups: &'a std::collections::BTreeSet<u32>,
    /// What its mount namespace hides.
    veil: Option<&'a Veil>,
}

impl Agent<'_> {
    /// What of brood's machinery hides `host` from the agent: the path as
    /// given (its directory resolved) or the file it leads to.
    fn hidden(&self, host: &Path) -> Option<String> {
        let veil = self.veil?;
        let mut at = Vec::new();
        if let (Some(dir), Some(name)) = (host.parent(), host.file_name())
            && let Ok(d) = std::fs::canonicalize(dir)
        {
            at.push(d.join(name));
        }
        if let Ok(c) = std::fs::canonicalize(host) {
            at.push(c);
        }
        at.iter().find_map(|p| veil.reserved(p))
    }
}

/// Where the agent's paths lead: the host's tree, or a private mount table.
enum View<'a> {
    Host,
    Ns {
        mounts: &'a [MountEntry],
        root: Option<&'a str>,
    },
}

/// A path of the agent's view, on the host.
enum Seen {
    At(PathBuf),
    /// The empty scratch root of `iso = ns` without `root`: only `/` exists.
    ScratchRoot,
    /// Nothing of the view holds it.
    Outside,
}

impl Intake {
    pub fn new(limits: Limits, base_path: String, operator: Policy, veil: Option<Veil>) -> Intake {
        Intake {
            limits,
            rates: Rates::default(),
            base_path,
            operator,
            veil,
        }
    }

    /// The intake of this process as a supervisor would have it: its ids as
    /// the operator's, the `PATH` its agents get (`bin_dir` first). For
    /// in-process callers that create jobs without a supervisor's handle.
    pub fn for_process(limits: Limits, bin_dir: Option<&str>) -> Intake {
        let base = brood_launch::env::Base::from_supervisor(bin_dir);
        let operator = Policy::operator(unsafe_geteuid(), unsafe_getegid(), supplementary_groups());
        Intake::new(limits, base.path, operator, None)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// One creation from `caller`'s rate, or `RateLimited` with when to ask again.
    pub fn rate(&self, caller: &Caller) -> Result<(), ApiError> {
        self.rates.take(&self.limits, caller, Instant::now())
    }

    /// What a creation names on the filesystem (module docs). `Ok` when the
    /// parent cannot be read: the dispatcher refuses that itself, by the
    /// same rules as always.
    pub fn check_spawn(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        caller: &Caller,
        req: &SpawnRequest,
    ) -> Result<(), ApiError> {
        let parent = match caller {
            Caller::Agent(me) => Some(me.clone()),
            Caller::User { .. } => req.parent.clone(),
        };
        let mut preq = match &req.policy {
            Some(v) => brood_proto::policy::from_value(v).map_err(|e| bad(e.to_string()))?,
            None => PolicyRequest::default(),
        };
        // The spawn request's `env` is the policy's given inline (admission).
        if !req.env.is_empty() {
            let mut env = preq.env.take().unwrap_or_default();
            env.extend(req.env.iter().cloned());
            preq.env = Some(env);
        }
        let Some(policy) = self.effective(store, tenant, parent.as_ref(), &preq) else {
            return Ok(());
        };
        let view = match req.iso {
            Iso::Ns => View::Ns {
                mounts: &policy.mounts,
                root: req.root.as_deref(),
            },
            Iso::None => View::Host,
        };
        if req.iso == Iso::Ns {
            if let Some(r) = &req.root {
                match std::fs::metadata(r) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(bad(format!("root: {r:?} is not a directory"))),
                    Err(e) => return Err(bad(format!("root: {r:?}: {}", why(&e)))),
                }
            }
            for (i, m) in policy.mounts.iter().enumerate() {
                if let Err(e) = std::fs::symlink_metadata(m.source.as_str()) {
                    return Err(bad(format!(
                        "policy.mounts[{i}].source: {:?}: {}",
                        m.source.as_str(),
                        why(&e)
                    )));
                }
            }
        }
        let who = Agent {
            uid: policy.uid,
            gid: policy.gid,
            groups: &policy.groups,
            veil: self.veil.as_ref(),
        };
        if let Some(cwd) = &req.cwd {
            check_cwd(cwd, &view, &who)?;
        }
        let path = policy
            .env
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| self.base_path.clone());
        check_program("argv[0]", &req.argv, &path, &view, &who)
    }

    /// A job's worker program, before the job is recorded: found and
    /// executable for a child of `owner` under `policy` (the worker's
    /// requested policy), by the same rules as an agent's.
    pub fn check_worker(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        owner: &AgentName,
        argv: &[String],
        policy: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(policy) = self.worker_policy(store, tenant, owner, policy)? else {
            return Ok(());
        };
        let who = self.agent_of(&policy);
        let path = policy
            .env
            .get("PATH")
            .cloned()
            .unwrap_or_else(|| self.base_path.clone());
        check_program("worker.argv[0]", argv, &path, &View::Host, &who)
    }

    /// The default worker's configuration file (`worker.config`, issue
    /// 25), before the job is recorded: a regular file the workers may
    /// read, in the host's view, not hidden by the veil. The workers read
    /// it; the supervisor only looks at its metadata.
    pub fn check_worker_config(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        owner: &AgentName,
        config: &str,
        policy: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(policy) = self.worker_policy(store, tenant, owner, policy)? else {
            return Ok(());
        };
        check_readable("worker.config", config, &self.agent_of(&policy))
    }

    /// A worker's policy as admission will derive it; `None` when the
    /// owner's record cannot be read (admission refuses that itself).
    fn worker_policy(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        owner: &AgentName,
        policy: Option<&Value>,
    ) -> Result<Option<Policy>, ApiError> {
        let preq = match policy.filter(|p| !p.is_null()) {
            Some(v) => brood_proto::policy::from_value(v)
                .map_err(|e| bad(format!("worker.policy: {e}")))?,
            None => PolicyRequest::default(),
        };
        Ok(self.effective(store, tenant, Some(owner), &preq))
    }

    fn agent_of<'a>(&'a self, policy: &'a Policy) -> Agent<'a> {
        Agent {
            uid: policy.uid,
            gid: policy.gid,
            groups: &policy.groups,
            veil: self.veil.as_ref(),
        }
    }

    /// The policy the new agent would get (inheritance only: whether it is
    /// within its parent is admission's question); `None` when the parent's
    /// record cannot be read.
    fn effective(
        &self,
        store: &dyn Store,
        tenant: &TenantId,
        parent: Option<&AgentName>,
        preq: &PolicyRequest,
    ) -> Option<Policy> {
        match parent {
            Some(p) => {
                let a = store.agent(tenant, p).ok().flatten()?;
                let spec: Value = serde_json::from_str(&a.spec).ok()?;
                let pp = crate::objects::policy_of(&spec, &self.operator).ok()?;
                Some(brood_core::policy::effective(&pp, preq))
            }
            None => {
                // A root: what admission derives it from (supervisor::admit).
                let mut op = self.operator.clone();
                if let Some(env) = &preq.env {
                    op.env = env.clone();
                }
                if let Some(m) = &preq.mounts {
                    op.mounts = m.clone();
                }
                Some(brood_core::policy::effective(&op, preq))
            }
        }
    }
}

/// An OS error as the caller is told it: the kind, not the raw text.
fn why(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist",
        std::io::ErrorKind::PermissionDenied => "the supervisor may not look at it",
        _ if e.raw_os_error() == Some(libc::ENOTDIR) => "a component of it is not a directory",
        _ if e.raw_os_error() == Some(libc::ELOOP) => "too many symbolic links",
        _ if e.raw_os_error() == Some(libc::ENAMETOOLONG) => "the name is too long",
        _ => "cannot be looked at",
    }
}

/// Where `p` of the agent's view lies on the host.
fn seen(view: &View<'_>, p: &AbsPath) -> Seen {
    match view {
        View::Host => Seen::At(PathBuf::from(p.as_str())),
        View::Ns { mounts, root } => {
            let deepest = mounts
                .iter()
                .filter(|m| p.is_within(&m.target))
                .max_by_key(|m| m.target.as_str().len());
            if let Some(m) = deepest {
                let rest = p.as_str()[m.target.as_str().len()..].trim_start_matches('/');
                let src = Path::new(m.source.as_str());
                return Seen::At(if rest.is_empty() {
                    src.to_path_buf()
                } else {
                    src.join(rest)
                });
            }
            match root {
                Some(r) => Seen::At(Path::new(r).join(p.as_str().trim_start_matches('/'))),
                None if p.as_str() == "/" => Seen::ScratchRoot,
                None => Seen::Outside,
            }
        }
    }
}

/// Whether the agent holds `bit` (4 read, 2 write, 1 exec/search) on a file
/// with this metadata, by its mode bits and without capabilities.
fn may(m: &std::fs::Metadata, who: &Agent<'_>, bit: u32) -> bool {
    let mode = m.permissions().mode();
    if m.uid() == who.uid {
        mode & (bit << 6) != 0
    } else if m.gid() == who.gid || who.groups.contains(&m.gid()) {
        mode & (bit << 3) != 0
    } else {
        mode & bit != 0
    }
}

/// The agent may walk down to `host` (search on each directory above it).
fn reachable(host: &Path, who: &Agent<'_>) -> Result<(), String> {
    let mut dirs: Vec<&Path> = host.ancestors().skip(1).collect();
    dirs.reverse();
    for d in dirs {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() && !may(&m, who, 1) => {
                return Err(format!(
                    "the agent (uid {}) may not enter {}",
                    who.uid,
                    d.display()
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_cwd(cwd: &str, view: &View<'_>, who: &Agent<'_>) -> Result<(), ApiError> {
    let p = AbsPath::new("cwd", cwd).map_err(|e| bad(e.to_string()))?;
    let host = match seen(view, &p) {
        Seen::ScratchRoot => return Ok(()),
        Seen::Outside => {
            return Err(bad(format!(
                "cwd: {cwd:?} is outside the agent's mount table (iso = ns without root sees only its mounts)"
            )));
        }
        Seen::At(h) => h,
    };
    let m = std::fs::metadata(&host).map_err(|e| bad(format!("cwd: {cwd:?} {}", why(&e))))?;
    if !m.is_dir() {
        return Err(bad(format!("cwd: {cwd:?} is not a directory")));
    }
    if !may(&m, who, 1) {
        return Err(bad(format!(
            "cwd: {cwd:?}: the agent (uid {}) may not enter it",
            who.uid
        )));
    }
    if let Some(what) = who.hidden(&host) {
        return Err(bad(format!(
            "cwd: {cwd:?} is inside {what}, hidden from every agent"
        )));
    }
    reachable(&host, who).map_err(|e| bad(format!("cwd: {cwd:?}: {e}")))
}

/// A file the agent will read (a worker's configuration): regular, readable
/// by its mode bits, reachable, not hidden.
fn check_readable(field: &str, file: &str, who: &Agent<'_>) -> Result<(), ApiError> {
    let p = AbsPath::new(field, file).map_err(|e| bad(e.to_string()))?;
    let host = Path::new(p.as_str());
    let m = std::fs::metadata(host).map_err(|e| bad(format!("{field}: {file:?} {}", why(&e))))?;
    if !m.is_file() {
        return Err(bad(format!("{field}: {file:?} is not a regular file")));
    }
    if !may(&m, who, 4) {
        return Err(bad(format!(
            "{field}: {file:?}: the agent (uid {}) may not read it",
            who.uid
        )));
    }
    if let Some(what) = who.hidden(host) {
        return Err(bad(format!(
            "{field}: {file:?} is inside {what}, hidden from every agent"
        )));
    }
    reachable(host, who).map_err(|e| bad(format!("{field}: {file:?}: {e}")))
}

/// Finds a bare name in `path` as the launcher does (`brood_launch::spawn`):
/// the first regular file with an exec bit, on the host.
fn search(name: &str, path: &str) -> Option<PathBuf> {
    path.split(':').filter(|d| !d.is_empty()).find_map(|d| {
        let cand = Path::new(d).join(name);
        match std::fs::metadata(&cand) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Some(cand),
            _ => None,
        }
    })
}

/// Whether the filesystem holding `p` is mounted `noexec`.
fn noexec(p: &Path) -> bool {
    rustix::fs::statvfs(p).is_ok_and(|s| s.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC))
}

fn check_program(
    field: &str,
    argv: &[String],
    path: &str,
    view: &View<'_>,
    who: &Agent<'_>,
) -> Result<(), ApiError> {
    let Some(prog) = argv.first() else {
        return Err(bad(format!("{field}: argv must name a program")));
    };
    // The path the launcher will exec (absolute), then where it lies on the
    // host: itself, or with `iso = ns` what the mount table puts there.
    let shown: String = if prog.starts_with('/') {
        prog.clone()
    } else if prog.contains('/') {
        return Err(bad(format!(
            "{field}: {prog:?} is a relative path; give the program's absolute path \
             (the supervisor does not run in the caller's directory)"
        )));
    } else {
        search(prog, path)
            .ok_or_else(|| {
                bad(format!(
                    "{field}: {prog:?} is not found in the agent's PATH ({path}); give an absolute path or set PATH in env"
                ))
            })?
            .to_string_lossy()
            .into_owned()
    };
    let (host, mount) = match view {
        View::Host => (PathBuf::from(&shown), None),
        View::Ns { mounts, .. } => {
            let at = AbsPath::new(field, &shown).map_err(|e| bad(e.to_string()))?;
            let mount = mounts
                .iter()
                .filter(|m| at.is_within(&m.target))
                .max_by_key(|m| m.target.as_str().len());
            match seen(view, &at) {
                Seen::At(h) => (h, mount),
                Seen::ScratchRoot | Seen::Outside => {
                    return Err(bad(format!(
                        "{field}: {prog:?} ({shown}) is outside the agent's mount table"
                    )));
                }
            }
        }
    };
    let m = std::fs::metadata(&host).map_err(|e| bad(format!("{field}: {prog:?} {}", why(&e))))?;
    if !m.is_file() {
        return Err(bad(format!(
            "{field}: {prog:?} ({shown}) is not a regular file"
        )));
    }
    if !may(&m, who, 1) {
        return Err(bad(format!(
            "{field}: {prog:?} ({shown}) is not executable by the agent (uid {})",
            who.uid
        )));
    }
    reachable(&host, who).map_err(|e| bad(format!("{field}: {prog:?}: {e}")))?;
    if let Some(what) = who.hidden(&host) {
        return Err(bad(format!(
            "{field}: {prog:?} ({shown}) is inside {what}, hidden from every agent"
        )));
    }
    if noexec(&host) || mount.is_some_and(|m| m.opts.noexec) {
        return Err(bad(format!(
            "{field}: {prog:?} ({shown}) is on a filesystem mounted noexec"
        )));
    }
    Ok(())
}

pub(crate) fn unsafe_getegid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The supervisor's supplementary groups (getgroups(2)).
pub(crate) fn supplementary_groups() -> std::collections::BTreeSet<u32> {
    let mut buf = vec![0 as libc::gid_t; 256];
    // SAFETY: the buffer holds 256 entries and we pass its length.
    let n = unsafe { libc::getgroups(buf.len() as libc::c_int, buf.as_mut_ptr()) };
    buf.truncate(n.max(0) as usize);
    buf.into_iter().collect()
}

pub(crate) fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn me() -> (u32, u32, BTreeSet<u32>) {
        // SAFETY: plain id getters.
        unsafe { (libc::geteuid(), libc::getegid(), BTreeSet::new()) }
    }

    #[test]
    fn programs_and_directories_in_the_hosts_view() {
        let (uid, gid, groups) = me();
        let who = Agent {
            uid,
            gid,
            groups: &groups,
            veil: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        check_cwd(&d, &View::Host, &who).unwrap();
        let e = check_cwd(&format!("{d}/missing"), &View::Host, &who).unwrap_err();
        assert!(
            e.message.starts_with("cwd:") && e.message.contains("does not exist"),
            "{}",
            e.message
        );
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let f = file.display().to_string();
        let e = check_cwd(&f, &View::Host, &who).unwrap_err();
        assert!(e.message.contains("not a directory"), "{}", e.message);
        // Not executable, then executable.
        let e =
            check_program("argv[0]", std::slice::from_ref(&f), "", &View::Host, &who).unwrap_err();
        assert!(e.message.contains("not executable"), "{}", e.message);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_program("argv[0]", std::slice::from_ref(&f), "", &View::Host, &who).unwrap();
        // An absolute path is taken as the kernel takes it, `.` and `..` too.
        let roundabout = format!("{d}/./x/../f");
        std::fs::create_dir(dir.path().join("x")).unwrap();
        check_program("argv[0]", &[roundabout], "", &View::Host, &who).unwrap();
        // A bare name: found in the PATH given, not elsewhere.
        check_program("argv[0]", &["f".into()], &d, &View::Host, &who).unwrap();
        let e = check_program(
            "argv[0]",
            &["f".into()],
            "/nonexistent-dir",
            &View::Host,
            &who,
        )
        .unwrap_err();
        assert!(
            e.message.contains("not found in the agent's PATH"),
            "{}",
            e.message
        );
        let e = check_program("argv[0]", &["./f".into()], &d, &View::Host, &who).unwrap_err();
        assert!(e.message.contains("relative path"), "{}", e.message);
        let e =
            check_program("argv[0]", std::slice::from_ref(&d), "", &View::Host, &who).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{}", e.message);
    }

    #[test]
    fn a_private_mount_table_maps_paths_to_their_sources() {
        let m = |s: &str, t: &str| MountEntry {
            source: AbsPath::new("s", s).unwrap(),
            target: AbsPath::new("t", t).unwrap(),
            rw: false,
            opts: Default::default(),
        };
        let mounts = vec![m("/srv/data", "/data"), m("/usr", "/usr")];
        let view = View::Ns {
            mounts: &mounts,
            root: None,
        };
        let at = |p: &str| match seen(&view, &AbsPath::new("p", p).unwrap()) {
            Seen::At(h) => Some(h.display().to_string()),
            Seen::ScratchRoot => Some("scratch".into()),
            Seen::Outside => None,
        };
        assert_eq!(at("/data/x/y").as_deref(), Some("/srv/data/x/y"));
        assert_eq!(at("/data").as_deref(), Some("/srv/data"));
        assert_eq!(at("/usr/bin/env").as_deref(), Some("/usr/bin/env"));
        assert_eq!(at("/").as_deref(), Some("scratch"));
        assert_eq!(at("/etc"), None);
        let rooted = View::Ns {
            mounts: &mounts,
            root: Some("/r"),
        };
        match seen(&rooted, &AbsPath::new("p", "/etc/x").unwrap()) {
            Seen::At(h) => assert_eq!(h, PathBuf::from("/r/etc/x")),
            _ => panic!("a root holds what no mount covers"),
        }
    }
}
