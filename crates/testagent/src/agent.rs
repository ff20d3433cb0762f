//! The test agent's life: the stdin reader thread, the handshake, the script
//! the flags describe, and how the agent finishes.
//!
//! One thread reads and decodes stdin and forwards messages over a channel; the
//! main thread runs the script and is the only writer of stdout, so lines never
//! interleave. Whenever the script waits (for a reply, an input, a sleep) it
//! keeps handling messages: pings are answered, inputs collected, children's
//! events logged, and a cancel ends the run. Each step of the script returns
//! `Result<_, Stop>`, and `Stop` decides how the agent ends.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use brood_proto::{
    DoneResult, Frame, Framer, FromAgent, InitConfig, MAX_LINE, Reply, ToAgent, decode_to_agent,
    encode_from_agent,
};
use serde_json::{Value, json};

use crate::count;
use crate::flags::{Flags, Malformed};
use crate::probe;
use crate::procs;
use crate::text::{self, ResultParts};

/// Exit code when stdout cannot be written (the supervisor went away).
pub const EXIT_IO: i32 = 1;
/// Exit code when stdin does not start with `init`.
pub const EXIT_NOT_PROTOCOL: i32 = 3;
/// Exit code when stdin closes while a reply is awaited.
pub const EXIT_STDIN_CLOSED: i32 = 4;

/// Bytes of delta per `chunk` of `--flood`.
const FLOOD_CHUNK: usize = 64 * 1024;
/// Length of the `--malformed long` line, twice the limit.
const LONG_LINE: usize = 2 << 20;

/// What the reader thread hands the main thread.
enum Inbound {
    /// Boxed: `init` makes `ToAgent` large, and most messages are small.
    Msg(Box<ToAgent>),
    /// A line that could not be decoded; logged and skipped.
    Bad(String),
    Eof,
}

/// Why the script stopped before composing a result.
#[derive(Debug)]
enum Stop {
    /// A `cancel` arrived: finish with `error` "cancelled: <reason>", exit 0.
    Cancelled(String),
    /// The script failed (a refused spawn, an unreadable file): finish with
    /// `error`, exit with `--exit`.
    Failed(String),
    /// Stdin closed while a reply was awaited: exit 4 without a result.
    StdinClosed(String),
    /// Stdout could not be written: exit 1.
    Io(String),
}

impl From<String> for Stop {
    fn from(why: String) -> Self {
        Stop::Failed(why)
    }
}

/// Runs the agent with already-parsed flags over the given stdin and stdout.
pub fn run<R: Read + Send + 'static, W: Write>(
    flags: &Flags,
    self_argv: &[String],
    input: R,
    out: W,
) -> i32 {
    if let Some(t) = &flags.stderr {
        eprintln!("{t}");
    }
    if flags.ignore_sigterm
        && let Err(e) = procs::ignore_sigterm()
    {
        eprintln!("test-agent: cannot ignore SIGTERM: {e}");
        return EXIT_IO;
    }
    let (tx, inbox) = mpsc::channel();
    if let Err(e) = thread::Builder::new()
        .name("stdin".into())
        .spawn(move || read_stdin(input, &tx))
    {
        eprintln!("test-agent: cannot start the stdin reader thread: {e}");
        return EXIT_IO;
    }
    let first = match inbox.recv() {
        Ok(Inbound::Msg(m)) => match *m {
            ToAgent::Init { config, .. } => Ok(config),
            other => Err(format!("a {:?} message", type_of(&other))),
        },
        Ok(Inbound::Bad(why)) => Err(why),
        Ok(Inbound::Eof) | Err(_) => Err("end of file".to_owned()),
    };
    let config = match first {
        Ok(config) => config,
        Err(got) => {
            eprintln!(
                "test-agent: stdin does not speak the brood child protocol: expected init first, got {got}"
            );
            return EXIT_NOT_PROTOCOL;
        }
    };
    let mut agent = Agent {
        flags,
        self_argv,
        config,
        out,
        inbox,
        stdin_closed: false,
        inputs: Vec::new(),
        next_id: 1,
        started: Instant::now(),
        refs: Vec::new(),
    };
    let outcome = match agent.send(&FromAgent::Ready) {
        Ok(()) => agent.script(),
        Err(stop) => Err(stop),
    };
    agent.finish(outcome)
}

fn type_of(m: &ToAgent) -> &'static str {
    match m {
        ToAgent::Init { .. } => "init",
        ToAgent::Input { .. } => "input",
        ToAgent::Reply(_) => "reply",
        ToAgent::Child { .. } => "child",
        ToAgent::Cancel { .. } => "cancel",
        ToAgent::Ping => "ping",
        ToAgent::Unknown => "unknown",
    }
}

/// The reader thread: frames stdin with the protocol's line limit, decodes each
/// line and forwards it, then reports end of file. Blank lines are skipped.
fn read_stdin<R: Read>(mut input: R, tx: &Sender<Inbound>) {
    let mut framer = Framer::new();
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // A broken stdin is treated like its end, after saying why.
                let _ = tx.send(Inbound::Bad(format!("cannot read stdin: {e}")));
                0
            }
        };
        if n == 0 {
            framer.finish(&mut frames);
        } else {
            framer.push(&buf[..n], &mut frames);
        }
        for frame in frames.drain(..) {
            let item = match frame {
                Frame::Line { bytes, .. } if bytes.iter().all(u8::is_ascii_whitespace) => continue,
                Frame::Line { no, bytes } => match decode_to_agent(&bytes) {
                    Ok(m) => Inbound::Msg(Box::new(m)),
                    Err(e) => Inbound::Bad(format!("stdin line {no}: {e}")),
                },
                Frame::TooLong { no, .. } => {
                    Inbound::Bad(format!("stdin line {no}: longer than {MAX_LINE} bytes"))
                }
            };
            if tx.send(item).is_err() {
                return; // The script has finished; nobody is listening.
            }
        }
        if n == 0 {
            let _ = tx.send(Inbound::Eof);
            return;
        }
    }
}

struct Agent<'a, W: Write> {
    flags: &'a Flags,
    self_argv: &'a [String],
    config: InitConfig,
    out: W,
    inbox: Receiver<Inbound>,
    stdin_closed: bool,
    /// Texts of every `input` received so far.
    inputs: Vec<String>,
    next_id: u64,
    started: Instant,
    /// Refs handed back besides `--ref`s (`--hand-back`).
    refs: Vec<Value>,
}

impl<W: Write> Agent<'_, W> {
    /// The flags' steps, in the documented order; returns the result text.
    fn script(&mut self) -> Result<String, Stop> {
        let flags = self.flags;
        if flags.job_worker {
            return self.job_worker();
        }
        if let Some(kind) = flags.malformed {
            self.write_raw(&malformed_line(kind))?;
        }
        self.start_processes()?;
        self.flood(flags.flood)?;
        for m in &flags.messages {
            self.send(&FromAgent::Message {
                role: "assistant".into(),
                content: m.clone(),
            })?;
        }
        if let Some(u) = flags.usage {
            self.send(&FromAgent::Usage {
                tokens_in: u.tokens_in,
                tokens_out: u.tokens_out,
                cost_usd: u.cost_usd,
            })?;
        }
        let mut names = Vec::new();
        for args in &flags.spawns {
            let fallback = args.get("name").and_then(Value::as_str).map(str::to_owned);
            if let Some(name) = self.spawn(Value::Object(args.clone()), fallback)? {
                names.push(name);
            }
        }
        let requests = self.requests()?;
        let mut children = Vec::new();
        if flags.wait && !names.is_empty() {
            children = self.wait_for(&names)?.iter().map(text::wait_line).collect();
        }
        let count = match &flags.count_lines {
            Some(path) => Some(self.count(path)?),
            None => None,
        };
        if let (true, Some(c)) = (flags.hand_back, &count) {
            self.hand_back(c)?;
        }
        let mut probes = Vec::with_capacity(flags.probes.len());
        for p in &flags.probes {
            probes.push(probe::run(p));
            self.drain()?;
        }
        while self.inputs.len() < flags.inputs {
            self.handle_next(None, None)?;
        }
        if flags.echo {
            self.echo(flags.inputs)?;
        }
        if flags.sleep_ms > 0 {
            self.pause(Duration::from_millis(flags.sleep_ms))?;
        }
        if flags.hang {
            loop {
                self.handle_next(None, None)?;
            }
        }
        if !flags.artifacts.is_empty() {
            write_artifacts(&flags.artifacts).map_err(Stop::Failed)?;
        }
        Ok(text::compose_result(&ResultParts {
            result: flags.result.as_deref(),
            count: count.as_deref(),
            inputs: (flags.inputs > 0).then_some(self.inputs.as_slice()),
            history: flags.history.then_some(self.config.history.as_slice()),
            children: &children,
            requests: &requests,
            probes: &probes,
        }))
    }

    /// `--request OP=JSON` in order, then `--await-job`: a line per reply.
    fn requests(&mut self) -> Result<Vec<String>, Stop> {
        let mut lines = Vec::new();
        for (op, args) in &self.flags.requests {
            let line = match self.request(op, args.clone())?.into_result() {
                Ok(v) => format!("{op}: ok {v}"),
                Err(e) => format!("{op}: {}", e.code),
            };
            lines.push(line);
        }
        if let Some(job) = &self.flags.await_job {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let v = self
                    .request("job.get", serde_json::json!({"job": job}))?
                    .into_result()
                    .map_err(|e| Stop::Failed(format!("job.get {job}: {}", e.message)))?;
                let status = v["status"].as_str().unwrap_or("").to_owned();
                if matches!(status.as_str(), "completed" | "failed" | "cancelled") {
                    lines.push(format!("job {job}: {status}"));
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Stop::Failed(format!("job {job} still {status} after 60 s")));
                }
                self.pause(Duration::from_millis(50))?;
            }
        }
        Ok(lines)
    }

    /// `--echo`: one turn per input from the `next`-th on, until `bye`.
    fn echo(&mut self, mut next: usize) -> Result<(), Stop> {
        let blocked = FromAgent::Status {
            status: "blocked".into(),
            reason: Some("waiting for input".into()),
        };
        self.send(&blocked)?;
        loop {
            while self.inputs.len() <= next {
                self.handle_next(None, None)?;
            }
            let text = self.inputs[next].clone();
            next += 1;
            if text == "bye" {
                return Ok(());
            }
            if !self.flags.echo_quiet {
                self.send(&FromAgent::Status {
                    status: "running".into(),
                    reason: None,
                })?;
            }
            self.send(&FromAgent::Chunk {
                delta: "echo: ".into(),
            })?;
            if self.flags.echo_pause_ms > 0 {
                self.pause(Duration::from_millis(self.flags.echo_pause_ms))?;
            }
            self.send(&FromAgent::Chunk {
                delta: text.clone(),
            })?;
            self.send(&FromAgent::Message {
                role: "assistant".into(),
                content: format!("echo: {text}"),
            })?;
            self.send(&blocked)?;
        }
    }

    /// Ends the run as the outcome and the flags say; returns the exit code.
    fn finish(&mut self, outcome: Result<String, Stop>) -> i32 {
        let flags = self.flags;
        let last = match outcome {
            Ok(response) => {
                if flags.crash {
                    std::process::abort();
                }
                if flags.no_result {
                    return flags.exit;
                }
                match &flags.error {
                    Some(error) => FromAgent::Error {
                        error: error.clone(),
                    },
                    None => FromAgent::Done {
                        result: self.done_result(response),
                    },
                }
            }
            Err(Stop::Cancelled(reason)) => {
                return match self.send(&FromAgent::Error {
                    error: format!("cancelled: {reason}"),
                }) {
                    Ok(()) => 0,
                    Err(_) => EXIT_IO,
                };
            }
            Err(Stop::Failed(why)) => {
                eprintln!("test-agent: {why}");
                FromAgent::Error { error: why }
            }
            Err(Stop::StdinClosed(why)) => {
                eprintln!("test-agent: {why}");
                return EXIT_STDIN_CLOSED;
            }
            Err(Stop::Io(why)) => {
                eprintln!("test-agent: {why}");
                return EXIT_IO;
            }
        };
        match self.send(&last) {
            Ok(()) => flags.exit,
            Err(Stop::Io(why)) => {
                eprintln!("test-agent: {why}");
                EXIT_IO
            }
            Err(_) => EXIT_IO,
        }
    }

    fn done_result(&self, response: String) -> DoneResult {
        let usage = self.flags.usage;
        DoneResult {
            success: true,
            response,
            tokens_in: usage.map_or(0, |u| u.tokens_in),
            tokens_out: usage.map_or(0, |u| u.tokens_out),
            cost_usd: usage.map_or(0.0, |u| u.cost_usd),
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            refs: self.flags.refs.iter().chain(&self.refs).cloned().collect(),
        }
    }

    /// `--grandchildren`, `--setsid-grandchild` and `--report-pids`.
    fn start_processes(&mut self) -> Result<(), Stop> {
        let flags = self.flags;
        let mut pids = vec![std::process::id() as libc::pid_t];
        for i in 1..=flags.grandchildren {
            let pid = procs::fork_idler().map_err(|e| {
                format!("cannot fork grandchild {i} of {}: {e}", flags.grandchildren)
            })?;
            pids.push(pid);
        }
        if flags.setsid_grandchild {
            let pid = procs::fork_setsid_daemon()
                .map_err(|e| format!("cannot start the setsid'd grandchild: {e}"))?;
            pids.push(pid);
        }
        if let Some(file) = &flags.report_pids {
            procs::report_pids(file, &pids)
                .map_err(|e| format!("cannot append pids to {}: {e}", file.display()))?;
        }
        Ok(())
    }

    /// `--flood`: chunks of 64 KiB of delta until `bytes` were sent, answering
    /// pings between chunks.
    fn flood(&mut self, bytes: u64) -> Result<(), Stop> {
        let chunk = "x".repeat(FLOOD_CHUNK);
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left).map_or(FLOOD_CHUNK, |l| l.min(FLOOD_CHUNK));
            self.send(&FromAgent::Chunk {
                delta: chunk[..n].to_owned(),
            })?;
            left -= n as u64;
            self.drain()?;
        }
        Ok(())
    }

    /// Sends a spawn request; returns the child's name, or `None` for a
    /// refusal tolerated by `--tolerate-refusal`.
    fn spawn(&mut self, args: Value, fallback: Option<String>) -> Result<Option<String>, Stop> {
        let reply = self.request("spawn", args.clone())?;
        match reply.into_result() {
            Ok(result) => {
                let name = result
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or(fallback);
                if name.is_none() {
                    eprintln!(
                        "test-agent: spawn reply names no child, it will not be waited for: {result}"
                    );
                }
                Ok(name)
            }
            Err(e) => {
                eprintln!("test-agent: spawn {args} refused: {e}");
                if self.flags.tolerate_refusal {
                    Ok(None)
                } else {
                    Err(Stop::Failed(format!("spawn refused: {e}")))
                }
            }
        }
    }

    /// Sends a wait request for `names`; returns `result.agents` of the reply.
    fn wait_for(&mut self, names: &[String]) -> Result<Vec<Value>, Stop> {
        let reply = self.request("wait", json!({ "names": names }))?;
        let result = reply
            .into_result()
            .map_err(|e| format!("wait for {} refused: {e}", names.join(", ")))?;
        match result.get("agents") {
            Some(Value::Array(agents)) => Ok(agents.clone()),
            _ => Err(Stop::Failed(format!(
                "wait reply has no \"agents\" array: {result}"
            ))),
        }
    }

    /// `--count-lines`: in process, or by a fan-out for a directory with `--fanout`.
    fn count(&mut self, path: &Path) -> Result<String, Stop> {
        let meta =
            std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // A line in the transcript, so a stopped counter still leaves its story.
        self.send(&FromAgent::Message {
            role: "assistant".into(),
            content: format!("counting the lines of {}", path.display()),
        })?;
        if meta.is_dir() && self.flags.fanout {
            return self.fan_out(path);
        }
        let work = Duration::from_millis(self.flags.work_ms);
        let (_, lines) = count::count_tree(path, &mut || {
            if work.is_zero() {
                self.drain()
            } else {
                self.pause(work)
            }
        })?;
        Ok(lines.join("\n"))
    }

    /// `--hand-back`: the count as the artifact `lines.txt`, and a ref naming
    /// it with the total's line as its summary (SPEC 4: what the parent's
    /// context pack carries).
    fn hand_back(&mut self, count: &str) -> Result<(), Stop> {
        // A root has no channel to hand anything back to.
        if std::env::var_os("BROOD_ARTIFACTS").is_none_or(|d| d.is_empty()) {
            return Ok(());
        }
        write_artifacts(&[("lines.txt".to_owned(), format!("{count}\n").into_bytes())])
            .map_err(Stop::Failed)?;
        let first = count.lines().next().unwrap_or("");
        self.refs.push(json!({
            "path": "artifact/lines.txt",
            "kind": "artifact",
            // "45\t/x/y.rs" (a file) or "235 lines in /x" (a directory).
            "summary": first.replacen('\t', " lines in ", 1),
        }));
        Ok(())
    }

    /// One child per entry of `dir`, then a wait for all of them; the result is
    /// the total and then each child's result lines.
    fn fan_out(&mut self, dir: &Path) -> Result<String, Stop> {
        let mut names: Vec<String> = Vec::new();
        for entry in count::entries(dir)? {
            let name = text::child_name(&self.config.name, &entry.name, &names);
            let path = entry.path.to_string_lossy().into_owned();
            let mut argv = self.self_argv.to_vec();
            argv.extend(["--count-lines".to_owned(), path.clone()]);
            if entry.is_dir {
                argv.push("--fanout".to_owned());
            }
            if self.flags.hand_back {
                argv.push("--hand-back".to_owned());
            }
            if self.flags.work_ms > 0 {
                argv.extend(["--work-ms".to_owned(), self.flags.work_ms.to_string()]);
            }
            let args =
                json!({"name": name, "argv": argv, "task": format!("count lines in {path}")});
            if let Some(got) = self.spawn(args, Some(name))? {
                names.push(got);
            }
        }
        let agents = if names.is_empty() {
            Vec::new()
        } else {
            self.wait_for(&names)?
        };
        let mut total = 0;
        let mut lines = Vec::new();
        for agent in &agents {
            let result = agent.get("result").and_then(Value::as_str).unwrap_or("");
            match text::leading_count(result) {
                Some(n) => {
                    total += n;
                    lines.extend(result.lines().map(str::to_owned));
                }
                None => lines.push(text::wait_line(agent)),
            }
        }
        lines.insert(0, format!("{total} lines in {}", dir.display()));
        Ok(lines.join("\n"))
    }

    /// Sends request `op` and handles messages until its reply arrives.
    /// `--job-worker`: one item after another until the supervisor has none.
    fn job_worker(&mut self) -> Result<String, Stop> {
        let mut instruction = self.config.instruction.clone();
        let mut done = 0;
        loop {
            if instruction.contains("FAIL-ALWAYS") {
                return Err(Stop::Failed(format!("refusing {instruction:?}")));
            }
            if let Some(dir) = &self.flags.fail_first
                && (!self.flags.fail_marked_only || instruction.contains("FAIL-ONCE"))
            {
                let marker: String = instruction
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .take(100)
                    .collect();
                let m = dir.join(marker);
                if !m.exists() {
                    let _ = std::fs::write(&m, b"failed once");
                    return Err(Stop::Failed(format!(
                        "failing {instruction:?} the first time"
                    )));
                }
            }
            if self.flags.item_delay_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(self.flags.item_delay_ms));
            }
            let reply = self.request(
                "job.report",
                serde_json::json!({"result": {"echo": instruction}, "stop": self.flags.one_item}),
            )?;
            let next = match reply.into_result() {
                Ok(v) => v,
                Err(e) => return Err(Stop::Failed(format!("job.report refused: {e}"))),
            };
            done += 1;
            match next["next"]["instruction"].as_str() {
                Some(i) => instruction = i.to_owned(),
                None => return Ok(format!("worked {done} items")),
            }
        }
    }

    fn request(&mut self, op: &str, args: Value) -> Result<Reply, Stop> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&FromAgent::Request {
            id,
            op: op.to_owned(),
            args,
        })?;
        let what = format!("the reply to request {id} ({op})");
        loop {
            if let Some(reply) = self.handle_next(None, Some(&what))? {
                if reply.re == id {
                    return Ok(reply);
                }
                eprintln!(
                    "test-agent: ignoring a reply to request {} not awaited",
                    reply.re
                );
            }
        }
    }

    /// Handles messages for `d`, then returns.
    fn pause(&mut self, d: Duration) -> Result<(), Stop> {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            self.handle_next(Some(deadline), None)?;
        }
        Ok(())
    }

    /// Handles the messages already queued, without waiting.
    fn drain(&mut self) -> Result<(), Stop> {
        loop {
            match self.inbox.try_recv() {
                Ok(Inbound::Msg(m)) => {
                    if let Some(r) = self.handle(*m)? {
                        eprintln!(
                            "test-agent: ignoring a reply to request {} not awaited",
                            r.re
                        );
                    }
                }
                Ok(Inbound::Bad(why)) => eprintln!("test-agent: ignoring a bad line: {why}"),
                Ok(Inbound::Eof) | Err(TryRecvError::Disconnected) => {
                    self.stdin_closed = true;
                    return Ok(());
                }
                Err(TryRecvError::Empty) => return Ok(()),
            }
        }
    }

    /// Waits for the next message (until `deadline`, if any) and handles it;
    /// returns a reply for the caller to match. `awaiting` names the reply the
    /// caller waits for: end of stdin is then fatal, otherwise the agent
    /// carries on without stdin (sleeping through the rest of the wait).
    fn handle_next(
        &mut self,
        deadline: Option<Instant>,
        awaiting: Option<&str>,
    ) -> Result<Option<Reply>, Stop> {
        loop {
            if self.stdin_closed {
                if let Some(what) = awaiting {
                    return Err(Stop::StdinClosed(format!(
                        "stdin closed while waiting for {what}"
                    )));
                }
                match deadline {
                    Some(d) => {
                        thread::sleep(d.saturating_duration_since(Instant::now()));
                        return Ok(None);
                    }
                    None => loop {
                        thread::sleep(Duration::from_secs(3600));
                    },
                }
            }
            let got = match deadline {
                Some(d) => self
                    .inbox
                    .recv_timeout(d.saturating_duration_since(Instant::now())),
                None => self
                    .inbox
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(Inbound::Msg(m)) => {
                    let reply = self.handle(*m)?;
                    if let Some(r) = &reply
                        && awaiting.is_none()
                    {
                        eprintln!(
                            "test-agent: ignoring a reply to request {} not awaited",
                            r.re
                        );
                        return Ok(None);
                    }
                    return Ok(reply);
                }
                Ok(Inbound::Bad(why)) => eprintln!("test-agent: ignoring a bad line: {why}"),
                Ok(Inbound::Eof) | Err(RecvTimeoutError::Disconnected) => self.stdin_closed = true,
                Err(RecvTimeoutError::Timeout) => return Ok(None),
            }
        }
    }

    /// Reacts to one message; a reply is handed back to whoever waits for it.
    fn handle(&mut self, msg: ToAgent) -> Result<Option<Reply>, Stop> {
        match msg {
            ToAgent::Ping => self.send(&FromAgent::Pong)?,
            ToAgent::Input { text, .. } => self.inputs.push(text),
            ToAgent::Reply(r) => return Ok(Some(r)),
            ToAgent::Child { child, event } => eprintln!("test-agent: child {child}: {event}"),
            ToAgent::Cancel { reason } if self.flags.ignore_cancel => {
                eprintln!("test-agent: ignoring cancel ({reason})");
            }
            ToAgent::Cancel { reason } => return Err(Stop::Cancelled(reason)),
            ToAgent::Init { .. } => eprintln!("test-agent: ignoring a second init"),
            ToAgent::Unknown => {}
        }
        Ok(None)
    }

    fn send(&mut self, msg: &FromAgent) -> Result<(), Stop> {
        self.write_raw(&encode_from_agent(msg))
    }

    /// Writes whole lines and flushes, so the supervisor sees each at once.
    fn write_raw(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        self.out
            .write_all(bytes)
            .and_then(|()| self.out.flush())
            .map_err(|e| Stop::Io(format!("cannot write to stdout: {e}")))
    }
}

/// The bad line `--malformed` writes.
fn malformed_line(kind: Malformed) -> Vec<u8> {
    match kind {
        Malformed::NotJson => b"this is not json\n".to_vec(),
        Malformed::Long => {
            let mut line = vec![b'a'; LONG_LINE];
            line.push(b'\n');
            line
        }
        Malformed::Utf8 => b"{\"type\":\"chunk\",\"delta\":\"\xff\xfe\"}\n".to_vec(),
        Malformed::Unknown => b"{\"type\":\"whatever\",\"x\":1}\n".to_vec(),
    }
}

/// `--artifact NAME=CONTENT`: each file written into the directory the
/// supervisor names in `BROOD_ARTIFACTS` (its parent's channel's `artifact/`).
fn write_artifacts(files: &[(String, Vec<u8>)]) -> Result<(), String> {
    let dir = std::env::var_os("BROOD_ARTIFACTS")
        .filter(|d| !d.is_empty())
        .ok_or("--artifact: BROOD_ARTIFACTS is not set (a root has no channel)")?;
    for (name, content) in files {
        let path = std::path::Path::new(&dir).join(name);
        if let Some(up) = path.parent() {
            std::fs::create_dir_all(up)
                .map_err(|e| format!("--artifact: creating {}: {e}", up.display()))?;
        }
        std::fs::write(&path, content)
            .map_err(|e| format!("--artifact: writing {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use brood_proto::{Decoded, InitConfig, ToAgent, decode_line, encode};
    use serde_json::Value;

    use super::*;

    /// The agent, run in process on one `init`, returns the response of its
    /// `done`.
    fn done_response(args: &[&str]) -> String {
        let init = ToAgent::Init {
            config: InitConfig {
                name: "p".into(),
                ..InitConfig::default()
            },
            agent_config: Value::Null,
        };
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut out = Vec::new();
        let code = crate::run_with(io::Cursor::new(encode(&init)), &mut out, &[], &args);
        assert_eq!(code, 0);
        let last = out
            .split_inclusive(|&b| b == b'\n')
            .next_back()
            .map(|l| decode_line(1, l))
            .unwrap();
        match last {
            Ok(Some(Decoded::Msg(FromAgent::Done { result }))) => result.response,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn probe_lines_follow_the_result_in_command_line_order() {
        let r = done_response(&[
            "--result",
            "r",
            "--probe-read",
            "/nonexistent-brood-probe",
            "--probe-exec",
            "/bin/true",
            "--probe-caps",
            "--memory-hog",
            "1",
            "--fork-bomb",
            "0",
        ]);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines.len(), 6, "{r}");
        assert_eq!(lines[0], "r");
        assert_eq!(
            lines[1],
            "read /nonexistent-brood-probe: error: No such file or directory (os error 2)"
        );
        assert_eq!(lines[2], "exec /bin/true: ok");
        assert!(lines[3].starts_with("caps: CapEff="), "{r}");
        assert_eq!(lines[4], "memory-hog: touched 1 MiB");
        assert_eq!(lines[5], "fork-bomb: forked 0");
    }
}
