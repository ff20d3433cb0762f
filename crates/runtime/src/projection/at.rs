//! The projection thread's writes, relative to their directory (issue 27
//! item 3: the ctx tree's bookkeeping was a quarter of a busy node's CPU).
//!
//! A batch opens each directory it writes in once (`O_PATH`, not following
//! a symlink) and names every file relative to it (`fstatat`, `openat`,
//! `renameat2`), so the kernel walks a file's path once a batch instead of on
//! every call, and a new file costs the temp file's create, write and owner,
//! and the rename (one that exists, a look first). The rules are [`super::write_atomic`]'s: a temp
//! file beside the file then `rename(2)`, never through a symlink, a file
//! that already holds the bytes left as it is. The directory descriptors
//! live for one batch only.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A directory of the tree, opened for one batch.
pub(super) struct Dir {
    fd: OwnedFd,
}

impl Dir {
    /// Opens `path` itself, refusing a symlink there (`O_NOFOLLOW`).
    pub(super) fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: open(2) of a NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        Ok(Dir {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Replaces the file `name` with `bytes` through the temp file `tmp`
    /// beside it, given to `owner`, with `mode`; left as it is when it
    /// already holds them (a new inode would escape a landlock rule made on
    /// the old one, see [`super::write_atomic`]). Errors name `path`, the
    /// file's full path.
    ///
    /// A file written `fresh` is expected not to be there yet (a new
    /// agent's control and session files): the temp file is first moved in
    /// with `RENAME_NOREPLACE`, which needs no look before it, and only a
    /// name that exists (`EEXIST`) is looked at, as any other write's is
    /// first (issue 27 item 3: one `fstatat` a new file fewer, and none
    /// more for a file rewritten, the status a cascade rewrites).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replace(
        &self,
        path: &Path,
        name: &OsStr,
        tmp: &OsStr,
        bytes: &[u8],
        owner: Option<u32>,
        mode: u32,
        fresh: bool,
    ) -> io::Result<()> {
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let cname = cstr(name)?;
        let ctmp = cstr(tmp)?;
        let unlink_tmp = || {
            // SAFETY: unlinkat(2) of our own temp file's name.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), ctmp.as_ptr(), 0) };
        };
        if !fresh && self.holds_already(path, &cname, bytes, owner, mode)? {
            return Ok(());
        }
        if let Err(e) = self.fill_new(&ctmp, bytes, owner, mode) {
            unlink_tmp();
            return Err(named(e));
        }
        if fresh {
            match self.rename(&ctmp, &cname, libc::RENAME_NOREPLACE) {
                Ok(()) => return Ok(()),
                // EINVAL: a filesystem without the flag.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::EINVAL)) => {}
                Err(e) => {
                    unlink_tmp();
                    return Err(named(e));
                }
            }
            match self.holds_already(path, &cname, bytes, owner, mode) {
                Ok(false) => {}
                Ok(true) => {
                    unlink_tmp();
                    return Ok(());
                }
                Err(e) => {
                    unlink_tmp();
                    return Err(e);
                }
            }
        }
        self.rename(&ctmp, &cname, 0).map_err(|e| {
            unlink_tmp();
            named(e)
        })
    }

    /// Whether the file `name` already holds `bytes` with `mode` and
    /// `owner` (so it is left as it is); a symlink there is refused, a name
    /// not there holds nothing.
    fn holds_already(
        &self,
        path: &Path,
        cname: &CString,
        bytes: &[u8],
        owner: Option<u32>,
        mode: u32,
    ) -> io::Result<bool> {
        match self.stat(cname) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(symlink_refused(path)),
            Ok(st) => Ok(st.st_mode & libc::S_IFMT == libc::S_IFREG
                && st.st_size == bytes.len() as libc::off_t
                && st.st_mode & 0o7777 == mode
                && owner.is_none_or(|o| st.st_uid == o)
                && self.holds(cname, bytes)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }

    /// `renameat2(2)` of `from` to `to`, both in this directory.
    fn rename(&self, from: &CString, to: &CString, flags: libc::c_uint) -> io::Result<()> {
        // SAFETY: renameat2(2) of two NUL-terminated names in our directory.
        let rc = unsafe {
            libc::renameat2(
                self.fd.as_raw_fd(),
                from.as_ptr(),
                self.fd.as_raw_fd(),
                to.as_ptr(),
                flags,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Appends `bytes` to `name` (made with `mode` and given to `owner` if
    /// new), never through a symlink.
    pub(super) fn append(
        &self,
        path: &Path,
        name: &OsStr,
        bytes: &[u8],
        owner: Option<u32>,
        mode: u32,
    ) -> io::Result<()> {
        let cname = cstr(name)?;
        let err = |e: io::Error| match e.raw_os_error() {
            // O_NOFOLLOW met a symlink.
            Some(libc::ELOOP) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symlink; refusing to append through it",
                    path.display()
                ),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        };
        // Nothing to append: the file is only to exist (an agent's
        // transcript before its first message). Made new when it is not
        // there, given away without a look at whose it is, nothing written
        // (issue 27 item 3); one already there is looked at as below.
        if bytes.is_empty() {
            match self.open_at(
                &cname,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                mode,
            ) {
                Ok(f) => {
                    return match owner {
                        Some(u) => std::os::unix::fs::fchown(&f, Some(u), Some(u)).map_err(err),
                        None => Ok(()),
                    };
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let mut f = self
            .open_at(
                &cname,
                libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_NOFOLLOW,
                mode,
            )
            .map_err(err)?;
        super::give(&f, owner)
            .and_then(|()| {
                if bytes.is_empty() {
                    Ok(())
                } else {
                    f.write_all(bytes)
                }
            })
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    }

    fn stat(&self, name: &CString) -> io::Result<libc::stat> {
        // SAFETY: fstatat(2) into a zeroed stat we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }

    /// Whether the file `name` holds exactly `bytes` (its size is known to
    /// be theirs).
    fn holds(&self, name: &CString, bytes: &[u8]) -> bool {
        let Ok(mut f) = self.open_at(name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) else {
            return false;
        };
        let mut old = Vec::with_capacity(bytes.len());
        f.read_to_end(&mut old).is_ok() && old == bytes
    }

    /// Creates the temp file `tmp` (it must not exist), sets its mode
    /// exactly (the umask may have narrowed it) unless it is the usual
    /// 0644, gives it to `owner` and writes `bytes`.
    fn fill_new(
        &self,
        tmp: &CString,
        bytes: &[u8],
        owner: Option<u32>,
        mode: u32,
    ) -> io::Result<()> {
        let mut f = self.open_at(
            tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode,
        )?;
        if mode != 0o644 {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        // The temp file is new, so ours: give it away without asking whose it is.
        if let Some(u) = owner {
            std::os::unix::fs::fchown(&f, Some(u), Some(u))?;
        }
        f.write_all(bytes)
    }

    fn open_at(&self, name: &CString, flags: libc::c_int, mode: u32) -> io::Result<File> {
        // SAFETY: openat(2) of a NUL-terminated name in our directory; the
        // descriptor is owned below.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} holds a NUL byte", s.to_string_lossy()),
        )
    })
}

fn symlink_refused(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is a symlink; refusing to write through it (remove it to let brood write the file)",
            path.display()
        ),
    )
}
