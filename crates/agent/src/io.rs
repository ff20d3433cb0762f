//! The agent's side of the child protocol: one thread reads and decodes
//! stdin, the main thread is the only writer of stdout (so lines never
//! interleave). Waiting for a reply keeps handling what else arrives: pings
//! are answered, inputs queued for the next turn, a cancel raises the flag
//! every long step (a model stream, a tool) checks.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use brood_proto::{
    ErrorBody, Frame, Framer, FromAgent, InitConfig, MAX_LINE, ToAgent, decode_to_agent,
    encode_from_agent,
};
use serde_json::Value;

/// What the reader thread hands the main thread.
enum Inbound {
    Msg(Box<ToAgent>),
    Eof,
}

/// Why the agent must stop now.
#[derive(Debug, Clone, PartialEq)]
pub enum Halt {
    /// A `cancel` arrived (its reason).
    Cancelled(String),
    /// Stdin closed: the supervisor is gone.
    Gone,
    /// Stdout could not be written.
    Io(String),
}

impl std::fmt::Display for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Halt::Cancelled(r) => write!(f, "cancelled: {r}"),
            Halt::Gone => f.write_str("the supervisor closed stdin"),
            Halt::Io(e) => write!(f, "writing to the supervisor: {e}"),
        }
    }
}

/// A cancel seen by the reader thread, for steps that cannot wait on the channel.
#[derive(Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The protocol connection.
pub struct Io {
    rx: Receiver<Inbound>,
    out: Box<dyn Write>,
    next_id: u64,
    /// Inputs that arrived while the agent was busy, oldest first.
    pub inputs: VecDeque<String>,
    pub cancel: CancelFlag,
    cancel_reason: Option<String>,
}

impl Io {
    /// Reads stdin on a thread of its own; `init` must come first.
    pub fn start() -> Result<(Io, InitConfig), String> {
        let (tx, rx) = mpsc::channel();
        let cancel = CancelFlag::default();
        let flag = cancel.clone();
        thread::spawn(move || {
            let mut stdin = io::stdin().lock();
            let mut framer = Framer::new();
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = stdin.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    framer.finish(&mut frames);
                } else {
                    framer.push(&buf[..n], &mut frames);
                }
                for f in frames.drain(..) {
                    if let Frame::Line { bytes, .. } = f
                        && let Ok(m) = decode_to_agent(&bytes)
                    {
                        if matches!(m, ToAgent::Cancel { .. }) {
                            flag.set();
                        }
                        if tx.send(Inbound::Msg(Box::new(m))).is_err() {
                            return;
                        }
                    }
                }
                if n == 0 {
                    let _ = tx.send(Inbound::Eof);
                    return;
                }
            }
        });
        let io = Io {
            rx,
            out: Box::new(io::stdout()),
            next_id: 0,
            inputs: VecDeque::new(),
            cancel,
            cancel_reason: None,
        };
        let init = match io.rx.recv() {
            Ok(Inbound::Msg(m)) => match *m {
                ToAgent::Init { config, .. } => config,
                other => return Err(format!("the first message was not init but {other:?}")),
            },
            _ => return Err("stdin closed before init".into()),
        };
        Ok((io, init))
    }

    pub fn send(&mut self, m: &FromAgent) -> Result<(), Halt> {
        let bytes = encode_from_agent(m);
        if bytes.len() > MAX_LINE {
            // Never break the protocol with an over-long line: the caller
            // sends large things cut (tool results are capped before this).
            return Err(Halt::Io(format!(
                "a {}-byte line is over the limit",
                bytes.len()
            )));
        }
        self.out
            .write_all(&bytes)
            .and_then(|_| self.out.flush())
            .map_err(|e| Halt::Io(e.to_string()))
    }

    /// Handles what arrived without waiting; `Err` when the agent must stop.
    pub fn poll(&mut self) -> Result<(), Halt> {
        loop {
            match self.rx.try_recv() {
                Ok(m) => self.handle(m)?,
                Err(mpsc::TryRecvError::Empty) => return self.check(),
                Err(mpsc::TryRecvError::Disconnected) => return Err(Halt::Gone),
            }
        }
    }

    fn check(&self) -> Result<(), Halt> {
        match &self.cancel_reason {
            Some(r) => Err(Halt::Cancelled(r.clone())),
            None if self.cancel.is_set() => Err(Halt::Cancelled(String::new())),
            None => Ok(()),
        }
    }

    fn handle(&mut self, m: Inbound) -> Result<(), Halt> {
        match m {
            Inbound::Eof => Err(Halt::Gone),
            Inbound::Msg(m) => {
                match *m {
                    ToAgent::Ping => self.send(&FromAgent::Pong)?,
                    ToAgent::Input { text, .. } => self.inputs.push_back(text),
                    ToAgent::Cancel { reason } => {
                        self.cancel_reason = Some(reason);
                    }
                    // Children's events and stray replies need nothing here:
                    // `wait` asks the supervisor when it wants to know.
                    _ => {}
                }
                self.check()
            }
        }
    }

    /// One protocol request, answered by its reply.
    pub fn request(&mut self, op: &str, args: Value) -> Result<Result<Value, ErrorBody>, Halt> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&FromAgent::Request {
            id,
            op: op.to_owned(),
            args,
        })?;
        loop {
            match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Inbound::Msg(m)) => match *m {
                    ToAgent::Reply(r) if r.re == id => return Ok(r.into_result()),
                    other => self.handle(Inbound::Msg(Box::new(other)))?,
                },
                Ok(Inbound::Eof) => return Err(Halt::Gone),
                Err(RecvTimeoutError::Timeout) => self.check()?,
                Err(RecvTimeoutError::Disconnected) => return Err(Halt::Gone),
            }
        }
    }
}
