//! Issue 25 item 5, "help as a person expects it", with the real binary:
//! `--help` exits 0 for `brood` and every verb, nested ones (`job create`,
//! `quota set`, `bench spawn`) and `brood agent` included, and every flag
//! and argument it lists says what it is; docs/cli.md documents every verb
//! and every flag the real help lists (docs/cli.md is checked against the
//! help, not generated: docs/decisions/cli-and-docs.md "docs/cli.md is
//! tested against the real help, not generated from it");
//! `brood completions SHELL` prints a script its shell reads.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::exe;

/// One `--help` as the test reads it.
#[derive(Debug, Default)]
struct Help {
    /// The verbs of its `Commands:` section (without `help`).
    verbs: Vec<String>,
    /// Each entry of `Options:` and `Arguments:`: its spelling (`-a, --all`,
    /// `--timeout <DURATION>`, `<NAME>`) and its help text.
    entries: Vec<(String, String)>,
}

impl Help {
    /// The long and short flags of its options (`--all`, `-a`).
    fn flags(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (spec, _) in &self.entries {
            for word in spec.split([',', ' ']) {
                let word = word.split('=').next().unwrap_or("");
                if word.starts_with('-') && word.len() > 1 {
                    out.insert(word.to_owned());
                }
            }
        }
        out.remove("-h");
        out.remove("--help");
        out.remove("-V");
        out.remove("--version");
        out
    }
}

/// `brood ARGS... --help`: exit 0 (asserted) and its stdout.
fn help_of(path: &[&str]) -> String {
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(exe())
        .args(path)
        .arg("--help")
        .env_remove("BROOD_SOCKET")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "brood {} --help: {}",
        path.join(" "),
        common::text(&o)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Reads clap's help: sections (`Commands:`, `Arguments:`, `Options:`)
/// whose entries start two spaces in, their help on the same line after
/// two spaces or on the lines below, indented further.
fn parse(text: &str) -> Help {
    let mut h = Help::default();
    let mut section = "";
    for line in text.lines() {
        // Long help puts a blank line between entries.
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') && line.ends_with(':') {
            section = match line {
                "Commands:" => "commands",
                "Arguments:" | "Options:" => "entries",
                _ => "",
            };
            continue;
        }
        if !line.starts_with(' ') {
            section = "";
            continue;
        }
        // Heads are indented 2 (`-a, --all`, commands) or 6 (`--json`);
        // their help, when below them, further.
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        let head = indent == 2 || (indent <= 6 && body.starts_with(['-', '<', '[']));
        match section {
            "commands" if head => {
                let verb = body.split_whitespace().next().unwrap_or("");
                if verb != "help" {
                    h.verbs.push(verb.to_owned());
                }
            }
            "entries" if head => {
                // The spelling ends at the first run of two spaces.
                let (spec, help) = body.split_once("  ").unwrap_or((body, ""));
                h.entries
                    .push((spec.trim().to_owned(), help.trim().to_owned()));
            }
            "entries" if !body.is_empty() => {
                if let Some(last) = h.entries.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(body);
                }
            }
            _ => {}
        }
    }
    h
}

/// Every verb path the real help lists, with its parsed help, walked from
/// `brood --help` down.
fn all_helps() -> Vec<(Vec<String>, Help)> {
    let mut out = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let h = parse(&help_of(&refs));
        for v in &h.verbs {
            let mut p = path.clone();
            p.push(v.clone());
            todo.push(p);
        }
        out.push((path, h));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn every_verb_answers_help_and_every_flag_says_what_it_is() {
    let helps = all_helps();
    let paths: Vec<String> = helps.iter().map(|(p, _)| p.join(" ")).collect();
    // The walk reached the nested verbs and the reference agent.
    for want in [
        "",
        "run",
        "serve",
        "spawn",
        "wait",
        "agent",
        "job",
        "job create",
        "job run",
        "quota",
        "quota set",
        "bench",
        "bench spawn",
        "completions",
        "doctor",
        "events",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "no `brood {want} --help` in {paths:?}"
        );
    }
    let mut bare = Vec::new();
    for (path, h) in &helps {
        assert!(
            !h.entries.is_empty(),
            "brood {} --help lists no option",
            path.join(" ")
        );
        for (spec, help) in &h.entries {
            if help.is_empty() {
                bare.push(format!("brood {}: {spec}", path.join(" ")));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "flags and arguments without help:\n{}",
        bare.join("\n")
    );

    // The reference agent's help is its own flags', not a usage line.
    let agent = &helps.iter().find(|(p, _)| p == &["agent"]).unwrap().1;
    for f in [
        "--type",
        "--provider",
        "--model",
        "--config",
        "--max-turns",
        "--timeout",
        "--tools",
    ] {
        assert!(
            agent.flags().contains(f),
            "brood agent --help lacks {f}: {agent:?}"
        );
    }

    // Units and defaults where they apply.
    let entry = |path: &[&str], flag: &str| -> String {
        let h = &helps
            .iter()
            .find(|(p, _)| p.iter().map(String::as_str).eq(path.iter().copied()))
            .unwrap()
            .1;
        h.entries
            .iter()
            .find(|(s, _)| s.split([',', ' ']).any(|w| w == flag))
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("brood {} has no {flag}", path.join(" ")))
    };
    for (path, flag, says) in [
        (&["wait"][..], "--timeout", "seconds"),
        (&["wait"][..], "--timeout", "5m"),
        (&["run"][..], "--grace", "[default: 3]"),
        (&["serve"][..], "--node-expiry", "[default: 10]"),
        (&["job", "create"][..], "--concurrency", "default 8"),
        (&["job", "create"][..], "--max-attempts", "default 3"),
        (&["job", "create"][..], "--item-timeout", "default 1800 s"),
        (&["job", "create"][..], "--max-runtime", "seconds"),
        (&["agent"][..], "--timeout", "Seconds"),
        (&["agent"][..], "--timeout", "default 120"),
    ] {
        let t = entry(path, flag);
        assert!(
            t.contains(says),
            "brood {} {flag}: {t:?} does not say {says:?}",
            path.join(" ")
        );
    }
}

#[test]
fn help_exits_zero_and_mistakes_exit_two() {
    // `brood help agent` is the agent's own help.
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(exe())
        .args(["help", "agent"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", common::text(&o));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), help_of(&["agent"]));
    // A mistake is exit 2 and names what was wrong, on stderr.
    for (args, says) in [
        (&["agent", "--max-turns", "many"][..], "--max-turns"),
        (&["agent", "--type", "poet"][..], "poet"),
        (&["agent", "--nosuch"][..], "--nosuch"),
        (
            &["wait", "a", "--timeout", "5 weeks"][..],
            "unknown unit \"weeks\"",
        ),
        (&["run", "--grace", "soon", "--", "true"][..], "--grace"),
    ] {
        #[allow(clippy::disallowed_methods)]
        let o = Command::new(exe())
            .args(args)
            .env_remove("BROOD_SOCKET")
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "brood {args:?}: {}",
            common::text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "brood {args:?}: {err}");
        assert!(o.stdout.is_empty(), "brood {args:?}: {}", common::text(&o));
    }
}

/// The rows of docs/cli.md's command table: the first cell (unescaped),
/// and the whole row.
fn cli_rows(doc: &str) -> Vec<(String, &str)> {
    doc.lines()
        .filter(|l| l.starts_with("| `brood "))
        .map(|l| {
            let cell = l.trim_start_matches('|');
            let end = cell.find(" | ").unwrap_or(cell.len());
            (cell[..end].replace("\\|", "|").trim().to_owned(), l)
        })
        .collect()
}

/// Whether `cell` holds `flag` as a whole word (`--json`, not `--json-x`).
fn holds(cell: &str, flag: &str) -> bool {
    cell.match_indices(flag).any(|(i, _)| {
        let before = cell[..i].chars().last();
        let after = cell[i + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn docs_cli_md_documents_every_verb_and_flag_of_the_real_help() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let rows = cli_rows(&doc);
    let helps = all_helps();
    let globals = helps[0].1.flags();
    // The global options are described before the table.
    let intro = &doc[..doc.find("| command |").unwrap()];
    for g in &globals {
        assert!(
            holds(intro, g),
            "docs/cli.md's introduction does not name {g}"
        );
    }
    let mut missing = Vec::new();
    for (path, h) in &helps {
        if path.is_empty() {
            continue;
        }
        let name = format!("`brood {}", path.join(" "));
        // A verb's rows: the first cell starts with its whole path.
        let mine: Vec<&String> = rows
            .iter()
            .map(|(cell, _)| cell)
            .filter(|r| {
                r.strip_prefix(&name)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '`']))
            })
            .collect();
        if mine.is_empty() {
            // A verb with verbs of its own is documented by theirs.
            if h.verbs.is_empty() {
                missing.push(format!("no row for {name}`"));
            }
            continue;
        }
        for f in h.flags().difference(&globals) {
            if !mine.iter().any(|r| holds(r, f)) {
                missing.push(format!("{name}` row lacks {f}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/cli.md is behind the real help:\n{}",
        missing.join("\n")
    );
    // And no row documents a verb that is not there: its first word is a
    // verb of the help, or a hidden one (`shim`) that answers --help.
    let verbs: BTreeSet<&str> = helps[0].1.verbs.iter().map(String::as_str).collect();
    for (r, line) in &rows {
        let first = r
            .trim_start_matches("`brood ")
            .split([' ', '`'])
            .next()
            .unwrap_or("");
        if !verbs.contains(first) {
            #[allow(clippy::disallowed_methods)]
            let o = Command::new(exe())
                .args([first, "--help"])
                .output()
                .unwrap();
            assert!(
                o.status.success() && line.contains("hidden"),
                "docs/cli.md documents {r}, which brood does not list (a hidden verb says so)"
            );
        }
    }
}

#[test]
fn completions_are_scripts_their_shells_read() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, first) in [
        ("bash", "_brood()"),
        ("zsh", "#compdef brood"),
        ("fish", "complete -c brood"),
    ] {
        #[allow(clippy::disallowed_methods)]
        let o = Command::new(exe())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", common::text(&o));
        let script = String::from_utf8(o.stdout).unwrap();
        assert!(script.contains(first), "{shell}: {script}");
        // Every verb and the agent's own flags are offered.
        for word in [
            "spawn",
            "completions",
            "timeout",
            "max-turns",
            "item-timeout",
        ] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
        std::fs::write(dir.path().join(shell), &script).unwrap();
    }
    let bash = dir.path().join("bash");
    #[allow(clippy::disallowed_methods)]
    let n = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(n.status.success(), "bash -n: {}", common::text(&n));
    // Sourced, it registers a completion for brood that offers the verbs.
    #[allow(clippy::disallowed_methods)]
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; complete -p brood; COMP_WORDS=(brood sp); COMP_CWORD=1; COMP_LINE='brood sp'; COMP_POINT=8; _brood brood sp brood; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            bash.display()
        ))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sourcing the bash completion: {}",
        common::text(&o)
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains(" -F _brood brood"), "{said}");
    assert!(
        said.lines().any(|l| l == "spawn"),
        "`brood sp<TAB>` offers: {said}"
    );
    // An unknown shell is a mistake naming the choices.
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(exe())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bash, zsh, fish"),
        "{}",
        common::text(&o)
    );
}
