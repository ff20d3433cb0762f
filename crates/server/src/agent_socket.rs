//! The per-agent sockets' IO side (SPEC 8): `ctx/agent/<name>.sock`, JSON
//! lines, 1 MiB frames; docs/agent-socket.md is the reference. The runtime
//! decides when an agent has a socket and carries out what is asked
//! (`brood_runtime::agent_socket`, `supervisor::sockets`); this module binds
//! it and serves its connections, each a tokio task of its own, so the
//! dispatcher never waits on a client: a connection decides who is calling
//! (peer credentials, through `Supervisor::identify`), reads and checks
//! request lines with the protocol's framer, answers `ping` itself, and hands
//! `send`, `resume` and `cancel` to the dispatcher as a `Request` carrying an
//! `Out` channel, whose frames it writes until a `done` or `error` ends the
//! request.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use brood_core::{AgentName, RunId};
use brood_proto::{Frame, Framer, MAX_LINE};
use brood_runtime::Caller;
use brood_runtime::Supervisor;
use brood_runtime::agent_socket::{Access, MAX_CLIENT_ID, Request, error_frame};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// A connection handed to an agent socket's server task, with who made it.
/// Boxed: a tokio channel makes room for 32 of what it carries when it is
/// made, and every live agent's socket has one (issue 28: 1.8 KiB an agent
/// unboxed, a pointer's 32 boxed).
pub(crate) type Handoff = Box<(UnixStream, Caller)>;

/// The agent's owner, as its spec records it (the `owner` control file).
fn owner(sup: &Supervisor, name: &AgentName) -> Option<Caller> {
    let a = sup.store().agent(sup.tenant(), name).ok().flatten()?;
    let spec = serde_json::from_str::<Value>(&a.spec).ok()?;
    spec["owner"].as_str().and_then(Access::owner_of)
}

fn bind(path: &Path) -> std::io::Result<(UnixListener, u64)> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Whatever is there is a leftover of an earlier run: a run's socket is
    // removed when its stop begins, long before a resumed run is ready.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Bound under a temporary name, given its mode, then renamed into place:
    // a client never finds the socket before it has its final mode.
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(format!(".bind.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let l = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let ino = std::fs::symlink_metadata(path)?.ino();
    Ok((l, ino))
}

/// Binds and serves one agent's socket until `stop`; connections that came
/// through a door arrive on `doors`, their caller already known.
pub(crate) async fn serve(
    sup: Supervisor,
    name: AgentName,
    run: RunId,
    path: PathBuf,
    access: Arc<Access>,
    mut stop: oneshot::Receiver<()>,
    mut doors: mpsc::UnboundedReceiver<Handoff>,
) {
    let (listener, ino) = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(agent = %name, path = %path.display(), error = %e, "binding the agent's socket failed");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(handoff) = doors.recv() => {
                let (stream, caller) = *handoff;
                let (sup, name, run, access) = (sup.clone(), name.clone(), run.clone(), access.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(sup, name, run, access, stream, Some(caller)).await {
                        tracing::debug!(error = %e, "agent socket connection ended");
                    }
                });
            }
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let (sup, name, run, access) = (sup.clone(), name.clone(), run.clone(), access.clone());
                    tokio::spawn(async move {
                        if let Err(e) = connection(sup, name, run, access, stream, None).await {
                            tracing::debug!(error = %e, "agent socket connection ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "accept on the agent's socket failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    // Only our own file: a resumed run may already have bound a new one there.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == ino)
        && let Err(e) = std::fs::remove_file(&path)
    {
        tracing::warn!(path = %path.display(), error = %e, "removing the agent's socket failed");
    }
}

async fn write_frame(wr: &mut OwnedWriteHalf, v: &Value) -> std::io::Result<()> {
    let mut bytes = v.to_string().into_bytes();
    bytes.push(b'\n');
    wr.write_all(&bytes).await
}

fn who(c: &Caller) -> String {
    match c {
        Caller::User { uid } => format!("user:{uid}"),
        Caller::Agent(a) => format!("agent:{a}"),
    }
}

async fn connection(
    sup: Supervisor,
    name: AgentName,
    run: RunId,
    access: Arc<Access>,
    stream: UnixStream,
    through_door: Option<Caller>,
) -> std::io::Result<()> {
    let identified = match through_door {
        // A door is its agent's: whoever holds it is that agent.
        Some(c) => Ok(c),
        None => {
            let cred = stream.peer_cred()?;
            match cred.pid() {
                Some(pid) => sup.identify(pid, cred.uid()).await.map_err(|e| e.message),
                None => Err("the kernel gave no pid for the caller".to_owned()),
            }
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let caller = match identified {
        Ok(c) => c,
        Err(msg) => {
            write_frame(&mut wr, &error_frame(None, &run, "EACCES", &msg)).await?;
            return wr.shutdown().await;
        }
    };
    let allowed =
        access.operator_or_parent(&caller) || owner(&sup, &name).is_some_and(|o| o == caller);
    if !allowed {
        let msg = format!(
            "{} may not use agent {name}'s socket: only its owner, its parent and the operator may",
            who(&caller)
        );
        write_frame(&mut wr, &error_frame(None, &run, "EACCES", &msg)).await?;
        return wr.shutdown().await;
    }
    let mut framer = Framer::new();
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = rd.read(&mut buf).await?;
        if n == 0 {
            framer.finish(&mut frames);
        } else {
            framer.push(&buf[..n], &mut frames);
        }
        let batch: Vec<Frame> = std::mem::take(&mut frames);
        for f in batch {
            match f {
                Frame::TooLong { no, .. } => {
                    let msg = format!("request line {no} is longer than {MAX_LINE} bytes");
                    write_frame(&mut wr, &error_frame(None, &run, "EMSGSIZE", &msg)).await?;
                    return wr.shutdown().await;
                }
                Frame::Line { bytes, .. } if bytes.iter().all(u8::is_ascii_whitespace) => {}
                Frame::Line { bytes, .. } => {
                    request(&sup, &name, &run, &caller, &bytes, &mut wr).await?;
                }
            }
        }
        if n == 0 {
            return Ok(());
        }
    }
}

/// A field that must be a string when present (`null` counts as absent).
fn opt_str(req: &Value, key: &str) -> Result<Option<String>, String> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("{key} must be a string, not {v}")),
    }
}

/// Checks one request line and carries it out; errors in the request are
/// answered with an `error` frame and the connection stays open.
async fn request(
    sup: &Supervisor,
    name: &AgentName,
    run: &RunId,
    caller: &Caller,
    line: &[u8],
    wr: &mut OwnedWriteHalf,
) -> std::io::Result<()> {
    let bad = |id: Option<&str>, m: String| error_frame(id, run, "EINVAL", &m);
    let req = match serde_json::from_slice::<Value>(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(v) => {
            return write_frame(
                wr,
                &bad(None, format!("a request is a JSON object, not {v}")),
            )
            .await;
        }
        Err(e) => return write_frame(wr, &bad(None, format!("request is not JSON: {e}"))).await,
    };
    let Some(op) = req.get("op").and_then(Value::as_str) else {
        return write_frame(wr, &bad(None, "a request needs \"op\", a string".into())).await;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let r = match op {
        "ping" => return write_frame(wr, &json!({"type": "pong"})).await,
        "send" => {
            let id = match req.get("id") {
                Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_CLIENT_ID => {
                    s.clone()
                }
                _ => {
                    let m = format!(
                        "send needs \"id\", a non-empty string of at most {MAX_CLIENT_ID} characters"
                    );
                    return write_frame(wr, &bad(None, m)).await;
                }
            };
            let session = match opt_str(&req, "session") {
                Ok(s) => s,
                Err(m) => return write_frame(wr, &bad(Some(&id), m)).await,
            };
            let Some(input) = req.get("input").and_then(Value::as_str) else {
                let m = "send needs \"input\", a string".to_owned();
                return write_frame(wr, &bad(Some(&id), m)).await;
            };
            Request::Send {
                caller: caller.clone(),
                run: run.clone(),
                id,
                session,
                input: input.to_owned(),
                out: tx,
            }
        }
        "resume" => {
            let session = match opt_str(&req, "session") {
                Ok(s) => s,
                Err(m) => return write_frame(wr, &bad(None, m)).await,
            };
            let after = match req.get("after") {
                None | Some(Value::Null) => 0,
                Some(v) => match v.as_i64() {
                    Some(n) if n >= 0 => n,
                    _ => {
                        let m =
                            format!("after must be a message seq (a whole number >= 0), not {v}");
                        return write_frame(wr, &bad(None, m)).await;
                    }
                },
            };
            Request::Resume {
                run: run.clone(),
                session,
                after,
                out: tx,
            }
        }
        "cancel" => {
            let id = match opt_str(&req, "id") {
                Ok(s) => s,
                Err(m) => return write_frame(wr, &bad(None, m)).await,
            };
            Request::Cancel {
                caller: caller.clone(),
                run: run.clone(),
                id,
                out: tx,
            }
        }
        other => {
            let m = format!("unknown op {other:?}: use send, resume, cancel or ping");
            return write_frame(wr, &bad(None, m)).await;
        }
    };
    if !sup.agent_socket(name.clone(), r) {
        let m = "the supervisor has stopped".to_owned();
        return write_frame(wr, &error_frame(None, run, "EHOSTDOWN", &m)).await;
    }
    stream(rx, run, wr).await
}

/// Writes the dispatcher's frames for one request until its `done` or `error`.
async fn stream(
    mut rx: mpsc::UnboundedReceiver<Value>,
    run: &RunId,
    wr: &mut OwnedWriteHalf,
) -> std::io::Result<()> {
    while let Some(f) = rx.recv().await {
        write_frame(wr, &f).await?;
        if matches!(f["type"].as_str(), Some("done" | "error")) {
            return Ok(());
        }
    }
    // The dispatcher let go without a last word: the run is gone.
    let m = "the agent's run ended before the request was answered";
    write_frame(wr, &error_frame(None, run, "EHOSTDOWN", m)).await
}
