//! `brood bench all`: every bench in turn, each as a child process of this
//! binary (`brood bench NAME … --json`), its figures turned into rows of one
//! table (bench, figure, floor, ratio, target, date, machine): the table
//! docs/benchmarks.md shows. A child process each, so one bench's
//! supervisor, threads and page cache are gone before the next starts, and
//! each is run exactly as a user runs it alone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::cluster::Database;

pub(super) struct Params {
    /// Small counts everywhere: a smoke run, not figures.
    pub quick: bool,
    pub markdown: bool,
    pub json: bool,
    /// The global `--store`, when it is a PostgreSQL server's URL.
    pub postgres: Option<String>,
    /// The global `--slots`, given to `bench cluster --nodes 3`.
    pub slots: Option<String>,
}

/// One row of the table.
struct Row {
    bench: String,
    figure: String,
    floor: String,
    ratio: String,
    target: String,
}

impl Row {
    fn new(bench: impl Into<String>, figure: String, floor: String, target: &str) -> Row {
        Row {
            bench: bench.into(),
            figure,
            floor,
            ratio: DASH.into(),
            target: target.into(),
        }
    }

    /// The same row with the ratio of two figures.
    fn ratio(mut self, figure: f64, floor: f64) -> Row {
        if floor > 0.0 {
            self.ratio = format!("{:.2}×", figure / floor);
        }
        self
    }
}

const DASH: &str = "—";

/// Where a bench's store comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// SQLite in the bench's root (no `--store`).
    Sqlite,
    /// A database this run makes on the server and drops afterwards.
    OwnDatabase,
    /// The server's administrator URL itself: the bench makes its own database.
    Admin,
}

/// One bench as run: its arguments (full and `--quick`) and its rows.
struct Bench {
    /// The root subdirectory and the progress line's name.
    key: &'static str,
    args: &'static [&'static str],
    quick: &'static [&'static str],
    store: Store,
    rows: fn(&Value) -> Vec<Row>,
    /// The rows' names when not run (no PostgreSQL given).
    names: &'static [&'static str],
}

const BENCHES: &[Bench] = &[
    Bench {
        key: "spawn",
        args: &["spawn", "--sandbox", "all"],
        quick: &["-n", "5"],
        store: Store::Sqlite,
        rows: spawn_rows,
        names: &[],
    },
    Bench {
        key: "cascade",
        args: &["cascade"],
        quick: &["-n", "20", "--rounds", "1"],
        store: Store::Sqlite,
        rows: cascade_rows,
        names: &[],
    },
    Bench {
        key: "api",
        args: &["api"],
        quick: &[
            "-n",
            "3",
            "--clients",
            "4",
            "--seconds",
            "0.3",
            "--subscribers",
            "4",
        ],
        store: Store::Sqlite,
        rows: api_rows,
        names: &[],
    },
    Bench {
        key: "admission",
        args: &["admission"],
        quick: &["-n", "200", "--requesters", "4"],
        store: Store::Sqlite,
        rows: |v| admission_rows(v, "SQLite", "≥ 5,000/s", "≥ 5,000/s"),
        names: &[],
    },
    Bench {
        key: "jobs",
        args: &["jobs"],
        quick: &["--items", "40", "--per-item", "4", "--concurrency", "2"],
        store: Store::Sqlite,
        rows: jobs_rows,
        names: &[],
    },
    Bench {
        key: "cluster",
        args: &["cluster"],
        quick: &["-n", "10", "--clients", "2"],
        store: Store::Sqlite,
        rows: |v| cluster_rows(v, "≥ 0.6× (issue 27)"),
        names: &[],
    },
    Bench {
        key: "admission-postgres",
        args: &["admission", "--nodes", "3"],
        quick: &["-n", "200", "--requesters", "4"],
        store: Store::OwnDatabase,
        rows: |v| admission_rows(v, "PostgreSQL", "(reported)", "≥ 2,000/s (issue 15)"),
        names: &["admission, PostgreSQL"],
    },
    Bench {
        key: "nodes",
        args: &["nodes"],
        quick: &["--rounds", "2", "--children", "2"],
        store: Store::OwnDatabase,
        rows: nodes_rows,
        names: &["nodes: a cancel across three nodes"],
    },
    Bench {
        key: "cluster-postgres",
        args: &["cluster", "--nodes", "3"],
        quick: &["-n", "10", "--clients", "2"],
        store: Store::Admin,
        rows: |v| cluster_rows(v, "≥ 0.5× (issue 27)"),
        names: &["cluster, 3 nodes, PostgreSQL"],
    },
];

pub(super) async fn run(root: &Option<PathBuf>, exe: &str, p: &Params) -> Result<i32> {
    let date = brood_core::time::rfc3339_utc_ms(unix_ms())
        .chars()
        .take(10)
        .collect::<String>();
    let machine = machine();
    let mut rows = Vec::new();
    let mut results = serde_json::Map::new();
    let mut failed = Vec::new();
    for b in BENCHES {
        let admin = match (b.store, p.postgres.as_deref()) {
            (Store::Sqlite, _) => None,
            (_, Some(admin)) => Some(admin),
            (_, None) => {
                for name in b.names {
                    rows.push(Row::new(
                        *name,
                        "not run: needs `--store postgres://…`".into(),
                        DASH.into(),
                        DASH,
                    ));
                }
                continue;
            }
        };
        eprintln!("bench all: {}", b.key);
        let out = match (b.store, admin) {
            // `bench nodes` and `bench admission` work in the database they
            // are given: one of this run's own, so a run never writes into
            // the administrator's database nor meets another run's rows.
            (Store::OwnDatabase, Some(admin)) => match Database::make(admin).await {
                Ok(db) => {
                    let out = child(exe, root, b, p, Some(&db.url)).await;
                    let name = db.name.clone();
                    let dropped = db.drop().await;
                    out.and_then(|mut v| {
                        v["database"] = json!(name);
                        dropped.map(|()| v)
                    })
                }
                Err(e) => Err(e),
            },
            (_, admin) => child(exe, root, b, p, admin).await,
        };
        match out {
            Ok(v) => {
                rows.extend((b.rows)(&v));
                results.insert(b.key.into(), v);
            }
            Err(e) => {
                eprintln!("bench all: {}: {e:#}", b.key);
                failed.push(b.key);
            }
        }
    }
    for key in &failed {
        rows.push(Row::new(
            *key,
            "failed (its error above)".into(),
            DASH.into(),
            DASH,
        ));
    }
    if p.json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({"bench": r.bench, "figure": r.figure, "floor": r.floor,
                       "ratio": r.ratio, "target": r.target})
            })
            .collect();
        println!(
            "{}",
            json!({"bench": "all", "quick": p.quick, "date": date, "machine": machine,
                   "rows": rows, "results": results, "failed": failed})
        );
    } else {
        print!("{}", table(&rows, &date, &machine, p.markdown));
    }
    if failed.is_empty() {
        Ok(0)
    } else {
        anyhow::bail!(crate::Exit(
            1,
            format!("bench all: {} failed", failed.join(", "))
        ))
    }
}

/// `brood [--root ROOT/KEY] bench ARGS… --json`, its stdout parsed. The
/// store is only the one passed (in the environment: a URL may hold a
/// password); the child's stderr is the user's.
async fn child(
    exe: &str,
    root: &Option<PathBuf>,
    b: &Bench,
    p: &Params,
    store: Option<&str>,
) -> Result<Value> {
    let mut cmd = super::daemons::brood(exe, store);
    if let (Store::Admin, Some(slots)) = (b.store, &p.slots) {
        cmd.env("BROOD_SLOTS", slots);
    }
    // Each bench in a root of its own under the given one, so no bench
    // meets another's agents; without one, each makes (and removes) its own.
    let sub = root
        .as_ref()
        .map(|r| r.join(format!("bench-all-{}", b.key)));
    if let Some(sub) = &sub {
        let _ = std::fs::remove_dir_all(sub);
        cmd.arg("--root").arg(sub);
    }
    cmd.arg("bench").args(b.args);
    if p.quick {
        cmd.args(b.quick);
    }
    cmd.arg("--json")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    let what = format!("brood bench {} --json", b.args.join(" "));
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .with_context(|| format!("waiting for {what}"))?
        .with_context(|| format!("starting {what}"))?;
    if let Some(sub) = &sub {
        let _ = std::fs::remove_dir_all(sub);
    }
    if !out.status.success() {
        anyhow::bail!("{what} ended with {}", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{what} printed no JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The rows as a Markdown table, or as aligned text.
fn table(rows: &[Row], date: &str, machine: &str, markdown: bool) -> String {
    let head = [
        "bench", "figure", "floor", "ratio", "target", "date", "machine",
    ];
    let cells: Vec<[&str; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.bench.as_str(),
                r.figure.as_str(),
                r.floor.as_str(),
                r.ratio.as_str(),
                r.target.as_str(),
                date,
                machine,
            ]
        })
        .collect();
    let mut out = String::new();
    if markdown {
        let line = |c: &[&str]| format!("| {} |\n", c.join(" | "));
        out.push_str(&line(&head));
        out.push_str(&line(&["---"; 7]));
        for c in &cells {
            out.push_str(&line(c));
        }
        return out;
    }
    let mut width = head.map(|h| h.chars().count());
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: &[&str]| {
        let padded: Vec<String> = c
            .iter()
            .zip(width)
            .map(|(s, w)| format!("{s}{}", " ".repeat(w - s.chars().count())))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    out.push_str(&line(&head));
    for c in &cells {
        out.push_str(&line(c));
    }
    out
}

/// "2 cores, Linux 6.18": what the figures were measured on.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let read = |p: &str| std::fs::read_to_string(Path::new(p)).unwrap_or_default();
    let os = read("/proc/sys/kernel/ostype").trim().to_owned();
    let release = read("/proc/sys/kernel/osrelease");
    // The kernel's major and minor version: the rest is the distribution's.
    let version: Vec<&str> = release.trim().split(['.', '-']).take(2).collect();
    let os = if os.is_empty() { "Linux".into() } else { os };
    format!("{cores} cores, {os} {}", version.join("."))
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// `x` with `decimals` decimals and thousands separated by commas: 12,730.
fn fmt(x: f64, decimals: usize) -> String {
    let s = format!("{:.*}", decimals, x.abs());
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, ch) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    let sign = if x < 0.0 && s.chars().any(|c| c.is_ascii_digit() && c != '0') {
        "-"
    } else {
        ""
    };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// A latency in µs as read: µs below a millisecond, ms above.
fn latency_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{} µs", fmt(us, 0))
    } else {
        format!("{} ms", fmt(us / 1000.0, 1))
    }
}

fn spawn_rows(v: &Value) -> Vec<Row> {
    let n = num(v, "n");
    v["levels"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let (ours, floor) = (num(l, "brood_median_us"), num(l, "floor_median_us"));
            Row::new(
                format!("spawn `{}`", l["sandbox"].as_str().unwrap_or("?")),
                format!("{} µs median of {}", fmt(ours, 0), fmt(n, 0)),
                format!("{} µs", fmt(floor, 0)),
                &format!("≤ {:.1}×", num(l, "target_ratio")),
            )
            .ratio(ours, floor)
        })
        .collect()
}

fn cascade_rows(v: &Value) -> Vec<Row> {
    let (ours, floor) = (num(v, "brood_median_ms"), num(v, "floor_median_ms"));
    vec![
        Row::new(
            format!("cascade, {} descendants", fmt(num(v, "descendants"), 0)),
            format!(
                "{} ms median of {} {}",
                fmt(ours, 1),
                fmt(num(v, "rounds"), 0),
                if num(v, "rounds") == 1.0 {
                    "round"
                } else {
                    "rounds"
                }
            ),
            format!("{} ms", fmt(floor, 1)),
            &format!("≤ {:.1}×", num(v, "target_ratio")),
        )
        .ratio(ours, floor),
    ]
}

fn api_rows(v: &Value) -> Vec<Row> {
    let (s, g, e) = (&v["spawn"], &v["get"], &v["sse"]);
    let (ours, floor) = (num(s, "api_median_ms"), num(s, "floor_median_ms"));
    let (rps, floor_rps) = (num(g, "requests_per_s"), num(g, "floor_per_s"));
    vec![
        Row::new(
            "api: spawn through `POST /api/agents`",
            format!("{} ms median ({:+.3} ms)", fmt(ours, 3), num(s, "added_ms")),
            format!("{} ms in-process", fmt(floor, 3)),
            &format!("≤ +{} ms added", num(s, "target_added_ms")),
        )
        .ratio(ours, floor),
        Row::new(
            format!(
                "api: `GET /api/agents/:name`, {} clients",
                fmt(num(g, "clients"), 0)
            ),
            format!("{} requests/s", fmt(rps, 0)),
            format!("{}/s in-process, one task", fmt(floor_rps, 0)),
            &format!("≥ {}/s", fmt(num(g, "target_per_s"), 0)),
        )
        .ratio(rps, floor_rps),
        Row::new(
            format!("api: SSE, {} subscribers", fmt(num(e, "subscribers"), 0)),
            format!(
                "{} deliveries/s (lag p50 {} ms, p99 {} ms)",
                fmt(num(e, "deliveries_per_s"), 0),
                num(e, "lag_median_ms"),
                num(e, "lag_p99_ms")
            ),
            DASH.into(),
            "(reported)",
        ),
    ]
}

fn admission_rows(v: &Value, store: &str, one: &str, many: &str) -> Vec<Row> {
    let stores = v["store"]
        .as_str()
        .and_then(|s| s.split_once(" stores").map(|(a, _)| a.rsplit('(').next()))
        .flatten()
        .filter(|k| *k != "1")
        .map(|k| format!(" over {k} stores"))
        .unwrap_or_default();
    vec![
        Row::new(
            format!("admission, {store}, one requester"),
            format!(
                "{}/s (p99 {})",
                fmt(num(v, "one_requester_per_s"), 0),
                latency_us(num(v, "one_requester_p99_us"))
            ),
            DASH.into(),
            one,
        ),
        Row::new(
            format!(
                "admission, {store}, {} requesters{stores}",
                fmt(num(v, "requesters"), 0)
            ),
            format!(
                "{}/s (p99 {})",
                fmt(num(v, "concurrent_per_s"), 0),
                latency_us(num(v, "concurrent_p99_us"))
            ),
            DASH.into(),
            many,
        ),
    ]
}

fn jobs_rows(v: &Value) -> Vec<Row> {
    let (ours, floor) = (num(v, "reused_per_s"), num(v, "floor_per_s"));
    let mut rows = vec![
        Row::new(
            format!(
                "jobs, {} items, {} reused workers",
                fmt(num(v, "reused_items"), 0),
                fmt(num(v, "concurrency"), 0)
            ),
            format!("{} items/s", fmt(ours, 0)),
            format!("{} items/s, the store alone", fmt(floor, 0)),
            "≥ 2,000 items/s",
        )
        .ratio(ours, floor),
    ];
    if v.get("per_item_per_s").is_some() {
        rows.push(Row::new(
            format!(
                "jobs, {} items, a worker each",
                fmt(num(v, "per_item_items"), 0)
            ),
            format!("{} items/s", fmt(num(v, "per_item_per_s"), 0)),
            DASH.into(),
            "(reported)",
        ));
    }
    rows
}

fn cluster_rows(v: &Value, target: &str) -> Vec<Row> {
    let (ours, floor) = (num(v, "acknowledged_per_s"), num(v, "floor_per_s"));
    let nodes = num(v, "nodes");
    let store = v["store"].as_str().unwrap_or("?");
    let name = if nodes == 1.0 {
        format!("cluster, one node, {store}")
    } else {
        format!("cluster, {} nodes, {store}", fmt(nodes, 0))
    };
    vec![
        Row::new(
            format!("{name}, {} creations", fmt(num(v, "n"), 0)),
            format!(
                "{} acknowledged/s (p99 {} ms)",
                fmt(ours, 1),
                fmt(num(v, "latency_p99_ms"), 1)
            ),
            format!("{}/s, a parallel spawner", fmt(floor, 1)),
            target,
        )
        .ratio(ours, floor),
    ]
}

fn nodes_rows(v: &Value) -> Vec<Row> {
    let (ours, floor) = (num(v, "across_median_ms"), num(v, "floor_median_ms"));
    vec![
        Row::new(
            "nodes: a cancel across three nodes",
            format!(
                "{} ms median of {} (p99 {} ms)",
                fmt(ours, 1),
                fmt(num(v, "rounds"), 0),
                fmt(num(v, "across_p99_ms"), 1)
            ),
            format!("{} ms, every child on one node", fmt(floor, 1)),
            "(reported)",
        )
        .ratio(ours, floor),
    ]
}
