//! `shell` and `code_exec`: a program run inside the agent's own sandbox
//! (whatever the policy hides stays hidden from it), in a process group of
//! its own, killed whole when it outlives its timeout or the agent is
//! cancelled; its output is kept up to a cap and the rest counted.

use std::io::{Read, Write};
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
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let pgid = child.id() as i32;
    let start = Instant::now();
    let (status, why) = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break (Some(s), None);
        }
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
            break (None, Some(w));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: the group's leader is gone; whatever it left behind goes too.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let (out, out_more) = out.join().unwrap_or_default();
    let (err, err_more) = err.join().unwrap_or_default();
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
    Ok(text)
}

/// Reads a pipe to its end on a thread: the first half of the result cap,
/// and how many bytes beyond it were dropped.
fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<(Vec<u8>, usize)> {
    std::thread::spawn(move || {
        let Some(mut r) = r else {
            return (Vec::new(), 0);
        };
        let keep = MAX_RESULT / 2;
        let mut kept = Vec::new();
        let mut dropped = 0usize;
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = keep.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                    dropped += n - n.min(room);
                }
            }
        }
        (kept, dropped)
    })
}
