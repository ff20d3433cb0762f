//! Lowering a policy's `files` rules into what landlock can express.
//!
//! Landlock only ever *grants*: a rule gives rights over a whole hierarchy, and
//! rights are the union of every rule that covers a path. A policy, though, says
//! "the deepest rule decides", so `/ rw` with `/secret hidden` means everything but
//! `/secret`. That cannot be one landlock rule; it becomes grants on every sibling
//! along the way from `/` down to `/secret`, read from the filesystem when the
//! agent starts. Entries created later in those directories are not covered, which
//! fails closed (they are inaccessible), never open.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A file mode as the lowering sees it (`hidden < ro < rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Hidden,
    Ro,
    Rw,
}

/// Turns "deepest rule decides" rules into landlock-style grants whose union gives
/// every path exactly its rule's mode. `rules` are absolute, normalised paths.
pub fn grants(rules: &[(PathBuf, Access)]) -> Vec<(PathBuf, Access)> {
    let map: BTreeMap<PathBuf, Access> = rules.iter().cloned().collect();
    let mut out = Vec::new();
    for (path, mode) in &map {
        if *mode == Access::Hidden {
            continue;
        }
        // Deeper rules that must see less than this one: their subtrees are carved
        // out by granting the siblings along the way instead of `path` itself.
        let lower: Vec<&PathBuf> = map
            .iter()
            .filter(|(p, m)| *p != path && p.starts_with(path) && **m < *mode)
            .map(|(p, _)| p)
            .collect();
        if lower.is_empty() {
            out.push((path.clone(), *mode));
        } else {
            expand(path, *mode, &lower, &map, &mut out);
        }
    }
    out
}

fn expand(
    dir: &Path,
    mode: Access,
    lower: &[&PathBuf],
    map: &BTreeMap<PathBuf, Access>,
    out: &mut Vec<(PathBuf, Access)>,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        // Not a directory we can list: nothing below can be carved out, so grant
        // nothing rather than too much.
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for e in entries {
        if map.contains_key(&e) {
            // It has a rule of its own, lowered on its own turn: the deepest rule
            // decides, so it inherits nothing from this one.
            continue;
        }
        if lower.iter().any(|l| l.starts_with(&e)) {
            // A carved-out path lies inside: go one level down (never through a
            // symlink, which would grant its target instead).
            let is_dir = std::fs::symlink_metadata(&e)
                .map(|m| m.file_type().is_dir())
                .unwrap_or(false);
            if is_dir {
                expand(&e, mode, lower, map, out);
            }
        } else {
            out.push((e, mode));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_by_grants(g: &[(PathBuf, Access)], p: &Path) -> Access {
        g.iter()
            .filter(|(gp, _)| p.starts_with(gp))
            .map(|(_, m)| *m)
            .max()
            .unwrap_or(Access::Hidden)
    }

    #[test]
    fn a_hidden_path_under_a_writable_tree_is_carved_out() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for sub in ["a/secret", "a/open", "a/secret2/x", "b"] {
            std::fs::create_dir_all(r.join(sub)).unwrap();
        }
        std::fs::write(r.join("a/file"), "x").unwrap();
        let rules = vec![
            (r.to_path_buf(), Access::Rw),
            (r.join("a/secret"), Access::Hidden),
            (r.join("a/secret2"), Access::Ro),
            (r.join("a/secret2/x"), Access::Rw),
        ];
        let g = grants(&rules);
        assert_eq!(mode_by_grants(&g, &r.join("a/secret")), Access::Hidden);
        assert_eq!(mode_by_grants(&g, &r.join("a/secret/deep")), Access::Hidden);
        assert_eq!(mode_by_grants(&g, &r.join("a/secret2")), Access::Ro);
        assert_eq!(mode_by_grants(&g, &r.join("a/secret2/x")), Access::Rw);
        assert_eq!(mode_by_grants(&g, &r.join("a/open")), Access::Rw);
        assert_eq!(mode_by_grants(&g, &r.join("a/file")), Access::Rw);
        assert_eq!(mode_by_grants(&g, &r.join("b/new")), Access::Rw);
        // No grant covers the carved directory's parent as a whole.
        assert!(!g.iter().any(|(p, _)| p == &r.join("a") || p == r));
    }

    #[test]
    fn without_lower_rules_a_rule_is_one_grant() {
        let g = grants(&[
            (PathBuf::from("/usr"), Access::Ro),
            (PathBuf::from("/tmp/w"), Access::Rw),
        ]);
        assert_eq!(
            g,
            vec![
                (PathBuf::from("/tmp/w"), Access::Rw),
                (PathBuf::from("/usr"), Access::Ro)
            ]
        );
    }
}
