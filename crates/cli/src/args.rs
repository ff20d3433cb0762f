//! The command line as clap reads it: the global options and every verb
//! with its flags, help and examples (docs/cli.md).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
        #[arg(long)]
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
        /// Seconds between SIGTERM and SIGKILL when a subtree is stopped.
        #[arg(long, default_value_t = 3.0)]
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
        #[arg(long)]
        json: bool,
        /// Program and arguments.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Run the daemon on $BROOD_ROOT/brood.sock.
    Serve {
        #[arg(long, default_value_t = 3.0)]
        grace: f64,
        /// The sweepers' tick in seconds (timeouts every tick, orphans every 5,
        /// reconcile every 30). Only the supervisor holding the sweeper
        /// lease of its store sweeps.
        #[arg(long, default_value_t = 1.0)]
        sweep_every: f64,
        /// See `brood run --allow-weaker-sandbox`.
        #[arg(long)]
        allow_weaker_sandbox: bool,
        /// Also serve the API on this loopback address (`127.0.0.1:8420`),
        /// with the bearer token of $BROOD_ROOT/token (made at first start).
        #[arg(long)]
        listen: Option<String>,
        /// A label of this node for placement (`--label zone=a`; repeatable),
        /// shown by `brood nodes`.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// How many agents this node takes at once (shown by `brood nodes`).
        #[arg(long)]
        capacity: Option<u32>,
        /// Seconds without a heartbeat after which the other nodes declare a
        /// node lost (its agents end `failed (lost)`).
        #[arg(long, default_value_t = 10.0)]
        node_expiry: f64,
        /// Seconds without a request after which a web UI session ends
        /// (docs/ui.md).
        #[arg(long, default_value_t = 3600.0)]
        ui_session_idle: f64,
        /// Seconds after its login at which a web UI session ends, however busy.
        #[arg(long, default_value_t = 43200.0)]
        ui_session_max: f64,
    },
    /// The nodes sharing this store (`brood serve` processes): their address,
    /// labels, capacity, load and last heartbeat (docs/many-nodes.md).
    Nodes {
        #[arg(long)]
        json: bool,
    },
    /// Create an agent (inside an agent, a child of the calling agent).
    Spawn {
        #[arg(long)]
        parent: Option<String>,
        /// Who receives the result when not the parent (its customer).
        #[arg(long)]
        customer: Option<String>,
        #[arg(long)]
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
        #[arg(long)]
        json: bool,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// List agents (unfinished ones unless -a).
    Ps {
        #[arg(short = 'a', long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show the tree of agents under NAME (or every tree).
    Tree {
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show one agent: parent, status, reason, pid, cgroup, runs, timestamps.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's output (its transcript's messages, or an exec
    /// agent's result) on stdout and its log (what it wrote to stderr) on
    /// stderr; -f follows them until it ends.
    Logs {
        name: String,
        #[arg(short = 'f', long)]
        follow: bool,
        /// One JSON object a line: {"message":…}, {"log":…}, {"result":…}.
        #[arg(long)]
        json: bool,
    },
    /// Send input to a running agent.
    Send { name: String, text: String },
    /// Wait for agents to finish: exit 0 done, 1 error, 130 cancelled, 2 timed out.
    Wait {
        #[arg(required = true)]
        names: Vec<String>,
        #[arg(long)]
        timeout: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// Cancel an agent and its whole subtree.
    Cancel { name: String },
    /// Release a finished agent (nothing more can be sent to it but resume).
    Close { name: String },
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
        name: String,
        text: Option<String>,
        /// A root's secret NAME again, from this environment (repeatable):
        /// no secret's value outlives the run it was given for.
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
    },
    /// Rebuild the whole ctx tree (agent objects, sessions, channels) from the store.
    Fsck {
        #[arg(long)]
        json: bool,
    },
    /// Print events (-f to follow), optionally of one agent.
    Events {
        name: Option<String>,
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
        #[arg(long)]
        json: bool,
    },
    /// A live demo: a tree of agents counting lines, then a tree whose root is SIGKILLed.
    Demo,
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
    /// brood's reference agent: a model-driven agent speaking brood's
    /// protocol (run it under brood: `brood run -- brood agent --script FILE`);
    /// see docs/agent.md for its flags, types, tools and providers. Its flags
    /// follow `agent` directly (`brood agent --config FILE ...`).
    Agent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
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
