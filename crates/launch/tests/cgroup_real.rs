//! The cgroup layer against the real kernel of this machine.
//!
//! Each test works under its own instance (`brood-test-<pid>-<n>`) below our own
//! cgroup, forks real processes into nested groups and checks that kill, wait and
//! remove leave nothing behind. A [`Fixture`] kills and removes everything it
//! made even when an assertion fails. Tests that need a kernel feature fail with a
//! message naming it; none is skipped.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use brood_launch::cgroup::{CgroupError, Cgroups, Detected, Group, GroupPath, Layout, detect};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// What a forked test process does once it is in its group.
#[derive(Clone, Copy)]
enum Role {
    /// Sleeps until a signal ends it.
    Pause,
    /// Forks a child that calls setsid(2) and forks the daemon, then exits: the
    /// daemon is in another session and process group, orphaned, and still in
    /// the cgroup.
    DoubleForkSetsid,
    /// Forks a sleeping child every millisecond, `n` times: still forking when
    /// the kill comes.
    ForkLoop(u32),
}

/// One instance's groups, and the direct children forked into them. Dropping it
/// SIGKILLs and reaps those children, then removes every group it made.
struct Fixture {
    det: Detected,
    instance: String,
    cg: Cgroups,
    children: Vec<i32>,
}

impl Fixture {
    fn new(det: Detected) -> Fixture {
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let instance = format!("test-{me}-{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let cg = Cgroups::open(&det, &instance).unwrap_or_else(|e| {
            panic!("cannot create cgroups on this host ({:?}): {e}", det.layout)
        });
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

    /// Forks a process that joins `g` (through the launcher's procs file) and
    /// plays `role`; returns once the group lists it.
    fn fork_into(&mut self, g: &Group, role: Role) -> i32 {
        let procs = self.cg.procs_file(g).unwrap();
        let pid = fork_joining(&procs, role);
        self.children.push(pid);
        wait_for(&format!("pid {pid} to show in {}", g.dir.display()), || {
            self.cg.pids(g).unwrap().contains(&pid)
        });
        pid
    }

    /// waitpid(2) for one of our children; returns its raw status.
    fn reap(&mut self, pid: i32) -> i32 {
        self.children.retain(|p| *p != pid);
        let mut status = 0;
        // SAFETY: pid is our own unreaped child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            r,
            pid,
            "waitpid({pid}): {}",
            std::io::Error::last_os_error()
        );
        status
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for pid in std::mem::take(&mut self.children) {
            // SAFETY: our own unreaped children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        let destroyed = self.cg.destroy();
        let reaped = Cgroups::reap_leftovers(&self.det, &self.instance);
        self.cg.remove_instance_dirs();
        if !std::thread::panicking() {
            destroyed.unwrap();
            reaped.unwrap();
        }
    }
}

/// Forks a child that writes `0` into `procs` (moving itself into the group, as
/// the launcher's pre-exec step does) and then plays `role`.
fn fork_joining(procs: &File, role: Role) -> i32 {
    let fd = procs.as_raw_fd();
    // SAFETY: the child only makes async-signal-safe raw syscalls and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: we are the freshly forked child.
        unsafe { child_main(fd, role) }
    }
    pid
}

/// # Safety
/// Only in a freshly forked child: raw syscalls, no allocation, never returns.
unsafe fn child_main(procs_fd: i32, role: Role) -> ! {
    // SAFETY (whole body): raw syscalls on values we own, in a single-threaded child.
    unsafe {
        // The test thread's signal mask is inherited; the tests need SIGTERM through.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
            libc::_exit(100);
        }
        match role {
            Role::Pause => {}
            Role::DoubleForkSetsid => {
                let mid = libc::fork();
                if mid == 0 {
                    libc::setsid();
                    if libc::fork() == 0 {
                        loop {
                            libc::pause();
                        }
                    }
                    libc::_exit(0);
                }
                libc::waitpid(mid, std::ptr::null_mut(), 0);
            }
            Role::ForkLoop(n) => {
                let ms = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 1_000_000,
                };
                for _ in 0..n {
                    if libc::fork() == 0 {
                        loop {
                            libc::pause();
                        }
                    }
                    libc::nanosleep(&ms, std::ptr::null_mut());
                }
            }
        }
        loop {
            libc::pause();
        }
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Fields 3 (state) and 6 (session) of /proc/<pid>/stat (proc(5)), if it exists.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = text[text.rfind(')')? + 1..].split_whitespace();
    let state = f.next()?.chars().next()?;
    let session = f.nth(2)?.parse().ok()?;
    Some((state, session))
}

/// Dead: no such process, or a zombie waiting for its parent (PID 1 here reaps
/// orphans only every few seconds).
fn gone(pid: i32) -> bool {
    stat(pid).is_none_or(|(state, _)| state == 'Z' || state == 'X')
}

fn killed_by(status: i32, sig: i32) -> bool {
    libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == sig
}

/// This host's layout; v2 grouping with cgroup.kill is what brood relies on.
fn host_v2() -> Detected {
    let det = detect(Path::new("/")).unwrap();
    assert!(
        matches!(det.layout, Layout::V2 | Layout::Hybrid),
        "cgroup v2 is not mounted (layout {:?}): brood groups and kills with cgroup v2",
        det.layout
    );
    det
}

/// The host seen as if it had only v1, grouping in `controller`'s hierarchy.
fn host_v1(controller: &str) -> Detected {
    let mut det = detect(Path::new("/")).unwrap();
    assert!(
        det.v1_mounts.contains_key(controller),
        "the cgroup v1 {controller} hierarchy is not mounted: this test exercises the v1 kill"
    );
    det.layout = Layout::V1;
    det.v2_mount = None;
    det.own_v2 = None;
    if controller == "pids" {
        det.v1_mounts.remove("freezer");
    }
    det
}

/// a, a/b, a/b/c with a sleeper in a and in b, a double-forked setsid daemon and a
/// process that keeps forking in c; kill(a) must take every one of them.
fn nested_tree_dies_whole(mut fx: Fixture) {
    let a = fx.create(&["a"]);
    let b = fx.create(&["a", "b"]);
    let c = fx.create(&["a", "b", "c"]);
    let p1 = fx.fork_into(&a, Role::Pause);
    let p2 = fx.fork_into(&b, Role::Pause);
    let p3 = fx.fork_into(&c, Role::DoubleForkSetsid);
    let p4 = fx.fork_into(&c, Role::ForkLoop(300));
    // SAFETY: getsid(2) with 0 asks for our own session.
    let our_session = unsafe { libc::getsid(0) };
    // The daemon is the one process of c in another session (its parent called
    // setsid and exited); everything else inherited ours.
    let daemon_in = |pids: &[i32]| {
        pids.iter()
            .copied()
            .find(|p| stat(*p).is_some_and(|(_, sid)| sid != our_session))
    };
    wait_for("the daemon and 10 of p4's children", || {
        let pids = fx.cg.pids(&c).unwrap();
        pids.len() >= 13 && daemon_in(&pids).is_some()
    });
    let daemon = daemon_in(&fx.cg.pids(&c).unwrap()).unwrap();
    assert!(![p3, p4].contains(&daemon));
    let pids_a = fx.cg.pids(&a).unwrap();
    let pids_b = fx.cg.pids(&b).unwrap();
    let pids_c = fx.cg.pids(&c).unwrap();
    for p in [p1, p2, p3, p4, daemon] {
        assert!(pids_a.contains(&p), "pids(a) is recursive: {p} missing");
    }
    assert!(!pids_b.contains(&p1) && pids_b.contains(&p2) && pids_b.contains(&daemon));
    assert!(!pids_c.contains(&p2) && pids_c.contains(&p3));
    assert!(fx.cg.is_populated(&a).unwrap() && fx.cg.is_populated(&c).unwrap());

    fx.cg.kill(&a).unwrap();
    let empty = fx.cg.wait_empty(&a, Duration::from_secs(5)).unwrap();
    assert!(empty, "still populated after kill: {:?}", fx.cg.pids(&a));
    assert!(!fx.cg.is_populated(&a).unwrap());
    assert_eq!(fx.cg.pids(&a).unwrap(), Vec::<i32>::new());
    for p in [p1, p2, p3, p4] {
        let status = fx.reap(p);
        assert!(
            killed_by(status, libc::SIGKILL),
            "pid {p}: status {status:#x}"
        );
    }
    let stragglers: Vec<i32> = pids_a.iter().copied().filter(|p| !gone(*p)).collect();
    assert!(
        stragglers.is_empty(),
        "alive after the kill: {stragglers:?}"
    );

    fx.cg.remove(&a).unwrap();
    assert!(!a.dir.exists() && !c.dir.exists());
}

#[test]
fn cgroup_kill_takes_a_nested_tree_with_setsid_daemons_and_forks_during_the_kill() {
    let fx = Fixture::new(host_v2());
    assert_eq!(fx.cg.kill_mechanism(), "cgroup.kill");
    nested_tree_dies_whole(fx);
}

#[test]
fn v1_freezer_kill_takes_the_same_tree() {
    let fx = Fixture::new(host_v1("freezer"));
    assert_eq!(fx.cg.kill_mechanism(), "freezer+SIGKILL");
    assert!(fx.cg.base().starts_with(&fx.det.v1_mounts["freezer"]));
    nested_tree_dies_whole(fx);
}

#[test]
fn v1_pids_kill_takes_the_same_tree() {
    let fx = Fixture::new(host_v1("pids"));
    assert_eq!(fx.cg.kill_mechanism(), "pids.max=0+SIGKILL");
    nested_tree_dies_whole(fx);
}

#[test]
fn signal_reaches_every_process_of_the_subtree_and_pids_is_recursive() {
    let mut fx = Fixture::new(host_v2());
    let a = fx.create(&["a"]);
    let b = fx.create(&["a", "b"]);
    let c = fx.create(&["a", "b", "c"]);
    let p1 = fx.fork_into(&a, Role::Pause);
    let p2 = fx.fork_into(&b, Role::Pause);
    let p3 = fx.fork_into(&c, Role::Pause);
    let mut all = vec![p1, p2, p3];
    all.sort();
    assert_eq!(fx.cg.pids(&a).unwrap(), all);
    let mut below_b = vec![p2, p3];
    below_b.sort();
    assert_eq!(fx.cg.pids(&b).unwrap(), below_b);
    assert_eq!(fx.cg.pids(&c).unwrap(), [p3]);

    assert_eq!(fx.cg.signal(&b, libc::SIGTERM).unwrap(), 2);
    for p in [p2, p3] {
        let status = fx.reap(p);
        assert!(
            killed_by(status, libc::SIGTERM),
            "pid {p}: status {status:#x}"
        );
    }
    assert!(fx.cg.wait_empty(&b, Duration::from_secs(1)).unwrap());
    assert_eq!(fx.cg.signal(&b, libc::SIGTERM).unwrap(), 0);
    assert!(fx.cg.is_populated(&a).unwrap(), "p1 is still in a");
    assert_eq!(fx.cg.signal(&a, libc::SIGTERM).unwrap(), 1);
    let status = fx.reap(p1);
    assert!(killed_by(status, libc::SIGTERM));

    fx.cg.kill_and_remove(&a, Duration::from_secs(1)).unwrap();
    assert!(!a.dir.exists());
    fx.cg.kill_and_remove(&a, Duration::from_secs(1)).unwrap();
}

#[test]
fn reap_leftovers_kills_and_removes_only_dead_incarnations() {
    let mut fx = Fixture::new(host_v2());
    let ours = fx.create(&["mine"]);
    let p_ours = fx.fork_into(&ours, Role::Pause);
    let instance_dir = fx.cg.base().parent().unwrap().to_path_buf();

    // A dead incarnation with a live process two levels down.
    let dead = instance_dir.join("s999999-1");
    fs::create_dir_all(dead.join("agent/child")).unwrap();
    let procs = File::options()
        .write(true)
        .open(dead.join("agent/child/cgroup.procs"))
        .unwrap();
    let orphan = fork_joining(&procs, Role::DoubleForkSetsid);
    fx.children.push(orphan);
    // Our own pid with a wrong start time: the pid was reused, the incarnation is dead.
    // SAFETY: getpid(2) has no preconditions.
    let reused = instance_dir.join(format!("s{}-1", unsafe { libc::getpid() }));
    fs::create_dir(&reused).unwrap();
    // Not of the s<pid>-<starttime> shape: not ours to touch.
    let foreign = instance_dir.join("keep-me");
    fs::create_dir(&foreign).unwrap();
    wait_for("orphan and its daemon in the dead group", || {
        fs::read_to_string(dead.join("agent/child/cgroup.procs"))
            .unwrap()
            .lines()
            .count()
            == 2
    });

    let left = Cgroups::reap_leftovers(&fx.det, &fx.instance).unwrap();
    assert_eq!(left.groups, 2, "{left:?}");
    assert_eq!(left.pids_killed.len(), 2, "{left:?}");
    assert!(left.pids_killed.contains(&orphan));
    assert!(!dead.exists() && !reused.exists());
    assert!(foreign.exists() && fx.cg.base().exists() && ours.dir.exists());
    assert!(killed_by(fx.reap(orphan), libc::SIGKILL));
    assert!(left.pids_killed.iter().all(|p| gone(*p)));
    assert_eq!(
        fx.cg.pids(&ours).unwrap(),
        [p_ours],
        "our live incarnation was touched"
    );
    fs::remove_dir(&foreign).unwrap();
}

#[test]
fn the_launcher_path_joins_before_exec_and_the_group_is_found_from_proc() {
    let fx = Fixture::new(host_v2());
    let tenant = fx.create(&["user-0"]);
    let g = fx.cg.create(&tenant.rel.child("agent-1").unwrap()).unwrap();
    let procs = fx.cg.procs_file(&g).unwrap();
    let fd = procs.as_raw_fd();
    // The test needs a real exec'd program, as the launcher starts one.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("1000");
    // SAFETY: the closure makes one write(2) to a descriptor the parent keeps open.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("cannot run sleep(1)");
    let pid = child.id() as i32;
    assert_eq!(fx.cg.pids(&g).unwrap(), [pid]);
    let line = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert_eq!(fx.cg.path_of_process_line(&line), Some(g.dir.clone()));

    fx.cg.kill_and_remove(&g, Duration::from_secs(5)).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(!g.dir.exists());
}

#[test]
fn errors_name_the_path_and_remove_refuses_a_populated_group() {
    let mut fx = Fixture::new(host_v2());
    let a = fx.create(&["a"]);
    let err = fx.cg.create(&a.rel).unwrap_err();
    assert!(
        matches!(&err, CgroupError::Io { op: "mkdir", path, .. } if *path == a.dir),
        "{err}"
    );
    assert!(err.to_string().contains(&*a.dir.to_string_lossy()), "{err}");
    let missing = fx.cg.group(&GroupPath::new(&["nope"]).unwrap());
    fx.cg.remove(&missing).unwrap();
    fx.cg
        .kill_and_remove(&missing, Duration::from_millis(10))
        .unwrap();
    assert!(fx.cg.pids(&missing).is_err());

    let b = fx.create(&["a", "b"]);
    let p = fx.fork_into(&b, Role::Pause);
    match fx.cg.remove(&a) {
        Err(CgroupError::NotEmpty { path, pids }) => {
            assert_eq!(path, b.dir);
            assert_eq!(pids, [p]);
        }
        other => panic!("removing a populated group: {other:?}"),
    }
    fx.cg.kill_and_remove(&a, Duration::from_secs(5)).unwrap();
    assert!(killed_by(fx.reap(p), libc::SIGKILL));
    assert!(!a.dir.exists());
}

#[test]
fn many_groups_are_created_and_removed_as_one_subtree() {
    let fx = Fixture::new(host_v2());
    let top = fx.create(&["many"]);
    for i in 0..200 {
        fx.cg
            .create(&top.rel.child(&format!("g{i}")).unwrap())
            .unwrap();
    }
    let made = fs::read_dir(&top.dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
        .count();
    assert_eq!(made, 200);
    fx.cg.remove(&top).unwrap();
    assert!(!top.dir.exists());
}

/// Field 22 (start time) of /proc/<pid>/stat (proc(5)).
fn start_time(pid: i32) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    text[text.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

/// Issue 28 item 2: an incarnation's liveness mark decides before its pid.
/// Held, it is alive though its pid is dead here; free, it is dead though
/// its pid names a live process (as a supervisor's in another PID namespace
/// does); a free mark without a group goes too; unlocked, the held one is
/// dead and goes with its group.
#[test]
fn liveness_marks_decide_before_pids() {
    let fx = Fixture::new(host_v2());
    let marks = fx.det.marks.clone().unwrap().join(&fx.instance);
    let inst = fx.cg.base().parent().unwrap().to_path_buf();
    let me = fx
        .cg
        .base()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let own_mark = marks.join(format!("{me}.lock"));
    assert_eq!(fx.cg.mark(), Ok(own_mark.as_path()));

    let held = inst.join("s999998-1");
    fs::create_dir(&held).unwrap();
    let held_mark = marks.join("s999998-1.lock");
    let lock = File::create(&held_mark).unwrap();
    // SAFETY: flock(2) on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    #[allow(clippy::disallowed_methods)]
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = sleeper.id() as i32;
    let name = format!("s{pid}-{}", start_time(pid));
    let free = inst.join(&name);
    fs::create_dir(&free).unwrap();
    let free_mark = marks.join(format!("{name}.lock"));
    File::create(&free_mark).unwrap();
    let orphan_mark = marks.join("s999997-1.lock");
    File::create(&orphan_mark).unwrap();

    let left = Cgroups::reap_leftovers(&fx.det, &fx.instance).unwrap();
    assert_eq!((left.groups, left.marks), (1, 1), "{left:?}");
    assert!(!free.exists() && !free_mark.exists() && !orphan_mark.exists());
    assert!(
        held.exists() && held_mark.exists(),
        "a held mark's group went"
    );
    assert!(fx.cg.base().exists() && own_mark.exists());
    assert!(!gone(pid), "a process outside the group was touched");

    drop(lock);
    let left = Cgroups::reap_leftovers(&fx.det, &fx.instance).unwrap();
    assert_eq!(left.groups, 1, "{left:?}");
    assert!(!held.exists() && !held_mark.exists());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    fx.cg.destroy().unwrap();
    assert!(!own_mark.exists(), "destroy removes the incarnation's mark");
}
