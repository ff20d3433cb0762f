//! `file_search`: a regular expression over a tree's files, walked by the
//! `ignore` crate (ripgrep's walker: `.gitignore`, `.ignore`, hidden files
//! skipped), at most [`MAX_MATCHES`] matches.

use std::io::{BufRead, BufReader};

use serde_json::Value;

use super::{ToolResult, arg};

const MAX_MATCHES: usize = 200;

pub fn run(args: &Value) -> ToolResult {
    let pattern = arg(args, "pattern")?;
    let re = regex::Regex::new(pattern)
        .map_err(|e| format!("the pattern is not a regular expression: {e}"))?;
    let root = args.get("path").and_then(Value::as_str).unwrap_or(".");
    let mut walk = ignore::WalkBuilder::new(root);
    walk.sort_by_file_name(|a, b| a.cmp(b));
    if let Some(g) = args.get("glob").and_then(Value::as_str) {
        let mut o = ignore::overrides::OverrideBuilder::new(root);
        o.add(g).map_err(|e| format!("glob {g:?}: {e}"))?;
        walk.overrides(o.build().map_err(|e| format!("glob {g:?}: {e}"))?);
    }
    let mut hits = Vec::new();
    let mut files = 0;
    for e in walk.build() {
        let Ok(e) = e else { continue };
        if !e.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        files += 1;
        let Ok(f) = std::fs::File::open(e.path()) else {
            continue;
        };
        for (i, line) in BufReader::new(f).lines().enumerate() {
            let Ok(line) = line else { break }; // not text
            if re.is_match(&line) {
                let shown: String = line.chars().take(200).collect();
                hits.push(format!("{}:{}: {shown}", e.path().display(), i + 1));
                if hits.len() >= MAX_MATCHES {
                    hits.push(format!(
                        "[stopped at {MAX_MATCHES} matches; narrow the pattern or the path]"
                    ));
                    return Ok(hits.join("\n"));
                }
            }
        }
    }
    if hits.is_empty() {
        return Ok(format!(
            "no match for {pattern:?} in {files} files under {root}"
        ));
    }
    Ok(hits.join("\n"))
}
