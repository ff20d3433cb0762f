//! The sandbox's decisions tested without the matching kernel, and its
//! ruleset built on this one.

use std::io;
use std::path::Path;

use landlock::{ABI, Access, AccessFs, AccessNet};

use super::rules::plan_layers;
use super::rules::{Origin, grants};
use super::{BASE_LOADERS, ChildStep, FsAccess, SandboxError, SandboxSpec, prepare};

fn spec() -> SandboxSpec {
    SandboxSpec::default()
}

#[test]
fn missing_landlock_fails_closed_naming_the_layer() {
    let e = plan_layers(Err("ENOSYS".into()), &spec()).unwrap_err();
    assert!(
        matches!(
            &e,
            SandboxError::Layer {
                layer: "landlock",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("sandbox layer landlock"), "{e}");
    let e = plan_layers(Ok(0), &spec()).unwrap_err();
    assert!(matches!(
        e,
        SandboxError::Layer {
            layer: "landlock",
            ..
        }
    ));
}

#[test]
fn missing_landlock_with_allow_weaker_lists_every_layer() {
    let s = SandboxSpec {
        allow_weaker: true,
        net_connect: Some(vec![443]),
        ..spec()
    };
    let l = plan_layers(Err("EOPNOTSUPP".into()), &s).unwrap();
    assert!(!l.fs && l.net.is_empty() && !l.scoped);
    let layers: Vec<&str> = l
        .weaker
        .iter()
        .map(|w| w.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(layers, ["landlock", "landlock-net", "landlock-scope"]);
}

#[test]
fn tcp_rules_need_abi_4() {
    let s = SandboxSpec {
        net_bind: Some(vec![]),
        scoped: false,
        ..spec()
    };
    let e = plan_layers(Ok(3), &s).unwrap_err();
    assert!(
        matches!(&e, SandboxError::Layer { layer: "landlock-net", reason } if reason.contains("ABI 3")),
        "{e}"
    );
    let l = plan_layers(
        Ok(3),
        &SandboxSpec {
            allow_weaker: true,
            ..s.clone()
        },
    )
    .unwrap();
    assert!(l.fs && l.net.is_empty());
    assert_eq!(l.weaker.len(), 1);
    let l = plan_layers(Ok(4), &s).unwrap();
    assert_eq!(l.net, AccessNet::BindTcp);
    assert!(l.weaker.is_empty());
    // TCP left open: nothing to enforce, nothing missing, even on ABI 1.
    let l = plan_layers(
        Ok(1),
        &SandboxSpec {
            scoped: false,
            ..spec()
        },
    )
    .unwrap();
    assert!(l.fs && l.net.is_empty() && l.weaker.is_empty());
}

#[test]
fn scopes_need_abi_6() {
    let e = plan_layers(Ok(5), &spec()).unwrap_err();
    assert!(matches!(
        e,
        SandboxError::Layer {
            layer: "landlock-scope",
            ..
        }
    ));
    assert!(plan_layers(Ok(6), &spec()).unwrap().scoped);
}

#[test]
fn grants_follow_the_documented_modes() {
    let s = SandboxSpec {
        fs: vec![("/a".into(), FsAccess::Ro), ("/b".into(), FsAccess::Rw)],
        exec: vec!["/c".into()],
        ..spec()
    };
    let g = grants(&s, ABI::V7);
    let find = |p: &str| g.iter().find(|g| g.path == Path::new(p)).unwrap().access;
    assert_eq!(find("/a"), AccessFs::ReadFile | AccessFs::ReadDir);
    assert_eq!(find("/b"), AccessFs::from_all(ABI::V7));
    assert_eq!(find("/c"), AccessFs::Execute | AccessFs::ReadFile);
    assert_eq!(find("/dev/null"), AccessFs::ReadFile | AccessFs::WriteFile);
    assert_eq!(find("/proc"), AccessFs::ReadFile | AccessFs::ReadDir);
    assert_eq!(
        find("/lib64/ld-linux-x86-64.so.2"),
        AccessFs::Execute | AccessFs::ReadFile
    );
    // Nothing in the base set is writable but /dev/null, nothing executable
    // but the loaders.
    for b in g.iter().filter(|g| g.origin == Origin::Base) {
        let p = b.path.to_string_lossy();
        assert_eq!(
            b.access.contains(AccessFs::WriteFile),
            p == "/dev/null",
            "{p}"
        );
        assert_eq!(
            b.access.contains(AccessFs::Execute),
            BASE_LOADERS.contains(&p.as_ref()),
            "{p}"
        );
    }
    let none = grants(
        &SandboxSpec {
            base_ro: false,
            ..spec()
        },
        ABI::V7,
    );
    assert!(none.is_empty());
}

#[test]
fn relative_and_missing_paths_are_named() {
    let e = prepare(&SandboxSpec {
        fs: vec![("rel/x".into(), FsAccess::Ro)],
        ..spec()
    })
    .unwrap_err();
    assert!(e.to_string().contains("rel/x"), "{e}");
    let e = prepare(&SandboxSpec {
        exec: vec!["/nonexistent/brood-sandbox-test".into()],
        ..spec()
    })
    .unwrap_err();
    assert!(
        matches!(&e, SandboxError::Path { path, source }
            if path == Path::new("/nonexistent/brood-sandbox-test")
                && source.kind() == io::ErrorKind::NotFound),
        "{e}"
    );
}

#[test]
fn contradictory_spec_is_refused() {
    let e = prepare(&SandboxSpec {
        no_new_privs: false,
        ..spec()
    })
    .unwrap_err();
    assert!(matches!(e, SandboxError::Invalid(_)), "{e}");
}

#[test]
fn child_steps_round_trip_and_name_their_layer() {
    for s in [
        ChildStep::Descriptors,
        ChildStep::BoundingSet,
        ChildStep::Ambient,
        ChildStep::Capset,
        ChildStep::NoNewPrivs,
        ChildStep::Landlock,
    ] {
        assert_eq!(ChildStep::from_u8(s as u8), Some(s));
    }
    assert_eq!(ChildStep::from_u8(0), None);
    assert!(ChildStep::Landlock.describe().starts_with("landlock"));
}

#[test]
fn prepare_on_this_host_enforces_everything() {
    // This machine has landlock ABI >= 6 and runs the tests as root with
    // CAP_SETPCAP; a failure here names the missing layer.
    let p = prepare(&SandboxSpec {
        net_connect: Some(vec![80]),
        net_bind: Some(vec![]),
        ..spec()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let e = p.enforced();
    assert!(e.landlock_abi >= 6, "{e:?}");
    assert!(
        e.fs && e.net && e.scoped && e.no_new_privs && e.caps_dropped,
        "{e:?}"
    );
    assert!(e.weaker.is_empty(), "{e:?}");
    let plan = p.child_plan(-1);
    assert!(plan.ruleset_fd >= 0 && plan.drop_caps && plan.no_new_privs);
    // The ruleset fd is close-on-exec, so no agent inherits it.
    // SAFETY: F_GETFD on an fd we own.
    let flags = unsafe { libc::fcntl(plan.ruleset_fd, libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
}
