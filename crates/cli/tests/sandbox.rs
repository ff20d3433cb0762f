//! Proof from inside the sandbox (issue 3 item 6): the test agent probes what it
//! can actually do under its policy, with real landlock, real cgroup limits and
//! real processes, and reports; these tests read the reports.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

async fn run_probe(env: &Env, name_: &str, policy: Value, flags: &[&str]) -> Value {
    let mut r = req(name_, agent(flags));
    r.policy = Some(policy);
    r.await_ready = false;
    env.sup.spawn(me(), r).await.expect("spawn");
    let w = env
        .sup
        .wait(me(), vec![name(name_)], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let w = serde_json::to_value(&w).unwrap();
    w["agents"][0].clone()
}

fn line<'a>(result: &'a str, prefix: &str) -> &'a str {
    result
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in {result:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_exec_and_symlinks_are_enforced_by_the_kernel() {
    let env = start(Duration::from_millis(500));
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::create_dir_all(p.join("hidden")).unwrap();
    std::fs::create_dir_all(p.join("ro")).unwrap();
    std::fs::create_dir_all(p.join("rw")).unwrap();
    std::fs::write(p.join("hidden/secret.txt"), "secret").unwrap();
    std::fs::write(p.join("ro/file.txt"), "readable").unwrap();
    // A symlink planted in a writable directory, pointing at a hidden file.
    std::os::unix::fs::symlink(p.join("hidden/secret.txt"), p.join("rw/link")).unwrap();
    let s = |x: &str| p.join(x).to_string_lossy().into_owned();
    let policy = json!({
        "tools": ["file_read"],
        "files": [
            {"path": "/", "mode": "ro"},
            {"path": s("hidden"), "mode": "hidden"},
            {"path": s("ro"), "mode": "ro"},
            {"path": s("rw"), "mode": "rw"},
        ],
        "network": "none",
    });
    let (hidden, rofile, ronew, rwnew, link) = (
        s("hidden/secret.txt"),
        s("ro/file.txt"),
        s("ro/new"),
        s("rw/new"),
        s("rw/link"),
    );
    let a = run_probe(
        &env,
        "prober",
        policy,
        &[
            "--probe-read",
            &hidden,
            "--probe-read",
            &rofile,
            "--probe-write",
            &ronew,
            "--probe-write",
            &rwnew,
            "--probe-read",
            &link,
            "--probe-exec",
            "/bin/sh",
            "--probe-caps",
            "--result",
            "probed",
        ],
    )
    .await;
    assert_eq!(a["status"], "completed", "{a}");
    let r = a["result"].as_str().unwrap();
    assert_eq!(
        line(r, &format!("read {hidden}")),
        format!("read {hidden}: denied"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("read {rofile}")),
        format!("read {rofile}: ok"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("write {ronew}")),
        format!("write {ronew}: denied"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("write {rwnew}")),
        format!("write {rwnew}: ok"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("read {link}")),
        format!("read {link}: denied"),
        "{r}"
    );
    assert_eq!(
        line(r, "exec /bin/sh"),
        "exec /bin/sh: denied",
        "without shell only its own program runs: {r}"
    );
    let caps = line(r, "caps:");
    assert!(
        caps.contains("CapEff=0000000000000000") && caps.contains("NoNewPrivs=1"),
        "{caps}"
    );
    assert!(p.join("rw/new").exists() && !p.join("ro/new").exists());
    env.sup.flush().await;
    let meta: Value = serde_json::from_str(&read(
        env.sup.paths().agent_dir(&name("prober")).join("meta.json"),
    ))
    .unwrap();
    assert_eq!(meta["sandbox"]["files"], true, "{meta}");
    assert_eq!(meta["sandbox"]["capabilities_dropped"], true, "{meta}");

    // With `shell`, other programs run.
    let a = run_probe(
        &env,
        "sheller",
        json!({"tools": ["shell"], "files": [{"path": "/", "mode": "ro"}]}),
        &["--probe-exec", "/bin/sh"],
    )
    .await;
    assert_eq!(
        line(a["result"].as_str().unwrap(), "exec /bin/sh"),
        "exec /bin/sh: ok",
        "{a}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_and_one_port() {
    let env = start(Duration::from_millis(500));
    let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
    let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
    let (p1, p2) = (
        l1.local_addr().unwrap().port().to_string(),
        l2.local_addr().unwrap().port().to_string(),
    );
    let a = run_probe(
        &env,
        "offline",
        json!({"network": "none"}),
        &["--probe-connect", &p1],
    )
    .await;
    assert_eq!(
        line(a["result"].as_str().unwrap(), "connect"),
        format!("connect {p1}: denied"),
        "{a}"
    );
    let port: u16 = p1.parse().unwrap();
    let a = run_probe(
        &env,
        "one-port",
        json!({"network": {"connect": [port]}}),
        &["--probe-connect", &p1, "--probe-connect", &p2],
    )
    .await;
    let r = a["result"].as_str().unwrap();
    assert_eq!(
        line(r, &format!("connect {p1}")),
        format!("connect {p1}: ok"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("connect {p2}")),
        format!("connect {p2}: denied"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_stop_a_fork_bomb_and_a_memory_hog_while_siblings_go_on() {
    let env = start(Duration::from_millis(500));
    let sibling = json!({"name": "sibling", "argv": agent(&["--sleep-ms", "1500", "--result", "still fine"])}).to_string();
    let bomb = json!({"name": "bomb", "argv": agent(&["--fork-bomb", "200", "--result", "survived"]), "policy": {"resources": {"pids_max": 12}}}).to_string();
    let hog = json!({"name": "hog", "argv": agent(&["--memory-hog", "512"]), "policy": {"resources": {"memory_max": "64M"}}}).to_string();
    env.sup
        .spawn(
            me(),
            req(
                "family",
                agent(&[
                    "--spawn",
                    &sibling,
                    "--spawn",
                    &bomb,
                    "--spawn",
                    &hog,
                    "--wait",
                    "--result",
                    "family done",
                ]),
            ),
        )
        .await
        .unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("family")], Some(Duration::from_secs(60)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let b = show(&env, "bomb");
    let r = b["result"].as_str().unwrap_or("");
    let stopped = line(r, "fork-bomb:");
    assert!(
        stopped.starts_with("fork-bomb: stopped at "),
        "pids_max stopped the bomb: {stopped}"
    );
    let k: usize = stopped["fork-bomb: stopped at ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(k < 12, "at most pids_max processes: {k}");
    let h = show(&env, "hog");
    assert_eq!(h["status"], "failed", "{h}");
    assert!(
        h["detail"].as_str().unwrap_or("").contains("OOM"),
        "the reason names the limit: {h}"
    );
    assert_eq!(show(&env, "sibling")["result"], "still fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iso_ns_gives_a_private_mount_table_from_the_policy() {
    let env = start(Duration::from_millis(500));
    let d = tempfile::tempdir().unwrap();
    let (work, refd) = (d.path().join("work"), d.path().join("ref"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&refd).unwrap();
    let exe_dir = exe_dir();
    let (w, r) = (
        work.to_string_lossy().into_owned(),
        refd.to_string_lossy().into_owned(),
    );
    let mut mounts = system_mounts();
    mounts.push(format!("{w}\t/wdir\trw\tbind,nosuid,nodev"));
    mounts.push(format!("{r}\t/ref\tro\tbind,nosuid,nodev,noexec"));
    // File rules name host paths: landlock binds them to inodes before the agent
    // enters its namespace, so they follow the mounts.
    let policy = json!({
        "files": [{"path": w, "mode": "rw"}, {"path": r, "mode": "ro"}, {"path": exe_dir, "mode": "ro"}],
        "mounts": mounts,
        "network": "none",
    });
    let mut q = req(
        "isolated",
        agent(&[
            "--probe-write",
            "/wdir/x",
            "--probe-write",
            "/ref/y",
            "--probe-read",
            "/etc/hostname",
            "--result",
            "inside",
        ]),
    );
    q.policy = Some(policy);
    q.iso = brood_core::Iso::Ns;
    q.await_ready = false;
    env.sup.spawn(me(), q).await.expect("spawn");
    let wres = env
        .sup
        .wait(me(), vec![name("isolated")], Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let wres = serde_json::to_value(&wres).unwrap();
    let a = &wres["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    let res = a["result"].as_str().unwrap();
    assert_eq!(line(res, "write /wdir/x"), "write /wdir/x: ok", "{res}");
    assert!(
        work.join("x").exists(),
        "the write landed in the mount's source"
    );
    assert_ne!(line(res, "write /ref/y"), "write /ref/y: ok", "{res}");
    assert!(!refd.join("y").exists());
    assert_ne!(
        line(res, "read /etc/hostname"),
        "read /etc/hostname: ok",
        "the host's files are not there: {res}"
    );
    assert_eq!(show(&env, "isolated")["life"], "owned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_limit_binds_its_children() {
    let env = start(Duration::from_millis(500));
    let kid =
        json!({"name": "kid", "argv": agent(&["--fork-bomb", "100", "--result", "kid done"])})
            .to_string();
    let mut r = req(
        "limited",
        agent(&["--spawn", &kid, "--wait", "--result", "parent done"]),
    );
    r.policy = Some(json!({"resources": {"pids_max": 10}}));
    r.await_ready = false;
    env.sup.spawn(me(), r).await.unwrap();
    let w = env
        .sup
        .wait(me(), vec![name("limited")], Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    let k = show(&env, "kid");
    assert_eq!(
        k["policy"]["resources"]["pids_max"], 10,
        "the child inherits the limit: {k}"
    );
    let stopped = line(k["result"].as_str().unwrap_or(""), "fork-bomb:").to_owned();
    let n: usize = stopped["fork-bomb: stopped at ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Parent and child share the parent's 10 pids (the child's own limit is 10 too).
    assert!(n < 10, "{stopped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_root_becomes_the_agents_slash() {
    let env = start(Duration::from_millis(500));
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("rootfs");
    let exe_dir = std::path::Path::new(exe())
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut mounts = Vec::new();
    for p in ["/usr", "/lib", "/lib64", "/bin"] {
        if std::path::Path::new(p).exists() {
            std::fs::create_dir_all(root.join(p.trim_start_matches('/'))).unwrap();
            mounts.push(format!("{p}\t{p}\tro\tbind,nosuid,nodev"));
        }
    }
    std::fs::create_dir_all(root.join(exe_dir.trim_start_matches('/'))).unwrap();
    mounts.push(format!("{exe_dir}\t{exe_dir}\tro\tbind,nosuid,nodev"));
    std::fs::write(root.join("marker"), "inside the named root").unwrap();
    let r = root.to_string_lossy().into_owned();
    let policy = json!({"files": [{"path": r, "mode": "ro"}, {"path": exe_dir, "mode": "ro"}], "mounts": mounts});
    let mut q = req(
        "rooted",
        agent(&["--probe-read", "/marker", "--result", "inside"]),
    );
    q.policy = Some(policy.clone());
    q.iso = brood_core::Iso::Ns;
    q.root = Some(r.clone());
    q.await_ready = false;
    env.sup.spawn(me(), q).await.expect("spawn");
    let w = env
        .sup
        .wait(me(), vec![name("rooted")], Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let w = serde_json::to_value(&w).unwrap();
    let a = &w["agents"][0];
    assert_eq!(a["status"], "completed", "{a}");
    assert_eq!(
        line(a["result"].as_str().unwrap(), "read /marker"),
        "read /marker: ok",
        "{a}"
    );
    // A root the policy hides is refused before anything starts (its
    // program mounted, so the door finds it and admission decides).
    let args = json!({"name": "hidden-root", "argv": agent(&[]), "iso": "ns", "root": r,
        "policy": {"files": [{"path": "/", "mode": "ro"}, {"path": r, "mode": "hidden"}],
                   "mounts": mounts}});
    let e = brood_runtime::supervisor::handle(&env.sup, &me(), "spawn", &args)
        .await
        .unwrap_err();
    assert_eq!(e.code, brood_core::Code::FileExpansion, "{e}");
}

/// SPEC 3: a program inside a sandbox sees its own object read-only and can
/// write no control file: a policy asking `rw` on the agent objects gets `ro`,
/// and one hiding the ctx tree still lets the agent read its own object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reads_its_own_object_and_writes_no_control_file() {
    let env = start(Duration::from_millis(500));
    env.sup
        .spawn(me(), req("other", agent(&["--hang"])))
        .await
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let free = d.path().join("free").to_string_lossy().into_owned();
    let s = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
    let objects = s(env.sup.paths().ctx().join("agent"));
    let own = env.sup.paths().agent_dir(&name("selfish"));
    let other = env.sup.paths().agent_dir(&name("other"));
    // Its own `policy` is written by the launch itself, before the agent runs;
    // the other control files come from the projection thread, which a fast
    // agent may outrun.
    let own_policy = s(own.join("policy"));
    let (own_status, own_new, other_status) = (
        s(own.join("status")),
        s(own.join("planted")),
        s(other.join("status")),
    );
    let policy = json!({"files": [
        {"path": "/", "mode": "ro"},
        {"path": s(d.path().to_path_buf()), "mode": "rw"},
        {"path": objects, "mode": "rw"},
    ]});
    let a = run_probe(
        &env,
        "selfish",
        policy,
        &[
            "--probe-read",
            &own_policy,
            "--probe-write",
            &own_status,
            "--probe-write",
            &own_new,
            "--probe-write",
            &other_status,
            "--probe-write",
            &free,
            "--result",
            "probed",
        ],
    )
    .await;
    assert_eq!(a["status"], "completed", "{a}");
    let r = a["result"].as_str().unwrap();
    // Its grants reach the ctx tree, so it sees its own view of it (issue
    // 24): its object bound read-only, no other agent's there at all.
    const ROFS: &str = "error: Read-only file system (os error 30)";
    for (what, want) in [
        (format!("read {own_policy}"), "ok"),
        (format!("write {own_new}"), ROFS),
        (
            format!("write {other_status}"),
            "error: No such file or directory (os error 2)",
        ),
        (format!("write {free}"), "ok"),
    ] {
        assert_eq!(line(r, &what), format!("{what}: {want}"), "{r}");
    }
    // Its status file comes from the projection thread, which a fast agent
    // may outrun: landlock refuses the write when the file is there, the
    // read-only view when it is not yet.
    let status = line(r, &format!("write {own_status}"));
    assert!(
        status.ends_with(": denied") || status.ends_with(ROFS),
        "{status}"
    );
    assert!(!own.join("planted").exists());
    // The ctx tree hidden: its own object is still readable, another's not.
    let hid = env.sup.paths().agent_dir(&name("hider"));
    // `policy` is written by the launch itself, before the agent runs; the
    // other control files come from the projection thread, which a fast agent
    // may outrun.
    let hid_status = s(hid.join("policy"));
    let policy = json!({"files": [
        {"path": "/", "mode": "ro"},
        {"path": s(env.sup.paths().ctx()), "mode": "hidden"},
    ]});
    let a = run_probe(
        &env,
        "hider",
        policy,
        &[
            "--probe-read",
            &hid_status,
            "--probe-read",
            &other_status,
            "--result",
            "probed",
        ],
    )
    .await;
    let r = a["result"].as_str().unwrap();
    assert_eq!(
        line(r, &format!("read {hid_status}")),
        format!("read {hid_status}: ok"),
        "{r}"
    );
    assert_eq!(
        line(r, &format!("read {other_status}")),
        format!("read {other_status}: denied"),
        "{r}"
    );
    env.sup.cancel(me(), name("other")).await.unwrap();
}
