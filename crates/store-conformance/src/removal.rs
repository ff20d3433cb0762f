//! Removal (issue 25): a finished tree goes whole, every row of it, and its
//! names are free again; a tree with a live agent or an unfinished job is
//! refused and nothing is written; a subtree goes without its parent; the
//! finished trees are listed past a cutoff; a job goes with its items,
//! attempts and own workers.

use brood_core::{Code, JobStatus, TenantId, Terminal};
use brood_store::{Artifact, ChannelOutput, NewItem, NewJob, RunEnd, Store, StoreError};

use crate::helpers::{
    USER, admit, all_events, end, event, get, name, now, refusal, running, snapshot, start, tenant,
};

/// Ends `a` with a result and one artifact, `sha`.
fn end_with_artifact(store: &dyn Store, t: &TenantId, n: &str, sha: &str) {
    let a = get(store, t, n);
    store
        .end_run(
            t,
            &a.name,
            &a.run,
            &RunEnd {
                outcome: Terminal::Completed,
                exit_code: Some(0),
                result: Some(format!("result of {n}")),
                detail: None,
                now_ms: now(),
                output: Some(ChannelOutput {
                    refs: String::new(),
                    artifacts: vec![Artifact {
                        name: "a.txt".into(),
                        sha256: sha.to_owned(),
                        size: 3,
                    }],
                }),
            },
            &[event(&a.name, Some(&a.run), "agent.stop")],
        )
        .unwrap();
}

fn job(t: &TenantId, id: &str, owner: &str) -> NewJob {
    NewJob {
        tenant: t.clone(),
        id: id.to_owned(),
        owner: name(owner),
        spec: r#"{"instruction": "say {text}"}"#.to_owned(),
        source: None,
        created_ms: now(),
    }
}

fn one_item() -> Vec<NewItem> {
    vec![NewItem {
        id: "a".into(),
        row_index: 0,
        input: r#"{"text": "hi"}"#.into(),
    }]
}

fn gone(store: &dyn Store, t: &TenantId, n: &str) -> bool {
    store.agent(t, &name(n)).unwrap().is_none()
}

pub fn a_finished_tree_is_removed_whole_and_its_names_are_free(store: &dyn Store) {
    let t = tenant("conf-rm-tree");
    let shared = "5a".repeat(32);
    let own = "c0".repeat(32);
    // Another tree of the tenant, which names a blob the removed one names too.
    running(store, &t, "keep", None);
    running(store, &t, "keep-kid", Some("keep"));
    end_with_artifact(store, &t, "keep-kid", &shared);
    end(
        store,
        &get(store, &t, "keep"),
        Terminal::Completed,
        Some("k"),
    );
    // The tree: root > kid > grandkid, root > second; a message, usage, a
    // finished job, artifacts (one shared, one its own) kept in the store.
    let root = running(store, &t, "root", None);
    running(store, &t, "kid", Some("root"));
    running(store, &t, "grandkid", Some("kid"));
    running(store, &t, "second", Some("root"));
    store
        .append_message(
            &t,
            &root.name,
            &root.session,
            &root.run,
            "assistant",
            "hello",
            now(),
        )
        .unwrap();
    store.record_usage(&t, &root.run, 10, 5, 0.25).unwrap();
    for sha in [&shared, &own] {
        store.put_blob(&t, sha, 3, &mut &b"abc"[..]).unwrap();
    }
    store
        .create_job(&job(&t, "done-job", "root"), &one_item(), &[])
        .unwrap();
    store
        .set_job_status(&t, "done-job", JobStatus::Cancelled, now(), &[])
        .unwrap();
    end_with_artifact(store, &t, "grandkid", &own);
    end_with_artifact(store, &t, "kid", &shared);
    end(store, &get(store, &t, "second"), USER, None);
    end(
        store,
        &get(store, &t, "root"),
        Terminal::Completed,
        Some("r"),
    );
    let kept = snapshot(store, &t);
    let other: Vec<_> = kept
        .agents
        .iter()
        .filter(|a| a.root.as_str() == "keep")
        .cloned()
        .collect();

    let removed = store.remove_tree(&t, &name("root")).unwrap();
    let mut names: Vec<&str> = removed.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names[0], "root", "the top first: {names:?}");
    names.sort_unstable();
    assert_eq!(names, ["grandkid", "kid", "root", "second"]);
    assert!(
        removed.channels.is_empty(),
        "a root has no channel from a parent"
    );
    assert_eq!(removed.jobs, ["done-job"]);
    assert_eq!(removed.cgroups.len(), 4, "{:?}", removed.cgroups);
    assert_eq!(
        removed.blobs,
        std::slice::from_ref(&own),
        "the shared blob stays"
    );
    for n in ["root", "kid", "grandkid", "second"] {
        assert!(gone(store, &t, n), "{n} is still there");
        assert!(store.events(&t, 0, Some(&name(n)), 100).unwrap().is_empty());
        assert!(store.runs(&t, &name(n)).unwrap().is_empty());
    }
    assert!(
        store
            .messages(&t, &root.name, &root.session)
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.run(&t, &root.run).unwrap(), None);
    assert_eq!(store.job(&t, "done-job").unwrap(), None);
    assert!(matches!(
        store.job_items(&t, "done-job", None),
        Err(StoreError::Refused {
            code: Code::NotFound,
            ..
        })
    ));
    let mut out = Vec::new();
    assert!(!store.get_blob(&t, &own, &mut out).unwrap());
    assert!(store.get_blob(&t, &shared, &mut out).unwrap());
    // The other tree is as it was.
    let after = snapshot(store, &t);
    assert_eq!(after.agents, other);
    assert!(
        after
            .events
            .iter()
            .all(|e| e.agent.as_str().starts_with("keep"))
    );
    // The names are free again: the same tree can be made anew.
    let again = running(store, &t, "root", None);
    running(store, &t, "kid", Some("root"));
    assert_eq!(again.depth, 0);
    let events = all_events(store, &t);
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "numbers never reused: {seqs:?}"
    );
    // An unknown name is not found, and a second removal finds nothing.
    store.remove_tree(&t, &name("keep")).unwrap();
    assert!(matches!(
        store.remove_tree(&t, &name("keep")),
        Err(StoreError::NotFound { name, .. }) if name == "keep"
    ));
}

pub fn a_tree_with_a_live_agent_or_an_unfinished_job_is_refused_whole(store: &dyn Store) {
    let t = tenant("conf-rm-refused");
    running(store, &t, "root", None);
    let kid = running(store, &t, "kid", Some("root"));
    admit(store, &t, "queued-kid", Some("kid"));
    end(store, &get(store, &t, "root"), Terminal::Completed, None);
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.remove_tree(&t, &name("root")));
    assert_eq!(code, Code::Conflict, "{msg}");
    assert!(msg.contains("kid"), "names the live agent: {msg}");
    assert!(msg.contains("running") || msg.contains("queued"), "{msg}");
    assert_eq!(snapshot(store, &t), before, "nothing removed");
    // Every agent ended, but a job one of them owns is pending.
    store
        .mark_stopping(&t, &[name("queued-kid")], USER, now())
        .unwrap();
    end(store, &kid, USER, None);
    store
        .create_job(&job(&t, "open-job", "kid"), &one_item(), &[])
        .unwrap();
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.remove_tree(&t, &name("root")));
    assert_eq!(code, Code::Conflict, "{msg}");
    assert!(msg.contains("open-job") && msg.contains("pending"), "{msg}");
    assert_eq!(snapshot(store, &t), before, "nothing removed");
    assert!(store.job(&t, "open-job").unwrap().is_some());
    // Cancelled, the job goes with the tree.
    store
        .set_job_status(&t, "open-job", JobStatus::Cancelled, now(), &[])
        .unwrap();
    let removed = store.remove_tree(&t, &name("root")).unwrap();
    assert_eq!(removed.agents.len(), 3);
    assert_eq!(removed.jobs, ["open-job"]);
    assert!(snapshot(store, &t).agents.is_empty());
}

pub fn a_finished_subtree_goes_without_its_parent(store: &dyn Store) {
    let t = tenant("conf-rm-subtree");
    running(store, &t, "root", None);
    running(store, &t, "kid", Some("root"));
    running(store, &t, "grandkid", Some("kid"));
    let sibling = running(store, &t, "sibling", Some("root"));
    end_with_artifact(store, &t, "grandkid", &"77".repeat(32));
    end(
        store,
        &get(store, &t, "kid"),
        Terminal::Completed,
        Some("k"),
    );
    let removed = store.remove_tree(&t, &name("kid")).unwrap();
    let ch: Vec<(&str, &str)> = removed
        .channels
        .iter()
        .map(|c| (c.parent.as_str(), c.child.as_str()))
        .collect();
    assert_eq!(ch, [("root", "kid")], "the channel from root to kid");
    assert!(gone(store, &t, "kid") && gone(store, &t, "grandkid"));
    assert_eq!(
        store.channel(&t, &name("root"), &name("kid")).unwrap(),
        None
    );
    let kids: Vec<String> = store
        .children(&t, &name("root"))
        .unwrap()
        .into_iter()
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(kids, ["sibling"]);
    assert_eq!(
        store.descendants_post_order(&t, &name("root")).unwrap(),
        vec![get(store, &t, "sibling")]
    );
    // The parent and its other child are untouched; the parent's log keeps
    // what it was told of the child.
    assert!(get(store, &t, "root").status.is_live());
    assert_eq!(get(store, &t, "sibling").run, sibling.run);
    assert!(
        store
            .events(&t, 0, Some(&name("root")), 100)
            .unwrap()
            .iter()
            .any(|e| e.kind == "agent.child.spawn")
    );
}

pub fn finished_trees_are_listed_oldest_first_past_their_cutoff(store: &dyn Store) {
    let t = tenant("conf-rm-prune");
    let first = running(store, &t, "first", None);
    running(store, &t, "first-kid", Some("first"));
    end(store, &get(store, &t, "first-kid"), USER, None);
    end(store, &first, Terminal::Completed, None);
    let second = running(store, &t, "second", None);
    end(store, &second, Terminal::Completed, None);
    let cutoff = now();
    let late = running(store, &t, "late", None);
    end(store, &late, Terminal::Completed, None);
    running(store, &t, "live", None);
    let owner = running(store, &t, "owner", None);
    store
        .create_job(&job(&t, "pending", "owner"), &one_item(), &[])
        .unwrap();
    end(store, &owner, Terminal::Completed, None);
    let trees = store.finished_trees(&t, cutoff, 100).unwrap();
    let listed: Vec<(&str, u32)> = trees.iter().map(|f| (f.root.as_str(), f.agents)).collect();
    assert_eq!(listed, [("first", 2), ("second", 1)]);
    assert!(trees[0].last_end_ms <= trees[1].last_end_ms);
    assert!(trees.iter().all(|f| f.last_end_ms < cutoff));
    assert_eq!(store.finished_trees(&t, cutoff, 1).unwrap().len(), 1);
    // Later, the late tree too; never the live one or the one whose job is
    // pending.
    let all: Vec<String> = store
        .finished_trees(&t, now(), 100)
        .unwrap()
        .into_iter()
        .map(|f| f.root.to_string())
        .collect();
    assert_eq!(all, ["first", "second", "late"]);
}

pub fn a_job_goes_with_its_items_attempts_and_own_workers(store: &dyn Store) {
    let t = tenant("conf-rm-job");
    let owner = running(store, &t, "owner", None);
    store
        .create_job(&job(&t, "j", "owner"), &one_item(), &[])
        .unwrap();
    store
        .set_job_status(&t, "j", JobStatus::Running, now(), &[])
        .unwrap();
    let worker = admit(store, &t, "j-w1", Some("owner"));
    start(store, &worker);
    running(store, &t, "j-w1-helper", Some("j-w1"));
    // An agent given an item by `assign` is not the job's own worker.
    let assigned = running(store, &t, "helper", Some("owner"));
    let a = store
        .start_attempt(&t, "j", "a", &worker.name, now(), &[])
        .unwrap();
    store
        .fail_attempt(&t, "j", "a", a.number, "no", 3, now(), &[])
        .unwrap();
    // A running job is refused, naming its status.
    let (code, msg) = refusal(store.remove_job(&t, "j", now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("running"), "{msg}");
    store
        .set_job_status(&t, "j", JobStatus::Cancelled, now(), &[])
        .unwrap();
    // A worker still live keeps the job (and its items) in place.
    let before = snapshot(store, &t);
    let (code, msg) = refusal(store.remove_job(&t, "j", now(), &[]));
    assert_eq!(code, Code::Conflict);
    assert!(msg.contains("j-w1"), "{msg}");
    assert_eq!(snapshot(store, &t), before);
    assert!(store.job(&t, "j").unwrap().is_some());
    end(store, &get(store, &t, "j-w1-helper"), USER, None);
    end(store, &get(store, &t, "j-w1"), USER, None);
    let removed = store
        .remove_job(&t, "j", now(), &[event(&owner.name, None, "job.removed")])
        .unwrap();
    assert_eq!(removed.job.id, "j");
    let mut names: Vec<&str> = removed
        .workers
        .agents
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["j-w1", "j-w1-helper"]);
    let channels: Vec<(&str, &str)> = removed
        .workers
        .channels
        .iter()
        .map(|c| (c.parent.as_str(), c.child.as_str()))
        .collect();
    assert_eq!(
        channels,
        [("owner", "j-w1")],
        "the owner's channel to its worker goes"
    );
    assert_eq!(store.channel(&t, &owner.name, &name("j-w1")).unwrap(), None);
    assert_eq!(store.job(&t, "j").unwrap(), None);
    assert!(store.attempts(&t, "j", "a").is_err());
    assert!(gone(store, &t, "j-w1") && gone(store, &t, "j-w1-helper"));
    assert_eq!(get(store, &t, "helper").run, assigned.run);
    assert!(
        store
            .events(&t, 0, Some(&owner.name), 100)
            .unwrap()
            .iter()
            .any(|e| e.kind == "job.removed")
    );
    // The id is free again; an unknown job is not found.
    store
        .create_job(&job(&t, "j", "owner"), &one_item(), &[])
        .unwrap();
    let (code, _) = refusal(store.remove_job(&t, "nope", now(), &[]));
    assert_eq!(code, Code::NotFound);
    // A pending job goes at once (it has no worker).
    store.remove_job(&t, "j", now(), &[]).unwrap();
    assert_eq!(store.job(&t, "j").unwrap(), None);
}
