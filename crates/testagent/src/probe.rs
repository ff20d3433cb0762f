//! The probes: the test agent tries an action and *reports* what the kernel let
//! it do, one line per probe, instead of failing. This is how tests prove the
//! sandbox from inside it (issue 3, item 6): a denied read is a result, not a
//! crash.
//!
//! Each line is `<what> <target>: <outcome>` where the outcome is `ok`,
//! `denied` (the action failed with `EACCES` or `EPERM`, which is how landlock,
//! capabilities and DAC refuse), or `error: <errno text>` for anything else
//! (a missing file, a refused connection). `--fork-bomb`, `--memory-hog`,
//! `--write-bytes` and `--probe-caps` report what they measured instead; see
//! [`Probe`].

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crate::flags::Probe;
use crate::outcome::outcome;
use crate::procs;

/// How long `--probe-connect` waits for the TCP handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `--memory-hog` allocates and touches memory in steps of this size.
const MIB: usize = 1 << 20;

/// Runs one probe and returns its report line.
pub fn run(p: &Probe) -> String {
    match p {
        Probe::Read(path) => line("read", &path.display(), read(path)),
        Probe::Write(path) => line("write", &path.display(), write(path)),
        Probe::Exec(path) => line("exec", &path.display(), exec(path)),
        Probe::Connect(port) => line("connect", port, connect(*port)),
        Probe::Bind(port) => line("bind", port, bind(*port)),
        Probe::ForkBomb(n) => fork_bomb_line(*n, &fork_bomb(*n)),
        Probe::MemoryHog(mb) => memory_hog(*mb),
        Probe::WriteBytes(path, size) => write_bytes(path, *size),
        Probe::Caps => caps_line(fs::read_to_string("/proc/self/status")),
        Probe::CgroupRemount(c) => line("cgroup-remount", c, cgroup_remount(c)),
        Probe::Unix(path) => crate::sockets::unix(path),
        Probe::Abstract(name) => crate::sockets::abstract_unix(name),
        Probe::Udp(port) => crate::sockets::udp(*port),
        Probe::Families => crate::sockets::families(),
        Probe::IoUring => crate::sockets::io_uring(),
        Probe::BroodSocket(path) => crate::sockets::brood_socket(path),
    }
}

/// See [`Probe::CgroupRemount`]. A fork, because `unshare(CLONE_NEWUSER)`
/// refuses a process with more than one thread; the child reports the step
/// that failed through its exit status (10 + step) and the errno through a pipe.
fn cgroup_remount(controller: &str) -> io::Result<()> {
    let (fstype, data, file, value): (&std::ffi::CStr, Option<CString>, &str, &str) =
        if controller == "unified" {
            (c"cgroup2", None, "cgroup.procs", "0")
        } else {
            let file = match controller {
                "memory" => "memory.limit_in_bytes",
                "pids" => "pids.max",
                _ => "cgroup.procs",
            };
            let value = if controller == "pids" {
                "max"
            } else {
                "9223372036854771712"
            };
            (
                c"cgroup",
                Some(CString::new(controller).map_err(io::Error::other)?),
                file,
                value,
            )
        };
    let target = c"/tmp";
    let path = CString::new(format!("/tmp/{file}")).map_err(io::Error::other)?;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a two-element array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the child makes raw syscalls only and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY (whole block): raw syscalls on values prepared before the fork.
        unsafe {
            let fail = |step: i32| -> ! {
                let errno = *libc::__errno_location();
                libc::write(fds[1], (&errno as *const i32).cast(), 4);
                libc::_exit(10 + step)
            };
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP) != 0 {
                fail(0);
            }
            let data_ptr = data.as_ref().map_or(std::ptr::null(), |d| d.as_ptr());
            if libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                data_ptr.cast(),
            ) != 0
            {
                fail(1);
            }
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                fail(2);
            }
            if libc::write(fd, value.as_ptr().cast(), value.len()) < 0 {
                fail(3);
            }
            libc::_exit(0)
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let mut errno = [0u8; 4];
    // SAFETY: the read end is ours alone from here on.
    let mut pipe = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let got = pipe.read(&mut errno).unwrap_or(0);
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    if got != 4 {
        return Err(io::Error::other("the probe's child died"));
    }
    let e = io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
    if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        // A refusal: reported as `denied`, whichever step refused.
        return Err(e);
    }
    let step = ["unshare", "mount", "open", "write"]
        .get((libc::WEXITSTATUS(status) - 10).max(0) as usize)
        .copied()
        .unwrap_or("?");
    Err(io::Error::other(format!("{step}: {e}")))
}

fn line(what: &str, target: &dyn std::fmt::Display, r: io::Result<()>) -> String {
    format!("{what} {target}: {}", outcome(&r))
}

/// Reads the first block of a file, or lists a directory whole. `stat` is not
/// a right landlock controls, so it only chooses which.
fn read(path: &Path) -> io::Result<()> {
    if fs::metadata(path)?.is_dir() {
        for entry in fs::read_dir(path)? {
            entry?;
        }
    } else {
        // One block is enough to prove a read, and /dev/zero never ends.
        let mut buf = [0u8; 4096];
        // Any amount, even 0 for an empty file: the kernel let the read happen.
        let _amount = File::open(path)?.read(&mut buf)?;
    }
    Ok(())
}

/// Appends a line, creating the file if needed.
fn write(path: &Path) -> io::Result<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(b"brood test-agent probe\n")
}

/// Whether execve(2) of `path` (no arguments, empty environment) succeeds, in a
/// forked child: the child writes its errno to a close-on-exec pipe only when
/// execve fails, so end of file means the exec happened. The new program is
/// killed and reaped at once: the question is only whether it may start.
fn exec(path: &Path) -> io::Result<()> {
    let prog = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let argv = [prog.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];
    // Its output must not reach the protocol on our stdout. Without /dev/null
    // (hidden by a sandbox) the child closes its stdio instead.
    let devnull = OpenOptions::new().read(true).write(true).open("/dev/null");
    let null_fd = devnull.as_ref().map_or(-1, |f| f.as_raw_fd());
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2(2) writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [rd, wr] = fds;
    // SAFETY: the child makes only async-signal-safe calls (dup2, close,
    // execve, write of a stack value, _exit) on values prepared before fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            for target in 0..3 {
                if null_fd >= 0 {
                    libc::dup2(null_fd, target);
                } else {
                    libc::close(target);
                }
            }
            libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
            let errno = (*libc::__errno_location()).to_ne_bytes();
            libc::write(wr, errno.as_ptr().cast(), errno.len());
            libc::_exit(127);
        }
    }
    let fork_err = (pid < 0).then(io::Error::last_os_error);
    // SAFETY: our copy of the write end; closing it lets the read see EOF.
    unsafe { libc::close(wr) };
    let result = match fork_err {
        Some(e) => Err(e),
        None => {
            let mut buf = [0u8; 4];
            let mut got = 0;
            while got < buf.len() {
                // SAFETY: reading into the unfilled tail of buf.
                let n = unsafe { libc::read(rd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
                if n > 0 {
                    got += n as usize;
                } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted
                {
                    break;
                }
            }
            // SAFETY: pid is our own unreaped child.
            unsafe {
                if got == 0 {
                    libc::kill(pid, libc::SIGKILL);
                }
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            if got == buf.len() {
                Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)))
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: the read end is ours and no longer used.
    unsafe { libc::close(rd) };
    result
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A TCP connect to 127.0.0.1:`port`.
fn connect(port: u16) -> io::Result<()> {
    TcpStream::connect_timeout(&loopback(port), CONNECT_TIMEOUT).map(drop)
}

/// A TCP bind of 127.0.0.1:`port` (0: an ephemeral port).
fn bind(port: u16) -> io::Result<()> {
    TcpListener::bind(loopback(port)).map(drop)
}

/// Forks idling children until `n` exist or fork fails; returns their pids and
/// the error that stopped it. They idle until the supervisor kills the cgroup.
pub fn fork_bomb(n: u32) -> (Vec<libc::pid_t>, Option<io::Error>) {
    let mut pids = Vec::new();
    for _ in 0..n {
        match procs::fork_idler() {
            Ok(pid) => pids.push(pid),
            Err(e) => return (pids, Some(e)),
        }
    }
    (pids, None)
}

/// `fork-bomb: stopped at K: <errno text>`, or `fork-bomb: forked N`.
pub fn fork_bomb_line(n: u32, (pids, err): &(Vec<libc::pid_t>, Option<io::Error>)) -> String {
    match err {
        Some(e) => format!("fork-bomb: stopped at {}: {e}", pids.len()),
        None => format!("fork-bomb: forked {n}"),
    }
}

/// Allocates and touches `mb` MiB, 1 MiB at a time, holding all of it until
/// done: `memory-hog: touched N MiB`, or `memory-hog: stopped at K MiB: <why>`
/// when an allocation is refused. Killed by the OOM killer, it reports nothing,
/// which is the expected outcome under `memory_max`: the supervisor records it.
fn memory_hog(mb: u64) -> String {
    let mut held: Vec<Vec<u8>> = Vec::new();
    for i in 0..mb {
        let mut chunk = Vec::new();
        if let Err(e) = chunk.try_reserve_exact(MIB) {
            return format!("memory-hog: stopped at {i} MiB: {e}");
        }
        // Non-zero, so every page is written and really backed by memory.
        chunk.resize(MIB, 0xa5);
        held.push(chunk);
    }
    std::hint::black_box(&held);
    format!("memory-hog: touched {mb} MiB")
}

/// `--write-bytes PATH=SIZE`: creates (or truncates) PATH and writes SIZE
/// bytes that are not zero (so nothing is sparse) in 64 KiB steps, with
/// `SIGXFSZ` ignored so that a file-size limit (`RLIMIT_FSIZE`) is reported
/// rather than fatal: `write-bytes PATH: wrote SIZE bytes`, or `write-bytes
/// PATH: stopped at N bytes: <errno text>` (`File too large` for `EFBIG`).
fn write_bytes(path: &Path, size: u64) -> String {
    // SAFETY: signal(2) with SIG_IGN; no handler runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let shown = path.display();
    let mut f = match File::create(path) {
        Ok(f) => f,
        Err(e) => return format!("write-bytes {shown}: {}", outcome(&Err(e))),
    };
    let chunk = vec![0xa5u8; 64 * 1024];
    let mut written = 0u64;
    while written < size {
        let n = (size - written).min(chunk.len() as u64) as usize;
        match f.write(&chunk[..n]) {
            Ok(0) => return format!("write-bytes {shown}: stopped at {written} bytes: wrote 0"),
            Ok(k) => written += k as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return format!("write-bytes {shown}: stopped at {written} bytes: {e}"),
        }
    }
    format!("write-bytes {shown}: wrote {written} bytes")
}

/// `caps: CapEff=… CapPrm=… CapBnd=… CapAmb=… NoNewPrivs=…` from the text of
/// `/proc/self/status` (`?` for a field it lacks), or how reading it failed.
pub fn caps_line(status: io::Result<String>) -> String {
    let text = match status {
        Ok(t) => t,
        Err(e) => return format!("caps: {}", outcome(&Err(e))),
    };
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .map_or("?", str::trim)
    };
    let fields: Vec<String> = ["CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs"]
        .iter()
        .map(|k| format!("{k}={}", field(k)))
        .collect();
    format!("caps: {}", fields.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn err(errno: i32) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(errno))
    }

    #[test]
    fn outcomes() {
        assert_eq!(outcome(&Ok(())), "ok");
        assert_eq!(outcome(&err(libc::EACCES)), "denied");
        assert_eq!(outcome(&err(libc::EPERM)), "denied");
        assert_eq!(
            outcome(&err(libc::ENOENT)),
            "error: No such file or directory (os error 2)"
        );
        assert_eq!(
            line("connect", &8080, err(libc::ECONNREFUSED)),
            "connect 8080: error: Connection refused (os error 111)"
        );
        assert_eq!(line("read", &"/x", err(libc::EACCES)), "read /x: denied");
    }

    #[test]
    fn caps_and_fork_bomb_lines() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t00000000000000ff\nCapEff:\t0000000000000001\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
        assert_eq!(
            caps_line(Ok(status.into())),
            "caps: CapEff=0000000000000001 CapPrm=00000000000000ff CapBnd=0000000000000000 CapAmb=0000000000000000 NoNewPrivs=1"
        );
        assert_eq!(
            caps_line(Ok("CapEff:\t0\n".into())),
            "caps: CapEff=0 CapPrm=? CapBnd=? CapAmb=? NoNewPrivs=?"
        );
        assert_eq!(
            caps_line(err(libc::EACCES).map(|()| String::new())),
            "caps: denied"
        );
        let stopped = (vec![1, 2], Some(io::Error::from_raw_os_error(libc::EAGAIN)));
        assert_eq!(
            fork_bomb_line(5, &stopped),
            "fork-bomb: stopped at 2: Resource temporarily unavailable (os error 11)"
        );
        assert_eq!(
            fork_bomb_line(3, &(vec![1, 2, 3], None)),
            "fork-bomb: forked 3"
        );
    }

    /// A scratch directory of this test run, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("brood-probe-{}-{name}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn probes_without_a_sandbox() {
        let d = scratch("plain");
        let f = d.join("f");
        assert_eq!(
            run(&Probe::Write(f.clone())),
            format!("write {}: ok", f.display())
        );
        assert_eq!(
            run(&Probe::Read(f.clone())),
            format!("read {}: ok", f.display())
        );
        assert_eq!(
            run(&Probe::Read(d.clone())),
            format!("read {}: ok", d.display())
        );
        let missing = d.join("missing");
        assert_eq!(
            run(&Probe::Read(missing.clone())),
            format!(
                "read {}: error: No such file or directory (os error 2)",
                missing.display()
            )
        );
        assert_eq!(run(&Probe::Exec("/bin/true".into())), "exec /bin/true: ok");
        // A file without execute permission: execve refuses it with EACCES.
        assert_eq!(
            run(&Probe::Exec(f.clone())),
            format!("exec {}: denied", f.display())
        );
        assert!(
            run(&Probe::Exec(missing.clone()))
                .ends_with("error: No such file or directory (os error 2)")
        );
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(run(&Probe::Connect(port)), format!("connect {port}: ok"));
        // The port is taken by `l`.
        assert_eq!(
            run(&Probe::Bind(port)),
            format!("bind {port}: error: Address already in use (os error 98)")
        );
        drop(l);
        assert_eq!(run(&Probe::Bind(0)), "bind 0: ok");
        assert_eq!(run(&Probe::MemoryHog(3)), "memory-hog: touched 3 MiB");
        let w = d.join("written");
        assert_eq!(
            run(&Probe::WriteBytes(w.clone(), 100_000)),
            format!("write-bytes {}: wrote 100000 bytes", w.display())
        );
        assert_eq!(fs::metadata(&w).unwrap().len(), 100_000);
        assert_eq!(
            run(&Probe::WriteBytes(missing.join("x"), 1)),
            format!(
                "write-bytes {}: error: No such file or directory (os error 2)",
                missing.join("x").display()
            )
        );
        assert!(run(&Probe::Caps).starts_with("caps: CapEff="));
        let (pids, e) = fork_bomb(3);
        assert_eq!(fork_bomb_line(3, &(pids.clone(), e)), "fork-bomb: forked 3");
        for pid in pids {
            // SAFETY: our own idling children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        fs::remove_dir_all(&d).unwrap();
    }

    /// Environment variable that turns [`probes_inside_landlock`] into the
    /// sandboxed child of itself; its value is the path to try writing.
    const CHILD: &str = "BROOD_TESTAGENT_PROBE_CHILD";

    /// landlock_create_ruleset(2) handling reads, writes, file creation and
    /// execution, and TCP bind and connect, with no rule at all; then
    /// no_new_privs and landlock_restrict_self(2) on the calling thread.
    fn deny_everything() -> io::Result<()> {
        #[repr(C)]
        struct Attr {
            handled_access_fs: u64,
            handled_access_net: u64,
        }
        // LANDLOCK_ACCESS_FS_{EXECUTE,WRITE_FILE,READ_FILE,READ_DIR,MAKE_REG}.
        let fs = 1 | 2 | 4 | 8 | (1 << 8);
        // LANDLOCK_ACCESS_NET_{BIND,CONNECT}_TCP (ABI 4).
        let attr = Attr {
            handled_access_fs: fs,
            handled_access_net: 1 | 2,
        };
        // SAFETY: attr is a valid landlock_ruleset_attr prefix of the given size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr,
                size_of::<Attr>(),
                0u32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: prctl and landlock_restrict_self with integer arguments.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_landlock_restrict_self, fd as i32, 0u32) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The probes report `denied` from inside a real landlock domain. The test
    /// runs itself again as a child process (a forked copy of the threaded test
    /// harness could not safely allocate), which restricts its own thread and
    /// prints one `PROBE|` line per probe.
    #[test]
    fn probes_inside_landlock() {
        let write = match std::env::var_os(CHILD) {
            Some(w) => PathBuf::from(w),
            None => std::env::temp_dir().join(format!("brood-probe-denied-{}", std::process::id())),
        };
        let probes = [
            Probe::Read("/etc/hostname".into()),
            Probe::Read("/".into()),
            Probe::Write(write.clone()),
            Probe::Exec("/bin/true".into()),
            Probe::Connect(9),
            Probe::Bind(0),
            Probe::Caps,
        ];
        if std::env::var_os(CHILD).is_some() {
            deny_everything().unwrap_or_else(|e| panic!("landlock (ABI 4 needed): {e}"));
            for p in &probes {
                println!("PROBE|{}", run(p));
            }
            return;
        }
        #[allow(clippy::disallowed_methods)] // a test re-running itself, not an agent
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "probe::tests::probes_inside_landlock",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, &write)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // The harness may print its own text on the same line before ours.
        let got: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once("PROBE|").map(|(_, p)| p))
            .collect();
        assert_eq!(
            got,
            [
                "read /etc/hostname: denied".to_owned(),
                "read /: denied".to_owned(),
                format!("write {}: denied", write.display()),
                "exec /bin/true: denied".to_owned(),
                "connect 9: denied".to_owned(),
                "bind 0: denied".to_owned(),
                "caps: denied".to_owned(),
            ],
            "{}\n{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!write.exists());
    }
}
