//! What an agent said and wrote (issue 25, "failures say why, where the
//! user is"): `brood logs [-f]` (its output: the transcript's messages for a
//! protocol agent, the result for an exec one; and its log, what it wrote
//! to stderr), and the end of its log that `brood run`, `brood wait` and
//! `brood show` print. Over the API when a daemon serves the root, else
//! from the store and the ctx tree.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use brood_api::{Agent, AgentLog, LogEntry, MessageView};
use brood_core::{AgentName, SessionName};
use serde_json::json;

use crate::remote::{Remote, typed};
use crate::{Exit, api, root_of, unsafe_uid, view};

/// How often `logs -f` looks again.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// The log lines a failure shows.
pub(crate) const TAIL_LINES: usize = 10;

/// Where an agent's records are read from.
pub(crate) enum Source<'a> {
    Api(&'a Remote),
    Local {
        view: brood_runtime::View,
        root: PathBuf,
    },
}

impl<'a> Source<'a> {
    /// The API when a daemon answers for `name`, else the store.
    pub(crate) async fn open(
        r: &'a Remote,
        root: &Option<PathBuf>,
        name: &AgentName,
    ) -> Result<(Source<'a>, Agent)> {
        if let Some(v) = r.read(&format!("/api/agents/{name}")).await? {
            return Ok((Source::Api(r), typed(&v)?));
        }
        let s = Source::local(root_of(root))?;
        let a = s.agent(name).await?;
        Ok((s, a))
    }

    /// The store and ctx tree of `root` (`brood run`'s own, or no daemon's).
    pub(crate) fn local(root: PathBuf) -> Result<Source<'a>> {
        let root_opt = Some(root.clone());
        Ok(Source::Local {
            view: view(&root_opt)?,
            root,
        })
    }

    pub(crate) async fn agent(&self, name: &AgentName) -> Result<Agent> {
        match self {
            Source::Api(r) => typed(&r.call("GET", &format!("/api/agents/{name}"), None).await?),
            Source::Local { view, .. } => Ok(api(view.show(name))?.agent),
        }
    }

    /// The log after byte `after`, or its last `tail` entries.
    pub(crate) async fn log(
        &self,
        name: &AgentName,
        after: u64,
        tail: Option<usize>,
    ) -> Result<AgentLog> {
        match self {
            Source::Api(r) => {
                let q = match tail {
                    Some(t) => format!("tail={t}"),
                    None => format!("after={after}"),
                };
                typed(
                    &r.call("GET", &format!("/api/agents/{name}/log?{q}"), None)
                        .await?,
                )
            }
            Source::Local { root, .. } => {
                let path = brood_runtime::paths::Paths::new(root.clone(), unsafe_uid())
                    .agent_dir(name)
                    .join("log");
                brood_runtime::logs::read(&path, after, tail)
                    .map_err(|e| Exit(1, format!("reading the log {}: {e}", path.display())).into())
            }
        }
    }

    /// The messages of the agent's session after position `after`.
    pub(crate) async fn transcript(&self, a: &Agent, after: i64) -> Result<Vec<MessageView>> {
        match self {
            Source::Api(r) => {
                let t: brood_api::Transcript = typed(
                    &r.call(
                        "GET",
                        &format!("/api/ui/agents/{}/transcript?after={after}", a.name),
                        None,
                    )
                    .await?,
                )?;
                Ok(t.messages)
            }
            Source::Local { view, .. } => {
                let (Ok(name), Ok(session)) =
                    (AgentName::new(&a.name), SessionName::new(&a.session))
                else {
                    return Ok(Vec::new());
                };
                let m = view
                    .store()
                    .messages(view.tenant(), &name, &session)
                    .map_err(|e| Exit(1, format!("reading the transcript of {name}: {e}")))?;
                Ok(m.into_iter()
                    .filter(|m| m.seq > after)
                    .map(|m| MessageView {
                        seq: m.seq,
                        ts_ms: m.ts_ms,
                        run: m.run.to_string(),
                        role: m.role,
                        content: m.content,
                    })
                    .collect())
            }
        }
    }
}

/// The last `n` lines `entries` hold of `run` (every run when `None`).
pub(crate) fn last_lines(entries: &[LogEntry], run: Option<&str>, n: usize) -> Vec<String> {
    let text: String = entries
        .iter()
        .filter(|e| run.is_none_or(|r| e.run == r))
        .map(|e| e.text.as_str())
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| (*l).to_owned())
        .collect()
}

/// The detail without the stderr tail the supervisor appends to some
/// (printed from the log instead, when the log is at hand).
fn detail_alone(detail: &str) -> &str {
    detail
        .split_once("; stderr tail:")
        .map_or(detail, |(d, _)| d)
        .trim_end()
}

/// Why a failed agent failed: its status and reason, the detail, and the
/// end of what it wrote to stderr (from `log`, its current run's).
pub(crate) fn why_failed(a: &Agent, log: Option<&AgentLog>) -> String {
    let mut out = format!("brood: {} {}", a.name, crate::render::status(a));
    let lines = log
        .map(|l| last_lines(&l.entries, Some(&a.run), TAIL_LINES))
        .unwrap_or_default();
    match a.detail.as_deref() {
        Some(d) if lines.is_empty() => out.push_str(&format!(": {}", d.trim_end())),
        Some(d) if !detail_alone(d).is_empty() => out.push_str(&format!(": {}", detail_alone(d))),
        _ => {}
    }
    out.push('\n');
    if !lines.is_empty() {
        out.push_str(&format!(
            "brood: the end of its stderr (ctx/agent/{}.d/log; all of it: brood logs {}):\n",
            a.name, a.name
        ));
        for l in lines {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

/// Prints why each failed agent of `agents` failed, on stderr.
pub(crate) async fn explain_failures(src: &Source<'_>, agents: &[Agent]) {
    for a in agents.iter().filter(|a| a.status == "failed") {
        let log = match AgentName::new(&a.name) {
            Ok(n) => src.log(&n, 0, Some(4 * TAIL_LINES)).await.ok(),
            Err(_) => None,
        };
        eprint!("{}", why_failed(a, log.as_ref()));
    }
}

fn print_message(m: &MessageView) {
    println!("{}: {}", m.role, m.content.trim_end());
}

fn print_log(entries: &[LogEntry]) -> Result<()> {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for e in entries {
        err.write_all(e.text.as_bytes())?;
    }
    err.flush()?;
    Ok(())
}

fn finished(a: &Agent) -> bool {
    matches!(
        a.status.as_str(),
        "completed" | "failed" | "cancelled" | "closed"
    )
}

/// `brood logs [-f] NAME`: the output on stdout, the log on stderr;
/// following, until the agent ends.
pub(crate) async fn logs(
    r: &Remote,
    root: &Option<PathBuf>,
    name: &str,
    follow: bool,
    json_out: bool,
) -> Result<i32> {
    let name =
        AgentName::new(name).map_err(|e| Exit(4, format!("no agent named {name:?} ({e})")))?;
    let (src, mut a) = Source::open(r, root, &name).await?;
    let (mut seq, mut offset) = (0i64, 0u64);
    // Once it ended, one more look after a pause: what the supervisor
    // appended to the log just before the end may land just after it.
    let mut settled = false;
    loop {
        let messages = src.transcript(&a, seq).await?;
        let log = src.log(&name, offset, None).await?;
        seq = messages.last().map_or(seq, |m| m.seq);
        let more = log.next != offset;
        offset = log.next;
        if json_out {
            for m in &messages {
                println!("{}", json!({"message": m}));
            }
            for e in &log.entries {
                println!("{}", json!({"log": e}));
            }
        } else {
            for m in &messages {
                print_message(m);
            }
            print_log(&log.entries)?;
        }
        let done = finished(&a);
        if !follow || (done && settled && messages.is_empty() && !more) {
            break;
        }
        if done {
            if !settled {
                settled = true;
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        } else {
            tokio::time::sleep(FOLLOW_EVERY).await;
            a = src.agent(&name).await?;
        }
    }
    // An exec agent's output is its result (held until it ends).
    if a.protocol == "exec"
        && let Some(res) = &a.result
    {
        if json_out {
            println!("{}", json!({"result": res}));
        } else {
            print!("{res}");
            if !res.is_empty() && !res.ends_with('\n') {
                println!();
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{LogEntry, detail_alone, last_lines};

    fn entry(run: &str, text: &str) -> LogEntry {
        LogEntry {
            ts_ms: 0,
            run: run.into(),
            stream: "stderr".into(),
            text: text.into(),
        }
    }

    #[test]
    fn the_last_lines_of_a_run() {
        let e = [
            entry("a", "old\n"),
            entry("b", "one\ntw"),
            entry("b", "o\nthree\n"),
        ];
        assert_eq!(last_lines(&e, Some("b"), 2), ["two", "three"]);
        assert_eq!(last_lines(&e, None, 10), ["old", "one", "two", "three"]);
    }

    #[test]
    fn the_detail_loses_the_tail_it_repeats() {
        assert_eq!(
            detail_alone("exit code 3; stderr tail: oops"),
            "exit code 3"
        );
        assert_eq!(detail_alone("exit code 3"), "exit code 3");
    }
}
