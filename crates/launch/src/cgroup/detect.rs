//! Which cgroup hierarchies this host has and where this process sits in
//! them ([`detect`]), read from the mount table and `/proc/self/cgroup`: pure
//! v2, hybrid (v2 for grouping beside v1 controllers) or pure v1.

use super::{CgroupError, io_err};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::path::PathBuf;

/// v1 controllers we recognise in mount options (cgroups(7)); anything else in
/// the options is a mount flag or a named hierarchy (`name=systemd`).
pub(super) const V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// Which cgroup hierarchies this host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Only cgroup v2 (`/sys/fs/cgroup` is cgroup2).
    V2,
    /// cgroup v2 for grouping next to v1 controller hierarchies.
    Hybrid,
    /// Only v1 controller hierarchies.
    V1,
    /// No cgroup filesystem is mounted.
    Unavailable,
}

/// As people read it: `v2 only`, `hybrid (v2 and v1)`, `v1 only`, `none`.
impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::V2 => "v2 only",
            Layout::Hybrid => "hybrid (v2 and v1)",
            Layout::V1 => "v1 only",
            Layout::Unavailable => "none",
        })
    }
}

/// What [`detect`] found. Paths are under the `fs_root` given to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub layout: Layout,
    pub v2_mount: Option<PathBuf>,
    /// v1 controller -> its mount point (co-mounted controllers share one).
    pub v1_mounts: BTreeMap<String, PathBuf>,
    /// Our own v2 cgroup (`/proc/self/cgroup` line `0::`), relative to the v2
    /// mount: when only a subtree is mounted (a container without a cgroup
    /// namespace) the mount's root is taken off; `None` when we are outside it.
    pub own_v2: Option<String>,
    /// v1 hierarchy (controller list such as `cpu,cpuacct` split into each
    /// controller, or `name=systemd`) -> our cgroup there, as for `own_v2`.
    pub own_v1: BTreeMap<String, String>,
    /// What our own v2 group's `cgroup.controllers` offers (none enabled by us).
    pub v2_controllers: Vec<String>,
    /// Where the liveness marks of this user's supervisor incarnations live
    /// (`cgroup::alive`): `<fs_root>/run/brood/incarnations` for root;
    /// `None` when this user has no such place.
    pub marks: Option<PathBuf>,
}

/// One line of the mount table that is a cgroup filesystem.
pub(super) struct Mount {
    dir: PathBuf,
    /// Which directory of the hierarchy is mounted there (`/` unless a subtree).
    root: String,
    fstype: String,
    opts: String,
}

/// Finds the cgroup hierarchies and our place in them, from
/// `fs_root/proc/self/mountinfo` (proc(5); `mounts` when there is no mountinfo)
/// and `fs_root/proc/self/cgroup` (cgroups(7), `/proc/[pid]/cgroup`).
/// `fs_root` is `/` in production and a directory of fake files in tests.
pub fn detect(fs_root: &Path) -> Result<Detected, CgroupError> {
    let proc_self = fs_root.join("proc/self");
    let mounts = read_mounts(fs_root, &proc_self)?;
    let cgroup_file = proc_self.join("cgroup");
    // A kernel without cgroups has no /proc/self/cgroup: that is "unavailable",
    // not an error.
    let own = match fs::read_to_string(&cgroup_file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io_err("read", &cgroup_file, e)),
    };

    let mut v2: Option<&Mount> = None;
    let mut v1: BTreeMap<String, &Mount> = BTreeMap::new();
    for m in &mounts {
        if m.fstype == "cgroup2" && v2.is_none() {
            v2 = Some(m);
        } else if m.fstype == "cgroup" {
            for opt in m.opts.split(',') {
                if V1_CONTROLLERS.contains(&opt) {
                    v1.entry(opt.to_owned()).or_insert(m);
                }
            }
        }
    }

    let mut own_v2 = None;
    let mut own_v1 = BTreeMap::new();
    for line in own.lines() {
        // "hierarchy-ID:controller-list:cgroup-path"; the path may contain ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            own_v2 = v2.and_then(|m| relative_to(path, &m.root)).map(|p| {
                // A supervisor that moved into its leaf to enable v2 limits
                // (Cgroups::set_limits) still owns the group above it.
                match p.rsplit_once('/') {
                    Some((up, leaf))
                        if leaf.starts_with("brood-") && leaf.ends_with(".supervisor") =>
                    {
                        if up.is_empty() {
                            "/".to_owned()
                        } else {
                            up.to_owned()
                        }
                    }
                    _ => p,
                }
            });
        } else {
            for c in ctrls.split(',') {
                let root = v1.get(c).map_or("/", |m| m.root.as_str());
                if let Some(p) = relative_to(path, root) {
                    own_v1.insert(c.to_owned(), p);
                }
            }
        }
    }

    let v2_mount = v2.map(|m| m.dir.clone());
    let v2_controllers = match (&v2_mount, &own_v2) {
        (Some(mount), Some(own)) => {
            fs::read_to_string(join_own(mount, own).join("cgroup.controllers"))
                .map(|t| t.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let v1_mounts: BTreeMap<String, PathBuf> =
        v1.into_iter().map(|(c, m)| (c, m.dir.clone())).collect();
    let layout = match (v2_mount.is_some(), v1_mounts.is_empty()) {
        (true, true) => Layout::V2,
        (true, false) => Layout::Hybrid,
        (false, false) => Layout::V1,
        (false, true) => Layout::Unavailable,
    };
    Ok(Detected {
        layout,
        v2_mount,
        v1_mounts,
        own_v2,
        own_v1,
        v2_controllers,
        // SAFETY: geteuid(2) has no preconditions.
        marks: super::alive::marks_dir(fs_root, unsafe { libc::geteuid() }),
    })
}

pub(super) fn read_mounts(fs_root: &Path, proc_self: &Path) -> Result<Vec<Mount>, CgroupError> {
    let info = proc_self.join("mountinfo");
    let (text, is_info) = match fs::read_to_string(&info) {
        Ok(t) => (t, true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mounts = proc_self.join("mounts");
            let t = fs::read_to_string(&mounts).map_err(|e| io_err("read", &mounts, e))?;
            (t, false)
        }
        Err(e) => return Err(io_err("read", &info, e)),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // mountinfo: id parent dev root mountpoint opts [optional...] - fstype source superopts
        // mounts:    source mountpoint fstype opts freq passno
        let (root, point, fstype, opts) = if is_info {
            let Some(sep) = f.iter().position(|x| *x == "-") else {
                continue;
            };
            match (f.get(3), f.get(4), f.get(sep + 1), f.get(sep + 3)) {
                (Some(r), Some(p), Some(t), Some(o)) => (unescape(r), *p, *t, *o),
                _ => continue,
            }
        } else {
            match (f.get(1), f.get(2), f.get(3)) {
                (Some(p), Some(t), Some(o)) => (b"/".to_vec(), *p, *t, *o),
                _ => continue,
            }
        };
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let point = PathBuf::from(OsString::from_vec(unescape(point)));
        out.push(Mount {
            dir: fs_root.join(point.strip_prefix("/").unwrap_or(&point)),
            root: String::from_utf8_lossy(&root).into_owned(),
            fstype: fstype.to_owned(),
            opts: opts.to_owned(),
        });
    }
    Ok(out)
}

/// Undoes the octal escapes (`\040` for a space) of the mount table (proc(5)).
pub(super) fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |acc, c| acc.wrapping_mul(8) + (c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// `path` (from /proc/self/cgroup) relative to a mount whose root is `root`.
pub(super) fn relative_to(path: &str, root: &str) -> Option<String> {
    if root == "/" {
        return Some(path.to_owned());
    }
    match path.strip_prefix(root)? {
        "" => Some("/".to_owned()),
        rest if rest.starts_with('/') => Some(rest.to_owned()),
        _ => None,
    }
}

/// `mount` joined with an own-cgroup path such as `/` or `/a/b`.
pub(super) fn join_own(mount: &Path, own: &str) -> PathBuf {
    match own.trim_start_matches('/') {
        "" => mount.to_path_buf(),
        rel => mount.join(rel),
    }
}
