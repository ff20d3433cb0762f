//! A benchmark stopped by SIGINT or SIGTERM leaves nothing behind (issue 28
//! item 2): `bench cascade` (in-process supervisors, a thousand agents) is
//! interrupted with SIGINT while its tree runs, `bench cluster` (real
//! `brood serve` nodes) with SIGTERM while its nodes create agents. Each
//! exits as a shell reports the signal (130, 143); afterwards no group of
//! the benchmark or of its nodes is left on the host, every process it made
//! is gone, and its temporary roots are removed.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{alive, eventually, exe};

/// `brood bench ARGS…` with nothing of the caller's environment choosing
/// its store or counter.
fn bench(args: &[&str]) -> Child {
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(exe());
    for var in ["BROOD_STORE", "BROOD_SLOTS", "BROOD_SOCKET", "BROOD_URL"] {
        cmd.env_remove(var);
    }
    cmd.arg("bench")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Every process on the host whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// The processes in every group of the incarnations of `pids` (their
/// `s<pid>-<starttime>` groups, under any root's directory on this host).
fn processes_in_groups_of(pids: &[i32]) -> Vec<i32> {
    let det = brood_launch::cgroup::detect(Path::new("/")).expect("cgroups on this host");
    let v2 = det.v2_mount.clone().expect("a cgroup v2 mount");
    let own = v2.join(
        det.own_v2
            .clone()
            .unwrap_or_default()
            .trim_start_matches('/'),
    );
    let mut out = Vec::new();
    for inst in std::fs::read_dir(&own).unwrap().flatten() {
        if !inst.file_name().to_string_lossy().starts_with("brood-") {
            continue;
        }
        for g in std::fs::read_dir(inst.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = g.file_name().to_string_lossy().into_owned();
            if pids.iter().any(|p| n.starts_with(&format!("s{p}-"))) {
                out.extend(common::pids_under(&g.path()));
            }
        }
    }
    out
}

/// Groups of dead incarnations that belonged to `pids`, anywhere on the
/// host (the grouping hierarchy and the v1 limit mirrors).
fn groups_left_by(pids: &[i32]) -> Vec<String> {
    let det = brood_launch::cgroup::detect(Path::new("/")).expect("cgroups on this host");
    brood_launch::cgroup::dead_on_host(&det)
        .unwrap()
        .into_iter()
        .map(|p| p.display().to_string())
        .filter(|p| pids.iter().any(|pid| p.contains(&format!("/s{pid}-"))))
        .collect()
}

/// Temporary roots of benchmark `pid` still where benchmarks make them:
/// tmpfs (`/dev/shm`, where `bench cluster` puts its nodes' roots) and the
/// temp directory.
fn roots_left_by(pid: i32) -> Vec<String> {
    let shm = std::path::Path::new("/dev/shm");
    [shm.to_path_buf(), std::env::temp_dir()]
        .into_iter()
        .filter(|d| d.is_dir())
        .flat_map(|d| std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("brood-bench-") && n.ends_with(&format!("-{pid}")))
        .collect()
}

/// Signals the benchmark once `ready` holds, and checks what it leaves:
/// its exit code, no group of its own or of `also` (its nodes), no process
/// that was in them, no temporary root.
fn interrupt(mut b: Child, signal: i32, code: i32, ready: impl Fn(i32) -> Option<Vec<i32>>) {
    // This test reaps what the benchmark's processes leave orphaned, so a
    // zombie (which `alive` counts) is only ever one nobody killed.
    // SAFETY: prctl(2) with integer arguments, on this test process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let pid = b.id() as i32;
    let mut nodes = Vec::new();
    let mut incarnations = vec![pid];
    let mut agents = Vec::new();
    // Ready, and the agents in its groups read in the same look: a second
    // look could find none, since `bench cluster`'s agents (`true`) live
    // for a millisecond or two.
    let started = eventually(Duration::from_secs(120), || match ready(pid) {
        Some(n) => {
            incarnations = std::iter::once(pid).chain(n.iter().copied()).collect();
            agents = processes_in_groups_of(&incarnations);
            nodes = n;
            !agents.is_empty()
        }
        None => false,
    });
    assert!(
        started,
        "the benchmark never got going (no agent seen in its groups)"
    );
    // SAFETY: kill(2) on the benchmark this test started.
    unsafe { libc::kill(pid, signal) };
    let status = b.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(b.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(code), "exit status; stderr:\n{stderr}");
    let gone = eventually(Duration::from_secs(10), || {
        for p in agents.iter().chain(&nodes) {
            let mut st = 0;
            // SAFETY: waitpid(2) on one pid without blocking: reaps it if it
            // is a dead child adopted by this (subreaper) process.
            unsafe { libc::waitpid(*p, &mut st, libc::WNOHANG) };
        }
        agents.iter().chain(&nodes).all(|p| !alive(*p))
    });
    let left: Vec<i32> = agents
        .iter()
        .chain(&nodes)
        .copied()
        .filter(|p| alive(*p))
        .collect();
    assert!(
        gone,
        "processes {left:?} outlived the benchmark; stderr:\n{stderr}"
    );
    let groups = groups_left_by(&incarnations);
    assert!(
        groups.is_empty(),
        "groups left: {groups:?}; stderr:\n{stderr}"
    );
    let roots = roots_left_by(pid);
    assert!(roots.is_empty(), "temporary roots left: {roots:?}");
}

#[test]
fn sigint_stops_an_in_process_benchmark_and_removes_its_groups() {
    let b = bench(&["cascade", "-n", "300", "--rounds", "20"]);
    interrupt(b, libc::SIGINT, 130, |pid| {
        // Its tree is being built or is live: processes in its own groups.
        (processes_in_groups_of(&[pid]).len() >= 50).then(Vec::new)
    });
}

#[test]
fn sigterm_stops_a_benchmark_of_real_nodes_and_nothing_is_left() {
    let b = bench(&["cluster", "-n", "20000", "--clients", "4"]);
    interrupt(b, libc::SIGTERM, 143, |pid| {
        // A node runs (a `brood serve` child) and has agents in its groups.
        let nodes: Vec<i32> = children_of(pid)
            .into_iter()
            .filter(|c| {
                std::fs::read(format!("/proc/{c}/cmdline"))
                    .map(|c| c.split(|b| *b == 0).any(|a| a == b"serve"))
                    .unwrap_or(false)
            })
            .collect();
        (!nodes.is_empty() && !processes_in_groups_of(&nodes).is_empty()).then_some(nodes)
    });
}
