//! Pure helpers of the test agent: naming the children of a fan-out, and
//! composing result text from the parts the flags ask for. No IO here, so the
//! exact text other crates' tests compare against is pinned by unit tests.

use brood_proto::HistoryMessage;
use serde_json::Value;

/// Longest child name a fan-out generates (well under the runtime's 64).
pub const MAX_CHILD_NAME: usize = 40;

/// Replaces every character outside `[a-zA-Z0-9._+-]` with `_`.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The name of the fan-out child for directory entry `entry`, given the
/// spawning agent's own name and the names already taken by its siblings.
///
/// A top-level fan-out names its children `count-<entry>`. A fan-out child
/// (whose own name starts with `count-`) names its children
/// `<own name>.<entry>`, so that `a/lib.rs` and `b/lib.rs` do not both ask for
/// the tenant-wide name `count-lib.rs`. Names longer than
/// [`MAX_CHILD_NAME`] keep their start and end with a hash of the whole name;
/// a clash with a sibling gets `-2`, `-3`, ...; a name that would end in `.d`
/// or `.sock` (reserved by the ctx tree) has that dot turned into `-`.
pub fn child_name(own_name: &str, entry: &str, taken: &[String]) -> String {
    // Sanitised as a whole, so that slicing below is on ASCII boundaries
    // whatever name the agent was given.
    let full = sanitize(&if own_name.starts_with("count-") {
        format!("{own_name}.{entry}")
    } else {
        format!("count-{entry}")
    });
    let base = fix_reserved_suffix(shorten(&full, MAX_CHILD_NAME));
    if !taken.contains(&base) {
        return base;
    }
    (2u32..)
        .map(|i| {
            let suffix = format!("-{i}");
            let head = shorten(&full, MAX_CHILD_NAME - suffix.len());
            fix_reserved_suffix(format!("{head}{suffix}"))
        })
        .find(|n| !taken.contains(n))
        .unwrap_or(base)
}

/// Cuts an ASCII name to `max` characters, replacing its middle with an
/// 8-digit hash of the whole so that different long names stay different.
fn shorten(name: &str, max: usize) -> String {
    if name.len() <= max {
        return name.to_owned();
    }
    let hash = format!("{:08x}", fnv1a(name.as_bytes()) as u32);
    // head + "-" + hash + "-" + tail, with a short tail kept for the extension.
    let tail_len = 6.min(max.saturating_sub(hash.len() + 2) / 2);
    let head_len = max.saturating_sub(hash.len() + 2 + tail_len);
    let head = &name[..head_len];
    let tail = &name[name.len() - tail_len..];
    format!("{head}-{hash}-{tail}")
}

fn fix_reserved_suffix(mut name: String) -> String {
    for suffix in [".d", ".sock"] {
        if name.ends_with(suffix) {
            let dot = name.len() - suffix.len();
            name.replace_range(dot..=dot, "-");
        }
    }
    name
}

/// FNV-1a, 64 bits: a stable hash with no dependency and no randomness, so a
/// directory always fans out to the same names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The parts of a `done` response, in the order they appear.
#[derive(Debug, Default)]
pub struct ResultParts<'a> {
    /// `--result` (or "ok" when neither it nor a count was asked for).
    pub result: Option<&'a str>,
    /// The `--count-lines` output.
    pub count: Option<&'a str>,
    /// Texts of the inputs received, when `--inputs` was given.
    pub inputs: Option<&'a [String]>,
    /// The init's history, when `--history` was given.
    pub history: Option<&'a [HistoryMessage]>,
    /// One line per waited-for child (`--wait`).
    pub children: &'a [String],
    /// One line per `--request` reply (and `--await-job`).
    pub requests: &'a [String],
    /// One line per probe (`--probe-*`, `--fork-bomb`, `--memory-hog`), last.
    pub probes: &'a [String],
}

/// Joins the parts with newlines: the result text (default "ok", left out when
/// a count stands in its place), the count, one line per input, the history
/// block (`history: N messages` then `role: content` lines), the children's
/// lines, and the probes' lines.
pub fn compose_result(p: &ResultParts<'_>) -> String {
    let mut lines: Vec<String> = Vec::new();
    match (p.result, p.count) {
        (Some(r), _) => lines.push(r.to_owned()),
        (None, None) => lines.push("ok".to_owned()),
        (None, Some(_)) => {}
    }
    if let Some(c) = p.count {
        lines.push(c.to_owned());
    }
    if let Some(inputs) = p.inputs {
        lines.extend(inputs.iter().cloned());
    }
    if let Some(history) = p.history {
        lines.push(format!("history: {} messages", history.len()));
        lines.extend(history.iter().map(|m| format!("{}: {}", m.role, m.content)));
    }
    lines.extend(p.children.iter().cloned());
    lines.extend(p.requests.iter().cloned());
    lines.extend(p.probes.iter().cloned());
    lines.join("\n")
}

/// One agent of a `wait` reply as `name: status: result`. A missing or null
/// result is empty; a non-string result is shown as JSON.
pub fn wait_line(agent: &Value) -> String {
    let field = |k: &str| match agent.get(k) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    format!(
        "{}: {}: {}",
        field("name"),
        field("status"),
        field("result")
    )
}

/// The line count at the start of a count result (`N\tPATH` or
/// `N lines in PATH`), if it has one.
pub fn leading_count(result: &str) -> Option<u64> {
    let digits: &str = &result[..result
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(result.len())];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sanitize_keeps_the_allowed_set() {
        assert_eq!(sanitize("a-b_c.d+e9"), "a-b_c.d+e9");
        assert_eq!(sanitize("my file (1).txt"), "my_file__1_.txt");
        assert_eq!(sanitize("héllo/x"), "h_llo_x");
    }

    #[test]
    fn top_level_and_nested_child_names() {
        assert_eq!(child_name("root", "a.txt", &[]), "count-a.txt");
        assert_eq!(child_name("count-src", "lib.rs", &[]), "count-src.lib.rs");
        assert_eq!(child_name("root", "x y", &[]), "count-x_y");
    }

    #[test]
    fn child_names_are_unique_among_siblings() {
        let taken = vec!["count-a_b".to_string()];
        assert_eq!(child_name("root", "a b", &taken), "count-a_b-2");
        let taken = vec!["count-a_b".to_string(), "count-a_b-2".to_string()];
        assert_eq!(child_name("root", "a?b", &taken), "count-a_b-3");
    }

    #[test]
    fn long_child_names_are_shortened_and_stay_distinct() {
        let a = child_name("root", &"x".repeat(100), &[]);
        let b = child_name("root", &format!("{}y", "x".repeat(99)), &[]);
        assert_eq!(a.len(), MAX_CHILD_NAME);
        assert_eq!(b.len(), MAX_CHILD_NAME);
        assert!(a.starts_with("count-xxx"));
        assert_ne!(a, b);
        let long_ext = child_name("root", &format!("{}.rs", "n".repeat(80)), &[]);
        assert!(long_ext.ends_with(".rs"), "{long_ext}");
        let clash = child_name("root", &"x".repeat(100), std::slice::from_ref(&a));
        assert_eq!(clash.len(), MAX_CHILD_NAME);
        assert!(clash.ends_with("-2"));
    }

    #[test]
    fn reserved_suffixes_are_avoided() {
        assert_eq!(child_name("root", "conf.d", &[]), "count-conf-d");
        assert_eq!(child_name("root", "x.sock", &[]), "count-x-sock");
    }

    #[test]
    fn every_generated_name_is_a_valid_agent_name() {
        for entry in ["..", ".", ".hidden", "a.d", "ü", &"z".repeat(300), "-"] {
            let n = child_name("root", entry, &[]);
            assert!(n.len() <= MAX_CHILD_NAME && n.starts_with("count-"), "{n}");
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c)),
                "{n}"
            );
            assert!(!n.ends_with(".d") && !n.ends_with(".sock"), "{n}");
        }
    }

    #[test]
    fn result_composition() {
        assert_eq!(compose_result(&ResultParts::default()), "ok");
        let inputs = vec!["one".to_string(), "two".to_string()];
        let history = vec![
            HistoryMessage {
                role: "user".into(),
                content: "hi".into(),
            },
            HistoryMessage {
                role: "assistant".into(),
                content: "ok".into(),
            },
        ];
        let children = vec!["c1: completed: ok".to_string()];
        let r = compose_result(&ResultParts {
            result: Some("done"),
            count: None,
            inputs: Some(&inputs),
            history: Some(&history),
            children: &children,
            requests: &[],
            probes: &[],
        });
        assert_eq!(
            r,
            "done\none\ntwo\nhistory: 2 messages\nuser: hi\nassistant: ok\nc1: completed: ok"
        );
        let r = compose_result(&ResultParts {
            count: Some("3\t/f"),
            ..ResultParts::default()
        });
        assert_eq!(r, "3\t/f");
        let r = compose_result(&ResultParts {
            result: Some("r"),
            count: Some("3\t/f"),
            history: Some(&[]),
            ..ResultParts::default()
        });
        assert_eq!(r, "r\n3\t/f\nhistory: 0 messages");
        let probes = vec!["read /x: denied".to_string(), "caps: denied".to_string()];
        let r = compose_result(&ResultParts {
            children: &children,
            probes: &probes,
            ..ResultParts::default()
        });
        assert_eq!(r, "ok\nc1: completed: ok\nread /x: denied\ncaps: denied");
    }

    #[test]
    fn wait_lines() {
        assert_eq!(
            wait_line(&json!({"name":"a","status":"completed","result":"ok"})),
            "a: completed: ok"
        );
        assert_eq!(
            wait_line(&json!({"name":"b","status":"failed","result":null})),
            "b: failed: "
        );
        assert_eq!(
            wait_line(&json!({"name":"c","status":"x","result":{"k":1}})),
            "c: x: {\"k\":1}"
        );
    }

    #[test]
    fn counts() {
        assert_eq!(leading_count("12\t/a"), Some(12));
        assert_eq!(leading_count("7 lines in /d\n3\t/d/x"), Some(7));
        assert_eq!(leading_count("oops"), None);
    }
}
