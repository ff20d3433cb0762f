//! A cluster of real `brood serve` nodes on one PostgreSQL and one Redis
//! (the tenant's concurrency slots), for the many nodes tests
//! (`many_nodes.rs`, `many_nodes_placement.rs`): nodes started (in a PID
//! namespace of their own too), their API and CLI, and what runs where.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use brood_store_conformance::pg::{Fresh, Private};
use serde_json::{Value, json};

use super::*;

/// The Redis slot counter the nodes on `store` share: a database of its own
/// on the tests' Redis for each store (each test's cluster), emptied when
/// first handed out, since the counter's key is the tenant's and the
/// clusters of tests running at once have the same tenants.
pub struct SharedSlots {
    pub addr: SocketAddr,
    pub db: u32,
    pub url: String,
}

pub fn slots_for(store: &str) -> SharedSlots {
    static SERVER: OnceLock<Arc<redis::Server>> = OnceLock::new();
    static STORES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let server = SERVER.get_or_init(redis::server);
    let mut stores = STORES.lock().unwrap_or_else(|p| p.into_inner());
    let (i, new) = match stores.iter().position(|s| s == store) {
        Some(i) => (i, false),
        None => {
            stores.push(store.to_owned());
            (stores.len() - 1, true)
        }
    };
    // Databases 1 to 15 (a Redis has 16); 0 is the slot tests'.
    let db = 1 + (i as u32 % 15);
    if new {
        redis::raw_in(server.addr, db, &["FLUSHDB"]);
    }
    SharedSlots {
        addr: server.addr,
        db,
        url: format!("{}/{db}", server.url()),
    }
}

/// Among a node's extra arguments: no Redis for this node (the tenant's
/// slots are then counted in the store, as nodes sharing no Redis do).
pub const NO_REDIS: &str = "--no-redis";

/// `--slots <the cluster's Redis>`, unless the test gives its own or none.
fn slots_args(store: &str, extra: &[&str]) -> Vec<String> {
    if extra.contains(&NO_REDIS) || extra.contains(&"--slots") {
        Vec::new()
    } else {
        vec!["--slots".into(), slots_for(store).url]
    }
}

pub fn serve_with(root: &Path, store: &str, zone: &str, extra: &[&str]) -> Daemon {
    serve_wrapped(&[], root, store, zone, extra)
}

/// A node started under `wrap` (a command that runs the rest, as `unshare`).
pub fn serve_wrapped(
    wrap: &[&str],
    root: &Path,
    store: &str,
    zone: &str,
    extra: &[&str],
) -> Daemon {
    serve_full(wrap, root, store, zone, extra, &[])
}

/// [`serve_wrapped`] with variables of its own in the node's environment.
pub fn serve_full(
    wrap: &[&str],
    root: &Path,
    store: &str,
    zone: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Daemon {
    let d = serve_bound(wrap, root, store, zone, extra, env);
    // The socket is bound before the supervisor starts (and registers the
    // node), and `/healthz` answers 503 until it has: a 200 means it is
    // registered. (A node in a PID namespace of its own cannot tell who
    // calls from outside it: its caller waits for it in the registry
    // instead.)
    if wrap.is_empty() {
        let sock = root.join("brood.sock");
        let mut last = (0, Value::Null);
        let up = eventually(Duration::from_secs(60), || {
            last = http(&sock, "GET", "/healthz", None);
            last.0 == 200
        });
        assert!(
            up,
            "brood serve on {} never said it had started: {} {}",
            root.display(),
            last.0,
            last.1
        );
    }
    d
}

/// [`serve_full`], returning as soon as the node's control socket takes
/// connections: its supervisor may still be starting.
pub fn serve_bound(
    wrap: &[&str],
    root: &Path,
    store: &str,
    zone: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Daemon {
    // The node's log beside its root, so a node that fails says why.
    let log_path = root.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = match wrap.split_first() {
        #[allow(clippy::disallowed_methods)]
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe());
            c
        }
        #[allow(clippy::disallowed_methods)]
        None => Command::new(exe()),
    };
    // The store's URL (with the test server's password) in the environment:
    // a command line holding a password is refused (issue 24).
    let child = cmd
        .arg("--root")
        .arg(root)
        .env("BROOD_STORE", store)
        .envs(env.iter().copied())
        .args(["serve", "--grace", "0.3"])
        // A fast tick unless the test sets its own.
        .args(if extra.contains(&"--sweep-every") {
            &[][..]
        } else {
            &["--sweep-every", "0.1"][..]
        })
        .args(["--label", &format!("zone={zone}"), "--capacity", "50"])
        .args(slots_args(store, extra))
        .args(extra.iter().filter(|a| **a != NO_REDIS))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let sock = root.join("brood.sock");
    assert!(
        eventually(Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        }),
        "brood serve on {} did not start: {}",
        root.display(),
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    d
}

pub fn cli(root: &Path, store: &str, args: &[&str]) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    Command::new(exe())
        .arg("--root")
        .arg(root)
        .env("BROOD_STORE", store)
        .args(args)
        .env_remove("BROOD_SOCKET")
        .output()
        .unwrap()
}

pub struct Nodes {
    // Dropped first: the daemons stop before their database goes.
    pub daemons: Vec<Daemon>,
    pub roots: Vec<PathBuf>,
    pub store: String,
    pub db: Option<Fresh>,
    // A server of the test's own, stopped after the database it holds.
    pub server: Option<Private>,
    pub _dir: tempfile::TempDir,
}

impl Nodes {
    pub fn start(n: usize) -> Nodes {
        Nodes::start_with(n, &[])
    }

    pub fn start_with(n: usize, extra: &[&str]) -> Nodes {
        let db = Fresh::new();
        let mut nodes = Nodes::on(&db.url.clone(), n, extra);
        nodes.db = Some(db);
        nodes
    }

    /// `n` nodes on a PostgreSQL server of the test's own.
    pub fn on_private_server(n: usize) -> Nodes {
        let server = Private::new();
        let mut nodes = Nodes::on(&server.url.clone(), n, &[]);
        nodes.server = Some(server);
        nodes
    }

    pub fn on(store: &str, n: usize, extra: &[&str]) -> Nodes {
        Nodes::on_env(store, n, extra, &[])
    }

    /// `n` nodes on a database of their own, with `env` in each node's
    /// environment.
    pub fn start_env(n: usize, extra: &[&str], env: &[(&str, &str)]) -> Nodes {
        let db = Fresh::new();
        let mut nodes = Nodes::on_env(&db.url.clone(), n, extra, env);
        nodes.db = Some(db);
        nodes
    }

    pub fn on_env(store: &str, n: usize, extra: &[&str], env: &[(&str, &str)]) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        let roots: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("n{i}"))).collect();
        let mut daemons = Vec::new();
        for (i, r) in roots.iter().enumerate() {
            std::fs::create_dir_all(r).unwrap();
            daemons.push(serve_full(&[], r, store, &format!("z{i}"), extra, env));
        }
        Nodes {
            daemons,
            roots,
            store: store.to_owned(),
            db: None,
            server: None,
            _dir: dir,
        }
    }

    /// Cancels `name` through node `node`'s API.
    pub fn cancel(&self, node: usize, name: &str) {
        let (s, v) = http(
            &self.roots[node].join("brood.sock"),
            "POST",
            &format!("/api/agents/{name}/cancel"),
            None,
        );
        assert_eq!(s, 200, "{name}: {v}");
    }

    pub fn spawn(&self, node: usize, args: Value) -> (u16, Value) {
        http(
            &self.roots[node].join("brood.sock"),
            "POST",
            "/api/agents",
            Some(&args),
        )
    }
}

/// 100 creations under `parent` at once, spread over the nodes, each to run
/// on the node it is asked through.
pub fn bomb(nodes: &Nodes, parent: &str) -> Vec<(u16, Value)> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..100)
            .map(|i| {
                let nodes = &nodes;
                sc.spawn(move || {
                    // Each on the node asked (by its zone), not the parent's.
                    let node = i % nodes.roots.len();
                    nodes.spawn(
                        node,
                        json!({"parent": parent, "name": format!("{parent}-c{i}"), "argv": agent(&["--hang"]),
                               "placement": {"labels": {"zone": format!("z{node}")}}}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn codes(replies: &[(u16, Value)]) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for (status, v) in replies {
        if *status == 201 {
            ok.push(v["name"].as_str().unwrap().to_owned());
        } else {
            refused.push(v["error"]["code"].as_str().unwrap_or("?").to_owned());
        }
    }
    (ok, refused)
}

pub fn ctx_pids(root: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&env)
                .contains(&format!("CTX_ROOT={}", root.join("ctx").display()))
        })
        .collect()
}

/// A tree spanning three nodes: `top` on node 0, `mid` on node 1 and
/// `leaf` on node 2 (placed there by their zones, each asked for through
/// the node it goes to), each running before the next is asked for.
pub fn spawn_across(nodes: &Nodes, hang: impl Fn(&str, Option<&str>) -> Value) {
    for (node, name, parent) in [
        (0, "top", None),
        (1, "mid", Some("top")),
        (2, "leaf", Some("mid")),
    ] {
        let mut body = hang(name, parent);
        body["placement"] = json!({"labels": {"zone": format!("z{node}")}});
        let (s, v) = nodes.spawn(node, body);
        assert_eq!(s, 201, "{name}: {v}");
        assert!(
            eventually(
                Duration::from_secs(10),
                || agent_on(nodes, node, name)["status"] == "running"
            ),
            "{name} runs: {}",
            agent_on(nodes, node, name)
        );
    }
}

pub fn agent_on(nodes: &Nodes, node: usize, name: &str) -> Value {
    agent_on_root(&nodes.roots[node], name)
}

/// A node started inside `unshare`: stopped by killing `unshare`, whose
/// death the kernel passes on to the node as SIGKILL (`--kill-child`), and
/// with it to its whole PID namespace; `unshare` itself ignores SIGTERM
/// while it waits for its child.
pub struct Unshared(pub Daemon);

impl Drop for Unshared {
    fn drop(&mut self) {
        // SAFETY: killing the `unshare` this test started.
        unsafe { libc::kill(self.0.0.id() as i32, libc::SIGKILL) };
    }
}

pub fn agent_on_root(root: &Path, name: &str) -> Value {
    let (s, a) = http(
        &root.join("brood.sock"),
        "GET",
        &format!("/api/agents/{name}"),
        None,
    );
    assert_eq!(s, 200, "{a}");
    a
}

/// The node ids of a cluster by their `zone` label.
pub fn node_ids(nodes: &Nodes) -> std::collections::HashMap<String, String> {
    let o = cli(&nodes.roots[0], &nodes.store, &["nodes", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        nodes.roots.len(),
        "{listed}"
    );
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["labels"]["zone"].as_str().unwrap().to_owned(),
                n["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// One node on a database of its own behind the TCP proxy (no Redis), for
/// the tests of a store that goes silent or slow. The fields drop in order:
/// the node first (its shutdown records its ends, so put the network back
/// before), then the proxy, its root and the database.
pub struct Proxied {
    pub node: Daemon,
    pub proxy: brood_store_conformance::proxy::Proxy,
    pub root: PathBuf,
    pub sock: PathBuf,
    /// The store's URL through the proxy.
    pub url: String,
    _dir: tempfile::TempDir,
    _db: Fresh,
}

impl Proxied {
    /// Stops the node (SIGTERM, reaped) and starts it again on the same
    /// root and store with `extra` flags; returns once its control socket
    /// takes connections, its supervisor maybe still starting.
    pub fn restart(&mut self, extra: &[&str]) {
        // SAFETY: signalling the node this test started.
        unsafe { libc::kill(self.node.0.id() as i32, libc::SIGTERM) };
        let _ = self.node.0.wait();
        let args: Vec<&str> = std::iter::once(NO_REDIS)
            .chain(extra.iter().copied())
            .collect();
        self.node = serve_bound(&[], &self.root, &self.url, "z0", &args, &[]);
    }
}

/// [`Proxied`], the node started with `extra` flags.
pub fn proxied_node(extra: &[&str]) -> Proxied {
    let db = Fresh::new();
    let (proxy, url) = brood_store_conformance::proxy::Proxy::for_postgres(&db.url);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("n0");
    std::fs::create_dir_all(&root).unwrap();
    let args: Vec<&str> = std::iter::once(NO_REDIS)
        .chain(extra.iter().copied())
        .collect();
    let node = serve_with(&root, &url, "z0", &args);
    let sock = root.join("brood.sock");
    Proxied {
        node,
        proxy,
        root,
        sock,
        url,
        _dir: dir,
        _db: db,
    }
}
