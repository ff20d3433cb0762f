//! The shape of the workspace (issue 26): in every crate, the top-level
//! modules import each other without cycles, and ARCHITECTURE.md draws the
//! layers they form, as they are.
//!
//! A module's imports are read from its source: every `crate::NAME` (and
//! every name of a `crate::{...}` group), and every `super::` path that
//! climbs to the crate's root. Test modules count too: a test that reaches
//! up is a cycle like any other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's top-level modules and, for each, the top-level modules it uses.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file below `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file below `src` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`); the crate root is empty.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

fn ident_at(s: &str) -> Option<&str> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// The first-level names of the brace group that starts right after `{`
/// at the beginning of `s`.
fn group_names(s: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(s[start..i].trim());
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    names.into_iter().filter_map(ident_at).collect()
}

/// The top-level modules a file's code names, by `crate::` or by `super::`
/// climbing to the root.
fn uses(text: &str, path: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        // Comments name modules too (doc links); they are not imports.
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let before = rest[..i].chars().last();
            let after = &rest[i + "crate::".len()..];
            rest = after;
            // `brood_crate::x` is another crate's path, not this one's.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = after.strip_prefix('{') {
                out.extend(group_names(group).into_iter().map(str::to_owned));
            } else if let Some(name) = ident_at(after) {
                out.insert(name.to_owned());
            }
        }
        let mut rest = code;
        while let Some(i) = rest.find("super::") {
            let before = rest[..i].chars().last();
            let mut after = &rest[i..];
            let mut climbs = 0;
            while let Some(a) = after.strip_prefix("super::") {
                climbs += 1;
                after = a;
            }
            rest = after;
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            if climbs == path.len() {
                if let Some(group) = after.strip_prefix('{') {
                    out.extend(group_names(group).into_iter().map(str::to_owned));
                } else if let Some(name) = ident_at(after) {
                    out.insert(name.to_owned());
                }
            }
        }
    }
    out
}

/// The graph of one crate's top-level modules.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    sources(src, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(src, f).first().cloned())
        .collect();
    let mut g: Graph = tops.iter().map(|t| (t.clone(), BTreeSet::new())).collect();
    for f in &files {
        let path = module_path(src, f);
        let Some(top) = path.first() else { continue };
        let text = std::fs::read_to_string(f).unwrap();
        for used in uses(&text, &path) {
            if used != *top && tops.contains(&used) {
                g.get_mut(top).unwrap().insert(used);
            }
        }
    }
    g
}

/// The cycles of a graph, each as its modules (strongly connected
/// components of more than one module, or a module that uses itself).
fn cycles(g: &Graph) -> Vec<BTreeSet<String>> {
    // Reachability by a walk from each module: fine for a few dozen.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = g[from].iter().map(String::as_str).collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m.to_owned()) {
                todo.extend(g[m].iter().map(String::as_str));
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<String>> =
        g.keys().map(|m| (m.as_str(), reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for m in g.keys() {
        if !reach[m.as_str()].contains(m) || out.iter().any(|c| c.contains(m)) {
            continue;
        }
        let circle: BTreeSet<String> = g
            .keys()
            .filter(|n| reach[m.as_str()].contains(*n) && reach[n.as_str()].contains(m))
            .cloned()
            .collect();
        out.push(circle);
    }
    out
}

/// The floors of an acyclic graph: a module's floor is one above the
/// highest floor of what it uses; floor 0 uses no other module.
fn floors(g: &Graph) -> BTreeMap<usize, Vec<String>> {
    fn floor(m: &str, g: &Graph, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(f) = memo.get(m) {
            return *f;
        }
        // A module met again on its own way down (a cycle, which the other
        // test reports) counts as floor 0 there, so the drawing still ends.
        memo.insert(m.to_owned(), 0);
        let f = g[m]
            .iter()
            .map(|u| floor(u, g, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(m.to_owned(), f);
        f
    }
    let mut memo = BTreeMap::new();
    let mut out: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for m in g.keys() {
        out.entry(floor(m, g, &mut memo))
            .or_default()
            .push(m.clone());
    }
    out
}

fn crates() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(workspace().join("crates")).unwrap() {
        let dir = e.unwrap().path();
        let src = dir.join("src");
        if src.is_dir() {
            out.push((dir.file_name().unwrap().to_string_lossy().into_owned(), src));
        }
    }
    out.sort();
    out
}

/// The layers of every crate with more than one module, as ARCHITECTURE.md
/// draws them: a crate a line, its floors from the bottom, `<` between.
fn drawing() -> String {
    let mut out = String::new();
    for (name, src) in crates() {
        let g = graph(&src);
        if g.len() < 2 {
            continue;
        }
        let line: Vec<String> = floors(&g).into_values().map(|ms| ms.join(" ")).collect();
        out.push_str(&format!("{name}: {}\n", line.join(" < ")));
    }
    out
}

#[test]
fn no_crate_has_a_cycle_among_its_top_level_modules() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        let g = graph(&src);
        for c in cycles(&g) {
            let arrows: Vec<String> = c
                .iter()
                .flat_map(|m| {
                    g[m].iter()
                        .filter(|u| c.contains(*u))
                        .map(move |u| format!("{m} -> {u}"))
                })
                .collect();
            found.push(format!("{name}: {}", arrows.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "top-level modules that import each other in a circle:\n{}",
        found.join("\n")
    );
}

#[test]
fn architecture_draws_the_layers_as_they_are() {
    let doc = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let begin = "<!-- layers: begin -->\n```text\n";
    let end = "```\n<!-- layers: end -->";
    let drawn = doc
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(d, _)| d)
        .expect("ARCHITECTURE.md has a layers block between <!-- layers: begin --> and <!-- layers: end -->");
    let now = drawing();
    assert_eq!(
        drawn, now,
        "ARCHITECTURE.md's layers block is not the code's; it is now:\n{now}"
    );
}

#[test]
fn the_reader_sees_imports_the_way_rust_resolves_them() {
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let text = "use crate::{api::{A, B}, limits, self};\nuse super::super::view::View;\n\
                let x = brood_crate::x; // crate::comment\nuse super::sibling;\n";
    let got = uses(text, &path(&["supervisor", "jobs"]));
    let want: BTreeSet<String> = ["api", "limits", "self", "view"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);
    // From a top-level file, `super::` is the root already.
    let got = uses("use super::paths::Paths;", &path(&["view"]));
    assert!(got.contains("paths"), "{got:?}");
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_owned()].into());
    g.insert("b".into(), ["c".to_owned()].into());
    g.insert("c".into(), ["a".to_owned()].into());
    g.insert("d".into(), ["a".to_owned()].into());
    let c = cycles(&g);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].len(), 3, "{c:?}");
}
