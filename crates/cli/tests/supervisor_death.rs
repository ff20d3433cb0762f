//! Supervisor death (SPEC 6): `brood run` is SIGKILLed while a three-level tree
//! runs, with grandchild processes (one of them setsid()'d). Every process of the
//! tree must be gone within a second, with no restart; a restarted supervisor then
//! holds nothing `running` without a process and has removed the old groups.
//! What a dead supervisor leaves goes at the next start of any root and with
//! `brood doctor --fix`, told dead by its liveness mark; a live one in a PID
//! namespace of its own is left alone (issue 28 item 2).

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use brood_core::{CancelReason, Status, Terminal};
use common::*;
use serde_json::json;

fn instance_dir(root: &Path) -> PathBuf {
    let det = brood_launch::cgroup::detect(Path::new("/")).expect("cgroups on this host");
    let v2 = det.v2_mount.expect("a cgroup v2 mount on this host");
    let own = det.own_v2.unwrap_or_default();
    v2.join(own.trim_start_matches('/')).join(format!(
        "brood-{}",
        brood_runtime::paths::instance_key(root)
    ))
}

/// The tests here start supervisors, and a start removes what dead
/// supervisors left on the host: one at a time, so each sees its own
/// leftovers before its own start (or `brood doctor --fix`) removes them.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `s<pid>-<starttime>` groups under an instance directory.
fn incarnations(inst: &Path) -> Vec<String> {
    match std::fs::read_dir(inst) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('s') && !n.contains('.'))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {}: {e}", inst.display()),
    }
}

/// `brood run` of one hanging agent on `root`, SIGKILLed once the agent
/// runs: the dead incarnation's group is left, with nothing in it.
fn killed_supervisor(root: &Path) -> PathBuf {
    #[allow(clippy::disallowed_methods)]
    let mut run = Command::new(exe())
        .args([
            "--root",
            root.to_str().unwrap(),
            "run",
            "--name",
            "top",
            "--",
        ])
        .args(agent(&["--hang"]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let inst = instance_dir(root);
    assert!(
        eventually(Duration::from_secs(15), || !pids_under(&inst).is_empty()),
        "the agent never ran"
    );
    let pids = pids_under(&inst);
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            for p in &pids {
                let mut status = 0;
                // SAFETY: waitpid(2) on one pid without blocking (this
                // process is the orphans' subreaper).
                unsafe { libc::waitpid(*p, &mut status, libc::WNOHANG) };
            }
            pids_under(&inst).is_empty() && pids.iter().all(|p| !alive(*p))
        }),
        "the agents died with their supervisor"
    );
    let left = incarnations(&inst);
    assert_eq!(
        left.len(),
        1,
        "the dead supervisor's group is left: {left:?}"
    );
    inst.join(&left[0])
}

/// The liveness mark (`cgroup::alive`) of the incarnation whose group is
/// `group`.
fn mark_of(group: &Path) -> PathBuf {
    let det = brood_launch::cgroup::detect(Path::new("/")).expect("cgroups on this host");
    let inst = group
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let name = group.file_name().unwrap().to_str().unwrap();
    det.marks
        .expect("root has a place for liveness marks")
        .join(inst.strip_prefix("brood-").unwrap())
        .join(format!("{name}.lock"))
}

/// Starts and shuts down a supervisor of `root` in this process.
fn start_and_stop(root: &Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = brood_runtime::Config::new(root.to_path_buf());
        cfg.agent_sockets = Some(brood_server::agent_sockets());
        let sup = brood_runtime::Supervisor::start(cfg).expect("a supervisor starts");
        sup.shutdown().await;
    });
}

/// `brood doctor` (with `--fix` or not) on `root`: its `leftovers` line.
fn doctor_leftovers(root: &Path, fix: bool) -> String {
    let args: &[&str] = if fix {
        &["doctor", "--fix"]
    } else {
        &["doctor"]
    };
    let out = brood(root, args);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("leftovers"))
        .unwrap_or_else(|| panic!("no leftovers line: {}", text(&out)))
        .to_owned()
}

/// `brood serve` of `root` as PID 1 of a PID namespace of its own (as
/// `many_nodes_placement` runs a node); stopped with SIGTERM when dropped.
struct Unshared {
    unshare: std::process::Child,
    /// The node's pid here.
    node: i32,
    stopped: bool,
}

impl Unshared {
    fn start(root: &Path) -> Unshared {
        #[allow(clippy::disallowed_methods)]
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(exe())
            .arg("--root")
            .arg(root)
            .args(["serve", "--grace", "0.3"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let u = unshare.id();
        let mut node = 0;
        assert!(
            eventually(Duration::from_secs(20), || {
                node = std::fs::read_to_string(format!("/proc/{u}/task/{u}/children"))
                    .ok()
                    .and_then(|c| c.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0);
                node > 0 && std::os::unix::net::UnixStream::connect(root.join("brood.sock")).is_ok()
            }),
            "brood serve under unshare did not start"
        );
        Unshared {
            unshare,
            node,
            stopped: false,
        }
    }

    /// `brood ARGS…` on `root` run inside the node's PID and mount
    /// namespaces: a caller from outside is not the operator there.
    fn brood(&self, root: &Path, args: &[&str]) -> std::process::Output {
        #[allow(clippy::disallowed_methods)]
        Command::new("nsenter")
            .args(["-t", &self.node.to_string(), "-p", "-m"])
            .arg(exe())
            .arg("--root")
            .arg(root)
            .args(args)
            .env_remove("BROOD_SOCKET")
            .output()
            .unwrap()
    }

    /// SIGTERM to the node: it stops cleanly. Whether `unshare` exited.
    fn stop(&mut self) -> bool {
        if self.stopped {
            return true;
        }
        // SAFETY: signalling the node this test started (not reaped yet:
        // `unshare` reaps it before it exits itself).
        unsafe { libc::kill(self.node, libc::SIGTERM) };
        self.stopped = eventually(Duration::from_secs(20), || {
            matches!(self.unshare.try_wait(), Ok(Some(_)))
        });
        self.stopped
    }
}

impl Drop for Unshared {
    fn drop(&mut self) {
        if !self.stop() {
            // `--kill-child` takes the node with it.
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
    }
}

/// Issue 28 item 2: a supervisor killed by SIGKILL leaves its groups and
/// its liveness mark (free now); the next start of a different root removes
/// them, and the dead root's instance directories, empty then.
#[test]
fn a_dead_supervisors_empty_groups_go_at_the_next_start_of_another_root() {
    let _one = serial();
    // SAFETY: prctl(2) with integer arguments, on this test process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let dead = tempfile::tempdir().unwrap();
    let group = killed_supervisor(dead.path());
    let mark = mark_of(&group);
    assert!(mark.exists(), "{} was never made", mark.display());

    let other = tempfile::tempdir().unwrap();
    start_and_stop(other.path());
    assert!(
        !group.exists(),
        "{} outlived the next start of another root",
        group.display()
    );
    assert!(!mark.exists(), "{} outlived its group", mark.display());
    assert!(
        !instance_dir(dead.path()).exists() && !mark.parent().unwrap().exists(),
        "the dead root's empty instance directories are left"
    );
}

/// Issue 28 item 2: a live supervisor in a PID namespace of its own, its
/// base empty (its pid, 1, names another process here), is told alive by
/// its liveness mark: `brood doctor` lists only a dead supervisor's group
/// beside it, a start of another root and `brood doctor --fix` remove only
/// that one, and the live one still starts agents afterwards.
#[test]
fn a_live_supervisor_in_another_pid_namespace_is_left_alone_by_other_starts_and_doctor() {
    let _one = serial();
    // SAFETY: prctl(2) with integer arguments, on this test process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let live = tempfile::tempdir().unwrap();
    let mut node = Unshared::start(live.path());
    let inst = instance_dir(live.path());
    // Its socket answers before its supervisor has started.
    assert!(
        eventually(Duration::from_secs(20), || incarnations(&inst).len() == 1),
        "the node's incarnation group: {:?}",
        incarnations(&inst)
    );
    let names = incarnations(&inst);
    let base = inst.join(&names[0]);
    assert!(
        names[0].starts_with("s1-"),
        "the node is PID 1 of its namespace: {names:?}"
    );
    assert!(pids_under(&base).is_empty(), "its base is empty");
    let live_mark = mark_of(&base);
    assert!(live_mark.exists(), "{}", live_mark.display());

    let dead = tempfile::tempdir().unwrap();
    let gone = killed_supervisor(dead.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let listed = doctor_leftovers(elsewhere.path(), false);
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(listed.contains(&gone.display().to_string()), "{listed}");
    assert!(!listed.contains(&base.display().to_string()), "{listed}");

    let other = tempfile::tempdir().unwrap();
    start_and_stop(other.path());
    assert!(
        !gone.exists(),
        "{} outlived another root's start",
        name(&gone)
    );
    let fixed = doctor_leftovers(elsewhere.path(), true);
    assert!(
        base.exists() && live_mark.exists(),
        "the live node's base or mark was removed: {fixed}"
    );

    let out = node.brood(
        live.path(),
        &[
            "spawn",
            "--name",
            "after",
            "--",
            exe(),
            "test-agent",
            "--hang",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        eventually(Duration::from_secs(10), || !pids_under(&base).is_empty()),
        "the node's agent runs in its base"
    );
    assert!(node.stop(), "the node stops on SIGTERM");
    assert!(
        !base.exists() && !live_mark.exists(),
        "a clean stop removes the node's groups and mark"
    );
}

/// Issue 28 item 2: after a supervisor dies by SIGKILL, `brood doctor`
/// (from any root) lists the groups it left and `brood doctor --fix` removes
/// them.
#[test]
fn a_dead_supervisors_groups_are_listed_by_doctor_and_removed_by_doctor_fix() {
    let _one = serial();
    // SAFETY: prctl(2) with integer arguments, on this test process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    // `brood doctor` names it; `--fix` removes it.
    let dead = tempfile::tempdir().unwrap();
    let group = killed_supervisor(dead.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let doctor = |fix: bool| {
        let args: &[&str] = if fix {
            &["doctor", "--fix"]
        } else {
            &["doctor"]
        };
        let out = brood(elsewhere.path(), args);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = doctor(false);
    let name = group.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("leftovers") && l.contains(&name)),
        "doctor lists {name}: {listed}"
    );
    assert!(
        group.exists(),
        "doctor without --fix removed {}",
        group.display()
    );
    let fixed = doctor(true);
    assert!(
        !group.exists(),
        "{} outlived doctor --fix: {fixed}",
        group.display()
    );
    let line = fixed
        .lines()
        .find(|l| l.starts_with("leftovers"))
        .unwrap_or_default();
    assert!(
        line.contains("removed") && !line.contains("removed 0 group"),
        "{fixed}"
    );
    assert!(
        doctor(false)
            .lines()
            .any(|l| l.starts_with("leftovers") && l.contains("no group of a dead supervisor")),
        "nothing is left after --fix"
    );
}

#[test]
fn supervisor_sigkill_takes_the_whole_tree_and_restart_records_it() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // This test plays the host's init: the supervisor's orphans (its agents,
    // killed with it) come to it, and it reaps them, so a zombie (which
    // `alive` counts as alive) is only ever one nobody killed.
    // SAFETY: prctl(2) with integer arguments, on this test process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // top -> mid -> leaf; leaf forks two grandchildren, one of them setsid()'d.
    let leaf = json!({"name": "leaf", "argv": agent(&["--grandchildren", "1", "--setsid-grandchild", "--hang"]), "await_ready": true});
    let mid = json!({"name": "mid", "argv": agent(&["--spawn", &leaf.to_string(), "--hang"]), "await_ready": true});
    #[allow(clippy::disallowed_methods)]
    let mut run = Command::new(exe())
        .args([
            "--root",
            root.to_str().unwrap(),
            "run",
            "--name",
            "top",
            "--",
        ])
        .args(agent(&["--spawn", &mid.to_string(), "--hang"]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let inst = instance_dir(root);
    // top, mid, leaf, leaf's grandchild, leaf's setsid'd grandchild.
    let appeared = eventually(Duration::from_secs(15), || pids_under(&inst).len() >= 5);
    std::thread::sleep(Duration::from_millis(100));
    let pids = pids_under(&inst);
    assert!(appeared, "the tree never reached 5 processes: {pids:?}");

    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    let gone = eventually(Duration::from_secs(1), || {
        for p in &pids {
            let mut status = 0;
            // SAFETY: waitpid(2) on one pid, without blocking: reaps it only
            // if it is a dead child adopted by this (subreaper) process.
            unsafe { libc::waitpid(*p, &mut status, libc::WNOHANG) };
        }
        pids.iter().all(|p| !alive(*p))
    });
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        gone,
        "processes {left:?} outlived the supervisor by more than a second"
    );

    // Restart: leftovers reaped, nothing running without a process.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = brood_runtime::Config::new(root.to_path_buf());
        cfg.agent_sockets = Some(brood_server::agent_sockets());
        cfg.socket = root.join("restart.sock");
        let sup = brood_runtime::Supervisor::start(cfg).expect("restart");
        for n in ["top", "mid", "leaf"] {
            let a = sup.view().agent(&name(n)).unwrap();
            assert_eq!(
                a.status,
                Status::Ended(Terminal::Cancelled(CancelReason::RuntimeRestart)),
                "{n} after restart"
            );
        }
        let live = sup.store().agents(sup.tenant(), false).unwrap();
        assert!(live.is_empty(), "unfinished agents after restart: {live:?}");
        // The dead incarnation's groups are gone; only the new one's base remains.
        // The instance directory must be there to be looked at: a read that
        // fails must not pass as "nothing left".
        let dirs: Vec<String> = std::fs::read_dir(&inst)
            .unwrap_or_else(|e| panic!("reading {}: {e}", inst.display()))
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let me = brood_runtime::supervisor::supervisor_id(std::process::id() as i32).unwrap();
        let supervisors: Vec<&String> = dirs.iter().filter(|d| d.starts_with('s')).collect();
        assert_eq!(
            supervisors,
            [&me],
            "leftover groups of the dead supervisor, or none of the new one: {dirs:?}"
        );
        sup.shutdown().await;
    });
    let _ = std::fs::remove_dir(&inst);
}
