//! What the kernel says, read without asking brood: the agents' processes
//! (by the environment every agent process carries, `BROOD_AGENT` and
//! `CTX_ROOT`, read from /proc), the nodes' cgroups, and what is left in the
//! roots and the machine's temporary places.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A process of an agent: its pid and the root (node) it runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub node: usize,
}

/// Whether the process exists, a zombie included (an unreaped process is a
/// process left behind).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "X"),
        Err(_) => false,
    }
}

/// The process's state letter (`R`, `S`, `Z` for a zombie, ...), while it
/// exists.
pub fn state(pid: i32) -> Option<char> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()?
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|s| s.chars().next())
}

/// The pids in a cgroup directory and the groups below it (none when it is
/// gone).
pub fn pids_in(dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            dirs.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every agent process under the roots, by agent name.
pub fn agent_processes(roots: &[PathBuf]) -> BTreeMap<String, Vec<Proc>> {
    let ctx: Vec<Vec<u8>> = roots
        .iter()
        .map(|r| format!("CTX_ROOT={}", r.join("ctx").display()).into_bytes())
        .collect();
    let mut out: BTreeMap<String, Vec<Proc>> = BTreeMap::new();
    for pid in pids() {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let Some(node) = ctx.iter().position(|c| vars.contains(&c.as_slice())) else {
            continue;
        };
        let Some(name) = vars
            .iter()
            .find_map(|v| v.strip_prefix(b"BROOD_AGENT=".as_slice()))
        else {
            continue;
        };
        if alive(pid) {
            out.entry(String::from_utf8_lossy(name).into_owned())
                .or_default()
                .push(Proc { pid, node });
        }
    }
    out
}

/// Every process but this one that names a root on its command line or in
/// its environment (a node, an agent, anything they started).
pub fn processes_of_roots(roots: &[PathBuf]) -> Vec<String> {
    let me = std::process::id() as i32;
    let keys: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    let mut out = Vec::new();
    for pid in pids() {
        if pid == me || !alive(pid) {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let (cmd, env) = (
            String::from_utf8_lossy(&cmd).replace('\0', " "),
            String::from_utf8_lossy(&env),
        );
        if keys
            .iter()
            .any(|k| cmd.contains(k.as_str()) || env.contains(k.as_str()))
        {
            out.push(format!("pid {pid}: {}", cmd.trim()));
        }
    }
    out
}

/// The `brood-<instance>` groups of `root` in every hierarchy (our own group
/// of each is a few levels down at most), and the incarnations under each.
pub fn groups_of(root: &Path) -> Vec<PathBuf> {
    let prefix = format!("brood-{}", brood_runtime::paths::instance_key(root));
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for h in rd.flatten() {
        find(&h.path(), &prefix, 5, &mut out);
    }
    out.sort();
    out
}

fn find(dir: &Path, prefix: &str, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(prefix) {
            out.push(e.path());
        } else if depth > 0 && !name.starts_with("brood-") {
            find(&e.path(), prefix, depth - 1, out);
        }
    }
}

/// The incarnation groups (`s<pid>-<start>`) under `root`'s groups whose pid
/// is not `live` (the node's running process, if any).
pub fn dead_incarnations(root: &Path, live: Option<u32>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for g in groups_of(root) {
        let Ok(rd) = std::fs::read_dir(&g) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix('s')
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if e.file_type().is_ok_and(|t| t.is_dir()) && Some(pid) != live {
                out.push(e.path());
            }
        }
    }
    out
}

/// Files a write left half-done in a root (`.<name>.tmp.<pid>...`, the
/// projection's temp files).
pub fn temp_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                dirs.push(e.path());
            } else if e.file_name().to_string_lossy().contains(".tmp.") {
                out.push(e.path());
            }
        }
    }
    out
}

/// The entries of /dev/shm and the `brood-*` entries of the temporary
/// directory: taken before a campaign and after, what is new was left.
pub fn scratch() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        out.extend(rd.flatten().map(|e| e.path()));
    }
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        out.extend(
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("brood-"))
                .map(|e| e.path()),
        );
    }
    out
}
