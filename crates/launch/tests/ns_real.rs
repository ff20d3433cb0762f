//! The `iso = ns` layer ([`brood_launch::ns`]) against the real kernel of this
//! machine.
//!
//! Each test prepares a namespace spec in the test process, starts a real program
//! through `Command` with a `pre_exec` that calls the child side (exactly where the
//! launcher's `child_setup` will), and judges from the outside: exit status,
//! stdout/stderr, files in the host directories, connections to a host listener.
//! Every test also checks that the host's mount table is unchanged afterwards.
//! A missing kernel feature fails the test with a message naming it; none is
//! skipped.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::CString;
use std::fs;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use brood_launch::ns::{self, MountSpec, NsSpec, PreparedNs};

fn mountinfo() -> String {
    fs::read_to_string("/proc/self/mountinfo").unwrap()
}

/// Runs `argv` with the namespace applied between fork and exec, after `before`
/// (extra child-side setup some tests need).
fn run_with(
    p: &PreparedNs,
    argv: &[&str],
    before: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
) -> std::io::Result<Output> {
    // The test needs a real exec'd program, as the launcher starts one.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    let child = p.for_child();
    // SAFETY: `before` and apply make raw syscalls only; `p` outlives the spawn.
    unsafe {
        cmd.pre_exec(move || {
            before()?;
            child.apply()
        });
    }
    cmd.output()
}

fn run(p: &PreparedNs, argv: &[&str]) -> Output {
    run_with(p, argv, || Ok(())).unwrap_or_else(|e| {
        panic!(
            "spawning {argv:?} in the namespace: {e}; child step: {:?}",
            p.child_failure().map(|f| f.to_string())
        )
    })
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Read-only binds of the system directories a shell needs (`/bin` and `/lib`
/// are symlinks into `/usr` here; a bind follows its source, so each becomes a
/// directory in the new root).
fn system_mounts() -> Vec<MountSpec> {
    ["/usr", "/bin", "/lib", "/lib64"]
        .iter()
        .filter(|d| Path::new(d).exists())
        .map(|d| ro(Path::new(d), d))
        .collect()
}

fn ro(source: &Path, target: &str) -> MountSpec {
    MountSpec {
        source: source.to_path_buf(),
        target: PathBuf::from(target),
        rw: false,
        rbind: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    }
}

fn rw(source: &Path, target: &str) -> MountSpec {
    MountSpec {
        rw: true,
        ..ro(source, target)
    }
}

fn lines(out: &Output) -> Vec<String> {
    text(&out.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn a_root_built_from_the_table_gives_rw_ro_noexec_cwd_and_hides_the_host() {
    let before = mountinfo();
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let refdir = tempfile::tempdir().unwrap();
    fs::write(refdir.path().join("r"), "reference\n").unwrap();
    let exe = tempfile::tempdir().unwrap();
    let tru = exe.path().join("true");
    fs::copy("/usr/bin/true", &tru).unwrap();
    fs::set_permissions(&tru, fs::Permissions::from_mode(0o755)).unwrap();

    let mut mounts = system_mounts();
    mounts.push(rw(data.path(), "/work"));
    mounts.push(ro(refdir.path(), "/ref"));
    let mut noexec = ro(exe.path(), "/noexec");
    noexec.noexec = true;
    mounts.push(noexec);
    mounts.push(ro(exe.path(), "/exec"));
    let spec = NsSpec {
        mounts,
        root: Some(root.path().to_path_buf()),
        cwd: Some(PathBuf::from("/work")),
        ..NsSpec::default()
    };
    let p = ns::prepare(&spec).unwrap();
    let script = "\
        pwd
        echo hi > x && echo work-ok
        echo no > /ref/y || echo ref-refused
        cat /ref/r
        /exec/true; echo exec-status=$?
        /noexec/true; echo noexec-status=$?
        test -e /etc/hostname && echo etc-visible || echo etc-hidden
        test -e /proc/self && echo proc-visible || echo proc-hidden
        test -e /tmp && echo tmp-visible || echo tmp-hidden
        echo z > /newfile || echo root-refused
        ";
    let out = run(&p, &["/bin/sh", "-c", script]);
    let err = text(&out.stderr);
    assert_eq!(
        lines(&out),
        [
            "/work",
            "work-ok",
            "ref-refused",
            "reference",
            "exec-status=0",
            "noexec-status=126",
            "etc-hidden",
            "proc-hidden",
            "tmp-hidden",
            "root-refused",
        ],
        "stderr: {err}"
    );
    // EROFS for the ro mount and for the root itself, EACCES for noexec
    // (execve(2): "a mount with noexec").
    assert_eq!(err.matches("Read-only file system").count(), 2, "{err}");
    assert!(err.contains("/noexec/true: Permission denied"), "{err}");
    assert_eq!(fs::read_to_string(data.path().join("x")).unwrap(), "hi\n");
    assert!(!refdir.path().join("y").exists());
    assert!(!root.path().join("newfile").exists());
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

/// A scratch root is a tmpfs the child mounts on the given directory inside its
/// own namespace: the mount points (nested ones and a file's included) appear
/// there, the root is read-only, `/proc` is fresh, and the host's directory is
/// left exactly as it was: empty, with nothing mounted on it.
#[test]
fn a_scratch_root_is_a_private_tmpfs_that_leaves_nothing_on_the_host() {
    let before = mountinfo();
    let scratch = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    fs::write(data.path().join("f"), "file source\n").unwrap();
    let mut mounts = system_mounts();
    mounts.push(rw(data.path(), "/deep/er/work"));
    mounts.push(ro(&data.path().join("f"), "/etc/f"));
    let spec = NsSpec {
        mounts,
        root: Some(scratch.path().to_path_buf()),
        scratch: true,
        cwd: Some(PathBuf::from("/deep/er/work")),
        proc: true,
        ..NsSpec::default()
    };
    let p = ns::prepare(&spec).unwrap();
    assert_eq!(
        fs::read_dir(scratch.path()).unwrap().count(),
        0,
        "prepare made something on the host"
    );
    let script = "\
        pwd
        cat /etc/f
        echo hi > x && echo work-ok
        echo z > /newfile || echo root-refused
        mkdir /deep/new || echo mkdir-refused
        test -r /proc/self/mountinfo && echo proc-ok
        grep ' / / ' /proc/self/mountinfo | grep -c ' - tmpfs '
        ";
    let out = run(&p, &["/bin/sh", "-c", script]);
    let err = text(&out.stderr);
    assert_eq!(
        lines(&out),
        [
            "/deep/er/work",
            "file source",
            "work-ok",
            "root-refused",
            "mkdir-refused",
            "proc-ok",
            "1",
        ],
        "stderr: {err}; child step: {:?}",
        p.child_failure().map(|f| f.to_string())
    );
    assert_eq!(err.matches("Read-only file system").count(), 2, "{err}");
    assert_eq!(fs::read_to_string(data.path().join("x")).unwrap(), "hi\n");
    assert_eq!(
        fs::read_dir(scratch.path()).unwrap().count(),
        0,
        "the scratch root left something on the host"
    );
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

#[test]
fn rbind_takes_submounts_along_and_restricts_them_all_bind_does_not() {
    let before = mountinfo();
    let outer = tempfile::tempdir().unwrap();
    fs::create_dir(outer.path().join("sub")).unwrap();
    // In the child only, before the namespace is built: a private mount namespace
    // with a tmpfs on outer/sub holding a marker, standing in for a source that
    // has submounts. apply_in_child's own unshare copies it.
    let sub = CString::new(outer.path().join("sub").as_os_str().as_bytes()).unwrap();
    let marker = CString::new(outer.path().join("sub/marker").as_os_str().as_bytes()).unwrap();
    let submount = move || -> std::io::Result<()> {
        // SAFETY: raw syscalls on C strings owned by the closure.
        unsafe {
            let null = std::ptr::null::<libc::c_char>();
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                || libc::mount(
                    c"tmpfs".as_ptr(),
                    sub.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(
                marker.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            );
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
        }
        Ok(())
    };
    let submount = std::sync::Arc::new(submount);
    let script = "\
        test -e /data/sub/marker && echo marker-visible || echo marker-absent
        echo x > /data/sub/new || echo sub-refused
        ";
    for rbind in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let mut mounts = system_mounts();
        let mut data = ro(outer.path(), "/data");
        data.rbind = rbind;
        mounts.push(data);
        let p = ns::prepare(&NsSpec {
            mounts,
            root: Some(root.path().to_path_buf()),
            ..NsSpec::default()
        })
        .unwrap();
        let s = submount.clone();
        let out = run_with(&p, &["/bin/sh", "-c", script], move || s()).unwrap();
        let err = text(&out.stderr);
        let want = if rbind {
            "marker-visible"
        } else {
            "marker-absent"
        };
        assert_eq!(lines(&out), [want, "sub-refused"], "rbind={rbind}: {err}");
        assert!(
            err.contains("Read-only file system"),
            "rbind={rbind}: {err}"
        );
    }
    assert!(
        !outer.path().join("sub/marker").exists(),
        "the tmpfs was the child's"
    );
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

/// Connects with bash's /dev/tcp (bash(1) "REDIRECTION") to the host's listener.
fn connect_script(port: u16) -> String {
    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected; grep -c : /proc/net/dev")
}

#[test]
fn empty_network_cannot_reach_a_host_listener_and_has_only_lo() {
    let before = mountinfo();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = connect_script(port);

    // Control: the private mount namespace alone leaves the network alone.
    let p = ns::prepare(&NsSpec::default()).unwrap();
    let out = run(&p, &["/bin/bash", "-c", &script]);
    let host_ifaces: usize = lines(&out)[1].parse().unwrap();
    assert_eq!(lines(&out)[0], "connected", "{}", text(&out.stderr));
    assert!(
        listener.accept().is_ok(),
        "the control connection never arrived"
    );

    let p = ns::prepare(&NsSpec {
        empty_network: true,
        ..NsSpec::default()
    })
    .unwrap();
    let out = run(&p, &["/bin/bash", "-c", &script]);
    let err = text(&out.stderr);
    // lo is up in the new namespace, so nothing listening there: refused
    // (ECONNREFUSED), not unreachable.
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(
        lines(&out),
        ["1"],
        "only lo in /proc/net/dev (host has {host_ifaces}): {err}"
    );
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener was reached from an empty network namespace: {other:?}"),
    }
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

/// The namespace a child joins from the pool is as good as one it makes: only
/// `lo`, up (a connection to a host listener is refused, not unreachable), and
/// a namespace of its own that no other child gets.
#[test]
fn a_pooled_network_namespace_is_empty_up_and_given_once() {
    let before = mountinfo();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!("readlink /proc/self/ns/net; {}", connect_script(port));
    let host_ns = fs::read_link("/proc/self/ns/net").unwrap();
    let pool = ns::NetnsPool::start(2).unwrap();
    let mut seen = Vec::new();
    // Each namespace is kept alive to the end, so no two can share an inode.
    let mut kept = Vec::new();
    for _ in 0..3 {
        // The pool's thread fills it in the background: wait for one.
        // A pool that never fills would hang here; bound the wait so the
        // failure says so (a correctness bound, not a speed one).
        let mut fd = None;
        for _ in 0..10_000 {
            assert!(pool.broken().is_none(), "{:?}", pool.broken());
            fd = pool.take();
            if fd.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let fd = fd.expect("the pool made no namespace in 10,000 tries");
        let spec = NsSpec {
            empty_network: true,
            ..NsSpec::default()
        };
        let p = ns::prepare_with(&spec, Some(fd)).unwrap();
        let out = run(&p, &["/bin/bash", "-c", &script]);
        let err = text(&out.stderr);
        assert!(err.contains("Connection refused"), "{err}");
        let l = lines(&out);
        assert_eq!(l.len(), 2, "{l:?} {err}");
        assert_eq!(l[1], "1", "only lo in /proc/net/dev: {err}");
        assert_ne!(
            Path::new(&l[0]),
            host_ns,
            "the child is in the host's namespace"
        );
        assert!(!seen.contains(&l[0]), "{} given twice", l[0]);
        seen.push(l[0].clone());
        kept.push(p);
    }
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener was reached from a pooled namespace: {other:?}"),
    }
    drop(pool);
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

#[test]
fn proc_in_the_agents_pid_namespace_shows_only_its_processes() {
    let before = mountinfo();
    let root = tempfile::tempdir().unwrap();
    let p = ns::prepare(&NsSpec {
        mounts: system_mounts(),
        root: Some(root.path().to_path_buf()),
        proc: true,
        ..NsSpec::default()
    })
    .unwrap();
    // As the spawner thread does: a PID namespace for this thread's children, on
    // a thread of its own (unshare(2) CLONE_NEWPID affects the caller's later
    // children only).
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare with a flag that only affects this thread's children.
            let r = unsafe { libc::unshare(libc::CLONE_NEWPID) };
            assert_eq!(
                r,
                0,
                "cannot create a PID namespace: {}",
                std::io::Error::last_os_error()
            );
            run(
                &p,
                &[
                    "/bin/sh",
                    "-c",
                    "echo $$ $(cat /proc/1/comm); ls /proc/self/",
                ],
            )
        })
        .join()
        .unwrap()
    });
    let l = lines(&out);
    assert_eq!(
        l.first().map(String::as_str),
        Some("1 sh"),
        "{}",
        text(&out.stderr)
    );
    assert!(l.iter().any(|x| x == "mountinfo"), "{l:?}");
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

#[test]
fn a_failing_child_step_is_named_with_its_path() {
    let before = mountinfo();
    let root = tempfile::tempdir().unwrap();
    let p = ns::prepare(&NsSpec {
        mounts: system_mounts(),
        root: Some(root.path().to_path_buf()),
        cwd: Some(PathBuf::from("/no/such/dir")),
        ..NsSpec::default()
    })
    .unwrap();
    let err = run_with(&p, &["/bin/true"], || Ok(())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    let named = p
        .child_failure()
        .expect("the child recorded no step")
        .to_string();
    assert!(named.contains("chdir to /no/such/dir"), "{named}");
    assert!(named.contains("mount namespace layer"), "{named}");

    // The same prepared namespace, fixed cwd: the page is reset by the next child.
    let p = ns::prepare(&NsSpec {
        mounts: system_mounts(),
        root: Some(root.path().to_path_buf()),
        ..NsSpec::default()
    })
    .unwrap();
    assert!(run(&p, &["/bin/true"]).status.success());
    assert!(p.child_failure().is_none());
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

/// Times `apply_in_child` inside the child (CLOCK_MONOTONIC around the call,
/// the nanoseconds written to a pipe) over `n` spawns; returns sorted µs.
/// Runs `/bin/true` `n` times with `p` applied in the child; each must succeed.
fn apply_and_run(p: &PreparedNs, n: usize) {
    for _ in 0..n {
        #[allow(clippy::disallowed_methods)]
        let mut cmd = Command::new("/bin/true");
        let child = p.for_child();
        // SAFETY: apply makes only async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || child.apply());
        }
        assert!(cmd.status().unwrap().success());
    }
}

/// Each shape of namespace applies again and again, and none of it reaches the
/// host's mount table. (What applying costs is `brood bench spawn --level ns`.)
#[test]
fn every_namespace_shape_applies_and_leaves_the_host_mount_table_alone() {
    let before = mountinfo();
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut full = system_mounts();
    full.push(rw(data.path(), "/work"));
    full.push(ro(data.path(), "/ref"));
    let cases = [
        ("mount namespace only", NsSpec::default()),
        (
            "root + 6 binds + pivot_root",
            NsSpec {
                mounts: full.clone(),
                root: Some(root.path().to_path_buf()),
                cwd: Some(PathBuf::from("/work")),
                ..NsSpec::default()
            },
        ),
        (
            "root + 6 binds + pivot_root + /proc",
            NsSpec {
                mounts: full.clone(),
                root: Some(root.path().to_path_buf()),
                cwd: Some(PathBuf::from("/work")),
                proc: true,
                ..NsSpec::default()
            },
        ),
        (
            "root + 6 binds + pivot_root + empty network",
            NsSpec {
                mounts: full,
                root: Some(root.path().to_path_buf()),
                cwd: Some(PathBuf::from("/work")),
                empty_network: true,
                ..NsSpec::default()
            },
        ),
    ];
    for (name, spec) in cases {
        let p = ns::prepare(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        apply_and_run(&p, 5);
    }
    assert_eq!(mountinfo(), before, "the host's mount table changed");
}

#[test]
fn spawn_status_of_a_killed_program_is_seen_through_the_namespace() {
    // The launcher judges agents by exit status; make sure nothing in the
    // namespace setup turns a signal death into something else.
    let root = tempfile::tempdir().unwrap();
    let p = ns::prepare(&NsSpec {
        mounts: system_mounts(),
        root: Some(root.path().to_path_buf()),
        ..NsSpec::default()
    })
    .unwrap();
    let out = run(&p, &["/bin/sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
}
