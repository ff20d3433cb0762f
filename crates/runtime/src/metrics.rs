//! The supervisor's metrics (SPEC 9), rendered as Prometheus text at `/metrics`
//! on the control socket.
//!
//! Counters are bumped by the dispatcher (the only writer); a scrape reads them
//! from the socket's task, so they are atomics and small locked maps, never
//! anything the dispatcher waits on for long. Gauges are not kept here: a scrape
//! counts the supervisor's unfinished agents in the store, which is the truth.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the invocation duration histogram: from a quick
/// tool call to an hour-long agent run.
const BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
];

#[derive(Debug, Default)]
pub struct Metrics {
    invocations: Mutex<BTreeMap<String, u64>>,
    quota_denials: Mutex<BTreeMap<String, u64>>,
    refusals: Mutex<BTreeMap<String, u64>>,
    cascade_terminations: AtomicU64,
    sweeper_actions: [AtomicU64; 3],
    cross_tenant_reads: AtomicU64,
    lease_epoch: AtomicU64,
    duration_buckets: [AtomicU64; BUCKETS.len()],
    duration_count: AtomicU64,
    duration_sum_us: AtomicU64,
}

/// Agents of this supervisor by state, counted at scrape time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    pub live: u64,
    pub queued: u64,
    pub blocked: u64,
    /// Spans taken by the collector, and dropped (queue full, collector
    /// away): 0 and 0 with tracing off.
    pub spans_exported: u64,
    pub spans_dropped: u64,
}

fn bump(m: &Mutex<BTreeMap<String, u64>>, key: &str) {
    // A poisoned map only means a panic elsewhere mid-increment: keep counting.
    let mut m = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *m.entry(key.to_owned()).or_default() += 1;
}

/// Which sweeper acted (the `sweeper` label of the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sweeper {
    Timeouts,
    Orphans,
    Reconcile,
}

impl Sweeper {
    pub fn as_str(self) -> &'static str {
        match self {
            Sweeper::Timeouts => "timeouts",
            Sweeper::Orphans => "orphans",
            Sweeper::Reconcile => "reconcile",
        }
    }
}

fn sweeper_index(s: Sweeper) -> usize {
    match s {
        Sweeper::Timeouts => 0,
        Sweeper::Orphans => 1,
        Sweeper::Reconcile => 2,
    }
}

impl Metrics {
    /// A run ended with `outcome` (`completed`, `failed`, `cancelled`) after `took`.
    pub fn invocation(&self, outcome: &str, took: Option<Duration>) {
        bump(&self.invocations, outcome);
        if let Some(d) = took {
            let s = d.as_secs_f64();
            for (i, b) in BUCKETS.iter().enumerate() {
                if s <= *b {
                    self.duration_buckets[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            self.duration_count.fetch_add(1, Ordering::Relaxed);
            self.duration_sum_us.fetch_add(
                d.as_micros().min(u64::MAX as u128) as u64,
                Ordering::Relaxed,
            );
        }
    }

    /// A creation refused by the quota (or budget) named.
    pub fn quota_denial(&self, quota: &str) {
        bump(&self.quota_denials, quota);
    }

    /// A creation refused, whatever refused it (attenuation, quota, budget,
    /// name, parent, reserved path), by its code.
    pub fn refusal(&self, code: brood_core::Code) {
        bump(&self.refusals, code.as_str());
    }

    pub fn cascade_termination(&self) {
        self.cascade_terminations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn sweeper_action(&self, s: Sweeper) {
        self.sweeper_actions[sweeper_index(s)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn cross_tenant_read(&self) {
        self.cross_tenant_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn lease_epoch(&self, epoch: u64) {
        self.lease_epoch.store(epoch, Ordering::Relaxed);
    }

    pub fn sweeper_actions(&self, s: Sweeper) -> u64 {
        self.sweeper_actions[sweeper_index(s)].load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self, g: Gauges) -> String {
        let mut o = String::new();
        let lock = |m: &Mutex<BTreeMap<String, u64>>| {
            m.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        let _ = writeln!(
            o,
            "# HELP subagent_invocations_total Agent runs ended, by outcome."
        );
        let _ = writeln!(o, "# TYPE subagent_invocations_total counter");
        let inv = lock(&self.invocations);
        for outcome in ["completed", "failed", "cancelled"] {
            let n = inv.get(outcome).copied().unwrap_or(0);
            let _ = writeln!(o, "subagent_invocations_total{{outcome=\"{outcome}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP subagent_quota_denials_total Creations refused by a quota or budget."
        );
        let _ = writeln!(o, "# TYPE subagent_quota_denials_total counter");
        let den = lock(&self.quota_denials);
        for q in [
            "max_depth",
            "max_fanout",
            "max_tree_size",
            "create_limit",
            "budget",
        ] {
            let n = den.get(q).copied().unwrap_or(0);
            let _ = writeln!(o, "subagent_quota_denials_total{{quota=\"{q}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP subagent_refusals_total Creations refused, by the code of the refusal."
        );
        let _ = writeln!(o, "# TYPE subagent_refusals_total counter");
        let refused = lock(&self.refusals);
        for code in brood_core::Code::ALL {
            let c = code.as_str();
            let n = refused.get(c).copied().unwrap_or(0);
            let _ = writeln!(o, "subagent_refusals_total{{code=\"{c}\"}} {n}");
        }
        let _ = writeln!(
            o,
            "# HELP subagent_cascade_terminations_total Agents stopped because an ancestor stopped."
        );
        let _ = writeln!(o, "# TYPE subagent_cascade_terminations_total counter");
        let _ = writeln!(
            o,
            "subagent_cascade_terminations_total {}",
            self.cascade_terminations.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP subagent_sweeper_actions_total Repairs made by the sweepers."
        );
        let _ = writeln!(o, "# TYPE subagent_sweeper_actions_total counter");
        for s in [Sweeper::Timeouts, Sweeper::Orphans, Sweeper::Reconcile] {
            let _ = writeln!(
                o,
                "subagent_sweeper_actions_total{{sweeper=\"{}\"}} {}",
                s.as_str(),
                self.sweeper_actions(s)
            );
        }
        let _ = writeln!(
            o,
            "# HELP subagent_sweeper_cross_tenant_reads_total Rows of other tenants the sweepers read."
        );
        let _ = writeln!(
            o,
            "# TYPE subagent_sweeper_cross_tenant_reads_total counter"
        );
        let _ = writeln!(
            o,
            "subagent_sweeper_cross_tenant_reads_total {}",
            self.cross_tenant_reads.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP subagent_invoke_duration_seconds Agent runs, from admission to end."
        );
        let _ = writeln!(o, "# TYPE subagent_invoke_duration_seconds histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                o,
                "subagent_invoke_duration_seconds_bucket{{le=\"{b}\"}} {}",
                self.duration_buckets[i].load(Ordering::Relaxed)
            );
        }
        let count = self.duration_count.load(Ordering::Relaxed);
        let _ = writeln!(
            o,
            "subagent_invoke_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            o,
            "subagent_invoke_duration_seconds_sum {}",
            self.duration_sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(o, "subagent_invoke_duration_seconds_count {count}");
        for (name, help, v) in [
            (
                "subagent_live_agents",
                "Agents of this supervisor with a live process.",
                g.live,
            ),
            (
                "subagent_queued_agents",
                "Agents of this supervisor waiting for a slot.",
                g.queued,
            ),
            (
                "subagent_blocked_agents",
                "Agents of this supervisor blocked on something.",
                g.blocked,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} gauge");
            let _ = writeln!(o, "{name} {v}");
        }
        let _ = writeln!(
            o,
            "# HELP subagent_sweeper_lease_epoch The sweeper lease epoch this supervisor holds (0: none)."
        );
        let _ = writeln!(o, "# TYPE subagent_sweeper_lease_epoch gauge");
        let _ = writeln!(
            o,
            "subagent_sweeper_lease_epoch {}",
            self.lease_epoch.load(Ordering::Relaxed)
        );
        for (name, help, v) in [
            (
                "brood_trace_spans_exported_total",
                "Spans the OTLP collector took (docs/tracing.md).",
                g.spans_exported,
            ),
            (
                "brood_trace_spans_dropped_total",
                "Spans dropped: their queue was full or the collector did not take their batch.",
                g.spans_dropped,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} counter");
            let _ = writeln!(o, "{name} {v}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_every_family_and_counts() {
        let m = Metrics::default();
        m.invocation("completed", Some(Duration::from_millis(70)));
        m.invocation("failed", None);
        m.quota_denial("max_fanout");
        m.sweeper_action(Sweeper::Orphans);
        m.cascade_termination();
        let t = m.render(Gauges {
            live: 3,
            queued: 1,
            blocked: 0,
            spans_exported: 5,
            spans_dropped: 2,
        });
        for line in [
            "subagent_invocations_total{outcome=\"completed\"} 1",
            "subagent_invocations_total{outcome=\"failed\"} 1",
            "subagent_quota_denials_total{quota=\"max_fanout\"} 1",
            "subagent_cascade_terminations_total 1",
            "subagent_sweeper_actions_total{sweeper=\"orphans\"} 1",
            "subagent_sweeper_actions_total{sweeper=\"timeouts\"} 0",
            "subagent_sweeper_cross_tenant_reads_total 0",
            "subagent_invoke_duration_seconds_bucket{le=\"0.05\"} 0",
            "subagent_invoke_duration_seconds_bucket{le=\"0.1\"} 1",
            "subagent_invoke_duration_seconds_bucket{le=\"+Inf\"} 1",
            "subagent_invoke_duration_seconds_count 1",
            "subagent_live_agents 3",
            "subagent_queued_agents 1",
            "brood_trace_spans_exported_total 5",
            "brood_trace_spans_dropped_total 2",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }
}
