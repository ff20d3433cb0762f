//! Where the store's URL comes from (issue 24, docs/many-nodes.md "The
//! store's password"). A process's command line is world-readable in
//! `/proc/<pid>/cmdline`, so a PostgreSQL password given as `--store
//! postgres://user:pass@…` would be read by every local process, agents
//! included. Such a URL is refused on the command line; it is taken from
//! `BROOD_STORE` (read once, at start-up, then removed from this process's
//! environment so nothing it starts inherits it) or from a file named by
//! `--store-file` (`BROOD_STORE_FILE`), which must be readable by its owner
//! only when it holds a password.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::Exit;

/// Whether `spec` is a PostgreSQL URL that carries a password: in its
/// user information (`user:pass@`) or as a `password=` parameter.
pub(crate) fn has_password(spec: &str) -> bool {
    if !brood_store::is_postgres_url(spec) {
        return false;
    }
    let Some((_, rest)) = spec.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let in_userinfo = authority
        .rsplit_once('@')
        .is_some_and(|(creds, _)| creds.contains(':'));
    let in_query = rest.split_once('?').is_some_and(|(_, q)| {
        q.split('&').any(|kv| {
            kv.split_once('=')
                .is_some_and(|(k, _)| k.eq_ignore_ascii_case("password"))
        })
    });
    in_userinfo || in_query
}

/// `spec` as an error may show it: a PostgreSQL URL without its password.
pub(crate) fn shown(spec: &Path) -> String {
    let s = spec.to_string_lossy();
    if !has_password(&s) {
        return s.into_owned();
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.into_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((creds, host)) => {
            let user = creds.split(':').next().unwrap_or("");
            format!("{user}@{host}")
        }
        None => authority.to_owned(),
    };
    // A `password=` parameter goes with the whole query.
    let tail = tail.split('?').next().unwrap_or("");
    format!("{scheme}://{authority}{tail}")
}

/// The store to use: `--store` (from the command line, without a password;
/// or from `BROOD_STORE`), else the contents of `--store-file`, else none
/// (the default SQLite file).
pub(crate) fn choose(
    store: Option<PathBuf>,
    store_on_command_line: bool,
    store_file: Option<PathBuf>,
) -> Result<Option<PathBuf>> {
    if let Some(s) = &store
        && store_on_command_line
        && has_password(&s.to_string_lossy())
    {
        return Err(Exit(
            2,
            "--store: the URL holds a password, and a command line is readable by every \
             local process (/proc/<pid>/cmdline); give the URL in the environment \
             (BROOD_STORE=postgres://user:pass@host/db) or in a file readable only by \
             you (--store-file PATH, mode 0600): docs/many-nodes.md"
                .to_owned(),
        )
        .into());
    }
    match (store, store_file) {
        (Some(_), Some(f)) => Err(Exit(
            2,
            format!(
                "--store and --store-file {} both name the store; give one",
                f.display()
            ),
        )
        .into()),
        (Some(s), None) => Ok(Some(s)),
        (None, Some(f)) => read_file(&f).map(Some),
        (None, None) => Ok(None),
    }
}

/// The URL in `path` (its first line). A file that holds a password must
/// be a regular file of this user's that nobody else may read.
fn read_file(path: &Path) -> Result<PathBuf> {
    let bad = |why: String| Exit(2, format!("--store-file {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let url = text.lines().next().unwrap_or("").trim().to_owned();
    if url.is_empty() {
        return Err(bad("empty; write the store's URL on its first line".into()).into());
    }
    if has_password(&url) {
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(bad(format!(
                "it holds a password and belongs to uid {}, not {me}",
                meta.uid()
            ))
            .into());
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "it holds a password and its mode {mode:o} lets others read it; `chmod 600` it"
            ))
            .into());
        }
    }
    Ok(PathBuf::from(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_where_a_url_can_hold_them() {
        assert!(has_password("postgres://root:secret@127.0.0.1/db"));
        assert!(has_password("postgresql://u:p@h:5432/db?sslmode=disable"));
        assert!(has_password("postgres://u@h/db?password=x"));
        assert!(has_password("postgres://u@h/db?sslmode=disable&PASSWORD=x"));
        assert!(!has_password("postgres://root@127.0.0.1/db"));
        assert!(!has_password("postgres://h/db?user=u"));
        assert!(!has_password("/var/lib/brood/user:pass@x.db"));
    }

    #[test]
    fn an_error_shows_the_url_without_its_password() {
        let s = |u: &str| shown(Path::new(u));
        assert_eq!(
            s("postgres://root:secret@h:5432/db"),
            "postgres://root@h:5432/db"
        );
        assert_eq!(s("postgres://u@h/db?password=x&a=b"), "postgres://u@h/db");
        assert_eq!(s("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(s("/var/lib/brood.db"), "/var/lib/brood.db");
    }

    #[test]
    fn a_password_is_refused_on_the_command_line_only() {
        let url = PathBuf::from("postgres://root:secret@127.0.0.1/db");
        let e = choose(Some(url.clone()), true, None).unwrap_err();
        assert!(e.to_string().contains("BROOD_STORE"), "{e}");
        assert_eq!(choose(Some(url.clone()), false, None).unwrap(), Some(url));
        let plain = PathBuf::from("postgres://root@127.0.0.1/db");
        assert_eq!(
            choose(Some(plain.clone()), true, None).unwrap(),
            Some(plain)
        );
    }

    #[test]
    fn a_store_file_with_a_password_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("store");
        std::fs::write(&f, "postgres://root:secret@127.0.0.1/db\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = choose(None, false, Some(f.clone())).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            choose(None, false, Some(f.clone())).unwrap(),
            Some(PathBuf::from("postgres://root:secret@127.0.0.1/db"))
        );
        let e = choose(Some("x.db".into()), true, Some(f)).unwrap_err();
        assert!(e.to_string().contains("give one"), "{e}");
    }
}
