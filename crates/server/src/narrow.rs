//! A request narrowed to a stdio MCP session's root (issue 24, docs/mcp.md
//! "Sessions are confined"). `brood mcp` runs outside every agent, so on
//! the socket the kernel says it is the operator; the tools it serves are
//! driven by a model, which must reach only the session's own subtree. So
//! `POST /api/mcp/session` hands the operator who made the root a
//! capability (256 random bits) that lives exactly as long as the session's
//! held stream, and every tool call carries it in [`HEADER`]: the server
//! then takes the request as `Caller::Agent(root)`, and the per-agent
//! narrowing every route already applies (reads through `may_see`, acts
//! through the supervisor's descendants-only rule, `parent` only its own,
//! jobs only its own) confines it. The client's good will is not needed for
//! what the capability allows; it is needed only to send it, and `brood
//! mcp` (brood's own code, not the model) always does.
//!
//! A capability only narrows: it is honoured only from a caller that may
//! see the root already (the operator; an agent only for a root in its own
//! subtree, which no session root ever is), and a header that names no open
//! session is refused, never ignored, so a stale or forged one cannot fall
//! back to the caller's own, wider rights.

use axum::http::HeaderMap;
use brood_core::Code;
use brood_runtime::{ApiError, Caller};

use crate::state::{Api, may_see};

/// The header a narrowed request carries: the session's capability.
pub const HEADER: &str = "x-brood-session";

/// The caller a request acts as: `caller`, or the session root its
/// [`HEADER`] names when `caller` may see that root.
pub(crate) fn narrow(api: &Api, headers: &HeaderMap, caller: Caller) -> Result<Caller, ApiError> {
    let Some(v) = headers.get(HEADER) else {
        return Ok(caller);
    };
    let unknown = || {
        ApiError::new(
            Code::Forbidden,
            "X-Brood-Session names no open MCP session (it ended, or the daemon restarted); \
             restart the MCP server for a new session",
        )
    };
    let cap = v.to_str().map_err(|_| unknown())?.trim();
    let root = api.0.mcp_sessions.root_of(cap).ok_or_else(unknown)?;
    may_see(api, &caller, &root).map_err(|_| {
        ApiError::new(
            Code::Forbidden,
            format!(
                "X-Brood-Session narrows to {root}, outside the caller's own subtree: a session only narrows"
            ),
        )
    })?;
    Ok(Caller::Agent(root))
}
