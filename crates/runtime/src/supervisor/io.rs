//! One IO task per agent process: stdout (protocol frames or exec output), stderr
//! (the agent's log), the exit, and a writer for stdin. stdin and stdout are
//! one socket (the launcher's `Launched::stdio`). The exit is told by the
//! launcher's ring (`brood_launch::spawn::exits`: no descriptor an agent),
//! or, where the kernel has none, by the agent's pidfd.
//!
//! When the exit is told, the task first drains whatever the
//! process wrote before exiting (a `done` line is usually still in the socket), then
//! reaps it and reports `Exited` last, so the dispatcher always sees an agent's
//! final words before its death. It does not wait for end of file on stdout: a
//! grandchild that inherited the pipe could hold it open forever.

use std::os::fd::{AsRawFd, OwnedFd};

use brood_core::{AgentName, RunId};
use brood_launch::Launched;
use brood_proto::{Decoded, Frame, Framer, LineError, LineErrorKind};
use brood_store::Protocol;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

use super::{AgentEv, Cmd};

pub(crate) fn start(
    name: AgentName,
    run: RunId,
    protocol: Protocol,
    p: Launched,
    stdin_rx: mpsc::UnboundedReceiver<Vec<u8>>,
    tx: mpsc::UnboundedSender<Cmd>,
) {
    let Launched {
        pid,
        pidfd,
        stdio,
        stderr,
        stdin_written: _,
    } = p;
    // One socket is the agent's stdin and stdout: its writing half takes
    // what the supervisor sends (dropped, it is the agent's end of input),
    // its reading half what the agent writes.
    let stdio = UnixStream::from_std(std::os::unix::net::UnixStream::from(stdio));
    let exit = match brood_launch::spawn::exits::available() {
        true => {
            let (tx, rx) = oneshot::channel();
            let watched = brood_launch::spawn::exits::watch(pid, move || {
                let _ = tx.send(());
            });
            match watched {
                Ok(()) => {
                    drop(pidfd);
                    Ok(Exit::Told(Some(rx)))
                }
                Err(_) => Exit::pidfd(pidfd),
            }
        }
        false => Exit::pidfd(pidfd),
    };
    tokio::spawn(async move {
        let io = stdio
            .and_then(|s| exit.map(|exit| (s, exit)))
            .map(|(s, exit)| {
                let (out, w) = s.into_split();
                tokio::spawn(write_stdin(w, stdin_rx));
                (out, exit)
            });
        let read = match io {
            Ok((out, exit)) => read_loop(&name, &run, protocol, pid, exit, out, stderr, &tx).await,
            Err(e) => Err(e),
        };
        if let Err(e) = read {
            tracing::error!(agent = %name, error = %e, "agent IO failed; reaping");
            let status = reap_blocking(pid);
            let _ = tx.send(Cmd::Agent(name, run, AgentEv::Exited { status }));
        }
    });
}

async fn write_stdin(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(buf) = rx.recv().await {
        if w.write_all(&buf).await.is_err() {
            // The agent closed its stdin or died; its exit is reported elsewhere.
            break;
        }
    }
}

struct Reader<'a> {
    name: &'a AgentName,
    run: &'a RunId,
    protocol: Protocol,
    framer: Framer,
    frames: Vec<Frame>,
    broken: bool,
    tx: &'a mpsc::UnboundedSender<Cmd>,
}

impl Reader<'_> {
    fn send(&self, e: AgentEv) {
        let _ = self
            .tx
            .send(Cmd::Agent(self.name.clone(), self.run.clone(), e));
    }

    fn stderr(&self, bytes: &[u8]) {
        self.send(AgentEv::Stderr(String::from_utf8_lossy(bytes).into_owned()));
    }

    fn stdout(&mut self, bytes: &[u8], eof: bool) {
        if self.protocol == Protocol::Exec {
            if !bytes.is_empty() {
                self.send(AgentEv::ExecOut(bytes.to_vec()));
            }
            return;
        }
        self.framer.push(bytes, &mut self.frames);
        if eof {
            self.framer.finish(&mut self.frames);
        }
        let frames = std::mem::take(&mut self.frames);
        for f in frames {
            if self.broken {
                // After the first protocol error the run is failing; the rest of the
                // stream is not interpreted.
                break;
            }
            match f {
                Frame::Line { no, bytes } => match brood_proto::decode_line(no, &bytes) {
                    Ok(Some(Decoded::Msg(m))) => self.send(AgentEv::Msg(m)),
                    Ok(Some(Decoded::Unknown { type_name })) => {
                        self.send(AgentEv::Unknown(type_name))
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.broken = true;
                        self.send(AgentEv::Bad(e));
                    }
                },
                Frame::TooLong { no, len_so_far } => {
                    self.broken = true;
                    self.send(AgentEv::Bad(LineError {
                        line: no,
                        kind: LineErrorKind::TooLong { len: len_so_far },
                    }));
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    name: &AgentName,
    run: &RunId,
    protocol: Protocol,
    pid: i32,
    mut exit: Exit,
    out: OwnedReadHalf,
    stderr: OwnedFd,
    tx: &mpsc::UnboundedSender<Cmd>,
) -> std::io::Result<()> {
    let err = pipe::Receiver::from_owned_fd(stderr)?;
    let mut r = Reader {
        name,
        run,
        protocol,
        framer: Framer::new(),
        frames: Vec::new(),
        broken: false,
        tx,
    };
    let (mut out_open, mut err_open) = (true, true);
    loop {
        tokio::select! {
            ready = out.readable(), if out_open => {
                match ready.and_then(|()| read_now(|b| out.try_read(b), OUT_READ, |b| r.stdout(b, false))) {
                    Ok(0) => { out_open = false; r.stdout(&[], true); }
                    Ok(_) => {}
                    // Woken without data (readiness is cleared): wait again.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => { out_open = false; r.stdout(&[], true); }
                }
            }
            ready = err.readable(), if err_open => {
                match ready.and_then(|()| read_now(|b| err.try_read(b), ERR_READ, |b| r.stderr(b))) {
                    Ok(0) => err_open = false,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => err_open = false,
                }
            }
            told = exit.told() => {
                told?;
                // Everything written before the exit is in the socket and the
                // pipe now. Read by the descriptor itself: tokio's `try_read`
                // answers from the readiness its reactor last saw, and the
                // ring's word (from another thread) can come before the
                // reactor has seen the last bytes arrive.
                if out_open {
                    loop {
                        match read_now(|b| read_fd(out.as_ref().as_raw_fd(), b), OUT_READ, |b| r.stdout(b, false)) {
                            Ok(0) => { out_open = false; r.stdout(&[], true); break; }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                }
                if err_open {
                    while let Ok(n) = read_now(|b| read_fd(err.as_raw_fd(), b), ERR_READ, |b| r.stderr(b)) {
                        if n == 0 { err_open = false; break; }
                    }
                }
                let mut status = 0;
                // SAFETY: waitpid on our own child, without blocking.
                let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if got == pid {
                    r.send(AgentEv::Exited { status });
                    return Ok(());
                }
                if got < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Told, but not a zombie yet (should not happen): look again soon.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    }
}

/// The most of stdout one read takes: a whole pipe's default buffer.
const OUT_READ: usize = 64 * 1024;
/// The most of stderr one read takes, so one `Stderr` event at most.
const ERR_READ: usize = 8 * 1024;

thread_local! {
    /// What every IO task on this thread reads into. A read is handed on
    /// (framed, or copied into an event) before its task next yields, so
    /// one buffer a thread serves every agent; a buffer of each task's own
    /// (64 KiB for stdout, 8 KiB for stderr, zeroed, so resident, when
    /// allocated) cost the supervisor 72 KiB of memory a live agent
    /// (`brood bench memory`, docs/benchmarks.md).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; OUT_READ]);
}

/// One read (`try_read`, a tokio pipe's or socket's) of what is there
/// now, at most `max` bytes, into this thread's scratch buffer, handed to
/// `f` unless empty: the count as `read(2)` answers it (0 at end of file),
/// `WouldBlock` when nothing is there (tokio then clears the readiness).
fn read_now(
    try_read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    max: usize,
    f: impl FnOnce(&[u8]),
) -> std::io::Result<usize> {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        let max = max.min(buf.len());
        let n = try_read(&mut buf[..max])?;
        if n > 0 {
            f(&buf[..n]);
        }
        Ok(n)
    })
}

fn reap_blocking(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: waitpid on our own child; blocking is acceptable on this error path.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

/// One `read(2)` of a non-blocking descriptor (the agent's socket or
/// stderr pipe), past tokio's readiness: `WouldBlock` when it is empty.
fn read_fd(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: a read into a live buffer of its own length from a descriptor
    // the task owns for as long as this call.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n.unsigned_abs())
}

/// How the IO task learns its process exited.
enum Exit {
    /// The launcher's ring calls back (`None` once it has).
    Told(Option<oneshot::Receiver<()>>),
    /// The process's pidfd turns readable.
    Pidfd(AsyncFd<OwnedFd>),
}

impl Exit {
    fn pidfd(fd: OwnedFd) -> std::io::Result<Exit> {
        // SAFETY: the AsyncFd takes ownership of the pidfd, so the descriptor stays open
        // for exactly as long as it is registered and is deregistered before it closes.
        Ok(Exit::Pidfd(unsafe {
            AsyncFd::register_with_interest(fd, Interest::READABLE)?
        }))
    }

    /// Resolves once the process has exited, and at once from then on.
    async fn told(&mut self) -> std::io::Result<()> {
        match self {
            Exit::Told(rx) => {
                if let Some(r) = rx.as_mut() {
                    // A dropped sender (the ring's thread gone) tells too:
                    // the reap that follows says what happened.
                    let _ = r.await;
                    *rx = None;
                }
                Ok(())
            }
            Exit::Pidfd(fd) => {
                let mut g = fd.readable().await?;
                // A pidfd stays readable once its process exited.
                g.retain_ready();
                Ok(())
            }
        }
    }
}
