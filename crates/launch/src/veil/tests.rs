//! The veil's preparation tested on temporary directories and a parsed
//! mount table; its namespace made for real on this machine.

use std::path::{Path, PathBuf};

use super::{
    MountLine, VeilError, VeilSpec, cgroup_covers, containing_mount, parse_mountinfo, prepare_with,
};

fn line(point: &str, fstype: &str) -> MountLine {
    MountLine {
        point: PathBuf::from(point),
        fstype: fstype.into(),
    }
}

#[test]
fn mountinfo_lines_are_parsed_with_escapes() {
    let text = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n\
                30 22 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
                31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                40 1 0:40 / /mnt/a\\040b rw - ext4 /dev/x rw\n";
    let m = parse_mountinfo(text);
    assert_eq!(m.len(), 4);
    assert_eq!(m[1], line("/sys/fs/cgroup", "tmpfs"));
    assert_eq!(m[2], line("/sys/fs/cgroup/unified", "cgroup2"));
    assert_eq!(m[3].point, PathBuf::from("/mnt/a b"));
}

#[test]
fn a_hybrid_host_is_covered_by_its_cgroup_tmpfs() {
    let m = vec![
        line("/", "ext4"),
        line("/sys", "sysfs"),
        line("/sys/fs/cgroup", "tmpfs"),
        line("/sys/fs/cgroup/unified", "cgroup2"),
        line("/sys/fs/cgroup/memory", "cgroup"),
        line("/sys/fs/cgroup/pids", "cgroup"),
    ];
    assert_eq!(cgroup_covers(&m), vec![PathBuf::from("/sys/fs/cgroup")]);
}

#[test]
fn a_pure_v2_host_is_covered_at_its_one_mount() {
    let m = vec![
        line("/", "ext4"),
        line("/sys", "sysfs"),
        line("/sys/fs/cgroup", "cgroup2"),
    ];
    assert_eq!(cgroup_covers(&m), vec![PathBuf::from("/sys/fs/cgroup")]);
}

#[test]
fn a_cgroup_mount_beside_other_mounts_is_covered_alone() {
    // Its parent holds a non-cgroup mount too: covering the parent would
    // hide what agents may use, so each hierarchy is covered where it is.
    let m = vec![
        line("/", "ext4"),
        line("/run", "tmpfs"),
        line("/run/cg", "cgroup2"),
        line("/run/user", "tmpfs"),
        line("/mnt/v1", "cgroup"),
    ];
    assert_eq!(
        cgroup_covers(&m),
        vec![PathBuf::from("/run/cg"), PathBuf::from("/mnt/v1")]
    );
}

#[test]
fn the_containing_mount_is_the_longest_and_latest() {
    let m = vec![
        line("/", "ext4"),
        line("/tmp", "tmpfs"),
        line("/tmp", "tmpfs"),
        line("/tmp/x", "ext4"),
    ];
    assert_eq!(
        containing_mount(&m, Path::new("/tmp/y/z")),
        Some(Path::new("/tmp"))
    );
    assert_eq!(
        containing_mount(&m, Path::new("/tmp/x")),
        Some(Path::new("/tmp/x"))
    );
    assert_eq!(
        containing_mount(&m, Path::new("/var")),
        Some(Path::new("/"))
    );
}

#[test]
fn kept_entries_are_plain_names_and_missing_ones_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ctx")).unwrap();
    let m = vec![line("/", "ext4")];
    let mut spec = VeilSpec {
        covers: vec![],
        root: dir.path().to_path_buf(),
        keep: vec!["ctx".into(), "brood.sock".into()],
        files: vec![
            dir.path().join("brood.db"),
            PathBuf::from("/nonexistent/x.db"),
        ],
        proc: None,
    };
    let p = prepare_with(&spec, &m).unwrap();
    assert_eq!(p.kept.len(), 1, "only ctx exists");
    assert!(p.kept[0].dir);
    assert!(
        p.files.is_empty(),
        "the db is under the root; the other is missing"
    );
    spec.keep = vec!["../etc".into()];
    assert!(matches!(
        prepare_with(&spec, &m),
        Err(VeilError::BadPath { .. })
    ));
    std::os::unix::fs::symlink("/etc", dir.path().join("link")).unwrap();
    spec.keep = vec!["link".into()];
    let e = prepare_with(&spec, &m).unwrap_err().to_string();
    assert!(e.contains("symlink"), "{e}");
}
