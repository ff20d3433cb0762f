//! A child that tries to break containment (issue 11 items 1 and 5). Each
//! test is named after what the child tries, under the operator's default
//! policy (`/ rw`, every tool) and under a narrow one: a child and a
//! `setsid`'d grandchild each, from a shell,
//!
//! * move into every ancestor's and the root's cgroup on every hierarchy (v2
//!   and each v1 controller);
//! * raise their own limits (`memory.limit_in_bytes`, `pids.max`, ...);
//! * kill, freeze or join a sibling's group;
//! * append to and truncate the store, its WAL and shared memory, write the
//!   configuration and take the sweeper lock;
//! * leave every tree and then act as the operator on the control socket;
//! * trace (through `/proc/1`) and signal the keeper and the supervisor.
//!
//! Every attempt must fail. Then, checked from outside: every process is still
//! in its group, the limits, the sibling and the keeper are untouched, the
//! store passes `PRAGMA integrity_check`, the whole tree dies with its parent
//! (SIGKILLed) within grace + 1 s on every hierarchy, and the supervisor goes
//! on serving. Without the veil (`brood_launch::veil`) the default-policy
//! cases of the first five fail (the store case kills this test process with
//! SIGBUS: the supervisor maps the WAL's shared memory).

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const GRACE: Duration = Duration::from_millis(1000);

/// What the hostile shell does with each line of `targets`: `MODE PATH VALUE`,
/// where MODE is `write` (replace), `append` or `truncate`, and a VALUE of
/// `SELF` stands for the writing process's pid. Each outcome is one line of
/// `out.<role>`: `WROTE …` for an attempt that got through, `refused …`
/// otherwise. Then the other attempts, the same way.
const SCRIPT: &str = r#"
role=$1
out="$DIR/out.$role"
try() { # name, command...
  n=$1; shift
  if "$@" >/dev/null 2>&1; then echo "WROTE $n" >> "$out"; else echo "refused $n" >> "$out"; fi
}
while read -r mode path value; do
  [ "$value" = SELF ] && value=$$
  case $mode in
    write) try "$mode $path" sh -c 'printf "%s\n" "$1" > "$2"' _ "$value" "$path" ;;
    append) try "$mode $path" sh -c 'printf "%s\n" "$1" >> "$2"' _ "$value" "$path" ;;
    truncate) try "$mode $path" sh -c ': > "$1"' _ "$path" ;;
    flock) try "flock $path" sh -c 'exec 9>>"$1" && flock -n 9' _ "$path" ;;
    read) try "read $path" sh -c 'cat "$1"' _ "$path" ;;
    list) try "list $path" ls "$path" ;;
    readlink) try "readlink $path" readlink "$path" ;;
    signal) try "signal $value $path" kill "-$value" "$path" ;;
    operator) try "cancel $path as the operator" brood --root "$THE_ROOT" cancel "$path" ;;
    # The keeper is its namespace's init: the kernel drops these signals
    # without an error, so they are judged from outside (it lives on).
    keeper) kill "-$value" 1 2>/dev/null; echo "sent $value to the keeper" >> "$out" ;;
  esac
done < "$DIR/targets"
echo "done" >> "$out"
# The grandchild stays, so its parent's death has something to kill.
[ "$role" = grand ] && exec sleep 1000
"#;

/// What a hostile child tries; each is a test of its own, under the default
/// policy and under a narrow one.
#[derive(Clone, Copy, Debug)]
enum Attempt {
    /// Move into every ancestor's and the root's cgroup on every hierarchy.
    EscapeIntoAncestorCgroups,
    /// Raise its own memory and pids limits (v1 and v2 files).
    RaiseItsOwnLimits,
    /// Kill, freeze or join its sibling's group.
    KillASiblingsGroup,
    /// Append to and truncate the store, its WAL and shared memory; write the
    /// configuration; take the sweeper lock.
    WriteAndTruncateTheStore,
    /// The same with the store kept outside brood's root (`--store`).
    WriteAndTruncateAStoreOutsideTheRoot,
    /// Cancel its sibling through the control socket, as the operator may.
    ActAsTheOperator,
    /// Trace (through /proc) and signal the keeper and the supervisor.
    TraceAndSignalTheKeeperAndSupervisor,
}

/// The child: start the grandchild in a session of its own, try everything
/// itself, then stay (its parent's death must end it).
fn child_argv() -> Vec<String> {
    let launcher = "setsid sh \"$DIR/body.sh\" grand </dev/null >/dev/null 2>&1 &\n\
         echo $! > \"$DIR/grand.pid\"\n\
         sh \"$DIR/body.sh\" child\n\
         exec sleep 1000\n";
    vec!["sh".into(), "-c".into(), launcher.into()]
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every cgroup hierarchy mounted here, with the group this process (the
/// supervisor of these tests) is in there: its mount point and that group's
/// path. The groups differ between hierarchies on a hybrid host (this
/// machine's memory hierarchy puts every process in a group of its own).
fn places() -> Vec<(PathBuf, String)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut out = Vec::new();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for l in text.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        let (fstype, options) = (r.next().unwrap_or(""), r.nth(1).unwrap_or(""));
        let mount = PathBuf::from(left.split(' ').nth(4).unwrap());
        let group = match fstype {
            "cgroup2" => own.lines().find_map(|l| l.strip_prefix("0::")),
            "cgroup" => own.lines().find_map(|l| {
                let mut p = l.splitn(3, ':');
                let (ctrls, path) = (p.nth(1)?, p.next()?);
                let opts: Vec<&str> = options.split(',').collect();
                (!ctrls.is_empty() && ctrls.split(',').all(|c| opts.contains(&c))).then_some(path)
            }),
            _ => continue,
        };
        let group =
            group.unwrap_or_else(|| panic!("no group of this process in {}", mount.display()));
        out.push((mount, group.to_owned()));
    }
    assert!(!out.is_empty(), "this host mounts no cgroup hierarchy");
    out
}

/// Every cgroup hierarchy's directory as this process sees it.
fn hierarchies() -> Vec<PathBuf> {
    places().into_iter().map(|(m, _)| m).collect()
}

/// Where a v2 group (below this process's own v2 group) lies in every
/// hierarchy: its path below the supervisor's own group, under the
/// supervisor's own group of each (the v1 mirrors of a hybrid host).
fn places_of(v2_group: &Path) -> Vec<PathBuf> {
    let ps = places();
    let own_v2 = ps
        .iter()
        .map(|(m, g)| m.join(g.trim_start_matches('/')))
        .find(|own| v2_group.starts_with(own))
        .expect("the group lies below this process's own group");
    let rel = v2_group.strip_prefix(&own_v2).unwrap();
    ps.iter()
        .map(|(m, g)| m.join(g.trim_start_matches('/')).join(rel))
        .collect()
}

/// [`places_of`] where the group exists.
fn mirrors(v2_group: &Path) -> Vec<PathBuf> {
    places_of(v2_group)
        .into_iter()
        .filter(|p| p.is_dir())
        .collect()
}

struct Case {
    attempt: Attempt,
    narrow: bool,
}

async fn tries(case: Case) {
    let store_dir = tempfile::tempdir().unwrap();
    let outside = matches!(case.attempt, Attempt::WriteAndTruncateAStoreOutsideTheRoot);
    let env = start_with(GRACE, |cfg| {
        if outside {
            cfg.store = Some(store_dir.path().join("shared.db"));
        }
    });
    let db_path = if outside {
        store_dir.path().join("shared.db")
    } else {
        env.root().join("brood.db")
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = env.root().to_path_buf();
    // The script is a file: an `env` value holds no newline (it would split
    // the `env` control file's line).
    std::fs::write(d.join("body.sh"), SCRIPT).unwrap();
    // A child's env is a subset of its parent's (SPEC 5): p passes it down.
    let vars: Vec<(String, String)> = vec![
        ("DIR".into(), d.display().to_string()),
        ("THE_ROOT".into(), root.display().to_string()),
    ];
    let mut p = req("p", agent(&["--hang"]));
    p.env = vars.clone();
    env.sup.spawn(me(), p).await.expect("spawn p");
    let mut sib = req("sib", agent(&["--hang"]));
    sib.parent = Some(name("p"));
    env.sup.spawn(me(), sib).await.expect("spawn sib");
    let p_group = PathBuf::from(show(&env, "p")["cgroup"].as_str().unwrap());
    let sib_group = PathBuf::from(show(&env, "sib")["cgroup"].as_str().unwrap());

    // The targets of this attempt, one line each (see SCRIPT). The child's
    // own group will be p_group/r1.c.
    let own_group = p_group.join("r1.c");
    let mut t = String::new();
    match case.attempt {
        Attempt::EscapeIntoAncestorCgroups => {
            for h in hierarchies() {
                writeln!(t, "write {} SELF", h.join("cgroup.procs").display()).unwrap();
            }
            for g in mirrors(&p_group) {
                let mut a = g.clone();
                loop {
                    writeln!(t, "write {} SELF", a.join("cgroup.procs").display()).unwrap();
                    if !a.pop() || !a.join("cgroup.procs").exists() {
                        break;
                    }
                }
            }
        }
        Attempt::RaiseItsOwnLimits => {
            for g in places_of(&own_group) {
                for (file, value) in [
                    ("memory.limit_in_bytes", "9223372036854771712"),
                    ("memory.memsw.limit_in_bytes", "9223372036854771712"),
                    ("pids.max", "max"),
                    ("memory.max", "max"),
                    ("cpu.shares", "262144"),
                ] {
                    writeln!(t, "write {} {value}", g.join(file).display()).unwrap();
                }
            }
        }
        Attempt::KillASiblingsGroup => {
            for g in mirrors(&sib_group) {
                writeln!(t, "write {} 1", g.join("cgroup.kill").display()).unwrap();
                writeln!(t, "write {} SELF", g.join("cgroup.procs").display()).unwrap();
                writeln!(t, "write {} 1", g.join("cgroup.freeze").display()).unwrap();
                writeln!(t, "write {} FROZEN", g.join("freezer.state").display()).unwrap();
            }
        }
        Attempt::WriteAndTruncateTheStore | Attempt::WriteAndTruncateAStoreOutsideTheRoot => {
            let db = db_path.display().to_string();
            for f in ["", "-wal", "-shm"] {
                writeln!(t, "append {db}{f} garbage").unwrap();
                writeln!(t, "truncate {db}{f} -").unwrap();
            }
            writeln!(t, "flock {db}.sweeper.lock -").unwrap();
            writeln!(t, "write {} garbage", root.join("config.toml").display()).unwrap();
        }
        Attempt::ActAsTheOperator => {
            // First out of every tree (the root of each hierarchy), so that the
            // cgroup of the `brood` it then runs would say "operator".
            for h in hierarchies() {
                writeln!(t, "write {} SELF", h.join("cgroup.procs").display()).unwrap();
            }
            writeln!(t, "operator sib -").unwrap();
            writeln!(t, "operator p -").unwrap();
        }
        Attempt::TraceAndSignalTheKeeperAndSupervisor => {
            // The agent's /proc is the host's, so host pids name them there:
            // the keeper, the supervisor, the sibling agent, the host's init.
            let p_pid = show(&env, "p")["pid"].as_i64().unwrap() as i32;
            let keeper = keeper_of(p_pid).expect("p lives under a keeper");
            let sup = std::process::id() as i32;
            let sib_pid = show(&env, "sib")["pid"].as_i64().unwrap() as i32;
            for pid in [keeper, sup, sib_pid, 1] {
                writeln!(t, "read /proc/{pid}/environ -").unwrap();
                writeln!(t, "read /proc/{pid}/mem -").unwrap();
                writeln!(t, "list /proc/{pid}/root/ -").unwrap();
                // Listing fd/ shows only numbers; what they point at needs
                // ptrace access.
                writeln!(t, "readlink /proc/{pid}/fd/0 -").unwrap();
                writeln!(t, "readlink /proc/{pid}/cwd -").unwrap();
            }
            // Its own pid namespace has no number for the supervisor.
            writeln!(t, "signal {sup} TERM").unwrap();
            writeln!(t, "signal {sup} KILL").unwrap();
            writeln!(t, "keeper - TERM").unwrap();
            writeln!(t, "keeper - KILL").unwrap();
        }
    }
    std::fs::write(d.join("targets"), &t).unwrap();

    let mut c = req("c", child_argv());
    c.parent = Some(name("p"));
    c.protocol = brood_store::Protocol::Exec;
    c.await_ready = false;
    c.env = vars;
    if !case.narrow && matches!(case.attempt, Attempt::RaiseItsOwnLimits) {
        // The operator's files and tools, with limits to raise.
        c.policy = Some(json!({
            "resources": {"pids_max": 64, "memory_max": 268435456},
        }));
    }
    if case.narrow {
        c.policy = Some(narrow_policy(d));
    }
    env.sup
        .spawn(me(), c)
        .await
        .expect("spawn the hostile child");

    // Both the child and the grandchild finish trying.
    let done = eventually_async(Duration::from_secs(30), || {
        ["child", "grand"].iter().all(|r| {
            lines(&d.join(format!("out.{r}")))
                .iter()
                .any(|l| l == "done")
        })
    })
    .await;
    let report = |r: &str| lines(&d.join(format!("out.{r}"))).join("\n");
    assert!(
        done,
        "the hostile shells did not finish: child:\n{}\ngrand:\n{}\nc: {}",
        report("child"),
        report("grand"),
        show(&env, "c")
    );
    let targets = t.lines().count();
    for role in ["child", "grand"] {
        let out = lines(&d.join(format!("out.{role}")));
        // One line per target, plus `done`.
        assert_eq!(out.len(), targets + 1, "{role}: {out:?}");
        let got_through: Vec<&String> = out.iter().filter(|l| l.starts_with("WROTE")).collect();
        assert!(
            got_through.is_empty(),
            "{role} got through: {got_through:#?}"
        );
    }

    // From outside: everyone is where they were put.
    let c_show = show(&env, "c");
    let c_group = PathBuf::from(c_show["cgroup"].as_str().unwrap());
    assert_eq!(c_group, own_group, "{c_show}");
    let c_pid = c_show["pid"].as_i64().unwrap() as i32;
    // `$!` is the grandchild's pid in the agents' PID namespace: find its
    // host pid by the last field of NSpid (proc(5)).
    let ns_pid = std::fs::read_to_string(d.join("grand.pid")).unwrap();
    let in_group = pids_under(&c_group);
    let grand = *in_group
        .iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("NSpid:"))
                .and_then(|l| l.split_whitespace().last())
                == Some(ns_pid.trim())
        })
        .unwrap_or_else(|| {
            panic!(
                "grandchild {ns_pid} not in {}: {in_group:?}",
                c_group.display()
            )
        });
    assert!(
        in_group.contains(&c_pid) && in_group.contains(&grand),
        "child {c_pid} and grandchild {grand} must still be in {}: {in_group:?}",
        c_group.display()
    );
    for pid in [c_pid, grand] {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        for l in cg.lines() {
            let path = l.splitn(3, ':').nth(2).unwrap();
            assert!(
                path == "/" || !p_group.to_string_lossy().ends_with(path) || path.contains("r1.c"),
                "{pid} left its group: {l}"
            );
        }
        let v2 = cg.lines().find(|l| l.starts_with("0::")).unwrap();
        assert!(v2.ends_with("/r1.c"), "{pid} is not in its v2 group: {v2}");
    }
    if case.narrow || matches!(case.attempt, Attempt::RaiseItsOwnLimits) {
        // Its limits are as the policy set them, on every v1 mirror.
        // Each limit is looked at on at least one mirror (this host has
        // the pids and memory controllers on v1 hierarchies).
        let (mut pids, mut memory) = (0, 0);
        for g in mirrors(&c_group) {
            let p = g.join("pids.max");
            if let Some(v) = unless_gone(std::fs::read_to_string(&p), &p) {
                assert_eq!(v.trim(), "64", "{}", g.display());
                pids += 1;
            }
            let m = g.join("memory.limit_in_bytes");
            if let Some(v) = unless_gone(std::fs::read_to_string(&m), &m) {
                assert_eq!(v.trim(), "268435456", "{}", g.display());
                memory += 1;
            }
        }
        assert!(
            pids > 0 && memory > 0,
            "no mirror of {} holds pids.max ({pids}) or memory.limit_in_bytes ({memory})",
            c_group.display()
        );
    }
    assert_eq!(show(&env, "sib")["status"], "running");
    let keeper = keeper_of(c_pid).expect("the child lives under a keeper");
    assert!(alive(keeper), "the keeper {keeper} is gone");
    let db = rusqlite::Connection::open(&db_path).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db);

    // The tree dies with its parent, grandchild included, within grace + 1 s.
    let p_pid = show(&env, "p")["pid"].as_i64().unwrap() as i32;
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(p_pid, libc::SIGKILL) };
    let gone = eventually_async(GRACE + Duration::from_secs(1), || {
        !alive(c_pid) && !alive(grand) && mirrors(&p_group).iter().all(|g| pids_under(g).is_empty())
    })
    .await;
    assert!(
        gone,
        "the tree outlived its parent: {:?}",
        pids_under(&p_group)
    );
    assert!(
        eventually_async(Duration::from_secs(10), || {
            show(&env, "c")["status"] == "cancelled"
        })
        .await,
        "{}",
        show(&env, "c")
    );

    // The supervisor goes on serving.
    env.sup
        .spawn(me(), req("after", agent(&["--result", "still here"])))
        .await
        .expect("spawn after the attack");
    assert!(
        eventually_async(Duration::from_secs(10), || {
            show(&env, "after")["status"] == "completed"
        })
        .await
    );
}

/// One test per attempt and policy, named after what the child tries.
macro_rules! attempts {
    ($($test:ident: $attempt:ident, $narrow:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            tries(Case { attempt: Attempt::$attempt, narrow: $narrow }).await;
        }
    )*};
}

attempts! {
    escapes_into_every_ancestor_cgroup_under_the_default_policy: EscapeIntoAncestorCgroups, false;
    escapes_into_every_ancestor_cgroup_under_a_narrow_policy: EscapeIntoAncestorCgroups, true;
    raises_its_own_limits_under_the_default_policy: RaiseItsOwnLimits, false;
    raises_its_own_limits_under_a_narrow_policy: RaiseItsOwnLimits, true;
    kills_a_siblings_group_under_the_default_policy: KillASiblingsGroup, false;
    kills_a_siblings_group_under_a_narrow_policy: KillASiblingsGroup, true;
    writes_and_truncates_the_store_under_the_default_policy: WriteAndTruncateTheStore, false;
    writes_and_truncates_the_store_under_a_narrow_policy: WriteAndTruncateTheStore, true;
    writes_and_truncates_a_store_outside_the_root_under_the_default_policy: WriteAndTruncateAStoreOutsideTheRoot, false;
    writes_and_truncates_a_store_outside_the_root_under_a_narrow_policy: WriteAndTruncateAStoreOutsideTheRoot, true;
    acts_as_the_operator_on_the_control_socket_under_the_default_policy: ActAsTheOperator, false;
    acts_as_the_operator_on_the_control_socket_under_a_narrow_policy: ActAsTheOperator, true;
    traces_and_signals_the_keeper_and_supervisor_under_the_default_policy: TraceAndSignalTheKeeperAndSupervisor, false;
    traces_and_signals_the_keeper_and_supervisor_under_a_narrow_policy: TraceAndSignalTheKeeperAndSupervisor, true;
}

/// A policy that names brood's machinery is refused with its own code, not
/// silently narrowed: a cgroup hierarchy, the store, `$BROOD_ROOT` itself, and
/// a plain bind of a directory above the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_naming_brood_machinery_is_refused_with_reserved_path() {
    let env = start(GRACE);
    let root = env.root().to_path_buf();
    let cg = hierarchies().into_iter().next().unwrap();
    let marks = brood_launch::cgroup::detect(Path::new("/"))
        .unwrap()
        .marks
        .expect("root has a place for liveness marks");
    let cases: Vec<(Value, String)> = vec![
        (
            json!({"files": [{"path": marks.join("x").display().to_string(), "mode": "rw"}]}),
            "liveness marks".into(),
        ),
        (
            json!({"files": [{"path": cg.display().to_string(), "mode": "rw"}]}),
            "cgroup hierarchy".into(),
        ),
        (
            json!({"files": [{"path": root.join("brood.db").display().to_string(), "mode": "ro"}]}),
            "brood.db".into(),
        ),
        (
            json!({"files": [{"path": root.display().to_string(), "mode": "rw"}]}),
            "brood's root".into(),
        ),
        (
            json!({"mounts": [format!("{}\t/x\tro\tbind", root.parent().unwrap().display())]}),
            "plain bind".into(),
        ),
    ];
    for (i, (policy, says)) in cases.into_iter().enumerate() {
        let mut r = req(&format!("r{i}"), agent(&["--result", "x"]));
        r.policy = Some(policy.clone());
        let e = env.sup.spawn(me(), r).await.unwrap_err();
        assert_eq!(e.code, brood_core::Code::ReservedPath, "{policy}: {e}");
        assert!(e.message.contains(&says), "{policy}: {e}");
        assert!(
            env.sup.view().show(&name(&format!("r{i}"))).is_err(),
            "nothing is left"
        );
    }
    // Naming ctx/ stays allowed (it is the ABI agents read).
    let mut ok = req("reads-ctx", agent(&["--result", "x"]));
    ok.policy = Some(json!({"files": [
        {"path": "/", "mode": "rw"},
        {"path": root.join("ctx").display().to_string(), "mode": "ro"}]}));
    env.sup
        .spawn(me(), ok)
        .await
        .expect("a rule on ctx/ is fine");

    // Granted all of `/`, an agent still cannot reach the supervisors'
    // liveness marks: one that could remake a live supervisor's mark would
    // have it taken for dead (and `brood doctor --fix` kill its agents).
    let mark = marks
        .join(brood_runtime::paths::instance_key(&root))
        .join(format!(
            "{}.lock",
            brood_runtime::supervisor::supervisor_id(std::process::id() as i32).unwrap()
        ));
    assert!(mark.exists(), "{}", mark.display());
    let (m, forged) = (mark.display().to_string(), marks.join("s1-1.lock"));
    let f = forged.display().to_string();
    let mut r = req(
        "marks",
        agent(&[
            "--probe-read",
            &m,
            "--probe-write",
            &f,
            "--result",
            "probed",
        ]),
    );
    r.policy = Some(json!({"files": [{"path": "/", "mode": "rw"}]}));
    r.await_ready = false;
    env.sup.spawn(me(), r).await.expect("spawn");
    let w = env
        .sup
        .wait(me(), vec![name("marks")], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let a = serde_json::to_value(&w).unwrap()["agents"][0].clone();
    let result = a["result"].as_str().unwrap_or_default().to_owned();
    assert_eq!(a["status"], "completed", "{a}");
    assert!(
        result.contains(&format!("read {m}: error: No such file")),
        "{result}"
    );
    assert!(
        result.contains(&format!("write {f}: ")) && !result.contains(&format!("write {f}: ok")),
        "{result}"
    );
    assert!(!forged.exists());
}

/// The way around a covered `/sys/fs/cgroup` that a process without
/// capabilities still has: a user, mount and cgroup namespace of its own, and
/// the hierarchy mounted there rooted at its own group, whose limit it could
/// then raise. Every landlocked process is refused mount(2) outright, whatever
/// namespace it is in, so each attempt is `denied`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cannot_remount_its_cgroups_in_a_user_namespace_to_raise_its_limits() {
    let env = start(GRACE);
    let mut flags = vec![];
    for c in ["memory", "pids", "unified"] {
        flags.extend(["--probe-cgroup-remount", c]);
    }
    flags.extend(["--result", "tried"]);
    let mut r = req("remounter", agent(&flags));
    r.policy = Some(json!({"resources": {"pids_max": 64, "memory_max": 268435456}}));
    r.await_ready = false;
    env.sup.spawn(me(), r).await.expect("spawn");
    let w = env
        .sup
        .wait(me(), vec![name("remounter")], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let w = serde_json::to_value(&w).unwrap();
    let result = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for c in ["memory", "pids", "unified"] {
        let l = result
            .lines()
            .find(|l| l.starts_with(&format!("cgroup-remount {c}:")))
            .unwrap_or_else(|| panic!("no probe line for {c} in {result:?}"));
        assert_eq!(l, format!("cgroup-remount {c}: denied"), "{result}");
    }
}
