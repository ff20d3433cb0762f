//! Who is calling on a socket (the control socket, an agent's socket), from
//! the kernel's word only: the peer's pid and uid from its credentials, then
//! that process's cgroups, its namespaces and its ancestry in `/proc`, never
//! anything the caller says (SPEC 5, "a supervisor socket that decides who is
//! calling from the caller's cgroup"; issues 11 and 24).
//!
//! A caller inside one of this supervisor's live agents is that agent. Every
//! other caller is the operator only when the kernel proves it is one
//! ([`Dispatcher::identify`]): it has the supervisor's uid, and it is outside
//! every agent of *every* brood supervisor on the host and outside every
//! namespace brood makes. Anything else is refused with the reason, never
//! taken for the operator: an agent of another daemon (its cgroup lies under
//! a `brood-*` group that is not one of this supervisor's ancestors, or it
//! lives in another PID namespace, as every agent under a keeper does), a
//! process inside this supervisor's trees that no live agent accounts for (a
//! grandchild left behind while its agent is stopped), or another user.

use std::path::Path;

use brood_core::AgentName;

use super::agents::Agents;
use super::host::Host;
use super::launcher::Launcher;
use crate::api::Caller;

/// How many parents are followed at most: a chain longer than any real
/// process tree means something is off, and the caller is not trusted.
const MAX_ANCESTRY: usize = 4096;

/// The prefix of every cgroup brood makes (`brood-<root key>`, the
/// benchmark's `brood-benchfloor-*`), on every hierarchy.
const BROOD_GROUP: &str = "brood-";

impl Host {
    /// The caller behind `pid` (with the credentials' `uid`), or why it is
    /// refused.
    pub(super) fn identify(
        &self,
        launcher: &Launcher,
        agents: &Agents,
        pid: i32,
        uid: u32,
    ) -> Result<Caller, String> {
        let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            // Gone already, or not ours to read: not the operator's word.
            return Err(format!(
                "the caller (pid {pid}) could not be looked at in /proc"
            ));
        };
        let mut inside = false;
        if let Some(cg) = &launcher.cgroups
            && let Some(path) = cg.path_of_process_line(&cgroups)
        {
            // The deepest live agent whose group contains the caller's cgroup.
            let mut best: Option<(&AgentName, usize)> = None;
            for (name, l) in &agents.live {
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
                return Ok(Caller::Agent(n.clone()));
            }
            inside = path.starts_with(cg.base());
        }
        // Ancestry: the nearest live agent above the caller (what the
        // fallback without cgroups has, and a second check with them).
        let me = std::process::id() as i32;
        let mut p = pid;
        for _ in 0..MAX_ANCESTRY {
            if let Some((n, _)) = agents.live.iter().find(|(_, l)| l.pid == Some(p)) {
                return Ok(Caller::Agent(n.clone()));
            }
            match parent_of(p) {
                Some(pp) if pp == me => {
                    // A child of the supervisor that is no live agent. With a
                    // PID namespace, orphans go to its keeper, so this is a
                    // program the supervisor's host process started itself;
                    // without one, it is an orphan of a tree the supervisor
                    // adopted as subreaper.
                    inside |= launcher.spawner.keeper_pid().is_none();
                    break;
                }
                Some(pp) if pp > 0 => p = pp,
                _ => break,
            }
        }
        if let Some(keeper) = launcher.spawner.keeper_pid()
            && same_namespace("pid", pid, keeper)
        {
            inside = true;
        }
        if inside {
            return Err(format!(
                "the caller (pid {pid}) is inside an agent tree but belongs to no live agent"
            ));
        }
        // Not one of ours: the operator only if the kernel says so.
        if uid != self.uid {
            return Err(format!(
                "the caller (pid {pid}) runs as uid {uid}; only this supervisor's user (uid {}) \
                 is its operator",
                self.uid
            ));
        }
        if let Some(why) = in_another_brood_tree(&cgroups, &self.own_cgroups) {
            return Err(format!("the caller (pid {pid}) is {why}"));
        }
        for ns in ["pid", "user"] {
            if !same_namespace(ns, pid, me) {
                return Err(format!(
                    "the caller (pid {pid}) is in another {ns} namespace than this supervisor \
                     (as an agent of any brood supervisor is), so it is not taken for the operator"
                ));
            }
        }
        Ok(Caller::User { uid })
    }
}

/// Whether a process whose `/proc/PID/cgroup` reads `peer` sits under a
/// brood group that is not an ancestor of this supervisor's own groups
/// (`own`, its `/proc/self/cgroup`): a process inside an agent of another
/// brood supervisor, on any hierarchy. `Some(why)` names the group.
pub(crate) fn in_another_brood_tree(peer: &str, own: &str) -> Option<String> {
    for line in peer.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        // This supervisor's group on the same hierarchy (matched by the
        // hierarchy's id and controllers), or the root when it has none.
        let mine = own
            .lines()
            .find_map(|l| {
                let mut p = l.splitn(3, ':');
                (p.next() == Some(id) && p.next() == Some(ctrls))
                    .then(|| p.next())
                    .flatten()
            })
            .unwrap_or("/");
        let theirs: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let ours: Vec<&str> = mine.split('/').filter(|c| !c.is_empty()).collect();
        let shared = theirs.iter().zip(&ours).take_while(|(a, b)| a == b).count();
        if let Some(c) = theirs[shared..].iter().find(|c| c.starts_with(BROOD_GROUP)) {
            return Some(format!(
                "inside a brood agent tree (cgroup {path}, under {c}), not this supervisor's operator"
            ));
        }
        // This supervisor itself runs inside a brood tree (nested): a caller
        // on another branch of that tree is another agent of it. Only its
        // own group's line (the agent it runs in, above or below it) is
        // its operator's.
        let branched = shared < theirs.len() && shared < ours.len();
        if branched && let Some(c) = ours[..shared].iter().find(|c| c.starts_with(BROOD_GROUP)) {
            return Some(format!(
                "in another agent (cgroup {path}) of the brood tree {c} this supervisor runs in"
            ));
        }
    }
    None
}

/// The parent's pid from `/proc/<pid>/stat` (proc(5): the field after the
/// command, which is in parentheses and may itself hold spaces or parens).
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether two processes are in the same namespace of a kind (`pid`, `user`,
/// ...): the same inode behind `/proc/<pid>/ns/<kind>` (namespaces(7)). Not
/// known counts as not the same.
fn same_namespace(kind: &str, a: i32, b: i32) -> bool {
    let ns = |p: i32| std::fs::read_link(Path::new(&format!("/proc/{p}/ns/{kind}"))).ok();
    match (ns(a), ns(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &str = "12:pids:/user.slice\n0::/user.slice/session-3.scope\n";

    #[test]
    fn a_process_under_another_daemons_brood_group_is_named() {
        let peer =
            "12:pids:/user.slice\n0::/system.slice/other.service/brood-1a2b/s9-1/user-0/r1.x\n";
        let why = in_another_brood_tree(peer, OWN).unwrap();
        assert!(why.contains("brood-1a2b"), "{why}");
        // The same on a v1 hierarchy alone.
        let peer = "12:pids:/user.slice/brood-77/s1-2\n0::/user.slice\n";
        assert!(in_another_brood_tree(peer, OWN).is_some());
    }

    #[test]
    fn a_plain_process_and_a_supervisor_nested_in_a_tree_are_not() {
        let peer = "12:pids:/user.slice\n0::/user.slice/session-9.scope\n";
        assert_eq!(in_another_brood_tree(peer, OWN), None);
        // This supervisor itself runs inside a brood agent: the groups it
        // shares with the caller are its own ancestors, not another tree.
        let own = "0::/x/brood-aa/s1-1/user-0/r1.outer\n";
        let peer = "0::/x/brood-aa/s1-1/user-0/r1.outer/shell\n";
        assert_eq!(in_another_brood_tree(peer, own), None);
        let peer = "0::/x/brood-aa/s1-1/user-0\n";
        assert_eq!(in_another_brood_tree(peer, own), None);
        // ... but a sibling agent of the outer tree is another agent.
        let peer = "0::/x/brood-aa/s1-1/user-0/r1.sibling\n";
        let why = in_another_brood_tree(peer, own).unwrap();
        assert!(why.contains("r1.sibling"), "{why}");
        let peer = "0::/x/brood-aa/s1-1/user-0/r1.sibling/brood-bb/s2-2\n";
        assert!(in_another_brood_tree(peer, own).is_some());
    }
}
