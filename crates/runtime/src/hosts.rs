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

/// The nodes registered in the store. A read that fails is an error, never
/// "no nodes" (issue 28): with no nodes, [`host_alive`] would judge every
/// other machine's supervisor by this machine's process table, where it looks
/// dead, and its agents would be recorded lost.
pub(crate) fn registered_nodes(store: &dyn Store) -> Result<Vec<Node>, brood_store::StoreError> {
    store.nodes()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use brood_store::prelude::*;
    use brood_store::{NewNode, SqliteStore};

    use super::{MACHINE_LABEL, host_alive, registered_nodes};

    /// Issue 28: a read of the nodes that fails is an error, never "no
    /// nodes". Were it empty, a node of another machine would be judged by
    /// this machine's process table, look dead, and its agents be recorded
    /// lost by the orphan sweeper.
    #[test]
    fn nodes_that_cannot_be_read_are_an_error_not_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("brood.db");
        let store = SqliteStore::open(&path).unwrap();
        let id = "s1-elsewhere";
        store
            .register_node(&NewNode {
                id: id.into(),
                address: "127.0.0.1:1".into(),
                labels: serde_json::json!({ MACHINE_LABEL: "another machine" }).to_string(),
                capacity: None,
            })
            .unwrap();
        let nodes = registered_nodes(&store).unwrap();
        assert!(
            host_alive(id, &nodes),
            "a registered node of another machine is alive"
        );
        // The table goes under the store (a damaged file, an operator's
        // mistake): its reads now fail.
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE nodes")
            .unwrap();
        let r = registered_nodes(&store);
        assert!(r.is_err(), "a failed read was taken for a fact: {r:?}");
    }
}
