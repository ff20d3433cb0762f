//! Shutting down (SIGTERM, Ctrl-C): every tree still running here
//! stopped, and the answer given once nothing is left in flight, or once
//! the shutdown's patience has run out, saying what was left.

use brood_core::{AgentName, CancelReason, Terminal};

use crate::supervisor::Dispatcher;

/// How long a shutdown waits for its agents' ends to be recorded, beyond
/// their grace (`Config::grace`), before it ends without them: what is left
/// is killed with the supervisor's cgroups, and the next start of this root
/// (or the other nodes) recovers its records. A daemon that never exits on
/// SIGTERM is SIGKILLed in the end, which leaves its groups.
const SHUTDOWN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

impl Dispatcher {
    /// Shutting down: every tree still running here is stopped (its roots
    /// cancelled `user`); the answer waits until nothing is live.
    pub(in crate::supervisor) fn begin_shutdown(&mut self) {
        let roots: Vec<AgentName> = self
            .agents
            .live
            .iter()
            .filter(|(n, l)| l.stopping.is_none() && !self.ends_writer.flight.contains(n))
            .filter(|(_, l)| {
                l.parent
                    .as_ref()
                    .is_none_or(|p| !self.agents.live.contains_key(p))
            })
            .map(|(n, _)| n.clone())
            .collect();
        for r in roots {
            self.stop_subtree(&r, Terminal::Cancelled(CancelReason::User));
        }
    }

    /// Nothing a shutdown waits for is left: no live agent, no stop,
    /// admission or end in flight.
    pub(in crate::supervisor) fn nothing_left(&self) -> bool {
        self.agents.live.is_empty()
            && self.stops.is_empty()
            && self.admitting.idle()
            && self.ends_writer.flight.idle()
            && self.starts_writer.flight.idle()
    }

    /// A shutdown that has waited the agents' grace and [`SHUTDOWN_PATIENCE`]:
    /// what it still waits for is said once, halfway, and it ends at the
    /// full wait. (The
    /// fault campaign saw a node wait for ever, its log silent, just after
    /// a start refused for an agent already cancelled; this names what is
    /// left when that happens.)
    pub(in crate::supervisor) fn out_of_patience(&mut self) -> bool {
        let Some((since, said)) = self.shutting else {
            return false;
        };
        let waited = since.elapsed();
        let patience = self.host.cfg.grace + SHUTDOWN_PATIENCE;
        if waited < patience / 2 {
            return false;
        }
        if !said || waited >= patience {
            let live: Vec<String> = self
                .agents
                .live
                .iter()
                .take(20)
                .map(|(n, l)| {
                    format!(
                        "{n} (pid {:?}, launching {}, stopping {:?})",
                        l.pid, l.launching, l.stopping
                    )
                })
                .collect();
            let over = waited >= patience;
            tracing::error!(
                waited_s = waited.as_secs(),
                live = ?live,
                stops = self.stops.len(),
                admissions_in_flight = !self.admitting.idle(),
                ends_in_flight = !self.ends_writer.flight.idle(),
                starts_in_flight = !self.starts_writer.flight.idle(),
                "{}",
                if over {
                    "the shutdown ends without what it still waits for: what is left is killed with the supervisor's cgroups, its records recovered at the next start"
                } else {
                    "the shutdown still waits"
                }
            );
            self.shutting = Some((since, true));
            return over;
        }
        false
    }
}
