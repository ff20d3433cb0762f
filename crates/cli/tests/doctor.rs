//! Issue 25 item 5, `brood doctor` with the real binary: right on a fresh
//! root (nothing false for want of a directory, nothing made), and it checks
//! the services the command line names, each with a line: the store (a
//! SQLite file, or the real PostgreSQL with its schema version) and the
//! slot counter's real Redis; one that does not answer is NOT available and
//! the exit status 1.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

/// `brood --root ROOT [--slots URL] doctor [--json]`, with `store` (a URL
/// holding a password goes in the environment, as a user would give it).
fn doctor(
    root: &Path,
    store: Option<&str>,
    slots: Option<&str>,
    json: bool,
) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    let mut c = Command::new(exe());
    c.arg("--root")
        .arg(root)
        .env_remove("BROOD_SOCKET")
        .env_remove("BROOD_STORE")
        .env_remove("BROOD_SLOTS");
    if let Some(s) = store {
        c.env("BROOD_STORE", s);
    }
    if let Some(s) = slots {
        c.args(["--slots", s]);
    }
    c.arg("doctor");
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

/// The line of `layer` in doctor's table: (available, detail).
fn line(o: &std::process::Output, layer: &str) -> (bool, String) {
    let text = String::from_utf8_lossy(&o.stdout);
    let l = text
        .lines()
        .find(|l| l.split("  ").next() == Some(layer))
        .unwrap_or_else(|| panic!("no {layer} line in:\n{text}"));
    let rest = l[layer.len()..].trim_start();
    if let Some(d) = rest.strip_prefix("NOT available") {
        (false, d.trim().to_owned())
    } else {
        let d = rest
            .strip_prefix("available")
            .unwrap_or_else(|| panic!("{l}"));
        (true, d.trim().to_owned())
    }
}

#[test]
fn doctor_is_right_on_a_fresh_root_and_checks_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("not/made/yet");
    let o = doctor(&root, None, None, false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (ok, d) = line(&o, "store");
    assert!(ok, "{d}");
    assert_eq!(
        d,
        format!(
            "SQLite {}/brood.db: not made yet; the first supervisor makes it (mode 0600)",
            root.display()
        )
    );
    let (ok, d) = line(&o, "slots");
    assert!(ok, "{d}");
    assert!(d.starts_with("embedded"), "{d}");
    // This machine runs brood as root with mount namespaces: the veil holds
    // here, fresh root or not.
    let (ok, d) = line(&o, "veil");
    assert!(ok, "the veil on a fresh root: {d}");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(!said.contains("machinery NOT hidden"), "{said}");
    assert!(!root.exists(), "doctor made {}", root.display());
    // The same as JSON.
    let o = doctor(&root, None, None, true);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let store = v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "store")
        .unwrap();
    assert_eq!(store["available"], true, "{v}");

    // Once a supervisor made the store, doctor opens it and reads its schema.
    let o = brood(&root, &["run", "--", "true"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = doctor(&root, None, None, false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (ok, d) = line(&o, "store");
    assert!(ok, "{d}");
    let re =
        regex::Regex::new(r"^SQLite .*/brood\.db: opens; schema version (\d+) \(this build's\)$")
            .unwrap();
    let n: i64 = re.captures(&d).unwrap_or_else(|| panic!("{d}"))[1]
        .parse()
        .unwrap();
    assert_eq!(n, brood_store::sqlite::MIGRATION_COUNT as i64, "{d}");

    // A store that is not a SQLite file is NOT available, exit 1.
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        "not a database, just text long enough to be read as one",
    )
    .unwrap();
    #[allow(clippy::disallowed_methods)]
    let o = Command::new(exe())
        .arg("--root")
        .arg(&root)
        .arg("--store")
        .arg(&junk)
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (ok, d) = line(&o, "store");
    assert!(!ok, "{d}");
    assert!(
        d.starts_with(&format!("SQLite {}: ", junk.display())),
        "{d}"
    );
}

#[test]
fn doctor_checks_postgresql_and_redis_when_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let db = brood_store_conformance::pg::Fresh::new();
    let redis = common::redis::server();
    let o = doctor(&root, Some(&db.url), Some(&redis.url()), false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let (ok, d) = line(&o, "store");
    assert!(ok, "{d}");
    // A fresh database: nothing applied yet; the password is never shown.
    assert!(d.starts_with("PostgreSQL "), "{d}");
    assert!(
        d.ends_with(&format!(
            ": opens; schema version 0 (the next supervisor brings it to {})",
            brood_store::postgres::MIGRATION_COUNT
        )),
        "{d}"
    );
    assert!(!d.contains(":brood@"), "the password shown: {d}");
    let (ok, d) = line(&o, "slots");
    assert!(ok, "{d}");
    assert_eq!(d, format!("Redis {}: answers PING", redis.url()));

    // Nothing listens there: NOT available, naming it, exit 1.
    let o = doctor(&root, Some(&db.url), Some("redis://127.0.0.1:1"), false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (ok, d) = line(&o, "slots");
    assert!(!ok, "{d}");
    assert!(d.contains("redis://127.0.0.1:1"), "{d}");
    let o = doctor(
        &root,
        Some("postgres://root@127.0.0.1:1/brood"),
        None,
        false,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (ok, d) = line(&o, "store");
    assert!(!ok, "{d}");
    assert!(
        d.starts_with("PostgreSQL postgres://root@127.0.0.1:1/brood: "),
        "{d}"
    );
    // Without --slots, a PostgreSQL store's nodes count slots in it.
    let o = doctor(&root, Some(&db.url), None, false);
    let (ok, d) = line(&o, "slots");
    assert!(ok && d.starts_with("the store's shares"), "{d}");
}
