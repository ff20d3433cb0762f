//! brood-core: the pure domain of brood.
//!
//! Validated names and ids (SPEC 1), the agent status machine with its reasons and
//! its one transition function (SPEC 6), the mapping of a status onto the ctx ABI's
//! words, the refusal codes every surface reports (SPEC 5), the capability
//! policy with its attenuation check (SPEC 5: `policy`, `attenuation`), the
//! quotas of agent trees with their defaults and ceilings (SPEC 9: `quota`), the
//! events recorded in an agent's log (`event`), the status machines of jobs and
//! their items (SPEC 10: `job`), and what a creation asks for
//! besides its policy (`spec`: protocol, life, isolation). Nothing
//! here does IO, reads a clock or knows about serde: time and randomness come in
//! as arguments, so every rule can be tested exhaustively.

pub mod attenuation;
pub mod code;
pub mod event;
pub mod job;
pub mod name;
pub mod policy;
pub mod quota;
pub mod rate;
pub mod spec;
pub mod status;
pub mod time;

pub use attenuation::{ParentView, Refusal};
pub use code::Code;
pub use event::{AgentEvent, ModelCall};
pub use job::{IllegalJobTransition, ItemStatus, JobStatus};
pub use name::{AgentName, NameError, RunId, SessionName, TenantId};
pub use policy::{
    AbsPath, FileRule, Mode, ModelRate, MountEntry, MountOpts, Network, Policy, PolicyError,
    PolicyRequest, Resources, Rule, RuleClass,
};
pub use quota::{QuotaConfig, QuotaError, Quotas, TenantQuotas};
pub use spec::{Iso, Life, Protocol};
pub use status::{
    AbiView, CancelReason, ChannelStatus, FailReason, IllegalTransition, ProcessStatus,
    SessionState, Status, Terminal,
};
