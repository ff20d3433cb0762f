//! `brood bench api`: the HTTP API against the same work done in-process, in
//! the same run (SPEC 16): spawn through `POST /api/agents` on the control
//! socket against `Supervisor::spawn`; `GET /api/agents/:name` from 100
//! concurrent clients against the same read in-process; events delivered to
//! 100 SSE subscribers, with their lag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use brood_core::AgentName;
use brood_runtime::{Caller, Supervisor};
use brood_server::client::{Connection, Endpoint};
use serde_json::{Value, json};

use super::{median, pct, req};

pub(super) struct Params {
    pub n: usize,
    pub clients: usize,
    pub seconds: f64,
    pub subscribers: usize,
}

pub(super) async fn run(
    sup: &Supervisor,
    dir: &std::path::Path,
    exe: &str,
    p: &Params,
) -> Result<Value> {
    let me = Caller::User {
        uid: crate::unsafe_uid(),
    };
    let sock = dir.join("bench-api.sock");
    let listener = brood_server::bind_unix(&sock).await?;
    let server = tokio::spawn(brood_server::serve_unix(
        brood_server::Api::new(sup.clone(), None),
        listener,
    ));
    let ep = Endpoint::Unix(sock.clone());
    let out = async {
        let spawn = spawn(sup, &me, &ep, exe, p.n).await?;
        // The reads are timed from a settled node, as the cascade is: the
        // spawns' ctx files written first. Their writing took a core for
        // seconds on ext4 (its search for free inodes after many deletes),
        // and fell on the in-process floor and the API's reads unequally.
        sup.flush().await;
        let get = get(sup, &ep, p.clients, p.seconds).await?;
        let sse = sse(sup, &me, &ep, exe, p.subscribers).await?;
        Ok::<_, anyhow::Error>(json!({"bench": "api", "spawn": spawn, "get": get, "sse": sse}))
    }
    .await;
    server.abort();
    let _ = std::fs::remove_file(&sock);
    out
}

/// Spawn until `ready`: through the API (one kept-alive connection) and
/// in-process, alternating.
async fn spawn(sup: &Supervisor, me: &Caller, ep: &Endpoint, exe: &str, n: usize) -> Result<Value> {
    let mut conn = Connection::open(ep).await?;
    let (mut api, mut direct) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 5 {
        let name = format!("sp{i}");
        let body = json!({"name": name, "argv": [exe, "test-agent"], "await_ready": true});
        let t0 = Instant::now();
        let a = conn.call("POST", "/api/agents", Some(&body)).await?;
        let t_api = t0.elapsed();
        if a.status != 201 {
            bail!(
                "bench api: POST /api/agents answered {}: {}",
                a.status,
                a.body
            );
        }
        let name2 = format!("sd{i}");
        let r = req(
            name2.clone(),
            None,
            vec![exe.to_owned(), "test-agent".into()],
            true,
        )?;
        let t0 = Instant::now();
        crate::api(sup.spawn(me.clone(), r).await)?;
        let t_direct = t0.elapsed();
        for n in [name, name2] {
            crate::api(sup.cancel(me.clone(), AgentName::new(&n)?).await)?;
        }
        if i >= 5 {
            api.push(t_api);
            direct.push(t_direct);
        }
    }
    // Let the cancels finish before the next part.
    for i in 0..n + 5 {
        for n in [format!("sp{i}"), format!("sd{i}")] {
            crate::api(sup.wait(me.clone(), vec![AgentName::new(&n)?], None).await)?;
        }
    }
    let (ma, md) = (median(&mut api), median(&mut direct));
    let added = ma.as_secs_f64() * 1e3 - md.as_secs_f64() * 1e3;
    Ok(json!({
        "n": n,
        "api_median_ms": ms(ma), "api_p90_ms": ms(pct(&api, 0.9)),
        "floor_median_ms": ms(md), "floor_p90_ms": ms(pct(&direct, 0.9)),
        "floor": "Supervisor::spawn in-process, the same request",
        "added_ms": (added * 1000.0).round() / 1000.0,
        "ratio": round2(ma.as_secs_f64() / md.as_secs_f64().max(1e-9)),
        "target_added_ms": 0.3,
    }))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `GET /api/agents/:name` from `clients` kept-alive connections for
/// `seconds`, against the same read (`View::show`) in-process.
async fn get(sup: &Supervisor, ep: &Endpoint, clients: usize, seconds: f64) -> Result<Value> {
    let name = "sp5";
    let view = sup.view();
    let target = AgentName::new(name)?;
    // The floor: the same read, as fast as one task goes.
    let t0 = Instant::now();
    let mut floor_n = 0u64;
    while t0.elapsed().as_secs_f64() < seconds.min(2.0) {
        crate::api(view.show(&target))?;
        floor_n += 1;
    }
    let floor_rps = floor_n as f64 / t0.elapsed().as_secs_f64();

    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut conn = Connection::open(ep).await?;
        let (done, stop) = (done.clone(), stop.clone());
        let path = format!("/api/agents/{name}");
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match conn.call("GET", &path, None).await {
                    Ok(a) if a.status == 200 => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(a) => return Err(format!("GET answered {}: {}", a.status, a.body)),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let took = t0.elapsed().as_secs_f64();
    let total = done.load(Ordering::Relaxed);
    for t in tasks {
        t.await?
            .map_err(|e| anyhow::anyhow!("bench api: a client failed: {e}"))?;
    }
    let rps = total as f64 / took;
    Ok(json!({
        "clients": clients, "seconds": seconds, "requests": total,
        "requests_per_s": rps.round(),
        "floor": "View::show in-process, one task",
        "floor_per_s": floor_rps.round(),
        "ratio": round2(rps / floor_rps.max(1e-9)),
        "target_per_s": 10000,
    }))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Events delivered to `subscribers` SSE streams while agents are created
/// and run: deliveries a second, and the lag from an event's record to its
/// arrival.
async fn sse(
    sup: &Supervisor,
    me: &Caller,
    ep: &Endpoint,
    exe: &str,
    subscribers: usize,
) -> Result<Value> {
    let head = sup.store().last_event_seq(sup.tenant())?;
    let from = format!("{}-{head}", sup.tenant());
    let agents = 100;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, i64, i64)>();
    let mut tasks = Vec::new();
    for s in 0..subscribers {
        let (ep, from, tx) = (ep.clone(), from.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            brood_server::client::stream(&ep, "/api/events", Some(&from), |e| {
                let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
                let seq = v["sequence"].as_i64().unwrap_or(0);
                let lag = now_ms() - v["timestamp"].as_i64().unwrap_or(0);
                tx.send((s, seq, lag)).is_ok()
            })
            .await
        }));
    }
    drop(tx);
    // Every subscriber is connected before the first event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    for i in 0..agents {
        let r = req(
            format!("ev{i}"),
            None,
            vec![
                exe.to_owned(),
                "test-agent".into(),
                "--result".into(),
                "x".into(),
            ],
            false,
        )?;
        crate::api(sup.spawn(me.clone(), r).await)?;
    }
    for i in 0..agents {
        crate::api(
            sup.wait(me.clone(), vec![AgentName::new(&format!("ev{i}"))?], None)
                .await,
        )?;
    }
    let end = sup.store().last_event_seq(sup.tenant())?;
    let events = (end - head) as usize;
    let mut last = vec![head; subscribers];
    let mut lags = Vec::with_capacity(events * subscribers);
    let mut delivered = 0usize;
    while last.iter().any(|l| *l < end) {
        let (s, seq, lag) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .context("bench api: a subscriber stopped receiving events")?
            .context("bench api: every subscriber's stream ended")?;
        if seq <= last[s] {
            bail!(
                "bench api: subscriber {s} got event {seq} after {}",
                last[s]
            );
        }
        last[s] = seq;
        delivered += 1;
        lags.push(Duration::from_millis(lag.max(0) as u64));
    }
    let took = t0.elapsed().as_secs_f64();
    for t in tasks {
        t.abort();
    }
    lags.sort();
    Ok(json!({
        "subscribers": subscribers, "agents": agents, "events": events,
        "delivered": delivered,
        "deliveries_per_s": (delivered as f64 / took).round(),
        "lag_median_ms": pct(&lags, 0.5).as_millis(), "lag_p99_ms": pct(&lags, 0.99).as_millis(),
        "lag_max_ms": lags.last().map(|d| d.as_millis()).unwrap_or(0),
        "note": "events recorded while 100 agents are created and run; lag from the event's timestamp (ms) to its arrival",
    }))
}
