//! What a creation asks for besides its program and its policy (SPEC 3, 7):
//! how the program speaks to brood, how long it lives, how it is isolated.
//! Parsed once at the edge; the runtime matches on these, never on strings.

/// How an agent's program speaks to the supervisor (SPEC 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// JSON lines on stdin/stdout.
    Brood,
    /// A plain program: handoff on stdin, stdout becomes the result, exit 0 is done.
    Exec,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Brood => "brood",
            Protocol::Exec => "exec",
        }
    }
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "brood" => Some(Protocol::Brood),
            "exec" => Some(Protocol::Exec),
            _ => None,
        }
    }
}

/// How long an agent lives (SPEC 3 `life`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Life {
    /// Dies with its parent (the default).
    #[default]
    Owned,
    /// Owned, and its object is removed after its run (it comes back on resume).
    Temp,
    /// Outlives its parent; needs a tenant grant (none grants it yet).
    Detached,
}

impl Life {
    pub fn as_str(self) -> &'static str {
        match self {
            Life::Owned => "owned",
            Life::Temp => "temp",
            Life::Detached => "detached",
        }
    }
    pub fn parse(s: &str) -> Option<Life> {
        match s {
            "owned" => Some(Life::Owned),
            "temp" => Some(Life::Temp),
            "detached" => Some(Life::Detached),
            _ => None,
        }
    }
}

/// How an agent is isolated (SPEC 3 `iso`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Iso {
    /// The host's mount table (under the veil) and network.
    #[default]
    None,
    /// A private mount namespace built from the policy's mounts (and an empty
    /// network namespace when the policy grants no network).
    Ns,
}

impl Iso {
    pub fn as_str(self) -> &'static str {
        match self {
            Iso::None => "none",
            Iso::Ns => "ns",
        }
    }
    pub fn parse(s: &str) -> Option<Iso> {
        match s {
            "none" => Some(Iso::None),
            "ns" => Some(Iso::Ns),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_word_parses_back() {
        for p in [Protocol::Brood, Protocol::Exec] {
            assert_eq!(Protocol::parse(p.as_str()), Some(p));
        }
        for l in [Life::Owned, Life::Temp, Life::Detached] {
            assert_eq!(Life::parse(l.as_str()), Some(l));
        }
        for i in [Iso::None, Iso::Ns] {
            assert_eq!(Iso::parse(i.as_str()), Some(i));
        }
        assert_eq!(Life::parse("Owned"), None);
        assert_eq!(Iso::parse(""), None);
    }
}
