//! The one path that starts agent processes.
//!
//! A [`Spawner`] owns a dedicated OS thread that lives as long as the supervisor.
//! Every agent is forked from that thread, for two reasons the kernel imposes:
//!
//! * `PR_SET_PDEATHSIG` fires when the parent *thread* exits (prctl(2)), so the
//!   thread that forks must outlive every agent; tokio's blocking threads retire
//!   after ten idle seconds and would kill agents at random.
//! * The thread calls `unshare(CLONE_NEWPID)` once (unshare(2)), so every process it
//!   forks afterwards lands in one PID namespace whose first process, the *keeper*,
//!   is forked right after. The keeper is that namespace's init: it reaps orphans,
//!   and when it dies (it carries `PR_SET_PDEATHSIG=SIGKILL` tied to the same
//!   thread) the kernel SIGKILLs every process left in the namespace
//!   (pid_namespaces(7)). That is how every agent, grandchild and `setsid`'d daemon
//!   dies within moments of the supervisor's death, with no restart needed and no
//!   extra exec per agent.
//!
//! Between `fork` and `exec` the child runs only async-signal-safe raw syscalls
//! (setpgid, a write of `0` into its cgroup's `cgroup.procs` opened by the parent,
//! prctl, getppid), so no code of the agent ever runs outside its group. When the
//! spec carries a [`crate::sandbox::Prepared`], the child then drops its
//! capabilities, sets `no_new_privs` and enters the landlock domain prepared by the
//! parent, so no code of the agent ever runs outside its sandbox either.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;

use crate::sandbox::{ChildPlan, ChildStep, Prepared};

/// What to start.
#[derive(Debug)]
pub struct LaunchSpec {
    /// Program and arguments; `argv[0]` is looked up in the `PATH` of `env`.
    pub argv: Vec<OsString>,
    /// The complete environment (built with [`crate::env::build`]); nothing is inherited.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: Option<PathBuf>,
    /// `cgroup.procs` of the agent's group, opened for writing by the caller.
    /// `None` only when the host has no usable cgroups (weaker containment).
    pub cgroup_procs: Option<File>,
    /// Kernel enforcement applied in the child before exec (capabilities,
    /// `no_new_privs`, landlock), built by [`crate::sandbox::prepare`]; `None`
    /// starts the process with the supervisor's own rights.
    pub sandbox: Option<Prepared>,
    /// More `cgroup.procs` files to join before exec: the v1 mirrors that carry the
    /// limits on a hybrid host (`Cgroups::set_limits`). At most [`MAX_EXTRA_PROCS`].
    pub extra_procs: Vec<File>,
    /// A private mount (and network) namespace, for `iso = ns` (`crate::ns`).
    pub ns: Option<crate::ns::PreparedNs>,
}

/// How many extra `cgroup.procs` files a launch may join (one per v1 hierarchy).
pub const MAX_EXTRA_PROCS: usize = 8;

/// A started process. The caller owns the pipes and must reap `pid`
/// (wait for `pidfd` to become readable, then `waitpid`).
#[derive(Debug)]
pub struct Launched {
    pub pid: i32,
    /// A pidfd taken while the child cannot yet have been reaped, so signals and
    /// waits through it never hit a recycled pid.
    pub pidfd: OwnedFd,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("could not start {program:?}: {source}")]
    Spawn {
        program: OsString,
        #[source]
        source: io::Error,
    },
    #[error("could not start {program:?}: empty argv")]
    EmptyArgv { program: OsString },
    #[error("pidfd_open({pid}): {source}")]
    Pidfd {
        pid: i32,
        #[source]
        source: io::Error,
    },
    #[error("the spawner thread is gone (the supervisor is shutting down)")]
    SpawnerGone,
    #[error("starting the spawner thread: {0}")]
    Thread(#[source] io::Error),
}

/// How processes are contained against the supervisor's own death.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Containment {
    /// Agents live in a PID namespace whose init (the keeper) dies with the
    /// supervisor; the kernel then kills everything in it.
    PidNamespace { keeper_pid: i32 },
    /// No PID namespace could be made: each agent gets `PR_SET_PDEATHSIG` only, the
    /// supervisor is a subreaper, and a process that escaped its process group can
    /// outlive a supervisor killed with SIGKILL until the next start reaps its cgroup.
    Pdeathsig { why: String },
}

impl Containment {
    pub fn describe(&self) -> String {
        match self {
            Containment::PidNamespace { keeper_pid } => {
                format!(
                    "PID namespace with a keeper init (pid {keeper_pid}) tied to the supervisor"
                )
            }
            Containment::Pdeathsig { why } => {
                format!("PR_SET_PDEATHSIG and a subreaper only (no PID namespace: {why})")
            }
        }
    }
}

type Reply = Box<dyn FnOnce(Result<Launched, LaunchError>) + Send>;

enum Job {
    Launch(Box<LaunchSpec>, Reply),
}

/// Handle to the spawner thread. Dropping every handle ends the thread, which (by
/// design) kills every agent it started.
#[derive(Clone)]
pub struct Spawner {
    tx: mpsc::Sender<Job>,
    containment: Containment,
}

impl Spawner {
    /// Starts the spawner thread and, when the kernel allows it, the keeper.
    /// `want_pid_namespace = false` forces the weaker containment (used by `doctor`
    /// comparisons and tests of the fallback).
    pub fn start(want_pid_namespace: bool) -> Result<Spawner, LaunchError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Containment>();
        thread::Builder::new()
            .name("brood-spawner".into())
            .spawn(move || spawner_thread(want_pid_namespace, rx, ready_tx))
            .map_err(LaunchError::Thread)?;
        let containment = ready_rx.recv().map_err(|_| LaunchError::SpawnerGone)?;
        Ok(Spawner { tx, containment })
    }

    pub fn containment(&self) -> &Containment {
        &self.containment
    }

    /// Starts a process on the spawner thread; `done` is called there with the
    /// outcome (keep it short: it blocks the next launch).
    pub fn launch(
        &self,
        spec: LaunchSpec,
        done: impl FnOnce(Result<Launched, LaunchError>) + Send + 'static,
    ) {
        if let Err(mpsc::SendError(Job::Launch(_, reply))) =
            self.tx.send(Job::Launch(Box::new(spec), Box::new(done)))
        {
            reply(Err(LaunchError::SpawnerGone));
        }
    }

    /// The same, waiting for the outcome on the calling thread.
    pub fn launch_blocking(&self, spec: LaunchSpec) -> Result<Launched, LaunchError> {
        let (tx, rx) = mpsc::channel();
        self.launch(spec, move |r| {
            let _ = tx.send(r);
        });
        rx.recv().map_err(|_| LaunchError::SpawnerGone)?
    }
}

fn spawner_thread(want_ns: bool, rx: mpsc::Receiver<Job>, ready: mpsc::Sender<Containment>) {
    // Held for exactly the life of this thread: the keeper watches it (see keeper_main).
    let mut _keeper_pipe: Option<OwnedFd> = None;
    let containment = if want_ns {
        match start_keeper() {
            Ok((pid, pipe)) => {
                _keeper_pipe = Some(pipe);
                Containment::PidNamespace { keeper_pid: pid }
            }
            Err(e) => Containment::Pdeathsig { why: e.to_string() },
        }
    } else {
        Containment::Pdeathsig {
            why: "disabled by configuration".into(),
        }
    };
    if matches!(containment, Containment::Pdeathsig { .. }) {
        // Orphaned grandchildren then come to the supervisor instead of the host's
        // init, so they stay inside brood's accounting (prctl(2) PR_SET_CHILD_SUBREAPER).
        // SAFETY: plain prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    let in_ns = matches!(containment, Containment::PidNamespace { .. });
    // SAFETY: getpid has no preconditions.
    let supervisor_pid = unsafe { libc::getpid() };
    if ready.send(containment).is_err() {
        return;
    }
    while let Ok(job) = rx.recv() {
        match job {
            Job::Launch(spec, reply) => reply(launch_here(*spec, in_ns, supervisor_pid)),
        }
    }
}

/// Creates the PID namespace for this thread's future children and forks its init.
fn start_keeper() -> io::Result<(i32, OwnedFd)> {
    // SAFETY: unshare with a flag that only affects this thread's future children.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // A pipe lets the keeper notice a spawner thread (or supervisor) that ended
    // before the keeper could arm PR_SET_PDEATHSIG (getppid() is 0 across the
    // namespace border, so it cannot tell us). The spawner thread holds the write
    // end for exactly its own life.
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: after fork the child runs only keeper_main, which makes raw syscalls.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: we are the freshly forked keeper; never returns.
        unsafe { keeper_main(rd, wr) }
    }
    // SAFETY: closing our copy of the read end; `wr` is a fresh descriptor we own.
    unsafe { libc::close(rd) };
    // SAFETY: see above.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(wr) }))
}

/// PID 1 of the agents' namespace: reap every orphan, forever.
///
/// # Safety
/// Must be called only in a freshly forked child; uses only async-signal-safe calls.
unsafe fn keeper_main(rd: RawFd, wr: RawFd) -> ! {
    // SAFETY (whole body): raw syscalls on values we own, in a single-threaded child.
    unsafe {
        libc::close(wr);
        // Hold nothing of the supervisor's: every descriptor but the pipe goes
        // (close_range(2)), so no pipe or socket stays open through the keeper.
        if rd > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (rd - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (rd + 1) as u32, u32::MAX, 0u32);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let mut pfd = libc::pollfd {
            fd: rd,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & (libc::POLLHUP | libc::POLLIN) != 0 {
            libc::_exit(0);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut status = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&set, &mut info);
        }
    }
}

fn launch_here(
    spec: LaunchSpec,
    in_ns: bool,
    supervisor_pid: i32,
) -> Result<Launched, LaunchError> {
    let program = spec.argv.first().cloned().unwrap_or_default();
    let Some((prog, args)) = spec.argv.split_first() else {
        return Err(LaunchError::EmptyArgv { program });
    };
    // The only Command::new in brood (clippy.toml forbids it elsewhere).
    #[allow(clippy::disallowed_methods)]
    let mut cmd = std::process::Command::new(resolve(prog, &spec.env));
    cmd.arg0(prog)
        .args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    let procs_fd = spec
        .cgroup_procs
        .as_ref()
        .map(|f| f.as_raw_fd())
        .unwrap_or(-1);
    if spec.extra_procs.len() > MAX_EXTRA_PROCS {
        return Err(LaunchError::Spawn {
            program: program.clone(),
            source: io::Error::other(format!(
                "{} extra cgroup.procs files (at most {MAX_EXTRA_PROCS})",
                spec.extra_procs.len()
            )),
        });
    }
    // A fixed array the child can read without allocating.
    let mut extra = [-1 as RawFd; MAX_EXTRA_PROCS];
    for (slot, f) in extra.iter_mut().zip(&spec.extra_procs) {
        *slot = f.as_raw_fd();
    }
    let ns = spec.ns.as_ref().map(|n| n.for_child());
    // With a sandbox, a close-on-exec pipe on which the child names the step that
    // failed (the spawn error itself only carries an errno).
    let report = match &spec.sandbox {
        Some(_) => Some(report_pipe().map_err(|source| LaunchError::Spawn {
            program: program.clone(),
            source: io::Error::new(
                source.kind(),
                format!("sandbox: creating the report pipe: {source}"),
            ),
        })?),
        None => None,
    };
    let plan: Option<ChildPlan> = match (&spec.sandbox, &report) {
        (Some(sb), Some((_, wr))) => Some(sb.child_plan(wr.as_raw_fd())),
        _ => None,
    };
    // SAFETY: the closure makes only async-signal-safe syscalls on values captured
    // by copy; see the module docs. The fds in `plan` stay open in `spec` and
    // `report` until spawn returns.
    unsafe {
        cmd.pre_exec(move || child_setup(procs_fd, extra, in_ns, supervisor_pid, ns, plan));
    }
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: program.clone(),
        source: match report {
            Some((rd, wr)) => {
                drop(wr);
                name_failed_step(&rd, source)
            }
            None => source,
        },
    })?;
    let pid = child.id() as i32;
    // The child is ours and unreaped, so this pid cannot have been recycled yet.
    // SAFETY: pidfd_open(2) with a pid we own.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    let take = |o: Option<OwnedFd>| o.ok_or_else(|| io::Error::other("pipe missing"));
    let pipes = (|| -> io::Result<(OwnedFd, OwnedFd, OwnedFd)> {
        Ok((
            take(child.stdin.take().map(OwnedFd::from))?,
            take(child.stdout.take().map(OwnedFd::from))?,
            take(child.stderr.take().map(OwnedFd::from))?,
        ))
    })();
    if raw < 0 {
        let source = io::Error::last_os_error();
        kill_and_reap(pid);
        return Err(LaunchError::Pidfd { pid, source });
    }
    // SAFETY: raw is a fresh descriptor returned by the kernel and owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (stdin, stdout, stderr) = pipes.map_err(|source| {
        kill_and_reap(pid);
        LaunchError::Spawn {
            program: program.clone(),
            source,
        }
    })?;
    Ok(Launched {
        pid,
        pidfd,
        stdin,
        stdout,
        stderr,
    })
}

fn kill_and_reap(pid: i32) {
    // SAFETY: pid is our unreaped child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// A non-blocking, close-on-exec pipe (pipe2(2)): (read end, write end).
fn report_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Adds the sandbox step the child reported (if any) to a spawn error.
fn name_failed_step(rd: &OwnedFd, err: io::Error) -> io::Error {
    let mut b = [0u8; 1];
    // SAFETY: a one-byte read into a stack buffer from a non-blocking pipe we own.
    let n = unsafe { libc::read(rd.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
    match (n, ChildStep::from_u8(b[0])) {
        (1, Some(step)) => io::Error::new(
            err.kind(),
            format!(
                "sandbox layer {} failed before exec: {err}",
                step.describe()
            ),
        ),
        _ => err,
    }
}

/// Runs in the child between fork and exec.
fn child_setup(
    procs_fd: RawFd,
    extra_procs: [RawFd; MAX_EXTRA_PROCS],
    in_ns: bool,
    supervisor_pid: i32,
    ns: Option<crate::ns::ChildNs>,
    sandbox: Option<ChildPlan>,
) -> io::Result<()> {
    // SAFETY: raw syscalls only (async-signal-safe), on descriptors that stay open
    // in the parent until spawn returns.
    unsafe {
        // Its own process group, so a terminal's signals and killpg address it alone.
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if procs_fd >= 0 {
            // cgroup v2 "cgroup.procs": writing 0 moves the writing process.
            let zero = b"0";
            if libc::write(procs_fd, zero.as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        // The v1 groups that hold the limits (hybrid hosts), before any code of
        // the agent runs, so no allocation escapes them.
        for fd in extra_procs {
            if fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Close the race with a supervisor that died before the prctl: across the
        // namespace border getppid() is 0 while our parent lives; after its death we
        // would have been re-parented to the keeper (1) or to a host reaper.
        let ppid = libc::getppid();
        let parent_alive = if in_ns {
            ppid == 0
        } else {
            ppid == supervisor_pid
        };
        if !parent_alive {
            libc::_exit(137);
        }
        // The private mount/network namespace needs CAP_SYS_ADMIN, so it comes
        // before the sandbox drops capabilities (crate::ns documents the order).
        if let Some(ns) = ns {
            ns.apply()?;
        }
        // Last, so the steps above still run with the supervisor's rights; none of
        // the sandbox's credential changes clears PR_SET_PDEATHSIG (see
        // ChildPlan::apply).
        if let Some(plan) = sandbox {
            plan.apply()?;
        }
    }
    Ok(())
}

/// Finds `prog` in the agent's own `PATH` (not the supervisor's), as execvp would.
fn resolve(prog: &OsString, env: &[(OsString, OsString)]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let p = PathBuf::from(prog);
    if prog.as_bytes().contains(&b'/') {
        return p;
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(&p);
        if let Ok(md) = std::fs::metadata(&cand) {
            use std::os::unix::fs::PermissionsExt;
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return cand;
            }
        }
    }
    p
}
