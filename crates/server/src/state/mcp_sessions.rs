//! The open stdio MCP sessions' capabilities (`narrow`): each one's digest
//! and the root it narrows to.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use brood_core::AgentName;

use crate::secret::{digest, new_secret};

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

    pub(crate) fn root_of(&self, cap: &str) -> Option<AgentName> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&digest(cap))
            .cloned()
    }
}
