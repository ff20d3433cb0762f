//! brood-core: the pure domain of brood.
//!
//! Validated names and ids (SPEC 1), the agent status machine with its reasons and
//! its one transition function (SPEC 6), the mapping of a status onto the ctx ABI's
//! words, and the refusal codes every surface reports (SPEC 5). Nothing here does
//! IO, reads a clock or knows about serde: time and randomness come in as
//! arguments, so every rule can be tested exhaustively.

pub mod code;
pub mod name;
pub mod status;

pub use code::Code;
pub use name::{AgentName, NameError, RunId, SessionName, TenantId};
pub use status::{
    AbiView, CancelReason, ChannelStatus, FailReason, IllegalTransition, ProcessStatus,
    SessionState, Status, Terminal,
};
