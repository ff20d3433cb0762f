//! The file tools: read, write, edit (exact replacement), patch (a unified
//! diff, applied by `diffy`), delete, rename, list, tree (the `ignore`
//! crate's walker, which honours `.gitignore` and `.ignore`), info.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde_json::Value;

use super::{ToolResult, arg, opt_u64, os_error};

pub fn run(name: &str, args: &Value) -> ToolResult {
    match name {
        "file_read" => read(args),
        "file_write" => {
            let path = arg(args, "path")?;
            let content = arg(args, "content")?;
            std::fs::write(path, content).map_err(|e| os_error("writing", path, &e))?;
            Ok(format!("wrote {} bytes to {path}", content.len()))
        }
        "file_edit" => edit(args),
        "file_patch" => patch(args),
        "file_delete" => {
            let path = arg(args, "path")?;
            let m = std::fs::symlink_metadata(path).map_err(|e| os_error("deleting", path, &e))?;
            if m.is_dir() {
                return Err(format!(
                    "{path} is a directory; file_delete deletes files only"
                ));
            }
            std::fs::remove_file(path).map_err(|e| os_error("deleting", path, &e))?;
            Ok(format!("deleted {path}"))
        }
        "file_rename" => {
            let (from, to) = (arg(args, "from")?, arg(args, "to")?);
            std::fs::rename(from, to)
                .map_err(|e| os_error("renaming", &format!("{from} to {to}"), &e))?;
            Ok(format!("renamed {from} to {to}"))
        }
        "file_list" => list(args),
        "file_tree" => tree(args),
        "file_info" => {
            let path = arg(args, "path")?;
            let m = std::fs::symlink_metadata(path).map_err(|e| os_error("reading", path, &e))?;
            Ok(format!(
                "{path}: {}, {} bytes, mode {:o}, modified {} (seconds since the epoch)",
                kind(&m),
                m.len(),
                m.permissions().mode() & 0o7777,
                m.mtime()
            ))
        }
        other => Err(format!("no file tool {other:?}")),
    }
}

fn kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_file() {
        "file"
    } else {
        "special file"
    }
}

fn read(args: &Value) -> ToolResult {
    let path = arg(args, "path")?;
    let bytes = std::fs::read(path).map_err(|e| os_error("reading", path, &e))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text"))?;
    let offset = opt_u64(args, "offset")?.unwrap_or(1).max(1) as usize;
    let limit = opt_u64(args, "limit")?;
    if offset == 1 && limit.is_none() {
        return Ok(text);
    }
    let lines: Vec<&str> = text.lines().collect();
    let end = limit.map_or(lines.len(), |l| (offset - 1 + l as usize).min(lines.len()));
    if offset > lines.len() {
        return Err(format!(
            "{path} has {} lines; offset {offset} is past its end",
            lines.len()
        ));
    }
    Ok(lines[offset - 1..end].join("\n"))
}

fn edit(args: &Value) -> ToolResult {
    let path = arg(args, "path")?;
    let old = arg(args, "old")?;
    let new = arg(args, "new")?;
    let all = args.get("all").and_then(Value::as_bool).unwrap_or(false);
    if old.is_empty() {
        return Err("`old` is empty; give the exact text to replace".into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| os_error("reading", path, &e))?;
    let n = text.matches(old).count();
    match (n, all) {
        (0, _) => return Err(format!("the text to replace does not occur in {path}")),
        (n, false) if n > 1 => {
            return Err(format!(
                "the text to replace occurs {n} times in {path}; give more context so it occurs once, or set all"
            ));
        }
        _ => {}
    }
    let out = if all {
        text.replace(old, new)
    } else {
        text.replacen(old, new, 1)
    };
    std::fs::write(path, out).map_err(|e| os_error("writing", path, &e))?;
    Ok(format!(
        "replaced {n} occurrence{} in {path}",
        if n == 1 { "" } else { "s" }
    ))
}

fn patch(args: &Value) -> ToolResult {
    let path = arg(args, "path")?;
    let text = arg(args, "patch")?;
    let p = diffy::Patch::from_str(text)
        .map_err(|e| format!("the patch is not a unified diff: {e}"))?;
    // diffy reads any text as a patch; one without a hunk changes nothing.
    if p.hunks().is_empty() {
        return Err("the patch has no hunk (no `@@ -a,b +c,d @@` line): give a unified diff as `diff -u` writes it".into());
    }
    let before = std::fs::read_to_string(path).map_err(|e| os_error("reading", path, &e))?;
    let after = diffy::apply(&before, &p)
        .map_err(|e| format!("the patch does not apply to {path}: {e}"))?;
    std::fs::write(path, &after).map_err(|e| os_error("writing", path, &e))?;
    Ok(format!("patched {path} ({} hunks)", p.hunks().len()))
}

fn list(args: &Value) -> ToolResult {
    let path = args.get("path").and_then(Value::as_str).unwrap_or(".");
    let rd = std::fs::read_dir(path).map_err(|e| os_error("listing", path, &e))?;
    let mut rows = Vec::new();
    for e in rd {
        let e = e.map_err(|e| os_error("listing", path, &e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        match e.metadata() {
            Ok(m) if m.is_dir() => rows.push(format!("{name}/")),
            Ok(m) => rows.push(format!("{name}\t{} bytes", m.len())),
            Err(_) => rows.push(format!("{name}\t(unreadable)")),
        }
    }
    rows.sort();
    if rows.is_empty() {
        return Ok(format!("{path} is empty"));
    }
    Ok(rows.join("\n"))
}

fn tree(args: &Value) -> ToolResult {
    let path = args.get("path").and_then(Value::as_str).unwrap_or(".");
    let depth = opt_u64(args, "depth")?.unwrap_or(3) as usize;
    if !Path::new(path).is_dir() {
        return Err(format!(
            "{path} is not a directory (or this agent may not see it)"
        ));
    }
    let mut out = Vec::new();
    for e in ignore::WalkBuilder::new(path)
        .max_depth(Some(depth))
        .sort_by_file_name(|a, b| a.cmp(b))
        .build()
    {
        match e {
            Ok(e) if e.depth() == 0 => out.push(format!("{path}/")),
            Ok(e) => {
                let indent = "  ".repeat(e.depth());
                let name = e.file_name().to_string_lossy();
                let dir = e.file_type().is_some_and(|t| t.is_dir());
                out.push(format!("{indent}{name}{}", if dir { "/" } else { "" }));
            }
            Err(e) => out.push(format!("  ({e})")),
        }
    }
    Ok(out.join("\n"))
}
