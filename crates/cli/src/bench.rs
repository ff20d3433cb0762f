//! `brood bench`: brood's paths timed against their floors in the same run
//! (SPEC 16). A benchmark is not a test: it prints figures and ratios, and
//! asserts nothing.

mod admission;
mod all;
mod api;
mod cluster;
mod daemons;
mod gateway;
mod jobs;
mod memory;
mod nodes;
mod restart;
mod restart_lost;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use brood_core::AgentName;
use brood_launch::{cgroup, floor};
use brood_runtime::{Caller, Config, SpawnRequest, Supervisor};
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand)]
pub enum Which {
    /// Every bench in turn (each a child process), as one table: bench,
    /// figure, floor, ratio, target, date, machine. The PostgreSQL benches
    /// (nodes, admission, cluster --nodes 3) run only with `--store
    /// postgres://…`, on databases made for the run.
    All {
        /// Print the table as Markdown (docs/benchmarks.md's).
        #[arg(long)]
        markdown: bool,
        /// Small counts in every bench: a smoke run, not figures.
        #[arg(long)]
        quick: bool,
        /// Print the rows and every bench's own figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Spawn through the whole path until `ready`, against a bare posix_spawn with
    /// the same handshake.
    Spawn {
        /// Spawns timed, of each level.
        #[arg(short = 'n', long = "count", default_value_t = 200)]
        n: usize,
        /// none (every agent's baseline: no_new_privs, capabilities dropped, an
        /// all-access landlock ruleset), landlock (files and network restricted,
        /// exec limited to the program), limits (memory, pids, cpu), ns (a private
        /// mount namespace and an empty network namespace), full (all of them), or
        /// all (each level in turn, with the cost of each layer).
        #[arg(long, default_value = "none")]
        sandbox: String,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a tree of N live descendants until every process is gone and every
    /// record says cancelled, against a bare cgroup.kill of N processes.
    Cascade {
        /// Live descendants in the tree cancelled.
        #[arg(short = 'n', long = "count", default_value_t = 1000)]
        n: usize,
        /// Trees built and cancelled, one after another.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A cancel's reach across three `brood serve` nodes sharing the store
    /// named by `--store postgres://…`: until every child process on the
    /// other nodes is gone, against the same cancel with every child on the
    /// parent's node.
    Nodes {
        /// Cancels timed.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        /// Children per round.
        #[arg(long, default_value_t = 4)]
        children: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The deployment: N creations (`POST /api/agents`, each a root running
    /// `true`) from concurrent clients through real `brood serve` nodes,
    /// creations acknowledged a second, their latency and the time until all
    /// ended, against the same N `true` started by a parallel spawner at the
    /// same concurrency. On SQLite (one node), or on a database made for the
    /// run on the server of `--store postgres://…`; `--slots
    /// redis://host[:port]/db` gives the nodes that Redis database (emptied
    /// before and after) as their slot counter.
    Cluster {
        /// Creations.
        #[arg(short = 'n', long = "count", default_value_t = 1000)]
        n: usize,
        /// Concurrent clients, spread over the nodes; also the floor's
        /// concurrency.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// `brood serve` nodes (more than one needs `--store postgres://…`).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A streamed model call through a live agent's model gateway (issue
    /// 31), first token and whole stream, against the same call straight
    /// to the same loopback provider.
    Gateway {
        /// Calls timed, of each.
        #[arg(short = 'n', long = "count", default_value_t = 200)]
        n: usize,
        /// Chunks each streamed answer holds, a millisecond apart.
        #[arg(long, default_value_t = 50)]
        chunks: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The `brood serve` daemon's RSS and open descriptors with 0, 100 and
    /// 1,000 live idle agents (roots created through its API), and per live
    /// agent, against 32 KiB and 2 descriptors; the daemon's own process
    /// only (the agents are processes of their own). On SQLite, and also on
    /// a database made for the run on the server of `--store postgres://…`.
    Memory {
        /// Live agents at each reading, comma-separated (0, the baseline,
        /// is always read).
        #[arg(long, value_delimiter = ',', default_value = "0,100,1000")]
        agents: Vec<usize>,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// N live resumable roots (`on_restart: resume`) on a `brood serve`
    /// node killed with SIGKILL and started again: the time until every one
    /// runs again, against the time to start them fresh. On SQLite, and also
    /// on a database made for the run on the server of `--store postgres://…`.
    Restart {
        /// Live agents killed and resumed.
        #[arg(short = 'n', long = "count", default_value_t = 1000)]
        n: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The HTTP API: spawn through `POST /api/agents` against the same spawn
    /// in-process, `GET /api/agents/:name` from concurrent clients, and
    /// events delivered to SSE subscribers with their lag.
    Api {
        /// Spawns timed through the API, and in-process.
        #[arg(short = 'n', long = "count", default_value_t = 200)]
        n: usize,
        /// Concurrent clients reading an agent.
        #[arg(long, default_value_t = 100)]
        clients: usize,
        /// How long the clients read, in seconds.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// SSE subscribers receiving the events.
        #[arg(long, default_value_t = 100)]
        subscribers: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Creations per second through attenuation and the quota-checked admission
    /// transaction (records only, no processes), alone and with 100 concurrent
    /// requesters, with their latency.
    Admission {
        /// Creations timed, alone and concurrently.
        #[arg(short = 'n', long = "count", default_value_t = 5000)]
        n: usize,
        /// Concurrent requesters.
        #[arg(long, default_value_t = 100)]
        requesters: usize,
        /// With `--store postgres://…`: that many stores at once (a pool of
        /// connections each, as that many nodes would hold), the concurrent
        /// requesters spread over them, all in one tenant.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Items per second for a job with trivial workers (test agents that
    /// report at once): workers reused item after item, and a new worker per
    /// item, against the same store calls alone (no supervisor, no process).
    Jobs {
        /// Items of the reused-worker run (and of the store-only floor).
        #[arg(long, default_value_t = 10_000)]
        items: usize,
        /// Items of the run with a new worker per item (a process each, so
        /// fewer); 0 leaves it out.
        #[arg(long, default_value_t = 500)]
        per_item: usize,
        /// Workers at once.
        #[arg(long, default_value_t = 8)]
        concurrency: u32,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A sandbox level of `bench spawn`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Base,
    Landlock,
    Limits,
    Ns,
    Full,
}

impl Level {
    const ALL: [Level; 5] = [
        Level::Base,
        Level::Landlock,
        Level::Limits,
        Level::Ns,
        Level::Full,
    ];

    fn name(self) -> &'static str {
        match self {
            Level::Base => "none",
            Level::Landlock => "landlock",
            Level::Limits => "limits",
            Level::Ns => "ns",
            Level::Full => "full",
        }
    }

    fn parse(s: &str) -> Result<Level> {
        Level::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--sandbox must be none, landlock, limits, ns, full or all, not {s:?}"
                )
            })
    }

    /// The policy (and `iso`) of this level for an agent running `exe`.
    fn policy(self, exe: &str) -> (Option<serde_json::Value>, brood_core::Iso) {
        let exe_dir = std::path::Path::new(exe)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into());
        let landlock = json!({
            "tools": ["file_read"],
            "files": [{"path": "/", "mode": "ro"}, {"path": "/tmp", "mode": "rw"}],
            "network": "none",
        });
        let limits =
            json!({"resources": {"memory_max": "256M", "pids_max": 64, "cpu_weight": 100}});
        let mut mounts: Vec<String> = ["/usr", "/lib", "/lib64", "/bin"]
            .iter()
            .filter(|p| std::path::Path::new(p).exists())
            .map(|p| format!("{p}\t{p}\tro\tbind,nosuid,nodev"))
            .collect();
        mounts.push(format!("{exe_dir}\t{exe_dir}\tro\tbind,nosuid,nodev"));
        let ns = json!({"mounts": mounts, "network": "none"});
        let merge = |parts: &[&serde_json::Value]| {
            let mut out = serde_json::Map::new();
            for p in parts {
                if let Some(o) = p.as_object() {
                    out.extend(o.clone());
                }
            }
            serde_json::Value::Object(out)
        };
        match self {
            Level::Base => (None, brood_core::Iso::None),
            Level::Landlock => (Some(landlock), brood_core::Iso::None),
            Level::Limits => (Some(limits), brood_core::Iso::None),
            Level::Ns => (Some(ns), brood_core::Iso::Ns),
            Level::Full => (Some(merge(&[&landlock, &limits, &ns])), brood_core::Iso::Ns),
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn req(
    name: String,
    parent: Option<AgentName>,
    argv: Vec<String>,
    ready: bool,
) -> Result<SpawnRequest> {
    Ok(SpawnRequest {
        customer: None,
        label: None,
        placement: None,
        traceparent: None,
        name: Some(AgentName::new(&name)?),
        parent,
        argv,
        protocol: brood_store::Protocol::Brood,
        task: String::new(),
        env: Vec::new(),
        secrets: brood_api::Secrets::new(),
        cwd: None,
        session: brood_core::SessionName::default_session(),
        await_ready: ready,
        policy: None,
        life: brood_core::Life::Owned,
        iso: brood_core::Iso::None,
        root: None,
    })
}

async fn supervisor(root: &Option<PathBuf>, what: &str) -> Result<(Supervisor, PathBuf)> {
    let dir = match root {
        Some(r) => r.clone(),
        None => std::env::temp_dir().join(format!("brood-bench-{what}-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let mut cfg = Config::new(dir.clone());
    // The agents' ways in as `brood serve` gives them (a door each, served
    // on a task), so a spawn is timed as deployed.
    brood_server::Entrances::new().install(&mut cfg);
    cfg.grace = Duration::from_secs(3);
    // A thousand live agents under one root: the bench's own root gets the
    // platform ceilings as its defaults.
    cfg.quotas = brood_core::quota::QuotaConfig::new(
        brood_core::quota::Quotas::CEILINGS,
        brood_core::quota::Quotas::CEILINGS,
    );
    cfg.bin_dir = crate::bin_dir();
    // Traced as `brood serve` would be when the standard variables name a
    // collector (docs/tracing.md): how the overhead of tracing is measured.
    if let Some(endpoint) = brood_otel::endpoint_from_env(None) {
        let x = brood_otel::Exporter::start(brood_otel::Config::new(endpoint, "brood-bench"))
            .map_err(|e| anyhow::anyhow!(e))?;
        cfg.traces = Some(std::sync::Arc::new(x));
    }
    Ok((
        Supervisor::start(cfg).context("starting the supervisor")?,
        dir,
    ))
}

/// A benchmark, stopped by SIGINT or SIGTERM without leaving anything
/// behind (issue 28): the measuring is dropped, which stops the nodes it
/// started (SIGTERM, then waited for: they remove their own groups); then
/// every group this process's own supervisors made is killed and removed,
/// and the temporary roots it made under the temp directory go. Exits 130
/// or 143 at once, as a shell reports those signals.
pub async fn run(root: Option<PathBuf>, slots: Option<String>, which: Which) -> Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let (code, name) = tokio::select! {
        r = measure(root, slots, which) => return r,
        _ = int.recv() => (130, "SIGINT"),
        _ = term.recv() => (143, "SIGTERM"),
    };
    let groups = cgroup::detect(Path::new("/")).and_then(|det| cgroup::remove_own(&det));
    if let Err(e) = &groups {
        eprintln!("bench: removing this benchmark's cgroups failed: {e}");
    }
    let mine = format!("-{}", std::process::id());
    for base in scratch_bases() {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("brood-bench-") && n.ends_with(&mine) {
                remove_settling(&e.path());
            }
        }
    }
    eprintln!(
        "bench: stopped by {name}; its nodes stopped and {} group(s) of its own removed",
        groups.unwrap_or(0)
    );
    // Exit now: the runtime's shutdown would wait for blocking work still
    // running (a floor's spawner), and nothing of it is wanted any more.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code)
}

/// Removes a temporary root that threads of the dropped measuring (an
/// in-process supervisor's projection and store writers) may still be
/// writing into for a moment: a file made during the walk leaves a
/// directory behind, so the removal is tried again until the root is gone,
/// for at most two seconds.
fn remove_settling(dir: &Path) {
    for _ in 0..40 {
        let _ = std::fs::remove_dir_all(dir);
        if !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("bench: could not remove {}", dir.display());
}

/// Where a bench that starts nodes keeps their roots: `--root` when given
/// (left in place afterwards), else `brood-bench-<name>-<pid>` in the temp
/// directory, which the bench removes (`true`).
pub(super) fn scratch_dir(root: &Option<PathBuf>, name: &str) -> (PathBuf, bool) {
    match root {
        Some(r) => (r.clone(), false),
        None => (
            std::env::temp_dir().join(format!("brood-bench-{name}-{}", std::process::id())),
            true,
        ),
    }
}

/// Where a benchmark makes its temporary roots (`brood-bench-*-<pid>`),
/// preferred first: tmpfs where there is one (so the projection's file
/// writes are not a disk's), then the temp directory. An interrupted
/// benchmark removes its own from each.
pub(crate) fn scratch_bases() -> Vec<PathBuf> {
    let shm = Path::new("/dev/shm");
    let mut bases = Vec::new();
    if shm.is_dir() {
        bases.push(shm.to_path_buf());
    }
    bases.push(std::env::temp_dir());
    bases
}

/// The store the nodes of `bench NAME` run on: the global `--store` when it
/// is a PostgreSQL server, none (SQLite in each node's root) when not given;
/// anything else is refused (exit 2), naming the bench.
fn daemons_store(name: &str) -> Result<Option<String>> {
    let store = crate::store_spec();
    if let Some(s) = store
        .as_deref()
        .filter(|s| !brood_store::is_postgres_url(s))
    {
        anyhow::bail!(crate::Exit(
            2,
            format!(
                "bench {name}: --store is a PostgreSQL server (postgres://…) or nothing (SQLite in the node's root), not {s:?}"
            )
        ));
    }
    Ok(store)
}

async fn measure(root: Option<PathBuf>, slots: Option<String>, which: Which) -> Result<i32> {
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    let me = Caller::User {
        uid: crate::unsafe_uid(),
    };
    match which {
        Which::All {
            markdown,
            quick,
            json,
        } => {
            let postgres = crate::store_spec().filter(|s| brood_store::is_postgres_url(s));
            let p = all::Params {
                quick,
                markdown,
                json,
                postgres,
                slots,
            };
            return all::run(&root, &exe, &p).await;
        }
        Which::Cluster {
            n,
            clients,
            nodes,
            json: as_json,
        } => {
            let store = daemons_store("cluster")?;
            let params = cluster::Params {
                n: n.max(1),
                clients: clients.max(1),
                nodes: nodes.max(1),
                store,
                slots,
            };
            let out = cluster::run(&root, &exe, &params).await?;
            print_result(&out, as_json);
        }
        Which::Gateway { n, chunks, json } => {
            let p = gateway::Params { calls: n, chunks };
            print_result(&gateway::run(&root, &exe, me, &p).await?, json);
        }
        Which::Memory {
            agents,
            json: as_json,
        } => {
            let store = daemons_store("memory")?;
            let params = memory::Params {
                levels: memory::levels(&agents),
                store,
            };
            let out = memory::run(&root, &exe, &params).await?;
            if as_json {
                println!("{out}");
            } else {
                memory::print(&out);
            }
        }
        Which::Restart { n, json: as_json } => {
            let store = daemons_store("restart")?;
            let params = restart::Params { n: n.max(1), store };
            let out = restart::run(&root, &exe, &params).await?;
            if as_json {
                println!("{out}");
            } else {
                restart::print(&out);
            }
        }
        Which::Nodes {
            rounds,
            children,
            json: as_json,
        } => {
            let Some(store) = crate::store_spec().filter(|s| brood_store::is_postgres_url(s))
            else {
                anyhow::bail!(crate::Exit(
                    2,
                    "bench nodes needs --store postgres://… (a store nodes can share)".into()
                ));
            };
            let out = nodes::run(&exe, &store, rounds.max(1), children.max(1)).await?;
            print_result(&out, as_json);
        }
        Which::Jobs {
            items,
            per_item,
            concurrency,
            json: as_json,
        } => {
            let params = jobs::Params {
                items,
                per_item,
                concurrency: concurrency.max(1),
            };
            let out = jobs::run(&root, &exe, &params).await?;
            if as_json {
                println!("{out}");
            } else {
                jobs::print(&out);
            }
        }
        Which::Api {
            n,
            clients,
            seconds,
            subscribers,
            json: as_json,
        } => {
            let (sup, dir) = supervisor(&root, "api").await?;
            let params = api::Params {
                n,
                clients: clients.max(1),
                seconds,
                subscribers: subscribers.max(1),
            };
            let out = api::run(&sup, &dir, &exe, &params).await;
            sup.shutdown().await;
            if root.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            print_result(&out?, as_json);
        }
        Which::Admission {
            n,
            requesters,
            nodes,
            json: as_json,
        } => {
            let out = admission::run(&root, n, requesters.max(1), nodes.max(1))?;
            print_result(&out, as_json);
        }
        Which::Spawn {
            n,
            sandbox,
            json: as_json,
        } => {
            let (sup, dir) = supervisor(&root, "spawn").await?;
            // Whatever happens, the supervisor is shut down: no group or process of
            // the benchmark outlives it.
            let measured: Result<Vec<serde_json::Value>> = async {
                let init = brood_proto::encode(&brood_proto::ToAgent::Init {
                    config: brood_proto::InitConfig::default(),
                    agent_config: json!({}),
                });
                let argv: Vec<OsString> = vec![exe.clone().into(), "test-agent".into()];
                let levels: Vec<Level> = match sandbox.as_str() {
                    "all" => Level::ALL.to_vec(),
                    s => vec![Level::parse(s)?],
                };
                let mut rows = Vec::new();
                for level in levels {
                    let (policy, iso) = level.policy(&exe);
                    let (mut ours, mut bare) = (Vec::with_capacity(n), Vec::with_capacity(n));
                    // Warm both paths (page cache, store file) before timing; the floor
                    // and brood alternate so drift hits both alike.
                    for i in 0..n + 5 {
                        let b = floor::spawn_ready(&argv, &init).context("bare spawn")?;
                        let name = format!("{}{i}", level.name());
                        let mut r = req(
                            name.clone(),
                            None,
                            vec![exe.clone(), "test-agent".into()],
                            true,
                        )?;
                        r.policy = policy.clone();
                        r.iso = iso;
                        let t0 = Instant::now();
                        let a = crate::api(sup.spawn(me.clone(), r).await)?;
                        let o = t0.elapsed();
                        if a.status == "failed" {
                            anyhow::bail!(
                                "bench spawn ({}): the agent failed to start: {}",
                                level.name(),
                                serde_json::json!(a.detail)
                            );
                        }
                        crate::api(
                            sup.wait(me.clone(), vec![AgentName::new(&name)?], None)
                                .await,
                        )?;
                        if i >= 5 {
                            ours.push(o);
                            bare.push(b);
                        }
                    }
                    let (mo, mb) = (median(&mut ours), median(&mut bare));
                    let ratio = mo.as_secs_f64() / mb.as_secs_f64().max(1e-9);
                    rows.push(json!({
                        "sandbox": level.name(),
                        "brood_median_us": mo.as_micros(), "brood_p90_us": pct(&ours, 0.9).as_micros(),
                        "floor_median_us": mb.as_micros(), "floor_p90_us": pct(&bare, 0.9).as_micros(),
                        "ratio": (ratio * 100.0).round() / 100.0,
                        "target_ratio": if level == Level::Base { 2.0 } else { 2.5 },
                    }));
                }
                Ok(rows)
            }
            .await;
            sup.shutdown().await;
            let mut rows = measured?;
            // The cost of each layer on its own: its median minus the base level's.
            if let Some(base) = rows
                .iter()
                .find(|r| r["sandbox"] == "none")
                .and_then(|r| r["brood_median_us"].as_i64())
            {
                for r in rows.iter_mut() {
                    if let Some(m) = r["brood_median_us"].as_i64() {
                        r["layer_cost_us"] = json!(m - base);
                    }
                }
            }
            let out = json!({
                "bench": "spawn", "n": n,
                "floor": "posix_spawn of the same binary + the same init/ready handshake",
                "containment": sup.host_info().containment,
                "levels": rows,
            });
            if as_json {
                println!("{out}");
            } else {
                println!(
                    "spawn, n = {n}; floor: {}",
                    out["floor"].as_str().unwrap_or("")
                );
                println!(
                    "{:<10} {:>12} {:>12} {:>7} {:>7} {:>14}",
                    "sandbox", "brood µs", "floor µs", "ratio", "target", "layer cost µs"
                );
                for r in out["levels"].as_array().into_iter().flatten() {
                    let f = |k: &str| r.get(k).map(|v| v.to_string()).unwrap_or_default();
                    println!(
                        "{:<10} {:>12} {:>12} {:>7} {:>7} {:>14}",
                        r["sandbox"].as_str().unwrap_or(""),
                        f("brood_median_us"),
                        f("floor_median_us"),
                        f("ratio"),
                        f("target_ratio"),
                        f("layer_cost_us")
                    );
                }
            }
            if root.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        Which::Cascade {
            n,
            rounds,
            json: as_json,
        } => {
            let (sup, dir) = supervisor(&root, "cascade").await?;
            let det = cgroup::detect(std::path::Path::new("/"));
            let cg = det.and_then(|det| {
                cgroup::Cgroups::open(&det, &format!("benchfloor-{}", std::process::id()))
            });
            let measured: Result<(Vec<Duration>, Vec<Duration>)> = async {
                let cg = cg
                    .as_ref()
                    .map_err(|e| anyhow::anyhow!("the floor's cgroups: {e}"))?;
                // The floor kills the same program the tree runs: idle test agents.
                let sleeper: Vec<OsString> = vec![exe.clone().into(), "test-agent".into()];
                let (mut ours, mut bare) = (Vec::new(), Vec::new());
                let per_child = (n / 10).max(1) - 1;
                for r in 0..rounds {
                    bare.push(floor::cgroup_kill(cg, &format!("floor{r}"), &sleeper, n)?);
                    // root -> 10 children -> (n/10 - 1) grandchildren each: n descendants.
                    let root_name = format!("casc{r}");
                    let hang = vec![exe.clone(), "test-agent".into(), "--hang".into()];
                    crate::api(
                        sup.spawn(
                            me.clone(),
                            req(root_name.clone(), None, hang.clone(), true)?,
                        )
                        .await,
                    )?;
                    let root_agent = AgentName::new(&root_name)?;
                    let mut count = 0;
                    for c in 0..10 {
                        let cname = format!("casc{r}-{c}");
                        crate::api(
                            sup.spawn(
                                me.clone(),
                                req(cname.clone(), Some(root_agent.clone()), hang.clone(), true)?,
                            )
                            .await,
                        )?;
                        count += 1;
                        for g in 0..per_child {
                            crate::api(
                                sup.spawn(
                                    me.clone(),
                                    req(
                                        format!("casc{r}-{c}-{g}"),
                                        Some(AgentName::new(&cname)?),
                                        hang.clone(),
                                        true,
                                    )?,
                                )
                                .await,
                            )?;
                            count += 1;
                        }
                    }
                    // Timed from a settled node, as the floor is: the
                    // tree's own files written (its creation's work, not
                    // the cancel's; the projection is seconds behind a
                    // burst of 1,000 creations).
                    sup.flush().await;
                    let t0 = Instant::now();
                    crate::api(sup.cancel(me.clone(), root_agent.clone()).await)?;
                    crate::api(sup.wait(me.clone(), vec![root_agent.clone()], None).await)?;
                    let dt = t0.elapsed();
                    let left = sup
                        .store()
                        .descendants_post_order(sup.tenant(), &root_agent)?
                        .iter()
                        .filter(|a| {
                            !matches!(
                                a.status,
                                brood_core::Status::Ended(brood_core::Terminal::Cancelled(_))
                            )
                        })
                        .count();
                    if left != 0 || count != n {
                        anyhow::bail!(
                            "cascade round {r}: {left} of {count} descendants not cancelled"
                        );
                    }
                    ours.push(dt);
                }
                Ok((ours, bare))
            }
            .await;
            if let Ok(cg) = &cg {
                let _ = cg.destroy();
                cg.remove_instance_dirs();
            }
            sup.shutdown().await;
            let (mut ours, mut bare) = measured?;
            let (mo, mb) = (median(&mut ours), median(&mut bare));
            let ratio = mo.as_secs_f64() / mb.as_secs_f64().max(1e-9);
            let out = json!({
                "bench": "cascade", "descendants": n, "rounds": rounds,
                "brood_median_ms": mo.as_secs_f64() * 1e3, "floor_median_ms": mb.as_secs_f64() * 1e3,
                "ratio": (ratio * 100.0).round() / 100.0, "target_ratio": 3.0,
                "floor": "cgroup.kill of N idle test-agent processes (the same binary) in one group, until all are reaped and the group removed",
            });
            print_result(&out, as_json);
            if root.is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    Ok(0)
}

fn print_result(v: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{v}");
        return;
    }
    if let Some(o) = v.as_object() {
        for (k, val) in o {
            println!("{k:<18} {val}");
        }
    }
}
