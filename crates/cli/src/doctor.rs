//! `brood doctor`: what this host offers and what brood enforces here, and
//! whether the services the command line names answer: the store (a SQLite
//! file or a PostgreSQL server, with its schema version) and the slot
//! counter's Redis.

use std::path::Path;

use anyhow::Result;
use brood_launch::{cgroup, host};
use serde_json::{Value, json};

/// What `brood doctor` looks at besides the host: the global options.
pub struct Services<'a> {
    /// `--store` (a file or a URL), else the root's `brood.db`.
    pub store: Option<&'a Path>,
    /// `--slots`.
    pub slots: Option<&'a str>,
}

/// Exit 0 when the store and the slot counter answer (a host layer that is
/// missing is reported, not a failure: brood runs weaker there), 1 when one
/// of them does not (a supervisor could not start with them).
pub fn run(root: &Path, services: &Services<'_>, json_out: bool, fix: bool) -> Result<i32> {
    let mut layers: Vec<(String, bool, String)> = Vec::new();
    let db = services
        .store
        .map_or_else(|| root.join("brood.db"), Path::to_path_buf);
    layers.push(("store".into(), true, String::new()));
    match store_check(&db) {
        Ok(d) => layers[0].2 = d,
        Err(e) => layers[0] = ("store".into(), false, e),
    }
    let postgres = brood_store::is_postgres_url(&db.to_string_lossy());
    layers.push(match slots_check(services.slots, postgres) {
        Ok(d) => ("slots".into(), true, d),
        Err(e) => ("slots".into(), false, e),
    });
    let services_ok = layers.iter().all(|(_, ok, _)| *ok);
    let det = cgroup::detect(Path::new("/"));
    match &det {
        Ok(d) => {
            layers.push((
                "cgroup".into(),
                !matches!(d.layout, cgroup::Layout::Unavailable),
                format!(
                    "{}; v2 at {} (controllers: {}); v1 controllers: {}",
                    d.layout,
                    d.v2_mount
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "-".into()),
                    if d.v2_controllers.is_empty() {
                        "none".into()
                    } else {
                        d.v2_controllers.join(" ")
                    },
                    d.v1_mounts.keys().cloned().collect::<Vec<_>>().join(" "),
                ),
            ));
        }
        Err(e) => layers.push(("cgroup".into(), false, e.to_string())),
    }
    let instance = format!("doctor-{}", std::process::id());
    let mut limits: Vec<(&'static str, bool)> = Vec::new();
    let kill = det
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|d| cgroup::Cgroups::open(d, &instance).map_err(|e| e.to_string()))
        .map(|c| {
            limits = c.limits_supported();
            let k = c.kill_mechanism().to_owned();
            let _ = c.destroy();
            // The probe's own instance directory is of no use to anyone afterwards.
            c.remove_instance_dirs();
            k
        });
    layers.push(match kill {
        Ok(k) => ("kill".into(), true, format!("{k} on the agent's group (whole subtree, setsid'd processes included)")),
        Err(e) => ("kill".into(), false, format!("no cgroup can be made here ({e}); process groups plus a subreaper (a setsid'd process can escape)")),
    });
    if let Ok(d) = &det {
        layers.push(leftovers(d, fix));
    }
    for (what, ok) in &limits {
        layers.push(("limits".into(), *ok, (*what).to_owned()));
    }
    let abi = host::landlock_abi();
    match &abi {
        Ok(v) => {
            layers.push((
                "landlock".into(),
                true,
                format!("ABI {v}: files (read, write, execute)"),
            ));
            layers.push((
                "landlock-net".into(),
                *v >= 4,
                "TCP connect and bind by port (ABI 4+)".into(),
            ));
            layers.push((
                "landlock-scope".into(),
                *v >= 6,
                "signals and abstract sockets kept inside the sandbox (ABI 6+)".into(),
            ));
        }
        Err(e) => layers.push(("landlock".into(), false, e.clone())),
    }
    for (name, flag) in [
        ("user namespace", libc::CLONE_NEWUSER),
        ("mount namespace", libc::CLONE_NEWNS),
        ("pid namespace", libc::CLONE_NEWPID),
        ("network namespace", libc::CLONE_NEWNET),
    ] {
        match host::can_unshare(flag) {
            Ok(()) => layers.push((name.into(), true, "can be created".into())),
            Err(e) => layers.push((name.into(), false, e)),
        }
    }
    match host::seccomp() {
        Ok(s) => layers.push(("seccomp".into(), true, s)),
        Err(e) => layers.push(("seccomp".into(), false, e)),
    }
    // The veil (issue 11): the mount namespace every agent joins, covering brood's
    // own machinery; it needs root (no user namespace is involved).
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let mountns = layers
        .iter()
        .any(|(n, ok, _)| n == "mount namespace" && *ok);
    let paths =
        brood_runtime::paths::Paths::new(root.to_path_buf(), euid).with_db(Some(db.clone()));
    let veil = if euid != 0 {
        Err("brood is not root here: it cannot mount, so agents share its uid and only landlock keeps them from the store".to_owned())
    } else if !mountns {
        Err("no mount namespace can be made here".to_owned())
    } else {
        brood_runtime::veil::Veil::new(&paths, &[]).map(|v| v.describe().join("; "))
    };
    let veiled = veil.is_ok();
    layers.push(match veil {
        Ok(d) => (
            "veil".into(),
            true,
            format!("covered in the mount namespace every agent joins: {d}"),
        ),
        Err(e) => ("veil".into(), false, e),
    });
    let pidns = layers.iter().any(|(n, ok, _)| n == "pid namespace" && *ok);
    let cg = layers.iter().any(|(n, ok, _)| n == "kill" && *ok);
    let enforced: Vec<String> = vec![
        if cg {
            "containment: each agent in its own cgroup nested under its parent's; a stop kills the whole subtree with one kill".into()
        } else {
            "containment: process groups and a subreaper only (weaker: setsid escapes)".into()
        },
        if pidns {
            "supervisor death: agents live in a PID namespace whose init dies with the supervisor, so every process dies with it".into()
        } else {
            "supervisor death: PR_SET_PDEATHSIG only (weaker: grandchildren may survive until the next start)".into()
        },
        "PR_SET_PDEATHSIG=SIGKILL on every agent, tied to a supervisor thread".into(),
        if veiled {
            "brood's machinery out of reach: no agent can open a cgroup hierarchy (to leave its group, raise a limit or kill a sibling's group), brood's root outside ctx/, or the store's files, whatever its policy; a policy naming them is refused ReservedPath".into()
        } else {
            "brood's machinery NOT hidden: an agent whose policy grants it can write the store and the cgroup hierarchies (a supervisor that is not root has only landlock)".into()
        },
        if pidns {
            "the supervisor and the keeper: outside the agents' reach (the supervisor is not in their PID namespace; the keeper is its init and ignores their signals; ptrace needs capabilities agents lack)".into()
        } else {
            "the supervisor: not in a PID namespace of its own; agents are kept from it by dropped capabilities and landlock's scoping of signals".into()
        },
        "the control socket: callers identified from the cgroup of the peer's pid (or the door they came through), so an agent acts only as itself".into(),
        if cg {
            "collecting a result: the child's whole group is killed and emptied before its refs and artifacts are read; each is opened with openat2 following no link anywhere, only if it is a regular file, at most 1 GiB, within 60 s, on a thread confined with the child's ids, capabilities and landlock ruleset".into()
        } else {
            "collecting a result: the child's process group is signalled first (weaker: a setsid'd process may still run and swap files; opened as below all the same); each ref and artifact is opened with openat2 following no link anywhere, only if it is a regular file, at most 1 GiB, within 60 s, on a thread confined with the child's ids, capabilities and landlock ruleset".into()
        },
        "environment built from nothing (BROOD_* identity, HOME PATH LANG TERM, the policy's env)".into(),
        "always: no_new_privs, every capability dropped for agents started by root, file descriptors closed before exec".into(),
        match &abi {
            Ok(v) if *v >= 4 => "policy files and network: landlock (a layer a policy needs but the host lacks stops the start unless --allow-weaker-sandbox)".into(),
            Ok(_) => "policy files: landlock; network rules need landlock ABI 4, missing here: a policy limiting the network cannot start without --allow-weaker-sandbox".into(),
            Err(_) => "landlock missing: a policy limiting files or network cannot start without --allow-weaker-sandbox".into(),
        },
        if limits.iter().all(|(_, ok)| *ok) && !limits.is_empty() {
            "policy resources: memory_max, pids_max and cpu_weight as cgroup limits".into()
        } else {
            "policy resources: only the limits listed as available above".into()
        },
        match brood_launch::written::available() {
            Ok(()) => "disk: resources.disk_max (default [resources] disk_max, 1 GiB) is RLIMIT_FSIZE on every agent, so no file it writes grows past it, and its write budget: what its processes write to disk anywhere is summed each sweeper tick (the kernel's per-process write accounting) and the agent stopped past it, fallocate and clearing its orphans' reaper refused; its channel's artifact/ is measured the same way; a refused or unrecorded result leaves nothing in artifact/ or the blob store (docs/security.md \"Disk\")".into(),
            Err(why) => format!("disk: resources.disk_max is RLIMIT_FSIZE on every agent and bounds its channel's artifact/, but the total it writes over many files is NOT bounded: {why} (docs/security.md \"Disk\")"),
        },
        "iso = ns: a private mount namespace from the policy's mounts (and an empty network namespace for network none)".into(),
        "tools: the runtime refuses create send wait close resume job unless granted; without shell or code_exec only the agent's own program may run".into(),
        if layers.iter().any(|(n, ok, _)| n == "seccomp" && *ok) {
            "sockets: an agent that is not network: all may make no UNIX, UDP, raw or netlink socket nor an io_uring (a seccomp filter); network none: no socket at all; it reaches its own supervisor through its door (docs/security.md)".into()
        } else {
            "sockets NOT filtered: no seccomp filters here; a policy limiting the network cannot start without --allow-weaker-sandbox".into()
        },
        if veiled {
            "other trees: an agent whose grants reach the ctx tree sees only its own part of it (a mount namespace of its own); /proc shows an agent its own processes only (hidepid=ptraceable)".into()
        } else {
            "other trees: landlock only (no veil here): an agent granted a path above the ctx tree reads other agents' files, and /proc is the host's".into()
        },
        "callers: the operator is a caller the kernel proves outside every agent of every brood daemon on the host (uid, cgroups, PID and user namespaces); the TCP token counts only from such a process".into(),
    ];
    let out = json!({
        "root": root.display().to_string(),
        "layers": layers.iter().map(|(n, ok, d)| json!({"layer": n, "available": ok, "detail": d})).collect::<Vec<Value>>(),
        "enforced": enforced,
    });
    if json_out {
        println!("{out}");
    } else {
        println!("root: {}", root.display());
        for (n, ok, d) in &layers {
            println!(
                "{:<18} {:<13} {d}",
                n,
                if *ok { "available" } else { "NOT available" }
            );
        }
        println!("enforced here:");
        for e in &enforced {
            println!("  - {e}");
        }
    }
    Ok(if services_ok { 0 } else { 1 })
}

/// What dead supervisors left on this host (issue 28): listed, or with `fix`
/// removed, every root's (a leftover holding processes has them killed:
/// nothing answers for them). Dead is told by an incarnation's liveness
/// mark, or without one by its pid in this PID namespace (the host's, where
/// the operator runs this). Available when nothing is left afterwards.
fn leftovers(det: &cgroup::Detected, fix: bool) -> (String, bool, String) {
    let name = "leftovers".to_owned();
    if fix {
        return match cgroup::Cgroups::reap_host(det, None, true) {
            Ok(l) => {
                let killed: usize = l.reaped.values().map(|r| r.pids_killed.len()).sum();
                let marks: usize = l.reaped.values().map(|r| r.marks).sum();
                (
                    name,
                    true,
                    format!(
                        "removed {} group(s) of dead supervisors ({killed} process(es) killed), {marks} liveness mark(s) left without a group and {} empty instance director(ies)",
                        l.groups(),
                        l.instance_dirs_removed
                    ),
                )
            }
            Err(e) => (
                name,
                false,
                format!("removing the groups of dead supervisors failed: {e}"),
            ),
        };
    }
    match cgroup::dead_on_host(det) {
        Ok(dead) if dead.is_empty() => (name, true, "no group of a dead supervisor".into()),
        Ok(dead) => (
            name,
            false,
            format!(
                "{} group(s) of dead supervisors ({}); `brood doctor --fix` removes them",
                dead.len(),
                dead.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => (
            name,
            false,
            format!("looking for the groups of dead supervisors failed: {e}"),
        ),
    }
}

/// The store: its kind, where it is, whether it opens and its schema
/// version against this build's.
fn store_check(db: &Path) -> Result<String, String> {
    let shown = crate::store_url::shown(db);
    let spec = db.to_string_lossy();
    let kind = if brood_store::is_postgres_url(&spec) {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    match brood_store::schema_version(&spec) {
        Ok(None) => Ok(format!(
            "SQLite {shown}: not made yet; the first supervisor makes it (mode 0600)"
        )),
        Ok(Some(v)) if v.applied > v.latest => Err(format!(
            "{kind} {shown}: schema version {}, newer than this build's ({}): this brood cannot use it",
            v.applied, v.latest
        )),
        Ok(Some(v)) if v.applied < v.latest => Ok(format!(
            "{kind} {shown}: opens; schema version {} (the next supervisor brings it to {})",
            v.applied, v.latest
        )),
        Ok(Some(v)) => Ok(format!(
            "{kind} {shown}: opens; schema version {} (this build's)",
            v.applied
        )),
        Err(e) => Err(format!("{kind} {shown}: {e}")),
    }
}

/// The concurrency-slot counter: `--slots redis://…` must answer PING.
fn slots_check(slots: Option<&str>, postgres: bool) -> Result<String, String> {
    match slots {
        None if postgres => Ok(
            "the store's shares (no --slots: the nodes of the PostgreSQL store count slots in it)"
                .into(),
        ),
        None => Ok("embedded (no --slots: one supervisor counts its own slots)".into()),
        Some(url) => brood_runtime::slots::Redis::connect(url, "doctor")
            .map(|_| format!("Redis {url}: answers PING"))
            .map_err(|e| e.to_string()),
    }
}
