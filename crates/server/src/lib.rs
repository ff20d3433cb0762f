//! brood-server: the transports in front of the runtime. Everything here is a
//! client of the runtime's public API (`brood_runtime::Supervisor`,
//! `brood_runtime::api`); the dispatcher knows nothing of sockets or wire
//! formats.
//!
//! * [`control`]: the control socket (`$BROOD_ROOT/brood.sock`): JSON-lines
//!   requests, `events` streams, and `GET /metrics`; callers identified from
//!   the peer's credentials and cgroup.
//!
//! The per-agent sockets (`ctx/agent/<name>.sock`) still live in the runtime,
//! beside the dispatcher hooks they serve; the HTTP API will land here.

pub mod control;
