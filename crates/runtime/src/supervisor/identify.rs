//! Who is calling on a socket (the control socket, an agent's socket), from
//! the kernel's word only: the peer's pid from its credentials, then that
//! process's cgroup, its PID namespace and its ancestry in `/proc`, never
//! anything the caller says (SPEC 5, "a supervisor socket that decides who is
//! calling from the caller's cgroup"; issue 11 item 3).
//!
//! A caller is the operator only when it is provably outside every tree:
//! not in a group under this supervisor's cgroup base, not in the agents' PID
//! namespace, and not a descendant of a live agent or (without a PID
//! namespace, where orphans come to the supervisor as subreaper) of the
//! supervisor itself through a process no live agent accounts for. A process
//! that is inside a tree but belongs to no live agent (a grandchild left
//! behind while its agent is stopped, say) is nobody: its calls are refused.

use std::path::Path;

use brood_core::AgentName;

use super::Dispatcher;
use crate::api::Caller;

/// How many parents are followed at most: a chain longer than any real
/// process tree means something is off, and the caller is not trusted.
const MAX_ANCESTRY: usize = 4096;

impl Dispatcher {
    /// `Some(caller)`, or `None` for a process inside a tree that no live
    /// agent accounts for.
    pub(super) fn identify(&self, pid: i32) -> Option<Caller> {
        let operator = Caller::User { uid: 0 };
        let mut inside = false;
        if let Some(cg) = &self.cgroups {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
                // Gone already, or not ours to read: not the operator's word.
                return None;
            };
            if let Some(path) = cg.path_of_process_line(&text) {
                // The deepest live agent whose group contains the caller's cgroup.
                let mut best: Option<(&AgentName, usize)> = None;
                for (name, l) in &self.live {
                    if let Some(g) = &l.group
                        && path.starts_with(&g.dir)
                    {
                        let depth = g.dir.components().count();
                        if best.is_none_or(|(_, d)| depth > d) {
                            best = Some((name, depth));
                        }
                    }
                }
                if let Some((n, _)) = best {
                    return Some(Caller::Agent(n.clone()));
                }
                inside = path.starts_with(cg.base());
            }
        }
        // Ancestry: the nearest live agent above the caller (what the
        // fallback without cgroups has, and a second check with them).
        let me = std::process::id() as i32;
        let mut p = pid;
        for _ in 0..MAX_ANCESTRY {
            if let Some((n, _)) = self.live.iter().find(|(_, l)| l.pid == Some(p)) {
                return Some(Caller::Agent(n.clone()));
            }
            match parent_of(p) {
                Some(pp) if pp == me => {
                    // A child of the supervisor that is no live agent. With a
                    // PID namespace, orphans go to its keeper, so this is a
                    // program the supervisor's host process started itself;
                    // without one, it is an orphan of a tree the supervisor
                    // adopted as subreaper.
                    inside |= self.keeper_pid().is_none();
                    break;
                }
                Some(pp) if pp > 0 => p = pp,
                _ => break,
            }
        }
        if let Some(keeper) = self.keeper_pid()
            && same_pid_namespace(pid, keeper)
        {
            inside = true;
        }
        (!inside).then_some(operator)
    }

    fn keeper_pid(&self) -> Option<i32> {
        self.spawner.keeper_pid()
    }
}

/// The parent's pid from `/proc/<pid>/stat` (proc(5): the field after the
/// command, which is in parentheses and may itself hold spaces or parens).
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether two processes are in the same PID namespace (the same inode
/// behind `/proc/<pid>/ns/pid`, namespaces(7)).
fn same_pid_namespace(a: i32, b: i32) -> bool {
    let ns = |p: i32| std::fs::read_link(Path::new(&format!("/proc/{p}/ns/pid"))).ok();
    match (ns(a), ns(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}
