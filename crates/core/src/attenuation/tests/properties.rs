//! Property tests: generated parents and children over small alphabets,
//! against an oracle that decides each field its own way (mostly by brute
//! force over a finite universe) rather than the way `check` does.

use std::collections::BTreeSet;
use std::fmt;

use super::{
    AbsPath, Code, FileRule, Mode, ModelRate, MountEntry, NOW, Network, OnRestart, ParentView,
    Policy, PolicyRequest, Resources, Rule, ap, check, derive, fr, rule,
};
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use std::collections::BTreeMap;

const RULE_PATHS: [&str; 7] = ["/", "/a", "/a/b", "/a/b/c", "/x", "/a/x", "/x/a"];
const COMPONENTS: [&str; 5] = ["a", "b", "c", "x", "y"];
const TOOLS: [&str; 4] = ["t1", "t2", "t3", "t4"];
const MODELS: [&str; 3] = ["m1", "m2", "m3"];
const TIERS: [&str; 4] = ["p1", "p2", "p3", "p4"];
const PORTS: [u16; 3] = [80, 443, 8080];
const GROUPS: [u32; 4] = [1, 2, 3, 4];
const LIMITS: [u64; 3] = [1, 10, 100];
const TARGETS: [&str; 3] = ["/m1", "/m2", "/m3"];
const SOURCES: [&str; 2] = ["/s1", "/s2"];
const SUBJECTS: [&str; 4] = ["self", "*", "agent:r1", "agent:r2"];
const RULE_NAMES: [&str; 4] = ["n1", "n2", "n3", "*"];

/// The parent's live state, owned (a `ParentView` borrows the policy).
#[derive(Debug, Clone)]
struct Live {
    budget_remaining: Option<f64>,
    creates_used: u32,
    deadline_unix_s: Option<u64>,
}

fn view<'a>(p: &'a Policy, l: &Live) -> ParentView<'a> {
    ParentView {
        policy: p,
        budget_remaining: l.budget_remaining,
        creates_used: l.creates_used,
        deadline_unix_s: l.deadline_unix_s,
        now_unix_s: NOW,
    }
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| (*s).to_owned()).collect()
}

fn set_of<T: Clone + Ord + fmt::Debug + 'static>(items: Vec<T>) -> BoxedStrategy<BTreeSet<T>> {
    let n = items.len();
    subsequence(items, 0..=n)
        .prop_map(|v| v.into_iter().collect())
        .boxed()
}

fn opt<T: fmt::Debug + 'static>(s: BoxedStrategy<T>) -> BoxedStrategy<Option<T>> {
    proptest::option::weighted(0.75, s).boxed()
}

fn modes_upto(m: Mode) -> Vec<Mode> {
    Mode::ALL.into_iter().filter(|x| *x <= m).collect()
}

fn rule_universe() -> Vec<Rule> {
    let mut out = Vec::new();
    for s in ["self", "*", "agent:r1"] {
        for n in ["n1", "n2", "*"] {
            out.push(rule(&format!("allow {s} tool:{n} use")));
            out.push(rule(&format!("allow {s} shared:{n} read")));
            out.push(rule(&format!("allow {s} shared:{n} write")));
        }
    }
    out
}

fn any_files() -> BoxedStrategy<Vec<FileRule>> {
    subsequence(RULE_PATHS.to_vec(), 0..=4)
        .prop_flat_map(|paths| {
            paths
                .into_iter()
                .map(|p| select(Mode::ALL.to_vec()).prop_map(move |m| fr(p, m)))
                .collect::<Vec<_>>()
        })
        .boxed()
}

fn mount_of(target: &str, source: &str, rw: bool, rec: u8, flags: [bool; 3]) -> MountEntry {
    MountEntry {
        source: ap(source),
        target: ap(target),
        rw,
        opts: crate::policy::MountOpts {
            bind: rec == 1,
            rbind: rec == 2,
            nosuid: flags[0],
            nodev: flags[1],
            noexec: flags[2],
        },
    }
}

fn any_mounts() -> BoxedStrategy<Vec<MountEntry>> {
    subsequence(TARGETS.to_vec(), 0..=3)
        .prop_flat_map(|targets| {
            targets
                .into_iter()
                .map(|t| {
                    (
                        select(SOURCES.to_vec()),
                        any::<bool>(),
                        0u8..3,
                        any::<[bool; 3]>(),
                    )
                        .prop_map(move |(s, rw, rec, flags)| mount_of(t, s, rw, rec, flags))
                })
                .collect::<Vec<_>>()
        })
        .boxed()
}

fn any_network(ports: Vec<u16>) -> BoxedStrategy<Network> {
    prop_oneof![
        Just(Network::None),
        set_of(ports).prop_map(Network::Connect),
        Just(Network::All),
    ]
    .boxed()
}

fn any_env() -> BoxedStrategy<BTreeMap<String, String>> {
    (subsequence(vec!["A", "B", "C"], 0..=3), any::<[bool; 3]>())
        .prop_map(|(ks, alt)| {
            ks.into_iter()
                .zip(alt)
                .map(|(k, a)| (k.to_owned(), if a { "9" } else { "1" }.to_owned()))
                .collect()
        })
        .boxed()
}

fn any_on_restart() -> BoxedStrategy<OnRestart> {
    select(vec![OnRestart::Cancel, OnRestart::Resume]).boxed()
}

fn narrow_on_restart(p: OnRestart) -> BoxedStrategy<OnRestart> {
    narrow(select(vec![OnRestart::Cancel, p]).boxed(), any_on_restart())
}

fn any_secrets() -> BoxedStrategy<BTreeSet<String>> {
    subsequence(vec!["S1", "S2", "S3"], 0..=3)
        .prop_map(|ks| ks.into_iter().map(str::to_owned).collect())
        .boxed()
}

fn any_path(tiers: Vec<String>) -> BoxedStrategy<Vec<String>> {
    let n = tiers.len();
    subsequence(tiers, 0..=n).prop_shuffle().boxed()
}

fn limit() -> BoxedStrategy<Option<u64>> {
    opt(select(LIMITS.to_vec()).boxed())
}

fn any_policy() -> BoxedStrategy<Policy> {
    (
        (
            select(vec![0u32, 1000]),
            select(vec![0u32, 1000]),
            set_of(GROUPS.to_vec()),
            subsequence(rule_universe(), 0..=4),
            any_env(),
            (limit(), limit(), limit(), limit()),
            opt(select(vec![10u64, 100, 1000]).boxed()),
            opt(set_of(strings(&TOOLS))),
            (limit(), limit()),
        ),
        (
            any_files(),
            any_mounts(),
            any_network(PORTS.to_vec()),
            opt(set_of(strings(&MODELS))),
            any_path(strings(&TIERS)),
            opt(select(vec![100u64, 1000]).boxed()),
            opt(select(vec![0.0, 1.0, 2.5, 10.0]).boxed()),
            opt((0u32..4).boxed()),
            opt((0u32..5).boxed()),
            (any_secrets(), any_on_restart()),
        ),
    )
        .prop_map(
            |(
                (uid, gid, groups, rules, env, (m, pids, cpu, disk), timeout_s, tools, (rpm, tpm)),
                (
                    files,
                    mounts,
                    network,
                    models,
                    path,
                    window,
                    cost_limit,
                    depth,
                    create,
                    (secrets, on_restart),
                ),
            )| {
                Policy {
                    tools,
                    files,
                    mounts,
                    network,
                    cost_limit,
                    window,
                    depth_limit: depth,
                    create_limit: create,
                    timeout_s,
                    resources: Resources {
                        memory_max: m,
                        pids_max: pids,
                        cpu_weight: cpu,
                        disk_max: disk,
                    },
                    model_rate: ModelRate {
                        requests_per_minute: rpm,
                        tokens_per_minute: tpm,
                    },
                    uid,
                    gid,
                    groups,
                    env,
                    secrets,
                    models,
                    path,
                    rules,
                    on_restart,
                }
                .normalise()
                .unwrap()
            },
        )
        .boxed()
}

fn any_live() -> BoxedStrategy<Live> {
    (
        opt(select(vec![0.0, 1.0, 5.0, 20.0]).boxed()),
        0u32..4,
        // A deadline already past refuses every child at step 6 and hides
        // the later checks, so it is rare.
        opt(prop_oneof![
            1 => select(vec![NOW - 10, NOW]),
            8 => select(vec![NOW + 5, NOW + 50, NOW + 500]),
        ]
        .boxed()),
    )
        .prop_map(|(budget_remaining, creates_used, deadline_unix_s)| Live {
            budget_remaining,
            creates_used,
            deadline_unix_s,
        })
        .boxed()
}

/// Mostly a narrowing of the parent's value, sometimes anything.
fn narrow<T: fmt::Debug + 'static>(
    narrowed: BoxedStrategy<T>,
    anything: BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    prop_oneof![14 => narrowed, 1 => anything].boxed()
}

fn narrow_limit(p: Option<u64>) -> BoxedStrategy<Option<u64>> {
    let narrowed = match p {
        Some(v) => select(
            LIMITS
                .iter()
                .copied()
                .filter(|x| *x <= v)
                .chain([v])
                .collect::<Vec<_>>(),
        )
        .prop_map(Some)
        .boxed(),
        None => limit(),
    };
    narrow(narrowed, opt(select(vec![1u64, 10, 100, 1000]).boxed()))
}

fn narrow_names(
    p: &Option<BTreeSet<String>>,
    universe: &[&str],
) -> BoxedStrategy<Option<BTreeSet<String>>> {
    let narrowed = match p {
        Some(s) => set_of(s.iter().cloned().collect()).prop_map(Some).boxed(),
        None => opt(set_of(strings(universe))),
    };
    let mut wider = strings(universe);
    wider.push("extra".to_owned());
    narrow(narrowed, opt(set_of(wider)))
}

fn narrow_rules(p: &[Rule]) -> BoxedStrategy<Vec<Rule>> {
    let n = p.len();
    let narrowed = subsequence(p.to_vec(), 0..=n)
        .prop_flat_map(|rules| {
            rules
                .into_iter()
                .map(|q| {
                    let subjects = if q.subject == "*" {
                        strings(&SUBJECTS)
                    } else {
                        vec![q.subject.clone()]
                    };
                    let names = if q.name == "*" {
                        strings(&RULE_NAMES)
                    } else {
                        vec![q.name.clone()]
                    };
                    (select(subjects), select(names)).prop_map(move |(subject, name)| Rule {
                        subject,
                        name,
                        ..q.clone()
                    })
                })
                .collect::<Vec<_>>()
        })
        .boxed();
    narrow(narrowed, subsequence(rule_universe(), 0..=4).boxed())
}

fn narrow_files(p: &Policy) -> BoxedStrategy<Vec<FileRule>> {
    // The parent's rules with modes lowered, plus rules at new paths no
    // higher than the parent's mode there: always within.
    let lowered = p
        .files
        .iter()
        .map(|r| {
            let path = r.path.clone();
            select(modes_upto(r.mode))
                .prop_map(move |mode| FileRule {
                    path: path.clone(),
                    mode,
                })
                .boxed()
        })
        .collect::<Vec<_>>();
    let fresh: Vec<FileRule> = RULE_PATHS
        .iter()
        .map(|s| ap(s))
        .filter(|x| p.files.iter().all(|r| r.path != *x))
        .map(|path| FileRule {
            mode: p.mode_at(&path),
            path,
        })
        .collect();
    let extras = subsequence(fresh, 0..=2).prop_flat_map(|rs| {
        rs.into_iter()
            .map(|r| {
                let path = r.path.clone();
                select(modes_upto(r.mode)).prop_map(move |mode| FileRule {
                    path: path.clone(),
                    mode,
                })
            })
            .collect::<Vec<_>>()
    });
    let narrowed = (lowered, extras)
        .prop_map(|(mut a, b)| {
            a.extend(b);
            a
        })
        .boxed();
    // Dropping rules may widen (a hidden rule under a visible one) or not.
    let n = p.files.len();
    let dropped = subsequence(p.files.clone(), 0..=n).boxed();
    prop_oneof![12 => narrowed, 2 => dropped, 1 => any_files()].boxed()
}

fn narrow_mounts(p: &[MountEntry]) -> BoxedStrategy<Vec<MountEntry>> {
    let n = p.len();
    let narrowed = subsequence(p.to_vec(), 0..=n)
        .prop_flat_map(|ms| {
            ms.into_iter()
                .map(|m| {
                    let recs: Vec<u8> = if m.opts.rbind {
                        vec![0, 1, 2]
                    } else {
                        vec![0, 1]
                    };
                    (any::<bool>(), select(recs), any::<[bool; 3]>()).prop_map(
                        move |(keep_rw, rec, add)| {
                            mount_of(
                                m.target.as_str(),
                                m.source.as_str(),
                                m.rw && keep_rw,
                                rec,
                                [
                                    m.opts.nosuid || add[0],
                                    m.opts.nodev || add[1],
                                    m.opts.noexec || add[2],
                                ],
                            )
                        },
                    )
                })
                .collect::<Vec<_>>()
        })
        .boxed();
    // A near miss: a narrowed table with one entry pushed one step past
    // its parent's, in one of the ways SPEC 5 forbids.
    let near = narrowed
        .clone()
        .prop_flat_map(|ms| {
            let n = ms.len().max(1);
            (Just(ms), 0..n, 0u8..6)
        })
        .prop_map(|(mut ms, i, how)| {
            if let Some(m) = ms.get_mut(i) {
                match how {
                    0 => m.rw = true,
                    1 => m.opts.nosuid = false,
                    2 => m.opts.nodev = false,
                    3 => m.opts.noexec = false,
                    4 => (m.opts.bind, m.opts.rbind) = (false, true),
                    _ => m.source = ap("/elsewhere"),
                }
            }
            ms
        })
        .boxed();
    prop_oneof![12 => narrowed, 2 => near, 1 => any_mounts()].boxed()
}

fn narrow_network(p: &Network) -> BoxedStrategy<Network> {
    let narrowed = match p {
        Network::All => any_network(PORTS.to_vec()),
        Network::Connect(s) => prop_oneof![
            Just(Network::None),
            set_of(s.iter().copied().collect()).prop_map(Network::Connect),
        ]
        .boxed(),
        Network::None => Just(Network::None).boxed(),
    };
    narrow(narrowed, any_network(vec![22, 80, 443, 8080]))
}

fn child_of(p: &Policy, l: &Live) -> BoxedStrategy<Policy> {
    let left = l.deadline_unix_s.map(|d| d.saturating_sub(NOW));
    let bound = match (p.timeout_s, left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let timeout = match bound {
        Some(b) => select(vec![1.max(b / 2), b.max(1)]).prop_map(Some).boxed(),
        None => opt(select(vec![10u64, 100, 1000]).boxed()),
    };
    let cap = match (l.budget_remaining, p.cost_limit) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let cost = match cap {
        Some(c) => opt(select(vec![0.0, c / 2.0, c]).boxed()),
        None => opt(select(vec![0.0, 1.0, 100.0]).boxed()),
    };
    let window = match p.window {
        Some(w) => select(vec![w, (w / 2).max(1)]).prop_map(Some).boxed(),
        None => Just(None).boxed(),
    };
    let depth = match p.depth_limit {
        Some(0) => Just(Some(0)).boxed(),
        Some(d) => (0..d).prop_map(Some).boxed(),
        None => opt((0u32..4).boxed()),
    };
    let create = match p.create_limit {
        Some(n) => (0..=n.saturating_sub(l.creates_used))
            .prop_map(Some)
            .boxed(),
        None => opt((0u32..4).boxed()),
    };
    let n_env = p.env.len();
    let n_secrets = p.secrets.len();
    let n_groups = p.groups.len();
    let n_path = p.path.len();
    (
        (
            narrow(Just(p.uid).boxed(), select(vec![0u32, 1000, 7]).boxed()),
            narrow(Just(p.gid).boxed(), select(vec![0u32, 1000, 7]).boxed()),
            narrow(
                subsequence(p.groups.iter().copied().collect::<Vec<_>>(), 0..=n_groups)
                    .prop_map(|v| v.into_iter().collect())
                    .boxed(),
                set_of(vec![1, 2, 3, 4, 5]),
            ),
            narrow_rules(&p.rules),
            narrow(
                subsequence(p.env.clone().into_iter().collect::<Vec<_>>(), 0..=n_env)
                    .prop_map(|v| v.into_iter().collect())
                    .boxed(),
                any_env(),
            ),
            (
                narrow_limit(p.resources.memory_max),
                narrow_limit(p.resources.pids_max),
                narrow_limit(p.resources.cpu_weight),
                narrow_limit(p.resources.disk_max),
            ),
            narrow(
                timeout,
                opt(select(vec![1u64, 10, 100, 1000, 5000]).boxed()),
            ),
            narrow_names(&p.tools, &TOOLS),
            (
                narrow_limit(p.model_rate.requests_per_minute),
                narrow_limit(p.model_rate.tokens_per_minute),
            ),
        ),
        (
            narrow_files(p),
            narrow_mounts(&p.mounts),
            narrow_network(&p.network),
            narrow_names(&p.models, &MODELS),
            narrow(
                subsequence(p.path.clone(), 0..=n_path).boxed(),
                any_path(strings(&["p1", "p2", "p3", "p4", "p5"])),
            ),
            narrow(window, opt(select(vec![100u64, 1000, 2000]).boxed())),
            narrow(cost, opt(select(vec![0.0, 1.0, 5.0, 50.0]).boxed())),
            narrow(depth, opt((0u32..5).boxed())),
            narrow(create, opt((0u32..6).boxed())),
            narrow(
                subsequence(p.secrets.iter().cloned().collect::<Vec<_>>(), 0..=n_secrets)
                    .prop_map(|v| v.into_iter().collect())
                    .boxed(),
                any_secrets(),
            ),
            narrow_on_restart(p.on_restart),
        ),
    )
        .prop_map(
            |(
                (uid, gid, groups, rules, env, (m, pids, cpu, disk), timeout_s, tools, (rpm, tpm)),
                (
                    files,
                    mounts,
                    network,
                    models,
                    path,
                    window,
                    cost_limit,
                    depth,
                    create,
                    secrets,
                    on_restart,
                ),
            )| {
                Policy {
                    tools,
                    files,
                    mounts,
                    network,
                    cost_limit,
                    window,
                    depth_limit: depth,
                    create_limit: create,
                    timeout_s,
                    resources: Resources {
                        memory_max: m,
                        pids_max: pids,
                        cpu_weight: cpu,
                        disk_max: disk,
                    },
                    model_rate: ModelRate {
                        requests_per_minute: rpm,
                        tokens_per_minute: tpm,
                    },
                    uid,
                    gid,
                    groups,
                    env,
                    secrets,
                    models,
                    path,
                    rules,
                    on_restart,
                }
                .normalise()
                .unwrap()
            },
        )
        .boxed()
}

fn pairs() -> BoxedStrategy<(Policy, Live, Policy)> {
    (any_policy(), any_live())
        .prop_flat_map(|(p, l)| {
            let child = child_of(&p, &l);
            (Just(p), Just(l), child)
        })
        .boxed()
}

// ---- the oracle ----

/// Every path of up to three components over a five-letter alphabet:
/// all rule paths lie in it, and a deeper path has the mode of its
/// three-component ancestor.
fn universe() -> Vec<AbsPath> {
    let mut out = vec![AbsPath::root()];
    let mut frontier = vec![String::new()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for prefix in &frontier {
            for c in COMPONENTS {
                let s = format!("{prefix}/{c}");
                out.push(ap(&s));
                next.push(s);
            }
        }
        frontier = next;
    }
    out
}

fn rule_map(p: &Policy) -> BTreeMap<&AbsPath, Mode> {
    p.files.iter().map(|r| (&r.path, r.mode)).collect()
}

/// The mode at `x`, found by walking up from `x` to the first path with
/// a rule.
fn oracle_mode(rules: &BTreeMap<&AbsPath, Mode>, x: &AbsPath) -> Mode {
    let mut at = Some(x.clone());
    while let Some(here) = at {
        if let Some(m) = rules.get(&here) {
            return *m;
        }
        at = here.parent();
    }
    Mode::Hidden
}

/// Rules as the concrete grants they make, over every subject and name
/// that occurs plus one that never does (standing for "anyone else").
fn grants(rules: &[Rule]) -> BTreeSet<(String, String, String, String)> {
    let subjects = ["self", "agent:r1", "agent:r2", "agent:fresh"];
    let names = ["n1", "n2", "n3", "fresh"];
    let mut out = BTreeSet::new();
    for r in rules {
        for s in subjects {
            for n in names {
                if (r.subject == "*" || r.subject == s) && (r.name == "*" || r.name == n) {
                    out.insert((
                        r.class.as_str().to_owned(),
                        r.perm.clone(),
                        s.to_owned(),
                        n.to_owned(),
                    ));
                }
            }
        }
    }
    out
}

fn name_powers(set: &Option<BTreeSet<String>>, universe: &[&str]) -> BTreeSet<String> {
    match set {
        Some(s) => s.clone(),
        None => universe
            .iter()
            .map(|s| (*s).to_owned())
            .chain(["extra".to_owned(), "fresh".to_owned()])
            .collect(),
    }
}

/// A mount table as the powers it gives: to see a source at a target,
/// and each of write, setuid, devices, exec, recursion.
fn mount_powers(p: &Policy) -> BTreeSet<(String, String, &'static str)> {
    let mut out = BTreeSet::new();
    for m in &p.mounts {
        let at = |what| {
            (
                m.target.as_str().to_owned(),
                m.source.as_str().to_owned(),
                what,
            )
        };
        out.insert(at("see"));
        for (what, on) in [
            ("write", m.rw),
            ("suid", !m.opts.nosuid),
            ("dev", !m.opts.nodev),
            ("exec", !m.opts.noexec),
            ("recursive", m.opts.rbind),
        ] {
            if on {
                out.insert(at(what));
            }
        }
    }
    out
}

fn net_powers(n: &Network) -> BTreeSet<String> {
    match n {
        Network::None => BTreeSet::new(),
        Network::Connect(ports) => ports
            .iter()
            .map(u16::to_string)
            .chain(["netns".to_owned()])
            .collect(),
        Network::All => [22u16, 80, 443, 8080]
            .iter()
            .map(u16::to_string)
            .chain(["netns".to_owned(), "any".to_owned()])
            .collect(),
    }
}

/// `None` is infinite.
fn at_most(c: Option<u64>, p: Option<u64>) -> bool {
    c.map_or(u128::MAX, u128::from) <= p.map_or(u128::MAX, u128::from)
}

/// Every field that is not within the parent, as codes in the
/// documented order.
fn within(p: &Policy, l: &Live, c: &Policy, paths: &[AbsPath]) -> Vec<Code> {
    let mut out = Vec::new();
    let mut need = |ok: bool, code: Code| {
        if !ok {
            out.push(code);
        }
    };
    need((c.uid, c.gid) == (p.uid, p.gid), Code::IdentityExpansion);
    need(
        c.groups.iter().all(|g| p.groups.contains(g)),
        Code::GroupExpansion,
    );
    need(
        grants(&c.rules).is_subset(&grants(&p.rules)),
        Code::PolicyExpansion,
    );
    let penv: BTreeSet<_> = p.env.iter().collect();
    need(
        c.env.iter().all(|kv| penv.contains(&kv)),
        Code::PolicyExpansion,
    );
    need(c.secrets.is_subset(&p.secrets), Code::PolicyExpansion);
    need(
        c.on_restart == OnRestart::Cancel || p.on_restart == OnRestart::Resume,
        Code::PolicyExpansion,
    );
    let (cr, pr) = (&c.resources, &p.resources);
    need(
        at_most(cr.memory_max, pr.memory_max)
            && at_most(cr.pids_max, pr.pids_max)
            && at_most(cr.cpu_weight, pr.cpu_weight)
            && at_most(cr.disk_max, pr.disk_max),
        Code::PolicyExpansion,
    );
    let (cm, pm) = (&c.model_rate, &p.model_rate);
    need(
        at_most(cm.requests_per_minute, pm.requests_per_minute)
            && at_most(cm.tokens_per_minute, pm.tokens_per_minute),
        Code::PolicyExpansion,
    );
    let end = c.timeout_s.map(|t| NOW + t);
    need(
        at_most(end, l.deadline_unix_s) && at_most(c.timeout_s, p.timeout_s),
        Code::PolicyExpansion,
    );
    need(
        name_powers(&c.tools, &TOOLS).is_subset(&name_powers(&p.tools, &TOOLS)),
        Code::ToolExpansion,
    );
    let (crules, prules) = (rule_map(c), rule_map(p));
    need(
        paths
            .iter()
            .all(|x| oracle_mode(&crules, x) <= oracle_mode(&prules, x)),
        Code::FileExpansion,
    );
    need(
        mount_powers(c).is_subset(&mount_powers(p)),
        Code::MountExpansion,
    );
    need(
        net_powers(&c.network).is_subset(&net_powers(&p.network)),
        Code::NetworkExpansion,
    );
    need(
        name_powers(&c.models, &MODELS).is_subset(&name_powers(&p.models, &MODELS)),
        Code::ModelExpansion,
    );
    let positions: Option<Vec<usize>> = c
        .path
        .iter()
        .map(|t| p.path.iter().position(|u| u == t))
        .collect();
    need(
        positions.is_some_and(|v| v.windows(2).all(|w| w[0] < w[1])),
        Code::ToolPathExpansion,
    );
    match (c.window, p.window) {
        (Some(cw), Some(pw)) => need(cw <= pw, Code::WindowExpansion),
        (cw, pw) => need(cw.is_some() == pw.is_some(), Code::WindowUnknown),
    }
    need(
        c.cost_limit.is_none_or(|x| {
            [l.budget_remaining, p.cost_limit]
                .into_iter()
                .flatten()
                .all(|cap| x <= cap)
        }),
        Code::BudgetExceeded,
    );
    need(
        p.depth_limit
            .is_none_or(|d| c.depth_limit.is_some_and(|cd| cd < d)),
        Code::DepthLimit,
    );
    need(
        p.create_limit.is_none_or(|n| {
            let left = i64::from(n) - i64::from(l.creates_used);
            left > 0 && c.create_limit.is_some_and(|k| i64::from(k) <= left)
        }),
        Code::CreateLimit,
    );
    out
}

fn probes() -> Vec<AbsPath> {
    [
        "/",
        "/a",
        "/a/b",
        "/a/b/c",
        "/a/b/c/d/e",
        "/x",
        "/x/a",
        "/x/y/z",
        "/a/x",
        "/ab",
        "/b",
        "/c/a",
    ]
    .iter()
    .map(|s| ap(s))
    .collect()
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        // Nothing is written next to the sources on failure; a failing
        // case is printed and can be pinned as a table test.
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    }
}

proptest! {
    #![proptest_config(config(10_000))]

    #[test]
    fn an_admitted_child_is_within_and_a_refusal_names_the_first_failing_check(
        (p, l, c) in pairs(),
        random in proptest::collection::vec(
            proptest::collection::vec(select(COMPONENTS.to_vec()), 0..6), 4),
    ) {
        thread_local! {
            static UNIVERSE: Vec<AbsPath> = universe();
        }
        let oracle = UNIVERSE.with(|u| within(&p, &l, &c, u));
        match check(&view(&p, &l), &c) {
            Ok(()) => {
                prop_assert!(oracle.is_empty(), "admitted, but the oracle finds {oracle:?}");
                let random = random.iter().map(|cs| {
                    ap(&format!("/{}", cs.join("/")))
                });
                let rule_paths = p.files.iter().chain(&c.files).map(|r| r.path.clone());
                for x in probes().into_iter().chain(rule_paths).chain(random) {
                    prop_assert!(c.mode_at(&x) <= p.mode_at(&x), "{x}");
                }
            }
            Err(r) => {
                prop_assert_eq!(Some(&r.code), oracle.first(), "{}; oracle {:?}", r, oracle);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(2_000))]

    #[test]
    fn an_inheriting_child_is_refused_only_for_the_parents_live_state(
        p in any_policy(),
        l in any_live(),
    ) {
        let v = view(&p, &l);
        let child = derive(&v, &PolicyRequest::default());
        let normalised = child.clone().normalise().ok();
        prop_assert_eq!(normalised.as_ref(), Some(&child));
        // A child asking nothing holds its parent's model rate limits: a
        // limited parent never has an unlimited child.
        prop_assert_eq!(child.model_rate, p.model_rate);
        // In the order of the checks: timeout (6), depth (15), creates (16).
        let expect = if l.deadline_unix_s.is_some_and(|d| d <= NOW) {
            Err(Code::PolicyExpansion)
        } else if p.depth_limit == Some(0) {
            Err(Code::DepthLimit)
        } else if p.create_limit.is_some_and(|n| l.creates_used >= n) {
            Err(Code::CreateLimit)
        } else {
            Ok(())
        };
        prop_assert_eq!(check(&v, &child).map_err(|r| r.code), expect);
    }
}

/// The generator is not vacuous: it admits often, and every code the
/// check gives comes up as the first failure.
#[test]
fn the_generated_pairs_reach_every_outcome() {
    let mut runner = TestRunner::new(Config {
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..Config::default()
    });
    let strategy = pairs();
    let mut admitted = 0;
    let mut codes = BTreeSet::new();
    for _ in 0..3_000 {
        let (p, l, c) = strategy.new_tree(&mut runner).unwrap().current();
        match check(&view(&p, &l), &c) {
            Ok(()) => admitted += 1,
            Err(r) => {
                codes.insert(r.code.as_str());
            }
        }
    }
    assert!(admitted > 300, "only {admitted} of 3000 admitted");
    assert_eq!(codes.len(), 14, "{codes:?}");
}
