//! How a run ended (SPEC 7), from what its agent said and how its process
//! exited; and what a launch refused after the fact leaves to kill.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use brood_core::{FailReason, Terminal};
use brood_launch::Launched;
use brood_launch::cgroup::{Cgroups, Group};
use brood_store::Protocol;

use super::Live;

pub(super) fn exit_code(status: i32) -> Option<i32> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else {
        None
    }
}

/// SPEC 7's rules for how a run ended, from what the agent said and how it exited.
pub(super) fn outcome_of(l: &Live, status: i32) -> (Terminal, Option<String>, Option<String>) {
    let signalled = libc::WIFSIGNALED(status);
    let sig_detail = || format!("killed by signal {}", libc::WTERMSIG(status));
    match l.protocol {
        Protocol::Exec => {
            let out = String::from_utf8_lossy(&l.exec_out).into_owned();
            // What it wrote to stderr is most often why (issue 25): it goes
            // with the detail to every surface that shows one (a job's
            // attempt too), not only to the log.
            let with_tail = |d: String| match l.stderr_tail.trim_end() {
                "" => d,
                t => format!("{d}; stderr tail: {t}"),
            };
            if signalled {
                (
                    Terminal::Failed(FailReason::Crashed),
                    Some(out),
                    Some(with_tail(sig_detail())),
                )
            } else if exit_code(status) == Some(0) {
                (Terminal::Completed, Some(out), None)
            } else {
                (
                    Terminal::Failed(FailReason::ExitCode),
                    Some(out),
                    Some(with_tail(format!(
                        "exit code {}",
                        exit_code(status).unwrap_or(-1)
                    ))),
                )
            }
        }
        Protocol::Brood => {
            if let Some(e) = &l.protocol_error {
                return (
                    Terminal::Failed(FailReason::ProtocolError),
                    None,
                    Some(e.clone()),
                );
            }
            if let Some(d) = &l.done {
                return if d.success {
                    (Terminal::Completed, Some(d.response.clone()), None)
                } else {
                    (
                        Terminal::Failed(FailReason::ExitCode),
                        Some(d.response.clone()),
                        Some("the agent reported success: false".into()),
                    )
                };
            }
            if let Some(e) = &l.error {
                return (
                    Terminal::Failed(FailReason::ExitCode),
                    Some(e.clone()),
                    Some(format!("the agent reported an error: {e}")),
                );
            }
            if signalled {
                return (
                    Terminal::Failed(FailReason::Crashed),
                    None,
                    Some(format!(
                        "{}; stderr tail: {}",
                        sig_detail(),
                        l.stderr_tail.trim_end()
                    )),
                );
            }
            (
                Terminal::Failed(FailReason::ExitedWithoutResult),
                None,
                Some(format!(
                    "exited with code {} without done or error; stderr tail: {}",
                    exit_code(status).unwrap_or(-1),
                    l.stderr_tail.trim_end()
                )),
            )
        }
    }
}

/// Kills what a refused launch started and removes its group.
pub(super) fn reap_orphan_launch(p: Launched, group: Option<Group>, cg: Option<Arc<Cgroups>>) {
    std::thread::spawn(move || {
        if let (Some(g), Some(cg)) = (&group, &cg) {
            if let Err(e) = cg.kill_and_remove(g, Duration::from_secs(5)) {
                tracing::error!(group = %g.dir.display(), error = %e, "removing a refused agent's cgroup failed");
            }
        } else {
            // SAFETY: the process group we created for it.
            unsafe { libc::killpg(p.pid, libc::SIGKILL) };
        }
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(p.pid, std::ptr::null_mut(), 0) };
        drop::<(OwnedFd, OwnedFd, OwnedFd)>((p.pidfd, p.stdio, p.stderr));
    });
}
