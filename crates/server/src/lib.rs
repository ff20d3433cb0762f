//! brood's transports: the HTTP API of SPEC 11, one router served on the
//! control socket `$BROOD_ROOT/brood.sock` (callers identified from their peer
//! credentials) and, when asked, on a loopback TCP port (callers holding the
//! bearer token in `$BROOD_ROOT/token`); its event stream over SSE; its
//! OpenAPI document, generated from the handlers; and the client the CLI
//! uses. docs/api.md is the reference. And the per-agent sockets of SPEC 8
//! (`agent_sockets`, docs/agent-socket.md): the runtime decides when one
//! exists, this crate binds and serves it.
//!
//! The server holds no state of its own that matters: every request becomes a
//! verb of the runtime's `Supervisor` (mutations, through its dispatcher) or a
//! read of the store (`View`), and every reply is a `brood_api` type.

mod agent_socket;
mod app;
mod auth;
mod body;
pub mod client;
pub mod door;
mod error;
mod events;
pub mod gateway;
mod idempotency;
mod listen;
mod mcp;
mod narrow;
mod offload;
pub mod openapi;
mod peer;
mod routes;
mod secret;
mod starting;
mod state;
mod trace;
mod ui;

pub use door::{Entrances, agent_sockets};
pub use listen::{bind_tcp, bind_unix, serve_tcp, serve_unix, socket_of};
pub use narrow::HEADER as MCP_SESSION_HEADER;
pub use starting::{Started, Starting, serve_tcp_from_start, serve_unix_from_start, starting};
pub use state::{Api, EventLimits, Token, UiLimits, event_json};
