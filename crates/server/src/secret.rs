//! Secrets the server hands out and later recognises: a stdio MCP session's
//! capability (`narrow`) and the web UI's session cookie (`ui::session`).
//! Each is 256 bits from the kernel's random source, in hex; the server
//! keeps only its SHA-256, so a table that holds them can be looked up in a
//! `HashMap` without its timing telling anything about a valid value (the
//! hash of a guess, not the guess, is compared).

use sha2::{Digest, Sha256};

/// A new secret: 32 bytes from `getrandom(2)`, as 64 hex digits.
pub(crate) fn new_secret() -> std::io::Result<String> {
    let mut raw = [0u8; 32];
    let mut filled = 0;
    while filled < raw.len() {
        // SAFETY: writes at most `raw.len() - filled` bytes into `raw` from `filled` on.
        let n =
            unsafe { libc::getrandom(raw[filled..].as_mut_ptr().cast(), raw.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the server keeps of a secret: its SHA-256.
pub(crate) fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_256_bits_of_hex_and_differ() {
        let a = new_secret().unwrap();
        let b = new_secret().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(digest(&a), digest(&a));
        assert_ne!(digest(&a), digest(&b));
    }
}
