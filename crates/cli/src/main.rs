//! `brood`: the one binary. The composition root: it parses the command line,
//! builds a supervisor (in-process for `run` and `demo`, as a daemon for `serve`)
//! or talks to one over its control socket, and renders the answers for people
//! (tables, trees) or programs (`--json`).
//!
//! Exit codes (docs/cli.md): 0 success; 1 an agent failed or an internal error;
//! 2 bad usage or a wait that timed out; 3 a creation refused (attenuation,
//! quota, name); 4 unknown agent; 5 state conflict; 130 cancelled.

mod args;
mod bench;
mod demo;
mod doctor;
mod duration;
mod host;
mod job;
mod job_watch;
mod logs;
mod mcp;
mod quota;
mod remote;
mod remove;
mod render;
mod shim;
mod start;
mod store_url;
mod verbs;

use args::{Cli, Cmd};
use host::{run_root, serve};
use quota::{load_platform, quota};
use shim::shim;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use brood_core::Code;
use brood_runtime::{Config, View};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use remote::Remote;
use serde_json::{Value, json};

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Exit(pub(crate) i32, pub(crate) String);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for Exit {}

fn main() -> ExitCode {
    // `brood agent ...` takes its own flags verbatim: clap would take its
    // `--config` for the global one (the platform configuration).
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some("agent") {
        let code = brood_agent::main(&raw[2..]);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    // `brood help agent` is `brood agent --help`, the agent's own flags.
    if raw.get(1).map(String::as_str) == Some("help")
        && raw.get(2).map(String::as_str) == Some("agent")
    {
        let code = brood_agent::main(&["--help".to_owned()]);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // Only a URL typed on the command line is visible in /proc/<pid>/cmdline.
    let store_on_command_line = matches.value_source("store") == Some(ValueSource::CommandLine);
    if std::env::var_os("BROOD_STORE").is_some() {
        // Read once (just now, by clap); nothing this process starts inherits it.
        // SAFETY: no other thread exists yet (the runtime is built below).
        unsafe { std::env::remove_var("BROOD_STORE") };
    }
    // The model gateway's keys are read now, before any thread exists, and
    // their variables removed from this process's environment (issue 31):
    // nothing it starts inherits them.
    let providers = match &cli.cmd {
        Cmd::Run { .. } | Cmd::Serve { .. } => match model_providers(&cli.config, &cli.root) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("brood: {}", e.1);
                return ExitCode::from(e.0 as u8);
            }
        },
        _ => None,
    };
    if let Cmd::TestAgent { args } = &cli.cmd {
        let exe = std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "brood".into());
        let code = brood_testagent::run(&[exe, "test-agent".into()], args);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    if let Cmd::McpRoot = &cli.cmd {
        return ExitCode::from(mcp::root_program().clamp(0, 255) as u8);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("BROOD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    if matches!(&cli.cmd, Cmd::Serve { log_format, .. } if log_format == "json") {
        // One object a line; a line about a run carries the `run` span's
        // fields, its trace and span ids among them (docs/tracing.md).
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colour only for a person at a terminal, not in a file or a pipe.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("brood: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let done = rt.block_on(real_main(cli, store_on_command_line, providers));
    // Whatever runs on the blocking pool now is a request whose connection
    // is gone (`brood serve` aborts its servers once the supervisor's ends
    // are recorded): the runtime's drop would wait for it, with no worker
    // left to drive its timers or sockets. The fault campaign saw a node
    // not exit within 30 s of SIGTERM once requests on PostgreSQL ran
    // there (`brood_server`'s offload); before, they were tasks, dropped.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match done {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            if let Some(x) = e.downcast_ref::<Exit>() {
                eprintln!("brood: {}", x.1);
                return ExitCode::from(x.0 as u8);
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::BrokenPipe
            {
                return ExitCode::from(0);
            }
            eprintln!("brood: {e:#}");
            ExitCode::from(1)
        }
    }
}

pub(crate) fn default_root() -> PathBuf {
    if let Ok(x) = std::env::var("XDG_STATE_HOME")
        && !x.is_empty()
    {
        return PathBuf::from(x).join("brood");
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/".into());
    PathBuf::from(home).join(".local/state/brood")
}

pub(crate) fn root_of(cli_root: &Option<PathBuf>) -> PathBuf {
    cli_root.clone().unwrap_or_else(default_root)
}

/// `brood fsck`: the ctx projection rebuilt from the store, whole.
fn fsck(root: &Option<PathBuf>, json: bool) -> Result<i32> {
    let v = view(root)?;
    let uid = unsafe_uid();
    // SAFETY: getegid cannot fail.
    let gid = unsafe { libc::getegid() };
    let paths = brood_runtime::paths::Paths::new(root_of(root), uid);
    let operator = brood_core::policy::Policy::operator(uid, gid, Default::default());
    let r = brood_runtime::rebuild::rebuild(
        v.store().as_ref(),
        v.tenant(),
        &paths,
        &operator,
        bin_dir().as_deref(),
    )
    .with_context(|| format!("rebuilding {}", paths.ctx().display()))?;
    if json {
        println!(
            "{}",
            json!({"agents": r.agents, "files": r.files, "artifacts_elsewhere": r.artifacts_elsewhere,
                   "leftovers_removed": r.leftovers_removed, "blob_temps_removed": r.blob_temps_removed,
                   "unrecorded_removed": r.unrecorded_removed, "ctx": paths.ctx()})
        );
    } else {
        println!(
            "rebuilt {} agents ({} files) under {}",
            r.agents,
            r.files,
            paths.ctx().display()
        );
        if r.artifacts_elsewhere > 0 {
            println!(
                "{} artifacts left out: their bytes are not in this node's blob store \
                 (children another node ran)",
                r.artifacts_elsewhere
            );
        }
        if r.leftovers_removed > 0 || r.blob_temps_removed > 0 {
            println!(
                "removed {} leftovers from finished children's artifact/ (no record accounts \
                 for them) and {} unfinished blob files",
                r.leftovers_removed, r.blob_temps_removed
            );
        }
        if r.unrecorded_removed > 0 {
            println!(
                "removed {} files and directories of agents the store no longer holds \
                 (a removal that stopped before its files were gone)",
                r.unrecorded_removed
            );
        }
    }
    Ok(0)
}

/// The store's file: `--store`, else `$BROOD_ROOT/brood.db`.
pub(crate) fn store_file(root: &Option<PathBuf>) -> PathBuf {
    STORE
        .get()
        .cloned()
        .flatten()
        .unwrap_or_else(|| root_of(root).join("brood.db"))
}

pub(crate) fn view(root: &Option<PathBuf>) -> Result<View> {
    let db = store_file(root);
    View::open(&db).with_context(|| format!("reading the store {}", store_url::shown(&db)))
}

/// `--store` as given, if it was (a file or `postgres://…`).
pub(crate) fn store_spec() -> Option<String> {
    STORE
        .get()
        .cloned()
        .flatten()
        .map(|p| p.to_string_lossy().into_owned())
}

/// `--store`, set once at start (read by every verb that opens the store).
static STORE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

pub(crate) fn api<T>(r: Result<T, brood_runtime::ApiError>) -> Result<T> {
    r.map_err(|e| refusal(e.code, e.message).into())
}

/// A supervisor's refusal as the user reads it, the same from the API and
/// from the store: `CODE: message`, the code a word the docs explain
/// (`QuotaFanout`, `NameTaken`), but for `NotFound`, whose message says it
/// all (`no agent named nosuch`).
pub(crate) fn refusal(code: Code, message: String) -> Exit {
    let said = if code == Code::NotFound {
        message
    } else {
        format!("{code}: {message}")
    };
    Exit(code.exit_code(), said)
}

/// `--protocol`: `brood`, `exec`, or `auto`, which picks `brood` for brood's
/// own agents (the program is this `brood` binary, or one named `brood`, run
/// as `test-agent` or `agent`) and `exec` for every other program, so that
/// `brood run -- sh -c 'echo hi'` does what it says.
fn parse_protocol(p: &str, argv: &[String]) -> Result<brood_store::Protocol> {
    if p == "auto" {
        return Ok(if speaks_brood(argv) {
            brood_store::Protocol::Brood
        } else {
            brood_store::Protocol::Exec
        });
    }
    brood_store::Protocol::parse(p).ok_or_else(|| {
        Exit(
            2,
            format!("--protocol must be exec, brood or auto, not {p:?}"),
        )
        .into()
    })
}

/// Whether `--protocol auto` chose `exec` for `argv` (a guess the result
/// may show wrong: see `start::is_handshake`).
fn protocol_guessed(word: &str, argv: &[String]) -> bool {
    word == "auto" && !speaks_brood(argv)
}

/// Whether `argv` starts one of brood's own protocol agents.
fn speaks_brood(argv: &[String]) -> bool {
    let (Some(program), Some(verb)) = (argv.first(), argv.get(1)) else {
        return false;
    };
    let path = Path::new(program);
    let is_brood = path.file_name().is_some_and(|n| n == "brood")
        || std::env::current_exe().is_ok_and(|me| {
            std::fs::canonicalize(path).is_ok_and(|p| p == me) || path.file_name() == me.file_name()
        });
    is_brood && matches!(verb.as_str(), "test-agent" | "agent")
}

fn grace(s: f64) -> Result<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        bail!(Exit(
            2,
            format!("--grace must be a non-negative number of seconds, not {s}")
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// The directory of this binary, put first on agents' PATH so they can call `brood`.
pub(crate) fn bin_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

/// Exit code of `wait` for an agent in `state` (its `state` field, SPEC 4).
pub(crate) fn wait_code_of(state: &str) -> i32 {
    let outcome = state.strip_prefix("closed/").unwrap_or(state);
    brood_core::Terminal::decode(outcome)
        .map(|t| t.wait_exit_code())
        .unwrap_or(1)
}

/// The model gateway's providers with their keys read (`[models]` of the
/// platform configuration), `None` when it names none. Called before any
/// thread exists: the keys' variables are removed from the environment.
fn model_providers(
    config: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> std::result::Result<Option<Arc<brood_runtime::models::Providers>>, Exit> {
    let path = config
        .clone()
        .unwrap_or_else(|| root_of(root).join("config.toml"));
    let platform =
        brood_runtime::config::load_platform(&path).map_err(|e| Exit(2, e.to_string()))?;
    if platform.models.is_empty() {
        return Ok(None);
    }
    let providers = platform
        .models
        .load()
        .map_err(|e| Exit(2, format!("{}: {e}", path.display())))?;
    for var in platform.models.key_vars() {
        // SAFETY: no other thread exists yet (the runtime is built after).
        unsafe { std::env::remove_var(&var) };
    }
    Ok(Some(Arc::new(providers)))
}

/// The gateway a supervisor hosting agents is given.
fn gateway_of(
    providers: &Option<Arc<brood_runtime::models::Providers>>,
) -> Option<brood_runtime::Gateway> {
    providers.as_ref().map(|p| brood_runtime::Gateway {
        host: brood_server::gateway::host(),
        providers: p.clone(),
    })
}

async fn real_main(
    mut cli: Cli,
    store_on_command_line: bool,
    providers: Option<Arc<brood_runtime::models::Providers>>,
) -> Result<i32> {
    cli.store = store_url::choose(
        cli.store.take(),
        store_on_command_line,
        cli.store_file.take(),
    )?;
    // A relative root (or store file) is made absolute once, here: the
    // supervisor, its agents' mounts and every later path are built from it.
    if let Some(r) = &cli.root {
        cli.root = Some(start::absolute(r)?);
    }
    if let Some(s) = &cli.store
        && !brood_store::is_postgres_url(&s.to_string_lossy())
    {
        cli.store = Some(start::absolute(s)?);
    }
    let root = cli.root.clone();
    let remote = Remote::new(&root, &cli.url, &cli.token)?;
    let _ = STORE.set(cli.store.clone());
    let cli_config = cli.config.clone();
    match cli.cmd {
        Cmd::Run {
            name,
            protocol,
            task,
            cwd,
            grace: g,
            policy,
            iso,
            secrets,
            allow_weaker_sandbox,
            json,
            mut argv,
        } => {
            let secrets = secrets_from_env(&secrets)?;
            let mut cfg = Config::new(root_of(&root));
            let entrances = brood_server::Entrances::new();
            entrances.install(&mut cfg);
            cfg.grace = grace(g)?;
            cfg.allow_weaker_sandbox = allow_weaker_sandbox;
            let platform = load_platform(&cli_config, &root)?;
            cfg.quotas = platform.quotas;
            cfg.limits = platform.limits;
            cfg.resource_defaults = platform.resources;
            cfg.gateway = gateway_of(&providers);
            cfg.store = cli.store.clone();
            cfg.slots = cli.slots.clone();
            let policy = policy.as_deref().map(read_policy).transpose()?;
            cfg.bin_dir = bin_dir();
            let protocol_word = protocol;
            let protocol = parse_protocol(&protocol_word, &argv)?;
            let iso = match iso.as_deref() {
                None => brood_core::Iso::None,
                Some(i) => brood_core::Iso::parse(i)
                    .ok_or_else(|| Exit(2, format!("--iso must be ns or none, not {i:?}")))?,
            };
            let name = match name {
                Some(n) => Some(api(brood_core::AgentName::new(&n).map_err(|e| {
                    brood_runtime::ApiError::new(Code::InvalidName, e.to_string())
                }))?),
                None => None,
            };
            start::resolve_program(&mut argv)?;
            let start = host::Start {
                guessed: protocol_guessed(&protocol_word, &argv),
                cwd_defaulted: cwd.is_none(),
                cwd: start::workdir(cwd.as_deref(), iso == brood_core::Iso::Ns)?,
                task: start::task(task)?,
                name,
                protocol,
                argv,
                policy,
                secrets,
                iso,
            };
            run_root(cfg, entrances, start, json).await
        }
        Cmd::Serve {
            grace: g,
            sweep_every,
            allow_weaker_sandbox,
            listen,
            labels,
            capacity,
            node_expiry,
            ui_session_idle,
            ui_session_max,
            otlp_endpoint,
            log_format: _,
        } => {
            let mut cfg = Config::new(root_of(&root));
            // Traces only when a collector is named (issue 30).
            if let Some(endpoint) = brood_otel::endpoint_from_env(otlp_endpoint.as_deref()) {
                let exporter =
                    brood_otel::Exporter::start(brood_otel::Config::new(endpoint, "brood"))
                        .map_err(|e| Exit(2, format!("--otlp-endpoint: {e}")))?;
                cfg.traces = Some(std::sync::Arc::new(exporter));
            }
            if !(node_expiry.is_finite() && node_expiry > 0.0) {
                bail!(Exit(
                    2,
                    format!(
                        "--node-expiry must be a positive number of seconds, not {node_expiry}"
                    )
                ));
            }
            let mut node = brood_runtime::NodeConfig {
                expiry: Duration::from_secs_f64(node_expiry),
                address: listen
                    .clone()
                    .unwrap_or_else(|| cfg.socket.display().to_string()),
                labels: Default::default(),
                capacity,
            };
            for l in &labels {
                let Some((k, v)) = l.split_once('=').filter(|(k, _)| !k.is_empty()) else {
                    bail!(Exit(2, format!("--label {l:?}: expected KEY=VALUE")));
                };
                node.labels.insert(k.to_owned(), v.to_owned());
            }
            cfg.node = Some(node);
            let entrances = brood_server::Entrances::new();
            entrances.install(&mut cfg);
            cfg.grace = grace(g)?;
            if !(sweep_every.is_finite() && sweep_every > 0.0) {
                bail!(Exit(
                    2,
                    format!(
                        "--sweep-every must be a positive number of seconds, not {sweep_every}"
                    )
                ));
            }
            cfg.sweep_every = Some(Duration::from_secs_f64(sweep_every));
            cfg.allow_weaker_sandbox = allow_weaker_sandbox;
            let platform = load_platform(&cli_config, &root)?;
            cfg.quotas = platform.quotas;
            cfg.limits = platform.limits;
            cfg.resource_defaults = platform.resources;
            cfg.gateway = gateway_of(&providers);
            cfg.store = cli.store.clone();
            cfg.slots = cli.slots.clone();
            cfg.bin_dir = bin_dir();
            let mut ui = brood_server::UiLimits::default();
            for (flag, v, at) in [
                ("--ui-session-idle", ui_session_idle, &mut ui.idle),
                ("--ui-session-max", ui_session_max, &mut ui.max),
            ] {
                if !(v.is_finite() && v > 0.0 && v <= 30.0 * 86400.0) {
                    bail!(Exit(
                        2,
                        format!(
                            "{flag} must be a number of seconds above 0 and at most 30 days, not {v}"
                        )
                    ));
                }
                *at = Duration::from_secs_f64(v);
            }
            serve(cfg, entrances, listen, ui).await
        }
        Cmd::Spawn {
            parent,
            customer,
            name,
            label,
            protocol,
            task,
            cwd,
            ready,
            policy,
            iso,
            secrets,
            json,
            mut argv,
        } => {
            let secrets = secrets_from_env(&secrets)?;
            let protocol = parse_protocol(&protocol, &argv)?.as_str();
            let policy = policy.as_deref().map(read_policy).transpose()?;
            start::resolve_program(&mut argv)?;
            let task = start::task(task)?;
            let cwd_defaulted = cwd.is_none();
            let workdir = start::workdir(cwd.as_deref(), iso.as_deref() == Some("ns"))?;
            let mut body =
                json!({"argv": argv, "protocol": protocol, "task": task, "await_ready": ready});
            if let Some(d) = workdir {
                body["cwd"] = json!(d);
            }
            for (k, v) in [
                ("parent", parent),
                ("customer", customer),
                ("name", name),
                ("label", label),
                ("iso", iso),
            ] {
                if let Some(v) = v {
                    body[k] = json!(v);
                }
            }
            if let Some(p) = policy {
                body["policy"] = p;
            }
            if !secrets.is_empty() {
                body["secrets"] = serde_json::to_value(&secrets)?;
            }
            verbs::spawn(&remote, verbs::Spawn { body, json })
                .await
                .map_err(|e| start::cwd_hint(e, cwd_defaulted))
        }
        Cmd::Logs { name, follow, json } => logs::logs(&remote, &root, &name, follow, json).await,
        Cmd::Ps { all, json } => verbs::ps(&remote, &root, all, json).await,
        Cmd::Nodes { json } => verbs::nodes(&remote, &root, json).await,
        Cmd::Tree { name, json } => verbs::tree(&remote, &root, name, json).await,
        Cmd::Show { name, json } => verbs::show(&remote, &root, &name, json).await,
        Cmd::Send { name, text } => verbs::send(&remote, &name, text).await,
        Cmd::Wait {
            names,
            timeout,
            json,
        } => verbs::wait(&remote, &names, timeout, json).await,
        Cmd::Cancel { name } => verbs::act(&remote, "cancel", &name, None).await,
        Cmd::Close { name } => verbs::act(&remote, "close", &name, None).await,
        Cmd::Rm { names, json } => remove::rm(&remote, &root, &names, json).await,
        Cmd::Prune {
            older_than,
            dry_run,
            json,
        } => remove::prune(&remote, &root, &older_than, dry_run, json).await,
        Cmd::Resume {
            name,
            text,
            secrets,
        } => {
            let secrets = secrets_from_env(&secrets)?;
            let mut body = json!({});
            if let Some(t) = text {
                body["text"] = json!(t);
            }
            if !secrets.is_empty() {
                body["secrets"] = serde_json::to_value(&secrets)?;
            }
            let body = (body != json!({})).then_some(body);
            verbs::act(&remote, "resume", &name, body).await
        }
        Cmd::Events {
            name,
            follow,
            format,
        } => verbs::events(&remote, &root, name, follow, &format).await,
        Cmd::Job { what } => job::run(&remote, what).await,
        Cmd::Quota { what } => quota(&root, &cli_config, what),
        Cmd::Doctor { json, fix } => doctor::run(
            &root_of(&root),
            &doctor::Services {
                store: cli.store.as_deref(),
                slots: cli.slots.as_deref(),
            },
            json,
            fix,
        ),
        Cmd::Fsck { json } => fsck(&root, json),
        Cmd::Demo => demo::run(root).await,
        Cmd::Completions { shell } => {
            args::completions(shell, &mut std::io::stdout())?;
            Ok(0)
        }
        Cmd::Bench { which } => bench::run(root, cli.slots.clone(), which).await,
        Cmd::Shim {
            name,
            session,
            text,
        } => shim(&root, &name, session, text).await,
        Cmd::Mcp {
            policy,
            agent_config,
            secrets,
        } => {
            let secrets = secrets_from_env(&secrets)?;
            let policy = policy.as_deref().map(read_policy).transpose()?;
            let home = root_of(&root)
                .join("ctx/home")
                .join(unsafe_uid().to_string());
            let agent_args = match agent_config {
                Some(c) => vec!["--config".to_owned(), c.to_string_lossy().into_owned()],
                None => Vec::new(),
            };
            mcp::serve(
                remote.endpoint().clone(),
                mcp::Root { policy, secrets },
                home,
                agent_args,
            )
            .await
        }
        Cmd::TestAgent { .. } | Cmd::Agent { .. } | Cmd::McpRoot => Ok(0),
    }
}

/// Reads a policy file, JSON or TOML by extension, into the JSON the verbs take
/// (SPEC 5: "JSON; TOML accepted in files"). Its fields are checked at admission.
fn read_policy(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Exit(
            2,
            format!("reading the policy file {}: {e}", path.display()),
        )
    })?;
    let v = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str::<Value>(&text)
            .map_err(|e| Exit(2, format!("policy file {}: {e}", path.display())))?
    } else {
        serde_json::from_str::<Value>(&text)
            .map_err(|e| Exit(2, format!("policy file {}: {e}", path.display())))?
    };
    Ok(v)
}

/// The values of `--secret NAME`s, each read from this process's own
/// environment (issue 25). A name that is not set (or not UTF-8) is refused
/// naming it, before anything is asked of the supervisor; a value is never
/// printed.
fn secrets_from_env(names: &[String]) -> Result<brood_api::Secrets> {
    let mut out = brood_api::Secrets::new();
    for n in names {
        if n.is_empty() || n.contains('=') || n.contains('\0') {
            return Err(Exit(2, format!("--secret {n:?}: not a variable name")).into());
        }
        match std::env::var(n) {
            Ok(v) => out.insert(n.clone(), v),
            Err(std::env::VarError::NotPresent) => {
                return Err(Exit(
                    2,
                    format!(
                        "--secret {n}: {n} is not set in this environment \
                         (export {n}=... first; its value is passed to the agent, never stored)"
                    ),
                )
                .into());
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Exit(2, format!("--secret {n}: its value is not UTF-8")).into());
            }
        }
    }
    Ok(out)
}

pub(crate) fn unsafe_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}
