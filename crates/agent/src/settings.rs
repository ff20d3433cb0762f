//! What the agent runs with: its type (SPEC 13's five), provider, model,
//! prompt, tools and turn limit, each decided by SPEC 13's precedence from
//! three sources: the request (the agent's own flags, and `init`'s `config`
//! and `subAgentType`, which its creator chose), its type, and the agent's
//! defaults (the configuration file). The tools are then intersected with
//! the policy: a tool the policy does not grant is never offered.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

/// Every tool the agent knows.
pub const ALL_TOOLS: [&str; 18] = [
    "file_read",
    "file_write",
    "file_edit",
    "file_patch",
    "file_delete",
    "file_rename",
    "file_list",
    "file_tree",
    "file_info",
    "file_search",
    "shell",
    "code_exec",
    "web_search",
    "create",
    "send",
    "wait",
    "close",
    "resume",
];

const READ_ONLY: [&str; 5] = [
    "file_read",
    "file_search",
    "file_list",
    "file_tree",
    "file_info",
];

/// SPEC 13's types: their tools (empty: all the agent is granted), max turns
/// and the system prompt each starts from.
pub struct Type {
    pub name: &'static str,
    pub tools: &'static [&'static str],
    pub max_turns: u32,
    pub prompt: &'static str,
}

pub const TYPES: [Type; 5] = [
    Type {
        name: "explore",
        tools: &READ_ONLY,
        max_turns: 6,
        prompt: "You are an explorer: answer structural questions about the files you can see, quickly, by searching and reading. Do not change anything.",
    },
    Type {
        name: "general",
        tools: &[],
        max_turns: 12,
        prompt: "You are a capable generalist agent. Use your tools to complete the task, then answer with the result.",
    },
    Type {
        name: "plan",
        tools: &READ_ONLY,
        max_turns: 8,
        prompt: "You are a planner: read what you need and answer with a detailed, ordered execution plan. Do not change anything.",
    },
    Type {
        name: "code",
        tools: &[
            "file_read",
            "file_write",
            "file_edit",
            "file_patch",
            "file_delete",
            "file_rename",
            "file_list",
            "file_tree",
            "file_info",
            "file_search",
            "shell",
            "code_exec",
        ],
        max_turns: 10,
        prompt: "You are a coder: make the change the task asks for, check it by running what you can, and answer with what you changed.",
    },
    Type {
        name: "research",
        tools: &["web_search", "file_read", "file_list", "file_tree"],
        max_turns: 8,
        prompt: "You are a researcher: search, read and synthesise; answer with what you found and where.",
    },
];

pub fn type_named(name: &str) -> Option<&'static Type> {
    TYPES.iter().find(|t| t.name == name)
}

/// Dollars per million tokens of one model.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// A source's settings; every field optional.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The environment variable holding the provider's key (never the key).
    pub key_env: Option<String>,
    pub script: Option<PathBuf>,
    pub system_prompt: Option<String>,
    pub tools: Option<Vec<String>>,
    pub max_turns: Option<u32>,
    /// Seconds one model call may take.
    pub timeout_s: Option<u64>,
}

/// The configuration file: the agent's defaults, per-type overrides, prices,
/// and the tools' knobs.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub key_env: Option<String>,
    pub script: Option<PathBuf>,
    pub system_prompt: Option<String>,
    pub tools: Option<Vec<String>>,
    pub max_turns: Option<u32>,
    pub timeout_s: Option<u64>,
    #[serde(default)]
    pub types: BTreeMap<String, Layer>,
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    /// A search endpoint (`GET URL?q=...` answering JSON); without one,
    /// `web_search` is not offered.
    pub search_url: Option<String>,
    /// The longest a `shell` or `code_exec` call may run, seconds (default 60).
    pub shell_timeout_s: Option<u64>,
}

impl ConfigFile {
    /// The agent's defaults (the file's top level).
    pub fn defaults(&self) -> Layer {
        Layer {
            provider: self.provider.clone(),
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            key_env: self.key_env.clone(),
            script: self.script.clone(),
            system_prompt: self.system_prompt.clone(),
            tools: self.tools.clone(),
            max_turns: self.max_turns,
            timeout_s: self.timeout_s,
        }
    }

    /// Reads the file; a relative `script` in it (at the top or in a type)
    /// is the file's neighbour, wherever the agent reading it runs (a child
    /// handed the file starts in another directory than its parent).
    pub fn read(path: &std::path::Path) -> Result<ConfigFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the agent configuration {}: {e}", path.display()))?;
        let mut file: ConfigFile = toml::from_str(&text)
            .map_err(|e| format!("agent configuration {}: {e}", path.display()))?;
        let dir = std::path::absolute(path)
            .ok()
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
            .unwrap_or_default();
        let beside = |s: &mut Option<PathBuf>| {
            if let Some(p) = s.as_mut()
                && p.is_relative()
            {
                *p = dir.join(&*p);
            }
        };
        beside(&mut file.script);
        for t in file.types.values_mut() {
            beside(&mut t.script);
        }
        Ok(file)
    }
}

/// What the agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub type_name: String,
    pub provider: String,
    pub model: String,
    pub base_url: Option<String>,
    pub key_env: Option<String>,
    pub script: Option<PathBuf>,
    pub system_prompt: String,
    /// Offered to the model, in `ALL_TOOLS` order.
    pub tools: Vec<String>,
    pub max_turns: u32,
    pub timeout_s: u64,
    pub price: Option<Price>,
    pub search_url: Option<String>,
    pub shell_timeout_s: u64,
    /// The request as it came (flags and init), handed on to children so
    /// they use the same provider unless asked otherwise.
    pub request: Layer,
    /// The configuration file it read, handed on to children.
    pub config_file: Option<PathBuf>,
}

/// The request part of `init`'s `config` (`provider model systemPrompt
/// tools maxTurns timeout`), in the seed's spelling.
pub fn layer_of_init(config: &Value) -> Result<Layer, String> {
    let s = |k: &str| config.get(k).and_then(Value::as_str).map(str::to_owned);
    let tools = match config.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("init config tools: {t} is not a tool name"))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(v) => return Err(format!("init config tools must be an array, not {v}")),
    };
    let n = |k: &str| config.get(k).and_then(Value::as_u64);
    Ok(Layer {
        provider: s("provider"),
        model: s("model"),
        system_prompt: s("systemPrompt"),
        tools,
        max_turns: n("maxTurns").map(|v| v.min(u64::from(u32::MAX)) as u32),
        timeout_s: n("timeout"),
        ..Layer::default()
    })
}

/// The later layer's fields where it has them.
fn over(base: Layer, top: &Layer) -> Layer {
    Layer {
        provider: top.provider.clone().or(base.provider),
        model: top.model.clone().or(base.model),
        base_url: top.base_url.clone().or(base.base_url),
        key_env: top.key_env.clone().or(base.key_env),
        script: top.script.clone().or(base.script),
        system_prompt: top.system_prompt.clone().or(base.system_prompt),
        tools: top.tools.clone().or(base.tools),
        max_turns: top.max_turns.or(base.max_turns),
        timeout_s: top.timeout_s.or(base.timeout_s),
    }
}

/// SPEC 13's precedence. `granted` is the policy's tools (`None`: every tool).
pub fn resolve(
    type_name: Option<&str>,
    request: &Layer,
    file: &ConfigFile,
    granted: Option<&BTreeSet<String>>,
) -> Result<Settings, String> {
    let type_name = type_name.unwrap_or("general");
    let ty = type_named(type_name).ok_or_else(|| {
        let names: Vec<&str> = TYPES.iter().map(|t| t.name).collect();
        format!(
            "unknown agent type {type_name:?}; the types are {}",
            names.join(", ")
        )
    })?;
    let per_type = file.types.get(type_name).cloned().unwrap_or_default();
    // Provider and model (and how to reach them): request > type > agent.
    let defaults = file.defaults();
    let reach = over(over(defaults.clone(), &per_type), request);
    // System prompt: type > request > agent.
    let system_prompt = per_type
        .system_prompt
        .clone()
        .or_else(|| Some(ty.prompt.to_owned()))
        .or_else(|| request.system_prompt.clone())
        .or_else(|| defaults.system_prompt.clone())
        .unwrap_or_default();
    // Tools: request > type (if non-empty) > agent > all.
    let type_tools: Vec<String> = per_type
        .tools
        .clone()
        .unwrap_or_else(|| ty.tools.iter().map(|t| (*t).to_owned()).collect());
    let wanted: Vec<String> = if let Some(t) = &request.tools {
        t.clone()
    } else if !type_tools.is_empty() {
        type_tools
    } else if let Some(t) = &defaults.tools {
        t.clone()
    } else {
        ALL_TOOLS.iter().map(|t| (*t).to_owned()).collect()
    };
    for t in &wanted {
        if !ALL_TOOLS.contains(&t.as_str()) {
            return Err(format!(
                "unknown tool {t:?}; the tools are {}",
                ALL_TOOLS.join(" ")
            ));
        }
    }
    let search_url = file.search_url.clone();
    let tools = ALL_TOOLS
        .iter()
        .filter(|t| wanted.iter().any(|w| w == *t))
        .filter(|t| granted.is_none_or(|g| g.contains(**t)))
        // Without a search endpoint there is no web_search to offer.
        .filter(|t| **t != "web_search" || search_url.is_some())
        .map(|t| (*t).to_owned())
        .collect();
    // Max turns: request > type > agent.
    let max_turns = request
        .max_turns
        .or(per_type.max_turns)
        .unwrap_or(ty.max_turns)
        .max(1);
    let provider = match (&reach.provider, &reach.script) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => "script".to_owned(),
        (None, None) => {
            return Err(
                "no provider: give --provider (openai or script) or set provider in the agent configuration"
                    .into(),
            );
        }
    };
    let model = reach.model.clone().unwrap_or_else(|| {
        if provider == "script" {
            "script".to_owned()
        } else {
            String::new()
        }
    });
    if model.is_empty() {
        return Err(format!(
            "no model for provider {provider}: give --model or set model in the agent configuration"
        ));
    }
    Ok(Settings {
        type_name: type_name.to_owned(),
        price: file.prices.get(&model).copied(),
        provider,
        model,
        base_url: reach.base_url.clone(),
        key_env: reach.key_env.clone(),
        script: reach.script.clone(),
        system_prompt,
        tools,
        max_turns,
        timeout_s: reach.timeout_s.unwrap_or(120),
        search_url,
        shell_timeout_s: file.shell_timeout_s.unwrap_or(60),
        request: request.clone(),
        config_file: None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::{ConfigFile, Layer, Price, resolve};

    fn set(tools: &[&str]) -> BTreeSet<String> {
        tools.iter().map(|t| (*t).to_owned()).collect()
    }

    fn script_request() -> Layer {
        Layer {
            provider: Some("script".into()),
            ..Layer::default()
        }
    }

    #[test]
    fn each_type_has_its_tools_and_turns() {
        let s = resolve(
            Some("explore"),
            &script_request(),
            &ConfigFile::default(),
            None,
        )
        .unwrap();
        assert_eq!(
            s.tools,
            [
                "file_read",
                "file_list",
                "file_tree",
                "file_info",
                "file_search"
            ]
        );
        assert_eq!(s.max_turns, 6);
        let s = resolve(
            Some("code"),
            &script_request(),
            &ConfigFile::default(),
            None,
        )
        .unwrap();
        assert_eq!(s.max_turns, 10);
        assert!(s.tools.contains(&"shell".to_owned()) && !s.tools.contains(&"create".to_owned()));
        // general: all the agent is granted.
        let s = resolve(
            None,
            &script_request(),
            &ConfigFile::default(),
            Some(&set(&["file_read", "create"])),
        )
        .unwrap();
        assert_eq!((s.type_name.as_str(), s.max_turns), ("general", 12));
        assert_eq!(s.tools, ["file_read", "create"]);
        // research without a search endpoint: no web_search.
        let s = resolve(
            Some("research"),
            &script_request(),
            &ConfigFile::default(),
            None,
        )
        .unwrap();
        assert_eq!(s.tools, ["file_read", "file_list", "file_tree"]);
        let e = resolve(
            Some("hack"),
            &script_request(),
            &ConfigFile::default(),
            None,
        )
        .unwrap_err();
        assert!(e.contains("explore, general, plan, code, research"), "{e}");
    }

    #[test]
    fn the_configuration_file_reads_back() {
        let f: ConfigFile = toml::from_str(
            "provider = \"script\"\nmodel = \"m\"\nscript = \"/s.json\"\n[types.code]\nmax_turns = 4\n[prices.m]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
        )
        .unwrap();
        let s = resolve(Some("code"), &Layer::default(), &f, None).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.model.as_str(), s.max_turns),
            ("script", "m", 4)
        );
        assert_eq!(
            s.price,
            Some(Price {
                input_per_mtok: 1.0,
                output_per_mtok: 2.0
            })
        );
        let e = toml::from_str::<ConfigFile>("provder = \"x\"").unwrap_err();
        assert!(e.to_string().contains("provder"), "{e}");
    }

    /// A child handed the file starts in another directory than the agent
    /// that read it first: a relative `script` means the file's neighbour.
    #[test]
    fn a_relative_script_is_the_configuration_files_neighbour() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "provider = \"script\"\nscript = \"turns.json\"\n[types.explore]\nscript = \"sub/e.json\"\n[types.plan]\nscript = \"/abs.json\"\n",
        )
        .unwrap();
        let f = ConfigFile::read(&path).unwrap();
        assert_eq!(f.script, Some(dir.path().join("turns.json")));
        assert_eq!(
            f.types["explore"].script,
            Some(dir.path().join("sub/e.json"))
        );
        assert_eq!(f.types["plan"].script, Some(PathBuf::from("/abs.json")));
    }

    #[test]
    fn precedence_is_spec_13s() {
        let mut file = ConfigFile {
            provider: Some("openai".into()),
            model: Some("agent-model".into()),
            system_prompt: Some("agent prompt".into()),
            max_turns: Some(3),
            ..ConfigFile::default()
        };
        file.types.insert(
            "plan".into(),
            Layer {
                model: Some("type-model".into()),
                system_prompt: Some("type prompt".into()),
                ..Layer::default()
            },
        );
        // Model: request > type > agent.
        let s = resolve(Some("plan"), &Layer::default(), &file, None).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.model.as_str()),
            ("openai", "type-model")
        );
        let req = Layer {
            model: Some("req-model".into()),
            system_prompt: Some("req prompt".into()),
            max_turns: Some(2),
            tools: Some(vec!["file_read".into(), "shell".into()]),
            ..Layer::default()
        };
        let s = resolve(Some("plan"), &req, &file, None).unwrap();
        assert_eq!(s.model, "req-model");
        // System prompt: type > request > agent.
        assert_eq!(s.system_prompt, "type prompt");
        // Tools: request > type; max turns: request > type > agent.
        assert_eq!(
            (s.tools.clone(), s.max_turns),
            (vec!["file_read".to_owned(), "shell".to_owned()], 2)
        );
        // Always within the policy.
        let s = resolve(Some("plan"), &req, &file, Some(&set(&["file_read"]))).unwrap();
        assert_eq!(s.tools, ["file_read"]);
        // The type's own prompt when the configuration has none for it.
        let s = resolve(Some("code"), &req, &file, None).unwrap();
        assert!(
            s.system_prompt.starts_with("You are a coder"),
            "{}",
            s.system_prompt
        );
        assert_eq!(s.model, "req-model");
    }
}
