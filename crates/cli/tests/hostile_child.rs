//! A child that tries to break containment (issue 11 items 1 and 5): with the
//! operator's default policy (`/ rw`, every tool) and with a narrow one, a
//! child and a `setsid`'d grandchild each try, from a shell, to
//!
//! * move into every ancestor's and the root's cgroup on every hierarchy (v2
//!   and each v1 controller),
//! * raise their own limits (`memory.limit_in_bytes`, `pids.max`),
//! * kill a sibling's group (`cgroup.kill`, and `cgroup.procs` of its own into
//!   the sibling's),
//! * append to and truncate the store and its WAL, and take the sweeper lock,
//! * act as the operator through the control socket (cancel a sibling),
//! * ptrace (through `/proc/1/environ`, `/proc/1/root`) and signal the keeper
//!   (PID 1 of their namespace) and the supervisor.
//!
//! Every attempt must fail. Then, checked from outside: every process is still
//! in its group on every hierarchy, the limits and the sibling are untouched,
//! the store passes `PRAGMA integrity_check`, the whole tree dies with its
//! parent (SIGKILLed) within grace + 1 s, and the supervisor goes on serving.

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
  if "$@" 2>/dev/null; then echo "WROTE $n" >> "$out"; else echo "refused $n" >> "$out"; fi
}
while read -r mode path value; do
  [ "$value" = SELF ] && value=$$
  case $mode in
    write) try "$mode $path" sh -c 'printf "%s\n" "$1" > "$2"' _ "$value" "$path" ;;
    append) try "$mode $path" sh -c 'printf "%s\n" "$1" >> "$2"' _ "$value" "$path" ;;
    truncate) try "$mode $path" sh -c ': > "$1"' _ "$path" ;;
  esac
done < "$DIR/targets"
try "flock $LOCK" sh -c 'exec 9>>"$1" && flock -n 9' _ "$LOCK"
try "read /proc/1/environ" sh -c 'cat /proc/1/environ > /dev/null'
try "list /proc/1/root" sh -c 'ls /proc/1/root/ > /dev/null'
try "signal the supervisor $SUP" kill -TERM "$SUP"
try "cancel the sibling as the operator" brood --root "$BROOD_ROOT_DIR" cancel sib
kill -KILL 1 2>/dev/null
echo "done" >> "$out"
# The grandchild stays, so its parent's death has something to kill.
[ "$role" = grand ] && exec sleep 1000
"#;

/// The child: start the grandchild in a session of its own, try everything
/// itself, then stay (its parent's death must end it).
fn child_argv() -> Vec<String> {
    let launcher = "setsid sh -c \"$BODY\" grand grand </dev/null >/dev/null 2>&1 &\n\
         echo $! > \"$DIR/grand.pid\"\n\
         sh -c \"$BODY\" child child\n\
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

/// Every cgroup hierarchy's directory as this process sees it.
fn hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for l in text.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let fstype = right.split(' ').next().unwrap_or("");
        if fstype == "cgroup" || fstype == "cgroup2" {
            out.push(PathBuf::from(left.split(' ').nth(4).unwrap()));
        }
    }
    assert!(!out.is_empty(), "this host mounts no cgroup hierarchy");
    out
}

/// A v2 group's path relative to its hierarchy, and the same relative path
/// in every hierarchy where it exists (the v1 mirrors of a hybrid host).
fn mirrors(v2_group: &Path) -> Vec<PathBuf> {
    let hs = hierarchies();
    let v2 = hs
        .iter()
        .find(|h| v2_group.starts_with(h))
        .expect("the group lies in a hierarchy");
    let rel = v2_group.strip_prefix(v2).unwrap();
    hs.iter()
        .map(|h| h.join(rel))
        .filter(|p| p.is_dir())
        .collect()
}

struct Case {
    narrow: bool,
}

async fn tries_everything(case: Case) {
    let env = start(GRACE);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = env.root().to_path_buf();
    // A child's env is a subset of its parent's (SPEC 5): p passes it down.
    let vars: Vec<(String, String)> = vec![
        ("DIR".into(), d.display().to_string()),
        ("BODY".into(), SCRIPT.into()),
        ("SUP".into(), std::process::id().to_string()),
        (
            "LOCK".into(),
            root.join("brood.db.sweeper.lock").display().to_string(),
        ),
        ("BROOD_ROOT_DIR".into(), root.display().to_string()),
    ];
    let mut p = req("p", agent(&["--hang"]));
    p.env = vars.clone();
    env.sup.spawn(me(), p).await.expect("spawn p");
    let mut sib = req("sib", agent(&["--hang"]));
    sib.parent = Some(name("p"));
    env.sup.spawn(me(), sib).await.expect("spawn sib");
    let p_group = PathBuf::from(show(&env, "p")["cgroup"].as_str().unwrap());
    let sib_group = PathBuf::from(show(&env, "sib")["cgroup"].as_str().unwrap());

    // The targets: cgroup.procs of every hierarchy's root and of every
    // ancestor of the child's group (the child's own is p_group/r1.c), the
    // sibling's kill switch and its procs, its own limits, the store.
    let mut t = String::new();
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
    for g in mirrors(&sib_group) {
        writeln!(t, "write {} 1", g.join("cgroup.kill").display()).unwrap();
        writeln!(t, "write {} SELF", g.join("cgroup.procs").display()).unwrap();
        writeln!(t, "write {} 1", g.join("cgroup.freeze").display()).unwrap();
    }
    let own_group = p_group.join("r1.c");
    let own_v1: Vec<PathBuf> = hierarchies()
        .iter()
        .filter_map(|h| {
            let v2 = hierarchies().into_iter().find(|x| p_group.starts_with(x))?;
            Some(h.join(own_group.strip_prefix(v2).ok()?))
        })
        .collect();
    for g in &own_v1 {
        writeln!(
            t,
            "write {} 9223372036854771712",
            g.join("memory.limit_in_bytes").display()
        )
        .unwrap();
        writeln!(t, "write {} max", g.join("pids.max").display()).unwrap();
        writeln!(t, "write {} max", g.join("memory.max").display()).unwrap();
    }
    for f in ["brood.db", "brood.db-wal", "brood.db-shm"] {
        writeln!(t, "append {} garbage", root.join(f).display()).unwrap();
        writeln!(t, "truncate {} -", root.join(f).display()).unwrap();
    }
    writeln!(t, "write {} garbage", root.join("config.toml").display()).unwrap();
    std::fs::write(d.join("targets"), &t).unwrap();

    let mut c = req("c", child_argv());
    c.parent = Some(name("p"));
    c.protocol = brood_store::Protocol::Exec;
    c.await_ready = false;
    c.env = vars;
    if case.narrow {
        c.policy = Some(json!({
            "tools": ["shell"],
            "files": [{"path": "/", "mode": "ro"}, {"path": d.display().to_string(), "mode": "rw"}],
            "resources": {"pids_max": 64, "memory_max": 268435456},
        }));
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
        // Every target plus the five other attempts, plus `done`.
        assert_eq!(out.len(), targets + 6, "{role}: {out:?}");
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
    if case.narrow {
        // Its limits are as the policy set them, on every v1 mirror.
        for g in mirrors(&c_group) {
            if let Ok(v) = std::fs::read_to_string(g.join("pids.max")) {
                assert_eq!(v.trim(), "64", "{}", g.display());
            }
            if let Ok(v) = std::fs::read_to_string(g.join("memory.limit_in_bytes")) {
                assert_eq!(v.trim(), "268435456", "{}", g.display());
            }
        }
    }
    assert_eq!(show(&env, "sib")["status"], "running");
    let db = rusqlite::Connection::open(root.join("brood.db")).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_under_the_default_policy_cannot_escape_its_cgroup_or_touch_the_store() {
    tries_everything(Case { narrow: false }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_under_a_narrow_policy_cannot_escape_its_cgroup_or_touch_the_store() {
    tries_everything(Case { narrow: true }).await;
}

/// A policy that names brood's machinery is refused with its own code, not
/// silently narrowed: a cgroup hierarchy, the store, `$BROOD_ROOT` itself, and
/// a plain bind of a directory above the root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_naming_brood_machinery_is_refused_with_reserved_path() {
    let env = start(GRACE);
    let root = env.root().to_path_buf();
    let cg = hierarchies().into_iter().next().unwrap();
    let cases: Vec<(Value, String)> = vec![
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
