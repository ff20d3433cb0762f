//! Who is alive: a supervisor's identity (`s<pid>-<start time>`), and
//! whether the host of an agent record still runs it, asked of the process
//! table that can answer (this machine's, or the cluster's registry for a
//! node that lives in another).

use serde_json::Value;

use brood_store::{Node, Store};

/// Our identity as a supervisor: `s<pid>-<starttime>`, unique for the life of the
/// host, so a later incarnation can tell whether its predecessor still runs.
pub fn supervisor_id(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime) counted after the ")" that ends the command name.
    let rest = stat.rsplit_once(')')?.1;
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("s{pid}-{start}"))
}

/// The label brood adds to every node's own: the process table its
/// supervisor id's pid belongs to (the machine's boot id and the PID
/// namespace's inode), so that whether a node lives is asked of a process
/// table only by a node that shares it: not across machines, nor across
/// containers of one machine.
pub(crate) const MACHINE_LABEL: &str = "brood.pids";

/// This supervisor's process table (empty parts if unreadable).
fn this_machine() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let ns = std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{boot} {ns}")
    })
}

/// A node's labels as recorded: its own, and the machine it runs on.
pub(super) fn node_labels(labels: &std::collections::BTreeMap<String, String>) -> String {
    let mut all = labels.clone();
    all.insert(MACHINE_LABEL.to_owned(), this_machine().to_owned());
    serde_json::to_string(&all).unwrap_or_else(|_| "{}".into())
}

/// Whether the host `id` of an agent record still runs it. A supervisor of
/// this machine is alive while its process answers to the id (a registered
/// node that was SIGKILLed is dead at once, not at its heartbeat's expiry).
/// A node of another machine cannot be judged by this machine's process
/// table: it is alive while registered (one whose heartbeat expired is
/// declared lost by `declare_lost_nodes`, with its own rules).
pub(crate) fn host_alive(id: &str, nodes: &[Node]) -> bool {
    // An agent placed on a node and not claimed yet waits for that node.
    let id = brood_store::placed_for(id).unwrap_or(id);
    let elsewhere = nodes.iter().any(|n| {
        n.id == id
            && serde_json::from_str::<Value>(&n.labels)
                .ok()
                .and_then(|l| l[MACHINE_LABEL].as_str().map(|m| m != this_machine()))
                .unwrap_or(true)
    });
    elsewhere || supervisor_alive(id)
}

/// The nodes registered in the store (none when it cannot be read: then
/// only this machine's process table decides).
pub(crate) fn registered_nodes(store: &dyn Store) -> Vec<Node> {
    match store.nodes() {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "reading the registered nodes");
            Vec::new()
        }
    }
}

pub(super) fn supervisor_alive(id: &str) -> bool {
    let Some(pid) = id
        .strip_prefix('s')
        .and_then(|r| r.split_once('-'))
        .and_then(|(p, _)| p.parse::<i32>().ok())
    else {
        return false;
    };
    supervisor_id(pid).as_deref() == Some(id)
}
