//! The supervisor hosted by this process: `brood run` (a root supervised
//! in-process until it ends, with its control socket) and `brood serve` (the
//! daemon, on its socket and, when asked, loopback TCP).

use anyhow::{Context, Result};
use brood_runtime::{Caller, Config, SpawnRequest, Supervisor};
use serde_json::{Value, json};

use crate::remote::typed;
use crate::{Exit, api, render, unsafe_uid, wait_code_of};

/// What `brood run` starts: the program (its path already resolved against
/// the caller's directory), its task, directory and protocol.
pub(crate) struct Start {
    pub name: Option<brood_core::AgentName>,
    pub protocol: brood_store::Protocol,
    /// `--protocol auto` chose `exec` (the program is not one of brood's own).
    pub guessed: bool,
    pub task: String,
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    /// The directory is the caller's, not one given with `--cwd`.
    pub cwd_defaulted: bool,
    pub policy: Option<Value>,
    /// `--secret` values, read from this process's environment (issue 25).
    pub secrets: brood_api::Secrets,
    pub iso: brood_core::Iso,
}

/// Runs a root agent: with the daemon that serves the root, as its client,
/// when one answers on its socket (issue 25: `brood run` and `brood serve`
/// on one root); otherwise with an in-process supervisor and its control
/// socket.
pub(crate) async fn run_root(
    cfg: Config,
    entrances: brood_server::Entrances,
    start: Start,
    json_out: bool,
) -> Result<i32> {
    let sock = cfg.socket.clone();
    let root = cfg.root.clone();
    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
        let remote = crate::remote::Remote::at(&sock);
        return run_with_daemon(&remote, start, json_out).await;
    }
    let (sup, listener) = host(cfg).await?;
    let api = brood_server::Api::new(sup.clone(), None);
    entrances.serve(&api);
    let server = tokio::spawn(brood_server::serve_unix(api, listener));
    let req = SpawnRequest {
        customer: None,
        label: None,
        placement: None,
        traceparent: None,
        name: start.name,
        parent: None,
        argv: start.argv,
        protocol: start.protocol,
        task: start.task,
        env: Vec::new(),
        secrets: start.secrets,
        cwd: start.cwd,
        session: brood_core::SessionName::default_session(),
        await_ready: false,
        policy: start.policy,
        life: brood_core::Life::Owned,
        iso: start.iso,
        root: None,
    };
    // Whatever happens to the run, the supervisor is shut down: no process, group
    // or socket of this run outlives it.
    let outcome = supervise_root(&sup, req).await;
    sup.shutdown().await;
    server.abort();
    let _ = std::fs::remove_file(&sock);
    let (a, tree) = outcome.map_err(|e| crate::start::cwd_hint(e, start.cwd_defaulted))?;
    let src = crate::logs::Source::local(root);
    report(a, tree, start.guessed, json_out, src.ok()).await
}

/// `brood run` through the daemon serving the root: the same root, its end
/// waited for, its result and tree printed as an in-process run prints
/// them; Ctrl-C cancels it.
async fn run_with_daemon(r: &crate::remote::Remote, start: Start, json_out: bool) -> Result<i32> {
    let mut body = json!({
        "argv": start.argv,
        "protocol": start.protocol.as_str(),
        "task": start.task,
        "iso": start.iso.as_str(),
    });
    if let Some(n) = &start.name {
        body["name"] = json!(n.as_str());
    }
    if let Some(c) = &start.cwd {
        body["cwd"] = json!(c);
    }
    if let Some(p) = start.policy {
        body["policy"] = p;
    }
    // The values go in the request (never stored, issue 25), as `brood
    // spawn --secret` sends them.
    if !start.secrets.is_empty() {
        body["secrets"] = serde_json::to_value(&start.secrets)?;
    }
    let started = r
        .call("POST", "/api/agents", Some(body))
        .await
        .map_err(|e| crate::start::cwd_hint(e, start.cwd_defaulted))?;
    let name = typed::<brood_api::Agent>(&started)?.name;
    // Ctrl-C cancels the tree (and then we report it like any other end).
    let ep = r.endpoint().clone();
    let n2 = name.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let path = format!("/api/agents/{n2}/cancel");
            let _ = brood_server::client::call(&ep, "POST", &path, Some(&json!({})), None).await;
        }
    });
    let a = loop {
        let w = r
            .call(
                "POST",
                &format!("/api/agents/{name}/wait"),
                Some(json!({"timeout_s": 3600.0})),
            )
            .await?;
        let w: brood_api::WaitReply = typed(&w)?;
        if !w.timed_out {
            break first_of(w)?;
        }
    };
    let tree: brood_api::Trees = crate::remote::typed(
        &r.call("GET", &format!("/api/tree?root={name}"), None)
            .await?,
    )?;
    report(
        a,
        tree,
        start.guessed,
        json_out,
        Some(crate::logs::Source::Api(r)),
    )
    .await
}

/// What `brood run` prints of a root that ended, and its exit code.
async fn report(
    a: brood_api::Agent,
    tree: brood_api::Trees,
    guessed: bool,
    json_out: bool,
    src: Option<crate::logs::Source<'_>>,
) -> Result<i32> {
    // A brood-protocol agent that `auto` ran as a plain program answered
    // the task with its handshake: that is no result.
    let handshake = guessed
        && a.status == "completed"
        && a.result.as_deref().is_some_and(crate::start::is_handshake);
    if json_out {
        println!("{}", json!({"agent": a, "tree": tree.trees.first()}));
    } else {
        if let Some(res) = a.result.as_deref()
            && !handshake
        {
            print!("{res}");
            if !res.ends_with('\n') && !res.is_empty() {
                println!();
            }
        }
        if let Some(t) = tree.trees.first() {
            eprint!("{}", render::tree(t));
        }
    }
    if handshake {
        return Err(Exit(
            1,
            format!(
                "{} answered with brood's protocol handshake ({{\"type\":\"ready\"}} on its first line): \
                 it speaks the brood protocol, but --protocol auto ran it as a plain program \
                 (auto picks brood only for brood's own agents); run it with --protocol brood",
                a.name
            ),
        )
        .into());
    }
    if a.status == "failed" {
        match &src {
            Some(src) => crate::logs::explain_failures(src, std::slice::from_ref(&a)).await,
            None => eprint!("{}", crate::logs::why_failed(&a, None)),
        }
    }
    Ok(wait_code_of(&a.state))
}

/// Starts the root, waits for it (Ctrl-C cancels it), and returns its record and
/// its tree.
async fn supervise_root(
    sup: &Supervisor,
    req: SpawnRequest,
) -> Result<(brood_api::Agent, brood_api::Trees)> {
    let me = Caller::User { uid: unsafe_uid() };
    let started = api(sup.spawn(me.clone(), req).await)?;
    let name = brood_core::AgentName::new(&started.name).map_err(|e| Exit(1, e.to_string()))?;
    // Ctrl-C cancels the tree (and then we report it like any other end).
    let sup2 = sup.clone();
    let n2 = name.clone();
    let me2 = me.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = sup2.cancel(me2, n2).await;
        }
    });
    let a = first_of(api(sup.wait(me, vec![name.clone()], None).await)?)?;
    let tree = api(sup.view().tree(Some(&name)))?;
    Ok((a, tree))
}

/// The one agent a wait for one agent answers with.
fn first_of(w: brood_api::WaitReply) -> Result<brood_api::Agent> {
    w.agents
        .into_iter()
        .next()
        .ok_or_else(|| Exit(1, "the wait answered with no agent".to_owned()).into())
}

/// A supervisor for `cfg` with its control socket bound (the socket first, so a
/// root another supervisor already serves is refused before anything starts).
async fn host(cfg: Config) -> Result<(Supervisor, tokio::net::UnixListener)> {
    std::fs::create_dir_all(&cfg.root)
        .with_context(|| format!("creating the root {}", cfg.root.display()))?;
    let listener = brood_server::bind_unix(&cfg.socket)
        .await
        .with_context(|| format!("binding the control socket {}", cfg.socket.display()))?;
    let sup = Supervisor::start(cfg).context("starting the supervisor")?;
    Ok((sup, listener))
}

pub(crate) async fn serve(
    cfg: Config,
    entrances: brood_server::Entrances,
    listen: Option<String>,
    ui: brood_server::UiLimits,
) -> Result<i32> {
    let sock = cfg.socket.clone();
    let root = cfg.root.clone();
    // The TCP listener is bound before anything starts, so a bad address is
    // refused without side effects.
    let tcp = match &listen {
        Some(addr) => Some(
            brood_server::bind_tcp(addr)
                .await
                .map_err(|e| Exit(2, format!("binding --listen {addr}: {e}")))?,
        ),
        None => None,
    };
    // The token is there before anyone can connect.
    let token = match &tcp {
        Some(_) => {
            std::fs::create_dir_all(&root)
                .with_context(|| format!("creating the root {}", root.display()))?;
            Some(
                brood_server::Token::load_or_create(&root)
                    .map_err(|e| Exit(1, format!("the API token: {e}")))?,
            )
        }
        None => None,
    };
    std::fs::create_dir_all(&cfg.root)
        .with_context(|| format!("creating the root {}", cfg.root.display()))?;
    let listener = brood_server::bind_unix(&cfg.socket)
        .await
        .with_context(|| format!("binding the control socket {}", cfg.socket.display()))?;
    // The listeners serve from now on: while the supervisor starts (its
    // recovery and the ctx tree's rebuild, seconds on a large tree behind a
    // slow store), `/healthz` says so at once and other requests wait for
    // the start (issue 28).
    let (started, starting) = brood_server::starting();
    let mut servers = vec![tokio::spawn(brood_server::serve_unix_from_start(
        starting.clone(),
        listener,
    ))];
    let tcp_addr = match tcp {
        Some(l) => {
            let addr = l.local_addr()?;
            servers.push(tokio::spawn(brood_server::serve_tcp_from_start(
                starting, l,
            )));
            Some(addr)
        }
        None => None,
    };
    // On a thread of the blocking pool: the start's store calls must not
    // hold a worker that the listeners need.
    let sup = tokio::task::spawn_blocking(move || Supervisor::start(cfg))
        .await
        .map_err(|e| Exit(1, format!("the supervisor's start panicked: {e}")))?
        .context("starting the supervisor")?;
    let api = brood_server::Api::new(sup.clone(), token);
    api.set_ui_limits(ui);
    entrances.serve(&api);
    started.set(api);
    eprintln!(
        "brood: serving {} ({})",
        sock.display(),
        sup.host_info().containment
    );
    if let Some(addr) = tcp_addr {
        eprintln!(
            "brood: serving http://{addr} (token in {})",
            brood_server::Token::path(&root).display()
        );
        eprintln!(
            "brood: web UI at http://{addr}/ui?token=… (the token of {}; docs/ui.md)",
            brood_server::Token::path(&root).display()
        );
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sup.shutdown().await;
    for s in servers {
        s.abort();
    }
    let _ = std::fs::remove_file(&sock);
    Ok(0)
}
