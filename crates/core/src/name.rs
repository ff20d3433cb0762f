//! Validated names and ids (SPEC 1).
//!
//! Every name that reaches the runtime is checked once, here, at the edge; after
//! that the type carries the proof. A name becomes a path component in the ctx tree
//! and a cgroup directory, so the rules exist for safety, not taste: no `/`, no
//! `.`/`..`, nothing that collides with the `<name>.sock` and `<name>.d` entries.

use std::fmt;

/// Why a name or id was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    /// What kind of name it was ("agent name", "session name", ...).
    pub what: &'static str,
    /// The refused input, escaped for display.
    pub input: String,
    /// Which rule it broke.
    pub rule: &'static str,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}: {}", self.what, self.input, self.rule)
    }
}

impl std::error::Error for NameError {}

const MAX_NAME: usize = 64;

/// The shared rule of SPEC 1: `[a-zA-Z0-9][a-zA-Z0-9._+-]{0,63}`, not ending in
/// `.sock` or `.d`.
fn check_name(what: &'static str, s: &str) -> Result<(), NameError> {
    let err = |rule| NameError {
        what,
        input: s.escape_debug().to_string(),
        rule,
    };
    let bytes = s.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(err("must not be empty"));
    };
    if bytes.len() > MAX_NAME {
        return Err(err("must be at most 64 characters"));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(err("must start with a letter or digit"));
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
    {
        return Err(err("may contain only letters, digits and . _ + -"));
    }
    if s.ends_with(".sock") || s.ends_with(".d") {
        return Err(err("must not end in .sock or .d"));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $ty(String);

        impl $ty {
            pub fn new(s: &str) -> Result<Self, NameError> {
                check_name($what, s)?;
                Ok(Self(s.to_owned()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $ty {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// An agent's id within its tenant.
    AgentName,
    "agent name"
);
name_type!(
    /// A session of an agent; `default` unless the caller names another.
    SessionName,
    "session name"
);
name_type!(
    /// Who owns a tree and whose quotas apply; `user-<uid>` on one machine.
    TenantId,
    "tenant"
);

impl AgentName {
    /// The generated name SPEC 1 gives an agent whose caller named none:
    /// `<type>-<8 hex>`. `kind` is the agent's type (for example `agent`,
    /// `explore`); it is sanitised so the result is always valid.
    pub fn generate(kind: &str, random: u32) -> AgentName {
        let mut prefix: String = kind
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))
            .take(MAX_NAME - 9)
            .collect();
        if !prefix.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            prefix = format!("agent{prefix}");
            prefix.truncate(MAX_NAME - 9);
        }
        AgentName(format!("{prefix}-{random:08x}"))
    }
}

impl SessionName {
    pub fn default_session() -> SessionName {
        SessionName("default".to_owned())
    }
}

impl TenantId {
    /// The default tenant of a local user.
    pub fn for_uid(uid: u32) -> TenantId {
        TenantId(format!("user-{uid}"))
    }
}

/// A run's id: a UUIDv7 in its canonical lowercase form. UUIDv7 sorts by start
/// time, which keeps the runs of an agent in order without a separate counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

impl RunId {
    pub fn parse(s: &str) -> Result<RunId, NameError> {
        let err = |rule| NameError {
            what: "run id",
            input: s.escape_debug().to_string(),
            rule,
        };
        let b = s.as_bytes();
        if b.len() != 36 {
            return Err(err("must be a UUID of 36 characters"));
        }
        for (i, c) in b.iter().enumerate() {
            let dash = matches!(i, 8 | 13 | 18 | 23);
            let ok = if dash {
                *c == b'-'
            } else {
                c.is_ascii_digit() || (b'a'..=b'f').contains(c)
            };
            if !ok {
                return Err(err("must be a lowercase hyphenated UUID"));
            }
        }
        if b[14] != b'7' {
            return Err(err("must be a version 7 UUID"));
        }
        Ok(RunId(s.to_owned()))
    }

    /// Builds a UUIDv7 from a Unix time in milliseconds and 74 random bits
    /// (the caller owns the clock and the randomness).
    pub fn v7(unix_ms: u64, rand_a: u16, rand_b: u64) -> RunId {
        let ms = unix_ms & 0xffff_ffff_ffff;
        let a = rand_a & 0x0fff;
        let b = (rand_b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
        RunId(format!(
            "{:08x}-{:04x}-7{:03x}-{:04x}-{:012x}",
            ms >> 16,
            ms & 0xffff,
            a,
            b >> 48,
            b & 0xffff_ffff_ffff
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_the_spec_refuses_are_refused_with_the_rule() {
        for (bad, rule) in [
            ("", "must not be empty"),
            ("../x", "must start with a letter or digit"),
            ("a/b", "may contain only letters, digits and . _ + -"),
            ("x.sock", "must not end in .sock or .d"),
            ("x.d", "must not end in .sock or .d"),
            (".", "must start with a letter or digit"),
            ("..", "must start with a letter or digit"),
            ("-x", "must start with a letter or digit"),
            ("a b", "may contain only letters, digits and . _ + -"),
            ("é", "must start with a letter or digit"),
        ] {
            let e = AgentName::new(bad).unwrap_err();
            assert_eq!(e.rule, rule, "{bad:?}");
            assert!(e.to_string().contains("agent name"), "{e}");
        }
        let long = "a".repeat(65);
        assert_eq!(
            AgentName::new(&long).unwrap_err().rule,
            "must be at most 64 characters"
        );
    }

    #[test]
    fn names_the_spec_allows_are_allowed() {
        for good in [
            "a",
            "A9",
            "rev-123",
            "x.y_z+w-1",
            &"a".repeat(64),
            "x.socks",
            "x.dd",
        ] {
            assert_eq!(AgentName::new(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn generated_names_are_valid_and_shaped() {
        let n = AgentName::generate("explore", 0xdead_beef);
        assert_eq!(n.as_str(), "explore-deadbeef");
        assert!(AgentName::new(AgentName::generate("../../etc", 1).as_str()).is_ok());
        assert!(AgentName::new(AgentName::generate("", 1).as_str()).is_ok());
        assert!(AgentName::new(AgentName::generate(&"x".repeat(200), 1).as_str()).is_ok());
    }

    #[test]
    fn run_ids_are_uuid_v7() {
        let r = RunId::v7(1_700_000_000_000, 0xabc, 0x1234_5678_9abc_def0);
        assert_eq!(RunId::parse(r.as_str()).unwrap(), r);
        assert!(RunId::parse("not-a-uuid").is_err());
        assert!(RunId::parse("0189c7a4-1234-4abc-8def-0123456789ab").is_err());
        // Later times sort later.
        assert!(RunId::v7(2, 0, 0) > RunId::v7(1, 0xfff, u64::MAX));
    }

    proptest! {
        #[test]
        fn a_valid_name_is_a_safe_path_component(s in "\\PC{0,70}") {
            if let Ok(n) = AgentName::new(&s) {
                prop_assert!(!n.as_str().contains('/'));
                prop_assert!(n.as_str() != "." && n.as_str() != "..");
                prop_assert!(n.as_str().len() <= 64);
                prop_assert!(!n.as_str().ends_with(".sock") && !n.as_str().ends_with(".d"));
            }
        }
    }
}
