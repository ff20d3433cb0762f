//! The attenuation check's table tests: one refusal per way of going too
//! far, in the order of the checks, and the parent's live state.

use super::{Code, ParentView, Policy, PolicyRequest, check, derive};
use crate::policy::{
    AbsPath, FileRule, Mode, ModelRate, MountEntry, Network, OnRestart, Resources, Rule,
};
use std::collections::{BTreeMap, BTreeSet};

const NOW: u64 = 1_000;

fn ap(s: &str) -> AbsPath {
    AbsPath::new("test", s).unwrap()
}
fn fr(path: &str, mode: Mode) -> FileRule {
    FileRule {
        path: ap(path),
        mode,
    }
}
fn mount(line: &str) -> MountEntry {
    MountEntry::parse_line("test", line).unwrap()
}
fn rule(text: &str) -> Rule {
    Rule::parse("test", text).unwrap()
}
fn names(xs: &[&str]) -> BTreeSet<String> {
    xs.iter().map(|s| (*s).to_owned()).collect()
}

/// A parent with something to lose in every field.
fn parent() -> Policy {
    Policy {
        tools: Some(names(&["a", "b"])),
        files: vec![
            fr("/", Mode::Ro),
            fr("/s", Mode::Hidden),
            fr("/w", Mode::Rw),
        ],
        mounts: vec![
            mount("/src\t/dst\tro\tbind,nosuid"),
            mount("/h\t/home\trw\trbind,nodev"),
        ],
        network: Network::Connect([80, 443].into()),
        cost_limit: Some(10.0),
        window: Some(1000),
        depth_limit: Some(2),
        create_limit: Some(3),
        timeout_s: Some(600),
        resources: Resources {
            memory_max: Some(1 << 30),
            pids_max: Some(100),
            cpu_weight: Some(100),
            disk_max: Some(1 << 30),
        },
        model_rate: ModelRate {
            requests_per_minute: Some(60),
            tokens_per_minute: Some(100_000),
        },
        uid: 1000,
        gid: 1000,
        groups: [27, 1000].into(),
        env: [("A", "1"), ("B", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        secrets: names(&["KEY1", "KEY2"]),
        models: Some(names(&["m1", "m2"])),
        path: vec!["x".into(), "y".into(), "z".into()],
        rules: vec![
            rule("allow self tool:* use"),
            rule("allow agent:rev shared:notes read"),
        ],
        on_restart: OnRestart::Cancel,
    }
    .normalise()
    .unwrap()
}

/// 5 dollars left, 1 of 3 creates used, 300 s left in the parent's run.
fn view(p: &Policy) -> ParentView<'_> {
    ParentView {
        policy: p,
        budget_remaining: Some(5.0),
        creates_used: 1,
        deadline_unix_s: Some(NOW + 300),
        now_unix_s: NOW,
    }
}

/// One way of going too far: which step of the order it fails, with which
/// code, and a piece of the message (naming the field).
struct Case {
    step: usize,
    code: Code,
    says: &'static str,
    edit: fn(&mut Policy),
}

fn cases() -> Vec<Case> {
    use crate::Code::*;
    vec![
        Case {
            step: 1,
            code: IdentityExpansion,
            says: "uid: 0 differs from the parent's 1000",
            edit: |c| c.uid = 0,
        },
        Case {
            step: 1,
            code: IdentityExpansion,
            says: "gid: 0 differs",
            edit: |c| c.gid = 0,
        },
        Case {
            step: 2,
            code: GroupExpansion,
            says: "groups: 4 is not",
            edit: |c| {
                c.groups.insert(4);
            },
        },
        Case {
            step: 3,
            code: PolicyExpansion,
            says: "rules[0]: \"allow * tool:* use\" is not covered",
            edit: |c| c.rules = vec![rule("allow * tool:* use")],
        },
        Case {
            step: 3,
            code: PolicyExpansion,
            says: "rules[0]: \"allow agent:rev shared:notes write\"",
            edit: |c| c.rules = vec![rule("allow agent:rev shared:notes write")],
        },
        Case {
            step: 4,
            code: PolicyExpansion,
            says: "env.C: the parent does not pass C",
            edit: |c| {
                c.env.insert("C".into(), "3".into());
            },
        },
        Case {
            step: 4,
            code: PolicyExpansion,
            says: "env.A: the value differs",
            edit: |c| {
                c.env.insert("A".into(), "secret".into());
            },
        },
        Case {
            step: 4,
            code: PolicyExpansion,
            says: "secrets.KEY3: the parent holds no secret KEY3",
            edit: |c| {
                c.secrets.insert("KEY3".into());
            },
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "resources.memory_max: 2147483648 is more than the parent's 1073741824",
            edit: |c| c.resources.memory_max = Some(2 << 30),
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "resources.pids_max: no limit",
            edit: |c| c.resources.pids_max = None,
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "resources.cpu_weight: 101",
            edit: |c| c.resources.cpu_weight = Some(101),
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "resources.disk_max: 1073741825 is more than the parent's 1073741824",
            edit: |c| c.resources.disk_max = Some((1 << 30) + 1),
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "resources.disk_max: no limit, but the parent's is 1073741824",
            edit: |c| c.resources.disk_max = None,
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "model_rate.requests_per_minute: 61 is more than the parent's 60",
            edit: |c| c.model_rate.requests_per_minute = Some(61),
        },
        Case {
            step: 5,
            code: PolicyExpansion,
            says: "model_rate.tokens_per_minute: no limit, but the parent's is 100000",
            edit: |c| c.model_rate.tokens_per_minute = None,
        },
        Case {
            step: 6,
            code: PolicyExpansion,
            says: "timeout_s: 301 would end after the parent's run",
            edit: |c| c.timeout_s = Some(301),
        },
        Case {
            step: 6,
            code: PolicyExpansion,
            says: "timeout_s: none",
            edit: |c| c.timeout_s = None,
        },
        Case {
            step: 6,
            code: PolicyExpansion,
            says: "on_restart: resume, but the parent's is cancel",
            edit: |c| c.on_restart = OnRestart::Resume,
        },
        Case {
            step: 7,
            code: ToolExpansion,
            says: "tools: \"shell\" is not granted",
            edit: |c| c.tools = Some(names(&["a", "shell"])),
        },
        Case {
            step: 7,
            code: ToolExpansion,
            says: "tools: all (no list)",
            edit: |c| c.tools = None,
        },
        Case {
            step: 8,
            code: FileExpansion,
            says: "files: \"/\" would be rw for the child, the parent has it ro",
            edit: |c| c.files = vec![fr("/", Mode::Rw)],
        },
        Case {
            step: 8,
            code: FileExpansion,
            says: "files: \"/s\" would be ro",
            edit: |c| c.files = vec![fr("/", Mode::Ro), fr("/w", Mode::Rw)],
        },
        Case {
            step: 8,
            code: FileExpansion,
            says: "files: \"/s/x\" would be ro",
            edit: |c| c.files = vec![fr("/s/x", Mode::Ro)],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "mounts[0]: the parent mounts nothing at \"/etc\"",
            edit: |c| c.mounts = vec![mount("/etc\t/etc\tro\t-")],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "source \"/etc\" at \"/dst\" differs",
            edit: |c| c.mounts = vec![mount("/etc\t/dst\tro\tbind,nosuid")],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "rw at \"/dst\"",
            edit: |c| c.mounts = vec![mount("/src\t/dst\trw\tbind,nosuid")],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "drops nosuid at \"/dst\"",
            edit: |c| c.mounts = vec![mount("/src\t/dst\tro\tbind")],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "drops nodev at \"/home\"",
            edit: |c| c.mounts = vec![mount("/h\t/home\trw\trbind")],
        },
        Case {
            step: 9,
            code: MountExpansion,
            says: "rbind at \"/dst\" widens",
            edit: |c| c.mounts = vec![mount("/src\t/dst\tro\trbind,nosuid")],
        },
        Case {
            step: 10,
            code: NetworkExpansion,
            says: "network.connect: port 22 is not allowed",
            edit: |c| c.network = Network::Connect([22, 80].into()),
        },
        Case {
            step: 10,
            code: NetworkExpansion,
            says: "network: all is wider than the parent's connect [80 443]",
            edit: |c| c.network = Network::All,
        },
        Case {
            step: 11,
            code: ModelExpansion,
            says: "models: \"m3\" is not granted",
            edit: |c| c.models = Some(names(&["m3"])),
        },
        Case {
            step: 11,
            code: ModelExpansion,
            says: "models: all (no list)",
            edit: |c| c.models = None,
        },
        Case {
            step: 12,
            code: ToolPathExpansion,
            says: "path[1]: \"x\" is out of the parent's order",
            edit: |c| c.path = vec!["z".into(), "x".into()],
        },
        Case {
            step: 12,
            code: ToolPathExpansion,
            says: "path[0]: \"w\" is not one of",
            edit: |c| c.path = vec!["w".into()],
        },
        Case {
            step: 13,
            code: WindowExpansion,
            says: "window: 2000 tokens is more than the parent's 1000",
            edit: |c| c.window = Some(2000),
        },
        Case {
            step: 13,
            code: WindowUnknown,
            says: "window: unknown",
            edit: |c| c.window = None,
        },
        Case {
            step: 14,
            code: BudgetExceeded,
            says: "cost_limit: 6 is more than the parent's remaining budget 5",
            edit: |c| c.cost_limit = Some(6.0),
        },
        Case {
            step: 15,
            code: DepthLimit,
            says: "depth_limit: 2 must be less than the parent's 2",
            edit: |c| c.depth_limit = Some(2),
        },
        Case {
            step: 15,
            code: DepthLimit,
            says: "depth_limit: unlimited",
            edit: |c| c.depth_limit = None,
        },
        Case {
            step: 16,
            code: CreateLimit,
            says: "create_limit: 3 is more than the parent's 2 creates left",
            edit: |c| c.create_limit = Some(3),
        },
        Case {
            step: 16,
            code: CreateLimit,
            says: "create_limit: unlimited",
            edit: |c| c.create_limit = None,
        },
    ]
}

#[test]
fn a_child_that_asks_for_nothing_is_admitted_and_inherits() {
    let p = parent();
    let v = view(&p);
    let child = derive(&v, &PolicyRequest::default());
    assert_eq!(check(&v, &child), Ok(()));
    assert_eq!(child.depth_limit, Some(1));
    assert_eq!(child.create_limit, Some(2), "the parent's creates left");
    assert_eq!(child.timeout_s, Some(300), "cut to the parent's deadline");
    assert_eq!(child.cost_limit, None, "no reservation");
    assert_eq!(child.tools, p.tools);
    assert_eq!(child.files, p.files);
    assert_eq!(child.mounts, p.mounts);
}

#[test]
fn each_expansion_is_refused_with_its_code_and_names_the_field() {
    let p = parent();
    let v = view(&p);
    let base = derive(&v, &PolicyRequest::default());
    let mut seen = BTreeSet::new();
    for case in cases() {
        let mut child = base.clone();
        (case.edit)(&mut child);
        let child = child.normalise().unwrap();
        let r = check(&v, &child).unwrap_err();
        assert_eq!(r.code, case.code, "{}: {r}", case.says);
        assert!(r.message.contains(case.says), "want {:?} in {r}", case.says);
        assert_eq!(r.to_string(), format!("{}: {}", r.code, r.message));
        seen.insert(case.code.as_str());
    }
    // Every code the check can give has a case (16 steps, 14 codes:
    // PolicyExpansion serves several steps, the window step has two codes).
    assert_eq!(seen.len(), 14);
}

#[test]
fn a_child_failing_two_checks_gets_the_earlier_code() {
    let p = parent();
    let v = view(&p);
    let base = derive(&v, &PolicyRequest::default());
    let cases = cases();
    let mut pairs = 0;
    for a in &cases {
        for b in &cases {
            if a.step >= b.step {
                continue;
            }
            let mut child = base.clone();
            (b.edit)(&mut child);
            (a.edit)(&mut child);
            let r = check(&v, &child.normalise().unwrap()).unwrap_err();
            assert_eq!(r.code, a.code, "{} and {}: {r}", a.says, b.says);
            pairs += 1;
        }
    }
    assert!(pairs > 400, "{pairs}");
}

#[test]
fn the_order_of_the_checks_follows_the_order_of_the_codes() {
    let index = |c: Code| Code::ALL.iter().position(|x| *x == c).unwrap();
    let cases = cases();
    for w in cases.windows(2) {
        assert!(w[0].step <= w[1].step);
        if w[0].step < w[1].step {
            assert!(
                index(w[0].code) <= index(w[1].code),
                "{:?} {:?}",
                w[0].code,
                w[1].code
            );
        }
    }
}

#[test]
fn narrowing_in_every_field_is_admitted() {
    let p = parent();
    let v = view(&p);
    let child = Policy {
        tools: Some(BTreeSet::new()),
        files: vec![
            fr("/", Mode::Hidden),
            fr("/w", Mode::Ro),
            fr("/w/x", Mode::Hidden),
        ],
        mounts: vec![mount("/h\t/home\tro\tbind,nodev,noexec")],
        network: Network::None,
        cost_limit: Some(5.0),
        window: Some(1000),
        depth_limit: Some(0),
        create_limit: Some(2),
        timeout_s: Some(300),
        resources: Resources {
            memory_max: Some(1),
            pids_max: Some(100),
            cpu_weight: Some(1),
            disk_max: Some(1),
        },
        model_rate: ModelRate {
            requests_per_minute: Some(1),
            tokens_per_minute: Some(100_000),
        },
        uid: 1000,
        gid: 1000,
        groups: BTreeSet::new(),
        env: [("B".to_owned(), "2".to_owned())].into(),
        secrets: names(&["KEY2"]),
        models: Some(names(&["m2"])),
        path: vec!["x".into(), "z".into()],
        rules: vec![
            rule("allow self tool:shell use"),
            rule("allow agent:rev shared:notes read"),
        ],
        on_restart: OnRestart::Cancel,
    }
    .normalise()
    .unwrap();
    assert_eq!(check(&v, &child), Ok(()));
    let none = Policy {
        files: vec![],
        mounts: vec![],
        network: Network::Connect(BTreeSet::new()),
        path: vec![],
        rules: vec![],
        env: BTreeMap::new(),
        secrets: BTreeSet::new(),
        ..child
    };
    assert_eq!(check(&v, &none), Ok(()));
}

#[test]
fn the_parents_live_state_refuses_even_an_inheriting_child() {
    let p = parent();
    let req = PolicyRequest::default();

    let no_depth = Policy {
        depth_limit: Some(0),
        ..p.clone()
    };
    let v = view(&no_depth);
    let r = check(&v, &derive(&v, &req)).unwrap_err();
    assert_eq!(r.code, Code::DepthLimit, "{r}");
    assert!(r.message.contains("the parent's is 0"), "{r}");

    let v = ParentView {
        creates_used: 3,
        ..view(&p)
    };
    let r = check(&v, &derive(&v, &req)).unwrap_err();
    assert_eq!(r.code, Code::CreateLimit, "{r}");
    assert!(r.message.contains("already created 3 of its 3"), "{r}");

    let v = ParentView {
        deadline_unix_s: Some(NOW),
        ..view(&p)
    };
    let r = check(&v, &derive(&v, &req)).unwrap_err();
    assert_eq!(r.code, Code::PolicyExpansion, "{r}");
    assert!(r.message.starts_with("timeout_s: 1 would end after"), "{r}");

    let v = ParentView {
        budget_remaining: Some(0.0),
        ..view(&p)
    };
    assert_eq!(check(&v, &derive(&v, &req)), Ok(()), "no reservation asked");
    let asks = derive(
        &v,
        &PolicyRequest {
            cost_limit: Some(0.01),
            ..req.clone()
        },
    );
    assert_eq!(check(&v, &asks).unwrap_err().code, Code::BudgetExceeded);
    let zero = derive(
        &v,
        &PolicyRequest {
            cost_limit: Some(0.0),
            ..req.clone()
        },
    );
    assert_eq!(check(&v, &zero), Ok(()));

    // A caller that passes no remaining budget still cannot exceed the
    // parent's own limit; a NaN remaining budget refuses.
    let v = ParentView {
        budget_remaining: None,
        ..view(&p)
    };
    let big = derive(
        &v,
        &PolicyRequest {
            cost_limit: Some(11.0),
            ..req.clone()
        },
    );
    let r = check(&v, &big).unwrap_err();
    assert_eq!(r.code, Code::BudgetExceeded);
    assert!(r.message.contains("own limit 10"), "{r}");
    let v = ParentView {
        budget_remaining: Some(f64::NAN),
        ..view(&p)
    };
    let one = derive(
        &v,
        &PolicyRequest {
            cost_limit: Some(1.0),
            ..req.clone()
        },
    );
    assert_eq!(check(&v, &one).unwrap_err().code, Code::BudgetExceeded);

    // No deadline: the parent's own timeout still bounds the child's.
    let v = ParentView {
        deadline_unix_s: None,
        ..view(&p)
    };
    assert_eq!(derive(&v, &req).timeout_s, Some(600));
    assert_eq!(check(&v, &derive(&v, &req)), Ok(()));
    let long = derive(
        &v,
        &PolicyRequest {
            timeout_s: Some(601),
            ..req.clone()
        },
    );
    assert!(
        check(&v, &long)
            .unwrap_err()
            .message
            .contains("longer than the parent's 600")
    );
}

#[test]
fn window_fails_closed_unless_both_are_unknown() {
    let op = Policy::operator(0, 0, BTreeSet::new());
    let v = ParentView {
        policy: &op,
        budget_remaining: None,
        creates_used: 0,
        deadline_unix_s: None,
        now_unix_s: NOW,
    };
    let child = derive(&v, &PolicyRequest::default());
    assert_eq!(child, op, "an operator's child inherits everything");
    assert_eq!(check(&v, &child), Ok(()));
    let asks = Policy {
        window: Some(8000),
        ..child.clone()
    };
    let r = check(&v, &asks).unwrap_err();
    assert_eq!(r.code, Code::WindowUnknown);
    assert!(r.message.contains("the parent's window is unknown"), "{r}");
    let known = Policy {
        window: Some(8000),
        ..op.clone()
    };
    let v = ParentView {
        policy: &known,
        ..v
    };
    assert_eq!(
        check(
            &v,
            &Policy {
                window: Some(8000),
                ..op.clone()
            }
        ),
        Ok(())
    );
    assert_eq!(check(&v, &op).unwrap_err().code, Code::WindowUnknown);
}

mod properties;

#[test]
fn resume_on_restart_is_a_right_a_child_holds_only_from_its_parent() {
    let mut p = parent();
    // Under a parent cancelled at a restart: `cancel` (asked or
    // inherited) is admitted, `resume` refused naming the field.
    let v = view(&p);
    let inherited = derive(&v, &PolicyRequest::default());
    assert_eq!(inherited.on_restart, OnRestart::Cancel);
    assert_eq!(check(&v, &inherited), Ok(()));
    let ask = |o| PolicyRequest {
        on_restart: Some(o),
        ..PolicyRequest::default()
    };
    let r = check(&v, &derive(&v, &ask(OnRestart::Resume))).unwrap_err();
    assert_eq!(r.code, Code::PolicyExpansion);
    assert!(r.message.starts_with("on_restart: resume"), "{r}");
    // Under a resumed parent: inherited as `resume`, and `cancel` is
    // always allowed.
    p.on_restart = OnRestart::Resume;
    let v = view(&p);
    let inherited = derive(&v, &PolicyRequest::default());
    assert_eq!(inherited.on_restart, OnRestart::Resume);
    assert_eq!(check(&v, &inherited), Ok(()));
    let cancel = derive(&v, &ask(OnRestart::Cancel));
    assert_eq!(cancel.on_restart, OnRestart::Cancel);
    assert_eq!(check(&v, &cancel), Ok(()));
}

#[test]
fn a_model_rate_is_inherited_limit_by_limit_and_never_raised() {
    let p = parent();
    let v = view(&p);
    // Asking nothing: the parent's two limits.
    let child = derive(&v, &PolicyRequest::default());
    assert_eq!(child.model_rate, p.model_rate);
    // Asking one lower: that one, and the other inherited.
    let req = PolicyRequest {
        model_rate: ModelRate {
            requests_per_minute: Some(5),
            tokens_per_minute: None,
        },
        ..PolicyRequest::default()
    };
    let child = derive(&v, &req);
    assert_eq!(
        child.model_rate,
        ModelRate {
            requests_per_minute: Some(5),
            tokens_per_minute: Some(100_000),
        }
    );
    assert_eq!(check(&v, &child), Ok(()));
    // Asking higher: refused, naming the field and both values.
    let req = PolicyRequest {
        model_rate: ModelRate {
            requests_per_minute: None,
            tokens_per_minute: Some(100_001),
        },
        ..PolicyRequest::default()
    };
    let r = check(&v, &derive(&v, &req)).unwrap_err();
    assert_eq!(r.code, Code::PolicyExpansion);
    assert_eq!(
        r.message,
        "model_rate.tokens_per_minute: 100001 is more than the parent's 100000"
    );
    // Under an unlimited parent any limit may be asked, and none.
    let free = Policy {
        model_rate: ModelRate::default(),
        ..p.clone()
    };
    let fv = ParentView {
        policy: &free,
        ..view(&free)
    };
    let child = derive(&fv, &req);
    assert_eq!(child.model_rate.tokens_per_minute, Some(100_001));
    assert_eq!(child.model_rate.requests_per_minute, None);
    assert_eq!(check(&fv, &child), Ok(()));
}
