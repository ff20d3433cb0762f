//! The OpenAPI document is exact (issue 25 item 7): schemathesis, from PyPI
//! (`.ci/setup` installs it into `target/ci-python`), generates requests
//! from the document served by a live supervisor on its TCP listener,
//! valid ones and invalid ones, and runs every check it has on each answer:
//! no 5xx, every status and content type declared, every body of its
//! schema, valid requests accepted and invalid ones refused, methods the
//! document does not list refused with 405, the token required where the
//! document says so. Its configuration and hooks are in `tests/openapi/`
//! (`schemathesis.toml`, `schemathesis_hooks.py`).
//!
//! The number of examples is bounded and the seed fixed, so a run is the
//! same run every time and takes well under two minutes on two cores.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::wire::{Served, raw};

/// Test cases per operation in the fuzzing phase (the coverage phase's
/// are as many as the schemas' boundaries).
const EXAMPLES: &str = "10";
/// The seed of the run (the number).
const SEED: &str = "25";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_the_document_exact() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = here.join("../../target/ci-python/bin/schemathesis");
    assert!(
        bin.exists(),
        "{} is missing: run `bash .ci/setup` (it installs schemathesis from PyPI)",
        bin.display()
    );
    let s = Served::start(|_| {}).await;
    // The document, read as the operator (it is behind the token), for
    // schemathesis to read from a file; its requests go to the listener.
    let doc = raw(&s.tcp(Some(&s.token)), "GET", "/api/openapi.json", &[], b"").await;
    assert_eq!(doc.status, 200, "{}", doc.body);
    // Its own working directory: schemathesis writes nothing into the tree.
    let work = tempfile::tempdir().unwrap();
    let spec = work.path().join("openapi.json");
    std::fs::write(&spec, &doc.body).unwrap();
    let url = format!("http://{}", s.tcp);
    let dir = here.join("tests/openapi");
    #[allow(clippy::disallowed_methods)]
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--config-file")
        .arg(dir.join("schemathesis.toml"))
        .arg("run")
        .arg(&spec)
        .args(["--url", &url, "--checks", "all", "--seed", SEED])
        .args(["--max-examples", EXAMPLES, "--workers", "2"])
        .env("BROOD_TOKEN", &s.token)
        .env("SCHEMATHESIS_HOOKS", dir.join("schemathesis_hooks.py"))
        .env("NO_COLOR", "1")
        .current_dir(work.path());
    // Off the runtime's threads: the daemon answers on them meanwhile.
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    s.env.sup.shutdown().await;
    assert!(
        out.status.success(),
        "schemathesis found the document and the server apart ({}):\n{report}",
        out.status
    );
    // A run that tested nothing would pass too: it tested every operation
    // of the document (`Selected: 45/45`, `Tested: 45`).
    let field = |name: &str| {
        report
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name:?} in the summary:\n{report}"))
    };
    let total = field("Selected:").rsplit('/').next().unwrap();
    let tested = field("Tested:");
    assert!(
        tested == total && total.parse::<u32>().unwrap() > 0,
        "{tested} of {total} operations tested:\n{report}"
    );
    eprintln!("{report}");
}
