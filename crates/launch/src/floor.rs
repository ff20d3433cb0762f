//! The floors `brood bench` measures brood against, timed in the same run on the
//! same machine (SPEC 16). They live here because only this crate starts
//! processes.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::cgroup::{Cgroups, GroupPath};

/// A bare `posix_spawn` (std's `Command` without `pre_exec` uses it) of `argv`,
/// writing `init` on its stdin and timing until the first line comes back on its
/// stdout (the ready handshake). The process is then left to finish and reaped
/// outside the timing.
pub fn spawn_ready(argv: &[OsString], init: &[u8]) -> io::Result<Duration> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::other("empty argv"))?;
    let t0 = Instant::now();
    #[allow(clippy::disallowed_methods)]
    let mut child = std::process::Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin"))?;
    stdin.write_all(init)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let mut rd = BufReader::new(stdout);
    let mut line = String::new();
    rd.read_line(&mut line)?;
    let dt = t0.elapsed();
    drop(stdin);
    // Let it finish as it would after ready; drain so it never blocks on a full pipe.
    let mut rest = Vec::new();
    let _ = io::Read::read_to_end(&mut rd, &mut rest);
    child.wait()?;
    if !line.contains("ready") {
        return Err(io::Error::other(format!("no ready line, got {line:?}")));
    }
    Ok(dt)
}

/// Starts `n` processes of `argv` in a fresh group (their stdin held open), then
/// times `cgroup.kill` until every one of them is reaped and the group is removed.
pub fn cgroup_kill(cg: &Cgroups, name: &str, argv: &[OsString], n: usize) -> io::Result<Duration> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::other("empty argv"))?;
    let rel = GroupPath::new(&[name]).map_err(|e| io::Error::other(e.to_string()))?;
    let g = cg
        .create(&rel)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let procs = g.dir.join("cgroup.procs");
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        #[allow(clippy::disallowed_methods)]
        // stdin stays open (held in `children`), so a program that reads it first
        // (the test agent waiting for its init) stays alive until killed.
        let c = std::process::Command::new(prog)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        std::fs::write(&procs, c.id().to_string())?;
        children.push(c);
    }
    let t0 = Instant::now();
    cg.kill(&g).map_err(|e| io::Error::other(e.to_string()))?;
    for c in &mut children {
        c.wait()?;
    }
    while cg
        .is_populated(&g)
        .map_err(|e| io::Error::other(e.to_string()))?
    {
        std::thread::sleep(Duration::from_micros(100));
    }
    cg.remove(&g).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(t0.elapsed())
}

/// `n` runs of `argv` by `concurrency` threads, each starting one, waiting
/// for it to exit and going on to the next (what `xargs -P concurrency`
/// does); the time until the last has ended. No stdin, output discarded. A
/// run that does not exit 0 is an error naming the program, since a floor of
/// failed starts would flatter it.
pub fn parallel_runs(argv: &[OsString], n: usize, concurrency: usize) -> io::Result<Duration> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::other("empty argv"))?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t0 = Instant::now();
    std::thread::scope(|sc| -> io::Result<()> {
        let workers: Vec<_> = (0..concurrency.clamp(1, n.max(1)))
            .map(|_| {
                sc.spawn(|| -> io::Result<()> {
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                        #[allow(clippy::disallowed_methods)]
                        let status = std::process::Command::new(prog)
                            .args(args)
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()?;
                        if !status.success() {
                            return Err(io::Error::other(format!(
                                "{} ended {status}",
                                prog.to_string_lossy()
                            )));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| io::Error::other("a floor worker panicked"))??;
        }
        Ok(())
    })?;
    Ok(t0.elapsed())
}
