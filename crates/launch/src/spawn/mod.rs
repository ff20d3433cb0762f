//! The one path that starts agent processes.
//!
//! A [`Spawner`] owns a dedicated OS thread that lives as long as the supervisor.
//! Every agent is started from that thread, for two reasons the kernel imposes:
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
//! The child is made as posix_spawn(3) makes it: `clone(CLONE_VM | CLONE_VFORK)`,
//! so it shares the supervisor's memory on a stack of its own and the spawner
//! thread waits until it has exec'd or exited. A `fork` would copy the page
//! tables of the whole supervisor for a process that only makes a few syscalls,
//! and exec would tear them down again. Between clone and exec the child runs
//! only raw syscalls on memory the parent prepared (setpgid, a write of `0` into
//! its cgroup's `cgroup.procs` opened by the parent, prctl, getppid, dup2,
//! execve): no allocation, no lock, no glibc wrapper that acts on other threads
//! (setuid's broadcast would reach the supervisor's). So no code of the agent
//! ever runs outside its group.
//!
//! The agent's first input (its `init`) is written into its stdin before the
//! clone, as far as the pipe takes it without blocking, so the agent reads it as
//! soon as it starts instead of waiting for the supervisor to record the start. When the
//! spec carries a [`crate::sandbox::Prepared`], the child then drops its
//! capabilities, sets `no_new_privs` and enters the landlock domain prepared by the
//! parent, so no code of the agent ever runs outside its sandbox either.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::thread;

use crate::sandbox::{ChildPlan, ChildStep, Prepared};

mod child;
pub mod exits;
mod keeper;

use child::*;
use keeper::*;

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
    /// The veiled mount namespace where brood's machinery is covered
    /// (`crate::veil`), joined before `ns` and the sandbox. Shared by every
    /// launch while the veil's signature stays the same.
    pub veil: Option<std::sync::Arc<crate::veil::VeilNamespace>>,
    /// The agent's own view of the ctx tree, made in a mount namespace of
    /// its own after it joins the veil (`crate::veil::view`).
    pub view: Option<crate::veil::PreparedView>,
    /// Written to the child's stdin before it starts, as far as the socket takes
    /// it without blocking ([`Launched::stdin_written`] says how far).
    pub stdin_prelude: Vec<u8>,
    /// The agent's end of its door to the supervisor (a UNIX socket pair,
    /// docs/security.md): placed at [`DOOR_FD`] in the child, inherited by
    /// every process of the agent, the one way to its supervisor that needs
    /// no `socket(2)`.
    pub door: Option<OwnedFd>,
    /// `RLIMIT_FSIZE`, soft and hard, in bytes: no file the process or
    /// anything it starts writes grows past it (`write` gets `EFBIG`, and
    /// `SIGXFSZ` unless ignored). Set in the child before exec; lowering a
    /// limit needs no privilege and raising the hard one needs
    /// `CAP_SYS_RESOURCE`, which agents do not hold. `None`: inherited.
    pub file_size_max: Option<u64>,
}

/// Where the child finds its door (`BROOD_DOOR`).
pub const DOOR_FD: RawFd = 3;

/// How many extra `cgroup.procs` files a launch may join (one per v1 hierarchy).
pub const MAX_EXTRA_PROCS: usize = 8;

/// A started process. The caller owns its stdio and must reap `pid`: once
/// [`exits::watch`] says it exited (then `pidfd` may be dropped at once),
/// or once `pidfd` becomes readable, then `waitpid`.
#[derive(Debug)]
pub struct Launched {
    pub pid: i32,
    /// A pidfd taken while the child cannot yet have been reaped, so signals and
    /// waits through it never hit a recycled pid.
    pub pidfd: OwnedFd,
    /// One end of a stream socket pair whose other end is the child's
    /// stdin and stdout (descriptors 0 and 1): what is written here the
    /// child reads, what it writes is read here. Shutting down the writing
    /// side (`shutdown(2)` `SHUT_WR`) is the child's end of input. One
    /// descriptor in the supervisor for both, where two pipes took two.
    /// Non-blocking.
    pub stdio: OwnedFd,
    /// The read end of the child's stderr pipe.
    pub stderr: OwnedFd,
    /// How many bytes of [`LaunchSpec::stdin_prelude`] are already in the pipe;
    /// the rest is the caller's to write.
    pub stdin_written: usize,
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

/// What a launch runs on the spawner thread before the spawn: the spec, or
/// why there is none (a caller's preparation that failed).
type Prep = Box<dyn FnOnce() -> Result<LaunchSpec, LaunchError> + Send>;

enum Job {
    Launch(Prep, Reply),
    /// Only look whether the keeper is still there (the supervisor's tick).
    CheckKeeper,
}

/// A spawner thread whose keeper died hands its queue (and the job it was
/// about to run) to the minder, which starts the next spawner thread.
type Handover = (mpsc::Receiver<Job>, Option<Job>, mpsc::Sender<HandoverMsg>);
struct HandoverMsg(Handover);

/// What the spawner thread tells its handles about the keeper.
#[derive(Debug, Default)]
struct KeeperState {
    /// The keeper's pid now; 0 without a PID namespace.
    pid: AtomicI32,
    /// How many keepers were found dead and replaced.
    deaths: std::sync::atomic::AtomicU64,
}

/// The keeper's pid, readable from any thread ([`Spawner::keeper_watch`]).
#[derive(Clone)]
pub struct KeeperWatch(std::sync::Arc<KeeperState>);

impl KeeperWatch {
    /// The keeper's pid now, `None` without a PID namespace.
    pub fn pid(&self) -> Option<i32> {
        match self.0.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }
}

/// Handle to the spawner thread. Dropping every handle ends the thread, which (by
/// design) kills every agent it started.
#[derive(Clone)]
pub struct Spawner {
    tx: mpsc::Sender<Job>,
    containment: Containment,
    keeper: std::sync::Arc<KeeperState>,
}

impl Spawner {
    /// Starts the spawner thread and, when the kernel allows it, the keeper.
    /// `want_pid_namespace = false` forces the weaker containment (used by `doctor`
    /// comparisons and tests of the fallback).
    pub fn start(want_pid_namespace: bool) -> Result<Spawner, LaunchError> {
        raise_open_files();
        // Before the spawner thread exists: it may start no thread once it
        // made a PID namespace.
        exits::start();
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Containment>();
        let keeper = std::sync::Arc::new(KeeperState::default());
        let k = keeper.clone();
        // The minder starts replacement spawner threads: a thread that made a
        // PID namespace for its children can start no thread itself (clone(2)
        // refuses CLONE_THREAD when they differ). It holds no sender of its
        // own, so it ends with the last spawner thread.
        let (handover_tx, handover_rx) = mpsc::channel::<HandoverMsg>();
        let km = keeper.clone();
        thread::Builder::new()
            .name("brood-minder".into())
            .spawn(move || {
                while let Ok(HandoverMsg((rx, pending, handover))) = handover_rx.recv() {
                    let k = km.clone();
                    let started = thread::Builder::new()
                        .name("brood-spawner".into())
                        .spawn(move || spawner_thread(true, rx, None, k, pending, handover));
                    if started.is_err() {
                        // The queue went with the closure that could not run:
                        // later launches are told the spawner is gone.
                        km.pid.store(0, Ordering::Release);
                    }
                }
            })
            .map_err(LaunchError::Thread)?;
        thread::Builder::new()
            .name("brood-spawner".into())
            .spawn(move || {
                spawner_thread(want_pid_namespace, rx, Some(ready_tx), k, None, handover_tx)
            })
            .map_err(LaunchError::Thread)?;
        let containment = ready_rx.recv().map_err(|_| LaunchError::SpawnerGone)?;
        Ok(Spawner {
            tx,
            containment,
            keeper,
        })
    }

    /// The containment the spawner started with (a keeper that died and was
    /// replaced has another pid: [`Spawner::keeper_pid`]).
    pub fn containment(&self) -> &Containment {
        &self.containment
    }

    /// A handle that reads the keeper's pid from any thread, as
    /// [`Spawner::keeper_pid`] does (the keeper may be replaced).
    pub fn keeper_watch(&self) -> KeeperWatch {
        KeeperWatch(self.keeper.clone())
    }

    /// The keeper's pid now, `None` without a PID namespace.
    pub fn keeper_pid(&self) -> Option<i32> {
        match self.keeper.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// How many times the keeper was found dead (every agent in its namespace
    /// died with it, by the kernel's hand) and replaced.
    pub fn keeper_deaths(&self) -> u64 {
        self.keeper.deaths.load(Ordering::Acquire)
    }

    /// Asks the spawner thread to look at its keeper now (it also does before
    /// every launch); a dead one is replaced.
    pub fn check_keeper(&self) {
        let _ = self.tx.send(Job::CheckKeeper);
    }

    /// Starts a process on the spawner thread; `done` is called there with the
    /// outcome (keep it short: it blocks the next launch).
    pub fn launch(
        &self,
        spec: LaunchSpec,
        done: impl FnOnce(Result<Launched, LaunchError>) + Send + 'static,
    ) {
        self.launch_prepared(move || Ok(spec), done);
    }

    /// [`Spawner::launch`] with the spec made on the spawner thread by `prep`,
    /// right before the spawn: a caller's file work (cgroups, files, sandbox
    /// preparation) then happens off its own thread without a second hop.
    /// An `Err` from `prep` is handed to `done` as the outcome.
    pub fn launch_prepared(
        &self,
        prep: impl FnOnce() -> Result<LaunchSpec, LaunchError> + Send + 'static,
        done: impl FnOnce(Result<Launched, LaunchError>) + Send + 'static,
    ) {
        if let Err(mpsc::SendError(Job::Launch(_, reply))) =
            self.tx.send(Job::Launch(Box::new(prep), Box::new(done)))
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

fn spawner_thread(
    want_ns: bool,
    rx: mpsc::Receiver<Job>,
    ready: Option<mpsc::Sender<Containment>>,
    keeper: std::sync::Arc<KeeperState>,
    mut pending: Option<Job>,
    handover: mpsc::Sender<HandoverMsg>,
) {
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
    let keeper_pid = match containment {
        Containment::PidNamespace { keeper_pid } => keeper_pid,
        Containment::Pdeathsig { .. } => 0,
    };
    keeper.pid.store(keeper_pid, Ordering::Release);
    if keeper_pid == 0 {
        // Orphaned grandchildren then come to the supervisor instead of the host's
        // init, so they stay inside brood's accounting (prctl(2) PR_SET_CHILD_SUBREAPER).
        // SAFETY: plain prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    let in_ns = keeper_pid != 0;
    // SAFETY: getpid has no preconditions.
    let supervisor_pid = unsafe { libc::getpid() };
    if let Some(ready) = ready
        && ready.send(containment).is_err()
    {
        return;
    }
    // One stack for every child: a child has exec'd or exited before the next
    // clone (CLONE_VFORK).
    let stack = ChildStack::new();
    loop {
        let job = match pending.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        if in_ns && keeper_gone(keeper_pid) {
            hand_over(&keeper, keeper_pid, &handover, rx, job);
            return;
        }
        match job {
            Job::CheckKeeper => {}
            Job::Launch(prep, reply) => match (prep(), &stack) {
                (Err(e), _) => reply(Err(e)),
                (Ok(spec), Ok(stack)) => {
                    let launched = launch_here(&spec, in_ns, supervisor_pid, stack);
                    // The keeper was killed between the look above and the
                    // clone: the namespace refused the child with ENOMEM
                    // (alloc_pid of a namespace whose init is exiting). The
                    // same spec starts in the next namespace instead.
                    if in_ns
                        && matches!(&launched, Err(LaunchError::Spawn { source, .. })
                            if source.kind() == io::ErrorKind::OutOfMemory)
                        && keeper_gone(keeper_pid)
                    {
                        let again: Prep = Box::new(move || Ok(spec));
                        hand_over(
                            &keeper,
                            keeper_pid,
                            &handover,
                            rx,
                            Job::Launch(again, reply),
                        );
                        return;
                    }
                    reply(launched)
                }
                (Ok(spec), Err(e)) => reply(Err(LaunchError::Spawn {
                    program: spec.argv.first().cloned().unwrap_or_default(),
                    source: context(
                        "mapping the child stack",
                        io::Error::new(e.kind(), e.to_string()),
                    ),
                })),
            },
        }
    }
}

/// The kernel killed every process of the namespace with its init, and a
/// namespace without an init takes no new process. This thread cannot make
/// another (unshare(2) refuses a second CLONE_NEWPID), so a new thread takes
/// over the queue and `job` with a new keeper in a new namespace, and this one
/// ends: every agent it started is gone already.
fn hand_over(
    keeper: &KeeperState,
    keeper_pid: i32,
    handover: &mpsc::Sender<HandoverMsg>,
    rx: mpsc::Receiver<Job>,
    job: Job,
) {
    keeper.deaths.fetch_add(1, Ordering::AcqRel);
    keeper.pid.store(0, Ordering::Release);
    let again = handover.clone();
    if let Err(mpsc::SendError(HandoverMsg((_, Some(Job::Launch(_, reply)), _)))) =
        handover.send(HandoverMsg((rx, Some(job), again)))
    {
        reply(Err(LaunchError::SpawnerGone));
    }
    // An init that is still exiting waits for the rest of its namespace to be
    // reaped; reap it once it is done, or leave it to the host if it stalls.
    for _ in 0..1000 {
        if reaped(keeper_pid) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn launch_here(
    spec: &LaunchSpec,
    in_ns: bool,
    supervisor_pid: i32,
    stack: &ChildStack,
) -> Result<Launched, LaunchError> {
    let program = spec.argv.first().cloned().unwrap_or_default();
    let Some((prog, _)) = spec.argv.split_first() else {
        return Err(LaunchError::EmptyArgv { program });
    };
    let fail = |source: io::Error| LaunchError::Spawn {
        program: program.clone(),
        source,
    };
    if spec.extra_procs.len() > MAX_EXTRA_PROCS {
        return Err(fail(io::Error::other(format!(
            "{} extra cgroup.procs files (at most {MAX_EXTRA_PROCS})",
            spec.extra_procs.len()
        ))));
    }
    // Everything the child reads is made here: it may not allocate.
    let nul = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} holds a NUL byte"),
        )
    };
    let path = CString::new(resolve(prog, &spec.env).into_os_string().into_vec())
        .map_err(|_| fail(nul("the program path")))?;
    let argv = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| fail(nul("an argument")))?;
    let env = spec
        .env
        .iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| fail(nul("an environment variable")))?;
    let cwd = spec
        .cwd
        .as_ref()
        .map(|c| CString::new(c.as_os_str().as_bytes()))
        .transpose()
        .map_err(|_| fail(nul("the working directory")))?;
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let env_ptrs: Vec<*const libc::c_char> = env
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let (ours, theirs) =
        stdio_socket().map_err(|e| fail(context("stdin and stdout socket pair", e)))?;
    let (err_rd, err_wr) = stdio_pipe().map_err(|e| fail(context("stderr pipe", e)))?;
    // The first bytes the agent reads (its init) are in the socket before it
    // starts, so it never waits for the supervisor after exec. Without blocking:
    // what does not fit in the socket now is the caller's to send (`stdin_written`).
    let stdin_written = write_nonblocking(&ours, &spec.stdin_prelude)
        .map_err(|e| fail(context("writing the agent's first input", e)))?;
    let mut extra = [-1 as RawFd; MAX_EXTRA_PROCS];
    for (slot, f) in extra.iter_mut().zip(&spec.extra_procs) {
        *slot = f.as_raw_fd();
    }
    // With a sandbox, a close-on-exec pipe on which the child names the step that
    // failed (the spawn error itself only carries an errno).
    let report = match &spec.sandbox {
        Some(_) => {
            Some(report_pipe().map_err(|e| fail(context("sandbox: creating the report pipe", e)))?)
        }
        None => None,
    };
    let plan: Option<ChildPlan> = match (&spec.sandbox, &report) {
        (Some(sb), Some((_, wr))) => Some(sb.child_plan(wr.as_raw_fd())),
        _ => None,
    };
    let child = Child {
        path: path.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: env_ptrs.as_ptr(),
        cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        stdio: [theirs.as_raw_fd(), theirs.as_raw_fd(), err_wr.as_raw_fd()],
        procs_fd: spec
            .cgroup_procs
            .as_ref()
            .map(|f| f.as_raw_fd())
            .unwrap_or(-1),
        extra,
        in_ns,
        supervisor_pid,
        ns: spec.ns.as_ref().map(|n| n.for_child()),
        veil: spec
            .veil
            .as_ref()
            .map_or(std::ptr::null(), std::sync::Arc::as_ptr),
        plan,
        door: spec.door.as_ref().map_or(-1, |d| d.as_raw_fd()),
        open_files: started_open_files(),
        file_size: spec
            .file_size_max
            .map(|n| child::KernelRlimit { cur: n, max: n }),
        view: spec
            .view
            .as_ref()
            .map_or(std::ptr::null(), |v| v as *const crate::veil::PreparedView),
        errno: AtomicI32::new(0),
        at_exec: std::sync::atomic::AtomicBool::new(false),
    };
    let (pid, pidfd) = clone_child(&child, stack).map_err(|e| fail(context("clone", e)))?;
    // The child's ends are its own now (or it is gone).
    drop((theirs, err_wr));
    let errno = child.errno.load(Ordering::Acquire);
    let failed = if errno != 0 {
        Some(io::Error::from_raw_os_error(errno))
    } else if !child.at_exec.load(Ordering::Acquire) {
        // Gone before exec without an errno: killed by a signal on the way.
        Some(io::Error::other("the child died before it could exec"))
    } else {
        None
    };
    if let Some(err) = failed {
        // It exited before exec: reap it now, it will not be reported.
        kill_and_reap(pid);
        drop(pidfd);
        // The namespace layers record which of their steps failed; the
        // sandbox's steps report through the pipe.
        let named = spec
            .veil
            .as_ref()
            .and_then(|v| v.child_failure())
            .map(|e| io::Error::new(err.kind(), e.to_string()))
            .or_else(|| {
                spec.view
                    .as_ref()
                    .and_then(|v| v.child_failure())
                    .map(|e| io::Error::new(err.kind(), e.to_string()))
            })
            .or_else(|| {
                spec.ns
                    .as_ref()
                    .and_then(|n| n.child_failure())
                    .map(|e| io::Error::new(err.kind(), e.to_string()))
            });
        return Err(fail(match (named, report) {
            (Some(e), _) => e,
            (None, Some((rd, wr))) => {
                drop(wr);
                name_failed_step(&rd, err)
            }
            (None, None) => err,
        }));
    }
    Ok(Launched {
        pid,
        pidfd,
        stdio: ours,
        stderr: err_rd,
        stdin_written,
    })
}

fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A close-on-exec pipe for a child's stdio: (read end, write end), both >= 3 so
/// the child's dup2 onto 0, 1 and 2 cannot clobber one of them.
fn stdio_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors owned by nobody else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(rd)?, above_stdio(wr)?))
}

/// `RLIMIT_NOFILE` as the process had it before [`raise_open_files`]
/// raised it, once it has.
static STARTED_OPEN_FILES: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();

/// Raises this process's soft limit of open descriptors to its hard limit,
/// once. The supervisor holds a few descriptors for every live agent (its
/// stdio, its door, its socket, its pidfd: `brood bench memory`), so the
/// usual soft limit of 1,024 would refuse new agents at about 200 live
/// ones, where the hard limit (often 524,288) would not. Each agent gets
/// the limit the process was started with back before exec
/// ([`started_open_files`]).
pub fn raise_open_files() {
    STARTED_OPEN_FILES.get_or_init(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2)/setrlimit(2) on a struct we own.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
                return None;
            }
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return None;
            }
        }
        Some((lim.rlim_cur, lim.rlim_max))
    });
}

/// The limit to give a child back: the one the process started with, if
/// [`raise_open_files`] raised it.
fn started_open_files() -> Option<child::KernelRlimit> {
    STARTED_OPEN_FILES
        .get()
        .copied()
        .flatten()
        .map(|(cur, max)| child::KernelRlimit { cur, max })
}

/// A close-on-exec stream socket pair for a child's stdin and stdout: (the
/// supervisor's end, the child's end), both >= 3 like [`stdio_pipe`]'s.
fn stdio_socket() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors owned by nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(ours)?, above_stdio(theirs)?))
}

/// `fd` itself when it is >= 3, else a close-on-exec copy that is (a supervisor
/// started with a closed stdio gets its pipes at 0, 1 or 2).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= 3 {
        return Ok(fd);
    }
    // SAFETY: fcntl(2) F_DUPFD_CLOEXEC on a descriptor we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Writes as much of `bytes` as the pipe takes now, leaving `fd` non-blocking
/// (the supervisor's async writer wants it so anyway); the count written.
fn write_nonblocking(fd: &OwnedFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: fcntl(2) on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let mut done = 0;
    while done < bytes.len() {
        let rest = &bytes[done..];
        // SAFETY: a write from a live slice to a descriptor we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => break,
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        done += n.unsigned_abs();
    }
    Ok(done)
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
