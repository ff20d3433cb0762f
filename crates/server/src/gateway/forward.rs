//! One call through the gateway: read and checked (the model named and
//! priced, the dispatcher's yes: run going, model granted, budget left,
//! rate limits not reached),
//! sent to the provider with the operator's key on a blocking thread
//! (ureq: http and https), and its answer passed back, whole or as the
//! stream arrives, metered on the way. A stream whose cost passes the
//! budget left is cut there; every call, refused, cut or answered, is
//! reported to the dispatcher once (`Tally`).

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use brood_core::ModelCall;
use brood_runtime::models::meter::{Endpoint, Meter};
use brood_runtime::models::{Kind, Price, Upstream};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::{Request, Response};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{Body, Run, error, full};

/// The largest request body taken (a long conversation with images).
const MAX_REQUEST: usize = 32 << 20;
/// The largest whole (not streamed) answer read.
const MAX_ANSWER: usize = 64 << 20;
/// Request headers passed on to the provider; everything else (the
/// client's key above all) stays here.
const PASSED: [&str; 4] = [
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "accept",
];
/// Answer headers passed back.
const RETURNED: [&str; 5] = [
    "content-type",
    "retry-after",
    "request-id",
    "x-request-id",
    "anthropic-request-id",
];

/// What the provider's thread hands over.
enum Up {
    Head(u16, Vec<(String, String)>),
    Chunk(Bytes),
    End,
    Fail(String),
}

/// One call's record, reported to the dispatcher exactly once: by
/// `finish`, or by its drop when the agent went away mid-answer.
struct Tally {
    run: Arc<Run>,
    started: Instant,
    model: String,
    endpoint: Endpoint,
    stream: bool,
    request_bytes: u64,
    messages: u64,
    price: Option<Price>,
    meter: Meter,
    status: u16,
    reported: bool,
}

impl Tally {
    fn cost(&self) -> f64 {
        let u = self.meter.usage_so_far();
        self.price
            .map(|p| p.cost(u.tokens_in, u.tokens_out))
            .unwrap_or(0.0)
    }

    /// Reports the call; `sent` is false for one refused before leaving.
    fn finish(&mut self, sent: bool, outcome: &'static str, detail: Option<String>) {
        if self.reported {
            return;
        }
        self.reported = true;
        let (u, cost) = if sent {
            (self.meter.usage_so_far(), self.cost())
        } else {
            (Default::default(), 0.0)
        };
        self.run.sup.model_used(ModelCall {
            agent: self.run.agent.clone(),
            run: self.run.run.clone(),
            model: self.model.clone(),
            endpoint: self.endpoint.path(),
            stream: self.stream,
            request_bytes: self.request_bytes,
            messages: self.messages,
            tokens_in: u.tokens_in,
            tokens_out: u.tokens_out,
            cost_usd: cost,
            estimated: u.estimated,
            latency_ms: self.started.elapsed().as_millis() as u64,
            status: self.status,
            outcome,
            detail,
        });
    }

    /// The provider's answer ended: `ok`, or `failed` with its status
    /// when it refused the call.
    fn answered(&mut self) {
        if (200..300).contains(&self.status) {
            self.finish(true, "ok", None);
        } else {
            let d = format!("the provider answered {}", self.status);
            self.finish(true, "failed", Some(d));
        }
    }

    fn refuse(&mut self, status: u16, code: &str, message: String) -> Response<Body> {
        self.status = status;
        self.finish(false, "refused", Some(message.clone()));
        error(status, code, &message)
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.finish(
            true,
            "cut",
            Some("the connection closed before the answer ended".into()),
        );
    }
}

pub(super) async fn call(
    run: Arc<Run>,
    endpoint: Endpoint,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let started = Instant::now();
    // The query is kept (Anthropic's SDK says `?beta=true`); the path is
    // the endpoint's own.
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let headers: Vec<(String, String)> = PASSED
        .iter()
        .filter_map(|h| {
            req.headers()
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .map(|v| ((*h).to_owned(), v.to_owned()))
        })
        .collect();
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                413,
                "invalid_request_error",
                &format!("reading the request body (at most {MAX_REQUEST} bytes): {e}"),
            );
        }
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                400,
                "invalid_request_error",
                &format!("the request body is not JSON: {e}"),
            );
        }
    };
    let Some(model) = parsed
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return error(
            400,
            "invalid_request_error",
            "the request names no model (a string field `model`)",
        );
    };
    let stream = parsed.get("stream").and_then(Value::as_bool) == Some(true);
    let mut tally = Tally {
        run: run.clone(),
        started,
        model: model.clone(),
        endpoint,
        stream,
        request_bytes: body.len() as u64,
        messages: messages_of(&parsed),
        price: run.providers.price(&model),
        meter: Meter::new(body.len()),
        status: 0,
        reported: false,
    };
    let kind = endpoint.kind();
    let Some(upstream) = run.providers.upstream(kind).cloned() else {
        return tally.refuse(
            503,
            "unavailable",
            format!(
                "the operator configured no {} provider ([models.{}] in config.toml)",
                kind.word(),
                kind.word()
            ),
        );
    };
    let Some(price) = tally.price else {
        return tally.refuse(
            403,
            "model_not_priced",
            format!(
                "model {model:?} has no price in the operator's table ([models.prices]): \
                 brood forwards only calls it can count"
            ),
        );
    };
    let estimate = price.cost(tally.meter.input_estimate(), 0);
    let left = match run
        .sup
        .model_check(run.agent.clone(), run.run.clone(), model.clone(), estimate)
        .await
    {
        Ok(left) => left,
        Err(r) => {
            let Some(over) = r.rate else {
                return tally.refuse(r.status, r.code, r.message);
            };
            tally.status = r.status;
            tally.finish(false, "refused", Some(r.message.clone()));
            return super::rate_limited(r.code, &r.message, &over);
        }
    };
    if *run.closed.borrow() {
        return tally.refuse(
            403,
            "agent_ended",
            "the agent's run has ended: nothing of it is forwarded".into(),
        );
    }
    let (tx, mut rx) = mpsc::channel::<Up>(64);
    let url = format!("{}{}{query}", upstream.base_url, endpoint.path());
    let client = run.client.clone();
    let closed = run.closed.clone();
    tokio::task::spawn_blocking(move || send(client, &upstream, &url, headers, &body, &tx, closed));
    let (status, head) = match rx.recv().await {
        Some(Up::Head(s, h)) => (s, h),
        Some(Up::Fail(e)) => {
            tally.status = 502;
            tally.finish(false, "failed", Some(e.clone()));
            return error(502, "api_error", &e);
        }
        _ => {
            tally.status = 502;
            tally.finish(
                false,
                "failed",
                Some("the provider's answer was lost".into()),
            );
            return error(502, "api_error", "the provider's answer was lost");
        }
    };
    tally.status = status;
    let streamed = head
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v.starts_with("text/event-stream"));
    let mut resp = if streamed {
        Response::new(streamed_body(tally, rx, left))
    } else {
        whole(tally, rx).await
    };
    *resp.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    for (k, v) in head {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// A whole answer: read, metered, reported, passed back.
async fn whole(mut tally: Tally, mut rx: mpsc::Receiver<Up>) -> Response<Body> {
    let mut buf = Vec::new();
    loop {
        match rx.recv().await {
            Some(Up::Chunk(b)) => {
                if buf.len() + b.len() > MAX_ANSWER {
                    tally.finish(true, "failed", Some("the answer was too long".into()));
                    return error(502, "api_error", "the provider's answer was too long");
                }
                buf.extend_from_slice(&b);
            }
            Some(Up::End) => break,
            Some(Up::Fail(e)) => {
                tally.finish(true, "failed", Some(e.clone()));
                return error(502, "api_error", &e);
            }
            Some(Up::Head(..)) => {}
            None => {
                let m = "the run's endpoint closed before the answer ended";
                tally.finish(true, "cut", Some(m.into()));
                return error(403, "agent_ended", m);
            }
        }
    }
    if (200..300).contains(&tally.status) {
        tally.meter.body(&buf);
    }
    tally.answered();
    Response::new(full(Bytes::from(buf)))
}

/// A stream passed on as it arrives, metered chunk by chunk, cut when its
/// cost passes `left` or when the run's endpoint closes.
fn streamed_body(tally: Tally, rx: mpsc::Receiver<Up>, left: Option<f64>) -> Body {
    let closed = tally.run.closed.clone();
    let state = (tally, rx, closed, false);
    let s = futures_util::stream::unfold(
        state,
        move |(mut tally, mut rx, mut closed, done)| async move {
            if done {
                return None;
            }
            let next = tokio::select! {
                up = rx.recv() => Some(up),
                _ = closed.wait_for(|c| *c) => None,
            };
            let Some(next) = next else {
                tally.finish(true, "cut", Some("the agent's run ended mid-stream".into()));
                let e = std::io::Error::other("the agent's run ended");
                return Some((Err(e), (tally, rx, closed, true)));
            };
            match next {
                Some(Up::Chunk(b)) => {
                    if (200..300).contains(&tally.status) {
                        tally.meter.stream(&b);
                    }
                    if let Some(left) = left
                        && tally.cost() > left
                    {
                        let m = format!(
                            "the stream passed the budget left (${left:.6}) at ${:.6}: cut",
                            tally.cost()
                        );
                        tally.finish(true, "cut", Some(m.clone()));
                        // What passed the budget is not passed on.
                        return Some((Err(std::io::Error::other(m)), (tally, rx, closed, true)));
                    }
                    Some((Ok(Frame::data(b)), (tally, rx, closed, false)))
                }
                Some(Up::End) | None => {
                    tally.answered();
                    None
                }
                Some(Up::Fail(e)) => {
                    tally.finish(true, "failed", Some(e.clone()));
                    Some((Err(std::io::Error::other(e)), (tally, rx, closed, true)))
                }
                Some(Up::Head(..)) => {
                    Some((Ok(Frame::data(Bytes::new())), (tally, rx, closed, false)))
                }
            }
        },
    );
    BodyExt::boxed_unsync(StreamBody::new(s.boxed()))
}

/// The call to the provider, on a blocking thread: the key added, the
/// answer's head and then its bytes handed over as they come. It stops
/// when nobody takes them any more or the run's endpoint closed.
fn send(
    client: ureq::Agent,
    upstream: &Upstream,
    url: &str,
    headers: Vec<(String, String)>,
    body: &[u8],
    tx: &mpsc::Sender<Up>,
    closed: tokio::sync::watch::Receiver<bool>,
) {
    let mut req = client.post(url).header("content-type", "application/json");
    for (k, v) in &headers {
        req = req.header(k.as_str(), v.as_str());
    }
    if let Some(key) = &upstream.key {
        req = match upstream.kind {
            Kind::OpenAi => req.header("authorization", format!("Bearer {}", key.expose())),
            Kind::Anthropic => req.header("x-api-key", key.expose()),
        };
    }
    let resp = match req.send(body) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.blocking_send(Up::Fail(format!(
                "cannot reach the {} provider: {e}",
                upstream.kind.word()
            )));
            return;
        }
    };
    let status = resp.status().as_u16();
    let head: Vec<(String, String)> = RETURNED
        .iter()
        .filter_map(|h| {
            resp.headers()
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .map(|v| ((*h).to_owned(), v.to_owned()))
        })
        .collect();
    if tx.blocking_send(Up::Head(status, head)).is_err() {
        return;
    }
    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if *closed.borrow() {
            return;
        }
        match reader.read(&mut buf) {
            Ok(0) => {
                let _ = tx.blocking_send(Up::End);
                return;
            }
            Ok(n) => {
                if tx
                    .blocking_send(Up::Chunk(Bytes::copy_from_slice(&buf[..n])))
                    .is_err()
                {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Up::Fail(format!("the provider's answer broke: {e}")));
                return;
            }
        }
    }
}

/// The messages a request carries: chat's and Anthropic's `messages`, the
/// responses API's `input` (a list of items, or one text).
fn messages_of(v: &Value) -> u64 {
    match (v.get("messages"), v.get("input")) {
        (Some(Value::Array(m)), _) => m.len() as u64,
        (_, Some(Value::Array(i))) => i.len() as u64,
        (_, Some(Value::String(_))) => 1,
        _ => 0,
    }
}
