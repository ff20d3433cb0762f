//! How a probe's attempt reads in its line (the format of [`crate::probe`]
//! and [`crate::sockets`]): what the kernel answered, in one word or its
//! error.

use std::io;

/// `ok`, `denied` for `EACCES`/`EPERM`, or `error: <errno text>`.
pub fn outcome(r: &io::Result<()>) -> String {
    match r {
        Ok(()) => "ok".to_owned(),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            "denied".to_owned()
        }
        Err(e) => format!("error: {e}"),
    }
}
