//! What a campaign counts and finds, and how it is printed.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// A check that failed: which, in which round, and what it saw where.
#[derive(Debug, Clone)]
pub struct Violation {
    pub round: usize,
    pub check: &'static str,
    pub what: String,
}

#[derive(Default)]
pub struct Report {
    pub seed: u64,
    pub label: String,
    pub rounds: usize,
    pub trees: u64,
    pub jobs: u64,
    /// Agents the store holds at the end (every tree's, workers included).
    pub agents: u64,
    pub steps: u64,
    /// API answers that were not a success, by status (0: no answer).
    pub refused: BTreeMap<u16, u64>,
    /// The first few answers 500 (an internal error, not a refusal): what
    /// was asked and what came back.
    pub internal: Vec<String>,
    pub faults: BTreeMap<&'static str, u64>,
    /// Instants the sampler read the running counts.
    pub samples: u64,
    /// The most agents seen holding a slot at once, the most unfinished
    /// children of one parent, the largest tree: each against its quota.
    pub most: [(u64, u64); 3],
    pub violations: Mutex<Vec<Violation>>,
}

impl Report {
    /// Notes a violation, once: the same one seen again in a later round
    /// (a result still unreadable) is the same violation.
    pub fn violation(&self, round: usize, check: &'static str, what: String) {
        let mut all = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        if all.iter().any(|v| v.check == check && v.what == what) {
            return;
        }
        eprintln!(
            "chaos: VIOLATION (seed {}, round {round}) {check}: {what}",
            self.seed
        );
        all.push(Violation { round, check, what });
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn print(&self) {
        let v = self.violations();
        println!("chaos {}: seed {}", self.label, self.seed);
        println!(
            "  rounds {}, steps {}, trees {}, jobs {}, agents created {}, instants sampled {}",
            self.rounds, self.steps, self.trees, self.jobs, self.agents, self.samples
        );
        let [slots, kids, tree] = self.most;
        println!(
            "  most seen at once: {} agents holding a slot (max_concurrent {}), {} unfinished children of one parent (max_fanout {}); largest tree {} (max_tree_size {})",
            slots.0, slots.1, kids.0, kids.1, tree.0, tree.1
        );
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "  faults injected ({}): {}",
            self.faults.values().sum::<u64>(),
            faults.join(", ")
        );
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|(s, n)| {
                if *s == 0 {
                    format!("no answer {n}")
                } else {
                    format!("{s} {n}")
                }
            })
            .collect();
        println!("  calls not answered 2xx: {}", refused.join(", "));
        for i in &self.internal {
            println!("    500: {i}");
        }
        println!("  violations: {}", v.len());
        for x in &v {
            println!("    round {} {}: {}", x.round, x.check, x.what);
        }
    }
}
