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

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use axum::http::HeaderMap;
use brood_core::{AgentName, Code};
use brood_runtime::{ApiError, Caller};

use crate::auth::may_see;
use crate::secret::{digest, new_secret};
use crate::state::Api;

/// The header a narrowed request carries: the session's capability.
pub const HEADER: &str = "x-brood-session";

/// The open stdio sessions: each capability's digest and the root it
/// narrows to.
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<[u8; 32], AgentName>>);

impl Sessions {
    /// A new capability for `root`, valid until [`Sessions::revoke`].
    pub(crate) fn issue(&self, root: &AgentName) -> std::io::Result<String> {
        let cap = new_secret()?;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest(&cap), root.clone());
        Ok(cap)
    }

    /// The session ended: its capability is refused from now on.
    pub(crate) fn revoke(&self, cap: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&digest(cap));
    }

    fn root_of(&self, cap: &str) -> Option<AgentName> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&digest(cap))
            .cloned()
    }
}

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
