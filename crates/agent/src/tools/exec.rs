//! `shell` and `code_exec`: a program run inside the agent's own sandbox
//! (whatever the policy hides stays hidden from it), in a process group of
//! its own, killed whole when it outlives its timeout or the agent is
//! cancelled; its output is kept up to a cap and the rest counted.
//!
//! The pipes are read in the same loop that watches the clock (poll(2)), so
//! a process that left the group (`setsid`) and holds them open cannot keep
//! the tool past its timeout: once the group is gone, what is still open is
//! read for [`LINGER`] at most and then left (issue 24).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{MAX_RESULT, ToolResult, arg, opt_u64};
use crate::io::CancelFlag;
use crate::settings::Settings;

pub fn run(name: &str, args: &Value, settings: &Settings, cancel: &CancelFlag) -> ToolResult {
    let limit = settings.shell_timeout_s.max(1);
    let timeout = opt_u64(args, "timeout_s")?.unwrap_or(limit).clamp(1, limit);
    let (program, argv, stdin): (&str, Vec<String>, Option<String>) = if name == "shell" {
        let command = arg(args, "command")?;
        ("sh", vec!["-c".into(), command.to_owned()], None)
    } else {
        let code = arg(args, "code")?;
        let (p, a): (&str, &[&str]) = match arg(args, "language")? {
            "python" => ("python3", &["-"]),
            "sh" => ("sh", &["-s"]),
            "bash" => ("bash", &["-s"]),
            "node" => ("node", &["-"]),
            other => {
                return Err(format!(
                    "no interpreter for {other:?}; use python, sh, bash or node"
                ));
            }
        };
        (
            p,
            a.iter().map(|s| (*s).to_owned()).collect(),
            Some(code.to_owned()),
        )
    };
    // The agent is a program inside its sandbox like any other; its tools
    // start processes there (brood-launch's rule is for the supervisor).
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(program);
    cmd.args(&argv)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("{program} is not installed here (or this agent may not run it)")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("running {program}: permission denied (this agent's sandbox does not grant it)")
        }
        _ => format!("running {program}: {e}"),
    })?;
    if let (Some(code), Some(mut w)) = (stdin, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = w.write_all(code.as_bytes());
        });
    }
    let mut out = Pipe::new(child.stdout.take());
    let mut err = Pipe::new(child.stderr.take());
    let pgid = child.id() as i32;
    let start = Instant::now();
    let mut ended: Option<(Option<std::process::ExitStatus>, Option<String>, Instant)> = None;
    let mut held = false;
    loop {
        wait_readable(&[out.fd(), err.fd()], Duration::from_millis(10));
        out.read_some();
        err.read_some();
        if ended.is_none() {
            if let Ok(Some(s)) = child.try_wait() {
                // SAFETY: the group's leader is gone; whatever it left in
                // its group goes too.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                ended = Some((Some(s), None, Instant::now()));
            } else {
                let why = if cancel.is_set() {
                    Some("the agent was cancelled".to_owned())
                } else if start.elapsed() > Duration::from_secs(timeout) {
                    Some(format!("it ran past its {timeout} s timeout"))
                } else {
                    None
                };
                if let Some(w) = why {
                    // SAFETY: signalling the process group this tool started.
                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                    let _ = child.wait();
                    ended = Some((None, Some(w), Instant::now()));
                }
            }
        }
        if let Some((_, _, at)) = &ended {
            if out.done && err.done {
                break;
            }
            if at.elapsed() > LINGER {
                // A process outside the group (setsid) holds the pipes.
                held = true;
                break;
            }
        }
    }
    let Some((status, why, _)) = ended else {
        return Err("the tool's loop ended without its program".into());
    };
    let (out, out_more) = (out.kept, out.dropped);
    let (err, err_more) = (err.kept, err.dropped);
    let mut text = match (&status, &why) {
        (_, Some(w)) => format!("killed: {w}\n"),
        (Some(s), None) => match s.code() {
            Some(c) => format!("exit status {c}\n"),
            None => format!("ended by a signal ({s})\n"),
        },
        (None, None) => String::new(),
    };
    for (label, body, more) in [("stdout", out, out_more), ("stderr", err, err_more)] {
        if body.is_empty() && more == 0 {
            continue;
        }
        text.push_str(&format!("--- {label}\n{}", String::from_utf8_lossy(&body)));
        if more > 0 {
            text.push_str(&format!("\n[cut: {more} more bytes of {label} not kept]"));
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    if held {
        text.push_str(
            "[a process that left the command's group (setsid) still holds its output open; not waited for]\n",
        );
    }
    Ok(text)
}

/// How long output is still read once the command's group is gone.
const LINGER: Duration = Duration::from_millis(500);

/// One output pipe, read without blocking: the first half of the result
/// cap kept, the rest counted.
struct Pipe<R> {
    r: Option<R>,
    kept: Vec<u8>,
    dropped: usize,
    done: bool,
}

impl<R: Read + AsRawFd> Pipe<R> {
    fn new(r: Option<R>) -> Pipe<R> {
        if let Some(r) = &r {
            let fd = r.as_raw_fd();
            // SAFETY: fcntl(2) on a descriptor this process owns.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        let done = r.is_none();
        Pipe {
            r,
            kept: Vec::new(),
            dropped: 0,
            done,
        }
    }

    fn fd(&self) -> Option<i32> {
        (!self.done)
            .then(|| self.r.as_ref().map(|r| r.as_raw_fd()))
            .flatten()
    }

    /// Reads what is there now.
    fn read_some(&mut self) {
        let Some(r) = self.r.as_mut().filter(|_| !self.done) else {
            return;
        };
        let keep = MAX_RESULT / 2;
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) => {
                    self.done = true;
                    return;
                }
                Ok(n) => {
                    let room = keep.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&buf[..n.min(room)]);
                    self.dropped += n - n.min(room);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
        }
    }
}

/// Waits until one of the descriptors has something (or at most `limit`).
fn wait_readable(fds: &[Option<i32>], limit: Duration) {
    let mut fds: Vec<libc::pollfd> = fds
        .iter()
        .flatten()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if fds.is_empty() {
        std::thread::sleep(limit);
        return;
    }
    // SAFETY: poll(2) on pollfds of descriptors this process owns.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            limit.as_millis() as i32,
        )
    };
}
