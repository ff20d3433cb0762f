//! `brood bench gateway` (issue 31): a streamed chat completion through a
//! live agent's model gateway, against the same call made straight to the
//! same loopback provider in the same run. The provider streams its chunks
//! a millisecond apart (a fast model); the first token is the first `data:` line
//! the client reads, the whole stream its last byte. Calls alternate (the
//! gateway's, then the direct one) so drift hits both alike; medians of
//! each, and the gateway's ratio and added milliseconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brood_runtime::models::{Price, Providers, Upstream};
use brood_runtime::{Caller, Config, Supervisor};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODEL: &str = "bench-model";
/// The time between two events of the provider's stream.
const GAP: Duration = Duration::from_millis(1);

pub(super) struct Params {
    pub calls: usize,
    pub chunks: usize,
}

/// The loopback provider: each request answered with `chunks` chat
/// completion chunks a millisecond apart, its usage and `[DONE]`, then the
/// connection closed.
async fn provider(chunks: usize) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let mut events: Vec<String> = (0..chunks)
        .map(|i| {
            format!(
                "data: {}\n\n",
                json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": format!("token{i} ")}}]})
            )
        })
        .collect();
    events.push(format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": chunks}})
    ));
    let events = Arc::new(events);
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let events = events.clone();
            tokio::spawn(async move {
                if read_head_and_body(&mut s).await.is_none() {
                    return;
                }
                let _ = s.set_nodelay(true);
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                // A model's tokens come apart in time: GAP between events,
                // the first at once.
                for (i, e) in events.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(GAP).await;
                    }
                    if s.write_all(e.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((format!("http://{addr}"), task))
}

/// Reads a request's head and its `content-length` body.
async fn read_head_and_body(s: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut have = buf.len() - end - 4;
    while have < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        have += n;
    }
    Some(())
}

/// One streamed call: the time to its first `data:` line and to its end.
async fn call(origin: &str, token: Option<&str>) -> Result<(Duration, Duration)> {
    let addr = origin.trim_start_matches("http://");
    let body =
        json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "count"}]})
            .to_string();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         {auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let t0 = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(req.as_bytes()).await?;
    let mut seen = Vec::new();
    let mut chunk = [0u8; 16384];
    let mut first = None;
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&chunk[..n]);
        if first.is_none() && seen.windows(5).any(|w| w == b"data:") {
            first = Some(t0.elapsed());
        }
    }
    let all = t0.elapsed();
    let text = String::from_utf8_lossy(&seen);
    if !text.starts_with("HTTP/1.1 200") || !text.contains("[DONE]") {
        bail!(
            "a streamed call to {origin} did not end with [DONE]: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    Ok((first.unwrap_or(all), all))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

pub(super) async fn run(
    root: &Option<PathBuf>,
    exe: &str,
    me: Caller,
    p: &Params,
) -> Result<Value> {
    if p.calls == 0 || p.chunks == 0 {
        bail!("--count and --chunks must be at least 1");
    }
    let (base_url, provider_task) = provider(p.chunks).await?;
    let providers = Arc::new(Providers {
        openai: Some(Upstream {
            kind: brood_runtime::models::Kind::OpenAi,
            base_url: base_url.clone(),
            key: None,
            key_file: None,
        }),
        anthropic: None,
        prices: [(
            MODEL.to_owned(),
            Price {
                input: 0.0,
                output: 0.0,
            },
        )]
        .into(),
    });
    let (dir, remove) = super::scratch_dir(root, "gateway");
    std::fs::create_dir_all(&dir)?;
    let mut cfg = Config::new(dir.clone());
    brood_server::Entrances::new().install(&mut cfg);
    cfg.bin_dir = crate::bin_dir();
    cfg.gateway = Some(brood_runtime::Gateway {
        host: brood_server::gateway::host(),
        providers: providers.clone(),
    });
    let sup = Supervisor::start(cfg).context("starting the supervisor")?;
    let measured = measure(&sup, exe, me, &base_url, providers, p).await;
    sup.shutdown().await;
    provider_task.abort();
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    measured
}

async fn measure(
    sup: &Supervisor,
    exe: &str,
    me: Caller,
    base_url: &str,
    providers: Arc<Providers>,
    p: &Params,
) -> Result<Value> {
    // A live agent whose run the gateway's calls are made for.
    let r = super::req(
        "caller".into(),
        None,
        vec![exe.to_owned(), "test-agent".into(), "--hang".into()],
        true,
    )?;
    let a = crate::api(sup.spawn(me, r).await)?;
    let run = brood_core::RunId::parse(&a.run)?;
    let ep = (brood_server::gateway::host())(
        sup.clone(),
        brood_core::AgentName::new("caller")?,
        run,
        providers,
        None,
    )
    .map_err(anyhow::Error::msg)?;
    let (mut gw_first, mut gw_all, mut d_first, mut d_all) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..p.calls + 5 {
        let (gf, ga) = call(&ep.origin, Some(&ep.token)).await?;
        let (df, da) = call(base_url, None).await?;
        if i >= 5 {
            gw_first.push(gf);
            gw_all.push(ga);
            d_first.push(df);
            d_all.push(da);
        }
    }
    let (gf, ga, df, da) = (
        median(&mut gw_first),
        median(&mut gw_all),
        median(&mut d_first),
        median(&mut d_all),
    );
    let ratio = |a: Duration, b: Duration| {
        (a.as_secs_f64() / b.as_secs_f64().max(1e-9) * 100.0).round() / 100.0
    };
    let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
    Ok(json!({
        "calls": p.calls,
        "chunks": p.chunks,
        "first_token_gateway_ms": ms(gf),
        "first_token_direct_ms": ms(df),
        "first_token_added_ms": ms(gf.saturating_sub(df)),
        "first_token_ratio": ratio(gf, df),
        "stream_gateway_ms": ms(ga),
        "stream_direct_ms": ms(da),
        "stream_added_ms": ms(ga.saturating_sub(da)),
        "stream_ratio": ratio(ga, da),
        "what": "a streamed chat completion (medians) through a live agent's model gateway (token checked, the dispatcher's check, forwarded by ureq on a blocking thread, metered as it passes) against the same call straight to the same loopback provider, alternating",
    }))
}
