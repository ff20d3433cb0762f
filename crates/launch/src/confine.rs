//! Confining one thread of the supervisor as an agent is confined, so that
//! what it opens next is opened with the agent's rights and not brood's.
//!
//! Collecting a result (SPEC 4) means opening files a hostile child named: its
//! refs and the files of its `artifact/` directory. A root supervisor could
//! open anything, so a child could name a file it may not read itself and
//! learn about it from the answer. Every credential that decides an `open(2)`
//! belongs to a thread in Linux, not to the process: the filesystem uid and gid
//! (`setfsuid(2)`, `setfsgid(2)`), the supplementary groups (the `setgroups`
//! syscall; glibc's wrapper broadcasts it to every thread, the raw syscall
//! does not), the capabilities (`capset(2)`), `no_new_privs` and the landlock
//! domain (`landlock_restrict_self(2)` without `TSYNC`). So a fresh thread can
//! take the child's identity and its landlock ruleset, open what it must, hand
//! the open files back and end; the rest of the supervisor is untouched.
//!
//! There is no way back for the thread: use one made for the job
//! ([`on_confined_thread`]).

use std::io;
use std::thread::JoinHandle;

use crate::sandbox::Prepared;

/// Whose files a confined thread may open: the child's identity and its
/// sandbox. `ids` is `None` when the child runs as the supervisor's own ids.
#[derive(Debug, Clone)]
pub struct Confinement {
    pub sandbox: Option<Prepared>,
    pub ids: Option<FsIds>,
}

/// The filesystem identity a confined thread takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Confinement {
    /// Confines the calling thread: identity first (it needs `CAP_SETUID` and
    /// `CAP_SETGID`), then the capabilities go, then `no_new_privs` and the
    /// landlock domain (which needs `no_new_privs` once `CAP_SYS_ADMIN` is gone).
    fn apply_to_this_thread(&self) -> io::Result<()> {
        let step = |what: &str, r: io::Result<()>| {
            r.map_err(|e| io::Error::new(e.kind(), format!("confining a thread: {what}: {e}")))
        };
        if let Some(ids) = &self.ids {
            step("setgroups", set_groups(&ids.groups))?;
            step("setfsgid", set_fs_id(libc::SYS_setfsgid, ids.gid))?;
            step("setfsuid", set_fs_id(libc::SYS_setfsuid, ids.uid))?;
        }
        let (ruleset, drop_caps) = self
            .sandbox
            .as_ref()
            .map_or((None, false), |s| s.thread_parts());
        if drop_caps {
            step("capset", crate::sandbox::capset_empty_this_thread())?;
        }
        // SAFETY: prctl(2) with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return step("no_new_privs", Err(io::Error::last_os_error()));
        }
        if let Some(fd) = ruleset {
            // SAFETY: landlock_restrict_self(2) on a ruleset fd the Prepared
            // keeps open; flags 0 confine the calling thread only.
            if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } != 0 {
                return step("landlock_restrict_self", Err(io::Error::last_os_error()));
            }
        }
        Ok(())
    }
}

fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups(2) with a length and a pointer to that many gids.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// setfsuid(2)/setfsgid(2) report no error; they return the previous id. Ask
/// again (with an invalid id, which changes nothing) to see that it took.
fn set_fs_id(call: libc::c_long, id: u32) -> io::Result<()> {
    // SAFETY: setfsuid(2)/setfsgid(2) with integer arguments.
    let now = unsafe {
        libc::syscall(call, id);
        libc::syscall(call, u32::MAX)
    };
    if now as u32 != id {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the id is still {now}, not {id}"),
        ));
    }
    Ok(())
}

/// Starts `f` on a fresh thread confined by `c`. The thread's result is an
/// error naming the step when the confinement cannot be applied (then `f`
/// does not run).
pub fn spawn_confined<T, F>(c: Confinement, f: F) -> io::Result<JoinHandle<io::Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    std::thread::Builder::new()
        .name("brood-confined".into())
        .spawn(move || {
            c.apply_to_this_thread()?;
            Ok(f())
        })
}

/// Runs `f` on a fresh thread confined by `c`, and returns what it returns;
/// fails when the confinement cannot be applied or `f` panics.
pub fn on_confined_thread<T, F>(c: Confinement, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    spawn_confined(c, f)?
        .join()
        .map_err(|_| io::Error::other("a confined thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{FsAccess, SandboxSpec};

    #[test]
    fn a_confined_thread_opens_only_what_the_sandbox_grants_and_others_are_untouched() {
        let d = tempfile::tempdir().unwrap();
        let (open, secret) = (d.path().join("open"), d.path().join("secret"));
        std::fs::create_dir(&open).unwrap();
        std::fs::write(open.join("f"), "x").unwrap();
        std::fs::write(&secret, "s").unwrap();
        let spec = SandboxSpec {
            fs: vec![(open.clone(), FsAccess::Ro)],
            ..SandboxSpec::default()
        };
        let sandbox = crate::sandbox::prepare(&spec).expect("landlock is needed here");
        let c = Confinement {
            sandbox: Some(sandbox),
            ids: None,
        };
        let (o, s) = (open.join("f"), secret.clone());
        let got = on_confined_thread(c, move || {
            (
                std::fs::read(&o).is_ok(),
                std::fs::read(&s).map_err(|e| e.kind()),
            )
        })
        .unwrap();
        assert_eq!(got, (true, Err(io::ErrorKind::PermissionDenied)));
        // The calling thread is not confined.
        assert_eq!(std::fs::read(&secret).unwrap(), b"s");
    }

    #[test]
    fn a_confined_thread_takes_the_childs_uid_and_loses_root_s_reach() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let private = d.path().join("private");
        std::fs::write(&private, "p").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Confinement {
            sandbox: None,
            ids: Some(FsIds {
                uid: 65534,
                gid: 65534,
                groups: vec![],
            }),
        };
        let p = private.clone();
        let got = on_confined_thread(c, move || std::fs::read(&p).map_err(|e| e.kind())).unwrap();
        assert_eq!(got, Err(io::ErrorKind::PermissionDenied));
        assert_eq!(std::fs::read(&private).unwrap(), b"p");
    }
}
