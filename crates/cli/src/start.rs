//! How `brood run` and `brood spawn` start a program as a shell would
//! (issue 25, docs/cli.md "Starting programs"): the program and the working
//! directory resolved against the caller's, the task read from a pipe, and
//! the one case `--protocol auto` cannot tell in advance recognised after
//! the fact. The supervisor (or a daemon, or another node) never runs in
//! the caller's directory, so only this process can resolve what is
//! relative to it; the daemon's intake refuses a relative program or
//! directory outright.

use std::io::{IsTerminal, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::Result;
use serde_json::Value;

use crate::Exit;

/// The most bytes of a task read from stdin (the API takes a body of at
/// most 1 MiB; this is only a bound on what is held here).
const STDIN_TASK_MAX: u64 = 8 << 20;

/// The caller's working directory, or an error naming it.
pub(crate) fn cwd() -> Result<PathBuf> {
    std::env::current_dir().map_err(|e| {
        Exit(
            2,
            format!("the current directory cannot be read ({e}); give --cwd DIR"),
        )
        .into()
    })
}

/// `p` made absolute against `base`, its `.` components dropped (`..` is
/// kept: the kernel resolves it, through symbolic links, as a shell would).
pub(crate) fn absolute_from(base: &Path, p: &Path) -> PathBuf {
    let mut out = if p.is_absolute() {
        PathBuf::from("/")
    } else {
        base.to_path_buf()
    };
    for c in p.components() {
        match c {
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `p` made absolute against the caller's directory.
pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(absolute_from(&cwd()?, p))
}

/// Resolves a relative program path (`./tool`, `bin/x`) against the
/// caller's directory, and refuses, naming it as written, one that is not
/// there or cannot be run. A bare name is left as it is: the supervisor
/// looks it up in the `PATH` the agent will get and refuses it, by that
/// name, when it is not found there.
pub(crate) fn resolve_program(argv: &mut [String]) -> Result<()> {
    let Some(p) = argv.first_mut() else {
        return Ok(());
    };
    if p.starts_with('/') || !p.contains('/') {
        return Ok(());
    }
    let written = p.clone();
    let abs = absolute(Path::new(&written))?;
    let refuse = |why: &str| -> anyhow::Error {
        Exit(
            2,
            format!(
                "the program {written:?} {why} (looked for {})",
                abs.display()
            ),
        )
        .into()
    };
    match std::fs::metadata(&abs) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refuse("does not exist"));
        }
        Err(e) => return Err(refuse(&format!("cannot be looked at: {e}"))),
        Ok(m) if !m.is_file() => return Err(refuse("is not a regular file")),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => {
            return Err(refuse("is not executable (no x bit; chmod +x it)"));
        }
        Ok(_) => {}
    }
    *p = abs.to_string_lossy().into_owned();
    Ok(())
}

/// Whether this process runs inside an agent (its supervisor set these).
fn inside_an_agent() -> bool {
    std::env::var_os("BROOD_AGENT").is_some_and(|v| !v.is_empty())
}

/// The task: `--task TEXT`; `--task -` reads stdin; without `--task`, a
/// pipe or file on stdin is the task (as `cmd < file` or `echo hi | cmd`
/// gives a program its input), but not a terminal, and not inside an
/// agent, whose stdin is its own (a protocol agent's carries the protocol).
pub(crate) fn task(given: Option<String>) -> Result<String> {
    match given.as_deref() {
        Some("-") => read_stdin(),
        Some(_) => Ok(given.unwrap_or_default()),
        None if std::io::stdin().is_terminal() || inside_an_agent() => Ok(String::new()),
        None => read_stdin(),
    }
}

fn read_stdin() -> Result<String> {
    let mut buf = Vec::new();
    match std::io::stdin()
        .lock()
        .take(STDIN_TASK_MAX + 1)
        .read_to_end(&mut buf)
    {
        Ok(_) => {}
        // No stdin at all (a closed descriptor): no task.
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => return Ok(String::new()),
        Err(e) => return Err(Exit(2, format!("reading the task from stdin: {e}")).into()),
    }
    if buf.len() as u64 > STDIN_TASK_MAX {
        return Err(Exit(
            2,
            format!("the task on stdin is over {} MiB", STDIN_TASK_MAX >> 20),
        )
        .into());
    }
    String::from_utf8(buf).map_err(|_| Exit(2, "the task on stdin is not UTF-8 text".into()).into())
}

/// The working directory to send: `--cwd` (made absolute), else the
/// caller's, except with `iso = ns`, whose agent has a root of its own.
pub(crate) fn workdir(given: Option<&Path>, iso_ns: bool) -> Result<Option<String>> {
    let dir = match given {
        Some(d) => absolute(d)?,
        None if iso_ns => return Ok(None),
        None => cwd()?,
    };
    Ok(Some(dir.to_string_lossy().into_owned()))
}

/// The hint added to a refusal of the directory the caller did not choose.
pub(crate) fn cwd_hint(e: anyhow::Error, defaulted: bool) -> anyhow::Error {
    match e.downcast::<Exit>() {
        Ok(Exit(code, msg)) if defaulted && msg.contains("cwd:") => Exit(
            code,
            format!(
                "{msg} (the current directory, which the program starts in by default; give --cwd DIR)"
            ),
        )
        .into(),
        Ok(x) => x.into(),
        Err(e) => e,
    }
}

/// Whether an exec agent's result starts with brood's protocol handshake
/// (`{"type":"ready"}` on its first line): a brood-protocol agent that
/// `--protocol auto` ran as a plain program.
pub(crate) fn is_handshake(result: &str) -> bool {
    result
        .lines()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .is_some_and(|v| v["type"] == "ready")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_as_the_kernel_reads_them() {
        let base = Path::new("/home/u/w");
        assert_eq!(
            absolute_from(base, Path::new("./my-agent")),
            PathBuf::from("/home/u/w/my-agent")
        );
        assert_eq!(
            absolute_from(base, Path::new("bin/./x")),
            PathBuf::from("/home/u/w/bin/x")
        );
        assert_eq!(
            absolute_from(base, Path::new("../x")),
            PathBuf::from("/home/u/w/../x")
        );
        assert_eq!(
            absolute_from(base, Path::new("/a/b")),
            PathBuf::from("/a/b")
        );
    }

    #[test]
    fn the_handshake_is_recognised_and_nothing_else() {
        assert!(is_handshake("{\"type\":\"ready\"}\n"));
        assert!(is_handshake("\n{\"type\": \"ready\"}\n{\"type\":\"done\"}"));
        assert!(!is_handshake("ready\n"));
        assert!(!is_handshake("{\"type\":\"done\"}\n{\"type\":\"ready\"}"));
        assert!(!is_handshake(""));
    }
}
