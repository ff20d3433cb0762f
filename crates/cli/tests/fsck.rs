//! `brood fsck` (SPEC 3, issue 5 item 5): a whole tree's ctx files after a
//! scripted run, deleted, rebuilt from the store by `brood fsck`, and compared
//! with the original file by file. Only `log` (stderr, which the store does not
//! keep) is outside the comparison; fsck recreates it empty.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use brood_runtime::supervisor::handle;
use common::*;
use serde_json::json;

/// Every file under `dir` (relative path → bytes) and every directory, logs
/// and sockets left out (a live agent's `<name>.sock` is bound by the
/// supervisor, not rendered from the store).
fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let t = e.file_type().unwrap();
            assert!(!t.is_symlink(), "a symlink in the ctx tree: {rel}");
            if t.is_dir() {
                out.insert(format!("{rel}/"), None);
                stack.push(p);
            } else if e.file_name() != "log" && !t.is_socket() {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Deletes the ctx tree and runs `brood fsck` on the root: what it printed.
fn delete_and_fsck(env: &Env, ctx: &Path) -> String {
    std::fs::remove_dir_all(ctx).unwrap();
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(exe())
        .arg("--root")
        .arg(env.root())
        .arg("fsck")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn spawn(env: &Env, args: serde_json::Value) {
    handle(&env.sup, &me(), "spawn", &args)
        .await
        .unwrap_or_else(|e| panic!("spawn {args}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tree_is_rebuilt_by_fsck_file_for_file() {
    let env = start(Duration::from_millis(300));
    spawn(&env, json!({"name": "r", "argv": agent(&["--message", "hi from r", "--hang"]), "task": "lead", "await_ready": true})).await;
    spawn(&env, json!({"name": "c1", "parent": "r", "task": "first", "argv": agent(&["--message", "working", "--usage", "1,2,0.01", "--result", "done c1"])})).await;
    spawn(&env, json!({"name": "c2", "parent": "r", "task": "second", "argv": agent(&["--error", "bad input"])})).await;
    spawn(&env, json!({"name": "c3", "parent": "r", "task": "third", "argv": agent(&["--hang"]), "await_ready": true})).await;
    spawn(
        &env,
        json!({"name": "t", "parent": "r", "life": "temp", "argv": agent(&["--result", "temp"])}),
    )
    .await;
    spawn(&env, json!({"name": "x", "parent": "r", "protocol": "exec", "task": "to stdin", "argv": ["cat"]})).await;
    // A child that hands back refs and artifacts (SPEC 4): refs.jsonl and
    // artifact/ come back from the store and the blob store.
    let r1 = json!({"path": "artifact/notes/a.md", "summary": "the notes", "kind": "artifact"});
    let r2 = json!({"path": "src/lib.rs", "summary": "read this first"});
    spawn(
        &env,
        json!({"name": "c4", "parent": "r", "task": "fourth", "argv": agent(&[
        "--artifact", "notes/a.md=# notes\n", "--artifact", "b.bin=\u{1}\u{2}",
        "--ref", &r1.to_string(), "--ref", &r2.to_string(), "--result", "done c4"])}),
    )
    .await;
    env.sup
        .send(me(), name("r"), "hello r".into())
        .await
        .unwrap();
    env.sup.cancel(me(), name("c3")).await.unwrap();
    let kids = vec![
        name("c1"),
        name("c2"),
        name("c3"),
        name("t"),
        name("x"),
        name("c4"),
    ];
    env.sup
        .wait(me(), kids.clone(), Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup
        .resume(me(), name("c1"), Some("again".into()))
        .await
        .unwrap();
    env.sup
        .wait(me(), vec![name("c1")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup.close(me(), name("c2")).await.unwrap();
    // r stays running: a live agent's files are rebuilt too (status, pid). Its
    // own message must be in before the snapshot, or the store would be ahead.
    assert!(eventually(Duration::from_secs(5), || {
        env.sup
            .store()
            .messages(
                env.sup.tenant(),
                &name("r"),
                &brood_core::SessionName::default_session(),
            )
            .unwrap()
            .iter()
            .any(|m| m.content == "hi from r")
    }));
    env.sup.flush().await;
    let ctx = env.sup.paths().ctx();
    let before = tree(&ctx);
    assert!(before.len() > 60, "a real tree: {} entries", before.len());
    assert!(
        before
            .keys()
            .any(|k| k.ends_with("context/child/c1/result.md")),
        "{:?}",
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        !before.keys().any(|k| k.starts_with("agent/t.d")),
        "t was temp"
    );
    for f in ["refs.jsonl", "artifact/notes/a.md", "artifact/b.bin"] {
        assert!(
            before
                .keys()
                .any(|k| k.ends_with(&format!("context/child/c4/{f}"))),
            "c4's {f} is missing"
        );
    }

    let said = delete_and_fsck(&env, &ctx);
    assert!(said.starts_with("rebuilt 7 agents"), "{said}");
    let after = tree(&ctx);
    let only_before: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    let only_after: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    assert!(
        only_before.is_empty() && only_after.is_empty(),
        "missing after fsck: {only_before:?}; new after fsck: {only_after:?}"
    );
    for (k, v) in &before {
        assert_eq!(
            v.as_deref().map(String::from_utf8_lossy),
            after[k].as_deref().map(String::from_utf8_lossy),
            "{k} differs after fsck"
        );
    }
    // Logs come back empty rather than missing.
    assert!(env.sup.paths().agent_dir(&name("r")).join("log").exists());
    env.sup.cancel(me(), name("r")).await.unwrap();
}

/// A child another node ran left its artifacts' bytes in that node's blob
/// store; the store still lists them. A rebuild here fetches the ones that
/// node shared through the store (checked against their hashes), leaves the
/// others out, says so, and rebuilds everything else (it used to stop at
/// the first missing blob, leaving the rest of the tree unbuilt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_whose_bytes_are_elsewhere_do_not_stop_a_rebuild() {
    let env = start(Duration::from_millis(300));
    spawn(
        &env,
        json!({"name": "r", "argv": agent(&["--hang"]), "await_ready": true}),
    )
    .await;
    spawn(
        &env,
        json!({"name": "c", "parent": "r", "argv": agent(&[
        "--artifact", "kept.md=here\n", "--artifact", "gone.md=elsewhere\n",
        "--artifact", "shared.md=in the store\n", "--result", "done c"])}),
    )
    .await;
    spawn(
        &env,
        json!({"name": "d", "parent": "r", "argv": agent(&["--result", "done d"])}),
    )
    .await;
    env.sup
        .wait(
            me(),
            vec![name("c"), name("d")],
            Some(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    // Everything ended, so nothing writes into the tree while it is deleted.
    env.sup.cancel(me(), name("r")).await.unwrap();
    env.sup
        .wait(me(), vec![name("r")], Some(Duration::from_secs(10)))
        .await
        .unwrap();
    env.sup.flush().await;
    // The bytes of gone.md and shared.md are not on this machine (as on a
    // node that did not run c); those of shared.md are in the store, put
    // there as c's node puts them for a parent on another node.
    let artifacts = env
        .sup
        .store()
        .channel(env.sup.tenant(), &name("r"), &name("c"))
        .unwrap()
        .unwrap()
        .artifacts;
    let named = |n: &str| artifacts.iter().find(|a| a.name == n).unwrap().clone();
    let blobs = env.root().join("blobs");
    brood_runtime::channel::shared::share(
        env.sup.store().as_ref(),
        env.sup.tenant(),
        &blobs,
        &[named("shared.md")],
    )
    .unwrap();
    for n in ["gone.md", "shared.md"] {
        std::fs::remove_file(blobs.join("sha256").join(named(n).sha256)).unwrap();
    }
    let ctx = env.sup.paths().ctx();
    let said = delete_and_fsck(&env, &ctx);
    assert!(said.contains("1 artifacts left out"), "{said}");
    let after = tree(&ctx);
    let has = |suffix: &str| after.keys().any(|k| k.ends_with(suffix));
    assert!(
        has("context/child/c/artifact/kept.md"),
        "{:?}",
        after.keys()
    );
    assert!(!has("context/child/c/artifact/gone.md"));
    let shared = after
        .iter()
        .find(|(k, _)| k.ends_with("context/child/c/artifact/shared.md"))
        .and_then(|(_, v)| v.clone());
    assert_eq!(
        shared.as_deref(),
        Some(&b"in the store\n"[..]),
        "fetched from the store"
    );
    // Every channel after the missing blob is rebuilt too.
    assert!(has("context/child/c/result.md") && has("context/child/d/result.md"));
}
