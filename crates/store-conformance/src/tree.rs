//! Listing and the tree: children, agents, post-order descendants.

use crate::*;

pub fn children_in_creation_order(store: &dyn Store) {
    let t = tenant("conf-children");
    running(store, &t, "root", None);
    for n in ["z", "m", "a"] {
        admit(store, &t, n, Some("root"));
    }
    let kids: Vec<String> = store
        .children(&t, &name("root"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(kids, ["z", "m", "a"]);
    assert!(store.children(&t, &name("z")).unwrap().is_empty());
    assert!(matches!(
        store.children(&t, &name("ghost")),
        Err(StoreError::NotFound { .. })
    ));
}

pub fn agents_lists_all_or_unfinished(store: &dyn Store) {
    let t = tenant("conf-agents");
    let r = running(store, &t, "r", None);
    admit(store, &t, "q", None);
    let d = running(store, &t, "d", None);
    end(store, &d, Terminal::Completed, None);
    let s = running(store, &t, "s", None);
    store
        .mark_stopping(&t, std::slice::from_ref(&s.name), USER, now())
        .unwrap();
    let names = |all| -> Vec<String> {
        store
            .agents(&t, all)
            .unwrap()
            .into_iter()
            .map(|a| a.name.to_string())
            .collect()
    };
    assert_eq!(names(true), ["r", "q", "d", "s"]);
    assert_eq!(names(false), ["r", "q", "s"]);
    assert_eq!(store.agent(&t, &name("ghost")).unwrap(), None);
    assert_eq!(
        store.agent(&tenant("conf-agents-other"), &r.name).unwrap(),
        None
    );
}

/// `current_runs` gives, in one read, exactly the current run of each agent
/// the matching listing lists: never an earlier run of a resumed agent,
/// never one of another tenant or outside the listing.
pub fn current_runs_are_the_listed_agents_runs(store: &dyn Store) {
    let t = tenant("conf-current-runs");
    running(store, &t, "r", None);
    running(store, &t, "a", Some("r"));
    let b = running(store, &t, "b", Some("r"));
    end(store, &b, Terminal::Completed, Some("b done"));
    let c = running(store, &t, "c", Some("r"));
    end(store, &c, Terminal::Completed, None);
    store
        .resume(&t, &c.name, &new_run(), "sup", now(), &[])
        .unwrap();
    admit(store, &t, "q", None);
    running(store, &tenant("conf-current-runs-other"), "r", None);
    let expect = |agents: Vec<Agent>| -> Vec<(String, String)> {
        let mut v: Vec<_> = agents
            .into_iter()
            .map(|a| (a.name.to_string(), a.run.to_string()))
            .collect();
        v.sort();
        v
    };
    let got = |parent: Option<&AgentName>, all| -> Vec<(String, String)> {
        let mut v: Vec<_> = store
            .current_runs(&t, parent, all)
            .unwrap()
            .into_iter()
            .map(|r| (r.agent.to_string(), r.id.to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(got(None, true), expect(store.agents(&t, true).unwrap()));
    assert_eq!(got(None, false), expect(store.agents(&t, false).unwrap()));
    assert_eq!(
        got(Some(&name("r")), true),
        expect(store.children(&t, &name("r")).unwrap())
    );
    assert_eq!(got(None, true).len(), 5, "r, a, b, c and q");
    assert!(
        got(None, false).iter().all(|(n, _)| n != "b"),
        "b ended and is not listed unfinished"
    );
    let c_now = get(store, &t, "c");
    assert_ne!(c_now.run, c.run, "the resume began a new run");
    let b_run = store
        .current_runs(&t, Some(&name("r")), true)
        .unwrap()
        .into_iter()
        .find(|r| r.agent == b.name)
        .unwrap();
    assert_eq!(
        b_run.result.as_deref(),
        Some("b done"),
        "the run as recorded"
    );
    assert!(got(Some(&name("q")), true).is_empty());
}

/// Checks that every agent of `plan` comes after all of its own descendants, found
/// independently through `children`, and that the plan is exactly the subtree.
pub fn assert_post_order(store: &dyn Store, t: &TenantId, top: &AgentName, plan: &[Agent]) {
    let pos = |n: &AgentName| plan.iter().position(|a| a.name == *n);
    let mut all = Vec::new();
    let mut stack = vec![top.clone()];
    while let Some(n) = stack.pop() {
        for kid in store.children(t, &n).unwrap() {
            let (pk, pn) = (
                pos(&kid.name).expect("every descendant is planned"),
                pos(&n),
            );
            if let Some(pn) = pn {
                assert!(pk < pn, "{} must come before its ancestor {n}", kid.name);
            }
            all.push(kid.name.clone());
            stack.push(kid.name);
        }
    }
    // Transitively: a grandchild before its grandparent follows from the edges.
    assert_eq!(all.len(), plan.len(), "the plan is exactly the subtree");
}

pub fn descendants_are_in_post_order(store: &dyn Store) {
    let t = tenant("conf-descendants");
    running(store, &t, "root", None);
    running(store, &t, "a", Some("root"));
    running(store, &t, "b", Some("root"));
    running(store, &t, "a1", Some("a"));
    admit(store, &t, "a2", Some("a"));
    admit(store, &t, "b1", Some("b"));
    admit(store, &t, "a1x", Some("a1"));
    admit(store, &t, "a1y", Some("a1"));
    let plan = store.descendants_post_order(&t, &name("root")).unwrap();
    assert_eq!(plan.len(), 7);
    assert_post_order(store, &t, &name("root"), &plan);
    let names: Vec<&str> = plan.iter().map(|a| a.name.as_str()).collect();
    // Deepest first: level 3, then 2, then 1.
    assert_eq!(
        &names[..2]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        &["a1x", "a1y"].into()
    );
    assert_eq!(
        &names[5..]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        &["a", "b"].into()
    );
    let sub: Vec<String> = store
        .descendants_post_order(&t, &name("a1"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(sub.len(), 2);
    assert!(
        store
            .descendants_post_order(&t, &name("b1"))
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.descendants_post_order(&t, &name("ghost")),
        Err(StoreError::NotFound { .. })
    ));
    // The plan comes back as stored, statuses included.
    assert!(plan.iter().all(|a| *a == get(store, &t, a.name.as_str())));
}

/// `unfinished_below` names, of the agents asked about, exactly those whose
/// end leaves a stop to plan: an unfinished descendant at any depth
/// (queued counts), not a finished subtree, not an agent without children,
/// not a name the store does not hold.
pub fn unfinished_below_names_those_with_an_unfinished_descendant(store: &dyn Store) {
    let t = tenant("conf-below");
    let done = |n: &str, parent: Option<&str>| {
        let a = running(store, &t, n, parent);
        end(store, &a, Terminal::Completed, None);
    };
    running(store, &t, "busy", None);
    running(store, &t, "busy-kid", Some("busy"));
    running(store, &t, "deep", None);
    let kid = running(store, &t, "deep-kid", Some("deep"));
    admit(store, &t, "deep-grandkid", Some("deep-kid"));
    end(store, &kid, Terminal::Completed, None);
    running(store, &t, "settled", None);
    done("settled-kid", Some("settled"));
    running(store, &t, "lone", None);
    let ask = ["busy", "deep", "settled", "lone", "ghost", "deep-kid"].map(name);
    let below = store.unfinished_below(&t, &ask).unwrap();
    let mut got: Vec<&str> = below.iter().map(AgentName::as_str).collect();
    got.sort_unstable();
    assert_eq!(got, ["busy", "deep", "deep-kid"]);
    assert!(store.unfinished_below(&t, &[]).unwrap().is_empty());
    // Another tenant's tree is not this one's.
    let other = tenant("conf-below-other");
    assert!(store.unfinished_below(&other, &ask).unwrap().is_empty());
}
