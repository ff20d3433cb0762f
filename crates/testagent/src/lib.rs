//! The test agent: a real agent program speaking the child protocol
//! (brood-proto) on stdin and stdout, whose behaviour is chosen by flags. It is
//! what `brood test-agent ARGS...` runs, for the runtime's tests, the demo and
//! the benchmarks: it spawns and waits for children, collects inputs, shows its
//! history, and misbehaves on request (ignores SIGTERM, forks grandchildren and
//! `setsid` daemons, floods stdout, writes bad lines, crashes).
//!
//! It is small and synchronous on purpose (no async runtime): one thread reads
//! stdin, the main thread runs the script. Stdout carries only whole protocol
//! lines, each flushed; diagnostics go to stderr.
//!
//! # Life
//!
//! At start: `--stderr` is written, `--ignore-sigterm` applied. The first line
//! of stdin must be `init`, else the agent exits 3. It then sends `ready` and
//! does what the flags say, in this order: `--malformed`; `--grandchildren`,
//! `--setsid-grandchild`, `--report-pids`; `--flood`; `--message`s; `--usage`;
//! `--spawn`/`--spawn-n` (in command-line order); `--wait`; `--count-lines`;
//! the probes (in command-line order); `--inputs`; `--echo`; `--sleep-ms`; `--hang`. Then it finishes: `--crash` aborts,
//! `--no-result` exits without a result, `--error` sends `error`, otherwise it
//! sends `done` whose response is, one part per line: the `--result` text
//! (default `ok`, which a count replaces), the count, the inputs' texts (with
//! `--inputs`), `history: N messages` and `role: content` lines (with
//! `--history`), `name: status: result` per waited child (with `--wait`), and
//! last one line per probe, in command-line order.
//! `done` carries the `--usage` numbers and the run's duration.
//!
//! Whenever it waits, it answers `ping` with `pong`, collects `input`s, logs
//! `child` events to stderr, and on `cancel` finishes at once with
//! `{"type":"error","error":"cancelled: <reason>"}` and exit 0 (unless
//! `--ignore-cancel`). End of stdin does not stop it, except while it waits for
//! a `reply`, which can then never come (exit 4).
//!
//! # Flags
//!
//! | flag | effect |
//! | --- | --- |
//! | `--result TEXT` | response text of `done` (default `ok`) |
//! | `--message TEXT` | send `{"type":"message","role":"assistant","content":TEXT}` (repeatable) |
//! | `--usage TIN,TOUT,COST` | send a `usage` message |
//! | `--inputs N` | wait for N `input`s; their texts follow the result text |
//! | `--echo` | a conversation: say `{"type":"status","status":"blocked","reason":"waiting for input"}`, then answer every `input` (those `--inputs` took excepted) with `status` `running`, two `chunk`s (`echo: `, then the text) and a `message` (role `assistant`, content `echo: <text>`), then `blocked` again; the input `bye` ends the conversation (no echo) and the agent finishes |
//! | `--echo-pause-ms N` | with `--echo`: wait N ms (still answering) between the two chunks |
//! | `--echo-quiet` | with `--echo`: no `status running` when an input is taken |
//! | `--history` | append `history: N messages` and the init's history |
//! | `--spawn JSON` | request `spawn` with JSON as `args`, await the reply, remember `result.name` (repeatable) |
//! | `--spawn-n N:JSON` | N spawns of JSON, named `<name>-<i>` (i from 1) if JSON has a name (repeatable) |
//! | `--tolerate-refusal` | a refused spawn is logged instead of failing the agent |
//! | `--wait` | request `wait` for all spawned names; append `name: status: result` per child |
//! | `--count-lines PATH` | send the message `counting the lines of PATH`, then count: result `N\tPATH` for a file; `N lines in PATH` plus each entry's lines for a directory |
//! | `--fanout` | count a directory with one child per entry (`brood test-agent --count-lines ENTRY`) |
//! | `--hand-back` | with `--count-lines`: also hand the count back as the artifact `lines.txt` and a ref to it (children of `--fanout` inherit it) |
//! | `--work-ms N` | sleep N ms per file counted (passed on to fan-out children) |
//! | `--sleep-ms N` | sleep N ms (still answering) before finishing |
//! | `--hang` | never finish |
//! | `--ignore-sigterm` | SIGTERM ignored, also by grandchildren |
//! | `--grandchildren N` | fork N children that idle for ever |
//! | `--setsid-grandchild` | double-fork a daemon in its own session |
//! | `--report-pids FILE` | append own pid, then each grandchild's, one per line |
//! | `--flood BYTES` | send `chunk`s of 64 KiB of delta until BYTES were sent |
//! | `--malformed KIND` | write one bad line: `notjson`, `long` (2 MiB), `utf8`, `unknown` (a well-formed unknown type) |
//! | `--no-result` | exit without `done` or `error` |
//! | `--crash` | abort (SIGABRT) instead of finishing |
//! | `--error TEXT` | finish with `{"type":"error","error":TEXT}` |
//! | `--exit CODE` | exit code after finishing (default 0) |
//! | `--stderr TEXT` | write TEXT to stderr at start |
//! | `--ignore-cancel` | keep going after `cancel` |
//! | `--artifact NAME=CONTENT` | write CONTENT to `$BROOD_ARTIFACTS/NAME` before the result (repeatable) |
//! | `--artifact-bytes NAME=SIZE` | write SIZE bytes that are not text (`flags::bytes_of_size`) to `$BROOD_ARTIFACTS/NAME` before the result (repeatable) |
//! | `--ref JSON` | add JSON to the `refs` of the `done` result (repeatable) |
//! | `--probe-read PATH` | read a file's first block or list a directory: `read PATH: ok\|denied\|error: <errno text>` (repeatable) |
//! | `--probe-write PATH` | create or append: `write PATH: …` (repeatable) |
//! | `--probe-exec PATH` | fork and execve PATH with no arguments (output to /dev/null, killed once started): `exec PATH: …` (repeatable) |
//! | `--probe-connect PORT` | TCP connect to 127.0.0.1:PORT: `connect PORT: …` (repeatable) |
//! | `--probe-bind PORT` | TCP bind of 127.0.0.1:PORT: `bind PORT: …` (repeatable) |
//! | `--probe-caps` | `caps: CapEff=… CapPrm=… CapBnd=… CapAmb=… NoNewPrivs=…` from /proc/self/status |
//! | `--fork-bomb N` | fork idling children until N or a failure: `fork-bomb: forked N` or `fork-bomb: stopped at K: <errno text>`; the children idle until the supervisor kills the cgroup, the agent finishes |
//! | `--memory-hog MB` | allocate and touch MB MiB in 1 MiB steps: `memory-hog: touched MB MiB` (or `stopped at K MiB: …`); killed by the OOM killer it reports nothing, the supervisor records why |
//! | `--write-bytes PATH=SIZE` | write SIZE non-zero bytes to PATH with `SIGXFSZ` ignored: `write-bytes PATH: wrote SIZE bytes` or `stopped at N bytes: <errno text>` (`File too large` past `RLIMIT_FSIZE`) |
//!
//! `denied` means the kernel refused with `EACCES` or `EPERM`.
//!
//! # Exit codes
//!
//! 0 (or `--exit`) after finishing; 1 when stdout cannot be written; 2 for bad
//! flags; 3 when stdin does not start with `init`; 4 when stdin closes while a
//! reply is awaited; SIGABRT for `--crash`.
//!
//! Fan-out children are named `count-<entry>` by a top-level agent and
//! `<own name>.<entry>` by a fan-out child, sanitised to `[a-zA-Z0-9._+-]`, at
//! most 40 characters, unique among siblings (see [`text::child_name`]).

mod agent;
mod count;
pub mod flags;
mod outcome;
pub mod probe;
mod procs;
mod sockets;
pub mod text;

use std::io::{Read, Write};

pub use agent::{EXIT_IO, EXIT_NOT_PROTOCOL, EXIT_STDIN_CLOSED};
pub use flags::{FlagError, Flags, Probe};

/// Exit code for flags the parser refuses.
pub const EXIT_BAD_FLAGS: i32 = 2;

/// Runs the test agent on this process's stdin and stdout; returns the exit
/// code. `self_argv` starts another test agent (for fan-out children), e.g.
/// `["/path/brood", "test-agent"]`; `args` are the flags.
pub fn run(self_argv: &[String], args: &[String]) -> i32 {
    run_with(std::io::stdin(), std::io::stdout(), self_argv, args)
}

/// [`run`] over any input and output, so tests can drive the agent in process.
/// The input is read on a thread of its own until end of file.
pub fn run_with<R: Read + Send + 'static, W: Write>(
    input: R,
    mut out: W,
    self_argv: &[String],
    args: &[String],
) -> i32 {
    let flags = match flags::parse(args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("brood test-agent: {e}\n{}", flags::USAGE);
            return EXIT_BAD_FLAGS;
        }
    };
    if flags.help {
        // Before the protocol starts, stdout is free for people.
        return match out.write_all(flags::USAGE.as_bytes()) {
            Ok(()) => 0,
            Err(_) => EXIT_IO,
        };
    }
    agent::run(&flags, self_argv, input, out)
}
