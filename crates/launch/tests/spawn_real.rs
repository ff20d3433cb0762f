//! The spawn path itself against the real kernel: what a child starts with (its
//! signal state, its first input) when the spawner clones it sharing the
//! supervisor's memory (`CLONE_VM | CLONE_VFORK`) instead of forking.

// The helpers below are test code too; clippy's allow-unwrap-in-tests only sees
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

use brood_launch::{LaunchSpec, Spawner};

fn spec(argv: &[&str], prelude: &[u8]) -> LaunchSpec {
    LaunchSpec {
        argv: argv.iter().map(OsString::from).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: None,
        cgroup_procs: None,
        sandbox: None,
        extra_procs: Vec::new(),
        ns: None,
        veil: None,
        stdin_prelude: prelude.to_vec(),
        door: None,
        file_size_max: None,
        view: None,
    }
}

/// One spawner for the binary, made before any test has a pipe open (see
/// sandbox_real.rs: the keeper keeps what is open when it is forked).
fn spawner() -> &'static Spawner {
    static SPAWNER: OnceLock<Spawner> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        // What a supervisor typically has: SIGPIPE ignored (Rust's runtime does
        // it), a handler installed, and a signal blocked on the thread that
        // starts the spawner (its mask is inherited by the spawner thread).
        extern "C" fn on_usr1(_: libc::c_int) {}
        // SAFETY: signal(2) and pthread_sigmask(3) with valid arguments; the
        // handler does nothing.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        Spawner::start(true).unwrap()
    })
}

fn read_all(mut r: impl Read) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    s
}

/// The child's stdin and stdout (one socket, left non-blocking by the
/// launcher), blocking: (to read its output, to write its input).
fn stdio(fd: OwnedFd) -> (UnixStream, UnixStream) {
    let s = UnixStream::from(fd);
    s.set_nonblocking(false).unwrap();
    let w = s.try_clone().unwrap();
    (s, w)
}

/// The child's output to its end, once its input is ended.
fn output_after_input(fd: OwnedFd) -> UnixStream {
    let (out, w) = stdio(fd);
    w.shutdown(Shutdown::Write).unwrap();
    out
}

/// Reads the child's stdout to its end and reaps it; (exit code, stdout).
fn finish(pid: i32, stdout: UnixStream) -> (i32, String) {
    let out = read_all(stdout);
    let mut status = 0;
    // SAFETY: our own unreaped child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    (libc::WEXITSTATUS(status), out)
}

/// The child shares the supervisor's memory until exec, so none of the
/// supervisor's handlers, ignored signals or blocked signals may reach it: it
/// starts as a fresh process would (SigIgn, SigCgt and SigBlk all empty).
#[test]
fn the_child_starts_with_default_signals_and_an_empty_mask() {
    let l = spawner()
        .launch_blocking(spec(&["/bin/cat", "/proc/self/status"], b""))
        .unwrap();
    let (code, status) = finish(l.pid, output_after_input(l.stdio));
    assert_eq!(code, 0);
    for field in ["SigBlk", "SigIgn", "SigCgt"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        assert!(
            line.trim_start_matches(field)
                .trim_start_matches(':')
                .trim()
                .chars()
                .all(|c| c == '0'),
            "{line}"
        );
    }
}

/// The first input is in the pipe before the program runs: the child reads it
/// although nobody writes to its stdin after the launch.
#[test]
fn the_prelude_is_in_stdin_when_the_program_starts() {
    let l = spawner()
        .launch_blocking(spec(
            &["/bin/sh", "-c", "read l; echo \"got:$l\""],
            b"first line\n",
        ))
        .unwrap();
    assert_eq!(l.stdin_written, 11);
    let (code, out) = finish(l.pid, output_after_input(l.stdio));
    assert_eq!((code, out.as_str()), (0, "got:first line\n"));
}

/// A prelude larger than the pipe does not block the spawner: what fits is
/// written, the caller writes the rest, and the child reads all of it in order.
#[test]
fn a_prelude_larger_than_the_pipe_is_written_in_part() {
    let big: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    let l = spawner()
        .launch_blocking(spec(&["/usr/bin/sha256sum"], &big))
        .unwrap();
    assert!(
        l.stdin_written > 0 && l.stdin_written < big.len(),
        "{} of {}",
        l.stdin_written,
        big.len()
    );
    let rest = big[l.stdin_written..].to_vec();
    // Write the rest from a thread while the child's output is read.
    let (stdout, mut stdin) = stdio(l.stdio);
    let writer = std::thread::spawn(move || {
        stdin.write_all(&rest).unwrap();
        stdin.shutdown(Shutdown::Write).unwrap();
    });
    let (code, out) = finish(l.pid, stdout);
    writer.join().unwrap();
    assert_eq!(code, 0);
    let want = {
        // The same digest, computed here.
        let l2 = spawner()
            .launch_blocking(spec(&["/usr/bin/sha256sum"], b""))
            .unwrap();
        let (stdout, mut stdin) = stdio(l2.stdio);
        let data = big.clone();
        let w = std::thread::spawn(move || {
            stdin.write_all(&data).unwrap();
            stdin.shutdown(Shutdown::Write).unwrap();
        });
        let r = finish(l2.pid, stdout);
        w.join().unwrap();
        r.1
    };
    assert_eq!(out, want);
}

/// A program that cannot be executed is an error of the launch naming the
/// program and the errno. (That the child is reaped is not checked here: a
/// `waitpid(-1)` would race with the other tests' children.)
#[test]
fn an_exec_failure_names_the_program_and_the_errno() {
    let e = spawner()
        .launch_blocking(spec(&["/nonexistent/brood-program"], b""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/brood-program"), "{e}");
    assert!(e.contains("No such file"), "{e}");
}

/// `file_size_max` is the kernel's `RLIMIT_FSIZE` on the child and what it
/// starts, soft and hard (issue 24): a shell that writes past it is killed
/// by `SIGXFSZ` and its file stops at the limit; one that ignores the
/// signal gets `EFBIG` (`File too large`). (That an agent cannot raise it
/// back, having no `CAP_SYS_RESOURCE`, is brood-cli's `disk.rs`.)
#[test]
fn no_file_the_child_writes_grows_past_file_size_max() {
    let dir = tempfile::tempdir().unwrap();
    let (killed, ignored) = (dir.path().join("killed"), dir.path().join("ignored"));
    let script = format!(
        "ulimit -f; ulimit -H -f; \
         head -c 3000 /dev/zero > {k}; echo \"head: $?\"; \
         (trap '' XFSZ; head -c 3000 /dev/zero > {i}) 2>&1; exit 0",
        k = killed.display(),
        i = ignored.display(),
    );
    let mut s = spec(&["/bin/sh", "-c", &script], b"");
    s.file_size_max = Some(1024);
    let l = spawner().launch_blocking(s).unwrap();
    let (code, out) = finish(l.pid, output_after_input(l.stdio));
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    // `ulimit -f` counts 512-byte blocks: 1024 bytes are 2.
    assert_eq!(&lines[..2], ["2", "2"], "{out}");
    // 128 + SIGXFSZ: the shell's report of a child the signal killed.
    assert_eq!(lines[2], format!("head: {}", 128 + libc::SIGXFSZ), "{out}");
    assert!(
        lines[3].contains("File too large"),
        "ignoring SIGXFSZ, the write fails with EFBIG: {out}"
    );
    for f in [&killed, &ignored] {
        assert_eq!(std::fs::metadata(f).unwrap().len(), 1024, "{}", f.display());
    }
}

/// The ring tells each exit once, with the process left for its owner to
/// reap (its status intact), however many are watched at once (issue 28
/// item 4: no pidfd an agent).
#[test]
fn the_exit_ring_tells_every_exit_once_and_leaves_the_status_to_reap() {
    use std::sync::mpsc;
    use std::time::Duration;
    let sp = spawner();
    assert!(
        brood_launch::spawn::exits::available(),
        "this kernel has no io_uring with IORING_OP_WAITID (Linux 6.7), or it is disabled"
    );
    let (tx, rx) = mpsc::channel();
    let mut pids = Vec::new();
    for i in 0..100u32 {
        let code = i % 7;
        let l = sp
            .launch_blocking(spec(&["/bin/sh", "-c", &format!("exit {code}")], b""))
            .unwrap();
        drop(l.pidfd);
        let tx = tx.clone();
        let pid = l.pid;
        brood_launch::spawn::exits::watch(pid, move || tx.send(pid).unwrap())
            .unwrap_or_else(|_| panic!("the ring refused to watch {pid}"));
        pids.push((pid, code));
    }
    drop(tx);
    let mut told: Vec<i32> = Vec::new();
    while let Ok(pid) = rx.recv_timeout(Duration::from_secs(20)) {
        told.push(pid);
    }
    told.sort_unstable();
    let mut want: Vec<i32> = pids.iter().map(|(p, _)| *p).collect();
    want.sort_unstable();
    assert_eq!(told, want, "each exit told once");
    for (pid, code) in pids {
        let mut status = 0;
        // SAFETY: our own child, a zombie the ring left unreaped.
        assert_eq!(
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) },
            pid
        );
        assert_eq!(libc::WEXITSTATUS(status), code as i32);
    }
}

/// The kernel's waitid wakes on every child's change of state and looks
/// again: other children exiting around a watched one must not be taken
/// for its exit.
#[test]
fn the_exit_ring_is_not_fooled_by_another_child_exiting() {
    use std::sync::mpsc;
    use std::time::Duration;
    let sp = spawner();
    assert!(
        brood_launch::spawn::exits::available(),
        "this kernel has no io_uring with IORING_OP_WAITID (Linux 6.7), or it is disabled"
    );
    let long = sp
        .launch_blocking(spec(&["/bin/sh", "-c", "read -r x; exit 5"], b""))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let pid = long.pid;
    brood_launch::spawn::exits::watch(pid, move || tx.send(()).unwrap())
        .unwrap_or_else(|_| panic!("the ring refused to watch {pid}"));
    for _ in 0..10 {
        let l = sp.launch_blocking(spec(&["/bin/true"], b"")).unwrap();
        let (code, _) = finish(l.pid, output_after_input(l.stdio));
        assert_eq!(code, 0);
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "told of an exit while the child still runs"
    );
    let (out, w) = stdio(long.stdio);
    drop(w);
    let (code, _) = finish(pid, {
        let mut o = out;
        o.write_all(b"go\n").unwrap();
        o.shutdown(Shutdown::Write).unwrap();
        o
    });
    assert_eq!(code, 5);
    rx.recv_timeout(Duration::from_secs(20))
        .expect("told of the exit");
}
