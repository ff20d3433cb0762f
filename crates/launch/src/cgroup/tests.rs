//! Unit tests of the cgroup layer on fake `/proc` and cgroupfs trees (the
//! real kernel is `tests/cgroup_real.rs` and `tests/limits_real.rs`).
use super::*;

/// A fake root with the given proc files (`None` leaves a file out).
fn fake_root(
    mountinfo: Option<&str>,
    mounts: Option<&str>,
    cgroup: Option<&str>,
) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let proc_self = root.path().join("proc/self");
    fs::create_dir_all(&proc_self).unwrap();
    for (name, text) in [
        ("mountinfo", mountinfo),
        ("mounts", mounts),
        ("cgroup", cgroup),
    ] {
        if let Some(t) = text {
            fs::write(proc_self.join(name), t).unwrap();
        }
    }
    root
}

const V2_MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:23 / /proc rw,nosuid shared:12 - proc proc rw
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
const V2_CGROUP: &str = "0::/system.slice/brood.service\n";

/// This host's lines, as of writing.
const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/848a6f3298eb01edf96d80a4995e6130
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

/// A classic v1 host, given as /proc/self/mounts only (no mountinfo).
const V1_MOUNTS: &str = "\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,nodev,noexec,relatime,freezer 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,nosuid,nodev,noexec,relatime,pids 0 0
";
const V1_CGROUP: &str = "\
5:pids:/system.slice/brood.service
4:freezer:/
3:cpu,cpuacct:/system.slice/brood.service
1:name=systemd:/system.slice/brood.service
";

#[test]
fn detects_pure_v2() {
    let root = fake_root(Some(V2_MOUNTINFO), None, Some(V2_CGROUP));
    let own = root.path().join("sys/fs/cgroup/system.slice/brood.service");
    fs::create_dir_all(&own).unwrap();
    fs::write(own.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    let d = detect(root.path()).unwrap();
    assert_eq!(d.layout, Layout::V2);
    assert_eq!(d.v2_mount, Some(root.path().join("sys/fs/cgroup")));
    assert!(d.v1_mounts.is_empty());
    assert_eq!(d.own_v2.as_deref(), Some("/system.slice/brood.service"));
    assert_eq!(d.v2_controllers, ["cpu", "io", "memory", "pids"]);
}

#[test]
fn detects_this_hosts_hybrid_layout() {
    let root = fake_root(Some(HYBRID_MOUNTINFO), None, Some(HYBRID_CGROUP));
    let unified = root.path().join("sys/fs/cgroup/unified");
    fs::create_dir_all(&unified).unwrap();
    fs::write(unified.join("cgroup.controllers"), "hugetlb\n").unwrap();
    let d = detect(root.path()).unwrap();
    assert_eq!(d.layout, Layout::Hybrid);
    assert_eq!(d.v2_mount, Some(unified));
    assert_eq!(d.own_v2.as_deref(), Some("/"));
    assert_eq!(d.v2_controllers, ["hugetlb"]);
    let ctrls: Vec<&str> = d.v1_mounts.keys().map(String::as_str).collect();
    assert_eq!(
        ctrls,
        [
            "blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"
        ],
        "named hierarchies (name=systemd) are not controllers"
    );
    assert_eq!(
        d.v1_mounts["freezer"],
        root.path().join("sys/fs/cgroup/freezer")
    );
    assert_eq!(
        d.own_v1["memory"],
        "/process_api/848a6f3298eb01edf96d80a4995e6130"
    );
    assert_eq!(d.own_v1["freezer"], "/");
}

#[test]
fn detects_pure_v1_from_proc_mounts() {
    let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
    let d = detect(root.path()).unwrap();
    assert_eq!(d.layout, Layout::V1);
    assert_eq!(d.v2_mount, None);
    assert_eq!(d.own_v2, None);
    let comounted = root.path().join("sys/fs/cgroup/cpu,cpuacct");
    assert_eq!(d.v1_mounts["cpu"], comounted);
    assert_eq!(d.v1_mounts["cpuacct"], comounted);
    assert_eq!(d.own_v1["cpuacct"], "/system.slice/brood.service");
    assert_eq!(d.own_v1["freezer"], "/");
}

#[test]
fn detects_no_cgroups() {
    let mounts = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n25 22 0:23 / /proc rw - proc proc rw\n";
    let root = fake_root(Some(mounts), None, None);
    let d = detect(root.path()).unwrap();
    assert_eq!(d.layout, Layout::Unavailable);
    assert!(d.v1_mounts.is_empty() && d.own_v1.is_empty() && d.own_v2.is_none());
    let err = Cgroups::open(&d, "x").unwrap_err();
    assert!(matches!(err, CgroupError::NoCgroupFs(_)), "{err}");
}

#[test]
fn detect_without_proc_is_an_error_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    let err = detect(root.path()).unwrap_err().to_string();
    assert!(err.contains("proc/self/mounts"), "{err}");
}

#[test]
fn a_mounted_subtree_is_taken_off_our_own_path() {
    // A container without a cgroup namespace sees its own subtree mounted at
    // /sys/fs/cgroup and its full path in /proc/self/cgroup.
    let mi = "30 24 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let root = fake_root(Some(mi), None, Some("0::/docker/abc/x\n"));
    assert_eq!(detect(root.path()).unwrap().own_v2.as_deref(), Some("/x"));
    let root = fake_root(Some(mi), None, Some("0::/docker/abcdef\n"));
    assert_eq!(detect(root.path()).unwrap().own_v2, None);
}

#[test]
fn mount_points_are_unescaped() {
    let mi = "30 24 0:26 / /srv/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
    let root = fake_root(Some(mi), None, Some("0::/\n"));
    let d = detect(root.path()).unwrap();
    assert_eq!(d.v2_mount, Some(root.path().join("srv/my cgroups")));
}

#[test]
fn group_paths_accept_agent_names_and_refuse_everything_else() {
    let p = GroupPath::new(&["user-0", "coder-1a2b3c4d", "A.b_c+d-e"]).unwrap();
    assert_eq!(p.to_string(), "user-0/coder-1a2b3c4d/A.b_c+d-e");
    assert_eq!(p.as_path(), Path::new("user-0/coder-1a2b3c4d/A.b_c+d-e"));
    assert_eq!(
        p.child("x").unwrap().to_string(),
        "user-0/coder-1a2b3c4d/A.b_c+d-e/x"
    );
    assert_eq!(GroupPath::new(&[]).unwrap().to_string(), ".");
    assert!(GroupPath::new(&[&"a".repeat(80)]).is_ok());
    for bad in [
        "",
        ".",
        "..",
        "a/b",
        "a b",
        "tab\t",
        "é",
        "a\0",
        &"a".repeat(81),
        "cgroup.procs",
        "cgroup.kill",
        "memory.max",
        "pids.max",
        "cpu.weight",
        "freezer.state",
        "tasks",
        "release_agent",
        "notify_on_release",
    ] {
        match GroupPath::new(&["ok", bad]) {
            Err(CgroupError::BadComponent(c)) => assert_eq!(c, bad),
            other => panic!("{bad:?} was accepted: {other:?}"),
        }
    }
    // A dot is fine where it does not follow a controller name.
    assert!(GroupPath::new(&["agent.v2", "cpux.y", ".hidden"]).is_ok());
}

fn detected(mountinfo: &str, cgroup: &str) -> (tempfile::TempDir, Detected) {
    let root = fake_root(Some(mountinfo), None, Some(cgroup));
    let d = detect(root.path()).unwrap();
    (root, d)
}

#[test]
fn base_is_under_our_own_cgroup_and_the_instance_never_at_a_root() {
    let (root, d) = detected(HYBRID_MOUNTINFO, HYBRID_CGROUP);
    let (kind, base) = base_dir(&d, "a1-b2", "s42-7").unwrap();
    assert_eq!(kind, Kind::V2);
    assert_eq!(
        base,
        root.path().join("sys/fs/cgroup/unified/brood-a1-b2/s42-7")
    );

    let (root, d) = detected(V2_MOUNTINFO, V2_CGROUP);
    let (_, base) = base_dir(&d, "x", "s42-7").unwrap();
    assert_eq!(
        base,
        root.path()
            .join("sys/fs/cgroup/system.slice/brood.service/brood-x/s42-7")
    );

    let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
    let mut d = detect(root.path()).unwrap();
    let (kind, base) = base_dir(&d, "x", "s42-7").unwrap();
    assert_eq!(kind, Kind::V1Freezer);
    assert_eq!(
        base,
        root.path().join("sys/fs/cgroup/freezer/brood-x/s42-7")
    );
    d.v1_mounts.remove("freezer");
    let (kind, base) = base_dir(&d, "x", "s42-7").unwrap();
    assert_eq!(kind, Kind::V1Pids);
    assert_eq!(
        base,
        root.path()
            .join("sys/fs/cgroup/pids/system.slice/brood.service/brood-x/s42-7")
    );
    d.v1_mounts.remove("pids");
    assert!(matches!(
        base_dir(&d, "x", "s1-1"),
        Err(CgroupError::NoCgroupFs(_))
    ));
}

#[test]
fn instance_names_and_foreign_paths_are_refused() {
    let (_root, d) = detected(HYBRID_MOUNTINFO, HYBRID_CGROUP);
    for bad in ["", "A", "a_b", "a/b", "..", &"a".repeat(65)] {
        assert!(
            matches!(base_dir(&d, bad, "s1-1"), Err(CgroupError::BadInstance(_))),
            "{bad:?}"
        );
    }
    let (_root, d) = detected(V2_MOUNTINFO, "0::/../../elsewhere\n");
    let err = base_dir(&d, "x", "s1-1").unwrap_err().to_string();
    assert!(err.contains("outside"), "{err}");
}

#[test]
fn open_on_a_fake_v1_tree_makes_the_base_and_names_mirrors() {
    let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
    let d = detect(root.path()).unwrap();
    let cg = Cgroups::open(&d, "t").unwrap();
    assert!(cg.base().is_dir());
    assert_eq!(cg.layout(), Layout::V1);
    assert_eq!(cg.kill_mechanism(), "freezer+SIGKILL");
    let me = cg.base().file_name().unwrap().to_str().unwrap().to_owned();
    assert!(parse_incarnation(&me).is_some(), "{me}");
    let mirrors: Vec<&str> = cg.v1_mirror().keys().map(String::as_str).collect();
    assert_eq!(mirrors, ["cpu", "cpuacct", "pids"]);
    assert_eq!(
        cg.v1_mirror()["pids"],
        root.path()
            .join("sys/fs/cgroup/pids/system.slice/brood.service/brood-t")
            .join(&me)
    );

    let a = GroupPath::new(&["a"]).unwrap();
    let g = cg.create(&a).unwrap();
    assert_eq!(g.dir, cg.base().join("a"));
    let err = cg.create(&a).unwrap_err();
    assert!(err.to_string().contains(&*g.dir.to_string_lossy()), "{err}");
    let orphan = GroupPath::new(&["missing", "b"]).unwrap();
    assert!(matches!(
        cg.create(&orphan),
        Err(CgroupError::Io { op: "mkdir", .. })
    ));
    cg.create(&a.child("b").unwrap()).unwrap();
    cg.remove(&g).unwrap();
    assert!(!g.dir.exists());
    cg.remove(&g).unwrap();

    let line = format!("4:freezer:/brood-t/{me}/a/b\n0::/\n");
    assert_eq!(cg.path_of_process_line(&line), Some(cg.base().join("a/b")));
    let line = format!("4:freezer:/brood-t/{me}\n");
    assert_eq!(
        cg.path_of_process_line(&line),
        Some(cg.base().to_path_buf())
    );
    let line = format!("4:freezer:/brood-t/{me}0/a\n");
    assert_eq!(cg.path_of_process_line(&line), None);
    assert_eq!(cg.path_of_process_line("4:freezer:/\n"), None);
}

#[test]
fn an_incarnation_holds_its_liveness_mark_once_per_process() {
    let root = fake_root(None, Some(V1_MOUNTS), Some(V1_CGROUP));
    let d = detect(root.path()).unwrap();
    // SAFETY: geteuid(2) has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests run as root");
    let marks = root.path().join("run/brood/incarnations");
    assert_eq!(d.marks.as_deref(), Some(marks.as_path()));
    let cg = Cgroups::open(&d, "m").unwrap();
    let me = cg.base().file_name().unwrap().to_str().unwrap().to_owned();
    let mark = marks.join("m").join(format!("{me}.lock"));
    assert_eq!(cg.mark(), Ok(mark.as_path()));
    // Held: another open file description of it cannot lock it.
    assert!(matches!(
        alive::look(d.marks.as_deref(), "m", &me),
        alive::Mark::Held
    ));
    // A second handle on the same incarnation in this process shares it.
    let again = Cgroups::open(&d, "m").unwrap();
    assert_eq!(again.mark(), Ok(mark.as_path()));
    // (What `destroy` does once the groups are gone: tests/cgroup_real.rs.)
    alive::release(&mark);
    assert!(!mark.exists(), "a released mark is removed");
    assert!(alive::remove_instance_if_empty(d.marks.as_deref(), "m"));
    assert!(!marks.join("m").exists());
    // Free (nobody holds it), then gone once the looker removes it.
    fs::create_dir_all(marks.join("m")).unwrap();
    fs::write(marks.join("m/s7-7.lock"), "").unwrap();
    match alive::look(d.marks.as_deref(), "m", "s7-7") {
        alive::Mark::Free(taken) => taken.remove(),
        other => panic!("a mark nobody holds: {other:?}"),
    }
    assert!(!marks.join("m/s7-7.lock").exists());
    assert!(matches!(
        alive::look(d.marks.as_deref(), "m", "s7-7"),
        alive::Mark::None
    ));
}

#[test]
fn another_user_has_marks_only_in_a_runtime_directory_of_its_own() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(
        alive::marks_dir(root.path(), 0),
        Some(root.path().join("run/brood/incarnations"))
    );
    assert_eq!(alive::marks_dir(root.path(), 4242), None);
    let runtime = root.path().join("run/user/4242");
    fs::create_dir_all(&runtime).unwrap();
    // Root's, not the user's: not a place for its marks.
    assert_eq!(alive::marks_dir(root.path(), 4242), None);
    std::os::unix::fs::chown(&runtime, Some(4242), None).unwrap();
    assert_eq!(
        alive::marks_dir(root.path(), 4242),
        Some(runtime.join("brood/incarnations"))
    );
}

#[test]
fn incarnation_names_and_stat_start_times_parse() {
    assert_eq!(parse_incarnation("s999999-1"), Some((999_999, 1)));
    for bad in ["s-1", "s1-", "x1-1", "s0-1", "s1-1-1", "s1_1", "tenant"] {
        assert_eq!(parse_incarnation(bad), None, "{bad}");
    }
    let stat = |comm: &str, state: &str| {
        format!(
            "123 ({comm}) {state} 1 123 123 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
             987654 1000 100 18446744073709551615\n"
        )
    };
    assert_eq!(parse_stat_start(&stat("sleep", "S")), Some(Some(987_654)));
    assert_eq!(parse_stat_start(&stat("a) (b c", "R")), Some(Some(987_654)));
    assert_eq!(parse_stat_start(&stat("x", "Z")), Some(None));
    assert_eq!(parse_stat_start("123 (x) S 1"), None);
    // SAFETY: getpid(2) has no preconditions.
    let me = unsafe { libc::getpid() };
    assert!(matches!(start_time(me), Ok(Some(_))));
}

/// A fake pure-v2 host whose own group offers `controllers`, with the
/// interface files the limits code writes (plain files: nothing enforces
/// anything here, the real kernel is in tests/limits_real.rs).
fn fake_v2(controllers: &str) -> (tempfile::TempDir, Detected, PathBuf) {
    let root = fake_root(Some(V2_MOUNTINFO), None, Some(V2_CGROUP));
    let own = root.path().join("sys/fs/cgroup/system.slice/brood.service");
    fs::create_dir_all(&own).unwrap();
    fs::write(own.join("cgroup.controllers"), controllers).unwrap();
    let d = detect(root.path()).unwrap();
    (root, d, own)
}

/// Makes `dir` look like a fresh v2 group.
fn fake_group(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for f in [
        "cgroup.subtree_control",
        "cgroup.procs",
        "memory.max",
        "pids.max",
        "cpu.weight",
    ] {
        fs::write(dir.join(f), "").unwrap();
    }
}

#[test]
fn v2_limits_enable_controllers_top_down_and_write_the_v2_files() {
    let (_root, d, own) = fake_v2("cpu io memory pids\n");
    let base = own.join("brood-x/s1-1");
    let cg = Cgroups::assemble(&d, Kind::V2, "x", base.clone());
    assert!(cg.v1_mirror().is_empty());
    assert_eq!(
        cg.limits_supported(),
        [
            ("memory: cgroup v2 memory.max", true),
            ("pids: cgroup v2 pids.max", true),
            ("cpu: cgroup v2 cpu.weight", true)
        ]
    );
    for dir in [&own, &own.join("brood-x"), &base, &base.join("t")] {
        fake_group(dir);
    }
    let g = cg.group(&GroupPath::new(&["t", "a"]).unwrap());
    fake_group(&g.dir);
    let l = Limits {
        memory_max: Some(32 << 20),
        pids_max: Some(8),
        cpu_weight: Some(250),
    };
    let h = cg.set_limits(&g, &l).unwrap();
    assert!(h.procs_files.is_empty(), "v2 needs no extra group to join");
    for dir in [&own, &own.join("brood-x"), &base, &base.join("t")] {
        let sc = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap();
        assert_eq!(sc, "+memory +pids +cpu", "{}", dir.display());
    }
    assert_eq!(
        fs::read_to_string(g.dir.join("cgroup.subtree_control")).unwrap(),
        "",
        "the agent's own group must stay free to hold its leaf"
    );
    let read = |f: &str| fs::read_to_string(g.dir.join(f)).unwrap();
    assert_eq!(read("memory.max"), "33554432");
    assert_eq!(read("pids.max"), "8");
    assert_eq!(read("cpu.weight"), "250");

    // Only the pids limit: only pids is asked for (already on: no write).
    fs::write(own.join("cgroup.subtree_control"), "memory pids cpu\n").unwrap();
    cg.set_limits(
        &g,
        &Limits {
            pids_max: Some(3),
            ..Limits::default()
        },
    )
    .unwrap();
    assert_eq!(
        fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(),
        "memory pids cpu\n"
    );
    assert_eq!(read("pids.max"), "3");

    // The agent's processes go to its leaf, which maps back to the group.
    fake_group(&g.dir.join(PROCESS_LEAF));
    cg.procs_file(&g).unwrap();
    let line = "0::/system.slice/brood.service/brood-x/s1-1/t/a/@self\n";
    assert_eq!(cg.path_of_process_line(line), Some(g.dir.clone()));
}

#[test]
fn a_v2_limit_the_host_lacks_is_refused_naming_the_controller() {
    let (_root, d, own) = fake_v2("memory\n");
    let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
    assert_eq!(
        cg.limits_supported()[1],
        ("pids: no controller on this host", false)
    );
    let g = cg.group(&GroupPath::new(&["a"]).unwrap());
    let err = cg
        .set_limits(
            &g,
            &Limits {
                pids_max: Some(8),
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::Unsupported {
                controller: "pids",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("pids controller"), "{err}");
    // No limit asked for: nothing to do, whatever the host has.
    cg.set_limits(&g, &Limits::default()).unwrap();
}

#[test]
fn cpu_weight_out_of_range_is_refused_and_converts_to_shares() {
    let (_root, d, own) = fake_v2("cpu\n");
    let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
    let g = cg.group(&GroupPath::new(&["a"]).unwrap());
    for w in [0, 10_001] {
        let err = cg
            .set_limits(
                &g,
                &Limits {
                    cpu_weight: Some(w),
                    ..Limits::default()
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("cpu_weight"), "{err}");
    }
    assert_eq!(weight_to_shares(100), 1024, "the defaults match");
    assert_eq!(weight_to_shares(1), 10);
    assert_eq!(weight_to_shares(250), 2560);
    assert_eq!(weight_to_shares(10_000), 102_400);
    assert_eq!(weight_to_shares(0), 2, "clamped to the v1 minimum");
    assert_eq!(
        weight_to_shares(u64::MAX),
        262_144,
        "clamped to the v1 maximum"
    );
}

#[test]
fn the_supervisor_moves_itself_and_its_children_only_and_detect_sees_through_its_leaf() {
    let (root, d, own) = fake_v2("memory\n");
    let cg = Cgroups::assemble(&d, Kind::V2, "x", own.join("brood-x/s1-1"));
    // SAFETY: getpid(2) has no preconditions.
    let me = unsafe { libc::getpid() };
    let leaf = own.join("brood-x.supervisor");
    fake_group(&leaf);
    fs::write(own.join("cgroup.procs"), format!("{me}\n")).unwrap();
    cg.leave_own_group(&own, "+memory").unwrap();
    assert_eq!(
        fs::read_to_string(leaf.join("cgroup.procs")).unwrap(),
        me.to_string()
    );

    // pid 1 is not our child: not ours to move.
    fs::write(own.join("cgroup.procs"), format!("{me}\n1\n")).unwrap();
    match cg.leave_own_group(&own, "+memory") {
        Err(CgroupError::InternalProcess { path, pids, .. }) => {
            assert_eq!(path, own);
            assert_eq!(pids, [1]);
        }
        other => panic!("{other:?}"),
    }

    fs::write(
        root.path().join("proc/self/cgroup"),
        "0::/system.slice/brood.service/brood-x.supervisor\n",
    )
    .unwrap();
    let again = detect(root.path()).unwrap();
    assert_eq!(again.own_v2.as_deref(), Some("/system.slice/brood.service"));
    let top = "30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let r2 = fake_root(Some(top), None, Some("0::/brood-y.supervisor\n"));
    assert_eq!(detect(r2.path()).unwrap().own_v2.as_deref(), Some("/"));
}

#[test]
fn counters_read_flat_keyed_and_single_value_files() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("memory.events");
    fs::write(&f, "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n").unwrap();
    assert_eq!(read_counter(&f, "oom_kill"), Some(1));
    assert_eq!(read_counter(&f, "oom"), Some(1));
    assert_eq!(read_counter(&f, "max"), Some(12));
    assert_eq!(read_counter(&f, "nope"), None);
    fs::write(&f, "9223372036854771712\n").unwrap();
    assert_eq!(read_counter(&f, ""), Some(9_223_372_036_854_771_712));
    assert_eq!(read_counter(&dir.path().join("missing"), ""), None);
}
