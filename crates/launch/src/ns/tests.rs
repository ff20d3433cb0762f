//! The namespace preparation's checks, without a child: what [`super::prepare`]
//! accepts, refuses and creates.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountSpec, NsSpec,
    Restrict, Step, prepare,
};

fn entry(source: &Path, target: &str) -> MountSpec {
    MountSpec {
        source: source.to_path_buf(),
        target: PathBuf::from(target),
        rw: false,
        rbind: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    }
}

#[test]
fn bad_paths_are_refused_naming_the_field_and_path() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    for (target, what) in [
        ("work", "target must be absolute"),
        ("/a/../etc", "target must be absolute"),
        ("/a/./b", "target must be absolute"),
        ("/a\tb", "target must be absolute"),
        ("/", "must not be /"),
    ] {
        let spec = NsSpec {
            mounts: vec![entry(src.path(), target)],
            root: Some(root.path().to_path_buf()),
            ..NsSpec::default()
        };
        let e = prepare(&spec).unwrap_err().to_string();
        assert!(e.contains(what) && e.contains(target), "{target:?}: {e}");
    }
    let spec = NsSpec {
        mounts: vec![entry(Path::new("/nonexistent/brood"), "/x")],
        root: Some(root.path().to_path_buf()),
        ..NsSpec::default()
    };
    let e = prepare(&spec).unwrap_err().to_string();
    assert!(e.contains("stat mount source /nonexistent/brood"), "{e}");
    let spec = NsSpec {
        cwd: Some(PathBuf::from("rel")),
        ..NsSpec::default()
    };
    assert!(prepare(&spec).unwrap_err().to_string().contains("cwd"));
    let spec = NsSpec {
        root: Some(PathBuf::from("/")),
        ..NsSpec::default()
    };
    assert!(prepare(&spec).unwrap_err().to_string().contains("root"));
}

#[test]
fn mount_points_are_made_in_the_root_never_through_a_symlink() {
    let src = tempfile::tempdir().unwrap();
    let file_src = src.path().join("f");
    fs::write(&file_src, "x").unwrap();
    let root = tempfile::tempdir().unwrap();
    let spec = NsSpec {
        mounts: vec![entry(src.path(), "/a/b"), entry(&file_src, "/etc/f")],
        root: Some(root.path().to_path_buf()),
        proc: true,
        ..NsSpec::default()
    };
    let p = prepare(&spec).unwrap();
    assert!(root.path().join("a/b").is_dir());
    assert!(root.path().join("etc/f").is_file());
    assert!(root.path().join("proc").is_dir());
    assert_eq!(p.mounts.len(), 2);
    assert!(p.child_failure().is_none());

    std::os::unix::fs::symlink("/etc", root.path().join("evil")).unwrap();
    let spec = NsSpec {
        mounts: vec![entry(src.path(), "/evil/x")],
        root: Some(root.path().to_path_buf()),
        ..NsSpec::default()
    };
    let e = prepare(&spec).unwrap_err().to_string();
    assert!(e.contains("symlink") && e.contains("evil"), "{e}");
    assert!(!Path::new("/etc/x").exists());
}

#[test]
fn a_scratch_root_is_planned_for_the_child_and_nothing_is_made_here() {
    let src = tempfile::tempdir().unwrap();
    let file_src = src.path().join("f");
    fs::write(&file_src, "x").unwrap();
    let root = tempfile::tempdir().unwrap();
    let spec = NsSpec {
        mounts: vec![
            entry(src.path(), "/a/b"),
            entry(&file_src, "/a/f"),
            entry(src.path(), "/c"),
        ],
        root: Some(root.path().to_path_buf()),
        scratch: true,
        proc: true,
        ..NsSpec::default()
    };
    let p = prepare(&spec).unwrap();
    assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    let planned: Vec<(&Path, bool)> = p
        .points
        .iter()
        .map(|m| (m.shown.as_path(), m.file))
        .collect();
    // Parents first (the table sorted by depth), each once; the file
    // source's point is a file.
    assert_eq!(
        planned,
        [
            (Path::new("/c"), false),
            (Path::new("/a"), false),
            (Path::new("/a/b"), false),
            (Path::new("/a/f"), true),
            (Path::new("/proc"), false),
        ]
    );
    assert_eq!(
        p.points[2].path.to_bytes(),
        root.path().join("a/b").as_os_str().as_bytes()
    );
    assert!(p.scratch);
}

#[test]
fn nested_targets_need_their_mount_point_in_the_parent_source() {
    let outer = tempfile::tempdir().unwrap();
    let inner = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    // Listed child first: prepare orders parents first.
    let spec = NsSpec {
        mounts: vec![entry(inner.path(), "/w/sub"), entry(outer.path(), "/w")],
        root: Some(root.path().to_path_buf()),
        ..NsSpec::default()
    };
    let e = prepare(&spec).unwrap_err().to_string();
    assert!(
        e.contains(&*outer.path().join("sub").to_string_lossy()),
        "{e}"
    );
    assert!(
        !outer.path().join("sub").exists(),
        "nothing is made in user data"
    );
    fs::create_dir(outer.path().join("sub")).unwrap();
    let p = prepare(&spec).unwrap();
    let order: Vec<&Path> = p.mounts.iter().map(|m| m.target_shown.as_path()).collect();
    assert_eq!(order, [Path::new("/w"), Path::new("/w/sub")]);
}

#[test]
fn flags_follow_the_entry() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut rw = entry(src.path(), "/rw");
    rw.rw = true;
    rw.nosuid = false;
    rw.nodev = false;
    let mut rb = entry(src.path(), "/rb");
    rb.rbind = true;
    rb.noexec = true;
    let spec = NsSpec {
        mounts: vec![rw, rb, entry(src.path(), "/ro")],
        root: Some(root.path().to_path_buf()),
        empty_network: true,
        ..NsSpec::default()
    };
    let p = prepare(&spec).unwrap();
    assert_eq!(p.unshare_flags, libc::CLONE_NEWNS | libc::CLONE_NEWNET);
    assert_eq!(p.mounts[0].restrict, Restrict::None);
    assert_eq!(p.mounts[0].bind_flags, libc::MS_BIND);
    assert_eq!(p.mounts[1].bind_flags, libc::MS_BIND | libc::MS_REC);
    assert_eq!(
        p.mounts[1].restrict,
        Restrict::Recursive(
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC
        )
    );
    let Restrict::Remount(f) = p.mounts[2].restrict else {
        panic!("{:?}", p.mounts[2].restrict);
    };
    let want =
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    assert_eq!(f & want, want);
    assert_eq!(f & libc::MS_NOEXEC, 0);
}

#[test]
fn a_recorded_child_failure_names_its_step_and_path() {
    let p = prepare(&NsSpec {
        cwd: Some(PathBuf::from("/no/such/dir")),
        ..NsSpec::default()
    })
    .unwrap();
    let w = ((Step::Chdir as u64) << 48) | libc::ENOENT as u64;
    p.failure.word().store(w, Ordering::Release);
    let e = p.child_failure().unwrap().to_string();
    assert!(e.contains("chdir to /no/such/dir"), "{e}");
    assert!(e.contains("No such file"), "{e}");
}
