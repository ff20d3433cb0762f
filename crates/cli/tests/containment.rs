//! Issue 24's attacks on containment, performed for real against real
//! `brood serve` daemons: a hostile agent tries to reach sockets of the host
//! (PostgreSQL's, an abstract one, a UDP port, another daemon's control
//! socket and TCP listener) and to be taken for another daemon's operator.
//! Each test fails if the attack succeeds; positive controls show that the
//! same probes do reach their targets when the policy grants the network, so
//! a probe that cannot reach anything proves nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// PostgreSQL's socket on this machine (Debian's default directory): the
/// issue's `COPY … FROM PROGRAM` went through it.
const PG_SOCKET: &str = "/var/run/postgresql/.s.PGSQL.5432";

/// The issue's tight policy: system directories read-only, one work
/// directory, the test binary's directory, and no network.
fn tight(work: &Path, network: Value) -> Value {
    let mut files: Vec<Value> = ["/usr", "/bin", "/lib", "/lib64", "/etc"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| json!({"path": p, "mode": "ro"}))
        .collect();
    files.push(json!({"path": work.display().to_string(), "mode": "rw"}));
    files.push(json!({"path": exe_dir(), "mode": "ro"}));
    json!({"files": files, "network": network})
}

/// Starts agent `name` on the daemon of `root` with `policy` and waits for
/// it; its result (the probes' lines) and its record.
fn run_agent(root: &Path, name: &str, argv: Vec<String>, policy: Option<Value>) -> (String, Value) {
    let sock = root.join("brood.sock");
    let mut body = json!({"name": name, "argv": argv, "protocol": "brood"});
    if let Some(p) = policy {
        body["policy"] = p;
    }
    let (status, v) = http(&sock, "POST", "/api/agents", Some(&body));
    assert_eq!(status, 201, "spawning {name}: {v}");
    let (status, w) = http(
        &sock,
        "POST",
        &format!("/api/agents/{name}/wait"),
        Some(&json!({"timeout_s": 60})),
    );
    assert_eq!(status, 200, "waiting for {name}: {w}");
    let (_, a) = http(&sock, "GET", &format!("/api/agents/{name}"), None);
    let result = a["result"].as_str().unwrap_or_default().to_owned();
    assert_eq!(a["status"], "completed", "{name} did not complete: {a}");
    (result, a)
}

/// The line of `result` that starts with `prefix`.
fn line<'a>(result: &'a str, prefix: &str) -> &'a str {
    result
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in the agent's result:\n{result}"))
}

/// A listener on an abstract UNIX socket of the host's network namespace.
fn abstract_listener(name: &str) -> std::os::unix::net::UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
}

fn pg_socket() -> &'static str {
    assert!(
        Path::new(PG_SOCKET).exists(),
        "this test needs PostgreSQL's UNIX socket at {PG_SOCKET} (the attack of issue 24 went through it); start PostgreSQL"
    );
    PG_SOCKET
}

#[test]
fn network_none_reaches_no_socket_of_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let (root_a, root_b, work) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("w"),
    );
    std::fs::create_dir_all(&work).unwrap();
    let _a = serve_daemon(&root_a, None);
    let _b = serve_daemon(&root_b, None);
    let abstract_name = format!("brood-containment-{}", std::process::id());
    let _abs = abstract_listener(&abstract_name);
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let udp_port = udp.local_addr().unwrap().port().to_string();
    let b_sock = root_b.join("brood.sock").display().to_string();
    let probes = |extra: &[&str]| {
        let mut flags = vec![
            "--probe-families",
            "--probe-io-uring",
            "--probe-unix",
            pg_socket(),
            "--probe-unix",
            &b_sock,
            "--probe-abstract",
            &abstract_name,
            "--probe-udp",
            &udp_port,
            "--probe-udp",
            "53",
        ];
        flags.extend_from_slice(extra);
        agent(&flags)
    };

    let (r, a) = run_agent(
        &root_a,
        "tight",
        probes(&[]),
        Some(tight(&work, json!("none"))),
    );
    assert_eq!(
        line(&r, "families:"),
        "families: socketpair/AF_UNIX",
        "network none creates no socket at all"
    );
    for (probe, target) in [
        ("io-uring", ""),
        ("unix", PG_SOCKET),
        ("unix", b_sock.as_str()),
        ("abstract", abstract_name.as_str()),
        ("udp", udp_port.as_str()),
        ("udp", "53"),
    ] {
        let prefix = if target.is_empty() {
            format!("{probe}:")
        } else {
            format!("{probe} {target}:")
        };
        assert!(
            line(&r, &prefix).ends_with(": denied"),
            "{prefix} got through:\n{r}"
        );
    }
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram of the tight agent arrived"
    );
    // What was enforced is recorded with the agent (meta.json).
    // (written by the projection thread, which may still be on its way)
    let meta_file = root_a.join("ctx/agent/tight.d/meta.json");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            &meta_file
        )
        .is_ok_and(|m| m.contains("no socket (socketpair(AF_UNIX) only)"))),
        "meta.json does not say the sockets were filtered: {:?} ({})",
        std::fs::read_to_string(&meta_file),
        a["name"]
    );

    // The positive control: with the network granted, the same probes reach
    // these targets, so the refusals above were real.
    let (r, _) = run_agent(&root_a, "open", probes(&[]), None);
    assert!(
        line(&r, &format!("unix {PG_SOCKET}:")).ends_with(": ok"),
        "{r}"
    );
    // Abstract sockets stay scoped by landlock even with the whole network
    // (an agent reaches only those made in its own domain): the probe's own
    // code reaches this one from outside any sandbox.
    assert!(
        line(&r, &format!("abstract {abstract_name}:")).ends_with(": denied"),
        "{r}"
    );
    let outside = brood_testagent::probe::run(&brood_testagent::flags::Probe::Abstract(
        abstract_name.clone(),
    ));
    assert_eq!(outside, format!("abstract {abstract_name}: ok"));
    assert!(
        line(&r, &format!("udp {udp_port}:")).ends_with(": ok"),
        "{r}"
    );
    let (n, _) = udp
        .recv_from(&mut buf)
        .expect("the open agent's datagram arrives");
    assert_eq!(n, 1);
    for fam in ["AF_UNIX/stream", "AF_INET/dgram", "AF_NETLINK/raw"] {
        assert!(line(&r, "families:").contains(fam), "{fam} missing: {r}");
    }
}

#[test]
fn a_port_list_grants_tcp_to_those_ports_and_no_other_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("a"), dir.path().join("w"));
    std::fs::create_dir_all(&work).unwrap();
    let _a = serve_daemon(&root, None);
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (pa, po) = (
        allowed.local_addr().unwrap().port().to_string(),
        other.local_addr().unwrap().port().to_string(),
    );
    let port: u16 = pa.parse().unwrap();
    let argv = agent(&[
        "--probe-families",
        "--probe-connect",
        &pa,
        "--probe-connect",
        &po,
        "--probe-unix",
        pg_socket(),
        "--probe-udp",
        "53",
        "--probe-io-uring",
    ]);
    let (r, _) = run_agent(
        &root,
        "ports",
        argv,
        Some(tight(&work, json!({"connect": [port]}))),
    );
    assert_eq!(
        line(&r, "families:"),
        "families: AF_INET/stream AF_INET6/stream socketpair/AF_UNIX"
    );
    assert!(line(&r, &format!("connect {pa}:")).ends_with(": ok"), "{r}");
    assert!(
        line(&r, &format!("connect {po}:")).ends_with(": denied"),
        "{r}"
    );
    assert!(
        line(&r, &format!("unix {PG_SOCKET}:")).ends_with(": denied"),
        "{r}"
    );
    assert!(line(&r, "udp 53:").ends_with(": denied"), "{r}");
    assert!(line(&r, "io-uring:").ends_with(": denied"), "{r}");
}

/// The names of the agents a daemon has.
fn agents_of(root: &Path) -> Vec<String> {
    let (_, v) = http(
        &root.join("brood.sock"),
        "GET",
        "/api/agents?all=true",
        None,
    );
    v["agents"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_agent_is_never_another_daemons_operator() {
    let dir = tempfile::tempdir().unwrap();
    let (root_a, root_b) = (dir.path().join("a"), dir.path().join("b"));
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _a = serve_daemon(&root_a, None);
    let _b = serve_daemon(&root_b, Some(&listen));
    let token = std::fs::read_to_string(root_b.join("token"))
        .unwrap()
        .trim()
        .to_owned();
    // One of B's agents that takes input on its own socket (SPEC 8).
    let (s, v) = http(
        &root_b.join("brood.sock"),
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "victim", "argv": agent(&["--echo"]), "protocol": "brood", "await_ready": true}),
        ),
    );
    assert_eq!(s, 201, "{v}");
    let before = agents_of(&root_b);
    let b_sock = root_b.join("brood.sock");
    let b = b_sock.display().to_string();
    // An agent of A with the whole network (so it may make UNIX and TCP
    // sockets at all), four ways into B: B's control socket by path, the
    // brood CLI on B's root, B's TCP listener with B's own token, and the
    // socket of B's agent (through its shim's client).
    let script = format!(
        "{exe} test-agent --probe-brood-socket {b} --result x >/dev/null </dev/null; \
         {exe} --root {rb} spawn --name intruder2 -- /bin/sleep 600; echo spawn=$?; \
         {exe} --url http://{listen} --token {token} spawn --name intruder3 -- /bin/sleep 600; echo tcp=$?; \
         {exe} --root {rb} shim victim forged-input 2>&1; echo shim=$?",
        exe = exe(),
        rb = root_b.display(),
    );
    let body = json!({"name": "prober", "argv": ["/bin/sh", "-c", script], "protocol": "exec"});
    let (status, v) = http(
        &root_a.join("brood.sock"),
        "POST",
        "/api/agents",
        Some(&body),
    );
    assert_eq!(status, 201, "{v}");
    let (_, w) = http(
        &root_a.join("brood.sock"),
        "POST",
        "/api/agents/prober/wait",
        Some(&json!({"timeout_s": 60})),
    );
    let out = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        out.contains("spawn=3"),
        "B's socket took the agent for its operator:\n{out}\n{w}"
    );
    assert!(
        out.contains("shim=1")
            && out.contains("EACCES")
            && out.contains("not this supervisor's operator"),
        "B's agent socket took A's agent for its operator:\n{out}"
    );
    let said = std::fs::read_to_string(
        root_b.join("ctx/home/0/agent/victim/session/default/messages.jsonl"),
    )
    .unwrap_or_default();
    assert!(
        !said.contains("forged-input"),
        "the forged input reached B's agent: {said}"
    );
    assert!(
        out.contains("tcp=3"),
        "B's TCP listener took the agent's token:\n{out}\n{w}"
    );
    // And the probe of the control socket by hand, in the agent's sandbox.
    let (r, _) = run_agent(
        &root_a,
        "prober2",
        agent(&["--probe-brood-socket", &b]),
        None,
    );
    assert_eq!(
        line(&r, "brood-socket"),
        format!("brood-socket {b}: http 403")
    );
    assert_eq!(agents_of(&root_b), before, "B made an agent for A's agent");
    // The positive control: the same requests from outside every agent
    // are the operator's.
    let o = brood(&root_b, &["spawn", "--name", "legit", "--", "/bin/true"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn the_door_is_a_tight_agents_way_to_its_own_supervisor() {
    let dir = tempfile::tempdir().unwrap();
    let (root, work) = (dir.path().join("a"), dir.path().join("w"));
    std::fs::create_dir_all(&work).unwrap();
    let _a = serve_daemon(&root, None);
    // Another tree the door must not reach.
    let (s, v) = http(
        &root.join("brood.sock"),
        "POST",
        "/api/agents",
        Some(&json!({"name": "other", "argv": ["/bin/sleep", "600"], "protocol": "exec"})),
    );
    assert_eq!(s, 201, "{v}");
    let script = format!(
        "{exe} spawn --name kid --ready -- {exe} test-agent --echo; echo spawn=$?; \
         {exe} ps >/dev/null; echo ps=$?; \
         {exe} shim kid hello-kid; echo shim=$?; \
         {exe} cancel other; echo cancel=$?",
        exe = exe()
    );
    let mut policy = tight(&work, json!("none"));
    policy["tools"] = json!(["shell", "create", "send", "wait", "close", "resume"]);
    let body = json!({"name": "tight", "argv": ["/bin/sh", "-c", script], "protocol": "exec", "policy": policy});
    let (s, v) = http(&root.join("brood.sock"), "POST", "/api/agents", Some(&body));
    assert_eq!(s, 201, "{v}");
    let (_, w) = http(
        &root.join("brood.sock"),
        "POST",
        "/api/agents/tight/wait",
        Some(&json!({"timeout_s": 60})),
    );
    let out = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(out.contains("spawn=0"), "{out}\n{w}");
    assert!(out.contains("ps=0"), "{out}");
    assert!(out.contains("hello-kid") && out.contains("shim=0"), "{out}");
    assert!(
        out.contains("cancel=3"),
        "the door reached another tree:\n{out}"
    );
    let (_, kid) = http(&root.join("brood.sock"), "GET", "/api/agents/kid", None);
    assert_eq!(kid["parent"], "tight", "{kid}");
    let (_, other) = http(&root.join("brood.sock"), "GET", "/api/agents/other", None);
    assert_eq!(other["status"], "running", "{other}");
}

/// The pid of `host_pid` in its own (innermost) PID namespace (proc(5)
/// `NSpid`): what a process in the agents' namespace calls it.
fn inner_pid(host_pid: i64) -> String {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_owned()
}

#[test]
fn another_tree_is_out_of_sight_even_with_the_whole_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    let d = serve_daemon(&root, None);
    let sock = root.join("brood.sock");
    // Tree one: an agent holding an API key, with a transcript.
    let secret = "sk-tree-one-7c1e";
    let body = json!({
        "name": "victim",
        "argv": agent(&["--message", "transcript-of-tree-one", "--hang"]),
        "protocol": "brood",
        "await_ready": true,
        "policy": {"env": {"OPENAI_API_KEY": secret}},
    });
    let (s, v) = http(&sock, "POST", "/api/agents", Some(&body));
    assert_eq!(s, 201, "{v}");
    let victim_pid = v["pid"].as_i64().expect("the victim runs");
    let transcript = root.join("ctx/home/0/agent/victim/session/default/messages.jsonl");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            &transcript
        )
        .is_ok_and(|t| t.contains("transcript-of-tree-one"))),
        "the victim's transcript is on disk for the operator"
    );
    assert!(read(root.join("ctx/agent/victim.d/env")).contains(secret));
    let daemon_pid = d.0.id();
    let vin = inner_pid(victim_pid);
    let ctx = root.join("ctx");
    // Tree two: an agent with the operator's whole filesystem, looking.
    let script = format!(
        "cat {ctx}/agent/victim.d/env {ctx}/agent/victim.d/policy {t}; echo files=$?; \
         ls {ctx}/agent; cat /proc/{vin}/environ /proc/{vin}/cmdline /proc/{victim_pid}/environ; echo proc=$?; \
         cat /proc/{daemon_pid}/cmdline; echo daemon=$?; \
         ls -d /proc/[0-9]* | wc -l; \
         cat \"$BROOD_POLICY\" >/dev/null; echo own=$?",
        ctx = ctx.display(),
        t = transcript.display(),
    );
    let (s, v) = http(
        &sock,
        "POST",
        "/api/agents",
        Some(&json!({"name": "snoop", "argv": ["/bin/sh", "-c", script], "protocol": "exec"})),
    );
    assert_eq!(s, 201, "{v}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/snoop/wait",
        Some(&json!({"timeout_s": 30})),
    );
    let out = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    for leak in [secret, "transcript-of-tree-one", "--hang", "serve"] {
        assert!(!out.contains(leak), "the snoop read {leak:?}:\n{out}");
    }
    assert!(out.contains("files=1"), "{out}");
    assert!(out.contains("proc=1"), "{out}");
    assert!(out.contains("daemon=1"), "{out}");
    // It lists only its own part of the tree, sees its own processes (the
    // shell, ls and wc: a handful, not the host's), and reads its own object.
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&"snoop.d") && !lines.contains(&"victim.d"),
        "{out}"
    );
    let count: usize = lines
        .iter()
        .find_map(|l| l.trim().parse().ok())
        .expect("a process count");
    assert!(
        (1..=4).contains(&count),
        "the snoop sees {count} processes:\n{out}"
    );
    // Its own policy file is written by the launch itself, before it runs
    // (the other control files come from the projection thread, which a
    // fast agent may outrun).
    assert!(out.contains("own=0"), "its own policy unread:\n{out}");
}

/// `cmd` run as the local user `nobody` (runuser(1)): its exit status and
/// output.
fn as_nobody(cmd: &str) -> std::process::Output {
    #[allow(clippy::disallowed_methods)]
    std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "/bin/sh", "-c", cmd])
        .output()
        .expect("runuser (util-linux) runs")
}

#[test]
fn another_local_user_reads_nothing_of_the_root() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Every directory above the root may be entered by anyone, so only the
    // root's own modes stand between the user and the files.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = dir.path().join("r");
    let _d = serve_daemon(&root, None);
    let secret = "sk-local-user-9f2b";
    let (s, v) = http(
        &root.join("brood.sock"),
        "POST",
        "/api/agents",
        Some(
            &json!({"name": "keyed", "argv": ["/bin/sleep", "600"], "protocol": "exec",
                     "policy": {"env": {"OPENAI_API_KEY": secret}}}),
        ),
    );
    assert_eq!(s, 201, "{v}");
    let env_file = root.join("ctx/agent/keyed.d/env");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            &env_file
        )
        .is_ok_and(|t| t.contains(secret))),
        "the env file is written (the operator reads it)"
    );
    let db = root.join("brood.db");
    assert!(std::fs::read(&db).is_ok_and(|b| !b.is_empty()));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700, "the root");
    assert_eq!(mode(&db), 0o600, "the store");
    let wal = root.join("brood.db-wal");
    if wal.exists() {
        assert_eq!(mode(&wal), 0o600, "the store's WAL");
    }
    assert_eq!(mode(&env_file), 0o600, "an agent's env file");
    for target in [&db, &wal, &env_file, &root.join("token"), &root.join("ctx")] {
        let o = as_nobody(&format!("cat {0} || ls {0}", target.display()));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            !o.status.success() && !out.contains(secret),
            "nobody read {}: {}",
            target.display(),
            text(&o)
        );
    }
    // Nor can it reach the daemon: the socket is beneath the root.
    let o = as_nobody(&format!("{} --root {} ps", exe(), root.display()));
    assert!(
        !o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("keyed"),
        "{}",
        text(&o)
    );
    // (and that user can run brood at all, so the refusal above was the root's)
    let o = as_nobody(&format!("{} --version", exe()));
    assert!(o.status.success(), "{}", text(&o));
    // The positive control: the same user reads a file of the same tempdir
    // that is not beneath the root.
    let beside = dir.path().join("beside.txt");
    std::fs::write(&beside, "readable").unwrap();
    std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = as_nobody(&format!("cat {}", beside.display()));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "readable",
        "{}",
        text(&o)
    );
}

#[test]
fn iso_ns_with_network_none_makes_no_socket_either() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    let _a = serve_daemon(&root, None);
    // The host's /var/run is in its mount table, so PostgreSQL's socket is
    // there by path: only the filter stands between them.
    let mut mounts = system_mounts();
    mounts.push("/var/run\t/var/run\tro\tbind,nosuid,nodev".to_owned());
    let argv = agent(&[
        "--probe-families",
        "--probe-unix",
        pg_socket(),
        "--probe-udp",
        "53",
    ]);
    let sock = root.join("brood.sock");
    let body = json!({"name": "isolated", "argv": argv, "protocol": "brood", "iso": "ns",
                      "policy": {"mounts": mounts, "network": "none"}});
    let (s, v) = http(&sock, "POST", "/api/agents", Some(&body));
    assert_eq!(s, 201, "{v}");
    let (_, w) = http(
        &sock,
        "POST",
        "/api/agents/isolated/wait",
        Some(&json!({"timeout_s": 60})),
    );
    let r = w["agents"][0]["result"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(w["agents"][0]["status"], "completed", "{w}");
    assert_eq!(line(&r, "families:"), "families: socketpair/AF_UNIX", "{r}");
    assert!(
        line(&r, &format!("unix {PG_SOCKET}:")).ends_with(": denied"),
        "{r}"
    );
    assert!(line(&r, "udp 53:").ends_with(": denied"), "{r}");
}
