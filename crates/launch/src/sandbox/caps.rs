//! Dropping every capability (capabilities(7)): what the supervisor reads
//! and checks before a launch, and the raw capset(2) the child (or a confined
//! thread) makes.

use std::io;
use std::path::PathBuf;

use super::{SandboxError, SandboxSpec};

/// Where the kernel says how many capabilities it knows (capabilities(7)).
pub(super) const CAP_LAST_CAP: &str = "/proc/sys/kernel/cap_last_cap";
/// `CAP_SETPCAP`, needed to empty the bounding set (capabilities(7)).
pub(super) const CAP_SETPCAP: u32 = 8;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit words (capget(2)).
pub(super) const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (capget(2)).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct CapHeader {
    pub(super) version: u32,
    pub(super) pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (capget(2)); version 3 uses two of them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capset(2) with empty effective, permitted and inheritable sets for the
/// calling thread only: capabilities belong to a thread in Linux, and the raw
/// syscall (unlike a libc wrapper that broadcasts) changes no other.
pub(crate) fn capset_empty_this_thread() -> io::Result<()> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset(2) with pointers to a header and two data structs on the stack.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How to drop capabilities in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CapPlan {
    /// The highest capability number the kernel knows.
    pub(super) last_cap: u32,
    /// Whether to empty the bounding set (needs `CAP_SETPCAP`; skipped when it is
    /// already empty, or for a non-root supervisor under `no_new_privs`).
    pub(super) drop_bset: bool,
}

/// Reads what the child will need to drop every capability, and checks that this
/// process can do it (capabilities(7)).
pub(super) fn plan_caps(
    spec: &SandboxSpec,
    weaker: &mut Vec<String>,
) -> Result<Option<CapPlan>, SandboxError> {
    let text = std::fs::read_to_string(CAP_LAST_CAP).map_err(|source| SandboxError::Path {
        path: PathBuf::from(CAP_LAST_CAP),
        source,
    })?;
    let last_cap: u32 = text.trim().parse().map_err(|_| SandboxError::Path {
        path: PathBuf::from(CAP_LAST_CAP),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected a number, got {:?}", text.trim()),
        ),
    })?;
    // Two 32-bit words per set in capset(2) version 3.
    let last_cap = last_cap.min(63);
    let effective = own_effective_caps().map_err(|e| SandboxError::Layer {
        layer: "capabilities",
        reason: format!("capget: {e}"),
    })?;
    // prctl(2) PR_CAPBSET_READ: 1 when the capability is in the bounding set.
    // SAFETY: prctl with integer arguments only.
    let bset_nonempty = (0..=last_cap)
        .any(|c| unsafe { libc::prctl(libc::PR_CAPBSET_READ, c as libc::c_ulong, 0, 0, 0) } == 1);
    let can_drop_bset = effective & (1 << CAP_SETPCAP) != 0;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let drop_bset = if !bset_nonempty {
        false
    } else if can_drop_bset {
        true
    } else if root || !spec.no_new_privs {
        // A root agent with a full bounding set gets every capability back at its
        // next execve (capabilities(7), "Capabilities and execution of programs
        // by root"); without no_new_privs a setuid binary does the same.
        let reason = "the bounding set cannot be emptied without CAP_SETPCAP".to_owned();
        if spec.allow_weaker {
            weaker.push(format!("capabilities: {reason}"));
            false
        } else {
            return Err(SandboxError::Layer {
                layer: "capabilities",
                reason,
            });
        }
    } else {
        // Not root and no_new_privs: nothing can grant capabilities back.
        false
    };
    Ok(Some(CapPlan {
        last_cap,
        drop_bset,
    }))
}

/// This thread's effective capabilities, as a 64-bit mask (capget(2)).
pub(super) fn own_effective_caps() -> io::Result<u64> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: hdr and data are valid for the kernel to read and write (two
    // structures for version 3).
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}
