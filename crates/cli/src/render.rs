//! Rendering for people: tables, trees, key-value pages. Programs use `--json`.

use serde_json::Value;

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(x) => x.clone(),
        other => other.to_string(),
    }
}

fn status_word(a: &Value) -> String {
    let st = s(&a["status"]);
    let state = s(&a["state"]);
    let mut out = if state.starts_with("stopping/") {
        "stopping".to_owned()
    } else {
        st
    };
    if let Some(r) = a["reason"].as_str() {
        out.push_str(&format!(" ({r})"));
    }
    out
}

/// `ps`: one agent per line.
pub fn table(agents: &[Value]) -> String {
    let mut rows = vec![[
        "NAME".to_owned(),
        "PARENT".into(),
        "STATUS".into(),
        "PID".into(),
        "RUN".into(),
    ]];
    for a in agents {
        rows.push([
            s(&a["name"]),
            s(&a["parent"]),
            status_word(a),
            s(&a["pid"]),
            a["run"]
                .as_str()
                .map(|r| r.chars().take(13).collect())
                .unwrap_or_default(),
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
pub fn tree(t: &Value) -> String {
    let mut out = String::new();
    node(t, "", None, &mut out);
    out
}

fn node(a: &Value, prefix: &str, last: Option<bool>, out: &mut String) {
    let (branch, next) = match last {
        None => (String::new(), String::new()),
        Some(true) => (format!("{prefix}└── "), format!("{prefix}    ")),
        Some(false) => (format!("{prefix}├── "), format!("{prefix}│   ")),
    };
    let pid = a["pid"]
        .as_i64()
        .map(|p| format!("  pid {p}"))
        .unwrap_or_default();
    let result = a["result"]
        .as_str()
        .and_then(|r| r.lines().next())
        .map(|l| {
            let l: String = l.chars().take(60).collect();
            format!("  → {l}")
        })
        .unwrap_or_default();
    out.push_str(&format!(
        "{branch}{}  {}{pid}{}{result}\n",
        s(&a["name"]),
        status_word(a),
        spend_text(&a["spend"])
    ));
    let kids = a["children"].as_array().cloned().unwrap_or_default();
    let n = kids.len();
    for (i, k) in kids.iter().enumerate() {
        node(k, &next, Some(i + 1 == n), out);
    }
}

/// `  $own / $subtree (tokens in/out)` when anything was spent; nothing otherwise.
fn spend_text(sp: &Value) -> String {
    let own = &sp["own"];
    let sub = &sp["subtree"];
    let cost = |u: &Value| u["cost_usd"].as_f64().unwrap_or(0.0);
    let tok = |u: &Value, k: &str| u[k].as_u64().unwrap_or(0);
    if cost(sub) == 0.0 && tok(sub, "tokens_in") == 0 && tok(sub, "tokens_out") == 0 {
        return String::new();
    }
    format!(
        "  spent ${:.4} own, ${:.4} tree ({}/{} tokens own, {}/{} tree)",
        cost(own),
        cost(sub),
        tok(own, "tokens_in"),
        tok(own, "tokens_out"),
        tok(sub, "tokens_in"),
        tok(sub, "tokens_out")
    )
}

/// `show`: one field per line.
pub fn show(a: &Value) -> String {
    let mut out = String::new();
    for k in [
        "name",
        "parent",
        "status",
        "reason",
        "detail",
        "pid",
        "cgroup",
        "run",
        "session",
        "protocol",
        "life",
        "iso",
        "allow_weaker_sandbox",
        "depth",
        "exit_code",
        "created_ms",
        "started_ms",
        "ended_ms",
        "updated_ms",
        "tokens_in",
        "tokens_out",
        "cost_usd",
    ] {
        let v = if k == "status" {
            status_word(a)
        } else {
            s(&a[k])
        };
        out.push_str(&format!("{k:<11} {v}\n"));
    }
    if a["spend"].is_object() {
        for (k, part) in [("spent_own", "own"), ("spent_tree", "subtree")] {
            let u = &a["spend"][part];
            out.push_str(&format!(
                "{k:<11} ${:.4} ({} tokens in, {} out)\n",
                u["cost_usd"].as_f64().unwrap_or(0.0),
                u["tokens_in"].as_u64().unwrap_or(0),
                u["tokens_out"].as_u64().unwrap_or(0)
            ));
        }
        out.push_str(&format!("{:<11} {}\n", "cost_limit", s(&a["cost_limit"])));
    }
    if let Some(r) = a["result"].as_str() {
        out.push_str("result:\n");
        for l in r.lines() {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if let Some(p) = a["policy"].as_object() {
        out.push_str("policy:\n");
        for (k, v) in p {
            out.push_str(&format!("  {k:<13} {}\n", s(v)));
        }
    }
    if let Some(runs) = a["runs"].as_array() {
        out.push_str("runs:\n");
        for r in runs {
            out.push_str(&format!(
                "  #{} {} pid {} outcome {} exit {}\n",
                s(&r["seq"]),
                s(&r["id"]),
                s(&r["pid"]),
                s(&r["outcome"]),
                s(&r["exit_code"])
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tree_is_drawn_with_branches_and_reasons() {
        let t = json!({"name": "root", "status": "completed", "state": "completed", "reason": null, "pid": null, "result": "42 lines\nmore",
        "children": [
            {"name": "a", "status": "cancelled", "state": "cancelled:parent_dead", "reason": "parent_dead", "pid": null, "children": [
                {"name": "a1", "status": "running", "state": "running", "reason": null, "pid": 7, "children": []}
            ]},
            {"name": "b", "status": "running", "state": "stopping/cancelled:user", "reason": "user", "pid": 9, "children": []}
        ]});
        assert_eq!(
            tree(&t),
            "root  completed  → 42 lines\n├── a  cancelled (parent_dead)\n│   └── a1  running  pid 7\n└── b  stopping (user)  pid 9\n"
        );
    }
}
