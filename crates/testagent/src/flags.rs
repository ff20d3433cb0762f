//! The test agent's command line: parsing its flags into a [`Flags`] value, and
//! refusing bad ones with a message that names the flag.
//!
//! Parsing is all-or-nothing and happens before the agent reads a byte of
//! stdin, so a test with a typo fails at once with exit code 2 instead of
//! misbehaving in a way that looks like a runtime bug.

use std::fmt;
use std::path::PathBuf;

use serde_json::{Map, Value};

/// What the agent was asked to do; see the crate docs for each flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    pub result: Option<String>,
    pub messages: Vec<String>,
    pub usage: Option<Usage>,
    pub inputs: usize,
    /// `--echo`: answer every input with chunks, a message and `blocked`.
    pub echo: bool,
    /// `--echo-pause-ms N`: wait N ms (still answering) between an echo's
    /// two chunks, so a test can catch a turn half done.
    pub echo_pause_ms: u64,
    /// `--echo-quiet`: no `status running` when an input is taken (only
    /// `blocked`, as some agents do).
    pub echo_quiet: bool,
    pub history: bool,
    /// The `args` of every spawn request, in command-line order, with
    /// `--spawn-n` already expanded.
    pub spawns: Vec<Map<String, Value>>,
    pub tolerate_refusal: bool,
    pub wait: bool,
    pub count_lines: Option<PathBuf>,
    pub fanout: bool,
    /// `--hand-back`: a count is also handed back as an artifact and a ref.
    pub hand_back: bool,
    pub work_ms: u64,
    pub sleep_ms: u64,
    pub hang: bool,
    pub ignore_sigterm: bool,
    pub grandchildren: u32,
    pub setsid_grandchild: bool,
    pub report_pids: Option<PathBuf>,
    pub flood: u64,
    pub malformed: Option<Malformed>,
    pub no_result: bool,
    pub crash: bool,
    pub error: Option<String>,
    pub exit: i32,
    pub stderr: Option<String>,
    pub ignore_cancel: bool,
    /// `--job-worker`: work job items (SPEC 10): report `{"echo": <the
    /// instruction>}` for each with `job.report`, take the next one from the
    /// reply, until there is none. An instruction containing `FAIL-ALWAYS`
    /// makes it exit without reporting; with `--fail-first DIR`, each
    /// instruction fails once (a marker file in DIR remembers it).
    pub job_worker: bool,
    pub fail_first: Option<PathBuf>,
    /// `--item-delay MS`: a job worker takes this long over each item.
    pub item_delay_ms: u64,
    /// `--one-item`: a job worker reports its one item with `stop` and ends
    /// (a new worker per item).
    pub one_item: bool,
    /// `--fail-marked-only`: with `--fail-first`, only instructions holding
    /// `FAIL-ONCE` fail their first time.
    pub fail_marked_only: bool,
    /// `--request OP=JSON`: protocol requests sent in order after the
    /// spawns; each reply becomes a line of the result (`OP: ok RESULT` or
    /// `OP: CODE`).
    pub requests: Vec<(String, Value)>,
    /// `--await-job ID`: after the requests, `job.get` until the job is
    /// finished; its status becomes a line of the result.
    pub await_job: Option<String>,
    pub help: bool,
    /// The probes, in command-line order; each adds one line to the result.
    pub probes: Vec<Probe>,
    /// `--artifact NAME=CONTENT` and `--artifact-bytes NAME=SIZE`: files
    /// written into `$BROOD_ARTIFACTS` before the result.
    pub artifacts: Vec<(String, Vec<u8>)>,
    /// `--ref JSON`: the `refs` of the `done` result, in order.
    pub refs: Vec<Value>,
}

/// One action the agent tries and reports on instead of failing (see
/// [`crate::probe`]'s lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `--probe-read PATH`: read a file's first block, or list a directory.
    Read(PathBuf),
    /// `--probe-write PATH`: create or append.
    Write(PathBuf),
    /// `--probe-exec PATH`: execve PATH with no arguments in a child.
    Exec(PathBuf),
    /// `--probe-connect PORT`: TCP connect to 127.0.0.1:PORT.
    Connect(u16),
    /// `--probe-bind PORT`: TCP bind of 127.0.0.1:PORT.
    Bind(u16),
    /// `--fork-bomb N`: fork idling children until N or a failure.
    ForkBomb(u32),
    /// `--memory-hog MB`: allocate and touch MB MiB.
    MemoryHog(u64),
    /// `--write-bytes PATH=SIZE`: write SIZE bytes to PATH with `SIGXFSZ`
    /// ignored, so a file-size limit shows as the error it is (`EFBIG`).
    WriteBytes(PathBuf, u64),
    /// `--probe-caps`: capabilities and no_new_privs from /proc/self/status.
    Caps,
    /// `--probe-cgroup-remount CONTROLLER`: in a forked child, make a user,
    /// mount and cgroup namespace of its own, mount the hierarchy of
    /// CONTROLLER (`unified` for cgroup2) there, rooted at the agent's own
    /// group, and raise that group's limit: the way around a covered
    /// `/sys/fs/cgroup` that a process with no capabilities still has.
    CgroupRemount(String),
    /// `--probe-unix PATH`: connect to a UNIX socket by path.
    Unix(PathBuf),
    /// `--probe-abstract NAME`: connect to the abstract UNIX socket `\0NAME`.
    Abstract(String),
    /// `--probe-udp PORT`: send a UDP datagram to 127.0.0.1:PORT.
    Udp(u16),
    /// `--probe-families`: which socket families and types socket(2) creates.
    Families,
    /// `--probe-io-uring`: whether io_uring_setup(2) succeeds.
    IoUring,
    /// `--probe-brood-socket PATH`: ask the brood daemon on PATH for a root.
    BroodSocket(PathBuf),
}

/// `--usage TIN,TOUT,COST`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// The kinds of bad line `--malformed` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    NotJson,
    Long,
    Utf8,
    Unknown,
}

/// A flag the parser refused, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError(pub String);

impl fmt::Display for FlagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FlagError {}

/// The usage text printed by `--help`.
pub const USAGE: &str = "\
usage: brood test-agent [FLAGS]
A protocol-speaking agent for tests. Reads init from stdin, sends ready, then:
  --stderr TEXT  --ignore-sigterm  --malformed notjson|long|utf8|unknown
  --grandchildren N  --setsid-grandchild  --report-pids FILE  --flood BYTES
  --message TEXT (repeatable)  --usage TIN,TOUT,COST
  --spawn JSON (repeatable)  --spawn-n N:JSON  --tolerate-refusal  --wait
  --count-lines PATH [--fanout] [--work-ms N]  --inputs N  --echo [--echo-pause-ms N] [--echo-quiet]  --history
  --sleep-ms N  --hang  --ignore-cancel
  --result TEXT  --error TEXT  --no-result  --crash  --exit CODE
  --probe-read PATH  --probe-write PATH  --probe-exec PATH (repeatable)
  --probe-connect PORT  --probe-bind PORT (repeatable)  --probe-caps
  --probe-unix PATH  --probe-abstract NAME  --probe-udp PORT
  --probe-brood-socket PATH (repeatable)  --probe-families  --probe-io-uring
  --fork-bomb N  --memory-hog MB  --write-bytes PATH=SIZE (repeatable)
  --request OP=JSON (repeatable)  --await-job ID
  --job-worker [--item-delay MS] [--one-item] [--fail-first DIR [--fail-marked-only]]
";

/// Parses the test agent's flags. `--flag VALUE` and `--flag=VALUE` are both
/// accepted; a flag that is not repeatable may be given once.
pub fn parse(args: &[String]) -> Result<Flags, FlagError> {
    let mut f = Flags {
        result: None,
        messages: Vec::new(),
        usage: None,
        inputs: 0,
        echo: false,
        echo_pause_ms: 0,
        echo_quiet: false,
        history: false,
        spawns: Vec::new(),
        tolerate_refusal: false,
        wait: false,
        count_lines: None,
        fanout: false,
        hand_back: false,
        work_ms: 0,
        sleep_ms: 0,
        hang: false,
        ignore_sigterm: false,
        grandchildren: 0,
        setsid_grandchild: false,
        report_pids: None,
        flood: 0,
        malformed: None,
        no_result: false,
        crash: false,
        error: None,
        exit: 0,
        stderr: None,
        ignore_cancel: false,
        job_worker: false,
        item_delay_ms: 0,
        one_item: false,
        fail_marked_only: false,
        requests: Vec::new(),
        await_job: None,
        fail_first: None,
        help: false,
        probes: Vec::new(),
        artifacts: Vec::new(),
        refs: Vec::new(),
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let repeatable = matches!(
            name,
            "--message"
                | "--spawn"
                | "--spawn-n"
                | "--probe-read"
                | "--probe-write"
                | "--probe-exec"
                | "--probe-connect"
                | "--probe-bind"
                | "--probe-cgroup-remount"
                | "--probe-unix"
                | "--probe-abstract"
                | "--probe-udp"
                | "--probe-brood-socket"
                | "--artifact"
                | "--artifact-bytes"
                | "--write-bytes"
                | "--ref"
                | "--request"
        );
        if !repeatable && seen.contains(&name) {
            return Err(FlagError(format!("{name} is given more than once")));
        }
        let mut value = || -> Result<String, FlagError> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| FlagError(format!("{name} needs a value"))),
            }
        };
        match name {
            "--result" => f.result = Some(value()?),
            "--message" => f.messages.push(value()?),
            "--usage" => f.usage = Some(parse_usage(name, &value()?)?),
            "--inputs" => f.inputs = number(name, &value()?)?,
            "--spawn" => f.spawns.push(json_object(name, &value()?)?),
            "--spawn-n" => {
                let v = value()?;
                f.spawns.extend(parse_spawn_n(name, &v)?);
            }
            "--count-lines" => f.count_lines = Some(PathBuf::from(value()?)),
            "--fail-first" => f.fail_first = Some(PathBuf::from(value()?)),
            "--work-ms" => f.work_ms = number(name, &value()?)?,
            "--sleep-ms" => f.sleep_ms = number(name, &value()?)?,
            "--echo-pause-ms" => f.echo_pause_ms = number(name, &value()?)?,
            "--grandchildren" => f.grandchildren = number(name, &value()?)?,
            "--report-pids" => f.report_pids = Some(PathBuf::from(value()?)),
            "--flood" => f.flood = number(name, &value()?)?,
            "--malformed" => {
                let v = value()?;
                f.malformed = Some(match v.as_str() {
                    "notjson" => Malformed::NotJson,
                    "long" => Malformed::Long,
                    "utf8" => Malformed::Utf8,
                    "unknown" => Malformed::Unknown,
                    _ => {
                        return Err(FlagError(format!(
                            "{name}: expected notjson, long, utf8 or unknown, got {v:?}"
                        )));
                    }
                })
            }
            "--error" => f.error = Some(value()?),
            "--exit" => {
                let v = value()?;
                f.exit = v
                    .parse::<u8>()
                    .map(i32::from)
                    .map_err(|_| FlagError(format!("{name}: expected 0 to 255, got {v:?}")))?;
            }
            "--stderr" => f.stderr = Some(value()?),
            "--probe-read" => f.probes.push(Probe::Read(path(name, value()?)?)),
            "--probe-write" => f.probes.push(Probe::Write(path(name, value()?)?)),
            "--probe-exec" => f.probes.push(Probe::Exec(path(name, value()?)?)),
            "--probe-connect" => f.probes.push(Probe::Connect(number(name, &value()?)?)),
            "--probe-bind" => f.probes.push(Probe::Bind(number(name, &value()?)?)),
            "--probe-unix" => f.probes.push(Probe::Unix(path(name, value()?)?)),
            "--probe-abstract" => f.probes.push(Probe::Abstract(value()?)),
            "--probe-udp" => f.probes.push(Probe::Udp(number(name, &value()?)?)),
            "--probe-brood-socket" => f.probes.push(Probe::BroodSocket(path(name, value()?)?)),
            "--fork-bomb" => f.probes.push(Probe::ForkBomb(number(name, &value()?)?)),
            "--memory-hog" => f.probes.push(Probe::MemoryHog(number(name, &value()?)?)),
            "--write-bytes" => {
                let v = value()?;
                let parsed = v
                    .rsplit_once('=')
                    .filter(|(p, _)| !p.is_empty())
                    .and_then(|(p, size)| Some((p, size.parse::<u64>().ok()?)));
                let Some((p, size)) = parsed else {
                    return Err(FlagError(format!(
                        "{name}: expected PATH=SIZE (bytes), got {v:?}"
                    )));
                };
                f.probes.push(Probe::WriteBytes(PathBuf::from(p), size));
            }
            _ if inline.is_some() => {
                return Err(FlagError(format!("{name} takes no value")));
            }
            "--probe-families" => f.probes.push(Probe::Families),
            "--probe-io-uring" => f.probes.push(Probe::IoUring),
            "--history" => f.history = true,
            "--echo" => f.echo = true,
            "--echo-quiet" => f.echo_quiet = true,
            "--tolerate-refusal" => f.tolerate_refusal = true,
            "--wait" => f.wait = true,
            "--fanout" => f.fanout = true,
            "--hand-back" => f.hand_back = true,
            "--hang" => f.hang = true,
            "--ignore-sigterm" => f.ignore_sigterm = true,
            "--setsid-grandchild" => f.setsid_grandchild = true,
            "--no-result" => f.no_result = true,
            "--crash" => f.crash = true,
            "--ignore-cancel" => f.ignore_cancel = true,
            "--job-worker" => f.job_worker = true,
            "--one-item" => f.one_item = true,
            "--fail-marked-only" => f.fail_marked_only = true,
            "--await-job" => f.await_job = Some(value()?),
            "--request" => {
                let v = value()?;
                let Some((op, args)) = v.split_once('=').filter(|(op, _)| !op.is_empty()) else {
                    return Err(FlagError(format!("{name}: expected OP=JSON, got {v:?}")));
                };
                let args: Value = serde_json::from_str(args)
                    .map_err(|e| FlagError(format!("{name}: {op}: not JSON: {e}")))?;
                f.requests.push((op.to_owned(), args));
            }
            "--item-delay" => {
                let v = value()?;
                f.item_delay_ms = v.parse().map_err(|e| {
                    FlagError(format!("{name}: expected milliseconds, got {v:?}: {e}"))
                })?;
            }
            "--probe-caps" => f.probes.push(Probe::Caps),
            "--probe-cgroup-remount" => f.probes.push(Probe::CgroupRemount(value()?)),
            "--artifact" => {
                let v = value()?;
                let Some((n, c)) = v.split_once('=').filter(|(n, _)| !n.is_empty()) else {
                    return Err(FlagError(format!(
                        "{name}: expected NAME=CONTENT, got {v:?}"
                    )));
                };
                f.artifacts.push((n.to_owned(), c.as_bytes().to_vec()));
            }
            "--artifact-bytes" => {
                let v = value()?;
                let parsed = v
                    .split_once('=')
                    .filter(|(n, _)| !n.is_empty())
                    .and_then(|(n, size)| Some((n, size.parse::<usize>().ok()?)));
                let Some((n, size)) = parsed else {
                    return Err(FlagError(format!(
                        "{name}: expected NAME=SIZE (bytes), got {v:?}"
                    )));
                };
                f.artifacts.push((n.to_owned(), bytes_of_size(size)));
            }
            "--ref" => {
                let v = value()?;
                f.refs
                    .push(serde_json::from_str(&v).map_err(|e| {
                        FlagError(format!("{name}: expected JSON, got {v:?}: {e}"))
                    })?);
            }
            "--help" | "-h" => f.help = true,
            _ => return Err(FlagError(format!("unknown flag {name:?}"))),
        }
        seen.push(name);
    }
    if f.fanout && f.count_lines.is_none() {
        return Err(FlagError("--fanout needs --count-lines".into()));
    }
    if f.work_ms > 0 && f.count_lines.is_none() {
        return Err(FlagError("--work-ms needs --count-lines".into()));
    }
    if (f.echo_pause_ms > 0 || f.echo_quiet) && !f.echo {
        return Err(FlagError(
            "--echo-pause-ms and --echo-quiet need --echo".into(),
        ));
    }
    if f.wait && f.spawns.is_empty() {
        return Err(FlagError("--wait needs --spawn or --spawn-n".into()));
    }
    Ok(f)
}

fn path(flag: &str, v: String) -> Result<PathBuf, FlagError> {
    if v.is_empty() {
        return Err(FlagError(format!(
            "{flag}: expected a path, got an empty string"
        )));
    }
    Ok(PathBuf::from(v))
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, FlagError> {
    v.parse()
        .map_err(|_| FlagError(format!("{flag}: expected a whole number, got {v:?}")))
}

fn json_object(flag: &str, v: &str) -> Result<Map<String, Value>, FlagError> {
    match serde_json::from_str::<Value>(v) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(FlagError(format!(
            "{flag}: expected a JSON object, got {v}"
        ))),
        Err(e) => Err(FlagError(format!("{flag}: not JSON ({e}): {v}"))),
    }
}

fn parse_usage(flag: &str, v: &str) -> Result<Usage, FlagError> {
    let bad = || {
        FlagError(format!(
            "{flag}: expected TOKENS_IN,TOKENS_OUT,COST_USD, got {v:?}"
        ))
    };
    let mut parts = v.split(',');
    let (Some(a), Some(b), Some(c), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let cost_usd: f64 = c.trim().parse().map_err(|_| bad())?;
    if !cost_usd.is_finite() {
        return Err(bad());
    }
    Ok(Usage {
        tokens_in: a.trim().parse().map_err(|_| bad())?,
        tokens_out: b.trim().parse().map_err(|_| bad())?,
        cost_usd,
    })
}

/// `N:JSON`: N copies of JSON, the i-th (from 1) named `<name>-<i>` when JSON
/// has a string `name`.
fn parse_spawn_n(flag: &str, v: &str) -> Result<Vec<Map<String, Value>>, FlagError> {
    let (n, json) = v
        .split_once(':')
        .ok_or_else(|| FlagError(format!("{flag}: expected N:JSON, got {v:?}")))?;
    let n: usize = number(flag, n)?;
    let template = json_object(flag, json)?;
    let base = template
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok((1..=n)
        .map(|i| {
            let mut args = template.clone();
            if let Some(base) = &base {
                args.insert("name".into(), Value::String(format!("{base}-{i}")));
            }
            args
        })
        .collect())
}

/// `--artifact-bytes`' content: `size` bytes that are not text and differ
/// from one MiB to the next (a chunk swapped or repeated on its way shows).
pub fn bytes_of_size(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 31 + i / 1021) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(args: &[&str]) -> Result<Flags, FlagError> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn err(args: &[&str]) -> String {
        p(args).unwrap_err().0
    }

    #[test]
    fn no_flags_is_a_plain_agent() {
        let f = p(&[]).unwrap();
        assert_eq!(f.result, None);
        assert_eq!(f.exit, 0);
        assert!(f.spawns.is_empty());
    }

    #[test]
    fn values_in_both_spellings_and_repeats() {
        let f = p(&[
            "--result",
            "r",
            "--message=a",
            "--message",
            "b",
            "--usage",
            "10,20,0.5",
            "--inputs",
            "2",
            "--history",
            "--exit",
            "7",
            "--malformed",
            "long",
            "--count-lines",
            "/tmp",
            "--fanout",
            "--work-ms",
            "5",
        ])
        .unwrap();
        assert_eq!(f.result.as_deref(), Some("r"));
        assert_eq!(f.messages, vec!["a", "b"]);
        assert_eq!(
            f.usage,
            Some(Usage {
                tokens_in: 10,
                tokens_out: 20,
                cost_usd: 0.5
            })
        );
        assert_eq!(f.inputs, 2);
        assert!(f.history && f.fanout);
        assert_eq!(f.exit, 7);
        assert_eq!(f.malformed, Some(Malformed::Long));
        assert_eq!(f.work_ms, 5);
    }

    #[test]
    fn spawn_and_spawn_n_keep_order_and_number_names() {
        let f = p(&[
            "--spawn",
            r#"{"name":"a","argv":["x"]}"#,
            "--spawn-n",
            r#"2:{"name":"w","argv":["y"]}"#,
            "--spawn-n",
            r#"1:{"argv":["z"]}"#,
            "--wait",
        ])
        .unwrap();
        let names: Vec<Value> = f
            .spawns
            .iter()
            .map(|s| s.get("name").cloned().unwrap_or(Value::Null))
            .collect();
        assert_eq!(
            names,
            vec![json!("a"), json!("w-1"), json!("w-2"), Value::Null]
        );
        assert_eq!(f.spawns[1]["argv"], json!(["y"]));
        assert!(f.wait);
    }

    #[test]
    fn bad_flags_are_named() {
        assert_eq!(err(&["--bogus"]), "unknown flag \"--bogus\"");
        assert_eq!(err(&["--result"]), "--result needs a value");
        assert!(err(&["--inputs", "x"]).starts_with("--inputs: expected a whole number"));
        assert!(err(&["--spawn", "[1]"]).starts_with("--spawn: expected a JSON object"));
        assert!(err(&["--spawn", "{"]).starts_with("--spawn: not JSON"));
        assert!(err(&["--spawn-n", "3"]).starts_with("--spawn-n: expected N:JSON"));
        assert!(err(&["--spawn-n", "x:{}"]).starts_with("--spawn-n: expected a whole number"));
        assert!(err(&["--usage", "1,2"]).starts_with("--usage: expected"));
        assert!(err(&["--usage", "1,2,nan"]).starts_with("--usage: expected"));
        assert!(err(&["--malformed", "odd"]).starts_with("--malformed: expected notjson"));
        assert!(err(&["--exit", "300"]).starts_with("--exit: expected 0 to 255"));
        assert_eq!(err(&["--hang=yes"]), "--hang takes no value");
        assert_eq!(
            err(&["--result", "a", "--result", "b"]),
            "--result is given more than once"
        );
        assert_eq!(err(&["--fanout"]), "--fanout needs --count-lines");
        assert_eq!(err(&["--wait"]), "--wait needs --spawn or --spawn-n");
    }

    #[test]
    fn probes_keep_command_line_order() {
        let f = p(&[
            "--probe-read",
            "/etc",
            "--probe-connect=8080",
            "--probe-caps",
            "--probe-read",
            "/x",
            "--fork-bomb",
            "100",
            "--probe-write",
            "/tmp/w",
            "--probe-exec",
            "/bin/sh",
            "--memory-hog",
            "64",
            "--write-bytes",
            "/tmp/a=b=5",
            "--probe-bind",
            "0",
            "--probe-connect",
            "9",
        ])
        .unwrap();
        assert_eq!(
            f.probes,
            vec![
                Probe::Read("/etc".into()),
                Probe::Connect(8080),
                Probe::Caps,
                Probe::Read("/x".into()),
                Probe::ForkBomb(100),
                Probe::Write("/tmp/w".into()),
                Probe::Exec("/bin/sh".into()),
                Probe::MemoryHog(64),
                Probe::WriteBytes("/tmp/a=b".into(), 5),
                Probe::Bind(0),
                Probe::Connect(9),
            ]
        );
        assert!(p(&[]).unwrap().probes.is_empty());
    }

    #[test]
    fn bad_probe_flags_are_named() {
        assert!(
            err(&["--probe-connect", "70000"])
                .starts_with("--probe-connect: expected a whole number")
        );
        assert!(err(&["--probe-bind", "-1"]).starts_with("--probe-bind: expected a whole number"));
        assert!(err(&["--fork-bomb", "many"]).starts_with("--fork-bomb: expected a whole number"));
        assert!(err(&["--memory-hog", "1.5"]).starts_with("--memory-hog: expected a whole number"));
        assert!(err(&["--write-bytes", "/tmp/x"]).starts_with("--write-bytes: expected PATH=SIZE"));
        assert!(err(&["--write-bytes", "=5"]).starts_with("--write-bytes: expected PATH=SIZE"));
        assert_eq!(
            err(&["--probe-read", ""]),
            "--probe-read: expected a path, got an empty string"
        );
        assert_eq!(err(&["--probe-exec"]), "--probe-exec needs a value");
        assert_eq!(err(&["--probe-caps=1"]), "--probe-caps takes no value");
        assert_eq!(
            err(&["--probe-caps", "--probe-caps"]),
            "--probe-caps is given more than once"
        );
        assert_eq!(
            err(&["--fork-bomb", "1", "--fork-bomb", "2"]),
            "--fork-bomb is given more than once"
        );
    }

    #[test]
    fn bad_flags_exit_2_before_reading_stdin() {
        let mut out = Vec::new();
        // The reader would block on a real terminal; an empty input proves the
        // flags are refused before it matters.
        let code = crate::run_with(std::io::empty(), &mut out, &[], &["--nope".to_string()]);
        assert_eq!(code, 2);
        assert!(out.is_empty());
    }
}
