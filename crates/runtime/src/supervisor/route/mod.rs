//! The loop's routing: where the follow-ups of the supervisor's parts are
//! applied. A part decides, records what it owns and returns what it needs
//! another part to do; the applier here does it, in the order given, and
//! hands back to the part what it asked to hear (a worker admitted or
//! refused). A part never holds the dispatcher, so its decisions can move
//! off the loop while their effects stay on it.

mod admission;
mod cluster;
mod ends;
mod jobs;
mod launch;
mod models;
mod protocol;
mod restart;
mod routed;
mod shutdown;
mod sockets;
mod stops;
mod tick;
mod verbs;
