//! The nodes sharing a store (issue 15): registered, heartbeating, listed
//! with their load, leaving.

use super::{end, get, name, new_agent, now, spawn_events, start, tenant};
use brood_core::CancelReason;
use brood_core::Code;
use brood_core::Status;
use brood_core::TenantId;
use brood_core::Terminal;
use brood_store::NewNode;
use brood_store::Store;
use brood_store::StoreError;

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
    let n = store.register_node(&node(a, r#"{"zone": "one"}"#)).unwrap();
    // Registered at the store's time: its start is its first heartbeat.
    assert_eq!((n.started_ms, n.live_agents), (n.heartbeat_ms, 0));
    store.register_node(&node(b, "{}")).unwrap();
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
    store.heartbeat_node(a).unwrap();
    let ours: Vec<_> = store
        .nodes()
        .unwrap()
        .into_iter()
        .filter(|n| n.id.starts_with("conf-nodes-"))
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(ours[0].id, a);
    assert_eq!(
        (ours[0].live_agents, ours[0].capacity, ours[0].started_ms),
        (1, Some(64), n.started_ms)
    );
    assert!(ours[0].heartbeat_ms >= n.heartbeat_ms, "{ours:?}");
    assert_eq!(ours[0].labels, r#"{"zone": "one"}"#);
    assert_eq!((ours[1].id.as_str(), ours[1].live_agents), (b, 0));
    // Registering again replaces the record and restarts its clock.
    let again = store.register_node(&node(b, r#"{"gpu": "yes"}"#)).unwrap();
    assert!(again.started_ms >= ours[1].started_ms, "{again:?}");
    assert_eq!(again.labels, r#"{"gpu": "yes"}"#);
    // A node that leaves is gone; a heartbeat for it is refused.
    store.leave_node(b).unwrap();
    let e = store.heartbeat_node(b).unwrap_err();
    assert!(
        matches!(&e, StoreError::Refused { code: Code::NotFound, message } if message.contains(b)),
        "{e:?}"
    );
    assert!(!store.nodes().unwrap().iter().any(|n| n.id == b));
    // Labels that are not an object of strings are refused, nothing written.
    let e = store
        .register_node(&node("conf-nodes-c", "[1]"))
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

/// An hour: far beyond any expiry, and far beyond the time a case takes.
const HOUR_MS: i64 = 3_600_000;

/// Issue 28: node expiry is judged on the store's clock. A node registers
/// and heartbeats without a time of its own (the store writes its clock's),
/// and the nodes are read with each heartbeat's age on that same clock, so
/// two machines whose clocks differ never judge each other by their own.
///
/// `skew(id, ms)` writes node `id`'s recorded heartbeat as `ms` behind the
/// store's back (raw SQL, each backend its own), as a node whose clock is
/// off wrote it before issue 28. Not one of [`crate::CASES`] for that
/// reason: each backend's tests run it with its own writer.
pub fn node_expiry_is_judged_on_the_stores_clock(store: &dyn Store, skew: &dyn Fn(&str, i64)) {
    let (ahead, behind) = ("conf-clock-ahead", "conf-clock-behind");
    let ours = || -> Vec<brood_store::Node> {
        store
            .nodes()
            .unwrap()
            .into_iter()
            .filter(|n| n.id.starts_with("conf-clock-"))
            .collect()
    };
    let a = store.register_node(&node(ahead, "{}")).unwrap();
    let b = store.register_node(&node(behind, "{}")).unwrap();
    // Milliseconds since the epoch, as every other time the store keeps:
    // within a day of this machine's clock (the unit is checked here, not
    // the time; a store in seconds or microseconds would be far off).
    let here = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((a.heartbeat_ms - here).abs() < 24 * HOUR_MS, "{a:?}");
    for n in ours() {
        assert!(
            (0..HOUR_MS).contains(&n.heartbeat_age_ms),
            "a heartbeat just written is young on the store's clock: {n:?}"
        );
    }
    // One node's heartbeat recorded an hour ahead of the store's clock, the
    // other's an hour behind, as nodes with skewed clocks would write them.
    skew(ahead, a.heartbeat_ms + HOUR_MS);
    skew(behind, b.heartbeat_ms - HOUR_MS);
    let read = ours();
    assert_eq!(read.len(), 2, "{read:?}");
    let (ahead_n, behind_n) = (&read[0], &read[1]);
    assert_eq!((ahead_n.id.as_str(), behind_n.id.as_str()), (ahead, behind));
    // The age is the store's clock minus what was recorded: the one ahead
    // is in the store's future, the one behind older than any expiry.
    assert!(ahead_n.heartbeat_age_ms < 0, "{ahead_n:?}");
    assert!(behind_n.heartbeat_age_ms >= HOUR_MS, "{behind_n:?}");
    // A heartbeat is the store's time whatever was recorded before: a time
    // an hour ahead does not stay (it would keep a dead node alive that
    // long), one an hour behind is young again.
    store.heartbeat_node(ahead).unwrap();
    store.heartbeat_node(behind).unwrap();
    for n in ours() {
        assert!(
            (0..HOUR_MS).contains(&n.heartbeat_age_ms),
            "a heartbeat is recorded on the store's clock: {n:?}"
        );
    }
    store.leave_node(ahead).unwrap();
    store.leave_node(behind).unwrap();
}

/// Agents admitted by one node for another to run (`placed_on`): claimed
/// once, by that node only, in its tenant only, oldest first, up to the
/// limit; one cancelled before the claim ends at once (no process runs for
/// it) and is not claimed. A queued agent of a lost node moves to another's
/// queue; a running one does not.
pub fn placed_agents_are_claimed_once_by_their_node(store: &dyn Store) {
    let t = tenant("conf-place");
    let other = tenant("conf-place-other");
    let (a, b) = ("conf-place-a", "conf-place-b");
    let placed = |t: &TenantId, n: &str, node: &str| {
        let new = new_agent(t, n, None, &brood_store::placed_on(node));
        store.admit(&new, &spawn_events(&new)).unwrap()
    };
    let first = placed(&t, "p-first", a);
    let second = placed(&t, "p-second", a);
    let third = placed(&t, "p-third", a);
    placed(&other, "p-elsewhere", a);
    placed(&t, "p-for-b", b);
    assert_eq!(first.status, Status::Queued);
    // A stop before the claim: a queued agent's ends it.
    store
        .mark_stopping(
            &t,
            std::slice::from_ref(&third.name),
            Terminal::Cancelled(CancelReason::User),
            now(),
        )
        .unwrap();
    assert_eq!(
        get(store, &t, "p-third").status,
        Status::Ended(Terminal::Cancelled(CancelReason::User))
    );
    let got = store.claim_placed(&t, a, 2).unwrap();
    let names: Vec<&str> = got.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        ["p-first", "p-second"],
        "oldest first, up to the limit"
    );
    assert!(got.iter().all(|x| x.supervisor == a), "{got:?}");
    assert_eq!(get(store, &t, "p-first").supervisor, a);
    assert!(
        store.claim_placed(&t, a, 10).unwrap().is_empty(),
        "claimed once"
    );
    assert_eq!(
        get(store, &t, "p-for-b").supervisor,
        brood_store::placed_on(b)
    );
    // A lost node's queue: a claimed queued agent and an unclaimed one move;
    // a running one stays.
    assert!(store.replace_queued(&t, &first.name, a, b).unwrap());
    assert_eq!(
        get(store, &t, "p-first").supervisor,
        brood_store::placed_on(b)
    );
    assert!(store.replace_queued(&t, &name("p-for-b"), b, a).unwrap());
    let run = start(store, &second);
    assert_eq!(run.status, Status::Running);
    assert!(!store.replace_queued(&t, &second.name, a, b).unwrap());
    assert_eq!(get(store, &t, "p-second").supervisor, a);
    let claimed_by_b = store.claim_placed(&t, b, 10).unwrap();
    assert_eq!(claimed_by_b.len(), 1);
    assert_eq!(claimed_by_b[0].name, first.name);
}

/// Inputs posted for another node's agents: taken by that host only, in
/// its tenant only, in the order posted, each once.
pub fn inputs_posted_for_a_host_are_taken_once_in_order(store: &dyn Store) {
    let t = tenant("conf-inbox");
    let other = tenant("conf-inbox-other");
    let (a, b) = ("conf-inbox-a", "conf-inbox-b");
    let at = now();
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        store
            .post_input(&t, &name("in-kid"), a, "user:0", text, at + i as i64)
            .unwrap();
    }
    store
        .post_input(&t, &name("in-other"), b, "user:0", "for b", at)
        .unwrap();
    store
        .post_input(&other, &name("in-kid"), a, "user:0", "other tenant", at)
        .unwrap();
    let got = store.take_inputs(&t, a, 2).unwrap();
    let texts: Vec<&str> = got.iter().map(|i| i.text.as_str()).collect();
    assert_eq!(texts, ["one", "two"], "in order, up to the limit");
    assert_eq!(got[0].agent, name("in-kid"));
    assert_eq!(got[0].sender, "user:0");
    let rest = store.take_inputs(&t, a, 10).unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].text, "three");
    assert!(
        store.take_inputs(&t, a, 10).unwrap().is_empty(),
        "taken once"
    );
    assert_eq!(store.take_inputs(&t, b, 10).unwrap()[0].text, "for b");
    assert_eq!(
        store.take_inputs(&other, a, 10).unwrap()[0].text,
        "other tenant"
    );
}

/// A reader that must not be read: a blob already kept is not read again.
struct Untouched;

impl std::io::Read for Untouched {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        panic!("a blob the store holds whole was read again")
    }
}

pub fn blobs_are_kept_in_chunks_and_read_back_whole(store: &dyn Store) {
    let t = tenant("conf-blobs");
    let other = tenant("conf-blobs-other");
    // Two and a half chunks of bytes that differ from chunk to chunk, so a
    // chunk read twice or out of order shows.
    let size = brood_store::BLOB_CHUNK * 5 / 2;
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
    let sha = "0f".repeat(32);
    let read = |t: &TenantId, sha: &str| {
        let mut out = Vec::new();
        let whole = store.get_blob(t, sha, &mut out).unwrap();
        (whole, out)
    };
    assert_eq!(read(&t, &sha), (false, Vec::new()), "nothing before a put");

    // A source that ends early: an error naming the blob, nothing readable.
    let short = &bytes[..brood_store::BLOB_CHUNK + 10];
    let e = store
        .put_blob(&t, &sha, size as u64, &mut &short[..])
        .unwrap_err();
    assert!(
        matches!(e, StoreError::BlobIo { ref sha256, .. } if *sha256 == sha),
        "{e}"
    );
    assert!(e.to_string().contains("ended after"), "{e}");
    assert_eq!(read(&t, &sha), (false, Vec::new()), "a part is not a blob");

    // A whole put finishes it; it reads back byte for byte, in its tenant only.
    store
        .put_blob(&t, &sha, size as u64, &mut &bytes[..])
        .unwrap();
    let (whole, got) = read(&t, &sha);
    assert!(whole);
    assert!(got == bytes, "the blob reads back as it was put");
    assert_eq!(read(&other, &sha), (false, Vec::new()), "another tenant's");
    store
        .put_blob(&t, &sha, size as u64, &mut Untouched)
        .unwrap();

    // An empty blob is a blob.
    let empty = "e3".repeat(32);
    store.put_blob(&t, &empty, 0, &mut &b""[..]).unwrap();
    assert_eq!(read(&t, &empty), (true, Vec::new()));

    // A name that is no SHA-256 in lowercase hex is refused, naming it.
    for bad in ["ABC", &"0F".repeat(32), "../../etc/passwd"] {
        let e = store.put_blob(&t, bad, 1, &mut &b"x"[..]).unwrap_err();
        assert!(
            matches!(e, StoreError::Refused { code: Code::BadRequest, ref message } if message.contains(bad)),
            "{e}"
        );
        assert!(store.get_blob(&t, bad, &mut Vec::new()).is_err());
    }
}

pub fn slot_shares_count_every_holder_and_hold_under_racing(store: &dyn Store) {
    let t = tenant("conf-slots");
    let other = tenant("conf-slots-other");
    let sum = |t: &TenantId| -> u64 { store.slot_shares(t).unwrap().iter().map(|s| s.1).sum() };
    // 60 acquires racing over six holders for 8 slots: exactly 8 taken.
    let won: usize = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..60)
            .map(|i| {
                let t = &t;
                sc.spawn(move || store.slot_acquire(t, &format!("h{}", i % 6), 8).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| usize::from(h.join().unwrap())).sum()
    });
    assert_eq!((won, sum(&t)), (8, 8));
    assert!(!store.slot_acquire(&t, "h0", 8).unwrap(), "full");
    assert!(
        store.slot_acquire(&other, "h0", 1).unwrap(),
        "tenants apart"
    );
    // Each holder's release and repair touch its own share only.
    let shares = store.slot_shares(&t).unwrap();
    let (h, n) = shares.iter().find(|s| s.1 > 0).cloned().unwrap();
    store.slot_release(&t, &h).unwrap();
    assert_eq!(sum(&t), 7);
    assert!(
        store.slot_acquire(&t, "h0", 8).unwrap(),
        "a slot given back is free"
    );
    store.slot_release(&t, "nobody").unwrap();
    assert_eq!(sum(&t), 8, "a release of nothing changes nothing");
    let before = store.slot_repair(&t, "h9", 2).unwrap();
    assert_eq!(
        (before, sum(&t)),
        (0, 10),
        "a repair sets its holder's share"
    );
    assert_eq!(store.slot_repair(&t, "h9", 0).unwrap(), 2);
    assert!(
        store.slot_shares(&t).unwrap().iter().all(|s| s.0 != "h9"),
        "0 removes it"
    );
    // The shares of holders that are gone, given back whole.
    let gone: Vec<String> = store
        .slot_shares(&t)
        .unwrap()
        .into_iter()
        .map(|s| s.0)
        .filter(|x| *x != h)
        .collect();
    let left = store
        .slot_shares(&t)
        .unwrap()
        .iter()
        .find(|s| s.0 == h)
        .map_or(0, |s| s.1);
    let freed = store.slot_forget(&t, &gone).unwrap();
    assert!(n > 0);
    assert_eq!((freed, sum(&t)), (8 - left, left));
    assert_eq!(sum(&other), 1);
}

pub fn slots_are_taken_and_given_back_many_at_once(store: &dyn Store) {
    let t = tenant("conf-slots-many");
    let sum = |t: &TenantId| -> u64 { store.slot_shares(t).unwrap().iter().map(|s| s.1).sum() };
    assert_eq!(store.slot_acquire_up_to(&t, "a", 10, 4).unwrap(), 4);
    assert_eq!(
        store.slot_acquire_up_to(&t, "b", 10, 9).unwrap(),
        6,
        "as many as the tenant has room for"
    );
    assert_eq!(store.slot_acquire_up_to(&t, "a", 10, 3).unwrap(), 0, "full");
    assert_eq!(sum(&t), 10);
    store.slot_release_n(&t, "b", 5).unwrap();
    assert_eq!(sum(&t), 5, "b gave five of its six back");
    store.slot_release_n(&t, "a", 9).unwrap();
    let shares = store.slot_shares(&t).unwrap();
    assert_eq!(
        shares,
        vec![("b".to_owned(), 1)],
        "never below 0, and a share at 0 is gone"
    );
    // Racing bursts over three holders for 20 slots: exactly 20 taken.
    let won: u32 = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..12)
            .map(|i| {
                let t = &t;
                sc.spawn(move || {
                    store
                        .slot_acquire_up_to(t, &format!("h{}", i % 3), 20, 3)
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!((won, sum(&t)), (19, 20), "b's one and 19 taken");
}
