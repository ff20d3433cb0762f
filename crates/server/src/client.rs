//! The API's client, as the CLI uses it: one HTTP/1.1 request per
//! connection, over the control socket or (with `--url`) loopback TCP with
//! the bearer token; and the SSE reader of `brood events -f`.

use std::path::PathBuf;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpStream, UnixStream};

/// Where the API is.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    /// The door this process inherited (inside an agent: `BROOD_DOOR`,
    /// crate::door), with the tag that says where it leads.
    Door(std::os::fd::RawFd),
    /// `host:port`, and the token to present.
    Tcp {
        addr: String,
        token: Option<String>,
    },
}

impl Endpoint {
    /// `--url http://127.0.0.1:PORT` (a trailing `/` allowed).
    pub fn from_url(url: &str, token: Option<String>) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--url {url:?}: only http://HOST:PORT is supported"))?;
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') {
            return Err(format!(
                "--url {url:?}: give http://HOST:PORT, without a path"
            ));
        }
        Ok(Endpoint::Tcp {
            addr: addr.to_owned(),
            token,
        })
    }

    fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Door(fd) => format!("the agent's door (descriptor {fd})"),
            Endpoint::Tcp { addr, .. } => format!("http://{addr}"),
        }
    }
}

/// Why a call did not get an answer.
#[derive(Debug)]
pub struct ClientError(pub String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientError {}

/// An answer: its status and JSON body (`Null` when it had none).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(ep: &Endpoint) -> Result<Sender, ClientError> {
    let fail =
        |e: &dyn std::fmt::Display| ClientError(format!("connecting to {}: {e}", ep.describe()));
    macro_rules! handshake {
        ($stream:expr) => {{
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new($stream))
                .await
                .map_err(|e| fail(&e))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            send
        }};
    }
    Ok(match ep {
        Endpoint::Unix(p) => handshake!(UnixStream::connect(p).await.map_err(|e| fail(&e))?),
        Endpoint::Door(fd) => {
            // SAFETY: the descriptor is the door this process inherited and
            // keeps open for its whole life (crate::door::inherited).
            let door = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
            let s = crate::door::open(door, "api").map_err(|e| fail(&e))?;
            s.set_nonblocking(true).map_err(|e| fail(&e))?;
            handshake!(UnixStream::from_std(s).map_err(|e| fail(&e))?)
        }
        Endpoint::Tcp { addr, .. } => {
            handshake!(
                TcpStream::connect(addr.as_str())
                    .await
                    .map_err(|e| fail(&e))?
            )
        }
    })
}

fn request(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
    idempotency_key: Option<&str>,
) -> Result<Request<Full<Bytes>>, ClientError> {
    let host = match ep {
        Endpoint::Unix(_) | Endpoint::Door(_) => "brood".to_owned(),
        Endpoint::Tcp { addr, .. } => addr.clone(),
    };
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    if let Endpoint::Tcp { token: Some(t), .. } = ep {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    if let Some(k) = idempotency_key {
        b = b.header("idempotency-key", k);
    }
    let bytes = match body {
        Some(v) => {
            b = b.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    b.body(Full::new(bytes))
        .map_err(|e| ClientError(format!("{method} {path}: {e}")))
}

/// One call: `method path` with an optional JSON body.
pub async fn call(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
    idempotency_key: Option<&str>,
) -> Result<Answer, ClientError> {
    call_with(ep, method, path, body, idempotency_key, &[]).await
}

/// [`call`] with more header lines (a stdio MCP session's capability).
pub async fn call_with(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
    idempotency_key: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<Answer, ClientError> {
    let mut send = connect(ep).await?;
    let mut req = request(ep, method, path, body, idempotency_key)?;
    for (k, v) in headers {
        let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| ClientError(format!("header {k:?}: {e}")))?;
        let value = hyper::header::HeaderValue::from_str(v)
            .map_err(|e| ClientError(format!("header {k:?}: {e}")))?;
        req.headers_mut().insert(name, value);
    }
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| ClientError(format!("{method} {path} on {}: {e}", ep.describe())))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ClientError(format!("reading the answer to {method} {path}: {e}")))?
        .to_bytes();
    Ok(Answer {
        status,
        body: body_value(&bytes),
    })
}

/// An answer's body as JSON: `null` when empty, the text as a string when
/// it is not JSON.
pub(crate) fn body_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

/// Opens `GET path` as an event stream; `on_event` is called for each event
/// until it returns `false` or the stream ends. Non-200 answers are returned.
pub async fn stream(
    ep: &Endpoint,
    path: &str,
    last_event_id: Option<&str>,
    on_event: impl FnMut(SseEvent) -> bool,
) -> Result<Option<Answer>, ClientError> {
    stream_request(ep, "GET", path, None, last_event_id, on_event).await
}

/// [`stream`] for any method, with an optional JSON body (`brood mcp` holds
/// its session with a `POST /api/mcp/session` stream).
pub async fn stream_request(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
    last_event_id: Option<&str>,
    mut on_event: impl FnMut(SseEvent) -> bool,
) -> Result<Option<Answer>, ClientError> {
    let mut send = connect(ep).await?;
    let mut req = request(ep, method, path, body, None)?;
    if let Some(id) = last_event_id
        && let Ok(v) = id.parse()
    {
        req.headers_mut().insert("last-event-id", v);
    }
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| ClientError(format!("{method} {path} on {}: {e}", ep.describe())))?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    if status != 200 {
        let bytes = body
            .collect()
            .await
            .map_err(|e| ClientError(format!("reading the answer to {method} {path}: {e}")))?
            .to_bytes();
        return Ok(Some(Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }));
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut cur = SseEvent::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ClientError(format!("reading the event stream: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        // The whole lines of `buf`, read in place and dropped together
        // after: a frame holding many events costs one move, not one a line.
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
            let raw = &buf[start..start + nl];
            start += nl + 1;
            let line = String::from_utf8_lossy(raw);
            let line = line.trim_end_matches('\r');
            if line.is_empty() {
                if !cur.data.is_empty() || cur.event.is_some() {
                    let ev = std::mem::take(&mut cur);
                    if !on_event(ev) {
                        return Ok(None);
                    }
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => cur.id = Some(value.to_owned()),
                "event" => cur.event = Some(value.to_owned()),
                "data" => {
                    if !cur.data.is_empty() {
                        cur.data.push('\n');
                    }
                    cur.data.push_str(value);
                }
                _ => {}
            }
        }
        buf.drain(..start);
    }
    Ok(None)
}

/// One kept-alive connection for many calls (what a harness holds; the
/// benchmark uses it). Not for streams.
pub struct Connection {
    ep: Endpoint,
    send: Sender,
}

impl Connection {
    pub async fn open(ep: &Endpoint) -> Result<Connection, ClientError> {
        Ok(Connection {
            send: connect(ep).await?,
            ep: ep.clone(),
        })
    }

    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ClientError> {
        let req = request(&self.ep, method, path, body, None)?;
        self.send
            .ready()
            .await
            .map_err(|e| ClientError(format!("{method} {path}: the connection closed: {e}")))?;
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| ClientError(format!("{method} {path}: {e}")))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError(format!("reading the answer to {method} {path}: {e}")))?
            .to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        Ok(Answer { status, body })
    }
}
