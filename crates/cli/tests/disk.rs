//! Disk is a resource (issue 24 item 6, attack 8's second half): a child
//! cannot fill the host's disk through its writable paths or its channel.
//! Each test is the attack, performed by a real agent under a real
//! supervisor:
//!
//! - a child writes past its `disk_max` into a file of a writable path, by
//!   itself and through a shell it starts: the kernel stops the file at the
//!   limit (`EFBIG`, or `SIGXFSZ`, which the supervisor names), and the
//!   child cannot raise the limit back;
//! - a child writes many files into a writable path, each under the limit,
//!   together past it, by itself and through orphans that exit without
//!   being reaped: the sweeper stops it `failed` naming `resources.disk_max`
//!   (the kernel's per-process write accounting); the ways around that
//!   accounting (`fallocate`, clearing the child subreaper) are refused;
//! - a child writes many files into its `artifact/`, each under the limit,
//!   together past it: the sweeper stops it `failed` naming
//!   `resources.disk_max`, and nothing of what it wrote stays;
//! - a child hands back artifacts that collection refuses (over its
//!   `disk_max`, a FIFO): no byte of them stays in its channel or in the
//!   blob store, after the run, after `close` and after `brood fsck`, which
//!   also removes leftovers of runs whose result was never recorded;
//! - a child asks for more disk than its parent holds: refused with the
//!   resources' code, naming the field; the platform's default applies to a
//!   root that sets none and binds its children, and comes from the
//!   configuration file the `brood` command reads.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use brood_core::Code;
use common::*;
use serde_json::{Value, json};

const GRACE: Duration = Duration::from_millis(500);
const MIB: u64 = 1 << 20;

/// The channel `p` -> `child` on disk.
fn channel(env: &Env, child: &str) -> PathBuf {
    session_dir(env, "p").join("context/child").join(child)
}

/// Every entry below `dir` (relative paths), directories included.
fn entries(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Some(rd) = unless_gone(std::fs::read_dir(&d), &d) else {
            continue;
        };
        for e in rd {
            let e = e.unwrap();
            out.push(
                e.path()
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every file of the blob store, temp files included.
fn blob_files(env: &Env) -> Vec<String> {
    entries(&env.sup.paths().blobs().join("sha256"))
}

/// `sh -c SCRIPT` then the test agent with `flags` (`exec "$@"`).
fn shell_then_agent(script: &str, flags: &[&str]) -> Vec<String> {
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!("{script}\nexec \"$@\""),
        "sh".to_owned(),
    ];
    argv.extend(agent(flags));
    argv
}

async fn spawn_child(
    env: &Env,
    n: &str,
    argv: Vec<String>,
    policy: Option<Value>,
    vars: &[(&str, &str)],
) {
    let mut c = req(n, argv);
    c.parent = Some(name("p"));
    c.policy = policy;
    c.env = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.sup
        .spawn(me(), c)
        .await
        .unwrap_or_else(|e| panic!("spawn {n}: {e}"));
}

async fn wait_for(env: &Env, n: &str) -> Value {
    let w = env
        .sup
        .wait(me(), vec![name(n)], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], false, "{n} never ended: {w}");
    show(env, n)
}

/// The root `p`, hanging, passing `DIR` to its children when given.
async fn parent(env: &Env, policy: Option<Value>, dir: Option<&str>) {
    let mut p = req("p", agent(&["--hang"]));
    p.policy = policy;
    p.env = dir
        .map(|d| ("DIR".to_owned(), d.to_owned()))
        .into_iter()
        .collect();
    env.sup.spawn(me(), p).await.expect("spawn p");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_past_disk_max_in_a_writable_path_stops_at_the_limit() {
    // No sweeper: this is the kernel's per-file limit alone (the two files
    // together are past the write budget, which the next test is about).
    let env = start_with(GRACE, |cfg| cfg.sweep_every = None);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    parent(&env, None, Some(&d)).await;
    let policy = json!({
        "files": [{"path": "/", "mode": "ro"}, {"path": d, "mode": "rw"}],
        "resources": {"disk_max": "1M"},
    });
    // The agent itself, with SIGXFSZ ignored, and a shell it starts, which
    // then tries to raise the limit back.
    let by_agent = format!("{d}/by-agent");
    let script = r#"(head -c 3145728 /dev/zero > "$DIR/by-shell"); echo "shell: $?" > "$DIR/shell.txt"
        if ulimit -f unlimited 2>/dev/null; then echo raised; else echo "raise refused"; fi >> "$DIR/shell.txt"
        ulimit -f >> "$DIR/shell.txt""#;
    let argv = shell_then_agent(
        script,
        &[
            "--write-bytes",
            &format!("{by_agent}=3145728"),
            "--result",
            "wrote",
        ],
    );
    spawn_child(&env, "c", argv, Some(policy.clone()), &[("DIR", &d)]).await;
    let v = wait_for(&env, "c").await;
    assert_eq!(v["status"], "completed", "{v}");
    let result = v["result"].as_str().unwrap_or_default();
    assert!(
        result.contains(&format!(
            "write-bytes {by_agent}: stopped at 1048576 bytes: File too large (os error 27)"
        )),
        "{result}"
    );
    let shell = read(dir.path().join("shell.txt"));
    assert_eq!(
        shell.lines().collect::<Vec<_>>(),
        // 128 + SIGXFSZ (25); `ulimit -f` counts 512-byte blocks.
        ["shell: 153", "raise refused", "2048"],
        "{shell}"
    );
    for f in ["by-agent", "by-shell"] {
        assert_eq!(
            std::fs::metadata(dir.path().join(f)).unwrap().len(),
            MIB,
            "{f} grew past the limit"
        );
    }

    // An agent the signal kills: its end names the limit.
    let mut k = req(
        "k",
        vec![
            "sh".into(),
            "-c".into(),
            r#"exec head -c 3145728 /dev/zero > "$DIR/killed""#.into(),
        ],
    );
    k.parent = Some(name("p"));
    k.policy = Some(policy);
    k.protocol = brood_store::Protocol::Exec;
    k.env = vec![("DIR".into(), d.clone())];
    env.sup.spawn(me(), k).await.expect("spawn k");
    let v = wait_for(&env, "k").await;
    assert_eq!(v["status"], "failed", "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("killed by SIGXFSZ") && detail.contains("disk_max (1048576 bytes)"),
        "{v}"
    );
    assert_eq!(
        std::fs::metadata(dir.path().join("killed")).unwrap().len(),
        MIB
    );
    env.sup.cancel(me(), name("p")).await.unwrap();
}

/// A directory on the disk beside the build: /tmp may be a tmpfs, whose
/// writes are memory (bounded by `memory_max`), not disk.
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Runs `script` (then the test agent, hanging) as `c` under `p` with a 1 MiB
/// `disk_max` and `rw` on `d`, and returns its record once it has ended.
async fn writer(env: &Env, d: &str, script: &str) -> Value {
    parent(env, None, Some(d)).await;
    let policy = json!({
        "files": [{"path": "/", "mode": "ro"}, {"path": d, "mode": "rw"}],
        "resources": {"disk_max": "1M"},
    });
    let argv = shell_then_agent(script, &["--hang"]);
    spawn_child(env, "c", argv, Some(policy), &[("DIR", d)]).await;
    wait_for(env, "c").await
}

fn assert_stopped_for_writing(v: &Value) {
    assert_eq!(
        (v["status"].as_str(), v["reason"].as_str()),
        (Some("failed"), Some("budget_exceeded")),
        "{v}"
    );
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("bytes to disk, past resources.disk_max (1048576 bytes)"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_files_in_a_writable_path_past_disk_max_stop_the_child() {
    let env = start(GRACE);
    let dir = disk_dir();
    let d = dir.path().display().to_string();
    // Four files of 600 KiB, each under the limit, 2.4 MiB together.
    let script = r#"for i in 1 2 3 4; do head -c 614400 /dev/urandom > "$DIR/f$i" || exit 9; done"#;
    let v = writer(&env, &d, script).await;
    assert_stopped_for_writing(&v);
    // Its parent goes on.
    assert_eq!(show(&env, "p")["status"], "running");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_by_orphans_that_exit_unreaped_still_count() {
    let env = start(GRACE);
    let dir = disk_dir();
    let d = dir.path().display().to_string();
    // Each writer is orphaned at once (its subshell exits) and exits after
    // 600 KiB; the agent that execs next never reaps it. Reaped by the
    // namespace's init, its writes would be nobody's.
    let script = r#"for i in 1 2 3 4; do ( head -c 614400 /dev/urandom > "$DIR/o$i" & ); done
        while [ "$(ls "$DIR" | wc -l)" -lt 4 ]; do sleep 0.1; done; sleep 0.5"#;
    let v = writer(&env, &d, script).await;
    assert_stopped_for_writing(&v);
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ways_around_the_write_accounting_are_refused() {
    let env = start(GRACE);
    let dir = disk_dir();
    let d = dir.path().display().to_string();
    // 100 MiB reserved without a write (past RLIMIT_FSIZE too, with -n, keep
    // size), then the subreaper cleared so orphans go to the namespace's
    // init; then orphans write 2.4 MiB.
    let script = r#": > "$DIR/reserved"; fallocate -n -l 104857600 "$DIR/reserved" 2>> "$DIR/dodge.txt"; echo "fallocate: $?" >> "$DIR/dodge.txt"
        stat -c 'blocks: %b' "$DIR/reserved" >> "$DIR/dodge.txt"
        perl -e 'my $r = syscall(157, 36, 0, 0, 0, 0); print "clear subreaper: $r $!
"' >> "$DIR/dodge.txt"
        perl -e 'my $r = syscall(157, 36, 1, 0, 0, 0); print "set subreaper: $r
"' >> "$DIR/dodge.txt"
        for i in 1 2 3 4; do ( head -c 614400 /dev/urandom > "$DIR/o$i" & ); done
        while [ "$(ls "$DIR" | grep -c '^o')" -lt 4 ]; do sleep 0.1; done; sleep 0.5"#;
    let v = writer(&env, &d, script).await;
    let dodge = std::fs::read_to_string(dir.path().join("dodge.txt")).unwrap();
    // util-linux words EOPNOTSUPP its own way ("keep size mode is
    // unsupported" here); the call failed and reserved nothing.
    let lines: Vec<&str> = dodge.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("fallocate: fallocate failed: ")),
        "{dodge}"
    );
    assert_eq!(
        lines[1..],
        [
            "fallocate: 1",
            "blocks: 0",
            "clear subreaper: -1 Operation not supported",
            "set subreaper: 0",
        ],
        "{dodge}"
    );
    assert_stopped_for_writing(&v);
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_files_in_artifact_past_disk_max_stop_the_child_naming_the_limit() {
    let env = start(GRACE);
    parent(&env, None, None).await;
    // Eight files of 1 MiB, each within the 4 MiB limit, together past it.
    let script = r#"i=0; while [ $i -lt 8 ]; do head -c 1048576 /dev/urandom > "$BROOD_ARTIFACTS/f$i" || exit 9; i=$((i+1)); done"#;
    let argv = shell_then_agent(script, &["--hang"]);
    spawn_child(
        &env,
        "c",
        argv,
        Some(json!({"resources": {"disk_max": "4M"}})),
        &[],
    )
    .await;
    let v = wait_for(&env, "c").await;
    assert_eq!(
        (v["status"].as_str(), v["reason"].as_str()),
        (Some("failed"), Some("budget_exceeded")),
        "{v}"
    );
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("artifact/ takes more than resources.disk_max, 4194304 bytes"),
        "{detail}"
    );
    // What it wrote is gone by the time its end is recorded.
    assert_eq!(
        entries(&channel(&env, "c").join("artifact")),
        Vec::<String>::new()
    );
    assert!(stored_channel(&env, "c").artifacts.is_empty());
    assert_eq!(blob_files(&env), Vec::<String>::new());
    // Its parent goes on.
    assert_eq!(show(&env, "p")["status"], "running");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_result_leaves_no_bytes_behind_after_the_run_close_and_fsck() {
    // No sweeper: only the collection judges these results.
    let env = start_with(GRACE, |cfg| cfg.sweep_every = None);
    parent(&env, None, None).await;
    // Three artifacts of 400 KiB under a 1 MiB disk_max: the first two are
    // copied before the third is found over the limit.
    let over = agent(&[
        "--artifact-bytes",
        "a=409600",
        "--artifact-bytes",
        "b=409600",
        "--artifact-bytes",
        "c=409600",
        "--result",
        "three",
    ]);
    spawn_child(
        &env,
        "over",
        over,
        Some(json!({"resources": {"disk_max": "1M"}})),
        &[],
    )
    .await;
    // A FIFO as a ref, beside 300 KB of data.
    let fifo_ref = json!({"path": "artifact/fifo", "summary": "x", "hash": format!("sha256:{}", "0".repeat(64))});
    let fifo = shell_then_agent(
        r#"mkfifo "$BROOD_ARTIFACTS/fifo"; head -c 300000 /dev/urandom > "$BROOD_ARTIFACTS/data""#,
        &["--ref", &fifo_ref.to_string(), "--result", "a fifo"],
    );
    spawn_child(&env, "fifo", fifo, None, &[]).await;
    // The positive control: a result that is taken keeps its artifact.
    let fine = agent(&["--artifact", "ok.txt=kept", "--result", "fine"]);
    spawn_child(&env, "fine", fine, None, &[]).await;

    for (n, why) in [
        (
            "over",
            "the artifacts exceed resources.disk_max, 1048576 bytes (at artifact/c)",
        ),
        ("fifo", "refs.jsonl line 1: artifact/fifo: it is a FIFO"),
    ] {
        let v = wait_for(&env, n).await;
        assert_eq!(
            (v["status"].as_str(), v["reason"].as_str()),
            (Some("failed"), Some("protocol_error")),
            "{n}: {v}"
        );
        assert!(
            v["detail"].as_str().unwrap_or_default().contains(why),
            "{n}: {v}"
        );
    }
    assert_eq!(wait_for(&env, "fine").await["status"], "completed");
    let fine_blob = stored_channel(&env, "fine").artifacts[0].sha256.clone();
    let nothing_left = |when: &str| {
        for n in ["over", "fifo"] {
            assert_eq!(
                entries(&channel(&env, n).join("artifact")),
                Vec::<String>::new(),
                "{n}, {when}"
            );
            assert!(stored_channel(&env, n).artifacts.is_empty(), "{n}, {when}");
        }
        assert_eq!(blob_files(&env), std::slice::from_ref(&fine_blob), "{when}");
        assert_eq!(
            read(channel(&env, "fine").join("artifact/ok.txt")),
            "kept",
            "{when}"
        );
    };
    nothing_left("after the run");

    for n in ["over", "fifo", "fine"] {
        env.sup.close(me(), name(n)).await.unwrap();
    }
    nothing_left("after close");

    // What a supervisor that died mid-way would leave: bytes in a refused
    // child's artifact/ (a file, a directory of mode 000, a link) and a
    // blob half-written by a process that is gone.
    let art = channel(&env, "over").join("artifact");
    std::fs::write(art.join("leftover"), vec![7u8; 100_000]).unwrap();
    std::fs::create_dir(art.join("shut")).unwrap();
    std::fs::write(art.join("shut/inside"), "x").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep-me"), "mine").unwrap();
    std::os::unix::fs::symlink(outside.path(), art.join("link")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(art.join("shut"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let dead_temp = env.sup.paths().blobs().join("sha256/.in.999999999.half");
    std::fs::write(&dead_temp, vec![1u8; 4096]).unwrap();
    let o = brood(env.root(), &["fsck", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["leftovers_removed"], 4, "{report}");
    assert_eq!(report["blob_temps_removed"], 1, "{report}");
    nothing_left("after fsck");
    assert!(!dead_temp.exists());
    // The link was removed, not followed.
    assert_eq!(read(outside.path().join("keep-me")), "mine");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_asking_more_disk_than_its_parent_is_refused() {
    let env = start_with(GRACE, |cfg| cfg.resource_defaults.disk_max = 5 * MIB);
    // A root that sets nothing holds the platform's default, and so does a
    // child that asks for nothing.
    parent(&env, None, None).await;
    let disk = |n: &str| show(&env, n)["policy"]["resources"]["disk_max"].clone();
    assert_eq!(disk("p"), 5 * MIB);
    spawn_child(&env, "same", agent(&["--hang"]), None, &[]).await;
    assert_eq!(disk("same"), 5 * MIB);
    spawn_child(
        &env,
        "less",
        agent(&["--hang"]),
        Some(json!({"resources": {"disk_max": "2M"}})),
        &[],
    )
    .await;
    assert_eq!(disk("less"), 2 * MIB);

    let mut more = req("more", agent(&["--hang"]));
    more.parent = Some(name("p"));
    more.policy = Some(json!({"resources": {"disk_max": "6M"}}));
    let e = env.sup.spawn(me(), more).await.unwrap_err();
    assert_eq!(e.code, Code::PolicyExpansion, "{e}");
    assert!(
        e.message
            .contains("resources.disk_max: 6291456 is more than the parent's 5242880"),
        "{e}"
    );
    // Nothing of it was made.
    assert!(env.sup.view().show(&name("more")).is_err());
    assert!(!channel(&env, "more").exists());

    // A grandchild is bound by its own parent's, lower limit.
    let mut g = req("g", agent(&["--hang"]));
    g.parent = Some(name("less"));
    g.policy = Some(json!({"resources": {"disk_max": "3M"}}));
    let e = env.sup.spawn(me(), g).await.unwrap_err();
    assert_eq!(e.code, Code::PolicyExpansion, "{e}");
    assert!(
        e.message
            .contains("resources.disk_max: 3145728 is more than the parent's 2097152"),
        "{e}"
    );

    // The operator may give a root more than the default.
    let mut big = req("big", agent(&["--hang"]));
    big.policy = Some(json!({"resources": {"disk_max": "20G"}}));
    env.sup
        .spawn(me(), big)
        .await
        .expect("a root may hold more");
    assert_eq!(disk("big"), 20u64 << 30);
    // And a bad value is refused at the door, naming the field.
    let mut bad = req("bad", agent(&["--hang"]));
    bad.policy = Some(json!({"resources": {"disk_max": 0}}));
    let e = env.sup.spawn(me(), bad).await.unwrap_err();
    assert_eq!(e.code, Code::BadRequest, "{e}");
    assert!(e.message.contains("resources.disk_max"), "{e}");
    for n in ["p", "big"] {
        env.sup.cancel(me(), name(n)).await.unwrap();
    }
}

/// The platform's default comes from the configuration file the `brood`
/// command reads (`[resources] disk_max`): a root run with no policy holds
/// it, shows it, and runs under it; a bad value stops the command, naming
/// the key.
#[test]
fn the_configured_default_reaches_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[resources]\ndisk_max = \"64K\"\n",
    )
    .unwrap();
    // `ulimit -f` counts 512-byte blocks: 64 KiB are 128.
    let o = brood(
        dir.path(),
        &[
            "run",
            "--name",
            "w",
            "--protocol",
            "exec",
            "--",
            "sh",
            "-c",
            "ulimit -f",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "128\n");
    let o = brood(dir.path(), &["show", "w", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["policy"]["resources"]["disk_max"], 65536, "{v}");

    std::fs::write(
        dir.path().join("config.toml"),
        "[resources]\ndisk_max = 0\n",
    )
    .unwrap();
    let o = brood(dir.path(), &["run", "--protocol", "exec", "--", "true"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("resources.disk_max: 0: must be at least 1 byte"),
        "{}",
        text(&o)
    );
}

/// A run that ends by itself without a result (here it exits) hands nothing
/// back: what it wrote in `artifact/` goes, set aside at its end and removed
/// once its group is empty, while a resume started at once keeps what the
/// next run writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_a_result_leaves_nothing_and_its_resume_keeps_its_own() {
    let env = start(GRACE);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    parent(&env, None, Some(&d)).await;
    let script = r#"if [ -e "$DIR/second" ]; then head -c 1000 /dev/zero > "$BROOD_ARTIFACTS/new"; echo > "$DIR/wrote-new"
        else touch "$DIR/second"; head -c 100000 /dev/urandom > "$BROOD_ARTIFACTS/old"; exit 3; fi"#;
    spawn_child(
        &env,
        "c",
        shell_then_agent(script, &["--hang"]),
        None,
        &[("DIR", &d)],
    )
    .await;
    let v = wait_for(&env, "c").await;
    assert_eq!(
        (v["status"].as_str(), v["reason"].as_str()),
        (Some("failed"), Some("exited_without_result")),
        "{v}"
    );
    env.sup
        .resume(me(), name("c"), Some("again".into()))
        .await
        .expect("resume");
    let ch = channel(&env, "c");
    let settled = eventually_async(Duration::from_secs(10), || {
        dir.path().join("wrote-new").exists()
            && entries(&ch.join("artifact")) == ["new"]
            && entries(&ch).iter().all(|e| !e.starts_with(".artifact."))
    })
    .await;
    assert!(
        settled,
        "artifact/: {:?}, channel: {:?}",
        entries(&ch.join("artifact")),
        entries(&ch)
    );
    assert_eq!(
        std::fs::metadata(ch.join("artifact/new")).unwrap().len(),
        1000
    );
    env.sup.cancel(me(), name("p")).await.unwrap();
}
