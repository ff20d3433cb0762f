//! Resource limits ([`Cgroups::set_limits`]) against the real kernel of this
//! machine (hybrid: cgroup2 groups and kills, v1 `memory`, `pids` and `cpu`
//! limit).
//!
//! Programs are started the way the launcher starts agents: a `pre_exec` writes
//! `0` into the group's `cgroup.procs` and into every `cgroup.procs` that
//! `set_limits` handed back, so the program is limited before it execs. The tests
//! judge from outside: exit status, the kernel's own counters, and that the test
//! process (standing in for the supervisor) and a sibling agent carry on. A
//! [`Fixture`] kills and removes everything it made, v2 and v1, even when an
//! assertion fails. A missing controller fails the test naming it.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use brood_launch::cgroup::{
    CgroupError, Cgroups, Detected, Group, GroupPath, LimitHandles, Limits, detect,
};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// One instance's groups. Dropping it kills the children it started, destroys
/// the incarnation (v2 and v1 mirrors) and removes the instance directories.
struct Fixture {
    det: Detected,
    instance: String,
    cg: Cgroups,
    /// Started programs, each with the file its stderr goes to.
    children: Vec<(Child, File)>,
}

impl Fixture {
    fn new() -> Fixture {
        let det = detect(Path::new("/")).unwrap();
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let instance = format!("limits-{me}-{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let cg = Cgroups::open(&det, &instance).unwrap_or_else(|e| {
            panic!("cannot create cgroups on this host ({:?}): {e}", det.layout)
        });
        for (what, ok) in cg.limits_supported() {
            assert!(ok, "this host lacks a limit controller brood needs: {what}");
        }
        Fixture {
            det,
            instance,
            cg,
            children: Vec::new(),
        }
    }

    fn create(&self, comps: &[&str]) -> Group {
        self.cg.create(&GroupPath::new(comps).unwrap()).unwrap()
    }

    /// Where the v1 mirror of `g` is for `controller`.
    fn mirror(&self, controller: &str, g: &Group) -> PathBuf {
        let m = self.cg.v1_mirror().get(controller).unwrap_or_else(|| {
            panic!("no cgroup v1 {controller} hierarchy: this host's limits go through it")
        });
        m.join(g.rel.as_path())
    }

    /// Starts `argv` in `g` and its limit groups, as the launcher will.
    fn spawn_in(&mut self, g: &Group, h: &LimitHandles, argv: &[&str]) -> u32 {
        self.spawn_in_with(g, h, argv, Stdio::null())
    }

    /// The same with `stdin`. stderr goes to a file (a pipe would stay open in
    /// the program's background children until they exit).
    fn spawn_in_with(&mut self, g: &Group, h: &LimitHandles, argv: &[&str], stdin: Stdio) -> u32 {
        let procs = self.cg.procs_file(g).unwrap();
        let mut fds: Vec<RawFd> = vec![procs.as_raw_fd()];
        fds.extend(h.procs_files.iter().map(File::as_raw_fd));
        // The test needs real exec'd programs, as the launcher starts them.
        #[allow(clippy::disallowed_methods)]
        let mut cmd = Command::new(argv[0]);
        let stderr = tempfile::tempfile().unwrap();
        cmd.args(&argv[1..])
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(stderr.try_clone().unwrap());
        // SAFETY: write(2) of one byte to descriptors the parent keeps open until
        // spawn returns; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(move || join(&fds));
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {argv:?}: {e}"));
        drop(procs);
        let pid = child.id();
        self.children.push((child, stderr));
        pid
    }

    /// Starts `argv` like [`Fixture::spawn_in`] and returns its stdout, to feed
    /// another program.
    fn spawn_with_stdout(&mut self, g: &Group, h: &LimitHandles, argv: &[&str]) -> Stdio {
        let procs = self.cg.procs_file(g).unwrap();
        let mut fds: Vec<RawFd> = vec![procs.as_raw_fd()];
        fds.extend(h.procs_files.iter().map(File::as_raw_fd));
        #[allow(clippy::disallowed_methods)]
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        // SAFETY: as in spawn_in_with.
        unsafe {
            cmd.pre_exec(move || join(&fds));
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {argv:?}: {e}"));
        let out = Stdio::from(child.stdout.take().unwrap());
        self.children.push((child, tempfile::tempfile().unwrap()));
        out
    }

    /// Waits (up to `limit`) for the child `pid` to exit; `None` if it did not.
    fn wait(&mut self, pid: u32, limit: Duration) -> Option<(std::process::ExitStatus, String)> {
        let i = self
            .children
            .iter()
            .position(|(c, _)| c.id() == pid)
            .unwrap();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.children[i].0.try_wait().unwrap() {
                let (_, mut file) = self.children.remove(i);
                let mut err = String::new();
                use std::io::{Read, Seek};
                file.rewind().unwrap();
                file.read_to_string(&mut err).unwrap();
                return Some((st, err));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every directory this incarnation made, v2 and v1, that still exists.
    fn leftovers(&self) -> Vec<PathBuf> {
        std::iter::once(self.cg.base().to_path_buf())
            .chain(self.cg.v1_mirror().values().cloned())
            .chain(self.cg.mark().ok().map(Path::to_path_buf))
            .filter(|p| p.exists())
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let destroyed = self.cg.destroy();
        let reaped = Cgroups::reap_leftovers(&self.det, &self.instance);
        let left = self.leftovers();
        self.cg.remove_instance_dirs();
        if !std::thread::panicking() {
            destroyed.unwrap();
            reaped.unwrap();
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
}

/// In the child: `0` into every `cgroup.procs` (the v2 group first, then the v1
/// limit groups), exactly the launcher's sequence.
fn join(fds: &[RawFd]) -> std::io::Result<()> {
    for fd in fds {
        // SAFETY: write(2) of one byte to a descriptor the parent keeps open.
        if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn read(p: &Path) -> String {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_owned()
}

fn pids_of(p: &Path) -> Vec<i32> {
    read(&p.join("cgroup.procs"))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn a_fork_bomb_is_stopped_by_pids_max_and_the_supervisor_is_not() {
    let mut fx = Fixture::new();
    let tenant = fx.create(&["t"]);
    let g = fx.cg.create(&tenant.rel.child("bomb").unwrap()).unwrap();
    let h = fx
        .cg
        .set_limits(
            &g,
            &Limits {
                pids_max: Some(8),
                ..Limits::default()
            },
        )
        .unwrap();
    let pids_dir = fx.mirror("pids", &g);
    assert_eq!(read(&pids_dir.join("pids.max")), "8");
    assert!(!fx.cg.pids_limited(&g));

    let pid = fx.spawn_in(
        &g,
        &h,
        &[
            "/bin/sh",
            "-c",
            "for i in $(seq 50); do sleep 5 & done; wait",
        ],
    );
    assert_eq!(
        pids_of(&pids_dir).first(),
        Some(&(pid as i32)),
        "joined the v1 pids group"
    );
    let (st, err) = fx
        .wait(pid, Duration::from_secs(4))
        .expect("the fork bomb's shell neither finished nor failed: pids.max did not bite");
    // dash stops the script at the first failed fork(2) (EAGAIN).
    assert!(!st.success(), "{st:?}: {err}");
    assert!(err.contains("fork"), "the shell saw no failed fork: {err}");
    assert!(fx.cg.pids_limited(&g), "pids.events max stayed 0");
    let peak: u64 = read(&pids_dir.join("pids.peak")).parse().unwrap();
    assert!(peak <= 8, "pids.peak {peak}");
    let sleepers = fx.cg.pids(&g).unwrap();
    assert!(
        (1..8).contains(&sleepers.len()),
        "{} sleeps got through",
        sleepers.len()
    );

    // The supervisor (this process) is outside the limit: it can still fork
    // plenty while the bomb's leftovers fill their group.
    let t: Vec<Child> = (0..20)
        .map(|_| {
            #[allow(clippy::disallowed_methods)]
            Command::new("/bin/true").spawn().unwrap()
        })
        .collect();
    for mut c in t {
        assert!(c.wait().unwrap().success());
    }

    fx.cg.kill_and_remove(&g, Duration::from_secs(5)).unwrap();
    assert!(
        !g.dir.exists() && !pids_dir.exists(),
        "v2 and v1 groups removed"
    );
    for controller in ["memory", "cpu"] {
        assert!(
            !fx.mirror(controller, &g).exists(),
            "{controller} mirror removed"
        );
    }
    eprintln!(
        "fork bomb: {} sleeps got through, pids.peak {peak}, stderr: {}",
        sleepers.len(),
        err.lines().next().unwrap_or("")
    );
}

#[test]
fn a_memory_hog_is_oom_killed_and_the_supervisor_and_a_sibling_go_on() {
    let mut fx = Fixture::new();
    let hog_g = fx.create(&["hog"]);
    let sib_g = fx.create(&["sibling"]);
    let h = fx
        .cg
        .set_limits(
            &hog_g,
            &Limits {
                memory_max: Some(32 << 20),
                ..Limits::default()
            },
        )
        .unwrap();
    let mem = fx.mirror("memory", &hog_g);
    assert_eq!(read(&mem.join("memory.limit_in_bytes")), "33554432");
    let memsw = mem.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        assert_eq!(read(&memsw), "33554432", "swap cannot dodge the limit");
    }
    let sib_h = fx.cg.set_limits(&sib_g, &Limits::default()).unwrap();
    let sibling = fx.spawn_in(&sib_g, &sib_h, &["/bin/sleep", "30"]);
    assert!(!fx.cg.oom_killed(&hog_g));

    // tail(1) keeps the last line of its input in memory, and 200 MB of zeros
    // from head(1) hold no newline, so tail grows resident until the limit stops
    // it (and no further than 200 MB if it does not). tail is the direct child,
    // as an agent's program is; head feeds it from inside the group too.
    let feeder = fx.spawn_with_stdout(
        &hog_g,
        &h,
        &["/usr/bin/head", "-c", "200000000", "/dev/zero"],
    );
    let hog = fx.spawn_in_with(&hog_g, &h, &["/usr/bin/tail"], feeder);
    let (st, err) = fx
        .wait(hog, Duration::from_secs(20))
        .expect("the hog is still running: memory.limit_in_bytes did not bite");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}: {err}");
    assert!(
        fx.cg.oom_killed(&hog_g),
        "no oom_kill counted for {}",
        mem.display()
    );
    assert!(!fx.cg.oom_killed(&sib_g));
    let max_usage: u64 = read(&mem.join("memory.max_usage_in_bytes"))
        .parse()
        .unwrap();
    assert!(max_usage <= 32 << 20, "max usage {max_usage}");

    // The sibling agent is untouched, and so is the supervisor (this process).
    assert_eq!(fx.cg.pids(&sib_g).unwrap(), [sibling as i32]);
    let big = vec![1u8; 64 << 20];
    assert_eq!(big.iter().map(|b| *b as usize).sum::<usize>(), 64 << 20);

    fx.cg
        .kill_and_remove(&hog_g, Duration::from_secs(5))
        .unwrap();
    assert!(!hog_g.dir.exists() && !mem.exists());
}

#[test]
fn cpu_weight_is_written_as_shares_and_read_back() {
    let fx = Fixture::new();
    let g = fx.create(&["c"]);
    fx.cg
        .set_limits(
            &g,
            &Limits {
                cpu_weight: Some(250),
                ..Limits::default()
            },
        )
        .unwrap();
    assert_eq!(read(&fx.mirror("cpu", &g).join("cpu.shares")), "2560");
    // A default group keeps the default share.
    let d = fx.create(&["d"]);
    fx.cg.set_limits(&d, &Limits::default()).unwrap();
    assert_eq!(read(&fx.mirror("cpu", &d).join("cpu.shares")), "1024");
    let err = fx
        .cg
        .set_limits(
            &g,
            &Limits {
                cpu_weight: Some(0),
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::BadLimit {
                what: "cpu_weight",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn nested_groups_mirror_their_v2_place_and_limits_can_be_raised_and_lowered() {
    let mut fx = Fixture::new();
    let parent = fx.create(&["p"]);
    let child = fx.cg.create(&parent.rel.child("c").unwrap()).unwrap();
    let l = Limits {
        memory_max: Some(64 << 20),
        pids_max: Some(100),
        cpu_weight: Some(50),
    };
    fx.cg.set_limits(&parent, &l).unwrap();
    let h = fx.cg.set_limits(&child, &Limits::default()).unwrap();
    // memory, pids and cpu each a hierarchy of its own here: three files to join.
    assert_eq!(h.procs_files.len(), 3);
    let pid = fx.spawn_in(&child, &h, &["/bin/sleep", "30"]) as i32;
    for controller in ["memory", "pids", "cpu"] {
        let dir = fx.mirror(controller, &child);
        assert!(dir.starts_with(fx.mirror(controller, &parent)));
        assert_eq!(pids_of(&dir), [pid], "{controller}");
        let line = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let rel = dir
            .strip_prefix(&fx.det.v1_mounts[controller])
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(line.contains(&format!(":{controller}:/{rel}\n")), "{line}");
    }
    // Lower, then raise: memsw must stay >= the limit at every write.
    let mem = fx.mirror("memory", &parent);
    for bytes in [16u64 << 20, 256 << 20] {
        fx.cg
            .set_limits(
                &parent,
                &Limits {
                    memory_max: Some(bytes),
                    ..l
                },
            )
            .unwrap();
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), bytes.to_string());
    }
    // Removing the parent takes the child along, v1 too, deepest first.
    fx.cg
        .kill_and_remove(&parent, Duration::from_secs(5))
        .unwrap();
    for controller in ["memory", "pids", "cpu"] {
        assert!(!fx.mirror(controller, &parent).exists(), "{controller}");
    }
}

#[test]
fn leftover_v1_mirrors_of_a_dead_incarnation_are_reaped_even_without_v2() {
    let fx = Fixture::new();
    // A dead incarnation that only left v1 mirrors (killed between the v2 rmdir
    // and the v1 ones), one of them with a live process.
    let dead_mem = fx.cg.v1_mirror()["memory"]
        .parent()
        .unwrap()
        .join("s999999-1");
    let dead_pids = fx.cg.v1_mirror()["pids"]
        .parent()
        .unwrap()
        .join("s999999-1");
    fs::create_dir_all(dead_mem.join("a/b")).unwrap();
    fs::create_dir_all(dead_pids.join("a")).unwrap();
    let procs = File::options()
        .write(true)
        .open(dead_pids.join("a/cgroup.procs"))
        .unwrap();
    let fd = procs.as_raw_fd();
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("30");
    // SAFETY: one write(2) to a descriptor the parent keeps open.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut orphan = cmd.spawn().unwrap();
    let left = Cgroups::reap_leftovers(&fx.det, &fx.instance).unwrap();
    assert_eq!(left.groups, 1, "{left:?}");
    assert_eq!(left.pids_killed, [orphan.id() as i32]);
    assert_eq!(orphan.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(!dead_mem.exists() && !dead_pids.exists());
    assert!(
        fx.cg.base().exists(),
        "our own live incarnation was touched"
    );
}

#[test]
fn limits_supported_names_where_each_limit_goes_here() {
    let fx = Fixture::new();
    let got = fx.cg.limits_supported();
    eprintln!("{got:?}");
    let names: Vec<&str> = got.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "memory: cgroup v1 memory.limit_in_bytes (+ memory.memsw.limit_in_bytes)",
            "pids: cgroup v1 pids.max",
            "cpu: cgroup v1 cpu.shares"
        ],
        "this host is hybrid: cgroup2 offers only hugetlb"
    );
}

/// Limits set on many groups go to the v1 hierarchies, and removing the
/// subtree takes every v1 mirror with it. (What this costs is measured by
/// `brood bench spawn --level limits`.)
#[test]
fn limits_on_many_groups_are_removed_with_their_v1_mirrors() {
    let fx = Fixture::new();
    let top = fx.create(&["many"]);
    let l = Limits {
        memory_max: Some(256 << 20),
        pids_max: Some(64),
        cpu_weight: Some(100),
    };
    let mut groups = Vec::new();
    for i in 0..100 {
        let g = fx
            .cg
            .create(&top.rel.child(&format!("g{i}")).unwrap())
            .unwrap();
        let h = fx.cg.set_limits(&g, &l).unwrap();
        assert_eq!(h.procs_files.len(), 3);
        let d = fx
            .cg
            .create(&top.rel.child(&format!("d{i}")).unwrap())
            .unwrap();
        fx.cg.set_limits(&d, &Limits::default()).unwrap();
        groups.push(g);
        groups.push(d);
    }
    for controller in ["memory", "pids", "cpu"] {
        assert!(
            fx.mirror(controller, &groups[0]).exists(),
            "{controller} mirror made"
        );
    }
    fx.cg.remove(&top).unwrap();
    assert!(!top.dir.exists());
    for g in &groups {
        for controller in ["memory", "pids", "cpu"] {
            let m = fx.mirror(controller, g);
            assert!(!m.exists(), "{} left behind", m.display());
        }
    }
}
