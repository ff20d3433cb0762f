//! Who this supervisor is, read-only once it has started: its configuration,
//! the identity a root agent holds, the host's containment, and the shared
//! handles it gives out (its own inbox, the intake, the metrics).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use brood_launch::env::Base;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Cmd, Config, HostInfo};
use crate::paths::Paths;

pub(super) struct Host {
    pub(super) cfg: Config,
    /// The loop's own inbox: where work done elsewhere comes back as a `Cmd`.
    pub(super) tx: mpsc::UnboundedSender<Cmd>,
    pub(super) paths: Paths,
    /// The environment every agent starts from.
    pub(super) base: Base,
    /// This supervisor's id (`supervisor_id`): its name among nodes, lease
    /// holders and slot shares.
    pub(super) me: String,
    /// The containment part of every agent's `meta.json`.
    pub(super) meta: Value,
    /// What the host gives this supervisor (handed to the handles it makes).
    pub(super) info: HostInfo,
    /// The operator's identity: what a root agent holds.
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) groups: BTreeSet<u32>,
    /// `/proc/self/cgroup` of this process: where it sits on each hierarchy,
    /// what a caller's groups are compared with (`identify`).
    pub(super) own_cgroups: String,
    /// The operator proven off the loop, shared with the handles.
    pub(super) outsiders: Arc<super::outsider::Outsiders>,
    /// Whether the store answers (its probe), shared with the handles.
    pub(super) store_health: Arc<crate::store_health::StoreHealth>,
    /// This binary, executable by every agent (so it can call `brood spawn`).
    pub(super) brood_exe: Option<PathBuf>,
    /// The handles' intake (rates, the creation's paths), shared with them.
    pub(super) intake: Arc<crate::intake::Intake>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    /// The spans of admissions and runs, handed off without waiting.
    pub(super) tracer: crate::trace::Tracer,
}
