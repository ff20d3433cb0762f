//! Real `brood serve` nodes for the benchmarks that measure a deployment
//! (`bench nodes`, `bench cluster`, `bench memory`): started as separate
//! processes, called over their control sockets with the same client the
//! CLI uses, stopped (SIGTERM, then reaped) when dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use brood_server::client::Endpoint;
use serde_json::Value;

/// A node's control socket.
/// Writes the platform configuration the deployment benches start their
/// nodes with into `dir/config.toml`, and gives the flags that name it:
/// every agent a root of its own and all live at once, so the tenant may
/// run 4,096 (the ceiling), and the per-caller creation rate out of the
/// way, since a bench is one caller and measures the runtime, not its rate
/// limit.
pub(super) fn platform_config(dir: &Path) -> Result<Vec<String>> {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[quotas.defaults]\nmax_concurrent = 4096\n\n[limits]\nagents_per_second = 1000000\nagents_burst = 4294967295\n",
    )
    .with_context(|| format!("writing {}", config.display()))?;
    Ok(vec![
        "--config".to_owned(),
        config.to_string_lossy().into_owned(),
    ])
}

pub(super) fn endpoint(root: &Path) -> Endpoint {
    Endpoint::Unix(root.join("brood.sock"))
}

/// One call to a node's API over its socket; an answer outside 2xx is an
/// error naming the call, the node and the answer.
pub(super) async fn call(
    root: &Path,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value> {
    let a = brood_server::client::call(&endpoint(root), method, path, body.as_ref(), None)
        .await
        .map_err(|e| anyhow::anyhow!("{method} {path} on {}: {e}", root.display()))?;
    if !(200..300).contains(&a.status) {
        bail!(
            "{method} {path} on {}: {} {}",
            root.display(),
            a.status,
            a.body
        );
    }
    Ok(a.body)
}

/// `brood` (the binary at `exe`) with only the store the benchmark passes:
/// nothing of the caller's environment chooses its store, counter or
/// daemon, and the store URL goes in the environment, never on the command
/// line, where any local process reads a password.
pub(super) fn brood(exe: &str, store: Option<&str>) -> std::process::Command {
    #[allow(clippy::disallowed_methods)]
    let mut cmd = std::process::Command::new(exe);
    for var in [
        "BROOD_STORE",
        "BROOD_STORE_FILE",
        "BROOD_SLOTS",
        "BROOD_URL",
    ] {
        cmd.env_remove(var);
    }
    if let Some(store) = store {
        cmd.env("BROOD_STORE", store);
    }
    cmd
}

pub(super) struct Node {
    pub root: PathBuf,
    child: std::process::Child,
    /// Killed and reaped already: its pid may be another process's now.
    reaped: bool,
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: signalling the node this benchmark started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Node {
    /// SIGKILL, as a crash: no shutdown; reaped before this returns.
    pub(super) fn kill(mut self) -> Result<()> {
        self.child
            .kill()
            .with_context(|| format!("killing the node in {}", self.root.display()))?;
        self.child
            .wait()
            .with_context(|| format!("reaping the node in {}", self.root.display()))?;
        self.reaped = true;
        Ok(())
    }

    /// The daemon's process id (the `brood serve` process itself).
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `brood --root ROOT serve --grace 0.3 ARGS…` on `store` (a PostgreSQL
    /// URL, or none: the SQLite file in its root), answering once its
    /// `/healthz` answers 200 (the socket is bound before the supervisor
    /// starts, and `/healthz` answers 503 until it has).
    /// Its stderr goes to `ROOT.log`, quoted when it fails to start.
    pub(super) async fn start(
        exe: &str,
        root: &Path,
        store: Option<&str>,
        args: &[String],
    ) -> Result<Node> {
        std::fs::create_dir_all(root)
            .with_context(|| format!("making the node's root {}", root.display()))?;
        let log_path = root.with_extension("log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("making the node's log {}", log_path.display()))?;
        let mut cmd = brood(exe, store);
        cmd.arg("--root").arg(root);
        let child = cmd
            .args(["serve", "--grace", "0.3"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting a node in {}", root.display()))?;
        let mut node = Node {
            root: root.to_owned(),
            child,
            reaped: false,
        };
        let t = Instant::now();
        loop {
            if call(root, "GET", "/healthz", None).await.is_ok() {
                return Ok(node);
            }
            let exited = node.child.try_wait().ok().flatten();
            if exited.is_some() || t.elapsed() > Duration::from_secs(20) {
                bail!(
                    "the node in {} did not start ({}): {}",
                    root.display(),
                    exited.map_or("no answer in 20 s".into(), |s| s.to_string()),
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
