//! Every walk-through runs as written (issue 25 item 6): the command blocks
//! of README.md and every page below docs/, each page's in order, on a fresh
//! root, with the `brood` this build made first on `PATH`. A block that cannot run here
//! says why in the page (`<!-- not run: REASON -->` right before its fence);
//! the conventions are in docs/decisions/cli-and-docs.md "Walk-throughs that
//! run".
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "walkthroughs/extract.rs"]
mod extract;
#[path = "walkthroughs/runner.rs"]
mod runner;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use extract::Block;

/// How many pages run at once (most of a page's time is spent waiting).
const AT_ONCE: usize = 3;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository's root")
}

/// README.md and every page of docs/ and its subdirectories (the decision
/// pages of docs/decisions/ among them), in path order.
fn pages() -> Vec<PathBuf> {
    let repo = repo();
    let mut docs = Vec::new();
    markdown_below(&repo.join("docs"), &mut docs);
    docs.sort();
    let mut out = vec![repo.join("README.md")];
    out.extend(docs);
    out
}

/// Every `.md` file below `dir`, directories followed down.
fn markdown_below(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for p in entries.flatten().map(|e| e.path()) {
        if p.is_dir() {
            markdown_below(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// The loopback ports a page's runnable blocks listen on (`--listen
/// 127.0.0.1:PORT`): two pages that use the same one run one after the other.
fn ports(blocks: &[Block]) -> BTreeSet<String> {
    let re = regex::Regex::new(r"--listen[ =]127\.0\.0\.1:(\d+)").unwrap();
    blocks
        .iter()
        .filter_map(|b| match b {
            Block::Run { lines, .. } => Some(lines),
            Block::NotRun { .. } => None,
        })
        .flatten()
        .flat_map(|(_, l)| {
            re.captures_iter(l)
                .map(|c| c[1].to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Ports in use by running pages, and how many pages run.
struct Gate {
    state: Mutex<(BTreeSet<String>, usize)>,
    changed: Condvar,
}

impl Gate {
    fn enter(&self, want: &BTreeSet<String>) {
        let mut st = self.state.lock().unwrap();
        while st.1 >= AT_ONCE || !st.0.is_disjoint(want) {
            st = self.changed.wait(st).unwrap();
        }
        st.0.extend(want.iter().cloned());
        st.1 += 1;
    }

    fn leave(&self, had: &BTreeSet<String>) {
        let mut st = self.state.lock().unwrap();
        for p in had {
            st.0.remove(p);
        }
        st.1 -= 1;
        self.changed.notify_all();
    }
}

#[test]
fn every_walkthrough_runs_as_written() {
    let exe = Path::new(env!("CARGO_BIN_EXE_brood"));
    let bin = exe.parent().expect("the binary's directory").to_path_buf();
    let repo = repo();
    let mut parsed = Vec::new();
    let mut failures = Vec::new();
    for p in pages() {
        let name = p.strip_prefix(&repo).unwrap_or(&p).display().to_string();
        let text = std::fs::read_to_string(&p).expect("a page");
        match extract::blocks(&text) {
            Ok(b) => parsed.push((name, b)),
            Err(e) => failures.push(format!("{name}:{e}")),
        }
    }
    let runnable: usize = parsed
        .iter()
        .map(|(_, b)| b.iter().filter(|x| matches!(x, Block::Run { .. })).count())
        .sum();
    assert!(
        parsed.iter().any(|(n, _)| n == "README.md") && runnable > 10,
        "the pages hold {runnable} runnable blocks: the extraction found too few"
    );
    let gate = Gate {
        state: Mutex::new((BTreeSet::new(), 0)),
        changed: Condvar::new(),
    };
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = parsed
            .iter()
            .filter(|(_, b)| b.iter().any(|x| matches!(x, Block::Run { .. })))
            .map(|(name, blocks)| {
                let gate = &gate;
                let bin = &bin;
                s.spawn(move || {
                    let want = ports(blocks);
                    gate.enter(&want);
                    let t0 = std::time::Instant::now();
                    let r = runner::run(&runner::Page {
                        name,
                        blocks,
                        bin,
                        limits: runner::Limits::default(),
                    });
                    let how = if r.is_ok() { "ran" } else { "failed" };
                    eprintln!("{name}: {how} in {:.1} s", t0.elapsed().as_secs_f64());
                    gate.leave(&want);
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the page's thread panicked".into()))
            })
            .collect()
    });
    failures.extend(results.into_iter().filter_map(Result::err));
    assert!(
        failures.is_empty(),
        "{} walk-through(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn run_lines(b: &Block) -> Vec<&str> {
    match b {
        Block::Run { lines, .. } => lines.iter().map(|(_, l)| l.as_str()).collect(),
        Block::NotRun { .. } => Vec::new(),
    }
}

#[test]
fn shell_blocks_run_and_others_are_shown() {
    let page = "# t\n\n```sh\necho one\n```\n\n```text\necho never\n```\n\n```\nbare\n```\n\
                ```bash\necho two\n```\n```json\n{}\n```\n";
    let b = extract::blocks(page).unwrap();
    assert_eq!(b.len(), 2);
    assert_eq!(
        b[0],
        Block::Run {
            fence: 3,
            lines: vec![(4, "echo one".into())]
        }
    );
    assert_eq!(run_lines(&b[1]), vec!["echo two"]);
}

#[test]
fn a_console_block_runs_only_its_prompted_lines() {
    let page = "```console\n$ echo a \\\n  b\n$ ls\nprinted\n$ true\n```\n";
    let b = extract::blocks(page).unwrap();
    assert_eq!(run_lines(&b[0]), vec!["echo a \\", "  b", "ls", "true"]);
}

#[test]
fn a_marked_block_is_not_run_and_says_why() {
    let page = "<!-- not run: needs an OpenAI key -->\n```sh\nbrood run -- x\n```\n";
    assert_eq!(
        extract::blocks(page).unwrap(),
        vec![Block::NotRun {
            fence: 2,
            reason: "needs an OpenAI key".into()
        }]
    );
}

#[test]
fn a_marker_without_a_reason_is_refused() {
    for m in [
        "<!-- not run -->",
        "<!-- not run: -->",
        "<!-- not run:   -->",
    ] {
        let page = format!("{m}\n```sh\nbrood run -- x\n```\n");
        let e = extract::blocks(&page).unwrap_err();
        assert!(
            e.starts_with("line 1:") && e.contains("reason") || e.contains("write the marker"),
            "{m}: {e}"
        );
    }
}

#[test]
fn a_marker_away_from_a_command_fence_is_refused() {
    for page in [
        "<!-- not run: x -->\n\n```sh\ntrue\n```\n",
        "<!-- not run: x -->\n```text\nshown\n```\n",
        "<!-- not run: x -->\nprose\n",
    ] {
        let e = extract::blocks(page).unwrap_err();
        assert!(e.contains("right before"), "{page:?}: {e}");
    }
}

#[test]
fn an_indented_block_in_a_list_item_is_unindented() {
    let page = "- item\n\n  ```sh\n  echo in\n    deeper\n  ```\n";
    let b = extract::blocks(page).unwrap();
    assert_eq!(run_lines(&b[0]), vec!["echo in", "  deeper"]);
}

#[test]
fn an_unclosed_fence_is_refused() {
    let e = extract::blocks("```sh\necho\n").unwrap_err();
    assert!(e.contains("never closed"), "{e}");
}

#[test]
fn daemons_are_told_apart_by_their_ampersand() {
    assert_eq!(extract::daemon("brood serve &"), Some(true));
    assert_eq!(
        extract::daemon("brood --root n1 serve --listen 127.0.0.1:8421 &   # node 1"),
        Some(true)
    );
    assert_eq!(
        extract::daemon("brood --store-file f --root n1 serve"),
        Some(false)
    );
    assert_eq!(extract::daemon("brood serve && echo"), Some(false));
    assert_eq!(extract::daemon("brood run -- sh -c 'serve &'"), None);
    assert_eq!(extract::daemon("echo '# brood serve &'"), None);
}

/// Runs a page made up here, with the `brood` under test on `PATH`.
fn run_page(page: &str, limits: runner::Limits) -> Result<(), String> {
    let blocks = extract::blocks(page).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_brood")).parent().unwrap();
    runner::run(&runner::Page {
        name: "made-up.md",
        blocks: &blocks,
        bin,
        limits,
    })
}

#[test]
fn a_failure_names_the_block_the_command_its_status_and_output() {
    let page = "```sh\nX=1\n```\n\ntext\n\n```sh\necho \"before $X\"\necho 'to stderr' >&2\n\
                sh -c 'exit 7' \\\n  --ignored\necho never\n```\n";
    let e = run_page(page, runner::Limits::default()).unwrap_err();
    for want in [
        "made-up.md: the block at line 7, the command at line 10",
        "sh -c 'exit 7' \\\n      --ignored",
        "exit status: 7",
        "| before 1",
        "| to stderr",
    ] {
        assert!(e.contains(want), "{want:?} is not in:\n{e}");
    }
    assert!(!e.contains("never"), "{e}");
}

#[test]
fn a_variable_the_page_never_set_is_a_failure() {
    let e = run_page(
        "```sh\ncat $BROOD_ROOT/token\n```\n",
        runner::Limits::default(),
    )
    .unwrap_err();
    assert!(e.contains("BROOD_ROOT: unbound variable"), "{e}");
}

#[test]
fn what_a_page_leaves_running_is_stopped_and_what_will_not_stop_is_reported() {
    let limits = runner::Limits {
        page: std::time::Duration::from_secs(60),
        stop: std::time::Duration::from_secs(3),
    };
    run_page("```sh\nsleep 1000 &\n```\n", limits).unwrap();
    let e = run_page(
        "```sh\nsh -c 'trap \"\" TERM; sleep 1000; :' &\n```\n",
        limits,
    )
    .unwrap_err();
    assert!(
        e.contains("still running 3 s after the page's end") && e.contains("sleep 1000"),
        "{e}"
    );
}

#[test]
fn a_daemon_in_the_foreground_is_refused_before_anything_runs() {
    let e = run_page(
        "```sh\ntouch ran\nbrood serve\n```\n",
        runner::Limits::default(),
    )
    .unwrap_err();
    assert!(
        e.contains("made-up.md:3: `brood serve` runs the daemon in the foreground"),
        "{e}"
    );
}

#[test]
fn a_command_after_a_daemon_in_its_block_is_refused() {
    let page = "```sh\nbrood --root a serve &\nbrood --root b serve &  # two at once\n\n# ok\n```\n\
                ```sh\nbrood serve &\nbrood ps\n```\n";
    let e = run_page(page, runner::Limits::default()).unwrap_err();
    assert!(
        e.contains("made-up.md:9: `brood ps` follows the daemon started at line 8"),
        "{e}"
    );
}
