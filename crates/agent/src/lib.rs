//! `brood agent`: brood's reference agent (SPEC 13), a model-driven program
//! that speaks the child protocol (SPEC 7) like any third-party agent: it
//! depends on the protocol crate, never on the runtime. docs/agent.md is its
//! reference.
//!
//! It reads `init`, works out its settings ([`settings`]: its type, provider,
//! model, prompt, tools and turn limit, by SPEC 13's precedence, the tools
//! always within its policy, read from `$BROOD_POLICY`), and runs the model
//! loop ([`run`]) with a provider ([`provider`]: OpenAI-compatible or a
//! script) and its tools ([`tools`]), children included.

pub mod io;
pub mod journal;
pub mod provider;
pub mod run;
pub mod settings;
pub mod tools;
pub mod trace;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use settings::{ConfigFile, Layer};

/// Exit codes: 0 done (or cancelled), 1 failed, 2 bad usage or settings.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

/// The flags: the request's part of the settings, the type and the file
/// (docs/agent.md). `brood agent --help` prints them.
#[derive(clap::Parser, Debug)]
#[command(
    name = "brood agent",
    about = "brood's reference agent: a model-driven agent speaking brood's protocol.",
    long_about = "brood's reference agent: a model-driven agent speaking brood's protocol \
(SPEC 13). Run it under brood, which speaks the protocol on its stdin: \
`brood run -- brood agent --config agent.toml --type code`. Each flag is part of \
the request, which outranks the type's and the configuration's values \
(docs/agent.md \"Types and precedence\").",
    after_help = "Examples:\n  brood run -- brood agent --provider script --script turns.json\n  \
brood run --secret OPENAI_API_KEY -- brood agent --provider openai \\\n    \
--base-url https://api.openai.com/v1 --model gpt-4o-mini --key-env OPENAI_API_KEY --type code"
)]
pub struct Flags {
    /// The agent's type, which picks its tools, turn limit and system prompt
    /// (default: init's `subAgentType`, else general).
    #[arg(long = "type", value_name = "TYPE",
          value_parser = ["explore", "general", "plan", "code", "research"])]
    type_name: Option<String>,
    /// Where the model's turns come from: `openai` (any OpenAI-compatible
    /// server) or `script` (turns replayed from --script; the default when a
    /// script is given).
    #[arg(long, value_name = "PROVIDER", value_parser = ["openai", "script"])]
    provider: Option<String>,
    /// The model's name, as the server knows it (`script` for the script provider).
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The OpenAI-compatible server's base URL, e.g. `https://api.openai.com/v1`
    /// or `http://127.0.0.1:11434/v1` (Ollama).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// The environment variable holding the provider's key (never the key
    /// itself; pass the variable with `brood run --secret VAR`).
    #[arg(long, value_name = "VAR")]
    key_env: Option<String>,
    /// The script provider's file of model turns (JSON; docs/agent.md "Providers").
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// The agent configuration (TOML: defaults, per-type settings, prices;
    /// docs/agent.md "Configuration"); default: $BROOD_AGENT_CONFIG, else none.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The system prompt, used only when the type has none of its own.
    #[arg(long = "system", value_name = "TEXT")]
    system_prompt: Option<String>,
    /// The most model calls one run makes (default: the type's, 6 to 12).
    #[arg(long, value_name = "N")]
    max_turns: Option<u32>,
    /// The tools offered to the model, comma-separated (default: the type's);
    /// always within what the policy grants.
    #[arg(long, value_name = "TOOL,...")]
    tools: Option<String>,
    /// Seconds one model call may take (default 120).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Running as a job's worker: the answer is the item's result, reported
    /// with `job.report` before the run ends (`brood job run` passes it to
    /// its default workers).
    #[arg(long)]
    job_worker: bool,
}

impl Flags {
    /// The request's part of the settings.
    fn request(&self) -> Layer {
        Layer {
            provider: self.provider.clone(),
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            key_env: self.key_env.clone(),
            script: self.script.clone(),
            system_prompt: self.system_prompt.clone(),
            tools: self.tools.as_ref().map(|t| {
                t.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect()
            }),
            max_turns: self.max_turns,
            timeout_s: self.timeout,
        }
    }
}

/// The command line `brood agent` reads, for `brood`'s own help, docs test and
/// shell completions.
pub fn command() -> clap::Command {
    <Flags as clap::CommandFactory>::command()
}

/// The tools the policy in `$BROOD_POLICY` grants (`None`: every tool, as
/// for an agent run outside brood).
fn granted_tools() -> Result<Option<BTreeSet<String>>, String> {
    let Some(path) = std::env::var_os("BROOD_POLICY").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading the policy {}: {e}", PathBuf::from(&path).display()))?;
    // Only `tools` is read: the file is the policy as brood shows it, whose
    // `env` values are hidden (`null`, issue 25) and would not read back as
    // a policy; the agent's own values are in its environment.
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("the policy: not JSON: {e}"))?;
    let tools = serde_json::json!({"tools": doc.get("tools")});
    let p = brood_proto::policy::from_value(&tools).map_err(|e| format!("the policy: {e}"))?;
    Ok(p.tools)
}

/// Runs the agent; the process's exit code.
pub fn main(args: &[String]) -> i32 {
    let argv = std::iter::once("brood agent").chain(args.iter().map(String::as_str));
    let flags = match <Flags as clap::Parser>::try_parse_from(argv) {
        Ok(f) => f,
        // `--help` is printed on stdout with exit 0; a mistake on stderr, exit 2.
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { 0 };
        }
    };
    let requested = flags.request();
    let (mut io, init) = match io::Io::start() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("brood agent: {e} (run it under brood, which speaks the protocol on stdin)");
            return EXIT_USAGE;
        }
    };
    let fail = |io: &mut io::Io, m: String| {
        let _ = io.send(&brood_proto::FromAgent::Error { error: m.clone() });
        eprintln!("brood agent: {m}");
        EXIT_FAILED
    };
    // The request: the flags, then what the creator put in `init`.
    let from_init = match settings::layer_of_init(&init.config) {
        Ok(l) => l,
        Err(e) => return fail(&mut io, e),
    };
    let request = Layer {
        provider: requested.provider.clone().or(from_init.provider),
        model: requested.model.clone().or(from_init.model),
        system_prompt: requested.system_prompt.clone().or(from_init.system_prompt),
        tools: requested.tools.clone().or(from_init.tools),
        max_turns: requested.max_turns.or(from_init.max_turns),
        timeout_s: requested.timeout_s.or(from_init.timeout_s),
        ..requested.clone()
    };
    let type_name = flags.type_name.clone().or(init.sub_agent_type.clone());
    let config_path = flags.config.clone().or_else(|| {
        std::env::var_os("BROOD_AGENT_CONFIG")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    });
    let file = match &config_path {
        Some(p) => match ConfigFile::read(p) {
            Ok(f) => f,
            Err(e) => return fail(&mut io, e),
        },
        None => ConfigFile::default(),
    };
    let granted = match granted_tools() {
        Ok(g) => g,
        Err(e) => return fail(&mut io, e),
    };
    let mut s = match settings::resolve(type_name.as_deref(), &request, &file, granted.as_ref()) {
        Ok(s) => s,
        Err(e) => return fail(&mut io, e),
    };
    s.config_file = config_path;
    let mut provider: Box<dyn provider::Provider> = match s.provider.as_str() {
        "script" => {
            let Some(path) = &s.script else {
                return fail(&mut io, "the script provider needs --script FILE (or script in the agent configuration)".into());
            };
            match provider::script::Script::open(path, &init.name, &s.type_name) {
                Ok(p) => Box::new(p),
                Err(e) => return fail(&mut io, e),
            }
        }
        "openai" => {
            // brood's model gateway, when the environment announces one
            // and the configuration names no server of its own (issue 31,
            // docs/models.md): the key variable then holds this run's
            // token, never a provider's key.
            if s.base_url.is_none()
                && let Some((base, key_env)) = gateway(|k| std::env::var(k).ok())
            {
                s.base_url = Some(base);
                s.key_env = Some(key_env);
            }
            let Some(base) = &s.base_url else {
                return fail(&mut io, "the openai provider needs --base-url (or base_url in the agent configuration), e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1".into());
            };
            match provider::openai::OpenAi::new(
                base,
                &s.model,
                s.key_env.as_deref(),
                Duration::from_secs(s.timeout_s),
            ) {
                Ok(p) => Box::new(p),
                Err(e) => return fail(&mut io, e),
            }
        }
        other => {
            return fail(
                &mut io,
                format!("unknown provider {other:?}; use openai or script"),
            );
        }
    };
    if let Err(e) = io.send(&brood_proto::FromAgent::Ready) {
        eprintln!("brood agent: {e}");
        return EXIT_FAILED;
    }
    trace::init();
    let end = run::run(
        &mut io,
        provider.as_mut(),
        &s,
        &init.instruction,
        &init.history,
        flags.job_worker,
    );
    trace::finish();
    match end {
        run::End::Done | run::End::Cancelled => 0,
        run::End::Failed(m) => {
            eprintln!("brood agent: {m}");
            EXIT_FAILED
        }
    }
}

/// The model gateway brood announced in the environment (`get` reads a
/// variable): its OpenAI base URL and the variable holding this run's
/// token, when both are set.
fn gateway(get: impl Fn(&str) -> Option<String>) -> Option<(String, String)> {
    let base = get("OPENAI_BASE_URL").filter(|b| !b.is_empty())?;
    get("OPENAI_API_KEY").filter(|k| k.starts_with("brood-"))?;
    Some((base, "OPENAI_API_KEY".to_owned()))
}

#[cfg(test)]
mod gateway_tests {
    #[test]
    fn the_gateway_is_taken_only_when_brood_announced_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            super::gateway(env(&[
                ("OPENAI_BASE_URL", "http://127.0.0.1:5/v1"),
                ("OPENAI_API_KEY", "brood-ab12")
            ])),
            Some(("http://127.0.0.1:5/v1".into(), "OPENAI_API_KEY".into()))
        );
        // A key of the user's own is not brood's gateway.
        assert_eq!(
            super::gateway(env(&[
                ("OPENAI_BASE_URL", "http://127.0.0.1:5/v1"),
                ("OPENAI_API_KEY", "sk-real")
            ])),
            None
        );
        assert_eq!(
            super::gateway(env(&[("OPENAI_API_KEY", "brood-ab12")])),
            None
        );
    }
}
