//! The checks after each round, once the faults are healed and the cluster
//! settled: against the kernel (/proc, the cgroups) and the store (through
//! every node's API). What one check sees that could be a moment's race (a
//! process that is exiting, a record about to be written) is looked at
//! again after a few sweeps, and only what stays is a violation.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::driver::Driver;
use crate::http;
use crate::kernel;
use crate::report::Report;
use crate::sampler::{HOLDS_SLOT, LIVE};
use crate::world::{MAX_DEPTH, MAX_TREE_SIZE, World, roots};

const READ: Duration = Duration::from_secs(15);
/// How long a suspect must stay before it is a violation: several of the
/// orphan sweeps (every 5 ticks of 0.2 s) and a stop's grace (0.3 s).
const RECHECK: Duration = Duration::from_secs(3);

/// What completed agents returned and completed items' results, as first
/// read: every later read, from every node, must give the same.
#[derive(Default)]
pub struct Ledger {
    agents: BTreeMap<String, Kept>,
    items: BTreeMap<String, Value>,
}

struct Kept {
    result: Option<String>,
    /// The channel's result, refs and artifacts (name, hash, size), when it
    /// has a parent.
    channel: Value,
}

impl Ledger {
    pub fn agents(&self) -> usize {
        self.agents.len()
    }

    pub fn items(&self) -> usize {
        self.items.len()
    }
}

fn get(world: &World, node: usize, path: &str) -> Result<http::Answer, String> {
    let a = http::call(&world.nodes[node].sock(), "GET", path, None, READ)
        .map_err(|e| format!("node {node} GET {path}: {e}"))?;
    if a.status == 200 {
        Ok(a)
    } else {
        Err(format!("node {node} GET {path}: {} {}", a.status, a.text()))
    }
}

pub fn list_all(world: &World, node: usize) -> Result<BTreeMap<String, Value>, String> {
    let v = get(world, node, "/api/agents?all=true")?.json();
    Ok(v["agents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a["name"].as_str().unwrap_or("").to_owned(), a))
        .collect())
}

fn status(a: &Value) -> &str {
    a["status"].as_str().unwrap_or("")
}

/// One check: what it found, each a violation.
type Check = fn(&World, &Driver, &mut Ledger) -> Vec<String>;

/// Every check of a round, in order.
pub fn round(world: &World, driver: &Driver, ledger: &mut Ledger, report: &Report, round: usize) {
    let checks: [(&'static str, Check); 6] = [
        (
            "process without a live record / live record without a process",
            processes,
        ),
        ("completed result, ref or artifact lost", results),
        ("completed job item lost", items),
        ("events gapless per tenant", events),
        ("max_tree_size and max_depth", trees),
        ("stray cgroup", groups),
    ];
    for (check, f) in checks {
        for what in f(world, driver, ledger) {
            report.violation(round, check, what);
        }
    }
}

/// The suspects of one look, each by what, which agent and its run (the
/// same suspect at the next look has the same key), with what was seen:
/// agents with a process and no live record, and records holding a slot
/// with no process.
type Suspects = BTreeMap<(&'static str, String, String), String>;

fn suspects(world: &World) -> Result<Suspects, String> {
    let procs = kernel::agent_processes(&roots(world));
    let records = list_all(world, 0)?;
    let mut out = Suspects::new();
    for (name, ps) in &procs {
        let rec = records.get(name);
        if !rec.is_some_and(|r| LIVE.contains(&status(r))) {
            let pids: Vec<String> = ps
                .iter()
                .map(|p| format!("pid {} on node {}", p.pid, p.node))
                .collect();
            let run = rec.map(|r| r["run"].to_string()).unwrap_or_default();
            out.insert(
                ("process without a live record", name.clone(), run),
                format!(
                    "{} while its record says {}",
                    pids.join(", "),
                    rec.map(|r| r["state"].to_string())
                        .unwrap_or("nothing".into())
                ),
            );
        }
    }
    for (name, r) in &records {
        if !HOLDS_SLOT.contains(&status(r)) || procs.contains_key(name) {
            continue;
        }
        // Not found by its environment: its group and its recorded pid say
        // more (a zombie's environment reads empty).
        let group = r["cgroup"].as_str().map(std::path::PathBuf::from);
        let in_group = group.as_deref().map(kernel::pids_in).unwrap_or_default();
        let pid = r["pid"].as_i64().and_then(|p| i32::try_from(p).ok());
        let pid_state = pid.and_then(kernel::state);
        if in_group
            .iter()
            .any(|p| kernel::state(*p).is_some_and(|s| s != 'Z'))
        {
            continue;
        }
        out.insert((
            "live record without a process",
            name.clone(),
            r["run"].to_string()),
            format!(
                "{} on node {} run {} (pid {pid:?} state {pid_state:?}, its group {} holds {in_group:?})",
                r["state"],
                r["node"],
                r["run"],
                group.map(|g| g.display().to_string()).unwrap_or_default()
            ),
        );
    }
    Ok(out)
}

fn processes(world: &World, _: &Driver, _: &mut Ledger) -> Vec<String> {
    let first = match suspects(world) {
        Ok(s) => s,
        Err(e) => return vec![format!("could not look: {e}")],
    };
    if first.is_empty() {
        return Vec::new();
    }
    std::thread::sleep(RECHECK);
    let second = match suspects(world) {
        Ok(s) => s,
        Err(e) => return vec![format!("could not look again: {e}")],
    };
    second
        .iter()
        .filter(|(k, _)| first.contains_key(*k))
        .map(|((what, name, _), detail)| format!("{what}: {name}: {detail}"))
        .collect()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How many agents the largest tree has.
pub fn largest_tree(records: &BTreeMap<String, Value>) -> u64 {
    let mut size: BTreeMap<&str, u64> = BTreeMap::new();
    for name in records.keys() {
        *size.entry(root_of(records, name)).or_default() += 1;
    }
    size.values().copied().max().unwrap_or(0)
}

/// The root of `name`'s tree, by its parents.
fn root_of<'a>(records: &'a BTreeMap<String, Value>, mut name: &'a str) -> &'a str {
    for _ in 0..64 {
        match records.get(name).and_then(|r| r["parent"].as_str()) {
            Some(p) => name = p,
            None => break,
        }
    }
    name
}

/// The channel of `name` read from `node`, each artifact's bytes fetched
/// and checked against its hash (and, for `out.txt`, against what its tree
/// was asked to write): its result, refs and artifacts.
fn channel(
    world: &World,
    node: usize,
    name: &str,
    expect: Option<&String>,
) -> Result<Value, String> {
    let v = get(world, node, &format!("/api/ui/agents/{name}"))?.json();
    let ch = &v["channel"];
    if ch.is_null() {
        return Ok(Value::Null);
    }
    let arts = ch["artifacts"].as_array().cloned().unwrap_or_default();
    for a in &arts {
        let (file, sha) = (
            a["name"].as_str().unwrap_or(""),
            a["sha256"].as_str().unwrap_or(""),
        );
        let bytes = get(
            world,
            node,
            &format!("/api/ui/agents/{name}/artifacts/{sha}"),
        )?
        .body;
        let got = sha256(&bytes);
        if got != sha {
            return Err(format!(
                "node {node}: {name}'s artifact {file} is listed with hash {sha}, its {} bytes hash to {got}",
                bytes.len()
            ));
        }
        if file == "out.txt"
            && let Some(want) = expect
            && bytes != want.as_bytes()
        {
            return Err(format!(
                "node {node}: {name}'s out.txt holds {:?}, its tree wrote {want:?}",
                String::from_utf8_lossy(&bytes)
            ));
        }
    }
    Ok(serde_json::json!({"result": ch["result"], "refs": ch["refs"], "artifacts": arts}))
}

fn results(world: &World, driver: &Driver, ledger: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    for node in 0..world.nodes.len() {
        let records = match list_all(world, node) {
            Ok(r) => r,
            Err(e) => {
                out.push(format!("could not read: {e}"));
                continue;
            }
        };
        for (name, r) in &records {
            if status(r) != "completed" || ledger.agents.contains_key(name) {
                continue;
            }
            let expect = driver.artifact_of.get(root_of(&records, name));
            match channel(world, node, name, expect) {
                Ok(ch) => {
                    ledger.agents.insert(
                        name.clone(),
                        Kept {
                            result: r["result"].as_str().map(str::to_owned),
                            channel: ch,
                        },
                    );
                }
                Err(e) => out.push(e),
            }
        }
        for (name, kept) in &ledger.agents {
            let Some(r) = records.get(name) else {
                out.push(format!(
                    "node {node}: completed {name} is gone from the store"
                ));
                continue;
            };
            if status(r) != "completed" || r["result"].as_str().map(str::to_owned) != kept.result {
                out.push(format!(
                    "node {node}: {name} completed with {:?}, now reads {} with {}",
                    kept.result, r["state"], r["result"]
                ));
                continue;
            }
            if kept.channel.is_null() {
                continue;
            }
            let expect = driver.artifact_of.get(root_of(&records, name));
            match channel(world, node, name, expect) {
                Ok(ch) if ch == kept.channel => {}
                Ok(ch) => out.push(format!(
                    "node {node}: {name} handed back {}, now reads {ch}",
                    kept.channel
                )),
                Err(e) => out.push(e),
            }
        }
    }
    out
}

fn items(world: &World, driver: &Driver, ledger: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    let jobs: Vec<&String> = driver.jobs.iter().map(|(j, _)| j).collect();
    for node in 0..world.nodes.len() {
        for job in &jobs {
            let v = match get(world, node, &format!("/api/jobs/{job}/items")) {
                Ok(a) => a.json(),
                Err(e) => {
                    out.push(format!("could not read: {e}"));
                    continue;
                }
            };
            let listed = v["items"].as_array().cloned().unwrap_or_default();
            for it in &listed {
                let key = format!("{job}/{}", it["id"].as_str().unwrap_or("?"));
                if it["status"] == "completed" && !ledger.items.contains_key(&key) {
                    let want = serde_json::json!({"echo": format!("say {}", it["input"]["t"].as_str().unwrap_or("?"))});
                    if it["result"] != want {
                        out.push(format!(
                            "node {node}: item {key} completed with {}, its worker reported {want}",
                            it["result"]
                        ));
                    }
                    ledger.items.insert(key, it["result"].clone());
                }
            }
            for (key, result) in ledger
                .items
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{job}/")))
            {
                let id = &key[job.len() + 1..];
                match listed.iter().find(|it| it["id"] == id) {
                    Some(it) if it["status"] == "completed" && it["result"] == *result => {}
                    Some(it) => out.push(format!(
                        "node {node}: item {key} completed with {result}, now reads {} with {}",
                        it["status"], it["result"]
                    )),
                    None => out.push(format!("node {node}: completed item {key} is gone")),
                }
            }
        }
    }
    out
}

fn events(world: &World, _: &Driver, _: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    let mut logs: Vec<Vec<(u64, String)>> = Vec::new();
    for node in 0..world.nodes.len() {
        let text = match get(world, node, "/api/events?follow=false") {
            Ok(a) => a.text(),
            Err(e) => {
                out.push(format!("could not read: {e}"));
                continue;
            }
        };
        let log: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .map(|e| {
                (
                    e["sequence"].as_u64().unwrap_or(0),
                    format!("{} {}", e["type"], e["agent"]),
                )
            })
            .collect();
        for (i, (seq, what)) in log.iter().enumerate() {
            let want = i as u64 + 1;
            if *seq != want {
                out.push(format!(
                    "node {node}: the event log's sequence {want} is missing or out of order: event {i} is {seq} ({what}), of {} read",
                    log.len()
                ));
                break;
            }
        }
        logs.push(log);
    }
    if let [first, rest @ ..] = logs.as_slice() {
        for (k, other) in rest.iter().enumerate() {
            if let Some((a, b)) = first.iter().zip(other).find(|(a, b)| a != b) {
                out.push(format!(
                    "the nodes disagree on event {}: node 0 reads {}, node {} reads {}",
                    a.0,
                    a.1,
                    k + 1,
                    b.1
                ));
            }
        }
    }
    out
}

fn trees(world: &World, _: &Driver, _: &mut Ledger) -> Vec<String> {
    let records = match list_all(world, 0) {
        Ok(r) => r,
        Err(e) => return vec![format!("could not read: {e}")],
    };
    let mut size: BTreeMap<&str, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for (name, r) in &records {
        *size.entry(root_of(&records, name)).or_default() += 1;
        if r["depth"].as_u64().is_some_and(|d| d > MAX_DEPTH) {
            out.push(format!(
                "{name} at depth {} (max_depth {MAX_DEPTH})",
                r["depth"]
            ));
        }
    }
    for (root, n) in size {
        if n > MAX_TREE_SIZE {
            out.push(format!(
                "the tree of {root} has {n} agents (max_tree_size {MAX_TREE_SIZE})"
            ));
        }
    }
    out
}

/// Once every node runs again, no group of a dead incarnation of any root
/// is left (a node's start removes its own root's).
fn groups(world: &World, _: &Driver, _: &mut Ledger) -> Vec<String> {
    let mut out = Vec::new();
    for n in &world.nodes {
        for g in kernel::dead_incarnations(&n.root, n.pid()) {
            out.push(format!(
                "node {}: {} (its incarnation is dead)",
                n.index,
                g.display()
            ));
        }
    }
    out
}
