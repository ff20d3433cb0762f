//! Rendering for people: tables, trees, key-value pages, from the API's
//! types (`brood_api`). Programs use `--json`.

use brood_api::{Agent, AgentDetail, MessageView, Spend, TreeNode};

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), T::to_string)
}

/// An agent's status as people read it, the same on every surface (`ps`,
/// `tree`, `show`, `spawn`, `wait`, `cancel`, `close`, `resume`, `run`):
/// its status word (`stopping` while it is being stopped), then in brackets
/// its reason and whether its supervisor is gone: `running`, `stopping
/// (user)`, `cancelled (parent_dead)`, `running (supervisor gone)`.
pub fn status(a: &Agent) -> String {
    let word = if a.state.starts_with("stopping/") {
        "stopping"
    } else {
        a.status.as_str()
    };
    let mut notes: Vec<&str> = a.reason.iter().map(String::as_str).collect();
    if a.supervisor_gone {
        notes.push("supervisor gone");
    }
    if notes.is_empty() {
        word.to_owned()
    } else {
        format!("{word} ({})", notes.join("; "))
    }
}

/// `ps`: one agent per line.
pub fn table(agents: &[Agent]) -> String {
    let mut rows = vec![[
        "NAME".to_owned(),
        "PARENT".into(),
        "STATUS".into(),
        "PID".into(),
        "RUN".into(),
    ]];
    for a in agents {
        rows.push([
            a.name.clone(),
            opt(&a.parent),
            status(a),
            opt(&a.pid),
            a.run.chars().take(13).collect(),
        ]);
    }
    let mut w = [0usize; 5];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        out.push('\n');
    }
    out
}

/// `tree`: the agent and its descendants, drawn with box characters.
pub fn tree(t: &TreeNode) -> String {
    let mut out = String::new();
    node(t, "", None, &mut out);
    out
}

fn node(t: &TreeNode, prefix: &str, last: Option<bool>, out: &mut String) {
    let (branch, next) = match last {
        None => (String::new(), String::new()),
        Some(true) => (format!("{prefix}└── "), format!("{prefix}    ")),
        Some(false) => (format!("{prefix}├── "), format!("{prefix}│   ")),
    };
    let a = &t.agent;
    let pid = a.pid.map(|p| format!("  pid {p}")).unwrap_or_default();
    let result = a
        .result
        .as_deref()
        .and_then(|r| r.lines().next())
        .map(|l| {
            let l: String = l.chars().take(60).collect();
            format!("  → {l}")
        })
        .unwrap_or_default();
    out.push_str(&format!(
        "{branch}{}  {}{pid}{}{result}\n",
        a.name,
        status(a),
        spend_text(&t.spend)
    ));
    let n = t.children.len();
    for (i, k) in t.children.iter().enumerate() {
        node(k, &next, Some(i + 1 == n), out);
    }
}

/// `  $own / $subtree (tokens in/out)` when anything was spent; nothing otherwise.
fn spend_text(sp: &Spend) -> String {
    let (own, sub) = (&sp.own, &sp.subtree);
    if sub.cost_usd == 0.0 && sub.tokens_in == 0 && sub.tokens_out == 0 {
        return String::new();
    }
    format!(
        "  spent ${:.4} own, ${:.4} tree ({}/{} tokens own, {}/{} tree)",
        own.cost_usd, sub.cost_usd, own.tokens_in, own.tokens_out, sub.tokens_in, sub.tokens_out
    )
}

/// A span of milliseconds as people say it: `3 s`, `5 min`, `2 h`, `4 d`.
fn span(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        _ if s < 120 => format!("{s} s"),
        _ if s < 7200 => format!("{} min", s / 60),
        _ if s < 172_800 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// An instant (milliseconds since the epoch) as `2026-11-26 07:31:02 UTC
/// (3 s ago)`, `now_ms` being now.
pub fn when(ms: i64, now_ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, mo, d) = brood_core::time::civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    let ago = if now_ms >= ms {
        format!("{} ago", span(now_ms - ms))
    } else {
        format!("in {}", span(ms - now_ms))
    };
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02} UTC ({ago})",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

/// What `show` prints below the record: the transcript's tail and the log's.
pub struct Tails<'a> {
    pub messages: &'a [MessageView],
    pub log: &'a [String],
    pub now_ms: i64,
}

/// The messages `show` prints, and how much of each.
const SHOWN_MESSAGES: usize = 5;
const SHOWN_CHARS: usize = 200;

/// `show`: one field per line, then the transcript's and the log's tails.
pub fn show(d: &AgentDetail, tails: &Tails<'_>) -> String {
    let a = &d.agent;
    let at = |ms: Option<i64>| ms.map_or_else(|| "-".to_owned(), |m| when(m, tails.now_ms));
    let fields: [(&str, String); 23] = [
        ("name", a.name.clone()),
        ("parent", opt(&a.parent)),
        ("status", status(a)),
        ("reason", opt(&a.reason)),
        ("detail", opt(&a.detail)),
        ("pid", opt(&a.pid)),
        ("cgroup", opt(&a.cgroup)),
        ("run", a.run.clone()),
        ("session", a.session.clone()),
        ("protocol", a.protocol.clone()),
        ("life", d.life.clone()),
        ("iso", d.iso.clone()),
        ("allow_weaker_sandbox", d.allow_weaker_sandbox.to_string()),
        ("on_restart", d.on_restart.clone()),
        ("depth", a.depth.to_string()),
        ("exit_code", opt(&a.exit_code)),
        ("created", at(Some(a.created_ms))),
        ("started", at(a.started_ms)),
        ("ended", at(a.ended_ms)),
        ("updated", at(Some(a.updated_ms))),
        ("tokens_in", opt(&a.tokens_in)),
        ("tokens_out", opt(&a.tokens_out)),
        ("cost_usd", opt(&a.cost_usd)),
    ];
    let mut out = String::new();
    for (k, v) in fields {
        out.push_str(&format!("{k:<11} {v}\n"));
    }
    for (k, u) in [
        ("spent_own", &d.spend.own),
        ("spent_tree", &d.spend.subtree),
    ] {
        out.push_str(&format!(
            "{k:<11} ${:.4} ({} tokens in, {} out)\n",
            u.cost_usd, u.tokens_in, u.tokens_out
        ));
    }
    out.push_str(&format!("{:<11} {}\n", "cost_limit", opt(&d.cost_limit)));
    if let Some(r) = &a.result {
        out.push_str("result:\n");
        for l in r.lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if let Some(p) = d.policy.as_object() {
        out.push_str("policy:\n");
        for (k, v) in p {
            let v = match (k.as_str(), v.as_object()) {
                // Its names: the API shows no value (issue 25).
                ("env", Some(env)) if !env.is_empty() => format!(
                    "{} (values not shown)",
                    env.keys().cloned().collect::<Vec<_>>().join(" ")
                ),
                _ => v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            };
            out.push_str(&format!("  {k:<13} {v}\n"));
        }
    }
    out.push_str("runs:\n");
    for r in &d.runs {
        out.push_str(&format!(
            "  #{} {} pid {} outcome {} exit {}\n",
            r.seq,
            r.id,
            opt(&r.pid),
            opt(&r.outcome),
            opt(&r.exit_code)
        ));
    }
    if !tails.messages.is_empty() {
        let from = tails.messages.len().saturating_sub(SHOWN_MESSAGES);
        out.push_str(&format!(
            "transcript (the last {} of {} messages; brood logs {}):\n",
            tails.messages.len() - from,
            tails.messages.len(),
            a.name
        ));
        for m in &tails.messages[from..] {
            let one: String = m.content.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut cut: String = one.chars().take(SHOWN_CHARS).collect();
            if cut.len() < one.len() {
                cut.push('…');
            }
            out.push_str(&format!("  {}: {cut}\n", m.role));
        }
    }
    if !tails.log.is_empty() {
        out.push_str(&format!(
            "log (the end of its stderr, ctx/agent/{}.d/log; brood logs {}):\n",
            a.name, a.name
        ));
        for l in tails.log {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

/// A job in one line: id, owner, status and its items' non-zero counts.
pub(crate) fn job_line(j: &brood_api::JobView) -> String {
    let counts: Vec<String> = j
        .counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    format!("{}\t{}\t{}\t{}", j.id, j.owner, j.status, counts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{Agent, TreeNode, status, tree, when};
    use serde_json::json;

    fn node(v: serde_json::Value) -> TreeNode {
        serde_json::from_value(v).unwrap()
    }

    fn agent(
        name: &str,
        status: &str,
        state: &str,
        reason: Option<&str>,
        pid: Option<i64>,
    ) -> serde_json::Value {
        json!({"name": name, "parent": null, "customer": null, "status": status, "state": state,
               "reason": reason, "detail": null, "depth": 0, "session": "default", "protocol": "brood",
               "run": "r", "pid": pid, "cgroup": null, "result": null, "exit_code": null,
               "created_ms": 0, "updated_ms": 0, "started_ms": null, "ended_ms": null,
               "tokens_in": null, "tokens_out": null, "cost_usd": null,
               "spend": {"own": {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0},
                         "subtree": {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}},
               "children": []})
    }

    #[test]
    fn instants_read_as_dates_and_ages() {
        assert_eq!(when(0, 3000), "1970-01-01 00:00:00 UTC (3 s ago)");
        // 2026-11-26 07:31:02 UTC.
        let t = 1_795_678_262_000;
        assert_eq!(when(t, t + 300_000), "2026-11-26 07:31:02 UTC (5 min ago)");
        assert_eq!(when(t, t - 2000), "2026-11-26 07:31:02 UTC (in 2 s)");
        assert_eq!(
            when(951_782_400_000, 951_782_400_000),
            "2000-02-29 00:00:00 UTC (0 s ago)"
        );
    }

    #[test]
    fn a_tree_is_drawn_with_branches_and_reasons() {
        let mut root = agent("root", "completed", "completed", None, None);
        root["result"] = json!("42 lines\nmore");
        let mut a = agent(
            "a",
            "cancelled",
            "cancelled:parent_dead",
            Some("parent_dead"),
            None,
        );
        a["children"] = json!([agent("a1", "running", "running", None, Some(7))]);
        let b = agent(
            "b",
            "running",
            "stopping/cancelled:user",
            Some("user"),
            Some(9),
        );
        root["children"] = json!([a, b]);
        assert_eq!(
            tree(&node(root)),
            "root  completed  → 42 lines\n├── a  cancelled (parent_dead)\n│   └── a1  running  pid 7\n└── b  stopping (user)  pid 9\n"
        );
    }

    #[test]
    fn one_status_rendering_for_every_state() {
        let a = |status: &str, state: &str, reason: Option<&str>, gone: bool| {
            let mut v = agent("x", status, state, reason, None);
            v["supervisor_gone"] = json!(gone);
            status_of(v)
        };
        fn status_of(v: serde_json::Value) -> String {
            let a: Agent = serde_json::from_value(v).unwrap();
            status(&a)
        }
        assert_eq!(a("running", "running", None, false), "running");
        assert_eq!(
            a("running", "stopping/cancelled:user", Some("user"), false),
            "stopping (user)"
        );
        assert_eq!(
            a("cancelled", "cancelled:user", Some("user"), false),
            "cancelled (user)"
        );
        assert_eq!(
            a("failed", "failed:exit_code", Some("exit_code"), false),
            "failed (exit_code)"
        );
        assert_eq!(
            a("running", "running", None, true),
            "running (supervisor gone)"
        );
        assert_eq!(
            a("blocked", "blocked", Some("waiting"), true),
            "blocked (waiting; supervisor gone)"
        );
        assert_eq!(a("closed", "closed/completed", None, false), "closed");
    }
}
