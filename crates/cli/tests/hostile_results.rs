//! A child that tries to hang or fool the supervisor with what it hands back
//! (issue 11 item 2). Each test is named after what the child plants, under
//! the operator's default policy (`/ rw`) and under a narrow one: `/dev/zero`,
//! a FIFO and a symlinked directory as refs or artifacts, a 10 GiB sparse file,
//! a file only root's capabilities could read, and a `setsid`'d grandchild
//! that keeps swapping an artifact between a file and a FIFO.
//!
//! Each time the run ends (never stays `running`): refused as `failed`
//! naming the ref, or, for what is simply not an artifact, completed without
//! it. No refusal shows a digest the child could not compute. The grandchild
//! is dead before anything is read. What the run leaves in its `artifact/`
//! and in the blob store is exactly what its channel records: nothing of a
//! refused result (issue 24 item 6). The store passes `PRAGMA
//! integrity_check`, and the supervisor goes on serving.
//!
//! The sparse file is planted under a parent whose `disk_max` is 20 GiB:
//! under the default (1 GiB) the kernel refuses to make it at all
//! (`RLIMIT_FSIZE`, `disk.rs`), and the collection's own bound is what these
//! tests are about.

// Test helpers outside #[test] functions may panic like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const GRACE: Duration = Duration::from_millis(1000);

/// sha256 of `hello\n`: the content of every planted secret, so a leak of the
/// digest would show in a refusal.
const HELLO: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

#[derive(Clone, Copy, Debug)]
enum Plant {
    /// A ref to `/dev/zero` with a hash: reading it would never end.
    DevZeroAsARef,
    /// A FIFO in `artifact/`, named by a ref with a hash.
    AFifoAsARef,
    /// A FIFO in `artifact/`, not named: it is not an artifact.
    AFifoAsAnArtifact,
    /// `artifact/dir -> <a directory>`, and a ref through it with the right hash.
    ASymlinkedDirectoryInARefPath,
    /// A 10 GiB sparse file in `artifact/`.
    ATenGibSparseArtifact,
    /// The same as a ref with a hash.
    ATenGibSparseRef,
    /// A ref with the right hash to a file only root's capabilities could read.
    AFileOnlyRootCouldRead,
    /// A `setsid`'d grandchild swapping `artifact/x` between a file and a FIFO.
    ASwappingGrandchild,
}

/// What the child does before it runs the test agent (`exec "$@"`).
fn plant_script(p: Plant) -> &'static str {
    match p {
        Plant::DevZeroAsARef | Plant::AFileOnlyRootCouldRead => "",
        Plant::AFifoAsARef | Plant::AFifoAsAnArtifact => r#"mkfifo "$BROOD_ARTIFACTS/fifo""#,
        Plant::ASymlinkedDirectoryInARefPath => r#"ln -s "$DIR/secret" "$BROOD_ARTIFACTS/dir""#,
        Plant::ATenGibSparseArtifact | Plant::ATenGibSparseRef => {
            r#"truncate -s 10G "$BROOD_ARTIFACTS/big""#
        }
        Plant::ASwappingGrandchild => {
            r#"SWAPPER="$DIR" setsid sh -c 'echo $$ > "$DIR/swapper.pid"; a="$BROOD_ARTIFACTS"; while :; do echo hello > "$a/x.f"; mv -f "$a/x.f" "$a/x"; rm -f "$a/x.p"; mkfifo "$a/x.p" && mv -f "$a/x.p" "$a/x"; done' </dev/null >/dev/null 2>&1 &
               while [ ! -s "$DIR/swapper.pid" ]; do sleep 0.01; done"#
        }
    }
}

/// The `--ref` the child's result names, if any.
fn planted_ref(p: Plant, dir: &Path) -> Option<Value> {
    let hash = format!("sha256:{HELLO}");
    let r = |path: String| Some(json!({"path": path, "summary": "look", "hash": hash}));
    match p {
        Plant::DevZeroAsARef => r("/dev/zero".into()),
        Plant::AFifoAsARef => r("artifact/fifo".into()),
        Plant::ASymlinkedDirectoryInARefPath => r("artifact/dir/s.txt".into()),
        Plant::ATenGibSparseRef => r("artifact/big".into()),
        Plant::AFileOnlyRootCouldRead => r(dir.join("private/s.txt").display().to_string()),
        Plant::AFifoAsAnArtifact | Plant::ATenGibSparseArtifact | Plant::ASwappingGrandchild => {
            None
        }
    }
}

/// How the run must end: refused naming these words, or completed.
fn expected(p: Plant) -> Option<&'static str> {
    match p {
        Plant::DevZeroAsARef => Some("refs.jsonl line 1: /dev/zero: it is a character device"),
        Plant::AFifoAsARef => Some("refs.jsonl line 1: artifact/fifo: it is a FIFO"),
        Plant::ASymlinkedDirectoryInARefPath => {
            Some("refs.jsonl line 1: artifact/dir/s.txt: a symbolic link in its path")
        }
        Plant::ATenGibSparseArtifact => {
            Some("the artifacts exceed 1073741824 bytes (at artifact/big)")
        }
        Plant::ATenGibSparseRef => Some("refs.jsonl line 1: artifact/big: it is 10737418240 bytes"),
        Plant::AFileOnlyRootCouldRead => Some("the agent may not read it"),
        Plant::AFifoAsAnArtifact | Plant::ASwappingGrandchild => None,
    }
}

async fn hands_back(plant: Plant, narrow: bool) {
    let env = start(GRACE);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A directory of secrets for the symlink to point at.
    std::fs::create_dir(d.join("secret")).unwrap();
    std::fs::write(d.join("secret/s.txt"), "hello\n").unwrap();
    // A file no process without CAP_DAC_OVERRIDE may read: another owner,
    // mode 0600 (the agent runs as root's uid, without capabilities).
    std::fs::create_dir(d.join("private")).unwrap();
    let private = d.join("private/s.txt");
    std::fs::write(&private, "hello\n").unwrap();
    std::os::unix::fs::chown(&private, Some(12345), Some(12345)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();

    let vars: Vec<(String, String)> = vec![("DIR".into(), d.display().to_string())];
    let mut p = req("p", agent(&["--hang"]));
    p.env = vars.clone();
    if matches!(
        plant,
        Plant::ATenGibSparseArtifact | Plant::ATenGibSparseRef
    ) {
        p.policy = Some(json!({"resources": {"disk_max": "20G"}}));
    }
    env.sup.spawn(me(), p).await.expect("spawn p");

    let mut flags: Vec<String> = vec!["--result".into(), "handed back".into()];
    if let Some(r) = planted_ref(plant, d) {
        flags.push("--ref".into());
        flags.push(r.to_string());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!("{}\nexec \"$@\"", plant_script(plant)),
        "sh".to_owned(),
    ];
    argv.extend(agent(&flags));
    let mut c = req("c", argv);
    c.parent = Some(name("p"));
    c.env = vars;
    if narrow {
        c.policy = Some(narrow_policy(d));
    }
    env.sup
        .spawn(me(), c)
        .await
        .expect("spawn the hostile child");
    let w = env
        .sup
        .wait(me(), vec![name("c")], Some(Duration::from_secs(30)))
        .await
        .expect("wait");
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], false, "{plant:?}: the run never ended: {w}");
    let v = show(&env, "c");
    let detail = v["detail"].as_str().unwrap_or_default().to_owned();
    match expected(plant) {
        Some(why) => {
            assert_eq!(
                (v["status"].as_str(), v["reason"].as_str()),
                (Some("failed"), Some("protocol_error")),
                "{plant:?}: {v}"
            );
            assert!(detail.contains(why), "{plant:?}: {detail:?} lacks {why:?}");
            assert!(
                !detail.contains(HELLO),
                "{plant:?}: a digest leaked: {detail}"
            );
        }
        None => {
            assert_eq!(v["status"], "completed", "{plant:?}: {v}");
        }
    }
    // Nothing of a FIFO was taken; what was taken is a file.
    let recorded = stored_channel(&env, "c").artifacts;
    let names: Vec<String> = recorded.iter().map(|a| a.name.clone()).collect();
    assert!(
        !names.iter().any(|n| n == "fifo" || n == "big"),
        "{names:?}"
    );
    // artifact/ holds what the channel records and nothing else (no FIFO,
    // no link, no sparse file, nothing of a refused result), and so does
    // the blob store.
    let adir = env
        .sup
        .paths()
        .channel_dir(
            &name("p"),
            &brood_core::SessionName::default_session(),
            &name("c"),
        )
        .join("artifact");
    let mut left: Vec<String> = std::fs::read_dir(&adir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left, names,
        "{plant:?}: artifact/ keeps what no record accounts for"
    );
    let mut blobs: Vec<String> = std::fs::read_dir(env.sup.paths().blobs().join("sha256"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    blobs.sort();
    let mut want: Vec<String> = recorded.iter().map(|a| a.sha256.clone()).collect();
    want.sort();
    want.dedup();
    assert_eq!(
        blobs, want,
        "{plant:?}: the blob store keeps what no record accounts for"
    );

    if matches!(plant, Plant::ASwappingGrandchild) {
        // It started (it wrote its pid, in the agent's pid namespace)...
        assert!(d.join("swapper.pid").exists());
        // ...and its group was emptied before the collection, so it is gone by
        // the time the run's end is recorded (the record comes after). It is
        // found on the host by the variable only it carries.
        let mark = format!("SWAPPER={}", d.display());
        let left: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|b| *b == 0)
                    .any(|kv| kv == mark.as_bytes())
            })
            .collect();
        assert!(
            left.is_empty(),
            "the swapping grandchild outlived the collection: {left:?}"
        );
    }

    let db = rusqlite::Connection::open(env.root().join("brood.db")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db);

    // The supervisor goes on serving.
    env.sup
        .spawn(me(), req("after", agent(&["--result", "still here"])))
        .await
        .expect("spawn after the attempt");
    let w = env
        .sup
        .wait(me(), vec![name("after")], Some(Duration::from_secs(10)))
        .await
        .expect("wait for after");
    let w = serde_json::to_value(&w).unwrap();
    assert_eq!(w["timed_out"], false, "{w}");
    assert_eq!(show(&env, "after")["status"], "completed");
    env.sup.cancel(me(), name("p")).await.unwrap();
}

macro_rules! plants {
    ($($test:ident: $plant:ident, $narrow:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            hands_back(Plant::$plant, $narrow).await;
        }
    )*};
}

plants! {
    plants_dev_zero_as_a_ref: DevZeroAsARef, false;
    plants_dev_zero_as_a_ref_under_a_narrow_policy: DevZeroAsARef, true;
    plants_a_fifo_as_a_ref: AFifoAsARef, false;
    plants_a_fifo_as_a_ref_under_a_narrow_policy: AFifoAsARef, true;
    plants_a_fifo_as_an_artifact: AFifoAsAnArtifact, false;
    plants_a_fifo_as_an_artifact_under_a_narrow_policy: AFifoAsAnArtifact, true;
    plants_a_symlinked_directory_in_a_ref_path: ASymlinkedDirectoryInARefPath, false;
    plants_a_symlinked_directory_in_a_ref_path_under_a_narrow_policy: ASymlinkedDirectoryInARefPath, true;
    plants_a_ten_gib_sparse_artifact: ATenGibSparseArtifact, false;
    plants_a_ten_gib_sparse_artifact_under_a_narrow_policy: ATenGibSparseArtifact, true;
    plants_a_ten_gib_sparse_ref: ATenGibSparseRef, false;
    plants_a_ten_gib_sparse_ref_under_a_narrow_policy: ATenGibSparseRef, true;
    names_a_file_only_root_could_read: AFileOnlyRootCouldRead, false;
    names_a_file_only_root_could_read_under_a_narrow_policy: AFileOnlyRootCouldRead, true;
    leaves_a_grandchild_swapping_an_artifact_for_a_fifo: ASwappingGrandchild, false;
    leaves_a_grandchild_swapping_an_artifact_for_a_fifo_under_a_narrow_policy: ASwappingGrandchild, true;
}
