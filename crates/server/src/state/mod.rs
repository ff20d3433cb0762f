//! What every handler shares: the supervisor, the event hub, the token and
//! the idempotency keys in flight.

use std::sync::Arc;

use brood_core::Code;
use brood_runtime::{ApiError, Caller, Supervisor, View};

pub(crate) mod hub;
mod in_flight;
mod mcp_sessions;
mod token;
mod ui_sessions;

pub(crate) use hub::Hub;
pub use hub::{EventLimits, event_json};
pub(crate) use in_flight::InFlight;
pub(crate) use mcp_sessions::Sessions;
pub use token::Token;
pub use ui_sessions::UiLimits;
pub(crate) use ui_sessions::UiSessions;

/// The HTTP API in front of one supervisor. Cheap to clone.
#[derive(Clone)]
pub struct Api(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub sup: Supervisor,
    pub hub: Hub,
    /// What a TCP caller must present; `None` when no TCP listener was asked for.
    pub token: Option<Token>,
    pub in_flight: InFlight,
    /// The open stdio MCP sessions' capabilities (`narrow`).
    pub mcp_sessions: Sessions,
    /// The web UI's sessions (`ui::session`).
    pub ui_sessions: UiSessions,
}

impl Api {
    /// The API of `sup`; `token` is required of TCP callers (and only of them).
    /// Starts the event hub's reader, so call it inside the tokio runtime.
    pub fn new(sup: Supervisor, token: Option<Token>) -> Api {
        Api::with_event_limits(sup, token, EventLimits::default())
    }

    /// [`Api::new`] with other limits for slow event subscribers.
    pub fn with_event_limits(sup: Supervisor, token: Option<Token>, limits: EventLimits) -> Api {
        let hub = Hub::start(&sup, limits);
        Api(Arc::new(Inner {
            sup,
            hub,
            token,
            in_flight: InFlight::default(),
            mcp_sessions: Default::default(),
            ui_sessions: Default::default(),
        }))
    }

    /// How long the web UI's sessions last (default: [`UiLimits::default`]).
    pub fn set_ui_limits(&self, limits: UiLimits) {
        self.0.ui_sessions.set_limits(limits);
    }

    pub(crate) fn sup(&self) -> &Supervisor {
        &self.0.sup
    }

    pub(crate) fn view(&self) -> View {
        self.0.sup.view()
    }
}

/// Reads are narrowed like acts: an agent sees its own subtree only.
pub(crate) fn may_see(
    api: &Api,
    caller: &Caller,
    name: &brood_core::AgentName,
) -> Result<(), ApiError> {
    let Caller::Agent(me) = caller else {
        return Ok(());
    };
    let sup = api.sup();
    match sup.store().is_ancestor_or_self(sup.tenant(), me, name) {
        Ok(true) => Ok(()),
        Ok(false) => Err(ApiError::new(
            Code::Forbidden,
            format!("agent {me} may see only its own subtree, not {name}"),
        )),
        Err(brood_store::StoreError::NotFound { .. }) => Err(ApiError::new(
            Code::NotFound,
            format!("no agent named {:?}", name.as_str()),
        )),
        // Away is 503, not "outside the subtree" and not 500.
        Err(e) => Err(ApiError::from(e)),
    }
}
