//! The veil applied in a child of the supervisor's, with raw syscalls only:
//! the steps of the module docs, each failure recorded with its step and
//! path for the parent to report.

use std::io;
use std::ptr;

use super::{MAX_KEEP, MOVE_MOUNT_F_EMPTY_PATH, OPEN_TREE_CLONE, PreparedVeil, Step};

/// Applies the veil in the child (see the module docs for the steps).
///
/// # Safety
/// Only between clone and exec in a child made by `crate::spawn` that has its
/// own `fs_struct` (no `CLONE_FS`) and still holds `CAP_SYS_ADMIN`; raw
/// syscalls on memory `p` owns, nothing else.
pub unsafe fn apply_in_child(p: &PreparedVeil) -> io::Result<()> {
    p.failure.clear();
    let fail = |step: Step, index: usize| p.failure.record(step as u8, index);
    let null = ptr::null::<libc::c_char>();
    // SAFETY (whole block): raw syscalls with pointers to C strings owned by
    // `p`, which outlives the child's use of them (the spawner waits for exec).
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(fail(Step::Unshare, 0));
        }
        // Every mount private, once: the namespace is made once and copied
        // by each agent that gets a view of its own (`view`); a copy of a
        // shared mount joins its peer group, so with shared mounts every
        // view would grow the host's peer groups and make each later mount
        // operation walk them (mount_namespaces(7) "Shared subtrees").
        if libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            ptr::null(),
        ) != 0
        {
            return Err(fail(Step::MakePrivate, 0));
        }
        // Detached copies of what is kept, while the paths still name it.
        let mut copies = [-1 as libc::c_int; MAX_KEEP];
        let close_copies = |copies: &[libc::c_int; MAX_KEEP]| {
            for fd in copies.iter().filter(|fd| **fd >= 0) {
                libc::close(*fd);
            }
        };
        for (i, k) in p.kept.iter().enumerate() {
            let fd = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                k.source.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
            );
            if fd < 0 {
                let e = fail(Step::Keep, i);
                close_copies(&copies);
                return Err(e);
            }
            copies[i] = fd as libc::c_int;
        }
        let result = cover_and_seal(p, &copies, &fail);
        close_copies(&copies);
        result
    }
}

/// Steps 3 and 5 of [`apply_in_child`], with the copies of step 4 in hand.
///
/// # Safety
/// As for [`apply_in_child`]; `copies` holds a detached mount per kept entry.
unsafe fn cover_and_seal(
    p: &PreparedVeil,
    copies: &[libc::c_int; MAX_KEEP],
    fail: &dyn Fn(Step, usize) -> io::Error,
) -> io::Result<()> {
    let null = ptr::null::<libc::c_char>();
    let hide = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY (whole block): as in apply_in_child.
    unsafe {
        for (i, (c, _)) in p.covers.iter().enumerate() {
            if libc::mount(
                c"tmpfs".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                hide | libc::MS_RDONLY,
                c"mode=555,size=4k,nr_inodes=1".as_ptr().cast(),
            ) != 0
            {
                return Err(fail(Step::Cover, i));
            }
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            p.root.as_ptr(),
            c"tmpfs".as_ptr(),
            hide,
            p.tmpfs_opts.as_ptr().cast(),
        ) != 0
        {
            return Err(fail(Step::Root, 0));
        }
        for (i, k) in p.kept.iter().enumerate() {
            let made = if k.dir {
                libc::mkdir(k.target.as_ptr(), 0o755)
            } else {
                libc::mknod(k.target.as_ptr(), libc::S_IFREG | 0o644, 0)
            };
            if made != 0 {
                return Err(fail(Step::MountPoint, i));
            }
        }
        if !p.files.is_empty() && libc::mknod(p.empty.as_ptr(), libc::S_IFREG | 0o444, 0) != 0 {
            return Err(fail(Step::MountPoint, usize::MAX & 0xffff));
        }
        for (i, k) in p.kept.iter().enumerate() {
            // The original entry itself: ownership and landlock still decide
            // what the agent may do inside it.
            if libc::syscall(
                libc::SYS_move_mount,
                copies[i],
                c"".as_ptr(),
                libc::AT_FDCWD,
                k.target.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ) != 0
            {
                return Err(fail(Step::Keep, i));
            }
        }
        for (i, (f, _)) in p.files.iter().enumerate() {
            if libc::mount(
                p.empty.as_ptr(),
                f.as_ptr(),
                null,
                libc::MS_BIND,
                ptr::null(),
            ) != 0
            {
                return Err(fail(Step::File, i));
            }
        }
        if let Some((at, _)) = &p.proc {
            // proc(5): a new instance; `hidepid=ptraceable` hides every
            // process the viewer may not ptrace (PTRACE_MODE_READ_FSCREDS),
            // with no exception for a group (`invisible` lets members of
            // `gid=`, by default root's group, which agents are in, see all).
            if libc::mount(
                c"proc".as_ptr(),
                at.as_ptr(),
                c"proc".as_ptr(),
                hide,
                c"hidepid=ptraceable".as_ptr().cast(),
            ) != 0
            {
                return Err(fail(Step::Proc, 0));
            }
        }
        // Read-only for good: the superblock, so the empty file is read-only
        // wherever it is bound, and nothing can be made next to the kept entries.
        if libc::mount(
            null,
            p.root.as_ptr(),
            null,
            libc::MS_REMOUNT | libc::MS_RDONLY | hide,
            ptr::null(),
        ) != 0
        {
            return Err(fail(Step::Seal, 0));
        }
    }
    Ok(())
}
