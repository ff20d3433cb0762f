//! What the browser tests share (`ui.rs`, `ui_models.rs`): the browser
//! (headless Chromium through chromedriver and Selenium), a real `brood
//! serve --listen` with its token, and HTTP/1.1 written by hand. Each test
//! binary uses part of it.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// What the browser tests need, or a failure naming what is missing.
pub fn prerequisites() -> (PathBuf, PathBuf) {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ci-python/bin/python3");
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    let mut missing = Vec::new();
    if chromium.is_none() {
        missing.push("Chromium (/usr/bin/chromium: Debian's `chromium` package)".to_owned());
    }
    if !Path::new(CHROMEDRIVER).exists() {
        missing.push(format!(
            "chromedriver ({CHROMEDRIVER}: Debian's `chromium-driver` package)"
        ));
    }
    #[allow(clippy::disallowed_methods)]
    let selenium = python.exists()
        && Command::new(&python)
            .args(["-c", "import selenium"])
            .status()
            .is_ok_and(|s| s.success());
    if !selenium {
        missing.push(format!("Selenium in {}", python.display()));
    }
    assert!(
        missing.is_empty(),
        "the web UI's browser tests need {}: run `bash .ci/setup`",
        missing.join(", ")
    );
    (python, chromium.unwrap())
}

/// Headless Chromium behind `driver.py`: one JSON command a line.
pub struct Browser {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
    pub _profile: tempfile::TempDir,
}

impl Browser {
    pub fn start() -> Browser {
        let (python, chromium) = prerequisites();
        let profile = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/driver.py");
        #[allow(clippy::disallowed_methods)]
        let mut child = Command::new(python)
            .arg(script)
            .arg(chromium)
            .arg(CHROMEDRIVER)
            .arg(profile.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut b = Browser {
            child,
            stdin,
            stdout,
            _profile: profile,
        };
        let hello = b.read();
        assert_eq!(hello["ok"], true, "Chromium did not start: {hello}");
        b
    }

    pub fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the browser driver ended");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// A command; its answer, which must be ok.
    pub fn cmd(&mut self, c: Value) -> Value {
        let a = self.try_cmd(c.clone());
        assert_eq!(a["ok"], true, "browser: {c} failed: {}", a["error"]);
        a
    }

    pub fn try_cmd(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        self.read()
    }

    pub fn get(&mut self, url: &str) -> Value {
        self.cmd(json!({"op": "get", "url": url}))
    }

    /// Waits until `css` exists and its text holds `text`; that text.
    pub fn wait(&mut self, css: &str, text: &str) -> String {
        let a = self.cmd(json!({"op": "wait", "css": css, "text": text, "timeout": 40}));
        a["text"].as_str().unwrap_or_default().to_owned()
    }

    pub fn js(&mut self, script: &str) -> Value {
        self.cmd(json!({"op": "js", "script": script}))["value"].clone()
    }

    /// Goes to a view of the page (its hash) and waits until it is drawn.
    pub fn view(&mut self, hash: &str) {
        self.js(&format!(
            "document.body.dataset.ready = ''; location.hash = {};",
            json!(hash)
        ));
        let want = json!(hash.trim_start_matches('#'));
        for _ in 0..400 {
            if self.js("return document.body.dataset.ready;") == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the view {hash} was not drawn");
    }

    pub fn screenshot(&mut self, path: &Path) {
        self.cmd(json!({"op": "screenshot", "path": path}));
        let png = std::fs::read(path).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
            "{} is not a screenshot",
            path.display()
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `brood serve --listen` on a fresh root: the daemon, its port and token.
pub struct Served {
    pub _daemon: Daemon,
    pub port: u16,
    pub token: String,
    pub _dir: tempfile::TempDir,
}

impl Served {
    pub fn start() -> Served {
        Served::start_with(&[])
    }

    /// [`Served::start`] with more flags for `brood serve`.
    pub fn start_with(extra: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        let port = free_port();
        #[allow(clippy::disallowed_methods)]
        let child = Command::new(exe())
            .arg("--root")
            .arg(&root)
            .args(["serve", "--grace", "0.3", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
            .spawn()
            .unwrap();
        let daemon = Daemon(child);
        LOG.with(|l| *l.borrow_mut() = Some(dir.path().join("serve.log")));
        // The port is bound before the token is written and the API served;
        // until it answers, a failed exchange only means "not yet" (the last
        // one is shown if it never does).
        let mut last = String::new();
        assert!(
            eventually(Duration::from_secs(30), || {
                match try_http(port, "GET", "/healthz", &[], b"") {
                    Ok(a) if a.status == 200 => true,
                    Ok(a) => {
                        last = format!("{} {}", a.status, a.body);
                        false
                    }
                    Err(e) => {
                        last = e.to_string();
                        false
                    }
                }
            }),
            "brood serve answers on 127.0.0.1:{port}: {last}\nserve.log:\n{}",
            std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default()
        );
        let token = std::fs::read_to_string(root.join("token"))
            .unwrap()
            .trim()
            .to_owned();
        assert_eq!(token.len(), 64, "the token of {}", root.display());
        Served {
            _daemon: daemon,
            port,
            token,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// A request with the bearer token.
    pub fn api(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let auth = format!("Bearer {}", self.token);
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let a = http(
            self.port,
            method,
            path,
            &[("Authorization", &auth)],
            body.as_bytes(),
        );
        (
            a.status,
            serde_json::from_str(&a.body).unwrap_or(Value::Null),
        )
    }

    pub fn ok(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, v) = self.api(method, path, body);
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {v}"
        );
        v
    }

    pub fn agent(&self, name: &str) -> Value {
        self.ok("GET", &format!("/api/agents/{name}"), Value::Null)
    }

    pub fn spawn(&self, body: Value) -> Value {
        let mut body = body;
        body["await_ready"] = json!(true);
        self.ok("POST", "/api/agents", body)
    }
}

thread_local! {
    /// The daemon's log of the test running on this thread, shown when an
    /// answer cannot be read.
    static LOG: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// One HTTP/1.1 request over a fresh connection, written by hand.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    try_http(port, method, path, headers, body).unwrap_or_else(|e| {
        let log = LOG
            .with(|l| l.borrow().clone())
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
        panic!("{method} {path}: {e}\nserve.log (last lines, newest first):\n{tail}")
    })
}

/// [`http`], a failed connection an error.
pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connecting: {e}"))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| format!("writing the request: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("reading the answer: {e}"))?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {out:?}"))?;
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        crate::common::wire::dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    })
}

impl Browser {
    pub fn click(&mut self, css: &str) {
        self.cmd(json!({"op": "click", "css": css}));
    }
}
