//! `brood bench cluster`: the deployment measured, not a piece of it
//! (issue 27 item 1). N creations (`POST /api/agents`, each a root running
//! `true` as an exec agent) from C concurrent clients through K real `brood
//! serve` nodes over their control sockets, on SQLite (one node) or on
//! PostgreSQL (the nodes sharing a database made for the run, with a Redis
//! slot counter or the store's shares). The floor, measured in the same
//! run: the same N `true` started by a plain parallel spawner at the same
//! concurrency (`xargs -P C`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use brood_server::client::Connection;
use serde_json::{Value, json};

use super::daemons::{Node, call, endpoint};
use super::pct;

pub(super) struct Params {
    pub n: usize,
    pub clients: usize,
    pub nodes: usize,
    /// `--store postgres://…` (an administrator's URL: a database is made
    /// on its server for the run); none: SQLite in the node's root.
    pub store: Option<String>,
    /// `--slots redis://host[:port]/db`, emptied before and after.
    pub slots: Option<String>,
}

/// The program every agent and every floor process runs.
const PROGRAM: &str = "true";

pub(super) async fn run(root: &Option<PathBuf>, exe: &str, p: &Params) -> Result<Value> {
    if p.store.is_none() && p.nodes > 1 {
        bail!(crate::Exit(
            2,
            "bench cluster: nodes cannot share a SQLite store; --nodes above 1 needs --store postgres://…"
                .into()
        ));
    }
    if let Some(url) = &p.slots {
        redis_flush(url)?;
    }
    let db = match &p.store {
        Some(admin) => Some(Database::make(admin).await?),
        None => None,
    };
    let dir = match root {
        Some(r) => r.clone(),
        // The roots on tmpfs where there is one, so the projection's file
        // writes are not a disk's.
        None => super::scratch_bases()
            .remove(0)
            .join(format!("brood-bench-cluster-{}", std::process::id())),
    };
    let mut out = measure(&dir, exe, p, db.as_ref().map(|d| d.url.as_str())).await;
    if let (Ok(v), Some(db)) = (&mut out, &db) {
        v["database"] = json!(db.name);
    }
    // Whatever happened: the nodes were stopped in `measure` (dropped),
    // then their roots, database and counter go.
    if root.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(db) = db {
        db.drop().await?;
    }
    if let Some(url) = &p.slots {
        redis_flush(url)?;
    }
    out
}

async fn measure(dir: &Path, exe: &str, p: &Params, store: Option<&str>) -> Result<Value> {
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let mut args = super::daemons::platform_config(dir)?;
    if let Some(url) = &p.slots {
        args.extend(["--slots".to_owned(), url.clone()]);
    }
    let mut nodes = Vec::new();
    for i in 0..p.nodes {
        nodes.push(Node::start(exe, &dir.join(format!("n{i}")), store, &args).await?);
    }
    let roots: Vec<PathBuf> = nodes.iter().map(|n| n.root.clone()).collect();

    // The floor first, the nodes started and idle, so both see the same machine.
    let (n, clients) = (p.n, p.clients);
    let floor = tokio::task::spawn_blocking(move || {
        brood_launch::floor::parallel_runs(&[PROGRAM.into()], n, clients)
    })
    .await
    .context("the floor's spawner")?
    .with_context(|| format!("the floor: {n} runs of {PROGRAM}"))?;

    let (acks, t0_ms) = create(&roots, p.n, p.clients).await?;
    let ended = all_ended(&roots, p.n).await?;
    drop(nodes);

    let mut lat: Vec<Duration> = acks.iter().map(|a| a.latency).collect();
    lat.sort();
    let last_ack = acks.iter().map(|a| a.at).max().unwrap_or_default();
    let rate = round1(acks.len() as f64 / last_ack.as_secs_f64().max(1e-9));
    let floor_rate = round1(p.n as f64 / floor.as_secs_f64().max(1e-9));
    let all_ended_ms = ended.last_end_ms - t0_ms;
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    let slots = match &p.slots {
        Some(url) => format!("Redis ({url})"),
        None if store.is_some() => "the store's shares".into(),
        None => "embedded".into(),
    };
    Ok(json!({
        "bench": "cluster",
        "store": if store.is_some() { "PostgreSQL" } else { "SQLite" },
        "nodes": p.nodes, "clients": p.clients, "n": p.n, "slots": slots,
        "roots": dir.display().to_string(),
        "acknowledged": acks.len(),
        "acknowledged_per_s": rate,
        "last_ack_s": round3(last_ack.as_secs_f64()),
        "latency_p50_ms": ms(pct(&lat, 0.5)), "latency_p90_ms": ms(pct(&lat, 0.9)),
        "latency_p99_ms": ms(pct(&lat, 0.99)),
        "latency_max_ms": ms(lat.last().copied().unwrap_or_default()),
        "ended": ended.count, "statuses": ended.statuses,
        "all_ended_s": round3(all_ended_ms as f64 / 1e3),
        "floor_per_s": floor_rate,
        "floor_all_ended_s": round3(floor.as_secs_f64()),
        "ratio": round3(rate / floor_rate.max(1e-9)),
        "what": format!("{} POST /api/agents (a root running `{PROGRAM}`, protocol exec) from {} clients spread over the nodes' sockets; acknowledged_per_s: n / the time until the last 201; all_ended_s: until the last agent's recorded end", p.n, p.clients),
        "floor": format!("the same {} `{PROGRAM}` started by {} threads, each waiting for its process before the next (xargs -P {})", p.n, p.clients, p.clients),
    }))
}

/// One acknowledged creation: how long its `POST` took, and when (from the
/// first `POST`) its 201 came.
struct Ack {
    latency: Duration,
    at: Duration,
}

/// `n` creations from `clients` kept-alive connections, client `c` on node
/// `c mod K`, each taking the next number until all are taken; with the
/// wall-clock time of the start (Unix ms), the connections already open.
async fn create(roots: &[PathBuf], n: usize, clients: usize) -> Result<(Vec<Ack>, i64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::with_capacity(clients);
    for c in 0..clients {
        let root = &roots[c % roots.len()];
        let conn = Connection::open(&endpoint(root))
            .await
            .with_context(|| format!("connecting to the node in {}", root.display()))?;
        conns.push(conn);
    }
    let t0 = Instant::now();
    let t0_ms = unix_ms();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let next = next.clone();
            tokio::spawn(async move {
                let mut acks = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(acks);
                    }
                    let body =
                        json!({"name": format!("bc{i}"), "argv": [PROGRAM], "protocol": "exec"});
                    let sent = Instant::now();
                    let a = conn
                        .call("POST", "/api/agents", Some(&body))
                        .await
                        .with_context(|| format!("POST /api/agents (bc{i})"))?;
                    if a.status != 201 {
                        bail!("POST /api/agents (bc{i}) answered {}: {}", a.status, a.body);
                    }
                    acks.push(Ack {
                        latency: sent.elapsed(),
                        at: t0.elapsed(),
                    });
                }
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.context("a client task")??);
    }
    Ok((all, t0_ms))
}

struct Ended {
    count: usize,
    statuses: serde_json::Map<String, Value>,
    /// The latest recorded end among them (Unix ms).
    last_end_ms: i64,
}

/// Waits until no node lists a live agent, then reads the `n` agents'
/// records: how many ended, with which status, and the last end.
async fn all_ended(roots: &[PathBuf], n: usize) -> Result<Ended> {
    let t = Instant::now();
    loop {
        let mut live = 0;
        for root in roots {
            let a = call(root, "GET", "/api/agents", None).await?;
            live += a["agents"].as_array().map_or(0, Vec::len);
        }
        if live == 0 {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("bench cluster: {live} agents still live 600 s after the last creation");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = call(&roots[0], "GET", "/api/agents?all=true", None).await?;
    let ours: Vec<&Value> = listed["agents"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter(|a| a["name"].as_str().is_some_and(|s| s.starts_with("bc")))
                .collect()
        })
        .unwrap_or_default();
    if ours.len() != n {
        bail!(
            "bench cluster: {} of the {n} agents created are listed by the node in {}",
            ours.len(),
            roots[0].display()
        );
    }
    let mut statuses = serde_json::Map::new();
    let mut count = 0;
    let mut last_end_ms = 0;
    for a in ours {
        let status = a["status"].as_str().unwrap_or("?").to_owned();
        let e = statuses.entry(status).or_insert(json!(0));
        *e = json!(e.as_u64().unwrap_or(0) + 1);
        if let Some(end) = a["ended_ms"].as_i64() {
            count += 1;
            last_end_ms = last_end_ms.max(end);
        }
    }
    Ok(Ended {
        count,
        statuses,
        last_end_ms,
    })
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A database of the run's own on the server of an administrator's URL,
/// so runs never see each other's agents; dropped (its connections ended)
/// after the run.
pub(super) struct Database {
    admin: String,
    pub(super) name: String,
    pub(super) url: String,
}

impl Database {
    /// `measure` run on a database made for it on `admin`'s server, which
    /// goes afterwards even when the run failed (a failure to drop it is
    /// reported after the run's own); the figures name the database.
    pub(super) async fn around<F, Fut>(admin: &str, measure: F) -> Result<Value>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<Value>>,
    {
        let db = Database::make(admin).await?;
        let measured = measure(db.url.clone()).await;
        let name = db.name.clone();
        let dropped = db.drop().await;
        let mut v = measured?;
        dropped?;
        v["database"] = json!(name);
        Ok(v)
    }

    pub(super) async fn make(admin: &str) -> Result<Database> {
        let name = format!("brood_bench_{}_{}", std::process::id(), unix_ms());
        sql(admin, &format!("CREATE DATABASE {name}")).await?;
        Ok(Database {
            admin: admin.to_owned(),
            url: with_database(admin, &name)?,
            name,
        })
    }

    pub(super) async fn drop(self) -> Result<()> {
        sql(
            &self.admin,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        )
        .await
    }
}

async fn sql(url: &str, statement: &str) -> Result<()> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("bench cluster: connecting to {}", redacted(url)))?;
    let task = tokio::spawn(conn);
    let r = client
        .batch_execute(statement)
        .await
        .with_context(|| format!("bench cluster: {statement} on {}", redacted(url)));
    drop(client);
    let _ = task.await;
    r
}

/// `url` without its password, for errors.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:…{}", &url[..s + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

/// `url` naming database `db` instead of its own (query parameters kept).
fn with_database(url: &str, db: &str) -> Result<String> {
    let start = url
        .find("://")
        .map(|i| i + 3)
        .with_context(|| format!("not a PostgreSQL URL: {}", redacted(url)))?;
    let rest = &url[start..];
    let authority = rest.find(['/', '?']).unwrap_or(rest.len());
    let after = &rest[authority..];
    let query = after.find('?').map_or("", |i| &after[i..]);
    Ok(format!(
        "{}{}/{db}{query}",
        &url[..start],
        &rest[..authority]
    ))
}

/// Empties the Redis database `url` names (`redis://host[:port]/db`, the
/// number required: the counter's db is the benchmark's alone), so counts
/// of an earlier run's nodes do not hold the tenant's slots.
fn redis_flush(url: &str) -> Result<()> {
    let refused = |why: &str| {
        anyhow::Error::new(crate::Exit(
            2,
            format!(
                "bench cluster: --slots {url}: {why} (redis://host[:port]/db, a database number of the benchmark's own, emptied before and after)"
            ),
        ))
    };
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| refused("not a redis:// URL"))?;
    let (authority, db) = rest
        .split_once('/')
        .ok_or_else(|| refused("no database number"))?;
    let db: u32 = db
        .parse()
        .map_err(|_| refused("the database is not a number"))?;
    if authority.contains('@') {
        return Err(refused("credentials are not supported"));
    }
    let has_port = match authority.rfind(']') {
        Some(close) => authority[close..].contains(':'),
        None => authority.contains(':'),
    };
    let addr = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:6379")
    };
    let mut s = std::net::TcpStream::connect(&addr)
        .with_context(|| format!("bench cluster: connecting to Redis at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let db = db.to_string();
    let request = format!(
        "*2\r\n$6\r\nSELECT\r\n${}\r\n{db}\r\n*1\r\n$7\r\nFLUSHDB\r\n",
        db.len()
    );
    s.write_all(request.as_bytes())
        .with_context(|| format!("bench cluster: writing to Redis at {addr}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while got.iter().filter(|b| **b == b'\n').count() < 2 {
        let k = s
            .read(&mut buf)
            .with_context(|| format!("bench cluster: reading from Redis at {addr}"))?;
        if k == 0 {
            break;
        }
        got.extend_from_slice(&buf[..k]);
    }
    let got = String::from_utf8_lossy(&got);
    if got != "+OK\r\n+OK\r\n" {
        bail!("bench cluster: SELECT {db} and FLUSHDB on Redis at {addr} answered {got:?}");
    }
    Ok(())
}
