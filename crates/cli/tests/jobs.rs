//! Jobs (SPEC 10), as far as they are built: created whole through the CLI
//! and the API from CSV, JSON or JSON lines, or refused at creation naming
//! what was wrong with nothing created; listed, shown with their counts,
//! their items read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

fn serve(root: &Path) -> Daemon {
    #[allow(clippy::disallowed_methods)]
    let child = Command::new(exe())
        .arg("--root")
        .arg(root)
        .args(["serve", "--grace", "0.3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let sock = root.join("brood.sock");
    assert!(eventually(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    }));
    d
}

#[test]
fn jobs_are_created_from_files_or_refused_with_nothing_created() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    let _d = serve(&root);
    let mut spawn = vec!["spawn", "--name", "owner", "--ready", "--"];
    let a = agent(&["--hang"]);
    spawn.extend(a.iter().map(String::as_str));
    let o = brood(&root, &spawn);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let f = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let csv = f("rows.csv", "id,title\nb1,Dune\nb2,\"Emma, a novel\"\n");
    let create = |input: &str, extra: &[&str]| {
        let mut args = vec![
            "job",
            "create",
            "--owner",
            "owner",
            "--instruction",
            "Summarise {title}",
            "--input",
            input,
        ];
        args.extend(extra);
        brood(&root, &args)
    };
    let o = create(&csv, &["--id", "books", "--id-column", "id"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "books\towner\tpending\t2 pending\n"
    );
    let jl = f(
        "rows.jsonl",
        "{\"n\": 1, \"title\": \"A\"}\n{\"n\": 2, \"title\": \"B\"}\n{\"n\": 3, \"title\": \"C\"}\n",
    );
    let o = create(&jl, &["--id", "lines", "--id-column", "n", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(
        (v["total"].as_u64(), v["spec"]["max_attempts"].as_u64()),
        (Some(3), Some(3))
    );
    let o = brood(&root, &["job", "items", "books", "--json"]);
    let items: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(items[1]["id"], "b2");
    assert_eq!(items[1]["input"]["title"], "Emma, a novel");
    let o = brood(&root, &["job", "get", "books"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("instruction: Summarise {title}"),
        "{}",
        text(&o)
    );

    // Each bad input is refused (exit 2), naming what was wrong, and leaves
    // no job behind.
    let bad_schema = f("schema.json", r#"{"type": "no-such-type"}"#);
    let cases: Vec<(String, Vec<&str>, &str)> = vec![
        (f("empty.csv", ""), vec![], "no rows"),
        (
            f("header.csv", "name,title\nx,y\n"),
            vec!["--id-column", "id"],
            "no column \"id\"",
        ),
        (
            f("dup.csv", "id,title\na,x\na,y\n"),
            vec!["--id-column", "id"],
            "\"a\" is used twice",
        ),
        (
            f("bad.jsonl", "{\"title\": \"A\"}\n{\"title\": \n"),
            vec![],
            "input line 2: not JSON",
        ),
        (
            csv.clone(),
            vec!["--id", "x"],
            "\"author\" is not in the input",
        ),
        (
            csv.clone(),
            vec!["--schema", bad_schema.as_str()],
            "output_schema",
        ),
    ];
    for (input, extra, want) in cases {
        let instruction = if want.contains("author") {
            "Summarise {author}"
        } else {
            "Summarise {title}"
        };
        let mut args = vec![
            "job",
            "create",
            "--owner",
            "owner",
            "--instruction",
            instruction,
            "--input",
            input.as_str(),
        ];
        args.extend(extra.iter().copied());
        let o = brood(&root, &args);
        assert_eq!(o.status.code(), Some(2), "{want}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(want),
            "{want}: {}",
            text(&o)
        );
    }
    let o = brood(&root, &["job", "list"]);
    let lines: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2, "only the two good jobs: {lines:?}");
    let o = brood(
        &root,
        &[
            "job",
            "create",
            "--owner",
            "ghost",
            "--instruction",
            "x",
            "--input",
            &csv,
        ],
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let o = brood(&root, &["job", "get", "nope"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
}
