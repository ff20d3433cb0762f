//! The command line as clap reads it: the global options and every verb
//! with its flags, help and examples (docs/cli.md).

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::job::JobCmd;
use crate::quota::QuotaCmd;

#[derive(Parser)]
#[command(
    name = "brood",
    version,
    about = "A runtime for child agents: owned process trees that die with their parent, recorded durably.",
    after_help = "Examples:\n  brood demo\n  brood run -- brood test-agent --result hello\n  brood run -- sh -c 'echo hi'\n  brood serve &  brood spawn --name a -- brood test-agent --hang; brood tree; brood cancel a"
)]
pub(crate) struct Cli {
    /// State directory ($BROOD_ROOT; default $XDG_STATE_HOME/brood or ~/.local/state/brood).
    #[arg(long, global = true, env = "BROOD_ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Platform configuration (quota defaults and ceilings, `[limits]`); default $BROOD_ROOT/config.toml.
    #[arg(long, global = true)]
    pub(crate) config: Option<PathBuf>,
    /// The store: a SQLite file (default $BROOD_ROOT/brood.db) or a PostgreSQL
    /// server (`postgres://user@host:port/db`). Supervisors with roots of their
    /// own may share one store; one of them runs the sweepers. A URL with a
    /// password is refused here (every local process reads a command line):
    /// give it in $BROOD_STORE or with --store-file.
    #[arg(long, global = true, env = "BROOD_STORE", hide_env_values = true)]
    pub(crate) store: Option<PathBuf>,
    /// A file (mode 0600 when it holds a password) whose first line is the
    /// store's URL, read once at start-up.
    #[arg(long, global = true, env = "BROOD_STORE_FILE")]
    pub(crate) store_file: Option<PathBuf>,
    /// The concurrency-slot counter: embedded when absent, or
    /// `redis://host[:port][/db]` shared by the supervisors of one store.
    #[arg(long, global = true, env = "BROOD_SLOTS")]
    pub(crate) slots: Option<String>,
    /// Talk to a daemon's TCP listener (`http://127.0.0.1:PORT`, see `brood
    /// serve --listen`) instead of its control socket.
    #[arg(long, global = true, env = "BROOD_URL")]
    pub(crate) url: Option<String>,
    /// The bearer token for `--url` (the daemon keeps it in $BROOD_ROOT/token).
    #[arg(long, global = true, env = "BROOD_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Start a root agent with an in-process supervisor, wait for it, print its result and tree.
    Run {
        /// The agent's name (letters, digits, `-` and `_`; default: one brood
        /// picks from the program's name).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// How the program talks to brood: `exec` (a plain program: the task on
        /// stdin, stdout is its result, exit 0 is success), `brood` (brood's
        /// JSON-lines protocol), or `auto`: `brood` for brood's own agents
        /// (`brood test-agent ...`), `exec` for anything else; a program run
        /// so whose output starts with the protocol's `{"type":"ready"}` is
        /// reported as a mistake, not a result (pass --protocol brood).
        #[arg(long, default_value = "auto")]
        protocol: String,
        /// The task (handoff) given to the agent; `-` reads it from stdin.
        /// Without --task, a pipe or file on stdin is the task (`echo hi |
        /// brood run -- cat`); a terminal is not read.
        #[arg(long)]
        task: Option<String>,
        /// The program's working directory (default: the current directory;
        /// with --iso ns, the agent's own root).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// How long a stopped agent has between SIGTERM and SIGKILL: seconds
        /// (`3`, `0.5`) or with a unit (`500ms`, `10s`).
        #[arg(long, value_name = "DURATION", default_value = "3", value_parser = crate::duration::seconds)]
        grace: f64,
        /// The agent's policy (what it may touch, run and spend), a JSON or TOML
        /// file (by extension); see docs/cli.md.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// `ns`: a private mount namespace built from the policy's mounts.
        #[arg(long)]
        iso: Option<String>,
        /// Pass the variable NAME of this environment to the agent as a
        /// secret (repeatable): its value reaches the agent's environment
        /// and is never stored, shown or logged (docs/security.md "Secrets").
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
        /// Start agents even when a sandbox layer their policy needs is missing
        /// here; what was not enforced is recorded in each agent's meta.json.
        #[arg(long)]
        allow_weaker_sandbox: bool,
        /// Print the agent's record and its tree as one JSON object instead
        /// of its result and a drawing.
        #[arg(long)]
        json: bool,
        /// The program and its arguments, after `--` (a relative program is
        /// found from the current directory, a bare name on PATH).
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        argv: Vec<String>,
    },
    /// Run the daemon on $BROOD_ROOT/brood.sock.
    Serve {
        /// How long a stopped agent has between SIGTERM and SIGKILL: seconds
        /// (`3`, `0.5`) or with a unit (`500ms`, `10s`).
        #[arg(long, value_name = "DURATION", default_value = "3", value_parser = crate::duration::seconds)]
        grace: f64,
        /// The sweepers' tick (timeouts every tick, orphans every 5,
        /// reconcile every 30): seconds or with a unit (`500ms`). Only the
        /// supervisor holding the sweeper lease of its store sweeps.
        #[arg(long, value_name = "DURATION", default_value = "1", value_parser = crate::duration::seconds)]
        sweep_every: f64,
        /// See `brood run --allow-weaker-sandbox`.
        #[arg(long)]
        allow_weaker_sandbox: bool,
        /// Also serve the API on this loopback address (`127.0.0.1:8420`),
        /// with the bearer token of $BROOD_ROOT/token (made at first start).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// A label of this node for placement (`--label zone=a`; repeatable),
        /// shown by `brood nodes`.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// How many agents this node takes at once (shown by `brood nodes`;
        /// default: no limit of its own).
        #[arg(long, value_name = "N")]
        capacity: Option<u32>,
        /// How long without a heartbeat before the other nodes declare a node
        /// lost (its agents end `failed (lost)`): seconds or with a unit (`1m`).
        #[arg(long, value_name = "DURATION", default_value = "10", value_parser = crate::duration::seconds)]
        node_expiry: f64,
        /// How long without a request before a web UI session ends
        /// (docs/ui.md): seconds or with a unit (`1h`), at most 30 days.
        #[arg(long, value_name = "DURATION", default_value = "3600", value_parser = crate::duration::seconds)]
        ui_session_idle: f64,
        /// How long after its login a web UI session ends, however busy:
        /// seconds or with a unit (`12h`), at most 30 days.
        #[arg(long, value_name = "DURATION", default_value = "43200", value_parser = crate::duration::seconds)]
        ui_session_max: f64,
        /// Send traces over OTLP/HTTP (protobuf) to this collector
        /// (`http://127.0.0.1:4318`; `/v1/traces` is added). Default: the
        /// standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
        /// `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: no traces
        /// (docs/tracing.md).
        #[arg(long, value_name = "URL")]
        otlp_endpoint: Option<String>,
        /// The log on stderr: `text`, or `json` (one object a line, with the
        /// trace and span ids of the run it is about; docs/tracing.md).
        #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
        log_format: String,
    },
    /// The nodes sharing this store (`brood serve` processes): their address,
    /// labels, capacity, load and last heartbeat (docs/many-nodes.md).
    Nodes {
        /// Print the nodes as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Create an agent (inside an agent, a child of the calling agent).
    Spawn {
        /// The parent agent (default: the calling agent inside an agent, else
        /// none: a root). An agent may name no other parent.
        #[arg(long, value_name = "NAME")]
        parent: Option<String>,
        /// Who receives the result when not the parent (its customer).
        #[arg(long, value_name = "NAME")]
        customer: Option<String>,
        /// The agent's name (letters, digits, `-` and `_`; default: one brood
        /// picks from the program's name).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Free text for people, shown in the agent's `label` file.
        #[arg(long)]
        label: Option<String>,
        /// `exec`, `brood` or `auto` (see `brood run --help`).
        #[arg(long, default_value = "auto")]
        protocol: String,
        /// The task; `-` reads it from stdin. Without --task, a pipe or file
        /// on stdin is the task (not a terminal, and not inside an agent).
        #[arg(long)]
        task: Option<String>,
        /// The program's working directory (default: the current directory;
        /// with --iso ns, the agent's own root).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Return only once the agent said `ready` (or ended), wherever it runs.
        #[arg(long)]
        ready: bool,
        /// The child's policy, a JSON or TOML file; fields left out are
        /// inherited from the parent.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// `ns`: a private mount namespace built from the policy's mounts.
        #[arg(long)]
        iso: Option<String>,
        /// Pass the variable NAME of this environment to a root as a secret
        /// (repeatable; a child gets its parent's instead): its value reaches
        /// the agent's environment and is never stored, shown or logged
        /// (docs/security.md "Secrets").
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
        /// Print the agent's record as JSON instead of `name status run`.
        #[arg(long)]
        json: bool,
        /// The program and its arguments, after `--` (a relative program is
        /// found from the current directory, a bare name on PATH).
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        argv: Vec<String>,
    },
    /// List agents (unfinished ones unless -a).
    Ps {
        /// Finished agents too.
        #[arg(short = 'a', long)]
        all: bool,
        /// Print the agents as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show the tree of agents under NAME (or every tree).
    Tree {
        /// The agent whose subtree is drawn (default: every tree).
        name: Option<String>,
        /// Print the trees as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one agent: parent, status, reason, pid, cgroup, runs, timestamps.
    Show {
        /// The agent.
        name: String,
        /// Print the API's record (`AgentDetail`, times in milliseconds since
        /// the epoch) instead.
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's output (its transcript's messages, or an exec
    /// agent's result) on stdout and its log (what it wrote to stderr) on
    /// stderr; -f follows them until it ends.
    Logs {
        /// The agent.
        name: String,
        /// Keep printing as it writes, until it ends.
        #[arg(short = 'f', long)]
        follow: bool,
        /// One JSON object a line: {"message":…}, {"log":…}, {"result":…}.
        #[arg(long)]
        json: bool,
    },
    /// Send input to a running agent.
    Send {
        /// The agent.
        name: String,
        /// The input, one argument (quote it).
        text: String,
    },
    /// Wait for agents to finish: exit 0 done, 1 error, 130 cancelled, 2 timed out.
    Wait {
        /// The agents, waited for in turn.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Give up after this long, exit 2: seconds (`30`, `1.5`) or with a
        /// unit (`500ms`, `30s`, `5m`, `2h`). Default: wait until they end.
        #[arg(long, value_name = "DURATION", value_parser = crate::duration::seconds)]
        timeout: Option<f64>,
        /// Print `{"agents":[…],"timed_out":…}` instead of a line per agent.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an agent and its whole subtree.
    Cancel {
        /// The agent.
        name: String,
    },
    /// Release a finished agent (nothing more can be sent to it but resume).
    Close {
        /// The agent.
        name: String,
    },
    /// Remove finished trees: each NAME is a root whose every agent has
    /// ended; its records (agents, runs, events, transcripts, channels, the
    /// jobs its agents owned) and its ctx files go, and its names are free
    /// again. A tree with a live agent, or a pending or running job, is
    /// refused, naming it (exit 5); a non-root names its root (exit 2).
    #[command(
        after_help = "Examples:\n  brood rm build-1\n  brood rm a b c\n  brood prune --older-than 7d   (every finished tree older than a week)"
    )]
    Rm {
        /// The roots of the trees to remove.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// One JSON object a tree removed: {"root","agents","last_end_ms"}.
        #[arg(long)]
        json: bool,
    },
    /// Remove every finished tree whose last end is at least DURATION ago
    /// (what `brood rm` removes, for each), printing each and the count.
    #[command(
        after_help = "Examples:\n  brood prune --older-than 7d --dry-run\n  brood prune --older-than 12h"
    )]
    Prune {
        /// How old a tree's last end must be: a number and a unit, s m h d w
        /// (`90s`, `30m`, `12h`, `7d`, `2w`, `1h30m`).
        #[arg(long, value_name = "DURATION")]
        older_than: String,
        /// List the trees it would remove, and remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// The answer as JSON: {"dry_run","removed":[…],"skipped":[…]}.
        #[arg(long)]
        json: bool,
    },
    /// Start a new run of a finished agent on the same session.
    Resume {
        /// The agent.
        name: String,
        /// The new run's instruction, which joins its transcript.
        text: Option<String>,
        /// A root's secret NAME again, from this environment (repeatable):
        /// no secret's value outlives the run it was given for.
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
    },
    /// Rebuild the whole ctx tree (agent objects, sessions, channels) from the store.
    Fsck {
        /// Print the counts as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print events (-f to follow), optionally of one agent.
    Events {
        /// Only this agent's events (default: every agent's).
        name: Option<String>,
        /// Keep printing new events as they happen.
        #[arg(short = 'f', long)]
        follow: bool,
        /// `brood` (default) or `agentruntime` (the Agent Runtime draft standard's events).
        #[arg(long, default_value = "brood")]
        format: String,
    },
    /// Jobs: one instruction over many items (`create list get items`; docs/jobs.md).
    Job {
        #[command(subcommand)]
        what: JobCmd,
    },
    /// Quotas of agent trees: `show [TENANT]`, `set TENANT KEY VALUE`.
    Quota {
        #[command(subcommand)]
        what: QuotaCmd,
    },
    /// What this host offers and what brood enforces here.
    Doctor {
        /// Print the checks as one JSON object.
        #[arg(long)]
        json: bool,
        /// Also remove what dead supervisors left on this host, whatever
        /// their root: their groups, with any process still in them killed.
        #[arg(long)]
        fix: bool,
    },
    /// A live demo: a tree of agents counting lines, a tree whose root is
    /// SIGKILLed, a model-driven tree and a job (README "What the demo shows").
    Demo,
    /// Print a completion script for SHELL on stdout: `source <(brood
    /// completions bash)`; see docs/cli.md for zsh and fish.
    Completions {
        /// bash, zsh or fish.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Benchmarks: brood's paths timed against their floors on this machine.
    Bench {
        #[command(subcommand)]
        which: crate::bench::Which,
    },
    /// Sends TEXT (or stdin) to a live agent through its socket and prints the
    /// reply as it streams; what the shim `ctx/agent/<name>` runs.
    #[command(hide = true)]
    Shim {
        name: String,
        /// The agent's session (refused when it is not the agent's).
        #[arg(long)]
        session: Option<String>,
        /// The input, joined with spaces; read from stdin when none is given.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        text: Vec<String>,
    },
    /// brood's reference agent, a model-driven agent speaking brood's
    /// protocol, run under brood: `brood run -- brood agent --config FILE`
    /// (its flags: `brood agent --help`; docs/agent.md).
    Agent {
        /// The agent's flags (`brood agent --help` lists them).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "FLAGS"
        )]
        args: Vec<String>,
    },
    /// An MCP server on stdin/stdout (docs/mcp.md) for harnesses (Claude Code,
    /// Codex CLI, opencode, ...): brood's tools, with a session root of its
    /// own that owns every child it spawns and is cancelled, subtree and all,
    /// when the session ends. Needs `brood serve`.
    Mcp {
        /// The session root's policy (what its children may at most have), a
        /// JSON or TOML file; default: what the operator holds.
        #[arg(long, env = "BROOD_MCP_POLICY")]
        policy: Option<PathBuf>,
        /// The configuration file (provider, model, keys' variables) of the
        /// `brood agent` children that `spawn` starts without `argv`.
        #[arg(long)]
        agent_config: Option<PathBuf>,
        /// Give the session root the variable NAME of this environment as a
        /// secret (repeatable), which its children inherit (a model key):
        /// never stored, shown or logged (docs/security.md "Secrets").
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
    },
    /// What an MCP session root runs: it lives until cancelled.
    #[command(hide = true, name = "mcp-root")]
    McpRoot,
    /// The protocol-speaking test agent used by tests, the demo and benchmarks.
    #[command(hide = true, name = "test-agent")]
    TestAgent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The shells `brood completions` writes for.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The whole command line as completions see it: `brood`'s verbs, with
/// `agent` given the reference agent's own flags (which `brood agent`
/// parses itself: its `--config` is not the global one).
pub(crate) fn command() -> clap::Command {
    let agent = brood_agent::command();
    Cli::command().mut_subcommand("agent", move |sub| {
        let mut sub = sub.mut_arg("args", |a| a.hide(true));
        for a in agent.get_arguments() {
            if !matches!(a.get_id().as_str(), "help" | "version") {
                sub = sub.arg(a.clone());
            }
        }
        sub
    })
}

/// `brood completions SHELL`: the script for SHELL on `out`.
pub(crate) fn completions(shell: Shell, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = command();
    clap_complete::generate(shell, &mut cmd, "brood", out);
    out.flush()
}
