//! The operator, proven off the loop (issue 27: no request waits for the
//! dispatcher only to learn who is asking, so `/healthz` and the operator's
//! reads answer while the loop is busy, or stuck on a store that is away).
//!
//! [`Host::identify`](super::host::Host) on the loop decides every caller,
//! looking at the live agents. This answers the one case that needs none of
//! them, and only when the kernel proves it: a caller outside every tree.
//! Every agent of this supervisor runs in the keeper's PID namespace (or one
//! nested in it) and in a cgroup under this supervisor's base, and so does
//! every process an agent starts (neither can be left without capabilities
//! agents do not have, and the cgroup hierarchies are out of their reach
//! under the veil). So a caller that is
//!
//! - outside this supervisor's cgroup base,
//! - in *this* supervisor's PID and user namespaces (hence not in the
//!   keeper's, nor in one nested in it),
//! - of this supervisor's uid, and
//! - under no other brood daemon's groups,
//!
//! is no agent and no process of an agent: the operator, the same answer the
//! loop gives. Anything short of that proof (no keeper, no cgroups, a
//! namespace that cannot be read) goes to the loop.

use std::path::PathBuf;
use std::sync::Arc;

use brood_launch::KeeperWatch;
use brood_launch::cgroup::Cgroups;

use super::identify::in_another_brood_tree;
use crate::api::Caller;

/// What the proof needs, fixed when the supervisor starts.
pub(crate) struct Outsiders {
    pub(super) uid: u32,
    /// `/proc/self/cgroup` of this process.
    pub(super) own_cgroups: String,
    pub(super) cgroups: Option<Arc<Cgroups>>,
    pub(super) keeper: KeeperWatch,
}

impl Outsiders {
    /// The operator, when the kernel proves the caller behind `pid` (with
    /// the credentials' `uid`) outside every tree; `None`: ask the loop.
    pub(crate) fn operator(&self, pid: i32, uid: u32) -> Option<Caller> {
        let cg = self.cgroups.as_ref()?;
        let keeper = self.keeper.pid()?;
        if uid != self.uid {
            return None;
        }
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        if cg.path_of_process_line(&cgroups).is_some() {
            return None;
        }
        if in_another_brood_tree(&cgroups, &self.own_cgroups).is_some() {
            return None;
        }
        let me = std::process::id() as i32;
        for kind in ["pid", "user"] {
            if namespace(kind, pid)? != namespace(kind, me)? {
                return None;
            }
        }
        // The keeper's namespace is not ours (checked positively: the
        // keeper may be between two incarnations).
        if namespace("pid", keeper)? == namespace("pid", me)? {
            return None;
        }
        // The caller may have gone and its pid been reused between the
        // reads: the answer is for the process the reads were of, as the
        // loop's is; a pid whose cgroup file changed says so here.
        let again = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        (again == cgroups).then_some(Caller::User { uid })
    }
}

/// The namespace of a kind (`pid`, `user`) a process is in: the target of
/// `/proc/<pid>/ns/<kind>` (namespaces(7)); `None` when it cannot be read.
fn namespace(kind: &str, pid: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()
}
