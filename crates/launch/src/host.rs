//! What this host offers: landlock, namespaces, seccomp.
//!
//! Used by `brood doctor` and by the supervisor at start. Every probe asks the
//! kernel directly (a syscall or a throw-away child), never a version table.

use std::io;

/// The landlock ABI version the kernel supports, or the reason there is none
/// (landlock_create_ruleset(2) with `LANDLOCK_CREATE_RULESET_VERSION`).
pub fn landlock_abi() -> Result<i64, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a null attribute pointer with size 0 and the VERSION flag is the
    // documented way to query the ABI; no memory is touched.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error().to_string())
    } else {
        Ok(r)
    }
}

/// Whether a new namespace of the given kind (`CLONE_NEW*` flag) can be created,
/// tried in a throw-away child so the caller's own namespaces never change
/// (unshare(2) of user and mount namespaces is refused in threaded processes).
pub fn can_unshare(flag: libc::c_int) -> Result<(), String> {
    // SAFETY: the child only calls unshare and _exit (async-signal-safe).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            let code = if libc::unshare(flag) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code & 0x7f);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child we just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = libc::WEXITSTATUS(status);
    if libc::WIFEXITED(status) && code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(code).to_string())
    }
}

/// Whether this kernel can install a seccomp filter that returns an errno
/// (seccomp(2) `SECCOMP_GET_ACTION_AVAIL`), asked once.
pub fn seccomp_available() -> Result<(), String> {
    static ANSWER: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ANSWER.get_or_init(ask_available).clone()
}

fn ask_available() -> Result<(), String> {
    let action: u32 = libc::SECCOMP_RET_ERRNO;
    // SAFETY: seccomp(2) reading a u32 from a stack value.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "seccomp filters are not available: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// The seccomp mode of this process and whether filters can be installed
/// (prctl(2) `PR_GET_SECCOMP`; filters need kernel `CONFIG_SECCOMP_FILTER`).
pub fn seccomp() -> Result<String, String> {
    seccomp_available()?;
    Ok("filters that refuse a call with an errno: the socket filter of policies that are not network: all".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_has_landlock_and_namespaces() {
        // The development and CI machines have landlock ABI >= 1 and can create
        // user, mount and PID namespaces; if this fails the host lacks a feature
        // brood's tests rely on, and the message says which.
        let abi = landlock_abi().expect("landlock is not available on this kernel");
        assert!(abi >= 1, "landlock ABI {abi}");
        for (name, flag) in [
            ("user", libc::CLONE_NEWUSER),
            ("mount", libc::CLONE_NEWNS),
            ("pid", libc::CLONE_NEWPID),
            ("network", libc::CLONE_NEWNET),
        ] {
            can_unshare(flag).unwrap_or_else(|e| panic!("cannot create a {name} namespace: {e}"));
        }
    }
}
