//! brood-runtime: the supervisor.
//!
//! * [`supervisor`]: the dispatcher loop, admission, lifecycle, fate sharing.
//! * `supervisor::io`: one task per agent process (protocol frames, stderr, exit).
//! * [`lower`]: a policy's file rules lowered into landlock grants.
//! * [`config`]: the platform configuration file (quotas, limits).
//! * [`intake`]: what a creation names on the filesystem, checked before it is
//!   admitted (issue 24).
//! * [`limits`]: the work one request or caller may cause, and the callers'
//!   rates.
//! * [`api`]: the verbs every surface shares, and their errors.
//! * [`enforce`]: a policy lowered into the sandbox and limits the kernel enforces.
//! * [`agent_socket`]: the per-agent sockets (`ctx/agent/<name>.sock`, SPEC 8).
//! * [`projection`]: the ctx tree on disk, written off the hot path.
//! * [`channel`]: what a child hands back (refs, artifacts, the context pack).
//! * [`logs`]: an agent's log (its stderr), read by offset or from its end.
//! * [`objects`]: the static control files of an agent object, from its record.
//! * [`metrics`]: counters and the Prometheus text of `/metrics`.
//! * [`rebuild`]: the whole ctx projection rebuilt from the store (`brood fsck`).
//! * [`remove`]: finished trees removed, and what a removal leaves to do (issue 25).
//! * [`room`]: room given back by the maps holding an entry a live agent.
//! * [`view`]: read-only views of the store (ps, tree, show).
//! * [`nodes`]: the nodes sharing the store, as the surfaces show them.
//! * [`jobs`]: jobs (SPEC 10): creation checked whole, then recorded; their views.
//! * [`paths`]: the layout of `$BROOD_ROOT`.
//! * [`slots`]: per-tenant concurrency-slot counters (embedded, the store's
//!   shares, or Redis).
//! * [`agentruntime`]: events in the form of the Agent Runtime draft standard.
//! * [`veil`]: what no agent may reach (cgroups, `$BROOD_ROOT`, the store's
//!   files), for the launcher's veil and the refusal of policies naming it.
//!
//! **Invariant:** every state change is committed to the store before anyone
//! (a caller, an agent, a file reader) can observe it.

pub mod agent_socket;
pub mod agentruntime;
pub mod api;
pub mod channel;
pub mod config;
pub mod enforce;
mod hosts;
pub mod intake;
pub mod jobs;
pub mod limits;
pub mod logs;
pub mod lower;
pub mod metrics;
pub mod models;
pub mod nodes;
pub mod objects;
pub mod paths;
pub mod projection;
pub mod rebuild;
pub mod remove;
pub mod room;
mod shown;
pub mod slots;
pub mod store_health;
pub mod supervisor;
pub mod trace;
pub mod veil;
pub mod view;

pub use api::{ApiError, Caller, SpawnRequest, check_secrets};
pub use supervisor::{
    Config, DoorHost, Endpoint, Gateway, GatewayHost, Hooks, HostInfo, ModelRefusal, NodeConfig,
    SocketHost, StartError, Supervisor, Sweeper,
};
pub use view::View;
