//! The control socket (`$BROOD_ROOT/brood.sock`, mode 0600): JSON lines.
//!
//! A client writes one request `{"op": <verb>, "args": {...}}` and reads one reply
//! `{"ok": true, "result": ...}` or `{"ok": false, "error": {"code", "reason",
//! "message"}}`. `events` with `"follow": true` streams `{"event": ...}` lines until
//! the client hangs up (`"format": "agentruntime"` for the draft standard's
//! events). Who is calling is decided from the peer's credentials: the kernel
//! tells us its pid, and its cgroup tells us which agent it belongs to,
//! whatever the request claims (SPEC 5, last "always" rule).

use std::path::{Path, PathBuf};
use std::time::Duration;

use brood_core::{AgentName, Code};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use brood_runtime::Supervisor;
use brood_runtime::agentruntime::{EventFormat, to_agentruntime};
use brood_runtime::api::{self, ApiError};

/// Largest request line accepted (the protocol's 1 MiB).
const MAX_REQUEST: usize = 1 << 20;

/// Binds the socket (replacing a stale file nobody answers on) with mode 0600.
pub async fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!(
                    "{}: another brood supervisor is serving this root",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves connections until the listener fails.
pub async fn serve(sup: Supervisor, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let sup = sup.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(sup, stream).await {
                        tracing::debug!(error = %e, "control connection ended");
                    }
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "accept on the control socket failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(sup: Supervisor, stream: UnixStream) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    let identified = match cred.pid() {
        Some(pid) => sup.identify(pid, cred.uid()).await,
        None => Err(ApiError::new(
            Code::Forbidden,
            "the kernel gave no pid for the caller, so it cannot be identified",
        )),
    };
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = Vec::new();
    let n = (&mut rd)
        .take(MAX_REQUEST as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(());
    }
    // Plain HTTP on the same socket, for Prometheus (SPEC 9 `/metrics`):
    // `curl --unix-socket brood.sock http://brood/metrics`.
    if line.starts_with(b"GET ") {
        return http_get(&sup, &line, &mut rd, &mut wr).await;
    }
    // Refused after the request is read, so the caller gets the reason
    // rather than a broken pipe.
    let caller = match identified {
        Ok(c) => c,
        Err(e) => {
            let mut bytes = json!({"ok": false, "error": e.to_json()})
                .to_string()
                .into_bytes();
            bytes.push(b'\n');
            return wr.write_all(&bytes).await;
        }
    };
    let reply = if line.len() > MAX_REQUEST {
        Err(ApiError::new(Code::BadRequest, "request longer than 1 MiB"))
    } else {
        match serde_json::from_slice::<Value>(&line) {
            Err(e) => Err(ApiError::new(
                Code::BadRequest,
                format!("request is not JSON: {e}"),
            )),
            Ok(req) => {
                let op = req
                    .get("op")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let args = req.get("args").cloned().unwrap_or(json!({}));
                if op == "events" {
                    return stream_events(&sup, &args, &mut wr).await;
                }
                api::handle(&sup, &caller, &op, &args).await
            }
        }
    };
    let out = match reply {
        Ok(v) => json!({"ok": true, "result": v}),
        Err(e) => json!({"ok": false, "error": e.to_json()}),
    };
    let mut bytes = out.to_string().into_bytes();
    bytes.push(b'\n');
    wr.write_all(&bytes).await
}

/// One HTTP/1.x GET: `/metrics` (Prometheus text), anything else 404. The
/// headers are read (up to 64 KiB) and ignored; the connection closes after
/// the reply.
async fn http_get(
    sup: &Supervisor,
    request_line: &[u8],
    rd: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    wr: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    let mut seen = 0usize;
    loop {
        let mut h = Vec::new();
        let n = (&mut *rd).take(64 << 10).read_until(b'\n', &mut h).await?;
        seen += n;
        if n == 0 || h == b"\r\n" || h == b"\n" || seen > 64 << 10 {
            break;
        }
    }
    let text = String::from_utf8_lossy(request_line);
    let path = text.split_whitespace().nth(1).unwrap_or("");
    let (status, ctype, body) = if path == "/metrics" || path.starts_with("/metrics?") {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            sup.metrics_text(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            format!("no such path {path:?}; try /metrics\n"),
        )
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    wr.write_all(head.as_bytes()).await?;
    wr.write_all(body.as_bytes()).await?;
    wr.shutdown().await
}

/// `events {"after"?, "name"?, "follow"?, "format"?}`: the tenant's events in
/// sequence order, each line `{"event": ...}`. `format` is `brood` (the default,
/// [`event_json`]) or `agentruntime` (the draft standard's events,
/// [`brood_runtime::agentruntime::to_agentruntime`]; events without a counterpart are
/// left out, `last` still counts them so a client resumes at the right place).
async fn stream_events(
    sup: &Supervisor,
    args: &Value,
    wr: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    let mut after = args.get("after").and_then(Value::as_i64).unwrap_or(0);
    let follow = args.get("follow").and_then(Value::as_bool).unwrap_or(false);
    let format = match args.get("format") {
        None | Some(Value::Null) => EventFormat::Brood,
        Some(f) => match f.as_str().and_then(EventFormat::parse) {
            Some(f) => f,
            None => {
                let e = ApiError::new(
                    Code::BadRequest,
                    format!("events: unknown format {f}; use \"brood\" or \"agentruntime\""),
                );
                let out = json!({"ok": false, "error": e.to_json()});
                return wr.write_all(format!("{out}\n").as_bytes()).await;
            }
        },
    };
    let name = match args.get("name").and_then(Value::as_str) {
        Some(s) => match AgentName::new(s) {
            Ok(n) => Some(n),
            Err(e) => {
                let out = json!({"ok": false, "error": ApiError::new(Code::InvalidName, e.to_string()).to_json()});
                return wr.write_all(format!("{out}\n").as_bytes()).await;
            }
        },
        None => None,
    };
    loop {
        let batch = sup
            .store()
            .events(sup.tenant(), after, name.as_ref(), 1000)
            .unwrap_or_default();
        for e in &batch {
            after = e.seq;
            let event = match format {
                EventFormat::Brood => event_json(e),
                EventFormat::AgentRuntime => match to_agentruntime(e) {
                    Some(v) => v,
                    None => continue,
                },
            };
            let line = json!({"event": event});
            wr.write_all(format!("{line}\n").as_bytes()).await?;
        }
        if !follow {
            let done = json!({"ok": true, "result": {"last": after}});
            return wr.write_all(format!("{done}\n").as_bytes()).await;
        }
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An event as the control plane shows it (SPEC 11: `type event_id timestamp
/// sequence tenant agent run session` and a `payload`).
pub fn event_json(e: &brood_store::Event) -> Value {
    json!({
        "type": e.kind,
        "event_id": format!("{}-{}", e.tenant, e.seq),
        "timestamp": e.ts_ms,
        "sequence": e.seq,
        "tenant": e.tenant.as_str(),
        "agent": e.agent.as_str(),
        "run": e.run.as_ref().map(|r| r.as_str()),
        "session": e.session.as_str(),
        "payload": serde_json::from_str::<Value>(&e.payload).unwrap_or(Value::Null),
    })
}

/// A client of the control socket (the CLI's side).
pub async fn request(socket: &Path, op: &str, args: Value) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(socket).await?;
    let req = json!({"op": op, "args": args});
    s.write_all(format!("{req}\n").as_bytes()).await?;
    let mut rd = BufReader::new(s);
    let mut line = String::new();
    rd.read_line(&mut line).await?;
    serde_json::from_str(&line).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad reply from {}: {e}", socket.display()),
        )
    })
}

/// The default socket of a root.
pub fn socket_of(root: &Path) -> PathBuf {
    root.join("brood.sock")
}
