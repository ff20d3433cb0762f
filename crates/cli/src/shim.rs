//! `brood shim NAME`: what an agent object's shim runs, one `send` on the
//! agent's socket, its reply streamed (docs/agent-socket.md).

use super::{Exit, root_of, unsafe_uid};
use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use serde_json::Value;
use serde_json::json;
use std::path::PathBuf;

/// `brood shim NAME [--session S] [--] [TEXT...]` (the agent's shim, SPEC 3):
/// one `send` on `ctx/agent/NAME.sock` (SPEC 8) with a fresh client id, the
/// reply's deltas printed as they stream. Exit 0 on `done` (unless the run
/// failed), 1 on an `error` frame, 2 when the agent has no socket (not live, or
/// an agent that takes no input).
pub(crate) async fn shim(
    root: &Option<PathBuf>,
    name: &str,
    session: Option<String>,
    text: Vec<String>,
) -> Result<i32> {
    use std::io::Write;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let name = brood_core::AgentName::new(name)
        .map_err(|e| Exit(2, format!("{name:?} is not an agent name: {e}")))?;
    let sock = brood_runtime::paths::Paths::new(root_of(root), unsafe_uid()).agent_socket(&name);
    let unreachable = |e: &dyn std::fmt::Display| {
        Exit(
            2,
            format!(
                "agent {name} is not live or takes no input: nothing answers on {} ({e})",
                sock.display()
            ),
        )
    };
    // Inside an agent (no --root given), through its door: an agent whose
    // policy is not `network: all` may not make a socket of its own.
    let stream = match brood_server::door::inherited().filter(|_| root.is_none()) {
        Some(door) => brood_server::door::open(door, &format!("sock:{name}"))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::UnixStream::from_std)
            .map_err(|e| unreachable(&e))?,
        None => tokio::net::UnixStream::connect(&sock)
            .await
            .map_err(|e| unreachable(&e))?,
    };
    let input = if text.is_empty() {
        // Blocking is fine here: this command does nothing else meanwhile.
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("reading the input from stdin")?;
        s
    } else {
        text.join(" ")
    };
    let id = brood_runtime::agent_socket::client_id();
    let req = json!({"op": "send", "id": id, "session": session, "input": input});
    let (rd, mut wr) = stream.into_split();
    // A refusal (EACCES) may be written and the connection closed before the
    // request is: a failed write is reported only if no answer can be read.
    let wrote = wr.write_all(format!("{req}\n").as_bytes()).await;
    let mut lines = BufReader::new(rd).lines();
    let mut out = std::io::stdout();
    let mut printed = false;
    let mut last_newline = true;
    loop {
        let line = match lines.next_line().await {
            Ok(Some(l)) => l,
            Ok(None) => break,
            // A reset after a refusal: what was read decides, as at end of file.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => {
                return Err(e).with_context(|| format!("reading from {}", sock.display()));
            }
        };
        let f: Value = serde_json::from_str(&line)
            .with_context(|| format!("a reply on {} is not JSON: {line}", sock.display()))?;
        let shown = match f["type"].as_str() {
            Some("delta") => f["text"].as_str(),
            Some("message") if !printed && f["role"].as_str() != Some("user") => {
                f["content"].as_str()
            }
            _ => None,
        };
        if let Some(t) = shown {
            out.write_all(t.as_bytes())?;
            out.flush()?;
            printed = true;
            last_newline = t.ends_with('\n');
            continue;
        }
        match f["type"].as_str() {
            Some("error") => {
                bail!(Exit(
                    1,
                    format!(
                        "{}: {}",
                        f["code"].as_str().unwrap_or("EIO"),
                        f["message"].as_str().unwrap_or("")
                    )
                ));
            }
            Some("done") => {
                if printed && !last_newline {
                    println!();
                }
                let status = f["status"].as_str().unwrap_or("");
                if status == "failed" {
                    bail!(Exit(1, format!("agent {name}'s run failed")));
                }
                return Ok(0);
            }
            _ => {}
        }
    }
    if let Err(e) = wrote {
        bail!(Exit(
            1,
            format!("writing the request to {}: {e}", sock.display())
        ));
    }
    bail!(Exit(
        1,
        format!("agent {name}'s socket closed before the reply ended (its run may have ended)")
    ))
}
