//! The write accounting of `brood_launch::written` against the real kernel:
//! a reaped child's writes fold into its parent's figure, and an exited child
//! not yet reaped (a zombie, which its cgroup no longer lists) is found and
//! counted. The write budget of `resources.disk_max` rests on both.

// The helpers below are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::process::Command;

use brood_launch::written::{available, by, of};

const MIB: u64 = 1024 * 1024;

/// A directory on the disk beside the build: /tmp may be a tmpfs, whose
/// writes are memory and count nothing.
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn this_kernel_keeps_io_accounting() {
    available().expect("per-process I/O accounting (the write budget needs it)");
}

#[test]
fn a_reaped_childs_writes_count_in_its_parent_and_an_unreaped_ones_are_found() {
    let dir = disk_dir();
    let me = std::process::id() as i32;

    let before = of(me);
    let st = Command::new("sh")
        .arg("-c")
        .arg("head -c 2097152 /dev/urandom > \"$1\"")
        .arg("sh")
        .arg(dir.path().join("a"))
        .status()
        .unwrap();
    assert!(st.success());
    let after = of(me);
    assert!(
        after >= before + 2 * MIB,
        "a reaped child's writes fold into its parent: {before} -> {after}"
    );

    let mut child = Command::new("sh")
        .arg("-c")
        .arg("head -c 1048576 /dev/urandom > \"$1\"")
        .arg("sh")
        .arg(dir.path().join("b"))
        .spawn()
        .unwrap();
    let pid = child.id();
    // Until it has exited, but without reaping it (WNOWAIT): a zombie.
    // SAFETY: waitid(2) on our own child into a zeroed siginfo.
    let r = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
    let alone = of(me);
    let with_zombie = by(&[me]);
    assert!(
        with_zombie >= alone + MIB,
        "the unreaped child's writes are counted: {alone} alone, {with_zombie} with it"
    );
    child.wait().unwrap();
    assert!(
        of(me) >= alone + MIB,
        "once reaped, they are in the parent's own figure"
    );
}
