//! The supervisor raises its own limit of open descriptors and gives its
//! agents the one it was started with (a binary of its own: the limit is
//! the process's, and this test sets it before any spawner starts).

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::io::Read;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;

use brood_launch::{LaunchSpec, Spawner};

fn soft_and_hard() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) into a struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    (lim.rlim_cur, lim.rlim_max)
}

#[test]
fn the_supervisor_raises_its_descriptor_limit_and_its_agents_get_the_started_one() {
    let (_, hard) = soft_and_hard();
    assert!(
        hard > 256,
        "this test needs a hard limit above 256, not {hard}"
    );
    // What most machines start a process with: a soft limit far below the hard.
    let low = libc::rlimit {
        rlim_cur: 256,
        rlim_max: hard,
    };
    // SAFETY: setrlimit(2) from a struct we own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);

    let sp = Spawner::start(false).unwrap();
    assert_eq!(
        soft_and_hard(),
        (hard, hard),
        "the supervisor may hold as many descriptors as its hard limit allows"
    );
    let l = sp
        .launch_blocking(LaunchSpec {
            argv: ["/bin/sh", "-c", "ulimit -Sn; ulimit -Hn"]
                .iter()
                .map(OsString::from)
                .collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: None,
            cgroup_procs: None,
            sandbox: None,
            extra_procs: Vec::new(),
            ns: None,
            veil: None,
            stdin_prelude: Vec::new(),
            door: None,
            file_size_max: None,
            view: None,
        })
        .unwrap();
    let mut io = UnixStream::from(l.stdio);
    io.set_nonblocking(false).unwrap();
    io.shutdown(Shutdown::Write).unwrap();
    let mut out = String::new();
    io.read_to_string(&mut out).unwrap();
    let mut status = 0;
    // SAFETY: our own child (started by this process's spawner thread).
    assert_eq!(unsafe { libc::waitpid(l.pid, &mut status, 0) }, l.pid);
    assert_eq!(out, format!("256\n{hard}\n"), "the agent's limits");
}
