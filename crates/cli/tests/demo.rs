//! Issue 25 item 9, the demo's part: `brood demo` piped prints each part's
//! final tree once (not every frame), and README's "What the demo shows"
//! says what it prints: the numbers are read from README and from the
//! demo's output and must agree, and the demo's own count of workers is
//! the store's.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::*;
use regex::Regex;
use serde_json::Value;

/// A number as README writes it (a digit string or a word).
fn number(word: &str) -> usize {
    let words = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    word.parse()
        .ok()
        .or_else(|| words.iter().position(|w| *w == word))
        .unwrap_or_else(|| panic!("{word:?} is not a number README may write"))
}

/// The captures of `re` in `text`, which must match.
fn caps<'t>(re: &str, text: &'t str, what: &str) -> regex::Captures<'t> {
    Regex::new(re)
        .unwrap()
        .captures(text)
        .unwrap_or_else(|| panic!("{what} does not say /{re}/:\n{text}"))
}

/// How many lines of `text` hold `needle`.
fn lines_with(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn the_demo_piped_prints_each_tree_once_and_readme_says_what_it_prints() {
    let dir = tempfile::tempdir().unwrap();
    // `brood` writes to a pipe here: not a terminal.
    let o = brood(dir.path(), &["demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        !out.contains('\x1b'),
        "no terminal control in a pipe:\n{out}"
    );
    for part in 1..=4 {
        assert_eq!(
            lines_with(&out, &format!("brood demo, part {part}:")),
            1,
            "part {part}'s title, once:\n{out}"
        );
    }
    // Each part's tree once: its root's line appears once, in its final state.
    let counter = caps(
        r"(?m)^(count-[0-9a-f]+)  completed  → 492 lines",
        &out,
        "part 1",
    )[1]
    .to_owned();
    assert_eq!(
        lines_with(&out, &format!("{counter}  ")),
        1,
        "part 1's tree:\n{out}"
    );
    let doomed = caps(
        r"(?m)^(doomed-[0-9a-f]+)  failed \(crashed\)$",
        &out,
        "part 2",
    )[1]
    .to_owned();
    // Its root's line, and the kill line naming it; no frame of it running.
    assert_eq!(
        lines_with(&out, &format!("{doomed}  ")),
        1,
        "part 2's tree:\n{out}"
    );
    assert_eq!(
        lines_with(&out, "count-a  running"),
        0,
        "a frame was printed:\n{out}"
    );

    assert_eq!(
        lines_with(&out, "lead  completed  spent $"),
        1,
        "part 3's tree:\n{out}"
    );
    assert_eq!(
        Regex::new(r"(?m)^batch  running")
            .unwrap()
            .find_iter(&out)
            .count(),
        1,
        "part 4's tree:\n{out}"
    );

    // README's numbers are the demo's.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let r = caps(
        r"Part 4: a job over a (\d+)-row CSV run by reused workers, (\w+) at a time, that are the owner's children: (\w+) rows fail their first attempt and are retried, (\w+) fails every attempt",
        &readme,
        "README",
    );
    let (rows, at_once, retried, failing) =
        (number(&r[1]), number(&r[2]), number(&r[3]), number(&r[4]));
    let title = caps(
        r"brood demo, part 4: a job of (\d+) rows run by reused workers, (\d+) at a time",
        &out,
        "the demo",
    );
    assert_eq!((number(&title[1]), number(&title[2])), (rows, at_once));
    let done = caps(
        r"(\d+) items completed \((\d+) after a retry\) by (\d+) workers",
        &out,
        "the demo",
    );
    assert_eq!(number(&done[1]), rows - failing, "{out}");
    assert_eq!(number(&done[2]), retried, "{out}");
    assert_eq!(
        lines_with(&out, "failed after 2 attempts"),
        failing,
        "{out}"
    );
    // README says more than `at_once` run in all; the demo's count is the
    // store's, and its tree draws each of them.
    let workers = number(&done[3]);
    assert!(workers > at_once, "{out}");
    let o = brood(dir.path(), &["ps", "-a", "--json"]);
    let all: Value = serde_json::from_slice(&o.stdout).unwrap();
    let in_store = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["name"].as_str().unwrap().starts_with("cities-w"))
        .count();
    assert_eq!(workers, in_store, "{out}");
    assert_eq!(lines_with(&out, "── cities-w"), workers, "{out}");
    // Part 2 as README shows it: the root and its six descendants running
    // when killed.
    let shown = caps(
        r"kill -9 \d+ \(the root agent doomed-\w+, with (\d+) agents of its tree running\)",
        &readme,
        "README",
    );
    let said = caps(
        r"kill -9 \d+ +\(the root agent doomed-\w+, with (\d+) agents of its tree running\)",
        &out,
        "the demo",
    );
    assert_eq!(shown[1], said[1]);
}
