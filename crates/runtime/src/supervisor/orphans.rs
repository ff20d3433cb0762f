//! Reaping the orphans the supervisor adopts (issue 11 item 3). Without a
//! PID namespace the supervisor is its agents' subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so a grandchild whose parent died is re-parented
//! to it, and when that grandchild exits it stays a zombie until someone waits
//! for it. `waitpid(-1)` would steal the exit statuses the agents' IO tasks
//! wait for (LINUX-NOTES), so each tick the supervisor lists its own children
//! (`/proc/self/task/*/children`, proc(5)), and reaps, by pid, the zombies
//! that are no live agent and were already zombies, not live agents, at the
//! previous tick: an agent that just started and died at once is in the live
//! set by then (its start is recorded within milliseconds), so its IO task
//! keeps its exit status.

use std::collections::HashSet;

use brood_launch::Spawner;

use super::agents::Agents;

/// A part of the supervisor: what it remembers of its adopted children and
/// of the keeper between ticks.
#[derive(Default)]
pub(super) struct Orphans {
    /// Zombie children no live agent accounted for at the last tick.
    zombies: HashSet<i32>,
    /// Keeper deaths already reported.
    keeper_deaths: u64,
}

impl Orphans {
    /// Reaps the zombies among the supervisor's children that no live agent
    /// accounts for (see the module docs). With a PID namespace, its keeper
    /// reaps orphans instead, and this does nothing.
    pub(super) fn reap(&mut self, spawner: &Spawner, agents: &Agents) {
        if spawner.keeper_pid().is_some() {
            return;
        }
        let live: HashSet<i32> = agents.live.values().filter_map(|l| l.pid).collect();
        let zombies: HashSet<i32> = own_children()
            .into_iter()
            .filter(|p| !live.contains(p) && is_zombie(*p))
            .collect();
        for pid in zombies.intersection(&self.zombies) {
            let mut status = 0;
            // SAFETY: waitpid(2) on one pid, without blocking; it is a zombie
            // child no IO task waits for (see the module docs).
            let got = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
            if got == *pid {
                tracing::debug!(pid, "reaped an orphan adopted as subreaper");
            }
        }
        self.zombies = zombies;
    }

    /// The keeper is PID 1 of the agents' namespace; if it dies (killed by
    /// the operator, the OOM killer), the kernel kills every agent with it
    /// and the namespace takes no new process. The spawner replaces it
    /// before the next launch; this looks every tick so the death is reported
    /// when it happens, not when the next start fails.
    pub(super) fn watch_keeper(&mut self, spawner: &Spawner) {
        spawner.check_keeper();
        let deaths = spawner.keeper_deaths();
        if deaths > self.keeper_deaths {
            tracing::error!(
                deaths,
                keeper = ?spawner.keeper_pid(),
                "the keeper (PID 1 of the agents' namespace) died, and every agent in its \
                 namespace with it; a new keeper was started for the next agents"
            );
            self.keeper_deaths = deaths;
        }
    }
}

/// The pids of this process's children, over all its threads.
fn own_children() -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st == "Z"))
        })
        .unwrap_or(false)
}
