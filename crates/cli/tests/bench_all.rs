//! `brood bench all` (issue 26 item 6), run `--quick` with the real binary:
//! on SQLite alone its Markdown table has exactly the columns
//! docs/benchmarks.md shows, one row per bench that ran, the PostgreSQL
//! benches named as not run, and every ratio the quotient of its row's
//! figure and floor; with `--store postgres://…` the PostgreSQL benches
//! run too, on databases made for the run and dropped after it. No figure
//! is asserted.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::database_exists;
use serde_json::Value;

const HEADER: &str = "| bench | figure | floor | ratio | target | date | machine |";

/// `brood --root ROOT bench all --quick ARGS…`, `store` as `BROOD_STORE`.
fn bench_all(root: &Path, store: Option<&str>, args: &[&str]) -> Output {
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new(common::exe());
    for var in [
        "BROOD_STORE",
        "BROOD_STORE_FILE",
        "BROOD_SLOTS",
        "BROOD_SOCKET",
        "BROOD_URL",
    ] {
        cmd.env_remove(var);
    }
    if let Some(s) = store {
        // The URL holds a password: never on a command line.
        cmd.env("BROOD_STORE", s);
    }
    let o = cmd
        .arg("--root")
        .arg(root)
        .args(["bench", "all", "--quick"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", common::text(&o));
    o
}

/// The number a cell starts with ("12,730 requests/s" → 12730), if any.
fn leading(cell: &str) -> Option<f64> {
    let n: String = cell
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
        .filter(|c| *c != ',')
        .collect();
    n.parse().ok()
}

/// A row's ratio: "—" where figure or floor is not a number, else
/// "R×" with R figure / floor (the figures are rounded as printed).
fn check_ratio(figure: &str, floor: &str, ratio: &str, row: &str) {
    match (leading(figure), leading(floor)) {
        (Some(f), Some(fl)) if fl > 0.0 => {
            let r: f64 = ratio
                .strip_suffix('×')
                .unwrap_or_else(|| panic!("ratio {ratio:?} is not N×: {row}"))
                .parse()
                .unwrap_or_else(|e| panic!("ratio {ratio:?}: {e}: {row}"));
            let want = f / fl;
            assert!(
                (r - want).abs() <= 0.006 + 0.01 * want,
                "ratio {r} is not {f} / {fl}: {row}"
            );
        }
        _ => assert_eq!(ratio, "—", "no ratio without two figures: {row}"),
    }
}

/// The benches that run without PostgreSQL, one row each (the spawn
/// levels, the API's three parts, admission alone and concurrent, jobs
/// reused and a worker each).
const SQLITE_ROWS: &[&str] = &[
    "spawn `none`",
    "spawn `landlock`",
    "spawn `limits`",
    "spawn `ns`",
    "spawn `full`",
    "cascade, 20 descendants",
    "api: spawn through `POST /api/agents`",
    "api: `GET /api/agents/:name`, 4 clients",
    "api: SSE, 4 subscribers",
    "admission, SQLite, one requester",
    "admission, SQLite, 4 requesters",
    "jobs, 40 items, 2 reused workers",
    "jobs, 4 items, a worker each",
    "cluster, one node, SQLite, 10 creations",
];

const POSTGRES_ROWS: &[&str] = &[
    "admission, PostgreSQL, one requester",
    "admission, PostgreSQL, 4 requesters over 3 stores",
    "nodes: a cancel across three nodes",
    "cluster, 3 nodes, PostgreSQL, 10 creations",
];

const NOT_RUN: &[&str] = &[
    "admission, PostgreSQL",
    "nodes: a cancel across three nodes",
    "cluster, 3 nodes, PostgreSQL",
];

#[test]
fn the_markdown_table_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_all(dir.path(), None, &["--markdown"]);
    let out = String::from_utf8(o.stdout).unwrap();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(HEADER), "{out}");
    assert_eq!(
        lines.next(),
        Some("| --- | --- | --- | --- | --- | --- | --- |"),
        "{out}"
    );
    let machine = regex::Regex::new(r"^[0-9]+ cores, \S+ [0-9]+\.[0-9]+$").unwrap();
    let date = regex::Regex::new(r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$").unwrap();
    let (mut ran, mut not_run) = (Vec::new(), Vec::new());
    for row in lines {
        let cells: Vec<&str> = row
            .strip_prefix("| ")
            .and_then(|r| r.strip_suffix(" |"))
            .unwrap_or_else(|| panic!("not a table row: {row:?}\n{out}"))
            .split(" | ")
            .collect();
        let [bench, figure, floor, ratio, target, day, on] = cells[..] else {
            panic!("not seven cells: {row:?}");
        };
        assert!(date.is_match(day), "date {day:?}: {row}");
        assert!(machine.is_match(on), "machine {on:?}: {row}");
        if figure.starts_with("not run: needs `--store postgres://…`") {
            not_run.push(bench);
            continue;
        }
        assert!(
            leading(figure).is_some(),
            "the figure starts with its number: {row}"
        );
        assert!(!target.is_empty(), "{row}");
        check_ratio(figure, floor, ratio, row);
        ran.push(bench);
    }
    assert_eq!(ran, SQLITE_ROWS, "one row per bench that ran:\n{out}");
    assert_eq!(not_run, NOT_RUN, "{out}");
    // Every bench's own root under the given one is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the root: {left:?}");
}

#[test]
fn the_postgres_benches_on_databases_of_their_own() {
    let admin = brood_store_conformance::pg::admin_url();
    let dir = tempfile::tempdir().unwrap();
    let o = bench_all(dir.path(), Some(&admin), &["--json"]);
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)));
    assert_eq!(v["failed"], serde_json::json!([]), "{v}");
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["bench"].as_str().unwrap()).collect();
    let want: Vec<&str> = SQLITE_ROWS.iter().chain(POSTGRES_ROWS).copied().collect();
    assert_eq!(names, want, "{v}");
    for r in rows {
        let cell = |k: &str| r[k].as_str().unwrap();
        check_ratio(cell("figure"), cell("floor"), cell("ratio"), &r.to_string());
    }
    // The PostgreSQL benches measured PostgreSQL, each in a database made
    // for it, and every such database is gone.
    let results = &v["results"];
    assert_eq!(results["cluster-postgres"]["store"], "PostgreSQL", "{v}");
    assert!(
        results["admission-postgres"]["store"]
            .as_str()
            .unwrap()
            .starts_with("PostgreSQL (3 stores"),
        "{v}"
    );
    let made: Vec<&str> = ["admission-postgres", "nodes", "cluster-postgres"]
        .iter()
        .map(|k| results[k]["database"].as_str().unwrap())
        .collect();
    for name in made {
        assert!(name.starts_with("brood_bench_"), "{name}: {v}");
        assert!(!database_exists(&admin, name), "{name} was dropped");
    }
}
