//! The command blocks of a markdown page as the walk-through test reads them
//! (docs/decisions/cli-and-docs.md "Walk-throughs that run"): a fenced block in `sh`,
//! `bash`, `shell` or `console` is commands to run, unless the line right
//! before its fence is `<!-- not run: REASON -->`; every other fence (`text`,
//! `json`, a bare one, …) is shown, never run. In a `console` block only the
//! lines after a `$ ` prompt are commands (and their `\` continuations); the
//! rest is what they print.

/// The languages whose blocks are commands.
const COMMANDS: &[&str] = &["sh", "bash", "shell", "console"];

/// How a block is marked not to run; the reason follows the colon.
pub const NOT_RUN: &str = "<!-- not run:";

/// A block of commands, in page order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Commands to run: each source line with its line number (from 1).
    Run {
        fence: usize,
        lines: Vec<(usize, String)>,
    },
    /// A command block marked not to run, and why.
    NotRun { fence: usize, reason: String },
}

/// A fence that opens or closes a block: its indentation, its marker
/// (three or more backticks or tildes) and its info string.
struct Fence<'a> {
    indent: usize,
    marker: &'a str,
    info: &'a str,
}

fn fence(line: &str) -> Option<Fence<'_>> {
    let body = line.trim_start_matches(' ');
    let indent = line.len() - body.len();
    let ch = body.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = body.chars().take_while(|c| *c == ch).count();
    if n < 3 {
        return None;
    }
    Some(Fence {
        indent,
        marker: &body[..n],
        info: body[n..].trim(),
    })
}

/// `Some(Ok(reason))` for a well-formed marker, `Some(Err(why))` for a line
/// that tries to be one and is not, `None` for any other line.
fn marker(line: &str) -> Option<Result<String, String>> {
    let t = line.trim();
    if !(t.starts_with("<!--") && t.to_ascii_lowercase().contains("not run")) {
        return None;
    }
    let Some(rest) = t.strip_prefix(NOT_RUN) else {
        return Some(Err(format!(
            "write the marker as `{NOT_RUN} REASON -->`, not `{t}`"
        )));
    };
    let Some(reason) = rest.strip_suffix("-->") else {
        return Some(Err(format!("the marker `{t}` does not end with `-->`")));
    };
    let reason = reason.trim();
    if reason.is_empty() {
        return Some(Err(format!(
            "the marker `{t}` gives no reason: say why the block cannot run"
        )));
    }
    Some(Ok(reason.to_owned()))
}

/// Every command block of `page`, or the first thing wrong with its fences
/// or markers (with its line number).
pub fn blocks(page: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let n = i + 1;
        let Some(open) = fence(lines[i]) else {
            if let Some(m) = marker(lines[i]) {
                let next = lines.get(i + 1).and_then(|l| fence(l));
                let commands = next
                    .as_ref()
                    .is_some_and(|f| COMMANDS.contains(&language(f.info)));
                m.map_err(|e| format!("line {n}: {e}"))?;
                if !commands {
                    return Err(format!(
                        "line {n}: a not-run marker must be the line right before a \
                         ```sh, ```bash, ```shell or ```console fence"
                    ));
                }
            }
            i += 1;
            continue;
        };
        let close = (i + 1..lines.len())
            .find(|&j| {
                fence(lines[j]).is_some_and(|f| {
                    f.info.is_empty()
                        && f.marker.starts_with(&open.marker[..1])
                        && f.marker.len() >= open.marker.len()
                })
            })
            .ok_or_else(|| format!("line {n}: the fence {} is never closed", open.marker))?;
        let lang = language(open.info);
        if COMMANDS.contains(&lang) {
            let mark = if i > 0 { marker(lines[i - 1]) } else { None };
            let body: Vec<(usize, String)> = (i + 1..close)
                .map(|j| (j + 1, unindent(lines[j], open.indent)))
                .collect();
            out.push(match mark {
                Some(Ok(reason)) => Block::NotRun { fence: n, reason },
                Some(Err(e)) => return Err(format!("line {}: {e}", n - 1)),
                None => {
                    let lines = if lang == "console" {
                        prompted(&body)
                    } else {
                        body
                    };
                    if lines.iter().all(|(_, l)| l.trim().is_empty()) {
                        return Err(format!(
                            "line {n}: a ```{lang} block with no command (a `console` block \
                             runs only its `$ ` lines)"
                        ));
                    }
                    Block::Run { fence: n, lines }
                }
            });
        }
        i = close + 1;
    }
    Ok(out)
}

fn language(info: &str) -> &str {
    info.split(|c: char| c.is_whitespace() || c == ',' || c == '{')
        .next()
        .unwrap_or("")
}

/// A block's line without the indentation of its fence (a block inside a
/// list item is indented as the item is).
fn unindent(line: &str, indent: usize) -> String {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    line[spaces.min(indent)..].to_owned()
}

/// A console block's commands: the `$ ` lines, each with the lines its
/// trailing backslashes continue onto; everything else is output.
fn prompted(body: &[(usize, String)]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut continued = false;
    for (n, l) in body {
        let cmd = if continued {
            Some(l.as_str())
        } else {
            l.strip_prefix("$ ")
        };
        continued = false;
        if let Some(c) = cmd {
            continued = c.trim_end().ends_with('\\');
            out.push((*n, c.to_owned()));
        }
    }
    out
}

/// A line's shell words before any comment, roughly (quotes are honoured,
/// so a `#` inside them is kept).
pub fn code_part(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && prev.is_whitespace() => return &line[..i],
            None => {}
        }
        prev = c;
    }
    line
}

/// Whether a line starts `brood … serve` and how: `Some(true)` in the
/// background (it ends with `&`), `Some(false)` in the foreground.
pub fn daemon(line: &str) -> Option<bool> {
    let code = code_part(line).trim();
    let words: Vec<&str> = code.split_whitespace().collect();
    // `brood` as a command: the line's first word, or the first after a
    // separator (`a; brood serve &`).
    let brood = words.iter().enumerate().position(|(i, w)| {
        *w == "brood" && (i == 0 || [";", "&&", "||", "|"].contains(&words[i - 1]))
    })?;
    // The verb is the first word after `brood` that is not an option or an
    // option's value (`--root DIR serve`).
    let mut k = brood + 1;
    while k < words.len() && words[k].starts_with('-') {
        k += if words[k].contains('=') { 1 } else { 2 };
    }
    if words.get(k) != Some(&"serve") {
        return None;
    }
    Some(code.ends_with('&') && !code.ends_with("&&"))
}
