//! The agent's tools, run in the agent's own process, so its sandbox
//! (landlock, the limits, the namespaces) holds for them as for everything
//! else it does: a path the policy hides is refused by the kernel, and the
//! model is told so. Every result is text for the model; a failure is a
//! result too ("error: ..."), and the agent goes on. A result longer than
//! [`MAX_RESULT`] is cut with a note saying so.

mod brood;
mod exec;
mod files;
mod search;
mod web;

#[cfg(test)]
mod tests;

use serde_json::{Value, json};

use crate::io::{Halt, Io};
use crate::provider::ToolSpec;
use crate::settings::Settings;

/// The most text a tool result gives the model.
pub const MAX_RESULT: usize = 32 * 1024;

/// A tool's failure, told to the model.
pub type ToolResult = Result<String, String>;

/// Cuts `text` to [`MAX_RESULT`] bytes (on a character boundary) with a note.
pub fn cap(text: String) -> String {
    if text.len() <= MAX_RESULT {
        return text;
    }
    let mut end = MAX_RESULT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[cut: {} more bytes not shown; ask for less (a narrower path, an offset and limit, a tighter pattern)]",
        &text[..end],
        text.len() - end
    )
}

/// The JSON Schema of a tool's arguments.
fn schema(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

/// Every tool's offer to the model.
pub fn spec(name: &str) -> Option<ToolSpec> {
    let s = |v: &str| json!({"type": "string", "description": v});
    let n = |v: &str| json!({"type": "integer", "minimum": 0, "description": v});
    let (description, parameters) = match name {
        "file_read" => (
            "Read a text file (optionally from line `offset`, at most `limit` lines).",
            schema(
                json!({"path": s("the file"), "offset": n("first line, from 1"), "limit": n("lines at most")}),
                &["path"],
            ),
        ),
        "file_write" => (
            "Write a file (created or replaced) with `content`.",
            schema(
                json!({"path": s("the file"), "content": s("the whole new content")}),
                &["path", "content"],
            ),
        ),
        "file_edit" => (
            "Replace the exact text `old` with `new` in a file. `old` must occur exactly once unless `all` is true.",
            schema(
                json!({"path": s("the file"), "old": s("the exact text to replace"), "new": s("its replacement"), "all": {"type": "boolean"}}),
                &["path", "old", "new"],
            ),
        ),
        "file_patch" => (
            "Apply a unified diff (as `diff -u` writes it) to one file.",
            schema(
                json!({"path": s("the file"), "patch": s("the unified diff")}),
                &["path", "patch"],
            ),
        ),
        "file_delete" => (
            "Delete a file (not a directory).",
            schema(json!({"path": s("the file")}), &["path"]),
        ),
        "file_rename" => (
            "Rename or move a file.",
            schema(
                json!({"from": s("the file"), "to": s("its new path")}),
                &["from", "to"],
            ),
        ),
        "file_list" => (
            "List a directory: each entry's kind and size.",
            schema(json!({"path": s("the directory (default .)")}), &[]),
        ),
        "file_tree" => (
            "The tree under a directory, honouring .gitignore and .ignore files.",
            schema(
                json!({"path": s("the directory (default .)"), "depth": n("levels (default 3)")}),
                &[],
            ),
        ),
        "file_info" => (
            "A path's kind, size, mode and modification time.",
            schema(json!({"path": s("the path")}), &["path"]),
        ),
        "file_search" => (
            "Search file contents with a regular expression, honouring .gitignore and .ignore files; answers `path:line: text`.",
            schema(
                json!({"pattern": s("a regular expression"), "path": s("where to search (default .)"), "glob": s("only files whose name matches, e.g. *.rs")}),
                &["pattern"],
            ),
        ),
        "shell" => (
            "Run a shell command (sh -c); answers its exit status and output.",
            schema(
                json!({"command": s("the command"), "timeout_s": n("seconds (default and most: the configured limit)")}),
                &["command"],
            ),
        ),
        "code_exec" => (
            "Run code in an interpreter: python, sh, bash or node.",
            schema(
                json!({"language": {"type": "string", "enum": ["python", "sh", "bash", "node"]}, "code": s("the program"), "timeout_s": n("seconds")}),
                &["language", "code"],
            ),
        ),
        "web_search" => (
            "Search the web; answers the results.",
            schema(json!({"query": s("what to search for")}), &["query"]),
        ),
        "create" => (
            "Create a child agent (another brood agent) with a task, a type and capabilities no wider than yours. Answers its name; a refusal names its code (ask for less and try again).",
            schema(
                json!({
                "task": s("what the child must do"),
                "type": {"type": "string", "enum": ["explore", "general", "plan", "code", "research"]},
                "capabilities": {"type": "object", "additionalProperties": false, "properties": {
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "cost_limit": {"type": "number", "minimum": 0},
                    "files": {"type": "array", "items": {"type": "object", "properties": {"path": {"type": "string"}, "mode": {"type": "string", "enum": ["rw", "ro", "hidden"]}}, "required": ["path", "mode"]}},
                    "network": {"description": "\"none\", \"all\" or {\"connect\": [ports]}"},
                    "create_limit": {"type": "integer", "minimum": 0},
                    "depth_limit": {"type": "integer", "minimum": 0},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}, "description": "the variables passed to the child (default: yours)"},
                    "secrets": {"type": "array", "items": {"type": "string"}, "description": "the names of your secret variables the child gets, with your values (default: all of yours; [] for none)"}}},
                "customer": s("who receives the result (default: you)"),
                "name": s("the child's name (brood picks one when absent)"),
                "placement": {"type": "object", "additionalProperties": {"type": "string"}, "description": "in a cluster: run on a node with these labels (default: your node)"}}),
                &["task"],
            ),
        ),
        "send" => (
            "Send a message to one of your children.",
            schema(
                json!({"name": s("the child"), "text": s("the message")}),
                &["name", "text"],
            ),
        ),
        "wait" => (
            "Wait for children to finish (at most `timeout_s`); answers each one's status and result.",
            schema(
                json!({"names": {"type": "array", "items": {"type": "string"}}, "timeout_s": {"type": "number", "minimum": 0}}),
                &["names"],
            ),
        ),
        "close" => (
            "Release a finished child.",
            schema(json!({"name": s("the child")}), &["name"]),
        ),
        "resume" => (
            "Start a finished child again on its session, with a new message.",
            schema(
                json!({"name": s("the child"), "text": s("the new instruction")}),
                &["name"],
            ),
        ),
        _ => return None,
    };
    Some(ToolSpec {
        name: crate::settings::ALL_TOOLS.iter().find(|t| **t == name)?,
        description,
        parameters,
    })
}

/// Runs one call. A `Halt` (cancel, the supervisor gone) stops the agent;
/// anything else is the tool's answer.
pub fn run(name: &str, arguments: &str, settings: &Settings, io: &mut Io) -> Result<String, Halt> {
    if !settings.tools.iter().any(|t| t == name) {
        let why = if name == "web_search" && settings.search_url.is_none() {
            "web_search needs a search endpoint (search_url in the agent configuration), and none is configured".to_owned()
        } else {
            format!(
                "the tool {name:?} is not offered to this agent (its type and policy do not grant it)"
            )
        };
        return Ok(format!("error: {why}"));
    }
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v @ Value::Object(_)) => v,
        Ok(v) => {
            return Ok(format!(
                "error: {name}: the arguments must be a JSON object, not {v}"
            ));
        }
        Err(e) => return Ok(format!("error: {name}: the arguments are not JSON ({e})")),
    };
    if matches!(name, "create" | "send" | "wait" | "close" | "resume") {
        return brood::run(name, &args, settings, io);
    }
    Ok(local(name, &args, settings, &io.cancel))
}

/// A tool that needs no supervisor, run: its answer, an error included.
pub fn local(
    name: &str,
    args: &Value,
    settings: &Settings,
    cancel: &crate::io::CancelFlag,
) -> String {
    let r = match name {
        "file_read" | "file_write" | "file_edit" | "file_patch" | "file_delete" | "file_rename"
        | "file_list" | "file_tree" | "file_info" => files::run(name, args),
        "file_search" => search::run(args),
        "shell" | "code_exec" => exec::run(name, args, settings, cancel),
        "web_search" => web::run(args, settings),
        other => Err(format!("no tool {other:?} here")),
    };
    cap(match r {
        Ok(t) => t,
        Err(e) => format!("error: {name}: {e}"),
    })
}

/// A required string argument.
fn arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, String> {
    match args.get(key) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(format!("missing argument {key:?}")),
        Some(v) => Err(format!("argument {key:?} must be a string, not {v}")),
    }
}

/// An optional whole-number argument.
fn opt_u64(args: &Value, key: &str) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("argument {key:?} must be a whole number, not {v}")),
    }
}

/// An OS error as the model should read it: a refusal by the sandbox says so.
fn os_error(what: &str, path: &str, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("{what} {path}: permission denied (this agent's sandbox does not grant it)")
        }
        _ => format!("{what} {path}: {e}"),
    }
}
