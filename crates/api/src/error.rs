//! Errors: `{"error":{"code","reason","message"}}` (SPEC 11), and the one
//! mapping from brood's refusal codes to HTTP statuses.

use brood_core::Code;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An error reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong: `code` is what programs match on (SPEC 5's refusal codes
/// and brood's own), `reason` the same word (the protocol's replies carry
/// both), `message` a sentence for people naming what was wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub reason: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: Code, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.as_str().to_owned(),
                reason: code.as_str().to_owned(),
                message: message.into(),
            },
        }
    }
}

/// SPEC 11's status for a code: 400 malformed, 401 no or wrong token, 403
/// refused (attenuation, another agent's subtree), 404 unknown, 409 conflict
/// or name taken, 413 body (or a job's items) over its limit, 422 an
/// idempotency key reused with another body, 429 quota, budget or rate,
/// 501 not built yet, 503 unavailable.
pub fn http_status(code: Code) -> u16 {
    match code {
        Code::BadRequest | Code::InvalidName => 400,
        Code::Unauthorized => 401,
        Code::NotFound => 404,
        Code::Conflict | Code::NameTaken | Code::Cycle => 409,
        Code::TooLarge => 413,
        Code::IdempotencyMismatch => 422,
        Code::QuotaDepth
        | Code::QuotaFanout
        | Code::QuotaTreeSize
        | Code::QuotaConcurrent
        | Code::CreateLimit
        | Code::BudgetExceeded
        | Code::RateLimited
        | Code::QuotaJobs
        | Code::QuotaItems => 429,
        Code::NotImplemented => 501,
        Code::Unavailable => 503,
        Code::Internal => 500,
        Code::ParentMismatch
        | Code::UnsupportedLifecycle
        | Code::IdentityExpansion
        | Code::GroupExpansion
        | Code::PolicyExpansion
        | Code::ToolExpansion
        | Code::FileExpansion
        | Code::MountExpansion
        | Code::NetworkExpansion
        | Code::ModelExpansion
        | Code::ToolPathExpansion
        | Code::WindowExpansion
        | Code::WindowUnknown
        | Code::DepthLimit
        | Code::ReservedPath
        | Code::Forbidden => 403,
    }
}
