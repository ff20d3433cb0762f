//! The refusal codes of SPEC 5 and the runtime's own error codes.
//!
//! A code is what programs match on; it travels in protocol replies, CLI errors and
//! (later) HTTP error bodies. Keep the spelling exactly as the spec gives it.

use std::fmt;

/// Why a request was refused. The first block is SPEC 5's creation checks, in the
/// order the spec runs them; the second block is brood's codes for other verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidName,
    ParentMismatch,
    UnsupportedLifecycle,
    IdentityExpansion,
    GroupExpansion,
    PolicyExpansion,
    ToolExpansion,
    FileExpansion,
    MountExpansion,
    NetworkExpansion,
    ModelExpansion,
    ToolPathExpansion,
    WindowExpansion,
    WindowUnknown,
    BudgetExceeded,
    DepthLimit,
    CreateLimit,
    QuotaDepth,
    QuotaFanout,
    QuotaTreeSize,
    QuotaConcurrent,
    Cycle,
    NameTaken,
    /// A policy names brood's own machinery (a cgroup hierarchy, `$BROOD_ROOT`
    /// outside `ctx/`, the store's files): no agent may be granted those, and
    /// the request is refused rather than silently narrowed (issue 11).
    ReservedPath,
    /// The named agent (or session, run) does not exist.
    NotFound,
    /// The request is well formed but the agent's state does not allow it
    /// (for example `send` to a finished agent).
    Conflict,
    /// The request itself is malformed (missing or mistyped argument).
    BadRequest,
    /// The caller may not do this (for example acting on an agent outside its subtree).
    Forbidden,
    /// The runtime failed; details are in the supervisor's log.
    Internal,
    /// The HTTP API was called without its bearer token, or with a wrong one.
    Unauthorized,
    /// A request body over the API's limit.
    TooLarge,
    /// An `Idempotency-Key` used again with a different request.
    IdempotencyMismatch,
    /// A route of the contract this version does not serve yet (jobs).
    NotImplemented,
    /// The runtime cannot take the request now (shutting down).
    Unavailable,
    /// A caller asked faster than its rate (agents created a second): it may
    /// ask again after the time the answer gives (issue 24).
    RateLimited,
    /// The tenant's unfinished jobs are at their limit (issue 24).
    QuotaJobs,
    /// The items of the tenant's unfinished jobs are at their limit (issue 24).
    QuotaItems,
}

impl Code {
    pub const ALL: [Code; 37] = [
        Code::InvalidName,
        Code::ParentMismatch,
        Code::UnsupportedLifecycle,
        Code::IdentityExpansion,
        Code::GroupExpansion,
        Code::PolicyExpansion,
        Code::ToolExpansion,
        Code::FileExpansion,
        Code::MountExpansion,
        Code::NetworkExpansion,
        Code::ModelExpansion,
        Code::ToolPathExpansion,
        Code::WindowExpansion,
        Code::WindowUnknown,
        Code::BudgetExceeded,
        Code::DepthLimit,
        Code::CreateLimit,
        Code::QuotaDepth,
        Code::QuotaFanout,
        Code::QuotaTreeSize,
        Code::QuotaConcurrent,
        Code::Cycle,
        Code::NameTaken,
        Code::ReservedPath,
        Code::NotFound,
        Code::Conflict,
        Code::BadRequest,
        Code::Forbidden,
        Code::Internal,
        Code::Unauthorized,
        Code::TooLarge,
        Code::IdempotencyMismatch,
        Code::NotImplemented,
        Code::Unavailable,
        Code::RateLimited,
        Code::QuotaJobs,
        Code::QuotaItems,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidName => "InvalidName",
            Code::ParentMismatch => "ParentMismatch",
            Code::UnsupportedLifecycle => "UnsupportedLifecycle",
            Code::IdentityExpansion => "IdentityExpansion",
            Code::GroupExpansion => "GroupExpansion",
            Code::PolicyExpansion => "PolicyExpansion",
            Code::ToolExpansion => "ToolExpansion",
            Code::FileExpansion => "FileExpansion",
            Code::MountExpansion => "MountExpansion",
            Code::NetworkExpansion => "NetworkExpansion",
            Code::ModelExpansion => "ModelExpansion",
            Code::ToolPathExpansion => "ToolPathExpansion",
            Code::WindowExpansion => "WindowExpansion",
            Code::WindowUnknown => "WindowUnknown",
            Code::BudgetExceeded => "BudgetExceeded",
            Code::DepthLimit => "DepthLimit",
            Code::CreateLimit => "CreateLimit",
            Code::QuotaDepth => "QuotaDepth",
            Code::QuotaFanout => "QuotaFanout",
            Code::QuotaTreeSize => "QuotaTreeSize",
            Code::QuotaConcurrent => "QuotaConcurrent",
            Code::Cycle => "Cycle",
            Code::NameTaken => "NameTaken",
            Code::ReservedPath => "ReservedPath",
            Code::NotFound => "NotFound",
            Code::Conflict => "Conflict",
            Code::BadRequest => "BadRequest",
            Code::Forbidden => "Forbidden",
            Code::Internal => "Internal",
            Code::Unauthorized => "Unauthorized",
            Code::TooLarge => "TooLarge",
            Code::IdempotencyMismatch => "IdempotencyMismatch",
            Code::NotImplemented => "NotImplemented",
            Code::Unavailable => "Unavailable",
            Code::RateLimited => "RateLimited",
            Code::QuotaJobs => "QuotaJobs",
            Code::QuotaItems => "QuotaItems",
        }
    }

    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The process exit code the CLI uses when a request fails with this code
    /// (documented in docs/cli.md): refusals of a creation are 3, unknown names 4,
    /// state conflicts 5, malformed requests 2, internal errors 1.
    pub fn exit_code(self) -> i32 {
        match self {
            Code::NotFound => 4,
            Code::Conflict => 5,
            Code::BadRequest => 2,
            Code::Internal | Code::Unavailable | Code::NotImplemented => 1,
            Code::Unauthorized | Code::TooLarge | Code::IdempotencyMismatch => 2,
            _ => 3,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_spelling() {
        for c in Code::ALL {
            assert_eq!(Code::parse(c.as_str()), Some(c));
        }
        assert_eq!(Code::parse("invalidname"), None);
    }
}
