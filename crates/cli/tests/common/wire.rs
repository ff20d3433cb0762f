//! The HTTP API's tests' side of the wire: requests written by hand over raw
//! sockets (not with brood's own client), a supervisor served on both
//! listeners that records every answer, and an SSE reader.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// Where a request goes.
#[derive(Clone)]
pub enum To {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr, Option<String>),
}

/// One request and its answer, as the validator reads them.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A raw HTTP/1.1 request, the connection closed after it.
pub async fn raw(
    to: &To,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: brood\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let To::Tcp(_, Some(t)) = to {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    // A server may answer (413) and close before the whole body is written:
    // a failed write is not the test's failure, the answer read after it is.
    let mut out = Vec::new();
    match to {
        To::Unix(p) => {
            let mut s = tokio::net::UnixStream::connect(p).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.read_to_end(&mut out).await;
        }
        To::Tcp(a, _) => {
            let mut s = tokio::net::TcpStream::connect(a).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.read_to_end(&mut out).await;
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

/// A chunked body's content.
pub fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.headers
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// The API of a fresh supervisor on both listeners, recording every answer.
pub struct Served {
    pub env: Env,
    pub unix: To,
    pub tcp: std::net::SocketAddr,
    pub token: String,
    pub log: Mutex<Vec<Value>>,
    pub _servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Served {
    pub async fn start(f: impl FnOnce(&mut brood_runtime::Config)) -> Served {
        Served::start_limited(f, brood_server::EventLimits::default()).await
    }

    /// [`Served::start`] with other limits for slow event subscribers.
    pub async fn start_limited(
        f: impl FnOnce(&mut brood_runtime::Config),
        limits: brood_server::EventLimits,
    ) -> Served {
        Served::start_hooked(f, limits, |_| {}).await
    }

    /// [`Served::start_limited`], calling `before_api` once the supervisor
    /// runs and before the API (and its event hub) starts.
    pub async fn start_hooked(
        f: impl FnOnce(&mut brood_runtime::Config),
        limits: brood_server::EventLimits,
        before_api: impl FnOnce(&Env),
    ) -> Served {
        let env = start_with(Duration::from_millis(500), f);
        before_api(&env);
        let sock = env.root().join("brood.sock");
        let token = brood_server::Token::load_or_create(env.root()).unwrap();
        let api =
            brood_server::Api::with_event_limits(env.sup.clone(), Some(token.clone()), limits);
        let unix = brood_server::bind_unix(&sock).await.unwrap();
        let tcp = brood_server::bind_tcp("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let servers = vec![
            tokio::spawn(brood_server::serve_unix(api.clone(), unix)),
            tokio::spawn(brood_server::serve_tcp(api, tcp)),
        ];
        Served {
            env,
            unix: To::Unix(sock),
            tcp: addr,
            token: token.as_str().to_owned(),
            log: Mutex::new(Vec::new()),
            _servers: servers,
        }
    }

    pub fn tcp(&self, token: Option<&str>) -> To {
        To::Tcp(self.tcp, token.map(str::to_owned))
    }

    /// A request on `to`, recorded under the route's `template`.
    pub async fn on(
        &self,
        to: &To,
        method: &str,
        template: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Answer {
        let a = raw(to, method, path, headers, body).await;
        let (p, q) = path.split_once('?').unwrap_or((path, ""));
        let query: BTreeMap<&str, &str> = q
            .split('&')
            .filter(|s| !s.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .collect();
        self.log.lock().unwrap().push(json!({
            "method": method, "path": p, "query": query, "template": template,
            "status": a.status,
            "content_type": header(&a, "content-type").unwrap_or(""),
            "body": a.body,
        }));
        a
    }

    /// A JSON request on the control socket.
    pub async fn call(
        &self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.on(&self.unix, method, template, path, &[], body.as_bytes())
            .await
    }

    /// A JSON request that must answer `status`: its body.
    pub async fn expect(
        &self,
        status: u16,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let a = self.call(method, template, path, body).await;
        assert_eq!(a.status, status, "{method} {path}: {}", a.body);
        if a.body.is_empty() {
            Value::Null
        } else if header(&a, "content-type")
            .is_some_and(|c| c.contains("json") && !c.contains("ndjson"))
        {
            a.json()
        } else {
            Value::String(a.body)
        }
    }
}

/// An error answer's code, checked to have SPEC 11's shape.
pub fn code(v: &Value) -> &str {
    let e = &v["error"];
    assert!(
        e["code"].is_string() && e["reason"].is_string() && e["message"].is_string(),
        "not an error body: {v}"
    );
    e["code"].as_str().unwrap()
}

/// A following SSE connection read as it arrives.
pub struct Stream {
    s: tokio::net::UnixStream,
    raw: Vec<u8>,
    text: String,
    head_done: bool,
}

impl Stream {
    pub async fn open(sock: &Path, path: &str, last_event_id: Option<&str>) -> Stream {
        let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: brood\r\nAccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut st = Stream {
            s,
            raw: Vec::new(),
            text: String::new(),
            head_done: false,
        };
        // The answer's head: the subscription is in place once it came.
        while !st.head_done {
            st.fill().await;
        }
        st
    }

    pub async fn fill(&mut self) {
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(20), self.s.read(&mut buf))
            .await
            .expect("events within 20 s")
            .unwrap();
        assert!(n > 0, "the stream ended");
        self.raw.extend_from_slice(&buf[..n]);
        if !self.head_done {
            let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("text/event-stream"), "{head}");
            self.raw.drain(..end + 4);
            self.head_done = true;
        }
        // Whole chunks into the text.
        while let Some(nl) = self.raw.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.raw[..nl]).unwrap().trim(), 16)
                    .unwrap();
            if self.raw.len() < nl + 2 + size + 2 {
                break;
            }
            self.text
                .push_str(std::str::from_utf8(&self.raw[nl + 2..nl + 2 + size]).unwrap());
            self.raw.drain(..nl + 2 + size + 2);
        }
    }

    /// Comment lines (keep-alives) received and not yet consumed by [`Stream::next`].
    pub fn comments(&self) -> usize {
        self.text.lines().filter(|l| l.starts_with(':')).count()
    }

    /// The next event: (id, event type, data).
    pub async fn next(&mut self) -> (Option<String>, Option<String>, String) {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let (mut id, mut ev, mut data) = (None, None, String::new());
                for l in block.lines() {
                    if let Some(v) = l.strip_prefix("id: ") {
                        id = Some(v.to_owned())
                    }
                    if let Some(v) = l.strip_prefix("event: ") {
                        ev = Some(v.to_owned())
                    }
                    if let Some(v) = l.strip_prefix("data: ") {
                        data.push_str(v)
                    }
                }
                if data.is_empty() && ev.is_none() {
                    continue; // a keep-alive comment
                }
                return (id, ev, data);
            }
            self.fill().await;
        }
    }

    pub async fn next_seq(&mut self) -> (String, i64) {
        let (id, ev, data) = self.next().await;
        assert_eq!(ev, None, "{data}");
        let v: Value = serde_json::from_str(&data).unwrap();
        let id = id.expect("every event has an id");
        assert_eq!(v["event_id"], id.as_str());
        (id, v["sequence"].as_i64().unwrap())
    }
}

pub async fn quick_agents(s: &Served, names: &[&str]) {
    for n in names {
        let a = raw(
            &s.unix,
            "POST",
            "/api/agents",
            &[],
            json!({"name": n, "argv": agent(&["--result", n])})
                .to_string()
                .as_bytes(),
        )
        .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    for n in names {
        let w = raw(
            &s.unix,
            "POST",
            &format!("/api/agents/{n}/wait"),
            &[],
            br#"{"timeout_s": 20}"#,
        )
        .await;
        assert_eq!(w.json()["agents"][0]["status"], "completed", "{}", w.body);
    }
}
