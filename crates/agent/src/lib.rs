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
pub mod provider;
pub mod run;
pub mod settings;
pub mod tools;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use settings::{ConfigFile, Layer};

/// Exit codes: 0 done (or cancelled), 1 failed, 2 bad usage or settings.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

const USAGE: &str = "usage: brood agent [--type explore|general|plan|code|research] [--provider openai|script] \
[--model M] [--base-url URL] [--key-env VAR] [--script FILE] [--config FILE] [--max-turns N] \
[--system TEXT] [--tools a,b,...] [--timeout SECONDS] [--job-worker]";

/// The flags: the request's part of the settings, the type and the file.
struct Flags {
    type_name: Option<String>,
    request: Layer,
    config: Option<PathBuf>,
    /// Running as a job's worker: the answer is the item's result, reported
    /// with `job.report` before the run ends.
    job_worker: bool,
}

fn parse(args: &[String]) -> Result<Flags, String> {
    let mut f = Flags {
        type_name: None,
        request: Layer::default(),
        config: None,
        job_worker: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{a} must be a whole number, not {v:?}"))
        };
        match a.as_str() {
            "--type" => f.type_name = Some(val()?),
            "--provider" => f.request.provider = Some(val()?),
            "--model" => f.request.model = Some(val()?),
            "--base-url" => f.request.base_url = Some(val()?),
            "--key-env" => f.request.key_env = Some(val()?),
            "--script" => f.request.script = Some(PathBuf::from(val()?)),
            "--config" => f.config = Some(PathBuf::from(val()?)),
            "--system" => f.request.system_prompt = Some(val()?),
            "--max-turns" => {
                f.request.max_turns = Some(num(val()?)?.min(u64::from(u32::MAX)) as u32)
            }
            "--timeout" => f.request.timeout_s = Some(num(val()?)?),
            "--tools" => {
                f.request.tools = Some(
                    val()?
                        .split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(str::to_owned)
                        .collect(),
                )
            }
            "--job-worker" => f.job_worker = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(f)
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
    let flags = match parse(args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("brood agent: {e}");
            return EXIT_USAGE;
        }
    };
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
        provider: flags.request.provider.clone().or(from_init.provider),
        model: flags.request.model.clone().or(from_init.model),
        system_prompt: flags
            .request
            .system_prompt
            .clone()
            .or(from_init.system_prompt),
        tools: flags.request.tools.clone().or(from_init.tools),
        max_turns: flags.request.max_turns.or(from_init.max_turns),
        timeout_s: flags.request.timeout_s.or(from_init.timeout_s),
        ..flags.request.clone()
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
    match run::run(
        &mut io,
        provider.as_mut(),
        &s,
        &init.instruction,
        &init.history,
        flags.job_worker,
    ) {
        run::End::Done | run::End::Cancelled => 0,
        run::End::Failed(m) => {
            eprintln!("brood agent: {m}");
            EXIT_FAILED
        }
    }
}
