//! How many bytes an agent's processes have written to disk (issue 24 item
//! 6, "Disk is a resource"): the kernel's per-process I/O accounting
//! (`/proc/PID/io`, proc(5)), summed over the processes of one agent.
//!
//! `write_bytes` counts what a process caused to be sent to storage: a page
//! of the page cache counts when the process first dirties it (a buffered
//! `write`, a store through a shared mapping), a direct write when it is
//! submitted. `cancelled_write_bytes` is what it dirtied and then truncated
//! before writeback; it is taken off. Writes to pipes, sockets and memory
//! filesystems (tmpfs is memory, charged to the agent's memory limit) do not
//! count. The figure is a write budget, not space held: a file rewritten
//! after writeback counts again, and deleting one gives nothing back.
//!
//! The figure of one process includes its threads, living and exited, and
//! every child it has reaped (the kernel folds a reaped child's figures into
//! its parent's, wait_task_zombie). So the sum over an agent's processes
//! misses only what the kernel has not folded yet: an exited child nobody
//! has reaped (a zombie, no longer listed in its cgroup), which [`by`] finds
//! through its parent's `children` lists. An orphan would be reaped outside
//! the agent (by its namespace's init) and its figures lost to the agent,
//! so the launcher makes each agent's first process a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`, kept across exec) and the sandbox refuses to
//! clear it: orphans stay the agent's, and so do their figures.
//!
//! `fallocate(2)` reserves blocks without writing them and, with
//! `FALLOC_FL_KEEP_SIZE`, past `RLIMIT_FSIZE`; the sandbox refuses it
//! (`EOPNOTSUPP`, so `posix_fallocate` falls back to writing, which counts).

use std::collections::BTreeSet;
use std::fs;

/// The bytes the processes `pids` (an agent's, as its cgroup lists them)
/// and their exited, unreaped children have written to disk. A process that
/// is gone by the time it is read counts nothing (its figures went to its
/// reaper, which is listed or is itself counted here).
pub fn by(pids: &[i32]) -> u64 {
    let listed: BTreeSet<i32> = pids.iter().copied().collect();
    let mut seen = BTreeSet::new();
    let mut total: u64 = 0;
    for &pid in pids {
        if seen.insert(pid) {
            total = total.saturating_add(of(pid));
        }
        for child in unreaped_children(pid) {
            if !listed.contains(&child) && seen.insert(child) {
                total = total.saturating_add(of(child));
            }
        }
    }
    total
}

/// One process's `write_bytes` less its `cancelled_write_bytes`, or 0 when
/// it cannot be read (gone, or a kernel without task I/O accounting).
pub fn of(pid: i32) -> u64 {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/io")) else {
        return 0;
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("write_bytes").saturating_sub(field("cancelled_write_bytes"))
}

/// The children of every thread of `pid` that are zombies: exited, their
/// figures not yet folded into a parent's. A child is on the list of the
/// thread that forked it, so every thread's is read.
fn unreaped_children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let Ok(list) = fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        out.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
                .filter(|&c| is_zombie(c)),
        );
    }
    out
}

/// State `Z` in `/proc/PID/stat` (the field after the parenthesised name).
fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|st| st == "Z")
        })
        .unwrap_or(false)
}

/// Whether this kernel keeps per-process I/O accounting
/// (`CONFIG_TASK_IO_ACCOUNTING`): `/proc/self/io` has `write_bytes`.
pub fn available() -> Result<(), String> {
    match fs::read_to_string("/proc/self/io") {
        Ok(t) if t.lines().any(|l| l.starts_with("write_bytes:")) => Ok(()),
        Ok(_) => Err("/proc/self/io has no write_bytes (CONFIG_TASK_IO_ACCOUNTING is off)".into()),
        Err(e) => Err(format!("/proc/self/io: {e}")),
    }
}
