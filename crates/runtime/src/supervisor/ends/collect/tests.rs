//! The collector's sandbox, prepared again after the agent ended: a path the
//! agent swapped or removed since its launch grants nothing.

use std::path::PathBuf;

use brood_launch::sandbox::{FsAccess, SandboxSpec};

use super::KeptSandbox;

fn spec(fs: Vec<(PathBuf, FsAccess)>, exec: Vec<PathBuf>) -> SandboxSpec {
    SandboxSpec {
        fs,
        exec,
        ..SandboxSpec::default()
    }
}

#[test]
fn a_rule_whose_path_was_swapped_for_a_link_or_removed_is_left_out() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for sub in ["work/in", "secret", "gone", "kept"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::write(d.join("tool"), "#!/bin/sh\n").unwrap();
    let kept = KeptSandbox::new(spec(
        vec![
            (d.join("work"), FsAccess::Rw),
            (d.join("work/in"), FsAccess::Ro),
            (d.join("gone"), FsAccess::Ro),
            (d.join("kept"), FsAccess::Ro),
        ],
        vec![d.join("tool")],
    ));
    // What a hostile agent with `work` writable does before it ends: the
    // nested rule's directory becomes a link to what it was never granted.
    std::fs::rename(d.join("work/in"), d.join("work/in.old")).unwrap();
    std::os::unix::fs::symlink(d.join("secret"), d.join("work/in")).unwrap();
    std::fs::remove_dir(d.join("gone")).unwrap();
    // A file replaced by another of the same name is another inode. The old
    // one is kept (renamed), so its inode number cannot be given to the new
    // file: a file removed first may hand its number straight on.
    std::fs::rename(d.join("tool"), d.join("tool.old")).unwrap();
    std::fs::write(d.join("tool"), "#!/bin/sh\n").unwrap();

    let again = kept.unchanged();
    assert_eq!(
        again.fs,
        vec![
            (d.join("work"), FsAccess::Rw),
            (d.join("kept"), FsAccess::Ro)
        ],
        "only the rules whose path is still what it was"
    );
    assert!(again.exec.is_empty(), "{:?}", again.exec);
}

#[test]
fn an_unchanged_sandbox_is_prepared_again_whole() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::create_dir_all(d.join("a")).unwrap();
    let s = spec(vec![(d.join("a"), FsAccess::Ro)], vec!["/bin/sh".into()]);
    let kept = KeptSandbox::new(s.clone());
    assert_eq!(kept.clone().unchanged(), s);
    kept.prepare()
        .expect("landlock is needed here: the ruleset is built again");
}
