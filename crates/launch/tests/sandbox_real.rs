//! The sandbox against the real kernel of this machine, proven from outside.
//!
//! Every test starts real programs (`/bin/sh`, `/bin/cat`, `/bin/bash`) through
//! [`Spawner::start`] and [`Spawner::launch_blocking`] with a prepared sandbox,
//! exactly as the supervisor does, and judges only what can be seen from outside:
//! exit codes, stdout, stderr, files left behind. The shell scripts use builtins
//! (redirections, `read`, `echo`, globbing, `kill`) so that they act without
//! executing anything else. A kernel feature this needs that is missing makes
//! the test fail with a message naming it; nothing is skipped.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Read;
use std::net::{Shutdown, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use brood_launch::sandbox::{FsAccess, Prepared, SandboxSpec, prepare};
use brood_launch::{LaunchError, LaunchSpec, Spawner};

/// What a finished process showed.
#[derive(Debug)]
struct Out {
    /// Exit code, or 128 + signal.
    code: i32,
    stdout: String,
    stderr: String,
}

fn spec_for(argv: &[&str], sandbox: Option<Prepared>) -> LaunchSpec {
    LaunchSpec {
        argv: argv.iter().map(OsString::from).collect(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("LANG".into(), "C".into()),
        ],
        cwd: None,
        cgroup_procs: None,
        sandbox,
        extra_procs: Vec::new(),
        ns: None,
        veil: None,
        stdin_prelude: Vec::new(),
        door: None,
        file_size_max: None,
        view: None,
    }
}

fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}

/// Starts `argv` with `sandbox`, waits at most 20 s for it, and collects its
/// output. The spawner must outlive the process (PR_SET_PDEATHSIG).
fn run_on(sp: &Spawner, argv: &[&str], sandbox: Option<Prepared>) -> Result<Out, LaunchError> {
    let l = sp.launch_blocking(spec_for(argv, sandbox))?;
    let stdio = UnixStream::from(l.stdio);
    stdio.set_nonblocking(false).unwrap();
    // The child's end of input.
    stdio.shutdown(Shutdown::Write).unwrap();
    let mut pfd = libc::pollfd {
        fd: l.pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, 20_000) } == 0 {
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(l.pid, libc::SIGKILL) };
    }
    let stderr = std::thread::spawn(move || read_all(File::from(l.stderr)));
    let stdout = read_all(stdio);
    let mut status = 0;
    // SAFETY: our own child (forked by the spawner thread of this process).
    assert_eq!(unsafe { libc::waitpid(l.pid, &mut status, 0) }, l.pid);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Ok(Out {
        code,
        stdout,
        stderr: stderr.join().unwrap(),
    })
}

/// One spawner (with its PID-namespace keeper) for the whole test binary, made
/// by the first test before any test has a pipe open. The keeper is forked and
/// never execs, so it holds a copy of every descriptor open at that moment for
/// as long as it lives: a keeper forked while another test waits for end of file
/// on its child's stdout would make that wait last as long as the keeper.
fn spawner() -> &'static Spawner {
    static SPAWNER: OnceLock<Spawner> = OnceLock::new();
    SPAWNER.get_or_init(|| Spawner::start(true).unwrap())
}

fn run(argv: &[&str], sandbox: Option<Prepared>) -> Out {
    run_on(spawner(), argv, sandbox).unwrap_or_else(|e| panic!("launching {argv:?}: {e}"))
}

fn prep(spec: SandboxSpec) -> Prepared {
    prepare(&spec).unwrap_or_else(|e| panic!("prepare: {e}"))
}

fn sh(script: &str, sandbox: Prepared) -> Out {
    run(&["/bin/sh", "-c", script], Some(sandbox))
}

/// `/bin/sh` may run, nothing else beyond the base set.
fn sh_only(fs: Vec<(PathBuf, FsAccess)>) -> SandboxSpec {
    SandboxSpec {
        fs,
        exec: vec!["/bin/sh".into()],
        ..SandboxSpec::default()
    }
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

#[test]
fn hidden_ro_rw_and_a_planted_symlink() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for sub in ["ro", "rw", "hidden"] {
        fs::create_dir(d.join(sub)).unwrap();
    }
    fs::write(d.join("ro/file"), "ro-content\n").unwrap();
    fs::write(d.join("hidden/secret"), "secret\n").unwrap();
    std::os::unix::fs::symlink(d.join("hidden/secret"), d.join("rw/link")).unwrap();
    std::os::unix::fs::symlink(d.join("hidden"), d.join("rw/dirlink")).unwrap();
    let p = prep(sh_only(vec![
        (d.join("ro"), FsAccess::Ro),
        (d.join("rw"), FsAccess::Rw),
    ]));
    let script = format!(
        r#"D='{d}'
r() {{ if read -r l < "$1"; then echo "read $1: ok: $l"; fi; }}
w() {{ if echo written >> "$1"; then echo "write $1: ok"; fi; }}
r "$D/ro/file"
r "$D/hidden/secret"
r "$D/rw/link"
r "$D/rw/dirlink/secret"
for f in "$D"/ro/* "$D"/hidden/*; do echo "list: $f"; done
w "$D/ro/file"
w "$D/ro/new"
w "$D/rw/new"
r "$D/rw/new"
w "$D/hidden/secret"
w "/tmp/brood-sandbox-escape-$$"
echo end"#,
        d = d.display()
    );
    // The same prepared sandbox serves two launches.
    for _ in 0..2 {
        let _ = fs::remove_file(d.join("rw/new"));
        let out = sh(&script, p.clone());
        let dd = d.display();
        assert_eq!(out.code, 0, "{out:?}");
        assert_eq!(
            lines(&out.stdout),
            [
                format!("read {dd}/ro/file: ok: ro-content"),
                format!("list: {dd}/ro/file"),
                // A directory that cannot be listed leaves the glob unexpanded.
                format!("list: {dd}/hidden/*"),
                format!("write {dd}/rw/new: ok"),
                format!("read {dd}/rw/new: ok: written"),
                "end".to_owned(),
            ],
            "{out:?}"
        );
        // Denied by the kernel (EACCES), not missing: the shell says why.
        for denied in [
            "hidden/secret",
            "rw/link",
            "rw/dirlink/secret",
            "ro/file",
            "ro/new",
        ] {
            let path = d.join(denied);
            let said = out.stderr.lines().any(|l| {
                l.contains(&path.display().to_string()) && l.ends_with("Permission denied")
            });
            assert!(said, "no EACCES for {}: {out:?}", path.display());
        }
        assert!(
            out.stderr.contains("/tmp/brood-sandbox-escape-") && !out.stderr.contains("No such"),
            "{out:?}"
        );
    }
    // From outside: nothing written where it was not allowed.
    assert_eq!(
        fs::read_to_string(d.join("ro/file")).unwrap(),
        "ro-content\n"
    );
    assert!(!d.join("ro/new").exists());
    assert_eq!(
        fs::read_to_string(d.join("hidden/secret")).unwrap(),
        "secret\n"
    );
    assert_eq!(fs::read_to_string(d.join("rw/new")).unwrap(), "written\n");
}

/// The path of the C library this test process runs with (from its own
/// `/proc/self/maps`), an executable file under the system library directories.
fn libc_path() -> PathBuf {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(PathBuf::from)
        .expect("this test process maps no libc.so")
}

#[test]
fn only_what_exec_allows_can_be_executed() {
    let libc = libc_path();
    let script = format!(
        "/bin/ls --version >/dev/null; echo \"ls $?\"; {} >/dev/null; echo \"libc $?\"",
        libc.display()
    );
    // Only the agent's own program: /bin/ls is denied (126: found but not
    // executable), and so is a program under the base set's library directories,
    // which are readable but not executable.
    let out = sh(&script, prep(sh_only(vec![])));
    assert_eq!(lines(&out.stdout), ["ls 126", "libc 126"], "{out:?}");
    assert!(out.stderr.contains("/bin/ls: Permission denied"), "{out:?}");
    // With /bin/ls in `exec`, it runs (and finds its libraries in the base set).
    let mut spec = sh_only(vec![]);
    spec.exec.push("/bin/ls".into());
    let out = sh(&script, prep(spec));
    assert_eq!(lines(&out.stdout), ["ls 0", "libc 126"], "{out:?}");
}

#[test]
fn the_program_itself_needs_exec_and_the_base_set() {
    let sp = spawner();
    // Not in `exec`: execve(2) of the agent itself is refused.
    let err = run_on(
        sp,
        &["/bin/sh", "-c", "echo ran"],
        Some(prep(SandboxSpec::default())),
    )
    .unwrap_err();
    let LaunchError::Spawn { source, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    // In `exec` but without the base set, a dynamically linked program cannot
    // have its loader executed.
    let spec = SandboxSpec {
        base_ro: false,
        ..sh_only(vec![])
    };
    let err = run_on(sp, &["/bin/sh", "-c", "echo ran"], Some(prep(spec))).unwrap_err();
    assert!(err.to_string().contains("Permission denied"), "{err}");
    // With both, a dynamically linked program starts and reads what `fs` grants.
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), "via cat\n").unwrap();
    let spec = SandboxSpec {
        fs: vec![(t.path().to_path_buf(), FsAccess::Ro)],
        exec: vec!["/bin/cat".into()],
        ..SandboxSpec::default()
    };
    let f = t.path().join("f");
    let out = run_on(sp, &["/bin/cat", f.to_str().unwrap()], Some(prep(spec))).unwrap();
    assert_eq!((out.code, out.stdout.as_str()), (0, "via cat\n"), "{out:?}");
}

fn bash() -> &'static str {
    let b = "/bin/bash";
    assert!(
        Path::new(b).exists(),
        "this test needs bash at {b} (its /dev/tcp connects)"
    );
    b
}

#[test]
fn tcp_connect_only_to_allowed_ports() {
    let bash = bash();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let other = if port == u16::MAX { port - 1 } else { port + 1 };
    let script =
        format!("if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected; else echo failed; fi");
    let connect = |allowed: Option<Vec<u16>>| {
        let p = prep(SandboxSpec {
            exec: vec![bash.into()],
            net_connect: allowed,
            ..SandboxSpec::default()
        });
        run(&[bash, "-c", &script], Some(p))
    };
    for (allowed, expect) in [
        (Some(vec![]), "failed"),
        (Some(vec![other]), "failed"),
        (Some(vec![port]), "connected"),
        (Some(vec![other, port]), "connected"),
        (None, "connected"),
    ] {
        let out = connect(allowed.clone());
        assert_eq!(out.stdout.trim(), expect, "{allowed:?}: {out:?}");
        if expect == "failed" {
            // Refused by landlock (EACCES), while the listener is up.
            assert!(
                out.stderr.contains("Permission denied"),
                "{allowed:?}: {out:?}"
            );
        }
    }
    drop(listener);
}

/// `Key: value` lines of a `/proc/PID/status` dump.
fn status_fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .map(|(k, v)| (k.trim_end_matches(':').to_owned(), v.trim().to_owned()))
        .collect()
}

const CAPS_SCRIPT: &str = r#"while read -r k v; do case "$k" in Cap*|NoNewPrivs:) echo "$k $v";; esac; done < /proc/self/status"#;

#[test]
fn a_root_agent_has_no_capabilities_and_no_new_privs() {
    let own = status_fields(&fs::read_to_string("/proc/self/status").unwrap());
    let own_eff = own.iter().find(|(k, _)| k == "CapEff").unwrap();
    assert_ne!(
        own_eff.1, "0000000000000000",
        "the test must run as root with capabilities to prove they are dropped"
    );
    let out = sh(CAPS_SCRIPT, prep(sh_only(vec![])));
    assert_eq!(out.code, 0, "{out:?}");
    let f = status_fields(&out.stdout);
    let get = |k: &str| {
        f.iter()
            .find(|(fk, _)| fk == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {k} in {out:?}"))
    };
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(get(k), "0000000000000000", "{k}: {out:?}");
    }
    assert_eq!(get("NoNewPrivs"), "1", "{out:?}");
    // Without drop_caps, root's execve hands the bounding set back: the test
    // above measures the drop, not an unprivileged runner.
    let kept = sh(
        CAPS_SCRIPT,
        prep(SandboxSpec {
            drop_caps: false,
            ..sh_only(vec![])
        }),
    );
    let f = status_fields(&kept.stdout);
    let eff = f.iter().find(|(k, _)| k == "CapEff").unwrap();
    assert_eq!(eff.1, own_eff.1, "{kept:?}");
}

#[test]
fn signals_leave_the_domain_only_without_scopes() {
    // Outside a PID namespace, so the agent can name the test process's pid.
    let _ = spawner();
    let sp = Spawner::start(false).unwrap();
    let script = format!(
        "if kill -0 {}; then echo signalled; else echo refused; fi",
        std::process::id()
    );
    let scoped = run_on(
        &sp,
        &["/bin/sh", "-c", &script],
        Some(prep(sh_only(vec![]))),
    )
    .unwrap();
    assert_eq!(scoped.stdout.trim(), "refused", "{scoped:?}");
    assert!(
        scoped.stderr.contains("Operation not permitted"),
        "{scoped:?}"
    );
    let open = SandboxSpec {
        scoped: false,
        ..sh_only(vec![])
    };
    let out = run_on(&sp, &["/bin/sh", "-c", &script], Some(prep(open))).unwrap();
    assert_eq!(out.stdout.trim(), "signalled", "{out:?}");
}

#[test]
fn no_descriptor_of_the_sandbox_reaches_the_agent() {
    let sp = spawner();
    let l = sp
        .launch_blocking(spec_for(
            &["/bin/sh", "-c", "read -r x"],
            Some(prep(sh_only(vec![]))),
        ))
        .unwrap();
    // Wait until the exec happened (the fds of the fork are gone then).
    let exe = format!("/proc/{}/exe", l.pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_link(&exe)
        .map(|p| !p.to_string_lossy().contains("dash") && !p.ends_with("sh"))
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "the agent never exec'd /bin/sh");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut fds: Vec<u32> = fs::read_dir(format!("/proc/{}/fd", l.pid))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .collect();
    fds.sort_unstable();
    let links: Vec<String> = fds
        .iter()
        .map(|fd| {
            format!(
                "{fd} -> {:?}",
                fs::read_link(format!("/proc/{}/fd/{fd}", l.pid))
            )
        })
        .collect();
    drop(l.stdio);
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(l.pid, &mut status, 0) };
    // Not the ruleset, not the report pipe, and not the descriptors this test
    // process inherited without close-on-exec (the harness running it has some).
    assert_eq!(fds, [0, 1, 2], "{links:?}");
}

#[test]
fn the_supervisor_death_signal_survives_the_sandbox() {
    // Without a PID namespace only PR_SET_PDEATHSIG kills the agent when the
    // spawner thread ends; the sandbox's credential changes (capset, landlock)
    // must not have cleared it.
    let _ = spawner();
    let sp = Spawner::start(false).unwrap();
    let l = sp
        .launch_blocking(spec_for(
            &["/bin/sh", "-c", "read -r x"],
            Some(prep(sh_only(vec![]))),
        ))
        .unwrap();
    drop(sp);
    let mut pfd = libc::pollfd {
        fd: l.pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 10_000) };
    let mut status = 0;
    if ready == 0 {
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(l.pid, libc::SIGKILL) };
    }
    // SAFETY: our own child.
    unsafe { libc::waitpid(l.pid, &mut status, 0) };
    assert_eq!(ready, 1, "the agent outlived its spawner thread by 10 s");
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
        "status {status:#x}"
    );
    drop(l.stdio);
}

/// One prepared sandbox serves many launches (the launcher prepares once per
/// agent and applies in every child); each applies and runs. (What preparing
/// and applying cost is `brood bench spawn --level landlock`.)
#[test]
fn one_prepared_sandbox_applies_in_many_children() {
    let spec = SandboxSpec {
        fs: vec![("/tmp".into(), FsAccess::Rw), ("/etc".into(), FsAccess::Ro)],
        exec: vec!["/bin/true".into()],
        net_connect: Some(vec![443]),
        net_bind: Some(vec![]),
        ..SandboxSpec::default()
    };
    let sp = spawner();
    let p = prep(spec);
    for _ in 0..20 {
        let out = run_on(sp, &["/bin/true"], Some(p.clone())).unwrap();
        assert_eq!(out.code, 0, "{out:?}");
    }
}
