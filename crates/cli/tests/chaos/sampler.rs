//! The quotas at every instant sampled: a thread that, all through a
//! campaign, reads the agents from one node after another (the store's
//! view) and the agents' processes from /proc (the kernel's), and notes
//! each time `max_concurrent`, fanout or depth is exceeded.
//!
//! Two windows are judged per node rather than across the cluster, as
//! docs/reliability.md says they must be: while Redis is away (and until the
//! reconciler has repaired the shared count, and what was started past the
//! limit meanwhile has ended), each supervisor counts its own slots; and while a stopped node's agents are declared lost by the others,
//! its processes still run until it wakes and stops them, so the kernel
//! sees them beside their replacements' (the store does not).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http;
use crate::kernel;
use crate::report::Violation;
use crate::world::{MAX_CONCURRENT, MAX_DEPTH, MAX_FANOUT};

/// How long after Redis is back the count is judged per node: two of the
/// reconciler's passes (every 30 ticks of 0.2 s).
pub const REDIS_SETTLE: Duration = Duration::from_secs(14);
/// How long after a stopped node wakes the kernel's count is judged per
/// node: it stops what the others declared lost within a few ticks.
pub const LOST_SETTLE: Duration = Duration::from_secs(6);

pub const LIVE: [&str; 4] = ["queued", "running", "blocked", "stopping"];
pub const HOLDS_SLOT: [&str; 3] = ["running", "blocked", "stopping"];

#[derive(Default)]
pub struct Shared {
    pub socks: Vec<PathBuf>,
    pub roots: Vec<PathBuf>,
    pub usable: Mutex<Vec<bool>>,
    /// Until when the count is judged per node because of Redis.
    pub redis_until: Mutex<Option<Instant>>,
    /// Set when Redis goes: what the nodes started past the tenant's
    /// `max_concurrent` while the counter was empty keeps running after it
    /// is repaired (nothing stops a running agent for it). Cleared by the
    /// first sample past `redis_until` whose counts (the store's and the
    /// kernel's) are within the limit again; until then the count is judged
    /// per node.
    pub redis_drain: AtomicBool,
    /// Until when the kernel's count is judged per node because a node was
    /// stopped.
    pub lost_until: Mutex<Option<Instant>>,
    pub round: AtomicUsize,
    stop: AtomicBool,
    pub samples: AtomicU64,
    /// The most seen at one instant: agents holding a slot (the store's
    /// count), and one parent's unfinished children. They show the quotas
    /// were reached, not only kept.
    pub most_holding: AtomicU64,
    pub most_children: AtomicU64,
    found: Mutex<Vec<Violation>>,
    /// (check, round) already noted: one violation a check a round.
    noted: Mutex<BTreeSet<(&'static str, usize)>>,
}

impl Shared {
    pub fn new(socks: Vec<PathBuf>, roots: Vec<PathBuf>) -> Shared {
        Shared {
            socks,
            roots,
            ..Shared::default()
        }
    }

    pub fn disturb(w: &Mutex<Option<Instant>>, until: Instant) {
        *w.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    fn within(w: &Mutex<Option<Instant>>) -> bool {
        w.lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() < t)
    }

    fn note(&self, check: &'static str, what: String) {
        let round = self.round.load(Ordering::SeqCst);
        let fresh = self
            .noted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((check, round));
        if fresh {
            eprintln!("chaos: VIOLATION (round {round}) {check}: {what}");
            self.found
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Violation { round, check, what });
        }
    }

    /// The violations found since the last call.
    pub fn take(&self) -> Vec<Violation> {
        std::mem::take(&mut *self.found.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

pub struct Sampler {
    pub shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    pub fn start(shared: Arc<Shared>) -> Sampler {
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let mut turn = 0usize;
            while !s.stop.load(Ordering::SeqCst) {
                turn += 1;
                sample(&s, turn);
                std::thread::sleep(Duration::from_millis(150));
            }
        });
        Sampler {
            shared,
            thread: Some(thread),
        }
    }

    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn sample(s: &Shared, turn: usize) {
    let usable: Vec<usize> = {
        let u = s.usable.lock().unwrap_or_else(|p| p.into_inner());
        (0..u.len()).filter(|i| u[*i]).collect()
    };
    let redis = Shared::within(&s.redis_until) || s.redis_drain.load(Ordering::SeqCst);
    let lost = Shared::within(&s.lost_until);
    // The kernel first: it needs no node.
    let procs = kernel::agent_processes(&s.roots);
    let mut per_root: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (name, ps) in &procs {
        for p in ps {
            per_root.entry(p.node).or_default().insert(name);
        }
    }
    if !redis && !lost && procs.len() as u64 > MAX_CONCURRENT {
        s.note(
            "max_concurrent (kernel)",
            format!(
                "{} agents have processes at once (max_concurrent {MAX_CONCURRENT}): {:?}",
                procs.len(),
                procs.keys().collect::<Vec<_>>()
            ),
        );
    }
    for (node, names) in &per_root {
        if names.len() as u64 > MAX_CONCURRENT {
            s.note(
                "max_concurrent (kernel, one node)",
                format!(
                    "{} agents have processes at once on node {node} (max_concurrent {MAX_CONCURRENT}): {names:?}",
                    names.len()
                ),
            );
        }
    }
    let Some(&node) = usable.get(turn % usable.len().max(1)) else {
        return;
    };
    let Ok(a) = http::call(
        &s.socks[node],
        "GET",
        "/api/agents?all=true",
        None,
        Duration::from_secs(2),
    ) else {
        return;
    };
    if a.status != 200 {
        return;
    }
    s.samples.fetch_add(1, Ordering::SeqCst);
    let v = a.json();
    let agents = v["agents"].as_array().cloned().unwrap_or_default();
    judge_store(s, node, &agents, redis, procs.len() as u64);
}

/// `kernel`: how many agents had processes at this sample, so that the
/// allowance for a Redis restart ends only once both counts are within the
/// limit (an ended agent's processes outlive its record until its group is
/// emptied).
fn judge_store(s: &Shared, node: usize, agents: &[Value], redis: bool, kernel: u64) {
    let status = |a: &Value| a["status"].as_str().unwrap_or("").to_owned();
    let holding: Vec<&Value> = agents
        .iter()
        .filter(|a| HOLDS_SLOT.contains(&status(a).as_str()))
        .collect();
    s.most_holding
        .fetch_max(holding.len() as u64, Ordering::SeqCst);
    if !Shared::within(&s.redis_until)
        && holding.len() as u64 <= MAX_CONCURRENT
        && kernel <= MAX_CONCURRENT
    {
        s.redis_drain.store(false, Ordering::SeqCst);
    }
    if !redis && holding.len() as u64 > MAX_CONCURRENT {
        s.note(
            "max_concurrent (store)",
            format!(
                "node {node} lists {} agents holding a slot at once (max_concurrent {MAX_CONCURRENT}): {:?}",
                holding.len(),
                holding.iter().map(|a| (&a["name"], &a["node"])).collect::<Vec<_>>()
            ),
        );
    }
    let mut by_node: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for a in &holding {
        by_node
            .entry(a["node"].as_str().unwrap_or("?").to_owned())
            .or_default()
            .push(a["name"].as_str().unwrap_or("?"));
    }
    for (n, names) in by_node {
        if names.len() as u64 > MAX_CONCURRENT {
            s.note(
                "max_concurrent (store, one node)",
                format!("node {n} holds {} slots at once: {names:?}", names.len()),
            );
        }
    }
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for a in agents {
        if LIVE.contains(&status(a).as_str())
            && let Some(p) = a["parent"].as_str()
        {
            children
                .entry(p)
                .or_default()
                .push(a["name"].as_str().unwrap_or("?"));
        }
        if a["depth"].as_u64().is_some_and(|d| d > MAX_DEPTH) {
            s.note(
                "max_depth",
                format!(
                    "{} at depth {} (max_depth {MAX_DEPTH})",
                    a["name"], a["depth"]
                ),
            );
        }
    }
    for (p, kids) in children {
        s.most_children
            .fetch_max(kids.len() as u64, Ordering::SeqCst);
        if kids.len() as u64 > MAX_FANOUT {
            s.note(
                "max_fanout",
                format!(
                    "{p} has {} unfinished children at once (max_fanout {MAX_FANOUT}): {kids:?}",
                    kids.len()
                ),
            );
        }
    }
}
