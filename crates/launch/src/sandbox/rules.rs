//! The landlock side of a sandbox: which layers this host can enforce for a
//! spec (failing closed), the grants of the base set and the spec, and the
//! ruleset built from them (landlock_create_ruleset(2), landlock_add_rule(2),
//! through the crate).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope,
};

use super::{BASE_LOADERS, BASE_READ, BASE_READ_WRITE, FsAccess, SandboxError, SandboxSpec};

/// Which layers this host can enforce for a spec, before any fd is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layers {
    pub(super) abi: i32,
    pub(super) fs: bool,
    pub(super) net: BitFlags<AccessNet>,
    pub(super) scoped: bool,
    pub(super) weaker: Vec<String>,
}

/// Decides the landlock layers from the kernel's answer (`Ok(abi)` or why there
/// is none), failing closed unless `allow_weaker`. Pure, so every branch is
/// tested without the matching kernel.
pub(super) fn plan_layers(
    kernel: Result<i32, String>,
    spec: &SandboxSpec,
) -> Result<Layers, SandboxError> {
    let mut weaker = Vec::new();
    let mut missing = |layer: &'static str, reason: String| {
        if spec.allow_weaker {
            weaker.push(format!("{layer}: {reason}"));
            Ok(())
        } else {
            Err(SandboxError::Layer { layer, reason })
        }
    };
    let mut wanted_net = BitFlags::<AccessNet>::EMPTY;
    if spec.net_connect.is_some() {
        wanted_net |= AccessNet::ConnectTcp;
    }
    if spec.net_bind.is_some() {
        wanted_net |= AccessNet::BindTcp;
    }
    let abi = match kernel {
        Ok(abi) if abi >= 1 => abi,
        Ok(abi) => {
            missing(
                "landlock",
                format!("the kernel reports landlock ABI {abi}; files cannot be confined"),
            )?;
            0
        }
        Err(why) => {
            missing(
                "landlock",
                format!("the kernel has no landlock ({why}); files cannot be confined"),
            )?;
            0
        }
    };
    if abi == 0 {
        if !wanted_net.is_empty() {
            missing("landlock-net", "TCP port rules need landlock".into())?;
        }
        if spec.scoped {
            missing(
                "landlock-scope",
                "signal and abstract-socket scopes need landlock".into(),
            )?;
        }
        return Ok(Layers {
            abi,
            fs: false,
            net: BitFlags::EMPTY,
            scoped: false,
            weaker,
        });
    }
    let mut net = wanted_net;
    if !wanted_net.is_empty() && abi < 4 {
        missing(
            "landlock-net",
            format!("TCP port rules need landlock ABI 4 (Linux 6.7), this kernel has ABI {abi}"),
        )?;
        net = BitFlags::EMPTY;
    }
    let mut scoped = spec.scoped;
    if spec.scoped && abi < 6 {
        missing(
            "landlock-scope",
            format!(
                "signal and abstract-socket scopes need landlock ABI 6 (Linux 6.12), this kernel has ABI {abi}"
            ),
        )?;
        scoped = false;
    }
    Ok(Layers {
        abi,
        fs: true,
        net,
        scoped,
        weaker,
    })
}

/// Where a filesystem rule comes from: the spec's own paths must exist, the base
/// set's are skipped when the host lacks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Spec,
    Base,
}

/// One path-beneath rule to add, before masking for non-directories.
#[derive(Debug, Clone)]
pub(super) struct Grant {
    pub(super) path: PathBuf,
    pub(super) access: BitFlags<AccessFs>,
    pub(super) origin: Origin,
}

/// The rules of a spec, in order: base set, `fs`, `exec`.
pub(super) fn grants(spec: &SandboxSpec, abi: ABI) -> Vec<Grant> {
    let ro = AccessFs::ReadFile | AccessFs::ReadDir;
    let rx = AccessFs::Execute | AccessFs::ReadFile;
    let mut out = Vec::new();
    if spec.base_ro {
        let base = |paths: &[&str], access: BitFlags<AccessFs>| {
            paths
                .iter()
                .map(move |p| Grant {
                    path: PathBuf::from(p),
                    access,
                    origin: Origin::Base,
                })
                .collect::<Vec<_>>()
        };
        out.extend(base(BASE_READ, ro));
        out.extend(base(
            BASE_READ_WRITE,
            AccessFs::ReadFile | AccessFs::WriteFile,
        ));
        out.extend(base(BASE_LOADERS, rx));
    }
    for (path, mode) in &spec.fs {
        out.push(Grant {
            path: path.clone(),
            access: match mode {
                FsAccess::Ro => ro,
                FsAccess::Rw => AccessFs::from_all(abi),
            },
            origin: Origin::Spec,
        });
    }
    for path in &spec.exec {
        out.push(Grant {
            path: path.clone(),
            access: rx,
            origin: Origin::Spec,
        });
    }
    out
}

fn landlock_err(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Layer {
        layer: "landlock",
        reason: e.to_string(),
    }
}

/// The landlock ruleset for `spec`, as an owned fd (landlock_create_ruleset(2),
/// landlock_add_rule(2), through the crate).
pub(super) fn build_ruleset(spec: &SandboxSpec, layers: &Layers) -> Result<OwnedFd, SandboxError> {
    let abi = ABI::from(layers.abi);
    let mut ruleset = Ruleset::default()
        // Never let the crate drop a right the kernel lacks: we asked for exactly
        // what this kernel has, so any mismatch is a bug to report, not to hide.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(landlock_err)?;
    if !layers.net.is_empty() {
        ruleset = ruleset.handle_access(layers.net).map_err(landlock_err)?;
    }
    if layers.scoped {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(landlock_err)?;
    }
    let mut created = ruleset.create().map_err(landlock_err)?;
    let file_rights = AccessFs::from_file(abi);
    for g in grants(spec, abi) {
        // The base set's /proc is the veil's own proc(5) when there is one:
        // a rule on the host's would not reach the agent's.
        let opened = match &spec.proc_root {
            Some(root) if g.origin == Origin::Base && g.path == Path::new("/proc") => {
                root.0.try_clone().map(File::from)
            }
            _ => open_path(&g.path),
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) if g.origin == Origin::Base && e.kind() == io::ErrorKind::NotFound => continue,
            // A file rule on a path that does not exist (or vanished since the
            // policy was lowered) grants nothing; an exec-only path (the program)
            // must exist.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && spec.fs.iter().any(|(p, _)| *p == g.path) =>
            {
                continue;
            }
            Err(source) => {
                return Err(SandboxError::Path {
                    path: g.path,
                    source,
                });
            }
        };
        let is_dir = file
            .metadata()
            .map_err(|source| SandboxError::Path {
                path: g.path.clone(),
                source,
            })?
            .is_dir();
        // Directory-only rights on a file are refused by the kernel (EINVAL).
        let access = if is_dir {
            g.access
        } else {
            g.access & file_rights
        };
        if access.is_empty() {
            continue;
        }
        created = add_path_rule(created, file, access).map_err(|e| SandboxError::Rule {
            path: g.path.clone(),
            reason: e.to_string(),
        })?;
    }
    let ports = [
        (AccessNet::ConnectTcp, &spec.net_connect),
        (AccessNet::BindTcp, &spec.net_bind),
    ];
    for (right, list) in ports {
        if !layers.net.contains(right) {
            continue;
        }
        for &port in list.iter().flatten() {
            created =
                created
                    .add_rule(NetPort::new(port, right))
                    .map_err(|e| SandboxError::Port {
                        port,
                        reason: e.to_string(),
                    })?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| SandboxError::Layer {
        layer: "landlock",
        reason: "the landlock crate created no ruleset on a kernel with landlock".into(),
    })
}

fn add_path_rule(
    created: RulesetCreated,
    file: File,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, landlock::RulesetError> {
    created.add_rule(PathBeneath::new(file, access))
}

/// Opens `path` as a landlock rule's anchor: `O_PATH` needs no permission on the
/// file itself and follows symlinks, so the rule lands on the file they reach
/// (open(2)).
fn open_path(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
}
