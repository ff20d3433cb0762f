//! The bearer token of the TCP listener (`$BROOD_ROOT/token`): made once,
//! read at each start, refused when others could read it.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

/// The bearer token of the TCP listener.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// The token file of a root.
    pub fn path(root: &Path) -> PathBuf {
        root.join("token")
    }

    /// Reads `$BROOD_ROOT/token`, creating it (mode 0600, 256 random bits in
    /// hex) at the first start. A token file others can read or that belongs
    /// to someone else is refused: anyone who read it could act as the operator.
    pub fn load_or_create(root: &Path) -> std::io::Result<Token> {
        let path = Token::path(root);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                let mut raw = [0u8; 32];
                std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
                let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                f.write_all(hex.as_bytes())?;
                f.write_all(b"\n")?;
                f.sync_all()?;
                Ok(Token(hex))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let meta = std::fs::symlink_metadata(&path)?;
                // SAFETY: geteuid cannot fail.
                let me = unsafe { libc::geteuid() };
                let bad = |why: String| {
                    std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("token file {}: {why}", path.display()),
                    )
                };
                if !meta.file_type().is_file() {
                    return Err(bad("not a regular file".into()));
                }
                if meta.uid() != me {
                    return Err(bad(format!("owned by uid {}, not {me}", meta.uid())));
                }
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(bad(format!(
                        "mode {mode:o} lets others read it; `chmod 600` it or remove it for a new one"
                    )));
                }
                let text = std::fs::read_to_string(&path)?;
                let t = text.trim();
                if t.len() < 32 {
                    return Err(bad("shorter than 32 characters".into()));
                }
                Ok(Token(t.to_owned()))
            }
            Err(e) => Err(e),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn matches(&self, presented: &str) -> bool {
        // Constant time in the presented token's content; its length is not a secret.
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}
