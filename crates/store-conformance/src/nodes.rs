//! The nodes sharing a store (issue 15): registered, heartbeating, listed
//! with their load, leaving.

use super::*;
use brood_store::NewNode;

fn node(id: &str, labels: &str) -> NewNode {
    NewNode {
        id: id.into(),
        address: format!("/run/{id}.sock"),
        labels: labels.into(),
        capacity: Some(64),
    }
}

pub fn nodes_register_heartbeat_and_show_their_load(store: &dyn Store) {
    let t = tenant("conf-nodes");
    let a = "conf-nodes-a";
    let b = "conf-nodes-b";
    let at = now();
    let n = store
        .register_node(&node(a, r#"{"zone": "one"}"#), at)
        .unwrap();
    assert_eq!((n.started_ms, n.heartbeat_ms, n.live_agents), (at, at, 0));
    store.register_node(&node(b, "{}"), at).unwrap();
    // Two agents run on a (its supervisor id is the node's), one ends.
    let root_new = new_agent(&t, "n-root", None, a);
    let root = start(
        store,
        &store.admit(&root_new, &spawn_events(&root_new)).unwrap(),
    );
    let kid_new = new_agent(&t, "n-kid", Some("n-root"), a);
    let kid = start(
        store,
        &store.admit(&kid_new, &spawn_events(&kid_new)).unwrap(),
    );
    end(store, &kid, Terminal::Completed, Some("done"));
    let _ = root;
    store.heartbeat_node(a, at + 500).unwrap();
    // A heartbeat never goes back in time.
    store.heartbeat_node(a, at + 100).unwrap();
    let ours: Vec<_> = store
        .nodes()
        .unwrap()
        .into_iter()
        .filter(|n| n.id.starts_with("conf-nodes-"))
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(ours[0].id, a);
    assert_eq!(
        (ours[0].heartbeat_ms, ours[0].live_agents, ours[0].capacity),
        (at + 500, 1, Some(64))
    );
    assert_eq!(ours[0].labels, r#"{"zone": "one"}"#);
    assert_eq!((ours[1].id.as_str(), ours[1].live_agents), (b, 0));
    // Registering again replaces the record and restarts its clock.
    let again = store
        .register_node(&node(b, r#"{"gpu": "yes"}"#), at + 900)
        .unwrap();
    assert_eq!(again.started_ms, at + 900);
    // A node that leaves is gone; a heartbeat for it is refused.
    store.leave_node(b).unwrap();
    let e = store.heartbeat_node(b, at + 1000).unwrap_err();
    assert!(
        matches!(&e, StoreError::Refused { code: Code::NotFound, message } if message.contains(b)),
        "{e:?}"
    );
    assert!(!store.nodes().unwrap().iter().any(|n| n.id == b));
    // Labels that are not an object of strings are refused, nothing written.
    let e = store
        .register_node(&node("conf-nodes-c", "[1]"), at)
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Refused {
                code: Code::BadRequest,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        !store
            .nodes()
            .unwrap()
            .iter()
            .any(|n| n.id == "conf-nodes-c")
    );
}
