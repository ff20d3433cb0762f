//! What every handler shares: the supervisor, the event hub, the token and
//! the idempotency keys in flight.

use std::sync::Arc;

use axum::Router;
use brood_runtime::{Supervisor, View};

use crate::auth::Token;
use crate::events::{EventLimits, Hub};
use crate::idempotency::InFlight;
use crate::ui::session::UiLimits;

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
    pub mcp_sessions: crate::narrow::Sessions,
    /// The web UI's sessions (`ui::session`).
    pub ui_sessions: crate::ui::session::UiSessions,
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

    /// The router, every route of SPEC 11, with authentication in front.
    pub fn router(&self) -> Router {
        crate::routes::router(self.clone())
    }

    pub(crate) fn sup(&self) -> &Supervisor {
        &self.0.sup
    }

    pub(crate) fn view(&self) -> View {
        self.0.sup.view()
    }
}
