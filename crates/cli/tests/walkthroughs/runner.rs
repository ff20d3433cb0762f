//! Runs one page's command blocks, in order, in one `bash` (so a variable a
//! block sets is there for the next, as in a person's terminal), on a fresh
//! temporary directory: `HOME`, the working directory and `TMPDIR` inside
//! it, no `BROOD_*` or `XDG_*` variable of the caller's, and the freshly
//! built `brood` first on `PATH`. Whatever the page started is stopped at
//! its end, and anything still alive then is a failure.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::extract::{self, Block};

/// The variable that marks every process a page's shell starts (agents get
/// an environment built from nothing; they are found by their `CTX_ROOT`).
const MARK: &str = "BROOD_WALKTHROUGH";

/// Where a page runs.
pub struct Page<'a> {
    /// The page as the failure names it (`docs/jobs.md`).
    pub name: &'a str,
    pub blocks: &'a [Block],
    /// The directory of the `brood` under test.
    pub bin: &'a Path,
    pub limits: Limits,
}

/// How long things may take.
#[derive(Clone, Copy)]
pub struct Limits {
    /// One page, all its blocks together.
    pub page: Duration,
    /// What a page left running, to end after SIGTERM.
    pub stop: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            page: Duration::from_secs(200),
            stop: Duration::from_secs(30),
        }
    }
}

/// What the script's line `n` (from 1) is: a page's line, or a line of the
/// test's own (the prelude, a wait for a daemon after a page's line).
#[derive(Clone, Copy)]
enum Origin {
    Prelude,
    Page { block: usize, line: usize },
    DaemonWait { block: usize, line: usize },
}

struct Script {
    text: String,
    origin: Vec<Origin>,
}

impl Script {
    fn push(&mut self, line: &str, origin: Origin) {
        self.text.push_str(line);
        self.text.push('\n');
        self.origin.push(origin);
    }

    fn origin(&self, lineno: usize) -> Origin {
        lineno
            .checked_sub(1)
            .and_then(|i| self.origin.get(i).copied())
            .unwrap_or(Origin::Prelude)
    }
}

/// The test's own shell functions, before the page's lines. `cargo run
/// [--release] -- ARGS` is the `brood` under test run with ARGS (the README's
/// demo: the same code, without building a release here). `curl` fails on an
/// HTTP error status (`--fail-with-body`: a person reads the error, the test
/// needs the exit status), unless the line handles the status itself
/// (`-f`, `--fail…`, `-w`, `--write-out`).
const PRELUDE: &str = r#"__walk_block() { exec >"$__walk_dir/out.$1" 2>&1 </dev/null; }
__walk_sockets() { find "$__walk_top" -name brood.sock -printf '%p %i\n' 2>/dev/null | sort; }
__walk_mark() { __walk_sockets > "$__walk_dir/mark"; }
__walk_await_daemon() {
  local pid=$1 i s
  for i in $(seq 1 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "walk-through test: the daemon (pid $pid) ended before it answered" >&2
      return 1
    fi
    for s in $(__walk_sockets | comm -13 "$__walk_dir/mark" - | cut -d' ' -f1); do
      if curl -sf --max-time 5 --unix-socket "$s" http://brood/healthz >/dev/null; then
        return 0
      fi
    done
    sleep 0.1
  done
  echo "walk-through test: the daemon (pid $pid) did not answer on a new brood.sock within 60 s" >&2
  return 1
}
curl() {
  local a
  for a in "$@"; do
    case $a in
      --fail*|--write-out*) command curl "$@"; return ;;
      --*) ;;
      -*[fw]*) if [[ $a =~ ^-[A-Za-z]+$ ]]; then command curl "$@"; return; fi ;;
    esac
  done
  command curl --fail-with-body "$@"
}
cargo() {
  if [ "${1-}" = run ]; then
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
      case $1 in
        --release|-q|--quiet) shift ;;
        *) echo "walk-through test: cargo run $1 is not handled (only cargo run [--release] -- ARGS)" >&2; return 2 ;;
      esac
    done
    [ $# -gt 0 ] && shift
    brood "$@"
    return
  fi
  echo "walk-through test: only cargo run [--release] -- ARGS runs here; mark a block that needs cargo $*" >&2
  return 2
}
trap 'printf "%s\t%s" "$LINENO" "$BASH_COMMAND" > "$__walk_dir/current"' DEBUG
set -eEuo pipefail"#;

fn script(blocks: &[Block]) -> Script {
    let mut s = Script {
        text: String::new(),
        origin: Vec::new(),
    };
    for l in PRELUDE.lines() {
        s.push(l, Origin::Prelude);
    }
    for (b, block) in blocks.iter().enumerate() {
        let Block::Run { fence, lines } = block else {
            continue;
        };
        s.push(
            &format!("__walk_block {b}"),
            Origin::Page {
                block: b,
                line: *fence,
            },
        );
        for (n, l) in lines {
            let bg_daemon = extract::daemon(l) == Some(true);
            if bg_daemon {
                s.push("__walk_mark", Origin::DaemonWait { block: b, line: *n });
            }
            s.push(l, Origin::Page { block: b, line: *n });
            if bg_daemon {
                s.push(
                    "__walk_await_daemon $!",
                    Origin::DaemonWait { block: b, line: *n },
                );
            }
        }
    }
    s.push("printf ok > \"$__walk_dir/done\"", Origin::Prelude);
    s
}

/// A daemon runs in the background, and its line ends its block (other
/// daemons' lines and comments aside): pasted as a whole, a block would
/// run its next command before the daemon answers. A reader pastes the next
/// block after it said it is serving; the test waits as long.
fn daemons_end_their_block(page: &str, lines: &[(usize, String)]) -> Result<(), String> {
    let mut daemon_at = None;
    for (n, l) in lines {
        match extract::daemon(l) {
            Some(false) => {
                return Err(format!(
                    "{page}:{n}: `{}` runs the daemon in the foreground, where it would never \
                     end: end the line with `&` (the test stops it at the page's end) or mark \
                     the block `{} REASON -->`",
                    l.trim(),
                    extract::NOT_RUN
                ));
            }
            Some(true) => daemon_at = Some(*n),
            None if extract::code_part(l).trim().is_empty() => {}
            None => {
                if let Some(d) = daemon_at {
                    return Err(format!(
                        "{page}:{n}: `{}` follows the daemon started at line {d} in the same \
                         block; end the block after the daemon's line and go on in the next, \
                         so a pasted block never runs ahead of the daemon",
                        l.trim()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Runs the page; `Err` is the failure's report.
pub fn run(page: &Page) -> Result<(), String> {
    for block in page.blocks {
        if let Block::Run { lines, .. } = block {
            daemons_end_their_block(page.name, lines)?;
        }
    }
    let top = tempfile::Builder::new()
        .prefix("walk.")
        .tempdir()
        .map_err(|e| format!("{}: a temporary directory: {e}", page.name))?;
    let top_path = top.path().to_path_buf();
    let result = run_in(page, &top_path);
    let stopped = stop_everything(&top_path, page.limits.stop);
    match (result, stopped) {
        (Err(e), Err(s)) => Err(format!("{e}\n{s}")),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(())) => Ok(()),
    }
}

fn run_in(page: &Page, top: &Path) -> Result<(), String> {
    let dirs: HashMap<&str, PathBuf> = ["home", "work", "tmp", ".walk"]
        .into_iter()
        .map(|d| (d, top.join(d)))
        .collect();
    for d in dirs.values() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let walk = &dirs[".walk"];
    let s = script(page.blocks);
    let file = walk.join("page.sh");
    std::fs::write(&file, &s.text).map_err(|e| format!("{}: {e}", file.display()))?;

    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![page.bin.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(paths).map_err(|e| format!("PATH: {e}"))?;
    #[allow(clippy::disallowed_methods)]
    let mut cmd = Command::new("bash");
    cmd.arg(&file)
        .current_dir(&dirs["work"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    // Nothing of the caller's brood, XDG directories or model keys reaches
    // the page: its default root is under its own HOME.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("BROOD_")
            || k.starts_with("XDG_")
            || k.ends_with("_API_KEY")
            || k.starts_with("CARGO")
            || k.starts_with("RUST")
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("HOME", &dirs["home"])
        .env("TMPDIR", &dirs["tmp"])
        .env("PATH", path)
        .env(MARK, top)
        .env("__walk_dir", walk)
        .env("__walk_top", top);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: starting bash: {e}", page.name))?;
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if t0.elapsed() > page.limits.page => {
                // The shell's whole process group; the rest is stopped after.
                // SAFETY: kill(2) on a process group id we created.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("{}: waiting for bash: {e}", page.name)),
        }
    };
    if std::env::var_os("BROOD_WALKTHROUGH_SHOW").is_some() {
        // For the page's author: what each block printed.
        for (b, block) in page.blocks.iter().enumerate() {
            if let Block::Run { fence, .. } = block {
                let out =
                    std::fs::read_to_string(walk.join(format!("out.{b}"))).unwrap_or_default();
                eprintln!("{}:{fence}:\n{}", page.name, tail(&out, usize::MAX));
            }
        }
    }
    if status.is_some_and(|st| st.success()) && walk.join("done").exists() {
        return Ok(());
    }
    let current = std::fs::read_to_string(walk.join("current")).unwrap_or_default();
    let (lineno, command) = current.split_once('\t').unwrap_or(("0", ""));
    let origin = s.origin(lineno.parse().unwrap_or(0));
    let mut report = String::new();
    let (block, line, what) = match origin {
        Origin::Page { block, line } => (block, line, String::new()),
        Origin::DaemonWait { block, line } => (
            block,
            line,
            " (waiting for the daemon it started to answer on its socket)".to_owned(),
        ),
        Origin::Prelude => (usize::MAX, 0, format!(" in the test's own `{command}`")),
    };
    let fence = match page.blocks.get(block) {
        Some(Block::Run { fence, lines }) => {
            let text = logical(lines, line);
            let _ = write!(
                report,
                "{}: the block at line {fence}, the command at line {line}{what}:\n    {}\n",
                page.name,
                text.replace('\n', "\n    ")
            );
            Some(fence)
        }
        _ => {
            let _ = writeln!(report, "{}: failed{what}", page.name);
            None
        }
    };
    match status {
        None => {
            let _ = writeln!(
                report,
                "  did not finish within {} s (the page as a whole)",
                page.limits.page.as_secs()
            );
        }
        Some(st) => {
            let _ = writeln!(report, "  exit status: {}", describe(st));
        }
    }
    if fence.is_some() {
        let out = std::fs::read_to_string(walk.join(format!("out.{block}"))).unwrap_or_default();
        let _ = writeln!(
            report,
            "  its block's output (the end):\n{}",
            tail(&out, 6000)
        );
    }
    Err(report)
}

/// The whole command a page's line belongs to: the lines its backslashes
/// join with it.
fn logical(lines: &[(usize, String)], at: usize) -> String {
    let Some(i) = lines.iter().position(|(n, _)| *n == at) else {
        return String::new();
    };
    let cont = |k: usize| lines[k].1.trim_end().ends_with('\\');
    let mut a = i;
    while a > 0 && cont(a - 1) {
        a -= 1;
    }
    let mut b = i;
    while b + 1 < lines.len() && cont(b) {
        b += 1;
    }
    lines[a..=b]
        .iter()
        .map(|(_, l)| l.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn describe(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

fn tail(s: &str, max: usize) -> String {
    let start = s.len().saturating_sub(max);
    let start = (start..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    let cut = if start > 0 { "    …\n" } else { "" };
    let body: String = s[start..].lines().map(|l| format!("    | {l}\n")).collect();
    format!("{cut}{body}")
}

/// A process this page started: one whose environment holds the page's
/// directory (the shell's children carry [`MARK`]; agents carry their
/// `CTX_ROOT`, a root inside it).
struct Proc {
    pid: i32,
    ppid: i32,
    marked: bool,
    cmdline: String,
}

fn processes_of(top: &Path) -> Vec<Proc> {
    let needle = top.as_os_str().as_encoded_bytes();
    let mark = format!("{MARK}=");
    let mut out = Vec::new();
    // A /proc that cannot be read would show no process left behind.
    let rd = std::fs::read_dir("/proc").expect("reading /proc");
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.windows(needle.len()).any(|w| w == needle) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, …
        let mut rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace())
            .into_iter()
            .flatten();
        let state = rest.next().unwrap_or("X");
        if state == "Z" || state == "X" {
            continue;
        }
        let ppid = rest.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let marked = env
            .split(|b| *b == 0)
            .any(|v| v.starts_with(mark.as_bytes()) && v.ends_with(needle));
        out.push(Proc {
            pid,
            ppid,
            marked,
            cmdline: cmdline.trim().to_owned(),
        });
    }
    out
}

/// Stops what the page left running (its daemons, in the background): a
/// SIGTERM to each process of the page whose parent is not one (a daemon
/// stops its own agents and helpers), then waits for every process of the
/// page to be gone. One still there after `limit` is killed and reported:
/// a daemon that does not stop on SIGTERM, or an agent that outlived its
/// supervisor.
fn stop_everything(top: &Path, limit: Duration) -> Result<(), String> {
    let procs = processes_of(top);
    let ours: Vec<i32> = procs.iter().map(|p| p.pid).collect();
    for p in &procs {
        if p.marked && !ours.contains(&p.ppid) {
            // SAFETY: kill(2) with a pid just read, of a process this test's
            // page started.
            unsafe { libc::kill(p.pid, libc::SIGTERM) };
        }
    }
    let t0 = Instant::now();
    loop {
        let left = processes_of(top);
        if left.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            for p in &left {
                // SAFETY: as above.
                unsafe { libc::kill(p.pid, libc::SIGKILL) };
            }
            let names: Vec<String> = left
                .iter()
                .map(|p| format!("    pid {} ({})", p.pid, p.cmdline))
                .collect();
            return Err(format!(
                "  still running {} s after the page's end and a SIGTERM to what it started \
                 (now killed):\n{}",
                limit.as_secs(),
                names.join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
