//! The policy model's tests: paths, mounts, rules, normalisation, derivation.

use super::parts::MAX_PATH;
use super::*;
use proptest::prelude::*;

fn p(s: &str) -> AbsPath {
    AbsPath::new("test", s).unwrap()
}

#[test]
fn paths_are_normalised() {
    for (input, want) in [
        ("/", "/"),
        ("//", "/"),
        ("/a", "/a"),
        ("/a/", "/a"),
        ("//a//b///", "/a/b"),
        ("/a/.../b", "/a/.../b"),
        ("/a/.b/c.", "/a/.b/c."),
    ] {
        assert_eq!(p(input).as_str(), want, "{input:?}");
    }
}

#[test]
fn bad_paths_are_refused_naming_the_field_and_value() {
    let e = AbsPath::new("files[2].path", "/a/../b").unwrap_err();
    assert_eq!(e.field, "files[2].path");
    assert_eq!(
        e.to_string(),
        r#"policy field files[2].path: "/a/../b": ".." is not allowed"#
    );
    for (bad, rule) in [
        ("", "must be an absolute path"),
        ("a/b", "must be an absolute path"),
        ("/a/./b", "\".\" is not allowed"),
        ("/.", "\".\" is not allowed"),
        ("/..", "\"..\" is not allowed"),
        ("/a\0b", "control characters"),
        ("/a\nb", "control characters"),
        ("/a\tb", "control characters"),
        ("/a\u{7f}", "control characters"),
    ] {
        let e = AbsPath::new("f", bad).unwrap_err();
        assert!(e.message.contains(rule), "{bad:?}: {e}");
    }
    let long = format!("/{}", "a".repeat(MAX_PATH));
    assert!(AbsPath::new("f", &long).is_err());
}

#[test]
fn within_compares_whole_components() {
    assert!(p("/a/b").is_within(&p("/a")));
    assert!(p("/a").is_within(&p("/a")));
    assert!(p("/a").is_within(&p("/")));
    assert!(p("/").is_within(&p("/")));
    assert!(!p("/ab").is_within(&p("/a")));
    assert!(!p("/a").is_within(&p("/a/b")));
    assert!(!p("/").is_within(&p("/a")));
    assert_eq!(p("/a/b").parent(), Some(p("/a")));
    assert_eq!(p("/a").parent(), Some(p("/")));
    assert_eq!(p("/").parent(), None);
    assert_eq!(p("/a/b").components().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(p("/").depth(), 0);
}

#[test]
fn the_deepest_rule_decides_and_no_rule_is_hidden() {
    let mut pol = Policy::operator(0, 0, BTreeSet::new());
    pol.files = vec![
        FileRule {
            path: p("/a/b"),
            mode: Mode::Hidden,
        },
        FileRule {
            path: p("/a"),
            mode: Mode::Ro,
        },
        FileRule {
            path: p("/a/b/c"),
            mode: Mode::Rw,
        },
    ];
    assert_eq!(pol.mode_at(&p("/")), Mode::Hidden);
    assert_eq!(pol.mode_at(&p("/x")), Mode::Hidden);
    assert_eq!(pol.mode_at(&p("/a")), Mode::Ro);
    assert_eq!(pol.mode_at(&p("/ab")), Mode::Hidden);
    assert_eq!(pol.mode_at(&p("/a/x")), Mode::Ro);
    assert_eq!(pol.mode_at(&p("/a/b")), Mode::Hidden);
    assert_eq!(pol.mode_at(&p("/a/b/x")), Mode::Hidden);
    assert_eq!(pol.mode_at(&p("/a/b/c/d")), Mode::Rw);
    assert!(Mode::Hidden < Mode::Ro && Mode::Ro < Mode::Rw);
    assert_eq!(Mode::parse("m", "ro").unwrap(), Mode::Ro);
    assert_eq!(
        Mode::parse("files[1].mode", "RO").unwrap_err().to_string(),
        r#"policy field files[1].mode: "RO": must be hidden, ro or rw"#
    );
}

#[test]
fn mount_lines_round_trip() {
    for line in [
        "/src\t/dst\tro\t-",
        "/\t/\trw\trbind,nosuid,nodev,noexec",
        "/a\t/b\tro\tbind,noexec",
    ] {
        let m = MountEntry::parse_line("mounts[0]", line).unwrap();
        assert_eq!(m.to_line(), line);
    }
    let m = MountEntry::parse_line("m", "/a//\t/b/\tro\tnoexec,bind").unwrap();
    assert_eq!(m.to_line(), "/a\t/b\tro\tbind,noexec");
}

#[test]
fn bad_mount_lines_are_refused_naming_the_part() {
    for (line, field, rule) in [
        ("/a\t/b\tro", "mounts[3]", "found 3 tab-separated fields"),
        ("/a /b ro -", "mounts[3]", "found 1 tab-separated fields"),
        ("/a\t/b\tro\t-\t-", "mounts[3]", "found 5"),
        (
            "/a/../x\t/b\tro\t-",
            "mounts[3].source",
            "\"..\" is not allowed",
        ),
        ("/a\tb\tro\t-", "mounts[3].target", "absolute"),
        (
            "/a\t/b/.\tro\t-",
            "mounts[3].target",
            "\".\" is not allowed",
        ),
        ("/a\t/b\tRW\t-", "mounts[3].mode", "must be ro or rw"),
        (
            "/a\t/b\tro\t",
            "mounts[3].options",
            "write - for no options",
        ),
        ("/a\t/b\tro\tbind,bind", "mounts[3].options", "given twice"),
        (
            "/a\t/b\tro\tbind,rbind",
            "mounts[3].options",
            "exclude each other",
        ),
        (
            "/a\t/b\tro\tsuid",
            "mounts[3].options",
            "not a mount option",
        ),
        (
            "/a\t/b\tro\t-,bind",
            "mounts[3].options",
            "not a mount option",
        ),
        (
            "/a\t/b\tro\tbind,",
            "mounts[3].options",
            "not a mount option",
        ),
    ] {
        let e = MountEntry::parse_line("mounts[3]", line).unwrap_err();
        assert_eq!(e.field, field, "{line:?}: {e}");
        assert!(e.message.contains(rule), "{line:?}: {e}");
    }
}

#[test]
fn rules_follow_the_grammar() {
    for text in [
        "allow self tool:shell use",
        "allow * model:* use",
        "allow agent:rev-1 shared:notes write",
        "allow self session:default read",
        "allow self mount:/work read",
        "allow self agent:* resume",
        "allow self network:443 connect",
        "allow self network:8080 bind",
    ] {
        let r = Rule::parse("rules[0]", text).unwrap();
        assert_eq!(r.to_text(), text);
    }
    let r = Rule::parse("r", "  allow   self  tool:a:b   use ").unwrap();
    assert_eq!(r.name, "a:b");
    assert_eq!(r.to_text(), "allow self tool:a:b use");
    for (bad, rule) in [
        ("", "four words"),
        ("allow self tool:x", "four words"),
        ("deny self tool:x use", "must start with \"allow\""),
        ("allow me tool:x use", "must be self, agent:<name> or *"),
        (
            "allow agent:../x tool:x use",
            "must start with a letter or digit",
        ),
        ("allow self tool use", "must be <class>:<name>"),
        ("allow self file:x read", "class \"file\""),
        ("allow self tool: use", "must not be empty"),
        (
            "allow self tool:x read",
            "not a permission of class tool (use)",
        ),
        (
            "allow self agent:x spawn",
            "not a permission of class agent",
        ),
        ("allow self tool:x\0 use", "control characters"),
    ] {
        let e = Rule::parse("rules[4]", bad).unwrap_err();
        assert_eq!(e.field, "rules[4]");
        assert!(e.message.contains(rule), "{bad:?}: {e}");
    }
}

#[test]
fn coverage_is_class_perm_and_subject_and_name_equal_or_star() {
    let r = |s: &str| Rule::parse("r", s).unwrap();
    let child = r("allow self tool:shell use");
    assert!(r("allow self tool:shell use").covers(&child));
    assert!(r("allow self tool:* use").covers(&child));
    assert!(r("allow * tool:shell use").covers(&child));
    assert!(r("allow * tool:* use").covers(&child));
    assert!(!r("allow agent:a tool:shell use").covers(&child));
    assert!(!r("allow self model:shell use").covers(&child));
    assert!(!r("allow self tool:sh use").covers(&child));
    assert!(!r("allow self shared:x read").covers(&r("allow self shared:x write")));
    assert!(!r("allow self tool:shell use").covers(&r("allow self tool:* use")));
    assert!(!r("allow self tool:shell use").covers(&r("allow * tool:shell use")));
}

fn fr(path: &str, mode: Mode) -> FileRule {
    FileRule {
        path: p(path),
        mode,
    }
}

#[test]
fn normalise_sorts_and_refuses_what_types_allow() {
    let mut pol = Policy::operator(0, 0, BTreeSet::new());
    pol.files = vec![fr("/b", Mode::Ro), fr("/a", Mode::Rw)];
    let r = |s: &str| Rule::parse("r", s).unwrap();
    pol.rules = vec![
        r("allow self tool:b use"),
        r("allow self tool:a use"),
        r("allow self tool:b use"),
    ];
    let n = pol.clone().normalise().unwrap();
    assert_eq!(n.files, vec![fr("/a", Mode::Rw), fr("/b", Mode::Ro)]);
    assert_eq!(n.rules.len(), 2);
    assert_eq!(n.clone().normalise().unwrap(), n);

    let base = Policy::operator(0, 0, BTreeSet::new());
    let m = |line: &str| MountEntry::parse_line("m", line).unwrap();
    let cases: Vec<(Policy, &str, &str)> = vec![
        (
            Policy {
                files: vec![fr("/a", Mode::Ro), fr("/b", Mode::Ro), fr("/a/", Mode::Rw)],
                ..base.clone()
            },
            "files[2].path",
            "files[0] already has a rule",
        ),
        (
            Policy {
                mounts: vec![m("/a\t/x\tro\t-"), m("/b\t/x\tro\t-")],
                ..base.clone()
            },
            "mounts[1].target",
            "mounts[0] already mounts",
        ),
        (
            Policy {
                mounts: vec![m("/a\t/x/y\tro\t-"), m("/b\t/x\tro\t-")],
                ..base.clone()
            },
            "mounts[1].target",
            "would cover mounts[0]",
        ),
        (
            Policy {
                network: Network::Connect([0, 80].into()),
                ..base.clone()
            },
            "network.connect",
            "not a port",
        ),
        (
            Policy {
                cost_limit: Some(-1.0),
                ..base.clone()
            },
            "cost_limit",
            "-1: must be",
        ),
        (
            Policy {
                cost_limit: Some(f64::NAN),
                ..base.clone()
            },
            "cost_limit",
            "NaN: must be",
        ),
        (
            Policy {
                cost_limit: Some(f64::INFINITY),
                ..base.clone()
            },
            "cost_limit",
            "inf: must be",
        ),
        (
            Policy {
                window: Some(0),
                ..base.clone()
            },
            "window",
            "at least 1",
        ),
        (
            Policy {
                timeout_s: Some(0),
                ..base.clone()
            },
            "timeout_s",
            "at least 1",
        ),
        (
            Policy {
                resources: Resources {
                    memory_max: Some(0),
                    ..Resources::default()
                },
                ..base.clone()
            },
            "resources.memory_max",
            "at least 1",
        ),
        (
            Policy {
                resources: Resources {
                    pids_max: Some(0),
                    ..Resources::default()
                },
                ..base.clone()
            },
            "resources.pids_max",
            "at least 1",
        ),
        (
            Policy {
                resources: Resources {
                    cpu_weight: Some(10_001),
                    ..Resources::default()
                },
                ..base.clone()
            },
            "resources.cpu_weight",
            "10001: must be from 1 to 10000",
        ),
        (
            Policy {
                resources: Resources {
                    disk_max: Some(0),
                    ..Resources::default()
                },
                ..base.clone()
            },
            "resources.disk_max",
            "0: must be at least 1 byte",
        ),
        (
            Policy {
                model_rate: ModelRate {
                    requests_per_minute: Some(0),
                    ..ModelRate::default()
                },
                ..base.clone()
            },
            "model_rate.requests_per_minute",
            "0: must be at least 1",
        ),
        (
            Policy {
                model_rate: ModelRate {
                    tokens_per_minute: Some(u64::MAX),
                    ..ModelRate::default()
                },
                ..base.clone()
            },
            "model_rate.tokens_per_minute",
            "must be at most 9223372036854775807",
        ),
        (
            Policy {
                env: [("".into(), "v".into())].into(),
                ..base.clone()
            },
            "env",
            "must not be empty",
        ),
        (
            Policy {
                env: [("A=B".into(), "v".into())].into(),
                ..base.clone()
            },
            "env",
            "\"A=B\": a name must not contain \"=\"",
        ),
        (
            Policy {
                env: [("A\0".into(), "v".into())].into(),
                ..base.clone()
            },
            "env",
            "must not contain",
        ),
        (
            Policy {
                env: [("A".into(), "v\0".into())].into(),
                ..base.clone()
            },
            "env.A",
            "NUL or newline",
        ),
        (
            Policy {
                env: [("BROOD_KEY".into(), "v".into())].into(),
                ..base.clone()
            },
            "env.BROOD_KEY",
            "set by the runtime",
        ),
        (
            Policy {
                secrets: ["A=B".to_owned()].into(),
                ..base.clone()
            },
            "secrets",
            "must not contain \"=\"",
        ),
        (
            Policy {
                secrets: ["CTX_KEY".to_owned()].into(),
                ..base.clone()
            },
            "secrets.CTX_KEY",
            "set by the runtime",
        ),
        (
            Policy {
                env: [("KEY".into(), "v".into())].into(),
                secrets: ["KEY".to_owned()].into(),
                ..base.clone()
            },
            "secrets.KEY",
            "also in env",
        ),
        (
            Policy {
                tools: Some(["a b".to_owned()].into()),
                ..base.clone()
            },
            "tools",
            "\"a b\": a name must not contain whitespace",
        ),
        (
            Policy {
                tools: Some(["".to_owned()].into()),
                ..base.clone()
            },
            "tools",
            "must not be empty",
        ),
        (
            Policy {
                models: Some(["gpt\t4".to_owned()].into()),
                ..base.clone()
            },
            "models",
            "whitespace",
        ),
        (
            Policy {
                path: vec!["a".into(), "b:c".into()],
                ..base.clone()
            },
            "path[1]",
            "must not contain \":\"",
        ),
        (
            Policy {
                path: vec!["a".into(), "b".into(), "a".into()],
                ..base.clone()
            },
            "path[2]",
            "already given at path[0]",
        ),
        (
            Policy {
                path: vec!["".into()],
                ..base.clone()
            },
            "path[0]",
            "must not be empty",
        ),
        (
            Policy {
                rules: vec![Rule {
                    subject: "self".into(),
                    class: RuleClass::Tool,
                    name: "a b".into(),
                    perm: "use".into(),
                }],
                ..base.clone()
            },
            "rules[0]",
            "four words",
        ),
        (
            Policy {
                rules: vec![Rule {
                    subject: "self".into(),
                    class: RuleClass::Tool,
                    name: "a".into(),
                    perm: "read".into(),
                }],
                ..base.clone()
            },
            "rules[0]",
            "not a permission",
        ),
    ];
    for (pol, field, rule) in cases {
        let e = pol.clone().normalise().unwrap_err();
        assert_eq!(e.field, field, "{pol:?}: {e}");
        assert!(e.message.contains(rule), "{e}");
    }
}

#[test]
fn effective_inherits_what_the_request_leaves_out() {
    let mut parent = Policy::operator(1000, 1000, [1000, 27].into());
    parent.tools = Some(["a".to_owned(), "b".to_owned()].into());
    parent.depth_limit = Some(3);
    parent.create_limit = Some(5);
    parent.cost_limit = Some(10.0);
    parent.window = Some(100_000);
    parent.timeout_s = Some(600);
    parent.resources = Resources {
        memory_max: Some(1 << 30),
        pids_max: Some(100),
        cpu_weight: Some(100),
        disk_max: Some(1 << 20),
    };
    parent.env = [("A".to_owned(), "1".to_owned())].into();
    parent.secrets = ["KEY".to_owned()].into();

    let child = effective(&parent, &PolicyRequest::default());
    assert_eq!(child.secrets, parent.secrets, "secrets are inherited");
    assert_eq!(child.depth_limit, Some(2));
    assert_eq!(
        child.cost_limit, None,
        "no reservation: shares the parent's budget"
    );
    assert_eq!(
        Policy {
            depth_limit: parent.depth_limit,
            cost_limit: parent.cost_limit,
            ..child
        },
        parent,
        "everything else is inherited unchanged"
    );

    let req = PolicyRequest {
        tools: Some(["a".to_owned()].into()),
        files: Some(vec![]),
        depth_limit: Some(0),
        cost_limit: Some(1.5),
        resources: Resources {
            pids_max: Some(10),
            ..Resources::default()
        },
        ..PolicyRequest::default()
    };
    let child = effective(&parent, &req);
    assert_eq!(child.secrets, parent.secrets);
    let without = PolicyRequest {
        secrets: Some(BTreeSet::new()),
        ..PolicyRequest::default()
    };
    assert!(
        effective(&parent, &without).secrets.is_empty(),
        "an empty list keeps every secret from the child"
    );
    assert_eq!(child.tools, Some(["a".to_owned()].into()));
    assert!(child.files.is_empty());
    assert_eq!(child.depth_limit, Some(0));
    assert_eq!(child.cost_limit, Some(1.5));
    assert_eq!(
        child.resources,
        Resources {
            memory_max: Some(1 << 30),
            pids_max: Some(10),
            cpu_weight: Some(100),
            disk_max: Some(1 << 20),
        }
    );

    // Each model rate limit is inherited on its own.
    let limited = Policy {
        model_rate: ModelRate {
            requests_per_minute: Some(60),
            tokens_per_minute: Some(9000),
        },
        ..parent.clone()
    };
    let req = PolicyRequest {
        model_rate: ModelRate {
            requests_per_minute: Some(6),
            tokens_per_minute: None,
        },
        ..PolicyRequest::default()
    };
    assert_eq!(
        effective(&limited, &req).model_rate,
        ModelRate {
            requests_per_minute: Some(6),
            tokens_per_minute: Some(9000),
        }
    );

    let op = Policy::operator(0, 0, BTreeSet::new());
    assert_eq!(effective(&op, &PolicyRequest::default()), op);
    let zero = Policy {
        depth_limit: Some(0),
        ..op
    };
    assert_eq!(
        effective(&zero, &PolicyRequest::default()).depth_limit,
        Some(0)
    );
}

#[test]
fn a_request_is_normalised_like_a_policy() {
    let req = PolicyRequest {
        files: Some(vec![fr("/b", Mode::Ro), fr("/a", Mode::Ro)]),
        ..PolicyRequest::default()
    }
    .normalise()
    .unwrap();
    assert_eq!(
        req.files,
        Some(vec![fr("/a", Mode::Ro), fr("/b", Mode::Ro)])
    );
    let e = PolicyRequest {
        cost_limit: Some(-0.5),
        ..PolicyRequest::default()
    }
    .normalise()
    .unwrap_err();
    assert_eq!(e.field, "cost_limit");
    let e = PolicyRequest {
        env: Some([("KEY".into(), "v".into())].into()),
        secrets: Some(["KEY".to_owned()].into()),
        ..PolicyRequest::default()
    }
    .normalise()
    .unwrap_err();
    assert_eq!(e.field, "secrets.KEY");
    assert!(e.message.contains("also in env"), "{e}");
}

proptest! {
    #[test]
    fn normalised_paths_are_clean_and_stable(s in "[/a.\\n\\t\\x00-]{0,16}") {
        if let Ok(p) = AbsPath::new("f", &s) {
            let again = AbsPath::new("f", p.as_str()).unwrap();
            prop_assert_eq!(&again, &p);
            prop_assert!(p.as_str().starts_with('/'));
            prop_assert!(!p.as_str().chars().any(char::is_control));
            prop_assert!(!p.as_str().contains("//"));
            prop_assert!(p.as_str() == "/" || !p.as_str().ends_with('/'));
            prop_assert!(p.components().all(|c| c != "." && c != ".." && !c.is_empty()));
            prop_assert!(p.is_within(&p));
            if let Some(parent) = p.parent() {
                prop_assert!(p.is_within(&parent));
                prop_assert_eq!(parent.depth() + 1, p.depth());
            }
        }
    }

    #[test]
    fn clean_components_with_extra_slashes_are_accepted(
        comps in proptest::collection::vec("[a-z.]{1,4}", 0..5),
        slashes in proptest::collection::vec(1usize..3, 5),
        trailing in any::<bool>(),
    ) {
        let mut s = String::new();
        for (c, n) in comps.iter().zip(&slashes) {
            s.push_str(&"/".repeat(*n));
            s.push_str(c);
        }
        if trailing || s.is_empty() {
            s.push('/');
        }
        let clean = comps.iter().all(|c| c != "." && c != "..");
        match AbsPath::new("f", &s) {
            Ok(p) => {
                prop_assert!(clean);
                prop_assert_eq!(p.components().collect::<Vec<_>>(), comps.iter().map(String::as_str).collect::<Vec<_>>());
            }
            Err(e) => {
                prop_assert!(!clean);
                prop_assert!(e.message.contains("is not allowed"));
            }
        }
    }

    #[test]
    fn any_string_is_either_a_rule_that_reads_back_or_refused(s in "[a-z:* ]{0,30}") {
        if let Ok(r) = Rule::parse("r", &s) {
            prop_assert_eq!(Rule::parse("r", &r.to_text()).unwrap(), r);
        }
    }
}

/// Issue 24: numbers the store's signed 64-bit integers and the kernel hold,
/// and no `(uid_t) -1`, refused naming the field.
#[test]
fn numbers_beyond_the_store_and_the_kernel_are_refused() {
    let refused = |r: PolicyRequest, field: &str, says: &str| {
        let e = r.normalise().unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(says), "{field}: {e}");
    };
    let base = PolicyRequest::default;
    refused(
        PolicyRequest {
            timeout_s: Some(u64::MAX),
            ..base()
        },
        "timeout_s",
        "at most 315360000",
    );
    refused(
        PolicyRequest {
            window: Some(WHOLE_MAX + 1),
            ..base()
        },
        "window",
        "at most 9223372036854775807",
    );
    let mut r = base();
    r.resources.memory_max = Some(WHOLE_MAX + 1);
    refused(r, "resources.memory_max", "at most");
    let mut r = base();
    r.resources.pids_max = Some(PIDS_MAX + 1);
    refused(r, "resources.pids_max", "at most 4194304");
    let mut r = base();
    r.resources.disk_max = Some(WHOLE_MAX + 1);
    refused(r, "resources.disk_max", "at most 9223372036854775807 bytes");
    refused(
        PolicyRequest {
            uid: Some(u32::MAX),
            ..base()
        },
        "uid",
        "not a user id",
    );
    refused(
        PolicyRequest {
            gid: Some(u32::MAX),
            ..base()
        },
        "gid",
        "not a group id",
    );
    refused(
        PolicyRequest {
            groups: Some([u32::MAX].into()),
            ..base()
        },
        "groups",
        "not a group id",
    );
    // The largest of each is taken.
    let mut r = PolicyRequest {
        timeout_s: Some(TIMEOUT_MAX),
        window: Some(WHOLE_MAX),
        uid: Some(u32::MAX - 1),
        ..base()
    };
    r.resources.memory_max = Some(WHOLE_MAX);
    r.resources.pids_max = Some(PIDS_MAX);
    r.resources.disk_max = Some(WHOLE_MAX);
    r.normalise().unwrap();
}
